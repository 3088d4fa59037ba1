"""The C kernels of csrc/quant_kernels.h, declared once for the .pyx modules that call them."""
from libc.stdint cimport int64_t, uint8_t, uint16_t


cdef extern from "quant_kernels.h" nogil:
    enum:
        RF_QPARTS
        RF_FMTS
        RF_TIERS
    const char *rf_tier_name(int tier)
    const char *rf_format_name(int fmt)
    ctypedef struct rf_qweights:
        int fmt
        int64_t n
        const uint8_t *w
        const uint16_t *d
        const uint16_t *m
        const uint8_t *sc
        const uint8_t *mn
    int rf_quant_tier_ok(int tier)
    int rf_quant_own_rows(int tier, int x_bf16, int digits)
    int rf_quant_linear_rows(int tier, const rf_qweights *parts, int nparts, const float *bias, const void *x,
                             int x_bf16, int64_t B, int64_t K, void *y, int y_bf16, int64_t path_rows, int digits)
    int rf_quant_rows(const rf_qweights *q, const int64_t *ids, int64_t n, int64_t K, void *out, int out_bf16)


cdef extern from "quant_experts.h" nogil:
    int rf_quant_experts(int tier, const rf_qweights *const *gate_up, const int *gate_up_parts,
                         const rf_qweights *const *down, const int *down_parts, int64_t E, const void *x, int bf16,
                         int64_t T, int64_t H, int64_t I, const int64_t *order, const int64_t *counts,
                         const void *weights, int64_t top_k, void *out, int64_t path_rows, int digits)
