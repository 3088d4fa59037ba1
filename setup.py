"""Build: the Cython hot paths in rosefast/frontend/, or only their pure-Python twins.

ROSEFAST_NO_EXTENSIONS=1   build (and later use) the pure-Python twins only
ROSEFAST_DEBUG_BUILD=1     compile the extensions with -O0 -g and Cython line tracing off
"""
import os
import sys

from setuptools import Extension, setup

# One entry per accelerated module: rosefast/frontend/_<name>_c.pyx beside _<name>_py.py.
COMPILED_MODULES = ["admission", "collector", "fanout"]


def _flag(name):
    return os.environ.get(name, "").strip() not in ("", "0")


def _extensions():
    if _flag("ROSEFAST_NO_EXTENSIONS"):
        print("rosefast: ROSEFAST_NO_EXTENSIONS is set, building the pure-Python flavour only", file=sys.stderr)
        return []
    from Cython.Build import cythonize

    debug = _flag("ROSEFAST_DEBUG_BUILD")
    cflags = ["-O0", "-g"] if debug else ["-O3"]
    names = [m for m in COMPILED_MODULES if os.path.exists(f"rosefast/frontend/_{m}_c.pyx")]
    exts = [
        Extension(
            f"rosefast.frontend._{m}_c",
            [f"rosefast/frontend/_{m}_c.pyx"],
            include_dirs=["csrc"],
            extra_compile_args=cflags,
        )
        for m in names
    ]
    print(
        f"rosefast: building the compiled flavour ({'debug -O0 -g' if debug else '-O3'}): "
        + ", ".join(f"_{m}_c" for m in names),
        file=sys.stderr,
    )
    return cythonize(
        exts,
        include_path=["."],
        compiler_directives={
            "language_level": 3,
            "boundscheck": False,
            "wraparound": False,
            "initializedcheck": False,
            "cdivision": True,
            "binding": False,  # plain builtin methods: vectorcall, no CyFunction call overhead per token
        },
    )


setup(ext_modules=_extensions())
