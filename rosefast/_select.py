"""Pick the compiled or the pure-Python flavour of an accelerated module (aio-libs style)."""
import importlib
import os

NO_EXTENSIONS = os.environ.get("ROSEFAST_NO_EXTENSIONS", "").strip() not in ("", "0")


def select(name, package="rosefast.frontend"):
    """Return the module `<package>._<name>_c` when it is built and allowed, else `<package>._<name>_py`."""
    if not NO_EXTENSIONS:
        try:
            return importlib.import_module(f"{package}._{name}_c")
        except ImportError:
            pass
    return importlib.import_module(f"{package}._{name}_py")


def is_compiled(module):
    return module.__name__.endswith("_c")
