"""rosefast: an LLM inference server with a torch batching core and Cython hot paths."""
import importlib

__version__ = "0.1.0"
__all__ = ["ACCELERATED", "EXTENSIONS", "flavours", "__version__"]

#: every module with a compiled flavour and a pure-Python twin (rosefast._select picks one at import)
ACCELERATED = ("rosefast.frontend.admission", "rosefast.frontend.collector", "rosefast.frontend.fanout",
               "rosefast.engine.sample_ops", "rosefast.models.kernels", "rosefast.models.quant_ops",
               "rosefast.models.decode_layer")


def flavours():
    """{module: "compiled" | "pure"} for every accelerated module (importing them: the last four import torch)."""
    from rosefast._select import selected

    for name in ACCELERATED:
        importlib.import_module(name)
    return {name: "compiled" if selected(name) else "pure" for name in ACCELERATED}


def __getattr__(name):
    if name == "EXTENSIONS":   # True when every accelerated module runs its compiled flavour (computed on use)
        return all(f == "compiled" for f in flavours().values())
    raise AttributeError(f"module 'rosefast' has no attribute {name!r}")
