# cython: language_level=3
"""The sampler's per-row ops as C kernels (csrc/sample_kernels.h) on fp32 and bf16 CPU tensors; twin:
_sample_ops_py. The GIL is released around each kernel."""
from libc.stdint cimport int32_t, int64_t, uint16_t, uintptr_t

import torch


cdef extern from "sample_kernels.h" nogil:
    int rf_sample_f32(const float *logits, int64_t S, int64_t V, const float *temperature, const int64_t *top_k,
                      const float *top_p, const float *min_p, const float *u, int64_t *out)
    int rf_sample_bf16(const uint16_t *logits, int64_t S, int64_t V, const float *temperature,
                       const int64_t *top_k, const float *top_p, const float *min_p, const float *u, int64_t *out)
    void rf_argmax_f32(const float *logits, int64_t S, int64_t V, int64_t *out)
    void rf_argmax_bf16(const uint16_t *logits, int64_t S, int64_t V, int64_t *out)
    void rf_mask_f32(float *x, int64_t V, const int64_t *rows, int64_t R, const int32_t *bitmask, int64_t W)

cdef object F32 = torch.float32
cdef object BF16 = torch.bfloat16
cdef object I64 = torch.int64
cdef object I32 = torch.int32


cdef inline bint _check(logits) except -1:
    """True for bf16, False for fp32; ValueError for anything else."""
    if not logits.is_cpu or logits.dim() != 2 or not logits.is_contiguous() or logits.numel() == 0:
        raise ValueError(f"expected contiguous non-empty [S, V] CPU logits, got {tuple(logits.shape)} on "
                         f"{logits.device}")
    if logits.dtype is BF16:
        return True
    if logits.dtype is F32:
        return False
    raise ValueError(f"compiled sampling takes float32 or bfloat16 logits, got {logits.dtype}")


def argmax(logits):
    """[S, V] -> [S] long: each row's first largest entry."""
    cdef bint bf16 = _check(logits)
    cdef int64_t S = logits.shape[0], V = logits.shape[1]
    out = torch.empty(S, dtype=I64)
    cdef uintptr_t px = <uintptr_t>logits.data_ptr(), po = <uintptr_t>out.data_ptr()
    with nogil:
        if bf16:
            rf_argmax_bf16(<uint16_t *>px, S, V, <int64_t *>po)
        else:
            rf_argmax_f32(<float *>px, S, V, <int64_t *>po)
    return out


def sample(logits, temperature, top_k, top_p, min_p, u):
    """One token per row of logits [S, V] (not modified): per-row lists temperature (> 0), top_k (0: all),
    top_p, min_p; u an [S] float32 tensor of uniforms in (0, 1]."""
    cdef bint bf16 = _check(logits)
    cdef int64_t S = logits.shape[0], V = logits.shape[1]
    if not (len(temperature) == len(top_k) == len(top_p) == len(min_p) == S == u.numel()):
        raise ValueError(f"sample: the per-row settings must have {S} entries each")
    t = torch.tensor(temperature, dtype=F32)
    k = torch.tensor(top_k, dtype=I64)
    p = torch.tensor(top_p, dtype=F32)
    m = torch.tensor(min_p, dtype=F32)
    uu = u.to(F32).contiguous()
    out = torch.empty(S, dtype=I64)
    cdef uintptr_t px = <uintptr_t>logits.data_ptr(), po = <uintptr_t>out.data_ptr()
    cdef uintptr_t pt = <uintptr_t>t.data_ptr(), pk = <uintptr_t>k.data_ptr(), pp = <uintptr_t>p.data_ptr()
    cdef uintptr_t pm = <uintptr_t>m.data_ptr(), pu = <uintptr_t>uu.data_ptr()
    cdef int rc
    with nogil:
        if bf16:
            rc = rf_sample_bf16(<uint16_t *>px, S, V, <float *>pt, <int64_t *>pk, <float *>pp, <float *>pm,
                                <float *>pu, <int64_t *>po)
        else:
            rc = rf_sample_f32(<float *>px, S, V, <float *>pt, <int64_t *>pk, <float *>pp, <float *>pm,
                               <float *>pu, <int64_t *>po)
    if rc != 0:
        raise MemoryError("sample: no memory for the per-thread row buffers")
    return out


def mask(x, rows, bitmask):
    """In place on fp32 logits x [B, V]: -inf where row rows[r]'s bitmask [R, W] (int32; bit j of word w is
    token 32 w + j) has a 0 bit, and past W x 32 tokens."""
    if x.dtype is not F32 or not x.is_cpu or x.dim() != 2 or not x.is_contiguous():
        raise ValueError(f"mask: expected contiguous fp32 [B, V] CPU logits, got {x.dtype} {tuple(x.shape)}")
    r = rows.to(I64).contiguous()
    b = bitmask.to(I32).contiguous()
    cdef int64_t V = x.shape[1], R = r.numel(), W = b.shape[1]
    if b.dim() != 2 or b.shape[0] != R or R and (int(r.min()) < 0 or int(r.max()) >= x.shape[0]):
        raise ValueError(f"mask: {R} rows of {x.shape[0]} and a bitmask of {tuple(b.shape)} do not fit")
    cdef uintptr_t px = <uintptr_t>x.data_ptr(), pr = <uintptr_t>r.data_ptr(), pb = <uintptr_t>b.data_ptr()
    with nogil:
        rf_mask_f32(<float *>px, V, <int64_t *>pr, R, <int32_t *>pb, W)
    return x
