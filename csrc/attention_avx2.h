/* Decode attention for one (sequence, kv head) with AVX2 intrinsics: attention_avx512.h's kernel on 256-bit
 * vectors, for CPUs without AVX-512 (AMD Zen 2/3, Intel client cores). The query heads of a group share every
 * K and V row load (converted from bf16 once) three at a time: the accumulators of 3 heads x 4 tokens (scores)
 * or 3 heads x 32 dims (the weighted sum of V) and the 4 K or V vectors are one more than the 16 registers, and
 * still 1.33x two heads at a time (SmolLM2's G = 3, one spill). Used when the CPU has AVX2 and FMA,
 * no AVX-512 (or ROSEFAST_CPU_KERNELS limits it, decode_kernels.h), and head_dim is a multiple of 8 (<= 256).
 * On this project's Xeon, AVX-512 set aside: 3.3-3.6x the portable C's AVX2 clone at 32 sequences.
 * Included by decode_kernels.h only. */
#ifndef ROSEFAST_ATTENTION_AVX2_H
#define ROSEFAST_ATTENTION_AVX2_H

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#include <immintrin.h>
#define RF_HAVE_AVX2_KERNELS 1
#define RF_ATT_AVX2 __attribute__((target("avx2,fma")))

static int rf_att_cpu_has_avx2(void) {
    static int known = -1;
    if (known < 0) known = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return known;
}

RF_ATT_AVX2 static inline __m256 rf_load8_f32(const float *p) { return _mm256_loadu_ps(p); }
RF_ATT_AVX2 static inline __m256 rf_load8_bf16(const uint16_t *p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

/* the four horizontal sums of a, b, c, d as one 4-lane vector */
RF_ATT_AVX2 static inline __m128 rf_hsum4_256(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));   /* per 128-bit half */
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

RF_ATT_AVX2 static inline float rf_hsum_256(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* scores[g][t] = q_g . k_t for GG (compile-time, <= 3) heads starting at q (already scaled, fp32); four tokens at
 * a time, so one horizontal reduction serves four dot products */
#define RF_AVX2_SCORES(S, T, GG)                                                                         \
RF_ATT_AVX2 static inline __attribute__((always_inline)) void rf_scores256_##GG##_##S(                     \
        const float *q, int nd, const T *kpool, const int64_t *table, int64_t lo, int64_t L, int block_size,\
        float *scores, int64_t score_stride) {                                                          \
    int D = nd * 8;                                                                                      \
    int64_t t = 0;                                                                                       \
    for (; t + 4 <= L; t += 4) {                                                                         \
        const T *k[4];                                                                                   \
        for (int i = 0; i < 4; i++)                                                                      \
            k[i] = kpool + RF_SLOT(table, lo + t + i, block_size) * D;                                   \
        __m256 acc[GG][4];                                                                               \
        for (int g = 0; g < GG; g++)                                                                     \
            for (int i = 0; i < 4; i++) acc[g][i] = _mm256_setzero_ps();                                 \
        for (int j = 0; j < nd; j++) {                                                                   \
            __m256 kj[4];                                                                                \
            for (int i = 0; i < 4; i++) kj[i] = rf_load8_##S(k[i] + 8 * j);                              \
            for (int g = 0; g < GG; g++) {                                                               \
                __m256 qj = _mm256_loadu_ps(q + g * D + 8 * j);                                          \
                for (int i = 0; i < 4; i++) acc[g][i] = _mm256_fmadd_ps(qj, kj[i], acc[g][i]);           \
            }                                                                                            \
        }                                                                                                \
        for (int g = 0; g < GG; g++)                                                                     \
            _mm_storeu_ps(scores + g * score_stride + t, rf_hsum4_256(acc[g][0], acc[g][1], acc[g][2], acc[g][3])); \
    }                                                                                                    \
    for (; t < L; t++) {                                                                                 \
        const T *k = kpool + RF_SLOT(table, lo + t, block_size) * D;                                     \
        __m256 acc[GG];                                                                                  \
        for (int g = 0; g < GG; g++) acc[g] = _mm256_setzero_ps();                                       \
        for (int j = 0; j < nd; j++) {                                                                   \
            __m256 kj = rf_load8_##S(k + 8 * j);                                                         \
            for (int g = 0; g < GG; g++) acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * D + 8 * j), kj, acc[g]); \
        }                                                                                                \
        for (int g = 0; g < GG; g++) scores[g * score_stride + t] = rf_hsum_256(acc[g]);                 \
    }                                                                                                    \
}

/* out_g[8j .. 8j + 32) = sum_t p[g][t] v_t for GG (<= 3) heads and one 32-wide (nj <= 4 chunks) slice of D */
#define RF_AVX2_PV(S, T, GG)                                                                             \
RF_ATT_AVX2 static inline __attribute__((always_inline)) void rf_pv256_##GG##_##S(                         \
        const float *p, int64_t p_stride, int D, int j0, int nj, const T *vpool, const int64_t *table,  \
        int64_t lo, int64_t L, int block_size, float *out) {                                             \
    __m256 acc[GG][4];                                                                                   \
    for (int g = 0; g < GG; g++)                                                                         \
        for (int j = 0; j < 4; j++) acc[g][j] = _mm256_setzero_ps();                                     \
    for (int64_t t = 0; t < L; t++) {                                                                    \
        const T *v = vpool + RF_SLOT(table, lo + t, block_size) * D + 8 * j0;                            \
        __m256 vj[4];                                                                                    \
        for (int j = 0; j < 4; j++) vj[j] = j < nj ? rf_load8_##S(v + 8 * j) : _mm256_setzero_ps();     \
        for (int g = 0; g < GG; g++) {                                                                   \
            __m256 pg = _mm256_set1_ps(p[g * p_stride + t]);                                             \
            for (int j = 0; j < 4; j++) acc[g][j] = _mm256_fmadd_ps(pg, vj[j], acc[g][j]);               \
        }                                                                                                \
    }                                                                                                    \
    for (int g = 0; g < GG; g++)                                                                         \
        for (int j = 0; j < nj; j++) _mm256_storeu_ps(out + g * D + 8 * (j0 + j), acc[g][j]);            \
}

#define RF_AVX2_ATTEND(S, T)                                                                             \
RF_AVX2_SCORES(S, T, 1) RF_AVX2_SCORES(S, T, 2) RF_AVX2_SCORES(S, T, 3)                                 \
RF_AVX2_PV(S, T, 1) RF_AVX2_PV(S, T, 2) RF_AVX2_PV(S, T, 3)                                             \
/* same contract as rf_attend_one_##S; D % 8 == 0, D <= 256 */                                           \
RF_ATT_AVX2 static void rf_attend_avx2_##S(const T *q, int G, int D, const T *kpool, const T *vpool,    \
                                           const int64_t *table, int64_t lo, int64_t L, int block_size, \
                                           float scale, T *out, float *buf) {                           \
    float *scores = buf, *qf = buf + G * L, *acc = qf + G * D;                                           \
    int nd = D / 8;                                                                                      \
    for (int i = 0; i < G * D; i++) qf[i] = RF_LD_##S(q, i) * scale;                                     \
    for (int g0 = 0; g0 < G; g0 += 3) {                                                                  \
        const float *qg = qf + g0 * D;                                                                   \
        float *sg = scores + g0 * L;                                                                     \
        switch (G - g0 < 3 ? G - g0 : 3) {                                                               \
        case 1: rf_scores256_1_##S(qg, nd, kpool, table, lo, L, block_size, sg, L); break;                 \
        case 2: rf_scores256_2_##S(qg, nd, kpool, table, lo, L, block_size, sg, L); break;                 \
        default: rf_scores256_3_##S(qg, nd, kpool, table, lo, L, block_size, sg, L); break;                \
        }                                                                                                \
    }                                                                                                    \
    for (int g = 0; g < G; g++) rf_softmax(scores + g * L, L);                                           \
    for (int g0 = 0; g0 < G; g0 += 3) {                                                                  \
        for (int j0 = 0; j0 < nd; j0 += 4) {                                                             \
            int nj = nd - j0 < 4 ? nd - j0 : 4;                                                          \
            const float *pg = scores + g0 * L;                                                           \
            float *og = acc + g0 * D;                                                                    \
            switch (G - g0 < 3 ? G - g0 : 3) {                                                           \
            case 1: rf_pv256_1_##S(pg, L, D, j0, nj, vpool, table, lo, L, block_size, og); break;          \
            case 2: rf_pv256_2_##S(pg, L, D, j0, nj, vpool, table, lo, L, block_size, og); break;          \
            default: rf_pv256_3_##S(pg, L, D, j0, nj, vpool, table, lo, L, block_size, og); break;         \
            }                                                                                            \
        }                                                                                                \
    }                                                                                                    \
    for (int i = 0; i < G * D; i++) RF_ST_##S(out, i, acc[i]);                                           \
}

RF_AVX2_ATTEND(f32, float)
RF_AVX2_ATTEND(bf16, uint16_t)
#else
#define RF_HAVE_AVX2_KERNELS 0
#endif

#endif
