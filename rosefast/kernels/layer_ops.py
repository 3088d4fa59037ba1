"""A layer's small ops — RMSNorm (+ residual), RoPE + K/V store, paged decode attention, SiLU-mul, the gated delta
rule's decode step.

    ops = for_tensor(x)     # the compiled kernels for CPU fp32/bf16 tensors, else the torch twin
    h = ops.rms_norm(x, weight, eps, residual)

The compiled flavour (_kernels_c, C in csrc/decode_kernels.h) reads the paged pools in place and runs
each op as one call with the GIL released; the torch twin (_kernels_py) is the reference and what
ROSEFAST_NO_EXTENSIONS=1 selects. On CUDA: the twin with a Triton decode attention (_kernels_triton) when
Triton imports and ROSEFAST_TRITON is not 0, else the twin. All take and return the same tensors;
`FOLLOWS_CONTEXT` says whether a flavour's decode reads a padded block table only up to each context.
"""

import torch

from rosefast._select import select
from rosefast.config import process_setting
from rosefast.kernels import _layer_ops_py as reference

GatherWorkspace = reference.GatherWorkspace   # the torch twin's decode gather buffers (the runner keeps one)

impl = select("layer_ops", package="rosefast.kernels")
_COMPILED_DTYPES = (torch.float32, torch.bfloat16)


_cuda = []


def cuda_flavour():
    if not _cuda:
        flavour = reference
        if process_setting("ROSEFAST_TRITON"):
            try:
                from rosefast.kernels import _layer_ops_triton as flavour
            except ImportError:
                pass
        _cuda.append(flavour)
    return _cuda[0]


def for_device(device, dtype):
    """The flavour that runs on this device and dtype."""
    if device.type == "cuda":
        return cuda_flavour()
    if impl is not reference and device.type == "cpu" and dtype in _COMPILED_DTYPES:
        return impl
    return reference


def for_tensor(x):
    """The flavour that runs on x's device and dtype."""
    return for_device(x.device, x.dtype)


__all__ = ["cuda_flavour", "for_device", "for_tensor", "reference"]
