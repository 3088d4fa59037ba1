# cython: language_level=3
"""Linears on GGUF's Q4_1 and Q8_0 blocks as C kernels (csrc/quant_kernels.h: integer dot products on the tier
the CPU runs — AVX-512 VNNI, AVX-VNNI, AVX2, NEON or portable C —, the activations as two int8 digits per 32 inputs);
twin: _quant_ops_py, the same arithmetic in torch.

    check_tiles(w, d, m, bias, out_features, in_features, q8)     # once, when a layer is made
    kernels = tier("avx2")                                          # or tier(tiers()[0]): the best here
    y = kernels.linear(x, w, d, m, bias, out_features, q8)         # w, d, m: rosefast.models.quant_tiles
"""
from libc.stdint cimport int64_t, uint8_t, uint16_t, uintptr_t

import torch

from rosefast.config import CPU_KERNELS
from rosefast.models._quant_ops_py import check_tiles

from quant_kernels cimport rf_quant_linear, rf_quant_tier_ok

cdef object F32 = torch.float32
cdef object BF16 = torch.bfloat16

TIERS = ("scalar", "avx2", "avxvnni", "avx512vnni", "neon")   # csrc/quant_kernels.h's RF_TIER_* order
BEST_FIRST = tuple(k for k in CPU_KERNELS if k in TIERS)   # the settings list them best first


def tiers():
    """The tiers this CPU runs, best first."""
    return [name for name in BEST_FIRST if rf_quant_tier_ok(TIERS.index(name))]


cdef class Tier:
    """One tier of the kernels (made by `tier(name)`)."""
    cdef readonly int index
    cdef readonly str name

    def __init__(self, str name):
        if name not in TIERS:
            raise ValueError(f"unknown kernel tier {name!r}; the tiers are {', '.join(BEST_FIRST)}")
        if not rf_quant_tier_ok(TIERS.index(name)):
            raise ValueError(f"this CPU does not run the {name} kernels; it runs {', '.join(tiers())}")
        self.index, self.name = TIERS.index(name), name

    def __repr__(self):
        return f"<block kernels {self.name}>"

    def linear(self, x, w, d, m, bias, int64_t out_features, bint q8):
        """x [B, K] float32 or bfloat16, contiguous -> [B, out_features] of x's dtype. The tiles as check_tiles
        passed them: uint8 w [T, K/32, 256 or 512]; fp16 d, m [T, K/32, 16] (m None for Q8_0); bias float32 or
        None."""
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
        cdef int rc, index = self.index
        with nogil:
            rc = rf_quant_linear(index, q8, <const uint8_t *>pw, <const uint16_t *>pd, <const uint16_t *>pm,
                                 <const float *>pb, <const void *>px, bf16, B, N, K, <void *>py, bf16)
        if rc != 0:
            raise MemoryError(f"quantized linear: no memory for {B} rows' activations")
        return y


_made = {}


def tier(str name):
    """The Tier `name` (one object per name, so layers on the same tier hold the same one)."""
    if name not in _made:
        _made[name] = Tier(name)
    return _made[name]
