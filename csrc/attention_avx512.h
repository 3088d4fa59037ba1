/* Decode attention for one (sequence, kv head) with AVX-512 intrinsics: the G query heads of the group
 * share every K and V row load (converted from bf16 once), the accumulators of up to 4 heads x 64 dims
 * stay in registers. Used when the CPU has AVX-512 and head_dim is a multiple of 16 (<= 256); the
 * portable C of decode_kernels.h covers everything else. Included by decode_kernels.h only. */
#ifndef ROSEFAST_ATTENTION_AVX512_H
#define ROSEFAST_ATTENTION_AVX512_H

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#include <immintrin.h>
#define RF_HAVE_AVX512_KERNELS 1
#define RF_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

static int rf_cpu_has_avx512(void) {
    static int known = -1;
    if (known < 0) known = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
                           && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    return known;
}

RF_AVX512 static inline __m512 rf_load16_f32(const float *p) { return _mm512_loadu_ps(p); }
RF_AVX512 static inline __m512 rf_load16_bf16(const uint16_t *p) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

/* the four horizontal sums of a, b, c, d as one 4-lane vector */
RF_AVX512 static inline __m128 rf_hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));   /* per 128-bit lane */
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    __m512 abcd = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 half = _mm256_add_ps(_mm512_castps512_ps256(abcd), _mm512_extractf32x8_ps(abcd, 1));
    return _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
}

/* scores[g][t] = q_g . k_t for GG (compile-time, <= 4) heads starting at q (already scaled, fp32);
 * four tokens at a time, so one horizontal reduction serves four dot products */
#define RF_AVX512_SCORES(S, T, GG)                                                                       \
RF_AVX512 static inline __attribute__((always_inline)) void rf_scores##GG##_##S(                         \
        const float *q, int nd, const T *kpool, const int64_t *table, int64_t lo, int64_t L, int block_size,\
        float *scores, int64_t score_stride) {                                                          \
    int D = nd * 16;                                                                                     \
    int64_t t = 0;                                                                                       \
    for (; t + 4 <= L; t += 4) {                                                                         \
        const T *k[4];                                                                                   \
        for (int i = 0; i < 4; i++)                                                                      \
            k[i] = kpool + RF_SLOT(table, lo + t + i, block_size) * D;                                   \
        __m512 acc[GG][4];                                                                               \
        for (int g = 0; g < GG; g++)                                                                     \
            for (int i = 0; i < 4; i++) acc[g][i] = _mm512_setzero_ps();                                 \
        for (int j = 0; j < nd; j++) {                                                                   \
            __m512 kj[4];                                                                                \
            for (int i = 0; i < 4; i++) kj[i] = rf_load16_##S(k[i] + 16 * j);                            \
            for (int g = 0; g < GG; g++) {                                                               \
                __m512 qj = _mm512_loadu_ps(q + g * D + 16 * j);                                         \
                for (int i = 0; i < 4; i++) acc[g][i] = _mm512_fmadd_ps(qj, kj[i], acc[g][i]);           \
            }                                                                                            \
        }                                                                                                \
        for (int g = 0; g < GG; g++)                                                                     \
            _mm_storeu_ps(scores + g * score_stride + t, rf_hsum4(acc[g][0], acc[g][1], acc[g][2], acc[g][3])); \
    }                                                                                                    \
    for (; t < L; t++) {                                                                                 \
        const T *k = kpool + RF_SLOT(table, lo + t, block_size) * D;                                     \
        __m512 acc[GG];                                                                                  \
        for (int g = 0; g < GG; g++) acc[g] = _mm512_setzero_ps();                                       \
        for (int j = 0; j < nd; j++) {                                                                   \
            __m512 kj = rf_load16_##S(k + 16 * j);                                                       \
            for (int g = 0; g < GG; g++) acc[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * D + 16 * j), kj, acc[g]); \
        }                                                                                                \
        for (int g = 0; g < GG; g++) scores[g * score_stride + t] = _mm512_reduce_add_ps(acc[g]);        \
    }                                                                                                    \
}

/* out_g[16j .. 16j + 64) = sum_t p[g][t] v_t for GG heads and one 64-wide (ND <= 4 chunks) slice of D */
#define RF_AVX512_PV(S, T, GG)                                                                           \
RF_AVX512 static inline __attribute__((always_inline)) void rf_pv##GG##_##S(                             \
        const float *p, int64_t p_stride, int D, int j0, int nj, const T *vpool, const int64_t *table,  \
        int64_t lo, int64_t L, int block_size, float *out) {                                             \
    __m512 acc[GG][4];                                                                                   \
    for (int g = 0; g < GG; g++)                                                                         \
        for (int j = 0; j < 4; j++) acc[g][j] = _mm512_setzero_ps();                                     \
    for (int64_t t = 0; t < L; t++) {                                                                    \
        const T *v = vpool + RF_SLOT(table, lo + t, block_size) * D + 16 * j0;                           \
        __m512 vj[4];                                                                                    \
        for (int j = 0; j < 4; j++) vj[j] = j < nj ? rf_load16_##S(v + 16 * j) : _mm512_setzero_ps();   \
        for (int g = 0; g < GG; g++) {                                                                   \
            __m512 pg = _mm512_set1_ps(p[g * p_stride + t]);                                             \
            for (int j = 0; j < 4; j++) acc[g][j] = _mm512_fmadd_ps(pg, vj[j], acc[g][j]);               \
        }                                                                                                \
    }                                                                                                    \
    for (int g = 0; g < GG; g++)                                                                         \
        for (int j = 0; j < nj; j++) _mm512_storeu_ps(out + g * D + 16 * (j0 + j), acc[g][j]);           \
}

#define RF_AVX512_ATTEND(S, T)                                                                           \
RF_AVX512_SCORES(S, T, 1) RF_AVX512_SCORES(S, T, 2) RF_AVX512_SCORES(S, T, 3) RF_AVX512_SCORES(S, T, 4) \
RF_AVX512_PV(S, T, 1) RF_AVX512_PV(S, T, 2) RF_AVX512_PV(S, T, 3) RF_AVX512_PV(S, T, 4)                 \
/* same contract as rf_attend_one_##S; D % 16 == 0, D <= 256 */                                          \
RF_AVX512 static void rf_attend_avx512_##S(const T *q, int G, int D, const T *kpool, const T *vpool,    \
                                           const int64_t *table, int64_t lo, int64_t L, int block_size, \
                                           float scale, T *out, float *buf) {                           \
    float *scores = buf, *qf = buf + G * L, *acc = qf + G * D;                                           \
    int nd = D / 16;                                                                                     \
    for (int i = 0; i < G * D; i++) qf[i] = RF_LD_##S(q, i) * scale;                                     \
    for (int g0 = 0; g0 < G; g0 += 4) {                                                                  \
        const float *qg = qf + g0 * D;                                                                   \
        float *sg = scores + g0 * L;                                                                     \
        switch (G - g0 < 4 ? G - g0 : 4) {                                                               \
        case 1: rf_scores1_##S(qg, nd, kpool, table, lo, L, block_size, sg, L); break;                       \
        case 2: rf_scores2_##S(qg, nd, kpool, table, lo, L, block_size, sg, L); break;                       \
        case 3: rf_scores3_##S(qg, nd, kpool, table, lo, L, block_size, sg, L); break;                       \
        default: rf_scores4_##S(qg, nd, kpool, table, lo, L, block_size, sg, L); break;                      \
        }                                                                                                \
    }                                                                                                    \
    for (int g = 0; g < G; g++) rf_softmax(scores + g * L, L);                                           \
    for (int g0 = 0; g0 < G; g0 += 4) {                                                                  \
        for (int j0 = 0; j0 < nd; j0 += 4) {                                                             \
            int nj = nd - j0 < 4 ? nd - j0 : 4;                                                          \
            const float *pg = scores + g0 * L;                                                           \
            float *og = acc + g0 * D;                                                                    \
            switch (G - g0 < 4 ? G - g0 : 4) {                                                           \
            case 1: rf_pv1_##S(pg, L, D, j0, nj, vpool, table, lo, L, block_size, og); break;                \
            case 2: rf_pv2_##S(pg, L, D, j0, nj, vpool, table, lo, L, block_size, og); break;                \
            case 3: rf_pv3_##S(pg, L, D, j0, nj, vpool, table, lo, L, block_size, og); break;                \
            default: rf_pv4_##S(pg, L, D, j0, nj, vpool, table, lo, L, block_size, og); break;               \
            }                                                                                            \
        }                                                                                                \
    }                                                                                                    \
    for (int i = 0; i < G * D; i++) RF_ST_##S(out, i, acc[i]);                                           \
}

RF_AVX512_ATTEND(f32, float)
RF_AVX512_ATTEND(bf16, uint16_t)
#else
#define RF_HAVE_AVX512_KERNELS 0
#endif

#endif
