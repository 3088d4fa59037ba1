"""Linears on GGUF's block formats: the compiled flavour (csrc/quant_kernels.h, a tier per CPU family) or its
torch twin (ROSEFAST_NO_EXTENSIONS=1, and for tests).

    kernels = pick("auto")       # ROSEFAST_CPU_KERNELS: the best tier this CPU runs, a named one, or None
    kernels = pick("auto", "one-digit")   # its activations as one int8 digit (rosefast.config.ACTIVATIONS)
    weights = impl.Weights(tiles, bias, in_features)          # once: quant_tiles.Tiles, one or more parts
    if kernels is not None: y = kernels.linear(x, weights)
    with decoding(sequences): ...   # a speculative step: its rows on the path its sequences' decode step takes
"""
import threading
from contextlib import contextmanager

from rosefast._select import select
from rosefast.config import ACTIVATIONS, CPU_KERNELS, forced_cpu_kernels

impl = select("quant_ops", package="rosefast.kernels")


class _Step(threading.local):
    sequences = 0   # 0: a linear's own row count picks its tier's path


step = _Step()   # this thread's step, read by the quantized linears and the decode plan


@contextmanager
def decoding(sequences):
    """The linears of a step that verifies speculative proposals (more rows than sequences) take the path their
    tier would take for those sequences' plain decode step (the AMX tier's VNNI kernels below 12 rows, the AVX2
    tier's integer ones below 8): each row's numbers, and so greedy tokens, are then the same as without
    speculation."""
    step.sequences = sequences
    try:
        yield
    finally:
        step.sequences = 0


def pick(setting="auto", activations="two-digit"):
    """The kernels for a cpu_kernels setting (rosefast.config.CPU_KERNELS): "auto" is what ROSEFAST_CPU_KERNELS
    names when it is set (so one variable forces a tier for the server, the library and the tests alike), else
    the best tier this CPU runs (None, torch's ops, on the pure-Python flavour); a tier's name is that tier (a
    ValueError saying what runs here when this CPU or build does not run it); "torch" is None. `activations`: the
    tier's digits (rosefast.config.ACTIVATIONS)."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {', '.join(ACTIVATIONS)}; got {activations!r}")
    digits = ACTIVATIONS[activations]
    if setting == "auto":
        setting = forced_cpu_kernels()
    if setting not in CPU_KERNELS:
        raise ValueError(f"cpu_kernels must be one of {', '.join(CPU_KERNELS)}; got {setting!r}")
    if setting == "torch":
        return None
    if setting == "auto":
        best = impl.tiers()
        return impl.tier(best[0], digits) if best else None
    return impl.tier(setting, digits)


def available():
    """Every setting that runs here, best first: the compiled tiers, then torch's ops."""
    return list(impl.tiers()) + ["torch"]
