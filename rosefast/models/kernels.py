"""A layer's small ops — RMSNorm (+ residual), RoPE + K/V store, paged decode attention, SiLU-mul.

    ops = for_tensor(x)     # the compiled kernels for CPU fp32/bf16 tensors, else the torch twin
    h = ops.rms_norm(x, weight, eps, residual)

The compiled flavour (_kernels_c, C in csrc/decode_kernels.h) reads the paged pools in place and runs
each op as one call with the GIL released; the torch twin (_kernels_py) is the reference, the CUDA path
and what ROSEFAST_NO_EXTENSIONS=1 selects. Both take and return the same tensors.
"""
import torch

from rosefast._select import select
from rosefast.models import _kernels_py as reference

_impl = select("kernels", package="rosefast.models")
_COMPILED_DTYPES = (torch.float32, torch.bfloat16)


def for_tensor(x):
    """The flavour that runs on x's device and dtype."""
    if _impl is not reference and x.is_cpu and x.dtype in _COMPILED_DTYPES:
        return _impl
    return reference


__all__ = ["for_tensor", "reference"]
