"""Pick the compiled or the pure-Python flavour of an accelerated module (aio-libs style)."""
import importlib

from rosefast.config import process_setting

NO_EXTENSIONS = process_setting("ROSEFAST_NO_EXTENSIONS")
_SELECTED = {}   # selector module ("rosefast.kernels.layer_ops") -> the flavour it took
_MISSING = {}    # selector module -> why its compiled flavour did not import (the ImportError's words)


def select(name, package="rosefast.frontend"):
    """Return the module `<package>._<name>_c` when it is built and allowed, else `<package>._<name>_py`.

    Only the compiled module's own absence (not built, or built for another Python) selects the twin; an
    ImportError raised inside it (an import cycle, a name its imports lack) is a bug and propagates, rather
    than leaving the slow flavour running unnoticed."""
    module = None
    if not NO_EXTENSIONS:
        compiled = f"{package}._{name}_c"
        try:
            module = importlib.import_module(compiled)
        except ImportError as e:
            if e.name != compiled:
                raise
            _MISSING[f"{package}.{name}"] = str(e)
    if module is None:
        module = importlib.import_module(f"{package}._{name}_py")
    _SELECTED[f"{package}.{name}"] = module
    return module


def selected(name):
    """Whether the selector module `name` (imported) took its compiled flavour."""
    return is_compiled(_SELECTED[name])


def is_compiled(module):
    return module.__name__.endswith("_c")


def missing(name):
    """Why the selector module `name` (imported) runs its pure twin though extensions were allowed, or None."""
    return _MISSING.get(name) if not selected(name) else None
