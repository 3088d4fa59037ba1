# cython: language_level=3
"""One Llama layer's decode step as one call: RMSNorm, the q|k|v linear, the per-head q/k RMSNorms where the
family has them (Qwen3, Gemma 3), RoPE and the K/V store, paged attention, the o linear (then Gemma's norm of
it), RMSNorm, gate|up, SiLU-mul (Gemma: tanh-GELU) and down (then Gemma's norm of it), each the C kernel the per-op path runs (csrc/decode_kernels.h, csrc/quant_kernels.h) in the same order,
so the results are the same bits; twin: _decode_layer_py (the layer's own forward). For layers whose four
linears run on the block kernels (rosefast.models.quantized), fp32 or bf16, on the CPU.

    if fits(layer): plan = LayerPlan(layer)                       # once: the weights' pointers
    step = StepInputs(cos, sin, meta)                             # once a step: what every layer shares
    x, mlp_out = plan(x, residual, step, k_cache, v_cache)        # as layer.forward for a decode step

The per-op path paid ~6-10 us of Python wrapping a call, nine calls a layer: ~2 ms of a ~10 ms step
here at batch 1. A step's shared inputs are checked once for all layers, and share one scratch allocation.
"""
from libc.stdint cimport int64_t, uint8_t, uint16_t, uintptr_t

import torch

from rosefast.kernels import quant_ops
from rosefast.kernels._layer_ops_py import attention_isa_limit
from rosefast.quant.tiles import FORMATS

from decode_kernels cimport (rf_decode_attention_bf16, rf_decode_attention_f32, rf_gelu_tanh_mul_bf16,
                             rf_gelu_tanh_mul_f32, rf_rms_norm_bf16, rf_rms_norm_f32, rf_silu_mul_bf16,
                             rf_set_attention_limit, rf_silu_mul_f32, rf_store_kv_bf16, rf_store_kv_f32)
from quant_kernels cimport rf_qweights, rf_quant_linear_rows

rf_set_attention_limit(attention_isa_limit())   # the tier ROSEFAST_CPU_KERNELS forces, this module's copy

cdef object F32 = torch.float32
cdef object BF16 = torch.bfloat16
cdef object I64 = torch.int64

cdef struct Linear:
    rf_qweights parts[8]   # csrc's RF_QPARTS
    int nparts
    const float *bias
    int64_t k
    int tier, digits


def _tier(layer):
    """The one compiled tier (with its digits) all four of the layer's linears run on, else None."""
    from rosefast.kernels._quant_ops_c import Tier
    found = [getattr(getattr(layer, name), "kernels", None) for name in ("qkv", "o", "gate_up", "down")]
    return found[0] if all(isinstance(k, Tier) and k is found[0] for k in found) else None


def fits(layer):
    """Whether `layer` (a LlamaLayer) can run here: its four linears on one tier of the compiled block kernels."""
    if not layer.input_norm.is_cpu or layer.input_norm.dtype not in (F32, BF16):
        return False
    return _tier(layer) is not None


cdef inline uintptr_t _opt(t):
    return 0 if t is None else <uintptr_t>t.data_ptr()


cdef inline uintptr_t _ptr(t, dtype, str name) except 0:
    if t.dtype is not dtype or not t.is_cpu or not t.is_contiguous() or t.numel() == 0:
        raise ValueError(f"decode_layer: {name} must be a non-empty contiguous CPU {dtype} tensor, got {t.dtype} "
                         f"{tuple(t.shape)} on {t.device}")
    return <uintptr_t>t.data_ptr()


cdef class LayerPlan:
    """A layer's weights as pointers, made once its weights are final (the plan holds the tensors it points
    into, so a layer whose weights are replaced later keeps a stale plan, never a dangling one)."""
    cdef Linear lin[4]
    cdef uintptr_t input_norm, post_norm, q_norm, k_norm, post_attn_norm, post_mlp_norm
    cdef bint gelu
    cdef readonly object layer
    cdef object tensors
    cdef int nh, nkv, D
    cdef int64_t hidden, inter, qkv_n
    cdef float eps, scale
    cdef int64_t window
    cdef object dtype

    def __init__(self, layer):
        if not fits(layer):
            raise ValueError("decode_layer: the layer's linears are not all on the block kernels")
        a = layer.args
        self.layer = layer
        self.tensors = [layer.input_norm.data, layer.post_norm.data]
        self.dtype = layer.input_norm.dtype
        if self.dtype is not F32 and self.dtype is not BF16:
            raise ValueError(f"decode_layer: float32 or bfloat16 layers only, got {self.dtype}")
        self.nh, self.nkv, self.D = a.num_heads, a.num_kv_heads, a.head_dim
        self.hidden, self.inter = a.hidden_size, a.intermediate_size
        self.qkv_n = (a.num_heads + 2 * a.num_kv_heads) * a.head_dim
        self.eps, self.scale, self.window = a.norm_eps, layer.scale, layer.window
        self.input_norm = _ptr(layer.input_norm.data, self.dtype, "input_norm")
        self.post_norm = _ptr(layer.post_norm.data, self.dtype, "post_norm")
        self.q_norm = self.k_norm = 0
        if a.qk_norm:   # per head of q and of k, in place on the q|k|v rows
            self.tensors += [layer.q_norm.data, layer.k_norm.data]
            self.q_norm = _ptr(layer.q_norm.data, self.dtype, "q_norm")
            self.k_norm = _ptr(layer.k_norm.data, self.dtype, "k_norm")
        self.post_attn_norm = self.post_mlp_norm = 0
        self.gelu = a.gemma
        if a.gemma:   # the attention's and the MLP's outputs normed too; a tanh-GELU gate
            self.tensors += [layer.post_attn_norm.data, layer.post_mlp_norm.data]
            self.post_attn_norm = _ptr(layer.post_attn_norm.data, self.dtype, "post_attn_norm")
            self.post_mlp_norm = _ptr(layer.post_mlp_norm.data, self.dtype, "post_mlp_norm")
        kernels = _tier(layer)
        cdef int tier = kernels.index, digits = kernels.digits
        shapes = ((self.qkv_n, self.hidden), (self.hidden, self.nh * self.D), (2 * self.inter, self.hidden),
                  (self.hidden, self.inter))
        for i, name in enumerate(("qkv", "o", "gate_up", "down")):
            lin = getattr(layer, name)
            if (lin.out_features, lin.in_features) != shapes[i]:
                raise ValueError(f"decode_layer: {name} is [{lin.out_features}, {lin.in_features}], the layer "
                                 f"needs {list(shapes[i])}")
            weights = lin.weights   # checked once by _quant_ops_c.Weights
            self.lin[i].nparts = len(weights.parts)
            for j, t in enumerate(weights.parts):
                self.lin[i].parts[j].fmt = FORMATS.index(t.fmt)
                self.lin[i].parts[j].n = t.n
                self.lin[i].parts[j].w = <const uint8_t *>_opt(t.w)
                self.lin[i].parts[j].d = <const uint16_t *>_opt(t.d)
                self.lin[i].parts[j].m = <const uint16_t *>_opt(t.m)
                self.lin[i].parts[j].sc = <const uint8_t *>_opt(t.sc)
                self.lin[i].parts[j].mn = <const uint8_t *>_opt(t.mn)
            self.lin[i].bias = <const float *>_opt(weights.bias)
            self.lin[i].k = lin.in_features
            self.lin[i].tier = tier
            self.lin[i].digits = digits
            self.tensors.append(weights)

    def __call__(self, x, residual, StepInputs step, k_cache, v_cache):
        """x [B, hidden]: the residual stream, updated in place; residual: the previous layer's MLP output or
        None. Returns (x, this layer's MLP output), as LlamaLayer.forward does for a decode step."""
        return _decode(self, x, residual, step, k_cache, v_cache)


cdef class StepInputs:
    """One decode step's inputs that every layer shares (RoPE rows, block tables, context lengths, slots),
    checked and taken as pointers once a step, and the layers' scratch (they run one after another)."""
    cdef readonly object cos, sin, meta
    cdef object scratch
    cdef uintptr_t pc, ps, pt, pl, psl
    cdef int64_t B, width, D

    def __init__(self, cos, sin, meta):
        tables, lens, slots = meta.block_tables, meta.context_lens, meta.slot_mapping
        self.B = tables.shape[0] if tables.dim() == 2 else -1
        if self.B < 1 or lens.numel() != self.B or slots.numel() != self.B:
            raise ValueError(f"decode_layer: block_tables {tuple(tables.shape)}, context_lens {tuple(lens.shape)} "
                             f"and slots {tuple(slots.shape)} must have one row per sequence")
        if cos.dim() != 2 or cos.shape[0] != self.B or sin.shape != cos.shape:
            raise ValueError(f"decode_layer: cos/sin must be [{self.B}, head_dim], got {tuple(cos.shape)}")
        self.cos, self.sin, self.meta, self.scratch = cos, sin, meta, None
        self.width, self.D = tables.shape[1], cos.shape[1]
        self.pc, self.ps = _ptr(cos, cos.dtype, "cos"), _ptr(sin, cos.dtype, "sin")
        self.pt, self.pl = _ptr(tables, I64, "block_tables"), _ptr(lens, I64, "context_lens")
        self.psl = _ptr(slots, I64, "slot_mapping")


cdef inline int _linear(Linear *l, const void *x, int bf16, int64_t B, void *y, int64_t path_rows) noexcept nogil:
    return rf_quant_linear_rows(l.tier, l.parts, l.nparts, l.bias, x, bf16, B, l.k, y, bf16, path_rows, l.digits)


cdef _decode(LayerPlan plan, x, residual, StepInputs step, k_cache, v_cache):
    dt = plan.dtype
    cdef bint bf16 = dt is BF16
    cdef int64_t B = x.shape[0], H = plan.hidden, I = plan.inter, QKV = plan.qkv_n
    cdef int nh = plan.nh, nkv = plan.nkv, D = plan.D
    if x.dim() != 2 or x.shape[1] != H:
        raise ValueError(f"decode_layer: x must be [B, {H}], got {tuple(x.shape)}")
    if step is None or step.B != B or step.D != D or step.cos.dtype is not dt:
        raise ValueError(f"decode_layer: the step's inputs do not fit x {tuple(x.shape)} ({dt}) and head_dim {D}")
    if k_cache.dim() != 4 or k_cache.shape[0] != nkv or k_cache.shape[3] != D or k_cache.shape != v_cache.shape:
        raise ValueError(f"decode_layer: pools {tuple(k_cache.shape)} / {tuple(v_cache.shape)} do not fit "
                         f"{nkv} KV heads of {D}")
    cdef int64_t width = step.width, block_size = k_cache.shape[2]
    cdef int64_t pool_slots = k_cache.shape[1] * block_size
    cdef uintptr_t px = _ptr(x, dt, "x"), py = 0 if residual is None else _ptr(residual, dt, "residual")
    if residual is not None and residual.numel() != B * H:
        raise ValueError(f"decode_layer: residual {tuple(residual.shape)} does not match x {tuple(x.shape)}")
    cdef uintptr_t pc = step.pc, ps = step.ps, pt = step.pt, pl = step.pl, psl = step.psl
    cdef uintptr_t pk = _ptr(k_cache, dt, "k_cache"), pv = _ptr(v_cache, dt, "v_cache")
    out = torch.empty((B, H), dtype=dt)
    # scratch: h [B, H], qkv [B, QKV], attn [B, nh D], o [B, H], gate_up [B, 2 I], act [B, I]
    cdef int64_t attn_n = <int64_t>nh * D, need = B * (2 * H + QKV + attn_n + 3 * I)
    if step.scratch is None or step.scratch.numel() < need or step.scratch.dtype is not dt:
        step.scratch = torch.empty(need, dtype=dt)
    cdef uintptr_t po = out.data_ptr(), base = step.scratch.data_ptr()
    cdef int64_t es = 2 if bf16 else 4
    cdef uintptr_t ph = base, pqkv = ph + B * H * es, pa = pqkv + B * QKV * es, pob = pa + B * attn_n * es
    cdef uintptr_t pgu = pob + B * H * es, pact = pgu + B * 2 * I * es
    cdef Linear *lin = plan.lin
    cdef int64_t path_rows = quant_ops.step.sequences   # a speculative step's linears as its sequences' decode's
    cdef float eps = plan.eps, scale = plan.scale
    cdef int64_t window = plan.window, b
    cdef uintptr_t qn = plan.q_norm, kn = plan.k_norm, an = plan.post_attn_norm, mn = plan.post_mlp_norm
    cdef bint gelu = plan.gelu
    cdef uint16_t *row
    cdef float *frow
    cdef int rc = 0
    with nogil:
        if bf16:
            rf_rms_norm_bf16(<uint16_t *>px, <const uint16_t *>py, <const uint16_t *>plan.input_norm, <uint16_t *>ph,
                             B, H, eps)
            rc |= _linear(&lin[0], <void *>ph, 1, B, <void *>pqkv, path_rows)
            if qn:
                for b in range(B):
                    row = <uint16_t *>pqkv + b * QKV
                    rf_rms_norm_bf16(row, NULL, <const uint16_t *>qn, row, nh, D, eps)
                    rf_rms_norm_bf16(row + nh * D, NULL, <const uint16_t *>kn, row + nh * D, nkv, D, eps)
            rf_store_kv_bf16(<uint16_t *>pqkv, B, nh, nkv, D, <const int64_t *>psl, <const uint16_t *>pc,
                             <const uint16_t *>ps, <uint16_t *>pk, <uint16_t *>pv, pool_slots)
            rc |= rf_decode_attention_bf16(<const uint16_t *>pqkv, B, nh, nkv, D, <const uint16_t *>pk,
                                           <const uint16_t *>pv, pool_slots, <int>block_size, <const int64_t *>pt,
                                           width, <const int64_t *>pl, window, scale, <uint16_t *>pa)
            rc |= _linear(&lin[1], <void *>pa, 1, B, <void *>pob, path_rows)
            if an:
                rf_rms_norm_bf16(<uint16_t *>pob, NULL, <const uint16_t *>an, <uint16_t *>pob, B, H, eps)
            rf_rms_norm_bf16(<uint16_t *>px, <const uint16_t *>pob, <const uint16_t *>plan.post_norm, <uint16_t *>ph,
                             B, H, eps)
            rc |= _linear(&lin[2], <void *>ph, 1, B, <void *>pgu, path_rows)
            if gelu:
                rf_gelu_tanh_mul_bf16(<const uint16_t *>pgu, <uint16_t *>pact, B, I)
            else:
                rf_silu_mul_bf16(<const uint16_t *>pgu, <uint16_t *>pact, B, I)
            rc |= _linear(&lin[3], <void *>pact, 1, B, <void *>po, path_rows)
            if mn:
                rf_rms_norm_bf16(<uint16_t *>po, NULL, <const uint16_t *>mn, <uint16_t *>po, B, H, eps)
        else:
            rf_rms_norm_f32(<float *>px, <const float *>py, <const float *>plan.input_norm, <float *>ph, B, H, eps)
            rc |= _linear(&lin[0], <void *>ph, 0, B, <void *>pqkv, path_rows)
            if qn:
                for b in range(B):
                    frow = <float *>pqkv + b * QKV
                    rf_rms_norm_f32(frow, NULL, <const float *>qn, frow, nh, D, eps)
                    rf_rms_norm_f32(frow + nh * D, NULL, <const float *>kn, frow + nh * D, nkv, D, eps)
            rf_store_kv_f32(<float *>pqkv, B, nh, nkv, D, <const int64_t *>psl, <const float *>pc, <const float *>ps,
                            <float *>pk, <float *>pv, pool_slots)
            rc |= rf_decode_attention_f32(<const float *>pqkv, B, nh, nkv, D, <const float *>pk, <const float *>pv,
                                          pool_slots, <int>block_size, <const int64_t *>pt, width,
                                          <const int64_t *>pl, window, scale, <float *>pa)
            rc |= _linear(&lin[1], <void *>pa, 0, B, <void *>pob, path_rows)
            if an:
                rf_rms_norm_f32(<float *>pob, NULL, <const float *>an, <float *>pob, B, H, eps)
            rf_rms_norm_f32(<float *>px, <const float *>pob, <const float *>plan.post_norm, <float *>ph, B, H, eps)
            rc |= _linear(&lin[2], <void *>ph, 0, B, <void *>pgu, path_rows)
            if gelu:
                rf_gelu_tanh_mul_f32(<const float *>pgu, <float *>pact, B, I)
            else:
                rf_silu_mul_f32(<const float *>pgu, <float *>pact, B, I)
            rc |= _linear(&lin[3], <void *>pact, 0, B, <void *>po, path_rows)
            if mn:
                rf_rms_norm_f32(<float *>po, NULL, <const float *>mn, <float *>po, B, H, eps)
    if rc != 0:
        raise MemoryError("decode_layer: no memory for the attention's or the linears' work buffers")
    return x, out
