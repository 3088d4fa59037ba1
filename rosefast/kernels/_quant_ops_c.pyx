# cython: language_level=3
"""Linears on GGUF's block formats (Q4_0/Q4_1, Q5_0/Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) as C kernels
(csrc/quant_kernels.h: integer dot products on the tier the CPU runs — AVX-512 VNNI, AVX-VNNI, AVX2, NEON or
portable C —, the activations as two int8 digits per 32 inputs; the AMX tier's tiles, from 12 rows, on the blocks'
values in bf16 instead); twin: _quant_ops_py, the same arithmetic in torch.

    weights = Weights(parts, bias, in_features)     # once, when a layer is made: parts are quant_tiles.Tiles
    kernels = tier("avx2")                          # or tier(tiers()[0]): the best here; tier("avx2", 1): one digit
    y = kernels.linear(x, weights)
    e = rows(weights, ids, torch.bfloat16)          # rows of a one-part weight: an embedding from its blocks
"""
from libc.stdint cimport int64_t, uint8_t, uint16_t, uintptr_t

import torch

from rosefast.config import CPU_KERNELS
from rosefast.kernels import _quant_ops_py
from rosefast.quant.tiles import FORMATS

from libc.stdlib cimport free, malloc

from quant_kernels cimport (RF_FMTS, RF_TIERS, rf_format_name, rf_qweights, rf_quant_experts, rf_quant_linear_rows,
                            rf_quant_own_rows, rf_quant_rows, rf_quant_tier_ok, rf_tier_name)

cdef object F32 = torch.float32
cdef object BF16 = torch.bfloat16
cdef object I64 = torch.int64

TIERS = tuple(rf_tier_name(i).decode() for i in range(RF_TIERS))   # csrc/quant_common.h's list, by number
if set(TIERS) != set(CPU_KERNELS) - {"auto", "torch"} or \
        tuple(rf_format_name(i).decode() for i in range(RF_FMTS)) != FORMATS:
    raise ImportError("csrc/quant_common.h's tiers or formats are not rosefast.config.CPU_KERNELS' or "
                      "rosefast/quant/tiles.py's FORMATS: the one list of each must be changed in both",
                      name="rosefast.kernels._quant_ops_c.lists")
BEST_FIRST = tuple(k for k in CPU_KERNELS if k in TIERS)   # the settings list them best first


def tiers():
    """The tiers this CPU runs, best first."""
    return [name for name in BEST_FIRST if rf_quant_tier_ok(TIERS.index(name))]


cdef inline uintptr_t _p(t):
    return 0 if t is None else <uintptr_t>t.data_ptr()


cdef class Weights:
    """A linear's weights for the kernels: its parts (quant_tiles.Tiles, one after another along the outputs, each
    in its own format) and a float32 bias or None, checked once and held as the kernels' pointers."""
    cdef rf_qweights c[8]   # csrc's RF_QPARTS (_quant_ops_py.MAX_PARTS checks the count)
    cdef int nparts
    cdef const float *pbias
    cdef readonly object parts, bias
    cdef readonly int64_t in_features, out_features

    def __init__(self, parts, bias, int64_t in_features):
        checked = _quant_ops_py.Weights(parts, bias, in_features)
        self.parts, self.bias = checked.parts, bias
        self.in_features, self.out_features = in_features, checked.out_features
        self.nparts = len(self.parts)
        self.pbias = <const float *>_p(bias)
        for i, t in enumerate(self.parts):
            self.c[i].fmt = FORMATS.index(t.fmt)
            self.c[i].n = t.n
            self.c[i].w = <const uint8_t *>_p(t.w)
            self.c[i].d = <const uint16_t *>_p(t.d)
            self.c[i].m = <const uint16_t *>_p(t.m)
            self.c[i].sc = <const uint8_t *>_p(t.sc)
            self.c[i].mn = <const uint8_t *>_p(t.mn)


cdef class ExpertWeights:
    """A mixture-of-experts layer's experts for the kernels: each one's fused gate|up and down Weights (E of each,
    their shapes checked once), held as the kernels' pointer arrays."""
    cdef const rf_qweights **gate_up_c
    cdef const rf_qweights **down_c
    cdef int *gate_up_n
    cdef int *down_n
    cdef readonly object gate_up, down
    cdef readonly int64_t num_experts, hidden, width

    def __init__(self, gate_up, down):
        checked = _quant_ops_py.ExpertWeights(gate_up, down)
        self.gate_up, self.down = checked.gate_up, checked.down
        self.num_experts, self.hidden, self.width = checked.num_experts, checked.hidden, checked.width
        cdef int64_t E = self.num_experts
        self.gate_up_c = <const rf_qweights **>malloc(E * sizeof(rf_qweights *))
        self.down_c = <const rf_qweights **>malloc(E * sizeof(rf_qweights *))
        self.gate_up_n = <int *>malloc(E * sizeof(int))
        self.down_n = <int *>malloc(E * sizeof(int))
        if not (self.gate_up_c and self.down_c and self.gate_up_n and self.down_n):
            raise MemoryError("experts: no memory for the pointer arrays")
        cdef Weights w
        for e in range(E):
            w = self.gate_up[e]
            self.gate_up_c[e], self.gate_up_n[e] = &w.c[0], w.nparts
            w = self.down[e]
            self.down_c[e], self.down_n[e] = &w.c[0], w.nparts

    def __dealloc__(self):
        free(self.gate_up_c)
        free(self.down_c)
        free(self.gate_up_n)
        free(self.down_n)


cdef class Tier:
    """One tier of the kernels with the activations' digits, 2 or 1 (made by `tier(name, digits)`)."""
    cdef readonly int index, digits
    cdef readonly str name

    def __init__(self, str name, int digits=2):
        if name not in TIERS:
            raise ValueError(f"unknown kernel tier {name!r}; the tiers are {', '.join(BEST_FIRST)}")
        if not rf_quant_tier_ok(TIERS.index(name)):
            raise ValueError(f"this CPU does not run the {name} kernels; it runs {', '.join(tiers())}")
        _quant_ops_py.check_digits(digits)
        self.index, self.name, self.digits = TIERS.index(name), name, digits

    def __repr__(self):
        return f"<block kernels {self.name}{', one digit' if self.digits == 1 else ''}>"

    def own_numbers_from(self, dtype):
        """The activation rows from which this tier computes with numbers of its own, not the int8 digits' (the
        AMX tier's bf16 tiles; the AVX2 tier's fp32 FMAs with two digits: other last bits), for float32 or bfloat16
        activations; None: never."""
        return rf_quant_own_rows(self.index, dtype is BF16, self.digits) or None

    def linear(self, x, Weights weights, int64_t path_rows=0):
        """x [B, K] float32 or bfloat16, contiguous -> [B, out_features] of x's dtype. path_rows: the row count
        that picks the tier's path where it has two (0: B; see quant_ops.step)."""
        dt = x.dtype
        if (dt is not F32 and dt is not BF16) or x.dim() != 2 or not x.is_contiguous() or not x.is_cpu:
            raise ValueError(f"quantized linear: x must be a contiguous 2-D CPU float32/bfloat16 tensor, got {dt} "
                             f"{tuple(x.shape)}")
        cdef int64_t B = x.shape[0], K = x.shape[1]
        if K != weights.in_features:
            raise ValueError(f"quantized linear: x {tuple(x.shape)} does not fit {weights.in_features} inputs")
        y = torch.empty((B, weights.out_features), dtype=dt)
        if B == 0:
            return y
        cdef uintptr_t px = x.data_ptr(), py = y.data_ptr()
        cdef int bf16 = dt is BF16
        cdef int rc, index = self.index, digits = self.digits
        with nogil:
            rc = rf_quant_linear_rows(index, weights.c, weights.nparts, weights.pbias, <const void *>px, bf16, B, K,
                                      <void *>py, bf16, path_rows, digits)
        if rc == -1:
            raise MemoryError(f"quantized linear: no memory for {B} rows' activations")
        if rc != 0:
            raise ValueError(f"quantized linear: the kernels refused the weights (code {rc})")
        return y

    def experts(self, x, ExpertWeights experts, order, counts, weights, int64_t top_k, int64_t path_rows=0):
        """A mixture-of-experts layer's routed experts in one call (csrc/quant_experts.h): x [T, H] float32 or
        bfloat16, contiguous; order [T * top_k] int64, the flattened picks sorted by expert; counts [E] int64;
        weights [T * top_k], the picks' routing weights in x's dtype -> [T, H], each row's weighted sum."""
        _quant_ops_py.check_experts_call(x, experts, order, counts, weights, top_k)
        cdef int64_t T = x.shape[0], H = x.shape[1], E = experts.num_experts, I = experts.width
        out = torch.empty((T, H), dtype=x.dtype)
        if T == 0:
            return out
        cdef uintptr_t px = x.data_ptr(), po = out.data_ptr(), pord = order.data_ptr()
        cdef uintptr_t pc = counts.data_ptr(), pw = weights.data_ptr()
        cdef int rc, bf16 = x.dtype is BF16, index = self.index, digits = self.digits
        with nogil:
            rc = rf_quant_experts(index, experts.gate_up_c, experts.gate_up_n, experts.down_c, experts.down_n, E,
                                  <const void *>px, bf16, T, H, I, <const int64_t *>pord, <const int64_t *>pc,
                                  <const void *>pw, top_k, <void *>po, path_rows, digits)
        if rc == -1:
            raise MemoryError(f"experts: no memory for {T} rows' picks")
        if rc != 0:
            raise ValueError(f"experts: the kernels refused the call (code {rc})")
        return out


def rows(Weights weights, ids, dtype):
    """The rows `ids` (int64, any shape) of a one-part weight as `dtype` (float32 or bfloat16) [*ids.shape, K]:
    the blocks' own numbers (quant_tiles.dequantize_tiles' rows)."""
    if weights.nparts != 1:
        raise ValueError(f"rows: a weight of one part, not {weights.nparts}")
    if dtype is not F32 and dtype is not BF16:
        raise ValueError(f"rows: float32 or bfloat16, not {dtype}")
    flat = ids.reshape(-1).to(I64).contiguous()
    cdef int64_t n = flat.numel(), K = weights.in_features
    out = torch.empty((n, K), dtype=dtype)
    cdef uintptr_t pi = flat.data_ptr(), po = out.data_ptr()
    cdef int rc, bf16 = dtype is BF16
    with nogil:
        rc = rf_quant_rows(&weights.c[0], <const int64_t *>pi, n, K, <void *>po, bf16)
    if rc != 0:
        raise IndexError(f"rows: an id out of 0..{weights.out_features - 1}")
    return out.view(*ids.shape, K)


_made = {}


def tier(str name, int digits=2):
    """The Tier `name` with `digits` (one object per pair, so layers on the same tier hold the same one)."""
    if (name, digits) not in _made:
        _made[name, digits] = Tier(name, digits)
    return _made[name, digits]
