"""Build: the Cython hot paths (rosefast/frontend/, models/, engine/), or only their pure-Python twins.

ROSEFAST_NO_EXTENSIONS=1   build (and later use) the pure-Python twins only
ROSEFAST_DEBUG_BUILD=1     compile the extensions with -O0 -g and Cython line tracing off
"""
import os
import sys

from setuptools import Extension, setup

# One entry per accelerated module: <package>/_<name>_c.pyx beside _<name>_py.py.
COMPILED_MODULES = ["frontend/admission", "frontend/collector", "frontend/fanout", "models/kernels",
                    "engine/sample_ops", "models/quant_ops", "models/decode_layer"]
# The model kernels split their work with OpenMP: the same libgomp torch loads, so one thread pool.
OPENMP_MODULES = {"models/kernels", "engine/sample_ops", "models/quant_ops", "models/decode_layer"}


def _flag(name):
    return os.environ.get(name, "").strip() not in ("", "0")


def _extensions():
    if _flag("ROSEFAST_NO_EXTENSIONS"):
        print("rosefast: ROSEFAST_NO_EXTENSIONS is set, building the pure-Python flavour only", file=sys.stderr)
        return []
    from Cython.Build import cythonize

    debug = _flag("ROSEFAST_DEBUG_BUILD")
    cflags = ["-O0", "-g"] if debug else ["-O3"]
    exts = []
    for m in COMPILED_MODULES:
        package, name = m.split("/")
        source = f"rosefast/{package}/_{name}_c.pyx"
        if not os.path.exists(source):
            continue
        openmp = ["-fopenmp"] if m in OPENMP_MODULES else []
        exts.append(Extension(f"rosefast.{package}._{name}_c", [source], include_dirs=["csrc"],
                              extra_compile_args=cflags + openmp, extra_link_args=openmp))
    print(
        f"rosefast: building the compiled flavour ({'debug -O0 -g' if debug else '-O3'}): "
        + ", ".join(e.name for e in exts),
        file=sys.stderr,
    )
    return cythonize(
        exts,
        include_path=[".", "csrc"],   # csrc/*.pxd: the C kernels declared once
        compiler_directives={
            "language_level": 3,
            "boundscheck": False,
            "wraparound": False,
            "initializedcheck": False,
            "cdivision": True,
            "binding": False,  # plain builtin methods: vectorcall, no CyFunction call overhead per token
            # one-argument methods as METH_O, no-argument ones as METH_NOARGS (list.append's calling
            # convention): no keyword parsing per merge; the pure twins take those arguments positional-only
            "always_allow_keywords": False,
        },
    )


setup(ext_modules=_extensions())
