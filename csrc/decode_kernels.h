/* CPU kernels for one transformer layer's small ops, fp32 and bf16: RMSNorm (with the residual add
 * fused), RoPE + the K/V store into the paged pools, attention over the paged pools read in place, and
 * SiLU(gate) * up or tanh-GELU(gate) * up. Plain C, no Python API: the caller releases the GIL around each
 * call.
 *
 * Every kernel computes in fp32 and rounds once when it stores (bf16: round to nearest even).
 * Pools are head-major: pool[h][slot][d], slot = block * block_size + offset, `pool_slots` slots per head.
 * Work is split with OpenMP (the same libgomp as torch, so the two share one thread pool) only when a
 * call has enough of it; a batch-1 decode runs on the calling thread.
 */
#ifndef ROSEFAST_DECODE_KERNELS_H
#define ROSEFAST_DECODE_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
/* one build, the widest vector ISA the running CPU has (picked once at load time) */
#define RF_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define RF_SIMD_CLONES
#endif

/* below this many elements of work a call stays on one thread */
#define RF_PARALLEL_MIN 32768

static inline float rf_bf16_load(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t rf_bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);   /* a select: vectorizes */
}

/* exp(x) for x <= 88, branch-free so loops over it vectorize: 2^n * e^r, |r| <= ln2/2, a degree-6
 * polynomial for e^r (relative error ~2e-7). Very negative x gives ~1e-38 instead of 0. */
static inline float rf_exp(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x / ln2) */
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;                 /* x - n*ln2, split constant */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

/* s[0..L) <- softmax(s) in place */
RF_SIMD_CLONES static void rf_softmax(float *s, int64_t L) {
    float m = s[0], sum = 0.0f;
    for (int64_t t = 1; t < L; t++) m = s[t] > m ? s[t] : m;
    _Pragma("omp simd reduction(+:sum)")
    for (int64_t t = 0; t < L; t++) {
        s[t] = rf_exp(s[t] - m);
        sum += s[t];
    }
    float inv = 1.0f / sum;
    for (int64_t t = 0; t < L; t++) s[t] *= inv;
}

#define RF_LD_f32(p, i) ((p)[i])
#define RF_ST_f32(p, i, v) ((p)[i] = (v))
#define RF_LD_bf16(p, i) rf_bf16_load((p)[i])
#define RF_ST_bf16(p, i, v) ((p)[i] = rf_bf16_round(v))

/* the pool slot of a sequence's position `pos` through its block table */
#define RF_SLOT(table, pos, block_size) ((table)[(pos) / (block_size)] * (block_size) + (pos) % (block_size))

#define RF_DEFINE_KERNELS(S, T)                                                                          \
                                                                                                         \
/* out = x / rms(x) * w for one row; with y: first x += y (in place, rounded to T), then the norm */      \
RF_SIMD_CLONES static void rf_rms_norm_row_##S(T *x, const T *y, const T *w, T *out, int64_t n,          \
                                                float eps) {                                             \
    float ss = 0.0f;                                                                                     \
    if (y)                                                                                               \
        for (int64_t i = 0; i < n; i++) RF_ST_##S(x, i, RF_LD_##S(x, i) + RF_LD_##S(y, i));              \
    _Pragma("omp simd reduction(+:ss)")                                                                  \
    for (int64_t i = 0; i < n; i++) {                                                                    \
        float v = RF_LD_##S(x, i);                                                                       \
        ss += v * v;                                                                                     \
    }                                                                                                    \
    float inv = 1.0f / sqrtf(ss / (float)n + eps);                                                       \
    for (int64_t i = 0; i < n; i++) RF_ST_##S(out, i, RF_LD_##S(w, i) * (RF_LD_##S(x, i) * inv));        \
}                                                                                                        \
                                                                                                         \
static void rf_rms_norm_##S(T *x, const T *y, const T *w, T *out, int64_t rows, int64_t n, float eps) {  \
    _Pragma("omp parallel for if (rows * n >= RF_PARALLEL_MIN)")                                         \
    for (int64_t r = 0; r < rows; r++)                                                                   \
        rf_rms_norm_row_##S(x + r * n, y ? y + r * n : NULL, w, out + r * n, n, eps);                    \
}                                                                                                        \
                                                                                                         \
/* one token's qkv row [(nh + 2 nkv) * D]: rotate q and k in place (c/s: its position's cos/sin rows,    \
 * halves repeated; NULL: no RoPE), then copy k and v into the pools at `slot` */                        \
RF_SIMD_CLONES static void rf_store_kv_row_##S(T *row, int nh, int nkv, int D, int64_t slot, const T *c,  \
                                                const T *s, T *kpool, T *vpool, int64_t pool_slots) {    \
    int half = D / 2;                                                                                    \
    if (c) {                                                                                             \
        for (int h = 0; h < nh + nkv; h++) {                                                             \
            T *x = row + (int64_t)h * D;                                                                 \
            for (int i = 0; i < half; i++) {                                                            \
                float x1 = RF_LD_##S(x, i), x2 = RF_LD_##S(x, i + half);                                 \
                RF_ST_##S(x, i, x1 * RF_LD_##S(c, i) - x2 * RF_LD_##S(s, i));                            \
                RF_ST_##S(x, i + half, x2 * RF_LD_##S(c, i + half) + x1 * RF_LD_##S(s, i + half));       \
            }                                                                                            \
        }                                                                                                \
    }                                                                                                    \
    for (int h = 0; h < nkv; h++) {                                                                      \
        int64_t at = ((int64_t)h * pool_slots + slot) * D;                                               \
        memcpy(kpool + at, row + (int64_t)(nh + h) * D, sizeof(T) * D);                                  \
        memcpy(vpool + at, row + (int64_t)(nh + nkv + h) * D, sizeof(T) * D);                            \
    }                                                                                                    \
}                                                                                                        \
                                                                                                         \
/* qkv rows [tokens][(nh + 2 nkv) * D]; cos/sin [tokens][D]: each token's rows (NULL: no RoPE) */       \
static void rf_store_kv_##S(T *qkv, int64_t tokens, int nh, int nkv, int D, const int64_t *slots,        \
                            const T *cos, const T *sin, T *kpool, T *vpool, int64_t pool_slots) {        \
    int64_t stride = (int64_t)(nh + 2 * nkv) * D;                                                        \
    _Pragma("omp parallel for if (tokens * stride >= RF_PARALLEL_MIN)")                                  \
    for (int64_t t = 0; t < tokens; t++)                                                                 \
        rf_store_kv_row_##S(qkv + t * stride, nh, nkv, D, slots[t], cos ? cos + t * D : NULL,           \
                            cos ? sin + t * D : NULL, kpool, vpool, pool_slots);                      \
}                                                                                                        \
                                                                                                         \
/* one (sequence, kv head): its G query heads attend to the sequence's positions lo .. lo + L - 1 (the    \
 * whole context, or a sliding window's last L) read block by block from the pools; `buf` holds          \
 * G * (L + 2 * D) + D floats */                                                                         \
RF_SIMD_CLONES static void rf_attend_one_##S(const T *q, int G, int D, const T *kpool, const T *vpool,   \
                                              const int64_t *table, int64_t lo, int64_t L, int block_size,\
                                              float scale, T *out, float *buf) {                         \
    float *scores = buf, *qf = buf + G * L, *acc = qf + G * D, *row = acc + G * D;                       \
    for (int g = 0; g < G; g++)                                                                          \
        for (int d = 0; d < D; d++) qf[g * D + d] = RF_LD_##S(q, g * D + d) * scale;                     \
    for (int64_t t = 0; t < L; t++) {                                                                    \
        const T *k = kpool + RF_SLOT(table, lo + t, block_size) * D;                                     \
        for (int d = 0; d < D; d++) row[d] = RF_LD_##S(k, d);      /* convert once for the G heads */   \
        for (int g = 0; g < G; g++) {                                                                    \
            const float *qg = qf + g * D;                                                                \
            float s = 0.0f;                                                                              \
            _Pragma("omp simd reduction(+:s)")                                                           \
            for (int d = 0; d < D; d++) s += qg[d] * row[d];                                             \
            scores[g * L + t] = s;                                                                       \
        }                                                                                                \
    }                                                                                                    \
    for (int g = 0; g < G; g++) rf_softmax(scores + g * L, L);                                           \
    memset(acc, 0, sizeof(float) * G * D);                                                               \
    for (int64_t t = 0; t < L; t++) {                                                                    \
        const T *v = vpool + RF_SLOT(table, lo + t, block_size) * D;                                     \
        for (int d = 0; d < D; d++) row[d] = RF_LD_##S(v, d);                                            \
        for (int g = 0; g < G; g++) {                                                                    \
            float p = scores[g * L + t], *ag = acc + g * D;                                              \
            for (int d = 0; d < D; d++) ag[d] += p * row[d];                                             \
        }                                                                                                \
    }                                                                                                    \
    for (int i = 0; i < G * D; i++) RF_ST_##S(out, i, acc[i]);                                           \
}                                                                                                        \
                                                                                                         \
/* decode: each sequence's one query (the q part of its qkv row) against its context_lens[b] tokens, or   \
 * their last `window` (a sliding window; 0: all). block_tables [B][width]; out [B][nh * D]. Returns -1    \
 * when a work buffer cannot be allocated. */                                                            \
static int rf_decode_attention_##S(const T *qkv, int64_t B, int nh, int nkv, int D, const T *kpool,      \
                                   const T *vpool, int64_t pool_slots, int block_size,                   \
                                   const int64_t *block_tables, int64_t width,                           \
                                   const int64_t *context_lens, int64_t window, float scale, T *out) {   \
    int G = nh / nkv;                                                                                    \
    int64_t stride = (int64_t)(nh + 2 * nkv) * D, max_len = 0, work = 0;                                 \
    for (int64_t b = 0; b < B; b++) {                                                                    \
        max_len = context_lens[b] > max_len ? context_lens[b] : max_len;                                 \
        work += context_lens[b];                                                                         \
    }                                                                                                    \
    work *= (int64_t)nh * D;                                                                             \
    int failed = 0;                                                                                      \
    void (*attend)(const T *, int, int, const T *, const T *, const int64_t *, int64_t, int64_t, int,    \
                   float, T *, float *) = rf_attend_one_##S;                                              \
    int isa = rf_attention_isa();                                                                        \
    if (isa == 2 && D % 16 == 0 && D <= 256)                                                             \
        attend = rf_attend_avx512_##S;                                                                   \
    else if (isa >= 1 && D % 8 == 0 && D <= 256)                                                         \
        attend = rf_attend_avx2_##S;                                                                     \
    _Pragma("omp parallel if (work >= RF_PARALLEL_MIN) reduction(|:failed)")                             \
    {                                                                                                    \
        float *buf = (float *)malloc(sizeof(float) * (G * (max_len + 2 * D) + D));                             \
        if (!buf) failed = 1;                                                                            \
        _Pragma("omp for schedule(dynamic) collapse(2)")                                                 \
        for (int64_t b = 0; b < B; b++) {                                                                \
            for (int h = 0; h < nkv; h++) {                                                              \
                if (!buf) continue;                                                                      \
                int64_t len = context_lens[b], lo = window > 0 && len > window ? len - window : 0;       \
                attend(qkv + b * stride + (int64_t)h * G * D, G, D,                                      \
                       kpool + (int64_t)h * pool_slots * D, vpool + (int64_t)h * pool_slots * D,         \
                       block_tables + b * width, lo, len - lo, block_size, scale,                        \
                       out + (b * nh + (int64_t)h * G) * D, buf);                                        \
            }                                                                                            \
        }                                                                                                \
        free(buf);                                                                                       \
    }                                                                                                    \
    return failed ? -1 : 0;                                                                              \
}                                                                                                        \
                                                                                                         \
/* one row: gate_up [2 * n] (gate | up) -> out [n] = act(gate) * up, act(x) = x * sigmoid(z): SiLU's z = x;  \
 * tanh-GELU's z = 2 sqrt(2 / pi) (x + 0.044715 x^3) (0.5 x (1 + tanh(z / 2)), the same function) */      \
RF_SIMD_CLONES static void rf_act_mul_row_##S(const T *g, T *o, int64_t n, int gelu) {                   \
    const T *u = g + n;                                                                                  \
    for (int64_t i = 0; i < n; i++) {                                                                    \
        float x = RF_LD_##S(g, i);                                                                       \
        float z = gelu ? 1.5957691216057308f * (x + 0.044715f * x * x * x) : x;                          \
        RF_ST_##S(o, i, x / (1.0f + rf_exp(-z)) * RF_LD_##S(u, i));                                      \
    }                                                                                                    \
}                                                                                                        \
                                                                                                         \
static void rf_act_mul_##S(const T *gate_up, T *out, int64_t rows, int64_t n, int gelu) {                \
    _Pragma("omp parallel for if (rows * n >= RF_PARALLEL_MIN)")                                         \
    for (int64_t r = 0; r < rows; r++) rf_act_mul_row_##S(gate_up + r * 2 * n, out + r * n, n, gelu);    \
}                                                                                                        \
                                                                                                         \
static void rf_silu_mul_##S(const T *gate_up, T *out, int64_t rows, int64_t n) {                         \
    rf_act_mul_##S(gate_up, out, rows, n, 0);                                                            \
}                                                                                                        \
                                                                                                         \
static void rf_gelu_tanh_mul_##S(const T *gate_up, T *out, int64_t rows, int64_t n) {                    \
    rf_act_mul_##S(gate_up, out, rows, n, 1);                                                            \
}

#include "attention_avx512.h"
#if !RF_HAVE_AVX512_KERNELS
#define rf_cpu_has_avx512() 0
#define rf_attend_avx512_f32 rf_attend_one_f32
#define rf_attend_avx512_bf16 rf_attend_one_bf16
#endif
#include "attention_avx2.h"
#if !RF_HAVE_AVX2_KERNELS
#define rf_att_cpu_has_avx2() 0
#define rf_attend_avx2_f32 rf_attend_one_f32
#define rf_attend_avx2_bf16 rf_attend_one_bf16
#endif

/* The decode attention's kernel: 2 AVX-512, 1 AVX2, 0 the portable C — the widest this CPU runs within
 * `rf_attention_limit`, which the module sets at import from the tier ROSEFAST_CPU_KERNELS forces (avx2, avxvnni:
 * AVX2; scalar, neon: the portable C; rosefast.config.forced_cpu_kernels reads it, once), so one variable runs a
 * whole suite on one tier's code (the other small kernels are compiled for every ISA level and take the CPU's
 * own, target_clones). */
static int rf_attention_limit = 2;
static void rf_set_attention_limit(int limit) { rf_attention_limit = limit; }
static int rf_attention_isa(void) {
    static int isa = -1;
    if (isa < 0) {
        int limit = rf_attention_limit;
        isa = limit >= 2 && rf_cpu_has_avx512() ? 2 : limit >= 1 && rf_att_cpu_has_avx2() ? 1 : 0;
    }
    return isa;
}

RF_DEFINE_KERNELS(f32, float)
RF_DEFINE_KERNELS(bf16, uint16_t)

#endif
