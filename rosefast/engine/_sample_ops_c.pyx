# cython: language_level=3
"""The sampler's per-row ops as C kernels (csrc/sample_kernels.h) on fp32 and bf16 CPU tensors; twin:
_sample_ops_py. The GIL is released around each kernel."""
from libc.stdint cimport int64_t, uint16_t, uintptr_t

import torch

from rosefast.engine._sample_ops_py import device_tensor  # noqa: F401 (one public API with the twin)

cdef extern from "sample_kernels.h" nogil:
    int rf_sample_f32(const float *logits, int64_t S, int64_t V, const float *temperature, const int64_t *top_k,
                      const float *top_p, const float *min_p, const float *u, int64_t *out)
    int rf_sample_bf16(const uint16_t *logits, int64_t S, int64_t V, const float *temperature,
                       const int64_t *top_k, const float *top_p, const float *min_p, const float *u, int64_t *out)
    void rf_argmax_f32(const float *logits, int64_t S, int64_t V, int64_t *out)
    void rf_argmax_bf16(const uint16_t *logits, int64_t S, int64_t V, int64_t *out)

cdef object F32 = torch.float32
cdef object BF16 = torch.bfloat16
cdef object I64 = torch.int64


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
