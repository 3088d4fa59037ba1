"""Build: the Cython hot paths (rosefast/frontend/, kernels/, engine/), or only their pure-Python twins.

ROSEFAST_NO_EXTENSIONS=1   build (and later use) the pure-Python twins only
ROSEFAST_DEBUG_BUILD=1     compile the extensions with -O0 -g and Cython line tracing off
ROSEFAST_BUILD_MODULES=a,b only these of COMPILED_MODULES (e.g. frontend/admission; default: all)

`pip install .` also leaves each compiled module beside its source in the checkout (as `pip install -e .`
does), so `gunicorn -k gevent server:app` run from the repository root — which imports rosefast/ from the
checkout, not from site-packages — serves the compiled flavour too.
"""
import glob
import os
import shutil
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))

# One entry per accelerated module: <package>/_<name>_c.pyx beside _<name>_py.py.
COMPILED_MODULES = ["frontend/admission", "frontend/collector", "frontend/fanout", "kernels/layer_ops",
                    "engine/sample_ops", "kernels/quant_ops", "kernels/decode_layer"]
# The model kernels split their work with OpenMP: the same libgomp torch loads, so one thread pool.
OPENMP_MODULES = {"kernels/layer_ops", "engine/sample_ops", "kernels/quant_ops", "kernels/decode_layer"}


def _flag(name):
    return os.environ.get(name, "").strip() not in ("", "0")


def _extensions():
    if _flag("ROSEFAST_NO_EXTENSIONS"):
        print("rosefast: ROSEFAST_NO_EXTENSIONS is set, building the pure-Python flavour only", file=sys.stderr)
        return []
    from Cython.Build import cythonize

    debug = _flag("ROSEFAST_DEBUG_BUILD")
    cflags = ["-O0", "-g"] if debug else ["-O3"]
    only = [m.strip() for m in os.environ.get("ROSEFAST_BUILD_MODULES", "").split(",") if m.strip()]
    unknown = sorted(set(only) - set(COMPILED_MODULES))
    if unknown:
        sys.exit(f"rosefast: ROSEFAST_BUILD_MODULES names {', '.join(unknown)}; known: {', '.join(COMPILED_MODULES)}")
    exts = []
    headers = sorted(glob.glob("csrc/*.h"))
    for m in only or COMPILED_MODULES:
        package, name = m.split("/")
        source = f"rosefast/{package}/_{name}_c.pyx"
        if not os.path.exists(source):
            continue
        openmp = ["-fopenmp"] if m in OPENMP_MODULES else []
        exts.append(Extension(f"rosefast.{package}._{name}_c", [source], include_dirs=["csrc"],
                              depends=headers,   # a header's change (one ISA's, included by another) rebuilds
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


class BuildExtInTree(build_ext):
    """build_ext that also copies each built module into the source tree when it built elsewhere (`pip install .`):
    the checkout's rosefast/ then has its compiled flavour, whichever copy Python imports. The modules compile
    in parallel, one per CPU, unless -j says otherwise."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def run(self):
        super().run()
        if self.inplace or not os.access(ROOT, os.W_OK):
            return
        for ext in self.extensions:
            built = self.get_ext_fullpath(ext.name)
            *package, _ = ext.name.split(".")
            target = os.path.join(ROOT, *package, os.path.basename(built))
            if os.path.isdir(os.path.dirname(target)) and os.path.abspath(built) != target:
                shutil.copyfile(built, target + ".tmp")
                os.replace(target + ".tmp", target)   # a running server keeps its mapped copy


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildExtInTree})
