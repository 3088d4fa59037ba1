/* aarch64: the NEON tier (sdot; smmla for pairs of rows where the CPU has i8mm). Included by
 * quant_kernels.h, after quant_scalar.h. */
#ifndef ROSEFAST_QUANT_NEON_H
#define ROSEFAST_QUANT_NEON_H

#if defined(__GNUC__) && defined(__aarch64__) && !defined(__clang__)
#include <arm_neon.h>
#include <sys/auxv.h>
#define RF_NEON_TIERS 1
#define RF_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif

#if __GNUC__ >= 10   /* +i8mm and vmmlaq_s32 came with GCC 10 */
#define RF_NEON_I8MM 1
#define RF_I8MM __attribute__((target("arch=armv8.2-a+dotprod+i8mm")))
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1 << 13)
#endif

static int rf_cpu_has_dotprod(void) {
    static int known = -1;
    if (known < 0) known = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
    return known;
}

/* the int8 matrix multiply (smmla: Graviton 3+, Neoverse V1/N2, Apple M2+): the NEON tier's pairs of rows */
static int rf_cpu_has_i8mm(void) {
#ifdef RF_NEON_I8MM
    static int known = -1;
    if (known < 0) known = rf_cpu_has_dotprod() && (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0;
    return known;
#else
    return 0;   /* a compiler without it: sdot alone */
#endif
}

/* the 4 products of weight vectors c[o .. o + 3] with the 4 words of xv (16 bytes of one digit's block), one
 * row per int32 lane: sdot by element broadcasts word k */
#define RF_SDOT4(c, o, xv) ({                                                                               \
        int32x4_t u_ = vdotq_laneq_s32(vdupq_n_s32(0), c[o], xv, 0);                                       \
        int32x4_t v_ = vdotq_laneq_s32(vdupq_n_s32(0), c[o + 1], xv, 1);                                   \
        u_ = vdotq_laneq_s32(u_, c[o + 2], xv, 2);                                                          \
        v_ = vdotq_laneq_s32(v_, c[o + 3], xv, 3);                                                          \
        vaddq_s32(u_, v_);                                                                                  \
    })

/* a tile quarter's (rows 4 q .. 4 q + 3) weight vectors of a block, signed: the stored offsets (Q8_0's 128, Q5_0's
 * 16, Q6_K's 32) taken off here (sdot is signed x signed), the bit planes as rf_q_load_avx512's */
RF_DOTPROD static inline void rf_q_load_neon(int fmt, const uint8_t *blk, int q, int8x16_t *c) {
    const uint8x16_t low = vdupq_n_u8(0x0F), flip = vdupq_n_u8(0x80);
    uint8x16_t u[8];
    if (fmt == RF_FMT_Q8_0) {
        for (int i = 0; i < 8; i++) c[i] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(blk + 64 * i + 16 * q), flip));
        return;
    }
    for (int i = 0; i < 4; i++) {
        uint8x16_t raw = vld1q_u8(blk + 64 * i + 16 * q);
        u[2 * i] = vandq_u8(raw, low);
        u[2 * i + 1] = vshrq_n_u8(raw, 4);
    }
    int planes = rf_q_planes(fmt);
    for (int p = 0; p < planes; p++) {
        uint8x16_t cur = vld1q_u8(blk + 256 + 64 * p + 16 * q), bit = vdupq_n_u8((uint8_t)(0x10 << p));
        for (int k = 0; k < 8; k++) {
            u[k] = vorrq_u8(u[k], vandq_u8(p ? vshlq_n_u8(cur, 5) : vshlq_n_u8(cur, 4), bit));
            cur = vshrq_n_u8(cur, 1);
        }
    }
    const int8x16_t off = vdupq_n_s8((int8_t)rf_q_offset(fmt));
    for (int k = 0; k < 8; k++) c[k] = vsubq_s8(vreinterpretq_s8_u8(u[k]), off);
}

static inline float32x4_t rf_q_half4(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

/* a tile quarter's scales for a block, as rf_q_scales_avx512's */
RF_DOTPROD static inline void rf_q_scales_neon(const rf_qweights *w, int64_t g, int q, float32x4_t *sa, float32x4_t *sb,
                                              float32x4_t *mv) {
    int fmt = w->fmt, r = 4 * q;
    if (!rf_q_kformat(fmt)) {
        *sa = *sb = rf_q_half4(w->d + g * RF_QROWS + r);
        *mv = rf_q_has_min(fmt) ? rf_q_half4(w->m + g * RF_QROWS + r) : vdupq_n_f32(0.f);
        return;
    }
    float32x4_t d = rf_q_half4(w->d + (g / 8) * RF_QROWS + r);
    float s0[4], s1[4], m0[4];
    for (int j = 0; j < 4; j++) {
        if (fmt == RF_FMT_Q6_K) {
            s0[j] = (float)(int8_t)w->sc[2 * g * RF_QROWS + r + j];
            s1[j] = (float)(int8_t)w->sc[(2 * g + 1) * RF_QROWS + r + j];
            m0[j] = 0.f;
        } else {
            s0[j] = s1[j] = (float)w->sc[g * RF_QROWS + r + j];
            m0[j] = (float)w->mn[g * RF_QROWS + r + j];
        }
    }
    *sa = vmulq_f32(d, vld1q_f32(s0));
    *sb = vmulq_f32(d, vld1q_f32(s1));
    *mv = fmt == RF_FMT_Q6_K ? vdupq_n_f32(0.f) : vnegq_f32(vmulq_f32(rf_q_half4(w->m + (g / 8) * RF_QROWS + r), vld1q_f32(m0)));
}

/* a quarter's 4 rows' block result for one activation row, added to acc: s0/s1 the first digit's integer products
 * over the block's first/second 16 inputs, t0/t1 the second digit's (both tiles' shared tail, so the two compute
 * the same floats) */
RF_DOTPROD static inline float32x4_t rf_q_add_neon(float32x4_t acc, int32x4_t s0, int32x4_t s1, int32x4_t t0,
                                                  int32x4_t t1, float32x4_t sa, float32x4_t sb, float32x4_t mv,
                                                  float sx, float sumx, int q6, int has_min) {
    const float32x4_t inv254 = vdupq_n_f32(1.f / 254.f), sxv = vdupq_n_f32(sx);
    if (q6) {
        float32x4_t d0 = vfmaq_f32(vcvtq_f32_s32(s0), vcvtq_f32_s32(t0), inv254);
        float32x4_t d1 = vfmaq_f32(vcvtq_f32_s32(s1), vcvtq_f32_s32(t1), inv254);
        acc = vfmaq_f32(acc, d0, vmulq_f32(sa, sxv));
        return vfmaq_f32(acc, d1, vmulq_f32(sb, sxv));
    }
    float32x4_t dot = vfmaq_f32(vcvtq_f32_s32(vaddq_s32(s0, s1)), vcvtq_f32_s32(vaddq_s32(t0, t1)), inv254);
    acc = vfmaq_f32(acc, dot, vmulq_f32(sa, sxv));
    return has_min ? vfmaq_n_f32(acc, mv, sumx) : acc;
}

/* the tile on 128-bit vectors: each block's 16 rows as four quarters of 4 rows (see the scalar tile) */
RF_DOTPROD static void rf_quant_tile_neon(const rf_qweights *w, const rf_qacts *a, int64_t b0, int nb, float *out) {
    const int fmt = w->fmt, bytes = rf_q_block_bytes(fmt), q6 = fmt == RF_FMT_Q6_K, has_min = rf_q_has_min(fmt);
    const int64_t K = a->K, G = a->G;
    float32x4_t acc[RF_QB][4];
    for (int bb = 0; bb < nb; bb++)
        for (int q = 0; q < 4; q++) acc[bb][q] = vdupq_n_f32(0.f);
    for (int64_t g = 0; g < G; g++) {
        for (int i = 0; i < bytes / 64; i++) __builtin_prefetch(w->w + g * bytes + RF_Q_PREFETCH + 64 * i);
        for (int q = 0; q < 4; q++) {
            int8x16_t c[8];
            float32x4_t sa, sb, mv;
            rf_q_load_neon(fmt, w->w + g * bytes, q, c);
            rf_q_scales_neon(w, g, q, &sa, &sb, &mv);
            for (int bb = 0; bb < nb; bb++) {
                int64_t sg = (b0 + bb) * G + g;
                const int8_t *a1 = a->x1 + (b0 + bb) * K + g * RF_QG, *a2 = a->x2 + (b0 + bb) * K + g * RF_QG;
                int8x16_t xa = vld1q_s8(a1), xb = vld1q_s8(a1 + 16), ya = vld1q_s8(a2), yb = vld1q_s8(a2 + 16);
                int32x4_t s0 = RF_SDOT4(c, 0, xa), s1 = RF_SDOT4(c, 4, xb);
                int32x4_t t0 = RF_SDOT4(c, 0, ya), t1 = RF_SDOT4(c, 4, yb);
                acc[bb][q] = rf_q_add_neon(acc[bb][q], s0, s1, t0, t1, sa, sb, mv, a->sx[sg], a->sumx[sg], q6, has_min);
            }
        }
    }
    for (int bb = 0; bb < nb; bb++)
        for (int q = 0; q < 4; q++) vst1q_f32(out + bb * RF_QROWS + 4 * q, acc[bb][q]);
}
#undef RF_SDOT4

/* the tile with smmla for pairs of activation rows: one smmla multiplies 2 weight rows by 2 activation rows over 8
 * inputs (32 products, sdot's 16), so a block's quarter takes 8 of them a digit for two activation rows where sdot
 * takes 16. The same integers as the sdot tile's, the same floats after (rf_q_add_neon); an odd last row: that
 * tile. sdot's lanes hold 4 weights of 4 rows (vector k: weights 4k .. 4k + 3), so zipping the words of vectors
 * 2m and 2m + 1 gives rows (0, 1) and (2, 3) their weights 8m .. 8m + 7, smmla's operand. */
#ifdef RF_NEON_I8MM
RF_I8MM static void rf_quant_tile_neon_i8mm(const rf_qweights *w, const rf_qacts *a, int64_t b0, int nb, float *out) {
    const int fmt = w->fmt, bytes = rf_q_block_bytes(fmt), q6 = fmt == RF_FMT_Q6_K, has_min = rf_q_has_min(fmt);
    const int64_t K = a->K, G = a->G;
    const int pairs = nb / 2;
    if (!pairs) {
        rf_quant_tile_neon(w, a, b0, nb, out);
        return;
    }
    float32x4_t acc[RF_QB][4];
    for (int bb = 0; bb < 2 * pairs; bb++)
        for (int q = 0; q < 4; q++) acc[bb][q] = vdupq_n_f32(0.f);
    for (int64_t g = 0; g < G; g++) {
        for (int i = 0; i < bytes / 64; i++) __builtin_prefetch(w->w + g * bytes + RF_Q_PREFETCH + 64 * i);
        for (int q = 0; q < 4; q++) {
            int8x16_t c[8], wm[4][2];
            float32x4_t sa, sb, mv;
            rf_q_load_neon(fmt, w->w + g * bytes, q, c);
            rf_q_scales_neon(w, g, q, &sa, &sb, &mv);
            for (int m = 0; m < 4; m++) {
                int32x4_t lo = vreinterpretq_s32_s8(c[2 * m]), hi = vreinterpretq_s32_s8(c[2 * m + 1]);
                wm[m][0] = vreinterpretq_s8_s32(vzip1q_s32(lo, hi));   /* rows 0, 1: weights 8m .. 8m + 7 */
                wm[m][1] = vreinterpretq_s8_s32(vzip2q_s32(lo, hi));   /* rows 2, 3 */
            }
            for (int pp = 0; pp < pairs; pp++) {
                int64_t r0 = b0 + 2 * pp;
                const int8_t *x0 = a->x1 + r0 * K + g * RF_QG, *y0 = a->x2 + r0 * K + g * RF_QG;
                /* [half][row pair]: lanes (row 2i, act 0), (2i, act 1), (2i + 1, act 0), (2i + 1, act 1) */
                int32x4_t s[2][2], t[2][2];
                for (int h = 0; h < 2; h++)
                    for (int i = 0; i < 2; i++) s[h][i] = t[h][i] = vdupq_n_s32(0);
                for (int m = 0; m < 4; m++) {
                    int8x16_t xv = vcombine_s8(vld1_s8(x0 + 8 * m), vld1_s8(x0 + K + 8 * m));
                    int8x16_t yv = vcombine_s8(vld1_s8(y0 + 8 * m), vld1_s8(y0 + K + 8 * m));
                    for (int i = 0; i < 2; i++) {
                        s[m / 2][i] = vmmlaq_s32(s[m / 2][i], wm[m][i], xv);
                        t[m / 2][i] = vmmlaq_s32(t[m / 2][i], wm[m][i], yv);
                    }
                }
                for (int e = 0; e < 2; e++) {   /* activation row r0 + e: its 4 rows' lanes */
                    int64_t sg = (r0 + e) * G + g;
                    int32x4_t s0 = e ? vuzp2q_s32(s[0][0], s[0][1]) : vuzp1q_s32(s[0][0], s[0][1]);
                    int32x4_t s1 = e ? vuzp2q_s32(s[1][0], s[1][1]) : vuzp1q_s32(s[1][0], s[1][1]);
                    int32x4_t t0 = e ? vuzp2q_s32(t[0][0], t[0][1]) : vuzp1q_s32(t[0][0], t[0][1]);
                    int32x4_t t1 = e ? vuzp2q_s32(t[1][0], t[1][1]) : vuzp1q_s32(t[1][0], t[1][1]);
                    acc[2 * pp + e][q] = rf_q_add_neon(acc[2 * pp + e][q], s0, s1, t0, t1, sa, sb, mv, a->sx[sg],
                                                       a->sumx[sg], q6, has_min);
                }
            }
        }
    }
    for (int bb = 0; bb < 2 * pairs; bb++)
        for (int q = 0; q < 4; q++) vst1q_f32(out + bb * RF_QROWS + 4 * q, acc[bb][q]);
    if (nb % 2) rf_quant_tile_neon(w, a, b0 + nb - 1, 1, out + (nb - 1) * RF_QROWS);
}
#else
#define rf_quant_tile_neon_i8mm rf_quant_tile_neon
#endif
#endif

#endif   /* ROSEFAST_QUANT_NEON_H */
