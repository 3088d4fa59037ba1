# cython: language_level=3, wraparound=True
"""A layer's small ops as C kernels (csrc/decode_kernels.h), fp32 and bf16 CPU tensors; twin: _kernels_py.

Each call checks its tensors (dtype, contiguity), takes their data pointers and runs with the GIL
released. Same signatures and results (to rounding) as the torch twin.
"""
from libc.stdint cimport int64_t, uint16_t, uintptr_t

import torch

from rosefast.kernels._layer_ops_py import attention_isa_limit, decode_shapes

from decode_kernels cimport (rf_attention_isa, rf_decode_attention_bf16, rf_decode_attention_f32, rf_rms_norm_bf16,
                             rf_set_attention_limit,
                             rf_rms_norm_f32, rf_gelu_tanh_mul_bf16, rf_gelu_tanh_mul_f32, rf_silu_mul_bf16, rf_silu_mul_f32,
                             rf_store_kv_bf16, rf_store_kv_f32)

cdef extern from "delta_rule.h" nogil:
    int RF_DELTA_MAX_DV
    void rf_delta_step(float *pool, const int64_t *slots, int64_t rows, int64_t heads, int64_t dk, int64_t dv,
                       const float *q, const float *k, const float *v, const float *g, const float *beta, float *out)
    void rf_delta_sequence(float *state, int64_t n, int64_t heads, int64_t dk, int64_t dv, const float *q,
                           const float *k, const float *v, const float *g, const float *beta, float *out)

cdef extern from "delta_decode.h" nogil:
    void rf_delta_decode(const void *proj, int64_t row_stride, const void *ba, int64_t ba_stride, const void *conv,
                         int64_t K, void *tails, float *pool, const int64_t *slots, int64_t rows, const void *A_log,
                         const void *dt_bias, const void *norm, float eps, int64_t hk, int64_t hv, int64_t dk,
                         int64_t dv, int tiled, int bf16, float *x, void *out)

rf_set_attention_limit(attention_isa_limit())   # the tier ROSEFAST_CPU_KERNELS forces, this module's copy

FOLLOWS_CONTEXT = True     # decode reads each row's blocks in place, up to its context length

cdef object F32 = torch.float32
cdef object BF16 = torch.bfloat16
cdef object I64 = torch.int64


cdef inline uintptr_t _ptr(t, dtype, str name) except 0:
    if t.dtype is not dtype or not t.is_cpu or not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous CPU {dtype} tensor, got {t.dtype} {tuple(t.shape)} "
                         f"on {t.device}")
    if t.numel() == 0:
        raise ValueError(f"{name}: empty tensor")
    return <uintptr_t>t.data_ptr()


cdef inline bint _is_bf16(t) except -1:
    if t.dtype is BF16:
        return True
    if t.dtype is F32:
        return False
    raise ValueError(f"compiled kernels take float32 or bfloat16 tensors, got {t.dtype}")


def rms_norm(x, weight, float eps, residual=None):
    """RMSNorm of x's rows times weight -> a new tensor; with residual, x += residual (in place) first."""
    cdef bint bf16 = _is_bf16(x)
    dt = x.dtype
    cdef int64_t n = x.shape[-1]
    cdef int64_t rows = x.numel() // n
    if weight.numel() != n or (residual is not None and residual.shape != x.shape):
        raise ValueError(f"rms_norm: shapes x {tuple(x.shape)}, weight {tuple(weight.shape)} do not match")
    out = torch.empty_like(x)
    cdef uintptr_t px = _ptr(x, dt, "x"), pw = _ptr(weight, dt, "weight"), po = _ptr(out, dt, "out")
    cdef uintptr_t py = 0 if residual is None else _ptr(residual, dt, "residual")
    with nogil:
        if bf16:
            rf_rms_norm_bf16(<uint16_t *>px, <uint16_t *>py, <uint16_t *>pw, <uint16_t *>po, rows, n, eps)
        else:
            rf_rms_norm_f32(<float *>px, <float *>py, <float *>pw, <float *>po, rows, n, eps)
    return out


def store_kv(qkv, int num_heads, int num_kv_heads, slots, k_cache, v_cache, cos=None, sin=None):
    """qkv [T, (H + 2 Hkv) * D]: RoPE q and k in place (cos/sin: [T, D] rows per token, or None), then
    write k and v into the layer's pools [Hkv, blocks, block_size, D] at slots [T]."""
    cdef bint bf16 = _is_bf16(qkv)
    dt = qkv.dtype
    cdef int64_t tokens = qkv.shape[0]
    cdef int D = k_cache.shape[-1]
    cdef int64_t pool_slots = k_cache.shape[1] * k_cache.shape[2]
    if qkv.numel() != tokens * (num_heads + 2 * num_kv_heads) * D or k_cache.shape[0] != num_kv_heads:
        raise ValueError(f"store_kv: qkv {tuple(qkv.shape)} does not fit {num_heads} + 2 x {num_kv_heads} heads "
                         f"of {D} / pools {tuple(k_cache.shape)}")
    if slots.numel() != tokens:
        raise ValueError(f"store_kv: {slots.numel()} slots for {tokens} tokens")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"store_kv: K pool {tuple(k_cache.shape)} and V pool {tuple(v_cache.shape)} differ")
    if cos is not None and (cos.shape != (tokens, D) or sin.shape != (tokens, D)):
        raise ValueError(f"store_kv: cos/sin must be [{tokens}, {D}], got {tuple(cos.shape)}")
    cdef uintptr_t pq = _ptr(qkv, dt, "qkv"), ps = _ptr(slots, I64, "slots")
    cdef uintptr_t pk = _ptr(k_cache, dt, "k_cache"), pv = _ptr(v_cache, dt, "v_cache")
    cdef uintptr_t pc = 0 if cos is None else _ptr(cos, dt, "cos")
    cdef uintptr_t pn = 0 if cos is None else _ptr(sin, dt, "sin")
    with nogil:
        if bf16:
            rf_store_kv_bf16(<uint16_t *>pq, tokens, num_heads, num_kv_heads, D, <int64_t *>ps, <uint16_t *>pc,
                             <uint16_t *>pn, <uint16_t *>pk, <uint16_t *>pv, pool_slots)
        else:
            rf_store_kv_f32(<float *>pq, tokens, num_heads, num_kv_heads, D, <int64_t *>ps, <float *>pc,
                            <float *>pn, <float *>pk, <float *>pv, pool_slots)


def attention_kernel():
    """Which decode attention runs: "avx512", "avx2" or "portable" (the widest this CPU has, or the one the tier
    ROSEFAST_CPU_KERNELS forces stays within: csrc/decode_kernels.h, rf_attention_isa)."""
    return ("portable", "avx2", "avx512")[rf_attention_isa()]


def decode_attention(qkv, int num_heads, int num_kv_heads, k_cache, v_cache, meta, float scale, int64_t window=0):
    """Each sequence's one query (the q of its qkv row) over its context (its last `window` positions when
    given: a sliding window), read from the pools in place through meta.block_tables [B, width] and
    meta.context_lens [B] -> [B, H * D]."""
    cdef bint bf16 = _is_bf16(qkv)
    dt = qkv.dtype
    cdef int64_t B, width
    cdef int D, block_size
    cdef int64_t pool_slots
    B, width, D, block_size, pool_slots = decode_shapes(qkv, num_heads, num_kv_heads, k_cache, meta)
    out = torch.empty((B, num_heads * D), dtype=dt)
    cdef uintptr_t pq = _ptr(qkv, dt, "qkv"), pk = _ptr(k_cache, dt, "k_cache"), pv = _ptr(v_cache, dt, "v_cache")
    cdef uintptr_t pt = _ptr(meta.block_tables, I64, "block_tables"), po = _ptr(out, dt, "out")
    cdef uintptr_t pl = _ptr(meta.context_lens, I64, "context_lens")
    cdef int rc
    with nogil:
        if bf16:
            rc = rf_decode_attention_bf16(<uint16_t *>pq, B, num_heads, num_kv_heads, D, <uint16_t *>pk,
                                          <uint16_t *>pv, pool_slots, block_size, <int64_t *>pt, width,
                                          <int64_t *>pl, window, scale, <uint16_t *>po)
        else:
            rc = rf_decode_attention_f32(<float *>pq, B, num_heads, num_kv_heads, D, <float *>pk, <float *>pv,
                                         pool_slots, block_size, <int64_t *>pt, width, <int64_t *>pl, window,
                                         scale, <float *>po)
    if rc != 0:
        raise MemoryError("decode_attention: no memory for the attention work buffers")
    return out


def silu_mul(gate_up):
    """gate_up [T, 2 * I] (gate | up) -> silu(gate) * up, [T, I]."""
    return _act_mul(gate_up, False)


def gelu_tanh_mul(gate_up):
    """gate_up [T, 2 * I] (gate | up) -> tanh-GELU(gate) * up, [T, I] (Gemma's MLP)."""
    return _act_mul(gate_up, True)


cdef _act_mul(gate_up, bint gelu):
    cdef bint bf16 = _is_bf16(gate_up)
    dt = gate_up.dtype
    cdef int64_t n = gate_up.shape[-1] // 2
    cdef int64_t rows = gate_up.numel() // (2 * n)
    out = torch.empty((*gate_up.shape[:-1], n), dtype=dt)
    cdef uintptr_t pg = _ptr(gate_up, dt, "gate_up"), po = _ptr(out, dt, "out")
    with nogil:
        if bf16 and gelu:
            rf_gelu_tanh_mul_bf16(<uint16_t *>pg, <uint16_t *>po, rows, n)
        elif bf16:
            rf_silu_mul_bf16(<uint16_t *>pg, <uint16_t *>po, rows, n)
        elif gelu:
            rf_gelu_tanh_mul_f32(<float *>pg, <float *>po, rows, n)
        else:
            rf_silu_mul_f32(<float *>pg, <float *>po, rows, n)
    return out


def _delta_shapes(str name, state, q, k, v, g, beta):
    """(rows or tokens, heads, dk, dv) of a delta-rule call, or ValueError naming the shapes that do not match."""
    b, h, dk, dv = q.shape[0], q.shape[1], q.shape[2], v.shape[2]
    if (tuple(state.shape[-3:]) != (h, dk, dv) or tuple(k.shape) != (b, h, dk) or tuple(v.shape[:2]) != (b, h)
            or tuple(g.shape) != (b, h) or tuple(beta.shape) != (b, h)):
        raise ValueError(f"{name}: shapes state {tuple(state.shape)}, q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}, g {tuple(g.shape)}, beta {tuple(beta.shape)} do not match")
    if dv > RF_DELTA_MAX_DV:
        raise ValueError(f"{name}: v heads of {dv} > {RF_DELTA_MAX_DV}")
    return b, h, dk, dv


def delta_step(pool, slots, q, k, v, g, beta):
    """The gated delta rule's decode step (csrc/delta_rule.h): each row's state in `pool` [slots, H, dk, dv] (fp32,
    at its slot) updated in place by its q, k [B, H, dk], v [B, H, dv], log-decay g and beta [B, H] (all fp32) ->
    out [B, H, dv]."""
    cdef int64_t b, h, dk, dv
    b, h, dk, dv = _delta_shapes("delta_step", pool, q, k, v, g, beta)
    if pool.dim() != 4 or tuple(slots.shape) != (b,):
        raise ValueError(f"delta_step: shapes pool {tuple(pool.shape)}, slots {tuple(slots.shape)} for {b} rows")
    out = torch.empty((b, h, dv), dtype=F32)
    cdef uintptr_t pp = _ptr(pool, F32, "pool"), ps = _ptr(slots, I64, "slots"), pq = _ptr(q, F32, "q")
    cdef uintptr_t pk = _ptr(k, F32, "k"), pv = _ptr(v, F32, "v"), pg = _ptr(g, F32, "g")
    cdef uintptr_t pb = _ptr(beta, F32, "beta"), po = _ptr(out, F32, "out")
    with nogil:
        rf_delta_step(<float *>pp, <const int64_t *>ps, b, h, dk, dv, <const float *>pq, <const float *>pk,
                      <const float *>pv, <const float *>pg, <const float *>pb, <float *>po)
    return out


cdef inline uintptr_t _rows_ptr(t, dtype, int64_t rows, int64_t width, str name) except 0:
    """A [rows, width] CPU tensor of `dtype` whose rows may be apart (a slice of a wider projection's output)"""
    if (t.dtype is not dtype or not t.is_cpu or t.dim() != 2 or tuple(t.shape) != (rows, width)
            or t.stride(1) != 1):
        raise ValueError(f"{name}: expected a CPU {dtype} tensor [{rows}, {width}] of unit column stride, got "
                         f"{t.dtype} {tuple(t.shape)} on {t.device}")
    return <uintptr_t>t.data_ptr()


def delta_decode(proj, ba, conv, tails, pool, slots, A_log, dt_bias, norm, float eps, int64_t k_heads, bint tiled):
    """A Gated DeltaNet's decode step after its projections (csrc/delta_decode.h): proj [B, C + Hv dv] (q|k|v, the
    conv's C channels, then z), ba [B, 2 Hv] (b then a); the conv [C, K] over each row's tail in `tails` [slots,
    K - 1, C] (updated), each row's recurrent state in `pool` [slots, Hv, dk, dv] (fp32, updated) at `slots` [B];
    A_log, dt_bias [Hv], the gated norm's weight [dv] -> out [B, Hv dv], in proj's dtype (fp32 or bf16, which the
    weights and tails share)."""
    if pool.dim() != 4 or conv.dim() != 2 or tails.dim() != 3 or slots.dim() != 1:
        raise ValueError(f"delta_decode: shapes pool {tuple(pool.shape)}, conv {tuple(conv.shape)}, tails "
                         f"{tuple(tails.shape)}, slots {tuple(slots.shape)}")
    cdef int64_t b = slots.shape[0], hv = pool.shape[1], dk = pool.shape[2], dv = pool.shape[3], K = conv.shape[1]
    cdef int64_t c = 2 * k_heads * dk + hv * dv
    if (k_heads <= 0 or hv % k_heads or tuple(conv.shape) != (c, K) or tuple(tails.shape[1:]) != (K - 1, c)
            or tuple(A_log.shape) != (hv,) or tuple(dt_bias.shape) != (hv,) or tuple(norm.shape) != (dv,)):
        raise ValueError(f"delta_decode: conv {tuple(conv.shape)}, tails {tuple(tails.shape)}, A_log "
                         f"{tuple(A_log.shape)}, dt_bias {tuple(dt_bias.shape)}, norm {tuple(norm.shape)} do not "
                         f"fit {k_heads} k heads and a state of {tuple(pool.shape[1:])}")
    if dk > RF_DELTA_MAX_DV or dv > RF_DELTA_MAX_DV:
        raise ValueError(f"delta_decode: heads of {dk} x {dv} > {RF_DELTA_MAX_DV}")
    dt = proj.dtype
    cdef int bf16 = _is_bf16(proj)
    cdef uintptr_t pp = _rows_ptr(proj, dt, b, c + hv * dv, "proj"), pa = _rows_ptr(ba, dt, b, 2 * hv, "ba")
    cdef int64_t row_stride = proj.stride(0), ba_stride = ba.stride(0)
    x = torch.empty((b, c), dtype=F32)
    out = torch.empty((b, hv * dv), dtype=dt)
    cdef uintptr_t pc = _ptr(conv, dt, "conv"), pt = _ptr(tails, dt, "tails"), pl = _ptr(pool, F32, "pool")
    cdef uintptr_t ps = _ptr(slots, I64, "slots"), pA = _ptr(A_log, dt, "A_log"), pd = _ptr(dt_bias, dt, "dt_bias")
    cdef uintptr_t pn = _ptr(norm, dt, "norm"), px = _ptr(x, F32, "x"), po = _ptr(out, dt, "out")
    with nogil:
        rf_delta_decode(<const void *>pp, row_stride, <const void *>pa, ba_stride, <const void *>pc, K,
                        <void *>pt, <float *>pl, <const int64_t *>ps, b, <const void *>pA, <const void *>pd,
                        <const void *>pn, eps, k_heads, hv, dk, dv, tiled, bf16, <float *>px, <void *>po)
    return out


def delta_sequence(state, q, k, v, g, beta):
    """One sequence's n tokens of the gated delta rule from `state` [H, dk, dv] (fp32, updated in place): q, k [n, H,
    dk], v [n, H, dv], g and beta [n, H] (fp32) -> out [n, H, dv]. Each head's tokens in order in C
    (csrc/delta_rule.h), its state cache-resident from one to the next."""
    cdef int64_t n, h, dk, dv
    n, h, dk, dv = _delta_shapes("delta_sequence", state, q, k, v, g, beta)
    if state.dim() != 3:
        raise ValueError(f"delta_sequence: state {tuple(state.shape)} is not one sequence's [H, dk, dv]")
    out = torch.empty((n, h, dv), dtype=F32)
    cdef uintptr_t ps = _ptr(state, F32, "state"), pq = _ptr(q, F32, "q"), pk = _ptr(k, F32, "k")
    cdef uintptr_t pv = _ptr(v, F32, "v"), pg = _ptr(g, F32, "g"), pb = _ptr(beta, F32, "beta")
    cdef uintptr_t po = _ptr(out, F32, "out")
    with nogil:
        rf_delta_sequence(<float *>ps, n, h, dk, dv, <const float *>pq, <const float *>pk, <const float *>pv,
                          <const float *>pg, <const float *>pb, <float *>po)
    return out
