"""Pick the compiled or the pure-Python flavour of a frontend module (aio-libs style)."""
import importlib
import os

NO_EXTENSIONS = os.environ.get("ROSEFAST_NO_EXTENSIONS", "").strip() not in ("", "0")


def select(name):
    """Return the module `_<name>_c` when it is built and allowed, else `_<name>_py`."""
    if not NO_EXTENSIONS:
        try:
            return importlib.import_module(f"rosefast.frontend._{name}_c")
        except ImportError:
            pass
    return importlib.import_module(f"rosefast.frontend._{name}_py")


def is_compiled(module):
    return module.__name__.endswith("_c")
