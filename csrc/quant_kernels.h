/* Quantized linears on GGUF's own block formats with integer dot products, the activations as two int8 digits
 * per value, per 32 inputs:
 *
 *   x ~ sx (x1 + x2 / 254),  x1 = round(x / sx), x2 = round((x - sx x1) 254 / sx),  sx = max |x| / 127
 *
 * (one digit, llama.cpp's Q8 activations, is off by up to sx / 2: 1-3 % per linear on SmolLM2's activations,
 * enough to part greedy texts within a few tokens; two are off by sx / 508, finer than bf16). Per block g:
 *
 *   Q4_1: y[b, n] = sum_g d[n, g] sx[b, g] (q . x1 + q . x2 / 254) + m[n, g] sumx[b, g]    (q in 0..15)
 *   Q8_0: y[b, n] = sum_g d[n, g] sx[b, g] (q . x1 + q . x2 / 254)                        (q in -128..127)
 *
 * sumx is the group's exact sum. At batch 1 the weights' bytes bound the time; the second digit's products
 * cost nothing there.
 *
 * Weights are re-laid out once at load in tiles of 16 output rows (rosefast/models/quant_tiles.py) so that
 * one int32 lane of an integer dot product accumulates one row's whole block: for tile t and block g,
 *   Q4_1: 256 bytes, 4 chunks of 64; byte 4 j + b of chunk c holds row j's weight 8 c + b in its low nibble
 *         and 8 c + 4 + b in its high nibble; d and m fp16 [tiles, G, 16].
 *   Q8_0: 512 bytes, 8 chunks of 64; byte 4 j + b of chunk i holds row j's weight 4 i + b, plus 128 (so the
 *         weights are the unsigned operand of vpdpbusd; the activations' integer sums undo the shift).
 * A block's result for 16 rows is then one vector (two on 256-bit ISAs): no horizontal sums, the scales loaded
 * as they lie.
 *
 * Tiers, one build for every CPU of an architecture (each compiled with target attributes, picked at run time
 * by the caller, rf_quant_tier_ok says which this CPU runs):
 *   RF_TIER_AVX512VNNI  vpdpbusd on 512 bits (Ice Lake server and later, Zen 4+)
 *   RF_TIER_AVXVNNI     the VEX vpdpbusd on 256 bits (Alder Lake and later client chips, Sapphire Rapids, Zen 5)
 *   RF_TIER_AVX2        vpmaddubsw + vpmaddwd (Haswell and later, Zen 1-3); Q8_0 with the sign trick, since
 *                       u8 x s8 pairs of 0..255 weights overflow vpmaddubsw's int16
 *   RF_TIER_NEON        sdot (aarch64 with the dot-product extension: Graviton 2+, Ampere, Apple M1+)
 *   RF_TIER_SCALAR      portable C, the reference every other tier is tested against; any CPU
 * Every tier computes the same integers; the float sums may differ in order (and the AVX-512 tier's digits
 * saturate at -128 where the others clamp at -127: a difference of one in the second digit, 1/254 of a step).
 * Rows (tiles) are split over OpenMP threads (torch's libgomp pool). */
#ifndef ROSEFAST_QUANT_KERNELS_H
#define ROSEFAST_QUANT_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RF_QG 32          /* inputs per block */
#define RF_QROWS 16       /* output rows per tile */
#define RF_QB 4           /* activation rows sharing one unpacking of a tile's block */
#define RF_Q_PARALLEL_MIN 65536   /* below this many weights x rows a call stays on one thread */
#ifndef RF_Q_PREFETCH
#define RF_Q_PREFETCH 4096   /* bytes ahead in the weights' stream */
#endif

/* the tiers, in rosefast/models/_quant_ops_c.pyx's TIERS order */
enum { RF_TIER_SCALAR = 0, RF_TIER_AVX2 = 1, RF_TIER_AVXVNNI = 2, RF_TIER_AVX512VNNI = 3, RF_TIER_NEON = 4,
       RF_TIERS = 5 };

static int64_t rf_quant_work_bytes(int64_t B, int64_t K) {
    return 2 * ((B * K + 63) & ~(int64_t)63) + 4 * B * (K / RF_QG) * 4;
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
 * of x1 and of x2 per group. Portable; the digits clamped to -127..127 (the AVX2 sign trick negates them). */
static void rf_quantize_row_c(const void *x, int bf16, int64_t K, int8_t *x1, int8_t *x2, float *sx, float *sumx,
                              int32_t *isum) {
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

/* one tile of rows against activation rows b0 .. b0 + nb (nb <= RF_QB) -> out [nb, 16]: Q4_1 (m given) or Q8_0;
 * the portable reference (every tile function below has this signature) */
static void rf_quant_tile_scalar(int q8, const uint8_t *w, const uint16_t *d, const uint16_t *m, const int8_t *x1,
                                 const int8_t *x2, const float *sx, const float *sumx, const int32_t *isum,
                                 int64_t b0, int nb, int64_t K, int64_t G, float *out) {
    (void)isum;
    int16_t q[RF_QROWS][RF_QG];
    float dj[RF_QROWS], mj[RF_QROWS];
    for (int i = 0; i < nb * RF_QROWS; i++) out[i] = 0.f;
    for (int64_t g = 0; g < G; g++) {
        const uint8_t *blk = w + g * (q8 ? 512 : 256);
        for (int j = 0; j < RF_QROWS; j++) {
            for (int i = 0; i < RF_QG; i++) {
                if (q8) {
                    q[j][i] = (int16_t)((int)blk[64 * (i / 4) + 4 * j + i % 4] - 128);
                } else {
                    uint8_t byte = blk[64 * (i / 8) + 4 * j + i % 4];
                    q[j][i] = (int16_t)(i % 8 < 4 ? byte & 15 : byte >> 4);
                }
            }
            dj[j] = rf_q_half(d[g * RF_QROWS + j]);
            mj[j] = q8 ? 0.f : rf_q_half(m[g * RF_QROWS + j]);
        }
        for (int bb = 0; bb < nb; bb++) {
            const int8_t *a1 = x1 + (b0 + bb) * K + g * RF_QG, *a2 = x2 + (b0 + bb) * K + g * RF_QG;
            float s = sx[(b0 + bb) * G + g], sum = sumx[(b0 + bb) * G + g];
            for (int j = 0; j < RF_QROWS; j++) {
                int32_t s1 = 0, s2 = 0;
                for (int i = 0; i < RF_QG; i++) {
                    s1 += q[j][i] * a1[i];
                    s2 += q[j][i] * a2[i];
                }
                float dot = (float)s1 + (float)s2 * (1.f / 254.f);
                out[bb * RF_QROWS + j] += dot * (dj[j] * s) + mj[j] * sum;
            }
        }
    }
}

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#include <immintrin.h>
#define RF_X86_TIERS 1
#define RF_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c")))

static int rf_cpu_has_avx512vnni(void) {
    static int known = -1;
    if (known < 0) known = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
                           && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")
                           && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("f16c");
    return known;
}

/* one row of x (fp32 or bf16) -> its two digits x1, x2 [K] int8, sx, sumx [K / 32]; isum [2, K / 32]: the sums
 * of x1 and of x2 per group */
RF_VNNI static void rf_quantize_row_avx512(const void *x, int bf16, int64_t K, int8_t *x1, int8_t *x2, float *sx,
                                    float *sumx, int32_t *isum) {
    const __m512 sign = _mm512_set1_ps(-0.0f);
    int64_t G = K / RF_QG;
    for (int64_t g = 0; g < G; g++) {
        __m512 v[2];
        for (int h = 0; h < 2; h++) {
            if (bf16) {
                const uint16_t *p = (const uint16_t *)x + g * RF_QG + 16 * h;
                v[h] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
            } else {
                v[h] = _mm512_loadu_ps((const float *)x + g * RF_QG + 16 * h);
            }
        }
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, v[0]), _mm512_andnot_ps(sign, v[1])));
        float scale = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
        sx[g] = scale;
        sumx[g] = _mm512_reduce_add_ps(_mm512_add_ps(v[0], v[1]));
        __m512i s1 = _mm512_setzero_si512(), s2 = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            __m512i a = _mm512_cvtps_epi32(_mm512_mul_ps(v[h], _mm512_set1_ps(inv)));   /* nearest even */
            __m512 r = _mm512_sub_ps(v[h], _mm512_mul_ps(_mm512_cvtepi32_ps(a), _mm512_set1_ps(scale)));
            __m512i b = _mm512_cvtps_epi32(_mm512_mul_ps(r, _mm512_set1_ps(254.f * inv)));
            s1 = _mm512_add_epi32(s1, a);
            s2 = _mm512_add_epi32(s2, b);
            _mm_storeu_si128((__m128i *)(x1 + g * RF_QG + 16 * h), _mm512_cvtsepi32_epi8(a));
            _mm_storeu_si128((__m128i *)(x2 + g * RF_QG + 16 * h), _mm512_cvtsepi32_epi8(b));
        }
        isum[g] = _mm512_reduce_add_epi32(s1);
        isum[G + g] = _mm512_reduce_add_epi32(s2);
    }
}

#define RF_XB(xs, bb, i) _mm512_set1_epi32(((const int32_t *)(xs + (b0 + (bb)) * K + g * RF_QG))[i])

/* the 8 products of a block's 4 weight chunks (lo/hi nibbles, or 8 bytes) with one digit of an activation row */
#define RF_DOT8(acc, w, xs, bb) do {                                                                        \
        __m512i u_ = _mm512_dpbusd_epi32(acc, w[0], RF_XB(xs, bb, 0));                                     \
        __m512i v_ = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], RF_XB(xs, bb, 1));                 \
        u_ = _mm512_dpbusd_epi32(u_, w[2], RF_XB(xs, bb, 2));                                             \
        v_ = _mm512_dpbusd_epi32(v_, w[3], RF_XB(xs, bb, 3));                                             \
        u_ = _mm512_dpbusd_epi32(u_, w[4], RF_XB(xs, bb, 4));                                             \
        v_ = _mm512_dpbusd_epi32(v_, w[5], RF_XB(xs, bb, 5));                                             \
        u_ = _mm512_dpbusd_epi32(u_, w[6], RF_XB(xs, bb, 6));                                             \
        v_ = _mm512_dpbusd_epi32(v_, w[7], RF_XB(xs, bb, 7));                                             \
        acc = _mm512_add_epi32(u_, v_);                                                                     \
    } while (0)

/* one tile of rows against activation rows b0 .. b0 + nb (nb <= RF_QB) -> acc[bb] (16 rows each): Q4_1 (m
 * given) or Q8_0 (stored + 128: the activations' integer sums undo the shift) */
RF_VNNI static void rf_quant_tile_avx512(int q8, const uint8_t *w, const uint16_t *d, const uint16_t *m,
                                         const int8_t *x1, const int8_t *x2, const float *sx, const float *sumx,
                                         const int32_t *isum, int64_t b0, int nb, int64_t K, int64_t G,
                                         float *out) {
    __m512 acc[RF_QB];
    const __m512i low = _mm512_set1_epi8(0x0F);
    const __m512 inv254 = _mm512_set1_ps(1.f / 254.f);
    for (int bb = 0; bb < nb; bb++) acc[bb] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        __m512i c[8];
        /* the hardware's prefetch alone left the weights' stream at ~60 % of the machine's read bandwidth */
        for (int i = 0; i < (q8 ? 8 : 4); i++)
            _mm_prefetch((const char *)w + g * (q8 ? 512 : 256) + RF_Q_PREFETCH + 64 * i, _MM_HINT_T0);
        _mm_prefetch((const char *)(d + g * RF_QROWS) + RF_Q_PREFETCH / 8, _MM_HINT_T0);
        if (!q8) _mm_prefetch((const char *)(m + g * RF_QROWS) + RF_Q_PREFETCH / 8, _MM_HINT_T0);
        if (q8) {
            for (int i = 0; i < 8; i++) c[i] = _mm512_loadu_si512((const void *)(w + g * 512 + 64 * i));
        } else {
            for (int i = 0; i < 4; i++) {
                __m512i raw = _mm512_loadu_si512((const void *)(w + g * 256 + 64 * i));
                c[2 * i] = _mm512_and_si512(raw, low);
                c[2 * i + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
            }
        }
        __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(d + g * RF_QROWS)));
        __m512 mv = q8 ? _mm512_setzero_ps() : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(m + g * RF_QROWS)));
        for (int bb = 0; bb < nb; bb++) {
            int64_t sg = (b0 + bb) * G + g;
            __m512i s = q8 ? _mm512_set1_epi32(-128 * isum[(b0 + bb) * 2 * G + g]) : _mm512_setzero_si512();
            __m512i t = q8 ? _mm512_set1_epi32(-128 * isum[(b0 + bb) * 2 * G + G + g]) : _mm512_setzero_si512();
            RF_DOT8(s, c, x1, bb);
            RF_DOT8(t, c, x2, bb);
            __m512 dot = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), inv254, _mm512_cvtepi32_ps(s));
            acc[bb] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dv, _mm512_set1_ps(sx[sg])), acc[bb]);
            if (!q8) acc[bb] = _mm512_fmadd_ps(mv, _mm512_set1_ps(sumx[sg]), acc[bb]);
        }
    }
    for (int bb = 0; bb < nb; bb++) _mm512_storeu_ps(out + bb * RF_QROWS, acc[bb]);
}
#undef RF_DOT8
#undef RF_XB

#define RF_AVX2 __attribute__((target("avx2,fma,f16c")))
#define RF_AVXVNNI __attribute__((target("avx2,fma,f16c,avxvnni")))

static int rf_cpu_has_avx2(void) {
    static int known = -1;
    if (known < 0) known = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
                           && __builtin_cpu_supports("f16c");
    return known;
}

static int rf_cpu_has_avxvnni(void) {
    static int known = -1;
    if (known < 0) known = rf_cpu_has_avx2() && __builtin_cpu_supports("avxvnni");
    return known;
}

/* the portable digits, compiled for AVX2 (rintf becomes vroundps) */
RF_AVX2 static void rf_quantize_row_avx2(const void *x, int bf16, int64_t K, int8_t *x1, int8_t *x2, float *sx,
                                         float *sumx, int32_t *isum) {
    rf_quantize_row_c(x, bf16, K, x1, x2, sx, sumx, isum);
}

/* s + the products of one digit's block (xw: its 8 words of 4 bytes) with a tile half's 8 weight vectors c, one
 * row per int32 lane */
RF_AVXVNNI static inline __m256i rf_dot8_avxvnni(__m256i s, const __m256i *c, const int32_t *xw) {
    __m256i u = _mm256_dpbusd_avx_epi32(s, c[0], _mm256_set1_epi32(xw[0]));
    __m256i v = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), c[1], _mm256_set1_epi32(xw[1]));
    for (int k = 2; k < 8; k += 2) {
        u = _mm256_dpbusd_avx_epi32(u, c[k], _mm256_set1_epi32(xw[k]));
        v = _mm256_dpbusd_avx_epi32(v, c[k + 1], _mm256_set1_epi32(xw[k + 1]));
    }
    return _mm256_add_epi32(u, v);
}

/* AVX2, Q4_1 (weights 0..15): eight vpmaddubsw summed in int16, |sum| <= 8 x 2 x 15 x 127 = 30480 */
RF_AVX2 static inline __m256i rf_dot8_avx2_q4(const __m256i *c, const int32_t *xw) {
    __m256i p = _mm256_maddubs_epi16(c[0], _mm256_set1_epi32(xw[0]));
    for (int k = 1; k < 8; k++) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(c[k], _mm256_set1_epi32(xw[k])));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* AVX2, Q8_0 (c: the signed weights, a = |c|): |w| is the unsigned operand and x takes w's sign, so a pair is at
 * most 2 x 128 x 127 = 32512 (x is clamped to -127..127: negating it cannot overflow) */
RF_AVX2 static inline __m256i rf_dot8_avx2_q8(const __m256i *a, const __m256i *c, const int32_t *xw) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++)
        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(a[k], _mm256_sign_epi8(_mm256_set1_epi32(xw[k]),
                                                                                             c[k])), ones));
    return s;
}

#define RF_SIGNED_avx2 1      /* Q8_0 weights back to signed for the sign trick */
#define RF_SIGNED_avxvnni 0   /* kept + 128: vpdpbusd's unsigned operand, the activations' sums undo it */
#define RF_DOTS_avxvnni(s, t) do {                                                                          \
        const int32_t *i_ = isum + (b0 + bb) * 2 * G + g;                                                    \
        s = rf_dot8_avxvnni(q8 ? _mm256_set1_epi32(-128 * i_[0]) : _mm256_setzero_si256(), c, w1);          \
        t = rf_dot8_avxvnni(q8 ? _mm256_set1_epi32(-128 * i_[G]) : _mm256_setzero_si256(), c, w2);          \
    } while (0)
#define RF_DOTS_avx2(s, t) do {                                                                             \
        if (q8) { s = rf_dot8_avx2_q8(a, c, w1); t = rf_dot8_avx2_q8(a, c, w2); }                           \
        else { s = rf_dot8_avx2_q4(c, w1); t = rf_dot8_avx2_q4(c, w2); }                                    \
    } while (0)

/* the tile on 256-bit vectors: rows 0-7 and 8-15 of each block are two halves (see the scalar tile) */
#define RF_DEFINE_TILE256(V, ATTR)                                                                          \
ATTR static void rf_quant_tile_##V(int q8, const uint8_t *w, const uint16_t *d, const uint16_t *m,          \
                                   const int8_t *x1, const int8_t *x2, const float *sx, const float *sumx,  \
                                   const int32_t *isum, int64_t b0, int nb, int64_t K, int64_t G,           \
                                   float *out) {                                                            \
    const __m256i low = _mm256_set1_epi8(0x0F), flip = _mm256_set1_epi8((char)0x80);                       \
    const __m256 inv254 = _mm256_set1_ps(1.f / 254.f);                                                      \
    __m256 acc[RF_QB][2];                                                                                   \
    for (int bb = 0; bb < nb; bb++) acc[bb][0] = acc[bb][1] = _mm256_setzero_ps();                         \
    for (int64_t g = 0; g < G; g++) {                                                                       \
        for (int i = 0; i < (q8 ? 8 : 4); i++)                                                              \
            _mm_prefetch((const char *)w + g * (q8 ? 512 : 256) + RF_Q_PREFETCH + 64 * i, _MM_HINT_T0);    \
        _mm_prefetch((const char *)(d + g * RF_QROWS) + RF_Q_PREFETCH / 8, _MM_HINT_T0);                   \
        if (!q8) _mm_prefetch((const char *)(m + g * RF_QROWS) + RF_Q_PREFETCH / 8, _MM_HINT_T0);          \
        for (int h = 0; h < 2; h++) {                                                                       \
            __m256i c[8], a[8];                                                                             \
            if (q8) {                                                                                       \
                for (int i = 0; i < 8; i++) {                                                               \
                    c[i] = _mm256_loadu_si256((const __m256i *)(w + g * 512 + 64 * i + 32 * h));           \
                    if (RF_SIGNED_##V) {                                                                    \
                        c[i] = _mm256_xor_si256(c[i], flip);                                                \
                        a[i] = _mm256_sign_epi8(c[i], c[i]);                                                \
                    }                                                                                       \
                }                                                                                           \
            } else {                                                                                        \
                for (int i = 0; i < 4; i++) {                                                               \
                    __m256i raw = _mm256_loadu_si256((const __m256i *)(w + g * 256 + 64 * i + 32 * h));    \
                    c[2 * i] = _mm256_and_si256(raw, low);                                                  \
                    c[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);                        \
                }                                                                                           \
            }                                                                                               \
            (void)a;                                                                                        \
            __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + g * RF_QROWS + 8 * h)));    \
            __m256 mv = q8 ? _mm256_setzero_ps()                                                            \
                           : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m + g * RF_QROWS + 8 * h))); \
            for (int bb = 0; bb < nb; bb++) {                                                               \
                int64_t sg = (b0 + bb) * G + g;                                                             \
                const int32_t *w1 = (const int32_t *)(x1 + (b0 + bb) * K + g * RF_QG);                     \
                const int32_t *w2 = (const int32_t *)(x2 + (b0 + bb) * K + g * RF_QG);                     \
                __m256i s, t;                                                                               \
                RF_DOTS_##V(s, t);                                                                          \
                __m256 dot = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), inv254, _mm256_cvtepi32_ps(s));        \
                acc[bb][h] = _mm256_fmadd_ps(dot, _mm256_mul_ps(dv, _mm256_set1_ps(sx[sg])), acc[bb][h]);  \
                if (!q8) acc[bb][h] = _mm256_fmadd_ps(mv, _mm256_set1_ps(sumx[sg]), acc[bb][h]);           \
            }                                                                                               \
        }                                                                                                   \
    }                                                                                                       \
    for (int bb = 0; bb < nb; bb++) {                                                                       \
        _mm256_storeu_ps(out + bb * RF_QROWS, acc[bb][0]);                                                  \
        _mm256_storeu_ps(out + bb * RF_QROWS + 8, acc[bb][1]);                                              \
    }                                                                                                       \
}

RF_DEFINE_TILE256(avx2, RF_AVX2)
RF_DEFINE_TILE256(avxvnni, RF_AVXVNNI)
#undef RF_DEFINE_TILE256
#undef RF_DOTS_avx2
#undef RF_DOTS_avxvnni
#undef RF_SIGNED_avx2
#undef RF_SIGNED_avxvnni
#endif   /* x86-64 */

#if defined(__GNUC__) && defined(__aarch64__) && !defined(__clang__)
#include <arm_neon.h>
#include <sys/auxv.h>
#define RF_NEON_TIERS 1
#define RF_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif

static int rf_cpu_has_dotprod(void) {
    static int known = -1;
    if (known < 0) known = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
    return known;
}

/* the 8 products of one digit's block (xa, xb: its 32 bytes) with a tile quarter's 8 weight vectors, one row per
 * int32 lane: sdot by element broadcasts the block's word k (lane k % 4 of xa or xb) */
#define RF_SDOT8(c, xa, xb) ({                                                                              \
        int32x4_t u_ = vdotq_laneq_s32(vdupq_n_s32(0), c[0], xa, 0);                                       \
        int32x4_t v_ = vdotq_laneq_s32(vdupq_n_s32(0), c[1], xa, 1);                                       \
        u_ = vdotq_laneq_s32(u_, c[2], xa, 2);                                                              \
        v_ = vdotq_laneq_s32(v_, c[3], xa, 3);                                                              \
        u_ = vdotq_laneq_s32(u_, c[4], xb, 0);                                                              \
        v_ = vdotq_laneq_s32(v_, c[5], xb, 1);                                                              \
        u_ = vdotq_laneq_s32(u_, c[6], xb, 2);                                                              \
        v_ = vdotq_laneq_s32(v_, c[7], xb, 3);                                                              \
        vaddq_s32(u_, v_);                                                                                  \
    })

/* the tile on 128-bit vectors: each block's 16 rows as four quarters of 4 rows (see the scalar tile); sdot is
 * signed x signed, so Q8_0's weights are taken back to signed (x ^ 0x80) and need no correction */
RF_DOTPROD static void rf_quant_tile_neon(int q8, const uint8_t *w, const uint16_t *d, const uint16_t *m,
                                          const int8_t *x1, const int8_t *x2, const float *sx, const float *sumx,
                                          const int32_t *isum, int64_t b0, int nb, int64_t K, int64_t G,
                                          float *out) {
    (void)isum;
    const uint8x16_t low = vdupq_n_u8(0x0F), flip = vdupq_n_u8(0x80);
    const float32x4_t inv254 = vdupq_n_f32(1.f / 254.f);
    float32x4_t acc[RF_QB][4];
    for (int bb = 0; bb < nb; bb++)
        for (int q = 0; q < 4; q++) acc[bb][q] = vdupq_n_f32(0.f);
    for (int64_t g = 0; g < G; g++) {
        for (int i = 0; i < (q8 ? 8 : 4); i++)
            __builtin_prefetch(w + g * (q8 ? 512 : 256) + RF_Q_PREFETCH + 64 * i);
        for (int q = 0; q < 4; q++) {
            int8x16_t c[8];
            if (q8) {
                for (int i = 0; i < 8; i++)
                    c[i] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(w + g * 512 + 64 * i + 16 * q), flip));
            } else {
                for (int i = 0; i < 4; i++) {
                    uint8x16_t raw = vld1q_u8(w + g * 256 + 64 * i + 16 * q);
                    c[2 * i] = vreinterpretq_s8_u8(vandq_u8(raw, low));
                    c[2 * i + 1] = vreinterpretq_s8_u8(vshrq_n_u8(raw, 4));
                }
            }
            float32x4_t dv = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(d + g * RF_QROWS + 4 * q)));
            float32x4_t mv = q8 ? vdupq_n_f32(0.f) : vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(m + g * RF_QROWS + 4 * q)));
            for (int bb = 0; bb < nb; bb++) {
                int64_t sg = (b0 + bb) * G + g;
                const int8_t *a1 = x1 + (b0 + bb) * K + g * RF_QG, *a2 = x2 + (b0 + bb) * K + g * RF_QG;
                int8x16_t xa = vld1q_s8(a1), xb = vld1q_s8(a1 + 16), ya = vld1q_s8(a2), yb = vld1q_s8(a2 + 16);
                int32x4_t s = RF_SDOT8(c, xa, xb), t = RF_SDOT8(c, ya, yb);
                float32x4_t dot = vfmaq_f32(vcvtq_f32_s32(s), vcvtq_f32_s32(t), inv254);
                acc[bb][q] = vfmaq_f32(acc[bb][q], dot, vmulq_n_f32(dv, sx[sg]));
                if (!q8) acc[bb][q] = vfmaq_n_f32(acc[bb][q], mv, sumx[sg]);
            }
        }
    }
    for (int bb = 0; bb < nb; bb++)
        for (int q = 0; q < 4; q++) vst1q_f32(out + bb * RF_QROWS + 4 * q, acc[bb][q]);
}
#undef RF_SDOT8
#endif   /* aarch64 */

typedef void (*rf_quant_tile_fn)(int, const uint8_t *, const uint16_t *, const uint16_t *, const int8_t *,
                                 const int8_t *, const float *, const float *, const int32_t *, int64_t, int,
                                 int64_t, int64_t, float *);

/* whether this CPU runs `tier` */
static int rf_quant_tier_ok(int tier) {
    switch (tier) {
    case RF_TIER_SCALAR: return 1;
#ifdef RF_X86_TIERS
    case RF_TIER_AVX2: return rf_cpu_has_avx2();
    case RF_TIER_AVXVNNI: return rf_cpu_has_avxvnni();
    case RF_TIER_AVX512VNNI: return rf_cpu_has_avx512vnni();
#endif
#ifdef RF_NEON_TIERS
    case RF_TIER_NEON: return rf_cpu_has_dotprod();
#endif
    default: return 0;
    }
}

/* y [B, N] (fp32 or bf16, + bias [N] fp32 when given) = x [B, K] (fp32 or bf16) W^T, W in tiles (see above);
 * q8: the Q8_0 layout (m unused), else Q4_1; on `tier`. Returns -1 when there is no memory for the activations'
 * digits, -2 when this CPU does not run the tier. */
static int rf_quant_linear(int tier, int q8, const uint8_t *w, const uint16_t *d, const uint16_t *m,
                           const float *bias, const void *x, int x_bf16, int64_t B, int64_t N, int64_t K, void *y,
                           int y_bf16) {
    if (tier < 0 || tier >= RF_TIERS || !rf_quant_tier_ok(tier)) return -2;
    rf_quant_tile_fn tile = rf_quant_tile_scalar;
    void (*quantize)(const void *, int, int64_t, int8_t *, int8_t *, float *, float *, int32_t *) = rf_quantize_row_c;
#ifdef RF_X86_TIERS
    if (tier == RF_TIER_AVX2 || tier == RF_TIER_AVXVNNI) {
        tile = tier == RF_TIER_AVX2 ? rf_quant_tile_avx2 : rf_quant_tile_avxvnni;
        quantize = rf_quantize_row_avx2;
    } else if (tier == RF_TIER_AVX512VNNI) {
        tile = rf_quant_tile_avx512;
        quantize = rf_quantize_row_avx512;
    }
#endif
#ifdef RF_NEON_TIERS
    if (tier == RF_TIER_NEON) tile = rf_quant_tile_neon;
#endif
    /* the digits: on the stack for a few rows (a decode step's), else from the heap */
    char local[16384] __attribute__((aligned(64)));
    int64_t need = rf_quant_work_bytes(B, K);
    void *work = need <= (int64_t)sizeof local ? (void *)local : malloc((size_t)need);
    if (!work) return -1;
    int64_t G = K / RF_QG, tiles = (N + RF_QROWS - 1) / RF_QROWS;
    int64_t tile_bytes = G * (q8 ? 512 : 256), scale_len = G * RF_QROWS;
    int64_t bytes = (B * K + 63) & ~(int64_t)63;
    int8_t *x1 = (int8_t *)work, *x2 = x1 + bytes;
    float *sx = (float *)(x2 + bytes);
    float *sumx = sx + B * G;
    int32_t *isum = (int32_t *)(sumx + B * G);
    for (int64_t b = 0; b < B; b++)
        quantize((const char *)x + b * K * (x_bf16 ? 2 : 4), x_bf16, K, x1 + b * K, x2 + b * K, sx + b * G,
                 sumx + b * G, isum + b * 2 * G);
    int parallel = N * K * B >= RF_Q_PARALLEL_MIN;
    #pragma omp parallel for schedule(static) if (parallel)
    for (int64_t t = 0; t < tiles; t++) {
        int rows = N - t * RF_QROWS < RF_QROWS ? (int)(N - t * RF_QROWS) : RF_QROWS;
        for (int64_t b0 = 0; b0 < B; b0 += RF_QB) {
            int nb = B - b0 < RF_QB ? (int)(B - b0) : RF_QB;
            float v[RF_QB * RF_QROWS] __attribute__((aligned(64)));
            tile(q8, w + t * tile_bytes, d + t * scale_len, q8 ? 0 : m + t * scale_len, x1, x2, sx, sumx, isum, b0,
                 nb, K, G, v);
            for (int bb = 0; bb < nb; bb++)
                rf_q_store(y, y_bf16, (b0 + bb) * N + t * RF_QROWS, v + bb * RF_QROWS, bias ? bias + t * RF_QROWS : 0,
                           rows);
        }
    }
    if (work != (void *)local) free(work);
    return 0;
}

#endif
