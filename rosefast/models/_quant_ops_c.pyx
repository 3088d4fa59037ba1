# cython: language_level=3
"""Linears on GGUF's Q4_1 and Q8_0 blocks as C kernels (csrc/quant_kernels.h: AVX-512 VNNI integer dot
products, the activations as two int8 digits per 32 inputs); twin: _quant_ops_py, the same arithmetic.

    check_tiles(w, d, m, bias, out_features, in_features, q8)     # once, when a layer is made
    if fast(): y = linear(x, w, d, m, bias, out_features, q8)    # w, d, m: rosefast.models.quant_tiles
"""
from libc.stdint cimport int64_t, uint8_t, uint16_t, uintptr_t

import torch

from rosefast.models._quant_ops_py import check_tiles

from quant_kernels cimport rf_quant_cpu_ok, rf_quant_linear

cdef object F32 = torch.float32
cdef object BF16 = torch.bfloat16


def fast():
    """Whether this CPU runs the kernels (AVX-512 with VNNI); where not, the linears use torch's own ops."""
    return bool(rf_quant_cpu_ok())


def linear(x, w, d, m, bias, int64_t out_features, bint q8):
    """x [B, K] float32 or bfloat16, contiguous -> [B, out_features] of x's dtype. The tiles as check_tiles
    passed them: uint8 w [T, K/32, 256 or 512]; fp16 d, m [T, K/32, 16] (m None for Q8_0); bias float32 or None."""
    dt = x.dtype
    if (dt is not F32 and dt is not BF16) or x.dim() != 2 or not x.is_contiguous() or not x.is_cpu:
        raise ValueError(f"quantized linear: x must be a contiguous 2-D CPU float32/bfloat16 tensor, got {dt} "
                         f"{tuple(x.shape)}")
    cdef int64_t B = x.shape[0], K = x.shape[1], N = out_features
    if K != w.shape[1] * 32:
        raise ValueError(f"quantized linear: x {tuple(x.shape)} does not fit {w.shape[1] * 32} inputs")
    y = torch.empty((B, N), dtype=dt)
    if B == 0:
        return y
    cdef uintptr_t px = x.data_ptr(), pw = w.data_ptr(), pd = d.data_ptr(), py = y.data_ptr()
    cdef uintptr_t pm = 0 if m is None else m.data_ptr()
    cdef uintptr_t pb = 0 if bias is None else bias.data_ptr()
    cdef int bf16 = dt is BF16
    cdef int rc
    with nogil:
        rc = rf_quant_linear(q8, <const uint8_t *>pw, <const uint16_t *>pd, <const uint16_t *>pm, <const float *>pb,
                             <const void *>px, bf16, B, N, K, <void *>py, bf16)
    if rc != 0:
        raise MemoryError(f"quantized linear: no memory for {B} rows' activations" if rf_quant_cpu_ok() else
                          "quantized linear kernels need AVX-512 VNNI; this CPU has none (use torch's ops)")
    return y
