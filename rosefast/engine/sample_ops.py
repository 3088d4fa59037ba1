"""The sampler's per-row ops — argmax, and one draw per row under temperature / top_k / top_p / min_p.

    ops = for_tensor(logits)   # the compiled kernels for CPU fp32/bf16 logits, else the torch twin
    tokens = ops.sample(logits, temperatures, top_ks, top_ps, min_ps, u)

The compiled flavour (_sample_ops_c, C in csrc/sample_kernels.h) reads each row once, finds the top_k /
top_p thresholds with a histogram instead of a sort, and runs rows in parallel with the GIL released;
the torch twin (_sample_ops_py) is the reference, the CUDA path and what ROSEFAST_NO_EXTENSIONS=1 selects.
"""
import torch

from rosefast._select import select
from rosefast.engine import _sample_ops_py as reference

impl = select("sample_ops", package="rosefast.engine")
_COMPILED_DTYPES = (torch.float32, torch.bfloat16)


def for_tensor(x):
    """The flavour that runs on x's device and dtype."""
    if impl is not reference and x.is_cpu and x.dtype in _COMPILED_DTYPES and x.is_contiguous():
        return impl
    return reference


__all__ = ["for_tensor", "reference"]
