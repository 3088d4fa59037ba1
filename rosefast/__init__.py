"""rosefast: an LLM inference server with a torch batching core and Cython hot paths."""
import importlib

__version__ = "0.1.0"
__all__ = ["ACCELERATED", "EXTENSIONS", "flavour_warning", "flavours", "__version__"]

#: every module with a compiled flavour and a pure-Python twin (rosefast._select picks one at import)
ACCELERATED = ("rosefast.frontend.admission", "rosefast.frontend.collector", "rosefast.frontend.fanout",
               "rosefast.engine.sample_ops", "rosefast.kernels.layer_ops", "rosefast.kernels.quant_ops",
               "rosefast.kernels.decode_layer")


def flavours():
    """{module: "compiled" | "pure"} for every accelerated module (importing them: the last four import torch)."""
    from rosefast._select import selected

    for name in ACCELERATED:
        importlib.import_module(name)
    return {name: "compiled" if selected(name) else "pure" for name in ACCELERATED}


def flavour_warning():
    """None when every accelerated module runs compiled or ROSEFAST_NO_EXTENSIONS chose the twins; else what
    runs pure, why, and the one command that fixes it (logged loudly at start-up)."""
    import os

    from rosefast._select import NO_EXTENSIONS, missing

    flavours()
    pure = {name: missing(name) for name in ACCELERATED if missing(name)}
    if NO_EXTENSIONS or not pure:
        return None
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    checkout = os.path.isfile(os.path.join(root, "setup.py"))
    fix = (f"run `pip install -e .` (or `python setup.py build_ext --inplace`) in {root}" if checkout
           else "reinstall rosefast with its extensions: `pip install --force-reinstall --no-deps .` from its source")
    return (f"rosefast runs the pure-Python twins of {len(pure)} of {len(ACCELERATED)} accelerated modules "
            f"({', '.join(n.rsplit('.', 1)[1] for n in pure)}): their compiled modules are not in {here} "
            f"({next(iter(pure.values()))}). The hot paths and the CPU kernels are then many times slower. "
            f"To fix it, {fix}. Set ROSEFAST_NO_EXTENSIONS=1 to choose the twins on purpose.")


def __getattr__(name):
    if name == "EXTENSIONS":   # True when every accelerated module runs its compiled flavour (computed on use)
        return all(f == "compiled" for f in flavours().values())
    raise AttributeError(f"module 'rosefast' has no attribute {name!r}")
