/* The scalar reference every tier is tested against, and the C helpers every tier shares (the
 * activations' two digits, the stores). Included by quant_kernels.h after quant_common.h. */
#ifndef ROSEFAST_QUANT_SCALAR_H
#define ROSEFAST_QUANT_SCALAR_H

static int64_t rf_quant_work_bytes(int64_t B, int64_t K) {
    return 2 * ((B * K + 63) & ~(int64_t)63) + 4 * B * (K / RF_QG) * 6;
}

/* IEEE half -> float, portable (subnormals included) */
static inline float rf_q_half(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    float f;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else {
        f = (float)man * (1.0f / 16777216.0f);   /* man 2^-24 */
        memcpy(&u, &f, 4);
        u |= sign;
    }
    memcpy(&f, &u, 4);
    return f;
}

static inline int8_t rf_q_digit(float v) {
    float r = rintf(v);   /* nearest even, as the vector conversions */
    return (int8_t)(r > 127.f ? 127.f : (r < -127.f ? -127.f : r));
}

/* one row of x (fp32 or bf16) -> its two digits x1, x2 [K] int8, sx, sumx [K / 32]; isum [2, K / 32]: the sums
 * of x1 and of x2 per group; ihalf [2, K / 32]: the same over each group's first 16. Portable; the digits clamped
 * to -127..127 (the AVX2 sign trick negates them). */
static void rf_quantize_row_c(const void *x, int bf16, int64_t K, int8_t *x1, int8_t *x2, float *sx, float *sumx,
                              int32_t *isum, int32_t *ihalf) {
    int64_t G = K / RF_QG;
    for (int64_t g = 0; g < G; g++) {
        float v[RF_QG], amax = 0.f, sum = 0.f;
        for (int i = 0; i < RF_QG; i++) {
            if (bf16) {
                uint32_t u = (uint32_t)((const uint16_t *)x)[g * RF_QG + i] << 16;
                memcpy(&v[i], &u, 4);
            } else {
                v[i] = ((const float *)x)[g * RF_QG + i];
            }
            float a = fabsf(v[i]);
            amax = a > amax ? a : amax;
            sum += v[i];
        }
        float scale = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
        int32_t s1 = 0, s2 = 0;
        for (int i = 0; i < RF_QG; i++) {
            int8_t a = rf_q_digit(v[i] * inv);
            int8_t b = rf_q_digit((v[i] - (float)a * scale) * (254.f * inv));
            x1[g * RF_QG + i] = a;
            x2[g * RF_QG + i] = b;
            s1 += a;
            s2 += b;
            if (i == RF_QG / 2 - 1) {
                ihalf[g] = s1;
                ihalf[G + g] = s2;
            }
        }
        sx[g] = scale;
        sumx[g] = sum;
        isum[g] = s1;
        isum[G + g] = s2;
    }
}

static inline void rf_q_store(void *y, int bf16, int64_t index, const float *v, const float *bias, int count) {
    for (int r = 0; r < count; r++) {
        float f = v[r] + (bias ? bias[r] : 0.f);
        if (bf16) {
            uint32_t u;
            memcpy(&u, &f, 4);
            uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
            ((uint16_t *)y)[index + r] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);
        } else {
            ((float *)y)[index + r] = f;
        }
    }
}

/* row j's 32 weights of a block as integers (Q6_K's less 32, Q8_0's less 128) */
static inline void rf_q_weights_c(int fmt, const uint8_t *blk, int j, int16_t *q) {
    int planes = rf_q_planes(fmt);
    for (int i = 0; i < RF_QG; i++) {
        if (fmt == RF_FMT_Q8_0) {
            q[i] = (int16_t)((int)blk[64 * (i / 4) + 4 * j + i % 4] - 128);
            continue;
        }
        uint8_t byte = blk[64 * (i / 8) + 4 * j + i % 4];
        int v = i % 8 < 4 ? byte & 15 : byte >> 4;
        for (int p = 0; p < planes; p++) v |= ((blk[256 + 64 * p + 4 * j + i % 4] >> (i / 4)) & 1) << (4 + p);
        q[i] = (int16_t)(v - rf_q_offset(fmt));
    }
}

/* row j's scales for block g: s over the block's first and second 16 inputs (equal but for Q6_K), the min */
static inline void rf_q_scales_c(const rf_qweights *q, int64_t g, int j, float *sa, float *sb, float *mj) {
    int fmt = q->fmt;
    if (!rf_q_kformat(fmt)) {
        *sa = *sb = rf_q_half(q->d[g * RF_QROWS + j]);
        *mj = rf_q_has_min(fmt) ? rf_q_half(q->m[g * RF_QROWS + j]) : 0.f;
        return;
    }
    float d = rf_q_half(q->d[(g / 8) * RF_QROWS + j]);
    if (fmt == RF_FMT_Q6_K) {
        *sa = d * (float)(int8_t)q->sc[2 * g * RF_QROWS + j];
        *sb = d * (float)(int8_t)q->sc[(2 * g + 1) * RF_QROWS + j];
        *mj = 0.f;
    } else {
        *sa = *sb = d * (float)q->sc[g * RF_QROWS + j];
        *mj = -(rf_q_half(q->m[(g / 8) * RF_QROWS + j]) * (float)q->mn[g * RF_QROWS + j]);
    }
}

/* one tile of rows (q: the tile's own pointers) against activation rows b0 .. b0 + nb (nb <= RF_QB) -> out
 * [nb, 16]; the portable reference (every tile function below has this signature) */
static void rf_quant_tile_scalar(const rf_qweights *q, const rf_qacts *a, int64_t b0, int nb, float *out) {
    int16_t w[RF_QROWS][RF_QG];
    float sa[RF_QROWS], sb[RF_QROWS], mj[RF_QROWS];
    int64_t K = a->K, G = a->G, bytes = rf_q_block_bytes(q->fmt);
    int halves = q->fmt == RF_FMT_Q6_K;
    for (int i = 0; i < nb * RF_QROWS; i++) out[i] = 0.f;
    for (int64_t g = 0; g < G; g++) {
        for (int j = 0; j < RF_QROWS; j++) {
            rf_q_weights_c(q->fmt, q->w + g * bytes, j, w[j]);
            rf_q_scales_c(q, g, j, &sa[j], &sb[j], &mj[j]);
        }
        for (int bb = 0; bb < nb; bb++) {
            const int8_t *a1 = a->x1 + (b0 + bb) * K + g * RF_QG, *a2 = a->x2 + (b0 + bb) * K + g * RF_QG;
            float s = a->sx[(b0 + bb) * G + g], sum = a->sumx[(b0 + bb) * G + g];
            for (int j = 0; j < RF_QROWS; j++) {
                int32_t s1[2] = {0, 0}, s2[2] = {0, 0};
                for (int i = 0; i < RF_QG; i++) {
                    s1[i >= RF_QG / 2] += w[j][i] * a1[i];
                    s2[i >= RF_QG / 2] += w[j][i] * a2[i];
                }
                if (halves) {
                    float da = (float)s1[0] + (float)s2[0] * (1.f / 254.f), db = (float)s1[1] + (float)s2[1] * (1.f / 254.f);
                    out[bb * RF_QROWS + j] += da * (sa[j] * s) + db * (sb[j] * s);
                } else {
                    float dot = (float)(s1[0] + s1[1]) + (float)(s2[0] + s2[1]) * (1.f / 254.f);
                    out[bb * RF_QROWS + j] += dot * (sa[j] * s) + mj[j] * sum;
                }
            }
        }
    }
}

#endif   /* ROSEFAST_QUANT_SCALAR_H */
