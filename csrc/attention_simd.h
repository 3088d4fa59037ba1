/* Decode attention for one (sequence, kv head), written once for any float vector ISA I: the query heads of a
 * group share every K and V row load (converted from bf16 once), RF_GROUP_I of them a pass, so their
 * accumulators (GG heads x 4 tokens for the scores, GG heads x 4 vectors of V) stay in registers. An ISA's
 * header (attention_avx512.h, attention_avx2.h) defines, for its I: RF_VEC_I (its vector of RF_W_I floats),
 * RF_GROUP_I (<= 4), RF_ATT_ATTR_I (its target attribute), the plain helpers (RF_ATT_PLAIN_HELPERS: rf_zero_I,
 * rf_loadu_I, rf_load_I_f32, rf_fma_I, rf_set1_I, rf_storeu_I) and rf_hsum4_I (four vectors' sums as one
 * __m128), rf_hsum_I and rf_load_I_bf16 (RF_W_I bf16 values as fp32); then RF_ATT_KERNELS(I, S, T) gives rf_attend_I_S, with
 * rf_attend_one_S's contract for D a multiple of RF_W_I up to 256. Included by those headers only. */
#ifndef ROSEFAST_ATTENTION_SIMD_H
#define ROSEFAST_ATTENTION_SIMD_H

/* an ISA's plain helpers, each its intrinsics' P##_<op>_ps (P: _mm256, _mm512) on vectors V */
#define RF_ATT_PLAIN_HELPERS(I, V, P)                                                                    \
RF_ATT_ATTR_##I static inline V rf_zero_##I(void) { return P##_setzero_ps(); }                           \
RF_ATT_ATTR_##I static inline V rf_loadu_##I(const float *p) { return P##_loadu_ps(p); }                 \
RF_ATT_ATTR_##I static inline V rf_load_##I##_f32(const float *p) { return P##_loadu_ps(p); }            \
RF_ATT_ATTR_##I static inline V rf_fma_##I(V a, V b, V c) { return P##_fmadd_ps(a, b, c); }              \
RF_ATT_ATTR_##I static inline V rf_set1_##I(float x) { return P##_set1_ps(x); }                          \
RF_ATT_ATTR_##I static inline void rf_storeu_##I(float *p, V v) { P##_storeu_ps(p, v); }

/* scores[g][t] = q_g . k_t for GG (compile-time) heads starting at q (already scaled, fp32); four tokens at a
 * time, so one horizontal reduction serves four dot products */
#define RF_ATT_SCORES(I, S, T, GG)                                                                       \
RF_ATT_ATTR_##I static inline __attribute__((always_inline)) void rf_scores_##I##_##GG##_##S(            \
        const float *q, int nd, const T *kpool, const int64_t *table, int64_t lo, int64_t L, int block_size,\
        float *scores, int64_t score_stride) {                                                          \
    int D = nd * RF_W_##I;                                                                               \
    int64_t t = 0;                                                                                       \
    for (; t + 4 <= L; t += 4) {                                                                         \
        const T *k[4];                                                                                   \
        for (int i = 0; i < 4; i++)                                                                      \
            k[i] = kpool + RF_SLOT(table, lo + t + i, block_size) * D;                                   \
        RF_VEC_##I acc[GG][4];                                                                           \
        for (int g = 0; g < GG; g++)                                                                     \
            for (int i = 0; i < 4; i++) acc[g][i] = rf_zero_##I();                                       \
        for (int j = 0; j < nd; j++) {                                                                   \
            RF_VEC_##I kj[4];                                                                            \
            for (int i = 0; i < 4; i++) kj[i] = rf_load_##I##_##S(k[i] + RF_W_##I * j);                  \
            for (int g = 0; g < GG; g++) {                                                               \
                RF_VEC_##I qj = rf_loadu_##I(q + g * D + RF_W_##I * j);                                  \
                for (int i = 0; i < 4; i++) acc[g][i] = rf_fma_##I(qj, kj[i], acc[g][i]);                \
            }                                                                                            \
        }                                                                                                \
        for (int g = 0; g < GG; g++)                                                                     \
            _mm_storeu_ps(scores + g * score_stride + t, rf_hsum4_##I(acc[g][0], acc[g][1], acc[g][2], acc[g][3])); \
    }                                                                                                    \
    for (; t < L; t++) {                                                                                 \
        const T *k = kpool + RF_SLOT(table, lo + t, block_size) * D;                                     \
        RF_VEC_##I acc[GG];                                                                              \
        for (int g = 0; g < GG; g++) acc[g] = rf_zero_##I();                                             \
        for (int j = 0; j < nd; j++) {                                                                   \
            RF_VEC_##I kj = rf_load_##I##_##S(k + RF_W_##I * j);                                         \
            for (int g = 0; g < GG; g++) acc[g] = rf_fma_##I(rf_loadu_##I(q + g * D + RF_W_##I * j), kj, acc[g]); \
        }                                                                                                \
        for (int g = 0; g < GG; g++) scores[g * score_stride + t] = rf_hsum_##I(acc[g]);                 \
    }                                                                                                    \
}

/* out_g[W j0 .. W (j0 + nj)) = sum_t p[g][t] v_t for GG heads and one slice of up to 4 vectors of D */
#define RF_ATT_PV(I, S, T, GG)                                                                           \
RF_ATT_ATTR_##I static inline __attribute__((always_inline)) void rf_pv_##I##_##GG##_##S(                \
        const float *p, int64_t p_stride, int D, int j0, int nj, const T *vpool, const int64_t *table,  \
        int64_t lo, int64_t L, int block_size, float *out) {                                             \
    RF_VEC_##I acc[GG][4];                                                                               \
    for (int g = 0; g < GG; g++)                                                                         \
        for (int j = 0; j < 4; j++) acc[g][j] = rf_zero_##I();                                           \
    for (int64_t t = 0; t < L; t++) {                                                                    \
        const T *v = vpool + RF_SLOT(table, lo + t, block_size) * D + RF_W_##I * j0;                     \
        RF_VEC_##I vj[4];                                                                                \
        for (int j = 0; j < 4; j++) vj[j] = j < nj ? rf_load_##I##_##S(v + RF_W_##I * j) : rf_zero_##I(); \
        for (int g = 0; g < GG; g++) {                                                                   \
            RF_VEC_##I pg = rf_set1_##I(p[g * p_stride + t]);                                            \
            for (int j = 0; j < 4; j++) acc[g][j] = rf_fma_##I(pg, vj[j], acc[g][j]);                    \
        }                                                                                                \
    }                                                                                                    \
    for (int g = 0; g < GG; g++)                                                                         \
        for (int j = 0; j < nj; j++) rf_storeu_##I(out + g * D + RF_W_##I * (j0 + j), acc[g][j]);        \
}

#define RF_ATT_KERNELS(I, S, T)                                                                          \
RF_ATT_SCORES(I, S, T, 1) RF_ATT_SCORES(I, S, T, 2) RF_ATT_SCORES(I, S, T, 3) RF_ATT_SCORES(I, S, T, 4) \
RF_ATT_PV(I, S, T, 1) RF_ATT_PV(I, S, T, 2) RF_ATT_PV(I, S, T, 3) RF_ATT_PV(I, S, T, 4)                 \
/* same contract as rf_attend_one_##S; D % RF_W_##I == 0, D <= 256 */                                    \
RF_ATT_ATTR_##I static void rf_attend_##I##_##S(const T *q, int G, int D, const T *kpool, const T *vpool,\
                                                const int64_t *table, int64_t lo, int64_t L, int block_size,\
                                                float scale, T *out, float *buf) {                      \
    float *scores = buf, *qf = buf + G * L, *acc = qf + G * D;                                           \
    int nd = D / RF_W_##I;                                                                               \
    for (int i = 0; i < G * D; i++) qf[i] = RF_LD_##S(q, i) * scale;                                     \
    for (int g0 = 0; g0 < G; g0 += RF_GROUP_##I) {                                                       \
        const float *qg = qf + g0 * D;                                                                   \
        float *sg = scores + g0 * L;                                                                     \
        switch (G - g0 < RF_GROUP_##I ? G - g0 : RF_GROUP_##I) {                                         \
        case 1: rf_scores_##I##_1_##S(qg, nd, kpool, table, lo, L, block_size, sg, L); break;            \
        case 2: rf_scores_##I##_2_##S(qg, nd, kpool, table, lo, L, block_size, sg, L); break;            \
        case 3: rf_scores_##I##_3_##S(qg, nd, kpool, table, lo, L, block_size, sg, L); break;            \
        default: rf_scores_##I##_4_##S(qg, nd, kpool, table, lo, L, block_size, sg, L); break;           \
        }                                                                                                \
    }                                                                                                    \
    for (int g = 0; g < G; g++) rf_softmax(scores + g * L, L);                                           \
    for (int g0 = 0; g0 < G; g0 += RF_GROUP_##I) {                                                       \
        for (int j0 = 0; j0 < nd; j0 += 4) {                                                             \
            int nj = nd - j0 < 4 ? nd - j0 : 4;                                                          \
            const float *pg = scores + g0 * L;                                                           \
            float *og = acc + g0 * D;                                                                    \
            switch (G - g0 < RF_GROUP_##I ? G - g0 : RF_GROUP_##I) {                                     \
            case 1: rf_pv_##I##_1_##S(pg, L, D, j0, nj, vpool, table, lo, L, block_size, og); break;     \
            case 2: rf_pv_##I##_2_##S(pg, L, D, j0, nj, vpool, table, lo, L, block_size, og); break;     \
            case 3: rf_pv_##I##_3_##S(pg, L, D, j0, nj, vpool, table, lo, L, block_size, og); break;     \
            default: rf_pv_##I##_4_##S(pg, L, D, j0, nj, vpool, table, lo, L, block_size, og); break;    \
            }                                                                                            \
        }                                                                                                \
    }                                                                                                    \
    for (int i = 0; i < G * D; i++) RF_ST_##S(out, i, acc[i]);                                           \
}

#endif
