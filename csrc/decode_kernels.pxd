"""The C kernels of csrc/decode_kernels.h, declared once for the .pyx modules that call them."""
from libc.stdint cimport int64_t, uint16_t


cdef extern from "decode_kernels.h" nogil:
    void rf_rms_norm_f32(float *x, const float *y, const float *w, float *out, int64_t rows, int64_t n, float eps)
    void rf_rms_norm_bf16(uint16_t *x, const uint16_t *y, const uint16_t *w, uint16_t *out, int64_t rows,
                          int64_t n, float eps)
    void rf_store_kv_f32(float *qkv, int64_t tokens, int nh, int nkv, int D, const int64_t *slots,
                         const float *cos, const float *sin, float *kpool, float *vpool, int64_t pool_slots)
    void rf_store_kv_bf16(uint16_t *qkv, int64_t tokens, int nh, int nkv, int D, const int64_t *slots,
                          const uint16_t *cos, const uint16_t *sin, uint16_t *kpool, uint16_t *vpool,
                          int64_t pool_slots)
    int rf_decode_attention_f32(const float *qkv, int64_t B, int nh, int nkv, int D, const float *kpool,
                                const float *vpool, int64_t pool_slots, int block_size,
                                const int64_t *block_tables, int64_t width, const int64_t *context_lens,
                                int64_t window, float scale, float *out)
    int rf_decode_attention_bf16(const uint16_t *qkv, int64_t B, int nh, int nkv, int D, const uint16_t *kpool,
                                 const uint16_t *vpool, int64_t pool_slots, int block_size,
                                 const int64_t *block_tables, int64_t width, const int64_t *context_lens,
                                 int64_t window, float scale, uint16_t *out)
    int rf_attention_isa()
    void rf_set_attention_limit(int limit)
    void rf_silu_mul_f32(const float *gate_up, float *out, int64_t rows, int64_t n)
    void rf_silu_mul_bf16(const uint16_t *gate_up, uint16_t *out, int64_t rows, int64_t n)
    void rf_gelu_tanh_mul_f32(const float *gate_up, float *out, int64_t rows, int64_t n)
    void rf_gelu_tanh_mul_bf16(const uint16_t *gate_up, uint16_t *out, int64_t rows, int64_t n)
