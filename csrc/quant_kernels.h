/* Quantized linears on GGUF's own block formats with integer dot products, the activations as two int8 digits
 * per value, per 32 inputs:
 *
 *   x ~ sx (x1 + x2 / 254),  x1 = round(x / sx), x2 = round((x - sx x1) 254 / sx),  sx = max |x| / 127
 *
 * (one digit, llama.cpp's Q8 activations, is off by up to sx / 2: 1-3 % per linear on SmolLM2's activations,
 * enough to part greedy texts within a few tokens; two are off by sx / 508, finer than bf16). Per block g of 32
 * inputs, a row's weights are integers q times a scale s, plus a min m where the format has one:
 *
 *   y[b, n] = sum_g s[n, g] sx[b, g] (q . x1 + q . x2 / 254) + m[n, g] sumx[b, g]
 *
 *   format  q            s                          m                  bits a weight (file / tiles)
 *   Q4_1    0..15        d                          m                  5 / 5       (Q4_0: m = -8 d)
 *   Q5_0    0..31 - 16   d                          -                  5.5 / 5.5
 *   Q5_1    0..31        d                          m                  6 / 6
 *   Q8_0    -128..127    d                          -                  8.5 / 8.5
 *   Q4_K    0..15        d sc[g]                    -dmin mn[g]        4.5 / 4.625 (sc, mn 6-bit; d, dmin a 256)
 *   Q5_K    0..31        d sc[g]                    -dmin mn[g]        5.5 / 5.625
 *   Q6_K    0..63 - 32   d sc[h] per 16 inputs      -                  6.5625 / 6.5625
 *
 * sumx is the group's exact sum. The K formats' products d sc and dmin mn (fp16 times an integer under 2^8) are
 * exact in fp32, so every format is served on the file's own numbers. At batch 1 the weights' bytes bound the
 * time; the second digit's products cost nothing there.
 *
 * Weights are re-laid out once at load in tiles of 16 output rows (rosefast/quant/tiles.py) so that
 * one int32 lane of an integer dot product accumulates one row's whole block: for tile t and block g,
 *   4-bit planes: 256 bytes, 4 chunks of 64; byte 4 j + b of chunk c holds row j's weight 8 c + b in its low
 *         nibble and 8 c + 4 + b in its high nibble (so the 8 nibble vectors k = 0..7 hold weights 4 k + b);
 *   then, for Q5_1/Q5_K one and for Q6_K two bit planes of 64 bytes: byte 4 j + b of plane p holds, in its bit
 *         k, bit 4 + p of row j's weight 4 k + b;
 *   Q8_0: 512 bytes, 8 chunks of 64; byte 4 j + b of chunk i holds row j's weight 4 i + b, plus 128 (so the
 *         weights are the unsigned operand of vpdpbusd; the activations' integer sums undo the shift; Q5_0's
 *         -16 and Q6_K's -32 are undone the same way, Q6_K's with the sums of each half block).
 * The scales per tile, 16 rows innermost: d, m fp16 [G, 16] (Q4_1, Q5_1; d alone for Q8_0, Q5_0); d, dmin fp16 [G / 8, 16] and
 * sc, mn uint8 [G, 16] (Q4_K, Q5_K); d fp16 [G / 8, 16] and sc int8 [2 G, 16] (Q6_K).
 * A block's result for 16 rows is then one vector (two on 256-bit ISAs): no horizontal sums, the scales loaded
 * as they lie.
 *
 * Tiers, one build for every CPU of an architecture (each compiled with target attributes, picked at run time
 * by the caller, rf_quant_tier_ok says which this CPU runs):
 *   RF_TIER_AMX         Sapphire Rapids and later: the AVX-512 VNNI tier below RF_AMX_MIN_ROWS_* activation
 *                       rows, Intel's tile unit in bf16 from there (the block's values, not the two digits: below)
 *   RF_TIER_AVX512VNNI  vpdpbusd on 512 bits (Ice Lake server and later, Zen 4+)
 *   RF_TIER_AVXVNNI     the VEX vpdpbusd on 256 bits (Alder Lake and later client chips, Sapphire Rapids, Zen 5)
 *   RF_TIER_AVX2        vpmaddubsw + vpmaddwd (Haswell and later, Zen 1-3); Q8_0 with the sign trick, since
 *                       u8 x s8 pairs of 0..255 weights overflow vpmaddubsw's int16; from RF_AVX2_MIN_ROWS
 *                       activation rows fp32 FMAs on the blocks' values (below)
 *   RF_TIER_NEON        sdot (aarch64 with the dot-product extension: Graviton 2+, Ampere, Apple M1+); where the CPU
 *                       has the int8 matrix multiply (Graviton 3+, Apple M2+) smmla for pairs of activation rows
 *   RF_TIER_SCALAR      portable C, the reference every other tier is tested against; any CPU
 * Every tier but AMX's tiles and AVX2's FMAs computes the same integers; the float sums may differ in order (and
 * the AVX-512 tier's digits saturate at -128 where the others clamp at -127: a difference of one in the second
 * digit, 1/254 of a step).
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
#define RF_Q_MANY 64      /* activation rows one rf_quant_many_avx2 call takes (its accumulators: 4 KB) */
#define RF_Q_MANY_MIN 4   /* (from this many rows the AVX2 tier's integer path takes it) */
#define RF_Q_PARALLEL_MIN 65536   /* below this many weights x rows a call stays on one thread */
#ifndef RF_Q_PREFETCH
#define RF_Q_PREFETCH 4096   /* bytes ahead in the weights' stream */
#endif

/* the tiers, in rosefast/kernels/_quant_ops_c.pyx's TIERS order */
enum { RF_TIER_SCALAR = 0, RF_TIER_AVX2 = 1, RF_TIER_AVXVNNI = 2, RF_TIER_AVX512VNNI = 3, RF_TIER_NEON = 4,
       RF_TIER_AMX = 5, RF_TIERS = 6 };

/* the weights' formats (rosefast/quant/tiles.py's FORMATS order) */
enum { RF_FMT_Q4_1 = 0, RF_FMT_Q8_0 = 1, RF_FMT_Q5_1 = 2, RF_FMT_Q4_K = 3, RF_FMT_Q5_K = 4, RF_FMT_Q6_K = 5,
       RF_FMT_Q5_0 = 6, RF_FMTS = 7 };
#define RF_QPARTS 8       /* formats one linear may mix (a fused q|k|v of three types) */

/* one linear's part: `n` output rows in one format, the tiles and scales as quant_tiles lays them out */
typedef struct {
    int fmt;
    int64_t n;
    const uint8_t *w;
    const uint16_t *d, *m;     /* fp16: scale and min (per block), or d and dmin (per 256 inputs, K formats) */
    const uint8_t *sc, *mn;    /* K formats: uint8 scale and min per block; Q6_K: int8 scale per 16 inputs */
} rf_qweights;

/* the activations' digits and sums, made once a call for every part */
typedef struct {
    const int8_t *x1, *x2;
    const float *sx, *sumx;    /* [B, G] */
    const int32_t *isum;       /* [B, 2, G]: the sums of x1 and of x2 per group */
    const int32_t *ihalf;      /* [B, 2, G]: the same over each group's first 16 inputs (Q6_K) */
    int64_t K, G;
} rf_qacts;

static inline int rf_q_planes(int fmt) {
    return fmt == RF_FMT_Q6_K ? 2 : (fmt == RF_FMT_Q5_1 || fmt == RF_FMT_Q5_K || fmt == RF_FMT_Q5_0) ? 1 : 0;
}
static inline int rf_q_block_bytes(int fmt) {
    return fmt == RF_FMT_Q8_0 ? 512 : fmt == RF_FMT_Q6_K ? 384 : rf_q_planes(fmt) ? 320 : 256;
}
static inline int rf_q_kformat(int fmt) { return fmt == RF_FMT_Q4_K || fmt == RF_FMT_Q5_K || fmt == RF_FMT_Q6_K; }
static inline int rf_q_has_min(int fmt) { return fmt != RF_FMT_Q8_0 && fmt != RF_FMT_Q6_K && fmt != RF_FMT_Q5_0; }
/* what the stored (unsigned) integers are above the weights' own: undone by the activations' integer sums */
static inline int rf_q_offset(int fmt) { return fmt == RF_FMT_Q8_0 ? 128 : fmt == RF_FMT_Q6_K ? 32 : fmt == RF_FMT_Q5_0 ? 16 : 0; }

/* `q`'s tile t (of a layer with G blocks a row) */
static inline rf_qweights rf_q_tile_of(const rf_qweights *q, int64_t t, int64_t G) {
    rf_qweights r = *q;
    int64_t per = rf_q_kformat(q->fmt) ? G / 8 : G;
    r.w = q->w + t * G * rf_q_block_bytes(q->fmt);
    r.d = q->d + t * per * RF_QROWS;
    if (q->m) r.m = q->m + t * per * RF_QROWS;
    if (q->sc) r.sc = q->sc + t * G * RF_QROWS * (q->fmt == RF_FMT_Q6_K ? 2 : 1);
    if (q->mn) r.mn = q->mn + t * G * RF_QROWS;
    return r;
}

/* work unit u of a linear whose parts' tiles run one after another (first[p]: part p's first tile): its tile's
 * weights, its part, its tile within the part and how many of the tile's 16 rows are the part's */
static inline rf_qweights rf_q_unit(const rf_qweights *parts, const int64_t *first, int64_t u, int64_t G, int *part,
                                    int64_t *tile, int *rows) {
    int p = 0;
    while (u >= first[p + 1]) p++;
    int64_t t = u - first[p], n = parts[p].n;
    *part = p;
    *tile = t;
    *rows = n - t * RF_QROWS < RF_QROWS ? (int)(n - t * RF_QROWS) : RF_QROWS;
    return rf_q_tile_of(&parts[p], t, G);
}

/* A SIMD tile's body is compiled once for each format and activation row count (1 .. RF_QB): with both known only
 * at run time the compiler kept its accumulators in memory (a store and a reload in each block's chain). CALL(f, n)
 * runs the body for the format and rows given at run time. */
#define RF_BY_FORMAT(fmt, CALL, n) do {                                                                  \
        switch (fmt) {                                                                                   \
        case RF_FMT_Q4_1: CALL(RF_FMT_Q4_1, n); break;                                                   \
        case RF_FMT_Q8_0: CALL(RF_FMT_Q8_0, n); break;                                                   \
        case RF_FMT_Q5_1: CALL(RF_FMT_Q5_1, n); break;                                                   \
        case RF_FMT_Q4_K: CALL(RF_FMT_Q4_K, n); break;                                                   \
        case RF_FMT_Q5_K: CALL(RF_FMT_Q5_K, n); break;                                                   \
        case RF_FMT_Q6_K: CALL(RF_FMT_Q6_K, n); break;                                                   \
        default: CALL(RF_FMT_Q5_0, n); break;                                                            \
        }                                                                                                \
    } while (0)
#define RF_BY_SHAPE(fmt, nb, CALL) do {                                                                  \
        switch (nb) {                                                                                    \
        case 1: RF_BY_FORMAT(fmt, CALL, 1); break;                                                       \
        case 2: RF_BY_FORMAT(fmt, CALL, 2); break;                                                       \
        case 3: RF_BY_FORMAT(fmt, CALL, 3); break;                                                       \
        default: RF_BY_FORMAT(fmt, CALL, 4); break;                                                      \
        }                                                                                                \
    } while (0)

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

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
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
                                    float *sumx, int32_t *isum, int32_t *ihalf) {
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
            if (h == 0) {
                ihalf[g] = _mm512_reduce_add_epi32(s1);
                ihalf[G + g] = _mm512_reduce_add_epi32(s2);
            }
        }
        isum[g] = _mm512_reduce_add_epi32(s1);
        isum[G + g] = _mm512_reduce_add_epi32(s2);
    }
}

#define RF_XB(xs, bb, i) _mm512_set1_epi32(((const int32_t *)(xs + (b0 + (bb)) * K + g * RF_QG))[i])

/* acc + the 4 products of weight vectors w[o .. o + 3] with words o .. o + 3 of one digit of an activation row */
#define RF_DOT4(acc, w, xs, bb, o) do {                                                                     \
        __m512i u_ = _mm512_dpbusd_epi32(acc, w[o], RF_XB(xs, bb, o));                                     \
        __m512i v_ = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[o + 1], RF_XB(xs, bb, o + 1));         \
        u_ = _mm512_dpbusd_epi32(u_, w[o + 2], RF_XB(xs, bb, o + 2));                                     \
        v_ = _mm512_dpbusd_epi32(v_, w[o + 3], RF_XB(xs, bb, o + 3));                                     \
        acc = _mm512_add_epi32(u_, v_);                                                                     \
    } while (0)

/* the 8 products of a block's 8 weight vectors (lo/hi nibbles, or 8 bytes) with one digit of an activation row */
#define RF_DOT8(acc, w, xs, bb) do {                                                                        \
        __m512i h_ = _mm512_setzero_si512();                                                                \
        RF_DOT4(acc, w, xs, bb, 0);                                                                         \
        RF_DOT4(h_, w, xs, bb, 4);                                                                          \
        acc = _mm512_add_epi32(acc, h_);                                                                    \
    } while (0)

/* a block's weight vectors c[k] (weights 4 k + b of each row): nibbles, then the bit planes OR'ed in above them
 * (plane p's byte holds bit 4 + p of weight 4 k + b in its bit k: shifted down k, then up to bit 4 + p) */
RF_VNNI static inline void rf_q_load_avx512(int fmt, const uint8_t *blk, __m512i *c) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    if (fmt == RF_FMT_Q8_0) {
        for (int i = 0; i < 8; i++) c[i] = _mm512_loadu_si512((const void *)(blk + 64 * i));
        return;
    }
    for (int i = 0; i < 4; i++) {
        __m512i raw = _mm512_loadu_si512((const void *)(blk + 64 * i));
        c[2 * i] = _mm512_and_si512(raw, low);
        c[2 * i + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
    }
    int planes = rf_q_planes(fmt);
    for (int p = 0; p < planes; p++) {
        __m512i cur = _mm512_loadu_si512((const void *)(blk + 256 + 64 * p));
        const __m512i bit = _mm512_set1_epi8((char)(0x10 << p));
        for (int k = 0; k < 8; k++) {
            __m512i up = p ? _mm512_slli_epi16(cur, 5) : _mm512_slli_epi16(cur, 4);
            c[k] = _mm512_or_si512(c[k], _mm512_and_si512(up, bit));
            cur = _mm512_srli_epi16(cur, 1);
        }
    }
}

/* a block's scales for 16 rows: over its first and second 16 inputs (equal but for Q6_K), and its min */
RF_VNNI static inline void rf_q_scales_avx512(const rf_qweights *q, int64_t g, __m512 *sa, __m512 *sb, __m512 *mv) {
    int fmt = q->fmt;
    if (!rf_q_kformat(fmt)) {
        *sa = *sb = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(q->d + g * RF_QROWS)));
        *mv = rf_q_has_min(fmt) ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(q->m + g * RF_QROWS))) : _mm512_setzero_ps();
        return;
    }
    __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(q->d + (g / 8) * RF_QROWS)));
    if (fmt == RF_FMT_Q6_K) {
        const __m128i *s = (const __m128i *)(q->sc + 2 * g * RF_QROWS);
        *sa = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(s))));
        *sb = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(s + 1))));
        *mv = _mm512_setzero_ps();
        return;
    }
    *sa = *sb = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q->sc + g * RF_QROWS)))));
    __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(q->m + (g / 8) * RF_QROWS)));
    *mv = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
        _mm_loadu_si128((const __m128i *)(q->mn + g * RF_QROWS))))));
}

/* one tile of rows against activation rows b0 .. b0 + nb (nb <= RF_QB) -> out [nb, 16] (see the scalar tile);
 * the stored offsets (rf_q_offset) undone by the activations' integer sums */
RF_VNNI static inline __attribute__((always_inline)) void rf_quant_tile_avx512_n(const rf_qweights *q,
                                                                               const rf_qacts *a, int64_t b0, int nb,
                                                                               float *out, int fmt) {
    __m512 acc[RF_QB];
    const int bytes = rf_q_block_bytes(fmt), q6 = fmt == RF_FMT_Q6_K, off = rf_q_offset(fmt);
    const int has_min = rf_q_has_min(fmt), per_block = !rf_q_kformat(fmt);
    const int8_t *x1 = a->x1, *x2 = a->x2;
    const int64_t K = a->K, G = a->G;
    const __m512 inv254 = _mm512_set1_ps(1.f / 254.f);
    for (int bb = 0; bb < nb; bb++) acc[bb] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        __m512i c[8];
        __m512 sa, sb, mv;
        /* the hardware's prefetch alone left the weights' stream at ~60 % of the machine's read bandwidth */
        for (int i = 0; i < bytes / 64; i++)
            _mm_prefetch((const char *)q->w + g * bytes + RF_Q_PREFETCH + 64 * i, _MM_HINT_T0);
        if (per_block) {
            _mm_prefetch((const char *)(q->d + g * RF_QROWS) + RF_Q_PREFETCH / 8, _MM_HINT_T0);
            if (has_min) _mm_prefetch((const char *)(q->m + g * RF_QROWS) + RF_Q_PREFETCH / 8, _MM_HINT_T0);
        } else {
            _mm_prefetch((const char *)(q->sc + g * RF_QROWS * (q6 ? 2 : 1)) + RF_Q_PREFETCH / 8, _MM_HINT_T0);
        }
        rf_q_load_avx512(fmt, q->w + g * bytes, c);
        rf_q_scales_avx512(q, g, &sa, &sb, &mv);
        for (int bb = 0; bb < nb; bb++) {
            int64_t sg = (b0 + bb) * G + g;
            const int32_t *is = a->isum + (b0 + bb) * 2 * G + g, *ih = a->ihalf + (b0 + bb) * 2 * G + g;
            __m512 sxv = _mm512_set1_ps(a->sx[sg]);
            if (q6) {
                __m512i s0 = _mm512_set1_epi32(-32 * ih[0]), s1 = _mm512_set1_epi32(-32 * (is[0] - ih[0]));
                __m512i t0 = _mm512_set1_epi32(-32 * ih[G]), t1 = _mm512_set1_epi32(-32 * (is[G] - ih[G]));
                RF_DOT4(s0, c, x1, bb, 0);
                RF_DOT4(s1, c, x1, bb, 4);
                RF_DOT4(t0, c, x2, bb, 0);
                RF_DOT4(t1, c, x2, bb, 4);
                __m512 d0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t0), inv254, _mm512_cvtepi32_ps(s0));
                __m512 d1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t1), inv254, _mm512_cvtepi32_ps(s1));
                acc[bb] = _mm512_fmadd_ps(d0, _mm512_mul_ps(sa, sxv), acc[bb]);
                acc[bb] = _mm512_fmadd_ps(d1, _mm512_mul_ps(sb, sxv), acc[bb]);
                continue;
            }
            __m512i s = _mm512_set1_epi32(-off * is[0]), t = _mm512_set1_epi32(-off * is[G]);
            RF_DOT8(s, c, x1, bb);
            RF_DOT8(t, c, x2, bb);
            __m512 dot = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), inv254, _mm512_cvtepi32_ps(s));
            acc[bb] = _mm512_fmadd_ps(dot, _mm512_mul_ps(sa, sxv), acc[bb]);
            if (has_min) acc[bb] = _mm512_fmadd_ps(mv, _mm512_set1_ps(a->sumx[sg]), acc[bb]);
        }
    }
    for (int bb = 0; bb < nb; bb++) _mm512_storeu_ps(out + bb * RF_QROWS, acc[bb]);
}
RF_VNNI static void rf_quant_tile_avx512(const rf_qweights *q, const rf_qacts *a, int64_t b0, int nb, float *out) {
#define RF_TILE512(f, n) rf_quant_tile_avx512_n(q, a, b0, n, out, f)
    RF_BY_SHAPE(q->fmt, nb, RF_TILE512);
#undef RF_TILE512
}
#undef RF_DOT8
#undef RF_DOT4
#undef RF_XB

/* two adjacent tiles of one part at once (any format but Q6_K): each activation word is broadcast once for
 * both tiles' vpdpbusd (a broadcast per product held this CPU's vpdpbusd rate to ~2/3 of its peak) */
RF_VNNI static inline __attribute__((always_inline)) void rf_quant_tile2_avx512_n(const rf_qweights *q0,
                                                                                const rf_qweights *q1,
                                                                                const rf_qacts *a, int64_t b0, int nb,
                                                                                float *out0, float *out1, int fmt) {
    __m512 acc0[RF_QB], acc1[RF_QB];
    const int bytes = rf_q_block_bytes(fmt), off = rf_q_offset(fmt), has_min = rf_q_has_min(fmt);
    const int64_t K = a->K, G = a->G;
    const __m512 inv254 = _mm512_set1_ps(1.f / 254.f);
    for (int bb = 0; bb < nb; bb++) acc0[bb] = acc1[bb] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        __m512i c0[8], c1[8];
        __m512 sa0, sb0, mv0, sa1, sb1, mv1;
        for (int i = 0; i < bytes / 64; i++) {
            _mm_prefetch((const char *)q0->w + g * bytes + RF_Q_PREFETCH + 64 * i, _MM_HINT_T0);
            _mm_prefetch((const char *)q1->w + g * bytes + RF_Q_PREFETCH + 64 * i, _MM_HINT_T0);
        }
        rf_q_load_avx512(fmt, q0->w + g * bytes, c0);
        rf_q_load_avx512(fmt, q1->w + g * bytes, c1);
        rf_q_scales_avx512(q0, g, &sa0, &sb0, &mv0);
        rf_q_scales_avx512(q1, g, &sa1, &sb1, &mv1);
        (void)sb0;
        (void)sb1;
        for (int bb = 0; bb < nb; bb++) {
            int64_t sg = (b0 + bb) * G + g;
            const int32_t *is = a->isum + (b0 + bb) * 2 * G + g;
            const int32_t *w1 = (const int32_t *)(a->x1 + (b0 + bb) * K + g * RF_QG);
            const int32_t *w2 = (const int32_t *)(a->x2 + (b0 + bb) * K + g * RF_QG);
            __m512i s0 = _mm512_set1_epi32(-off * is[0]), s1 = s0, t0 = _mm512_set1_epi32(-off * is[G]), t1 = t0;
            __m512i u0 = _mm512_setzero_si512(), u1 = u0, v0 = u0, v1 = u0;
            for (int k = 0; k < 8; k += 2) {
                __m512i xa = _mm512_set1_epi32(w1[k]), xb = _mm512_set1_epi32(w1[k + 1]);
                __m512i ya = _mm512_set1_epi32(w2[k]), yb = _mm512_set1_epi32(w2[k + 1]);
                s0 = _mm512_dpbusd_epi32(s0, c0[k], xa);
                s1 = _mm512_dpbusd_epi32(s1, c1[k], xa);
                u0 = _mm512_dpbusd_epi32(u0, c0[k + 1], xb);
                u1 = _mm512_dpbusd_epi32(u1, c1[k + 1], xb);
                t0 = _mm512_dpbusd_epi32(t0, c0[k], ya);
                t1 = _mm512_dpbusd_epi32(t1, c1[k], ya);
                v0 = _mm512_dpbusd_epi32(v0, c0[k + 1], yb);
                v1 = _mm512_dpbusd_epi32(v1, c1[k + 1], yb);
            }
            s0 = _mm512_add_epi32(s0, u0);
            s1 = _mm512_add_epi32(s1, u1);
            t0 = _mm512_add_epi32(t0, v0);
            t1 = _mm512_add_epi32(t1, v1);
            __m512 sxv = _mm512_set1_ps(a->sx[sg]);
            __m512 d0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t0), inv254, _mm512_cvtepi32_ps(s0));
            __m512 d1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t1), inv254, _mm512_cvtepi32_ps(s1));
            acc0[bb] = _mm512_fmadd_ps(d0, _mm512_mul_ps(sa0, sxv), acc0[bb]);
            acc1[bb] = _mm512_fmadd_ps(d1, _mm512_mul_ps(sa1, sxv), acc1[bb]);
            if (has_min) {
                __m512 sum = _mm512_set1_ps(a->sumx[sg]);
                acc0[bb] = _mm512_fmadd_ps(mv0, sum, acc0[bb]);
                acc1[bb] = _mm512_fmadd_ps(mv1, sum, acc1[bb]);
            }
        }
    }
    for (int bb = 0; bb < nb; bb++) {
        _mm512_storeu_ps(out0 + bb * RF_QROWS, acc0[bb]);
        _mm512_storeu_ps(out1 + bb * RF_QROWS, acc1[bb]);
    }
}
RF_VNNI static void rf_quant_tile2_avx512(const rf_qweights *q0, const rf_qweights *q1, const rf_qacts *a, int64_t b0,
                                          int nb, float *out0, float *out1) {
#define RF_TILE512(f, n) rf_quant_tile2_avx512_n(q0, q1, a, b0, n, out0, out1, f)
    RF_BY_SHAPE(q0->fmt, nb, RF_TILE512);
#undef RF_TILE512
}

#define RF_AVX2 __attribute__((target("avx2,fma,f16c")))
#define RF_AVXVNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
/* the 256-bit tiers' helpers are inlined with their counts as constants (RF_DOTS_*): as out-of-line loops over
 * run-time counts they reloaded the weight vectors from memory and took one product an iteration (a Q4_1 linear
 * at 8 and 32 rows took 1.28x as long on a Zen 4, one thread) */
#define RF_INLINE256 static inline __attribute__((always_inline))

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
                                         float *sumx, int32_t *isum, int32_t *ihalf) {
    rf_quantize_row_c(x, bf16, K, x1, x2, sx, sumx, isum, ihalf);
}

/* s + the products of weight vectors c[0 .. n) (one tile half's) with one digit's words xw[0 .. n), one row per
 * int32 lane */
RF_AVXVNNI RF_INLINE256 __m256i rf_dot_avxvnni(__m256i s, const __m256i *c, const int32_t *xw, int n) {
    __m256i v = _mm256_setzero_si256();
    for (int k = 0; k < n; k += 2) {
        s = _mm256_dpbusd_avx_epi32(s, c[k], _mm256_set1_epi32(xw[k]));
        v = _mm256_dpbusd_avx_epi32(v, c[k + 1], _mm256_set1_epi32(xw[k + 1]));
    }
    return _mm256_add_epi32(s, v);
}

/* AVX2, unsigned weights under 2^bits: vpmaddubsw products summed in int16 `per` at a time before vpmaddwd,
 * so no sum passes 32767: a pair is at most 2 x 15 x 127 = 3810 (4 bits, 8 summed: 30480), 7874 (5 bits, 4:
 * 31496), 16002 (6 bits, 2: 32004) */
RF_AVX2 RF_INLINE256 __m256i rf_dot_avx2_u(__m256i s, const __m256i *c, const int32_t *xw, int n, int per) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int k0 = 0; k0 < n; k0 += per) {
        __m256i p = _mm256_maddubs_epi16(c[k0], _mm256_set1_epi32(xw[k0]));
        for (int k = k0 + 1; k < k0 + per; k++) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(c[k], _mm256_set1_epi32(xw[k])));
        s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
    }
    return s;
}

/* AVX2, Q8_0 (c: the signed weights): |w| is the unsigned operand and x takes w's sign, so a pair is at most
 * 2 x 128 x 127 = 32512 (x is clamped to -127..127: negating it cannot overflow); both digits in one pass, |w|
 * made per vector (kept for all eight beside c, the sixteen vectors spilled to the stack) */
RF_AVX2 RF_INLINE256 void rf_dot8_avx2_q8(const __m256i *c, const int32_t *w1, const int32_t *w2, __m256i *s,
                                          __m256i *t) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s_ = _mm256_setzero_si256(), t_ = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) {
        __m256i a = _mm256_sign_epi8(c[k], c[k]);
        s_ = _mm256_add_epi32(s_, _mm256_madd_epi16(_mm256_maddubs_epi16(a, _mm256_sign_epi8(
            _mm256_set1_epi32(w1[k]), c[k])), ones));
        t_ = _mm256_add_epi32(t_, _mm256_madd_epi16(_mm256_maddubs_epi16(a, _mm256_sign_epi8(
            _mm256_set1_epi32(w2[k]), c[k])), ones));
    }
    *s = s_;
    *t = t_;
}

/* a tile half's (rows 8 h .. 8 h + 7) weight vectors of a block, as rf_q_load_avx512's */
RF_AVX2 RF_INLINE256 void rf_q_load_avx2(int fmt, const uint8_t *blk, int h, __m256i *c) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    if (fmt == RF_FMT_Q8_0) {
        for (int i = 0; i < 8; i++) c[i] = _mm256_loadu_si256((const __m256i *)(blk + 64 * i + 32 * h));
        return;
    }
    for (int i = 0; i < 4; i++) {
        __m256i raw = _mm256_loadu_si256((const __m256i *)(blk + 64 * i + 32 * h));
        c[2 * i] = _mm256_and_si256(raw, low);
        c[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
    }
    int planes = rf_q_planes(fmt);
    for (int p = 0; p < planes; p++) {
        __m256i cur = _mm256_loadu_si256((const __m256i *)(blk + 256 + 64 * p + 32 * h));
        const __m256i bit = _mm256_set1_epi8((char)(0x10 << p));
        for (int k = 0; k < 8; k++) {
            __m256i up = p ? _mm256_slli_epi16(cur, 5) : _mm256_slli_epi16(cur, 4);
            c[k] = _mm256_or_si256(c[k], _mm256_and_si256(up, bit));
            cur = _mm256_srli_epi16(cur, 1);
        }
    }
}

RF_AVX2 RF_INLINE256 __m256 rf_q_half8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
RF_AVX2 RF_INLINE256 __m256 rf_q_u8x8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
RF_AVX2 RF_INLINE256 __m256 rf_q_i8x8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* a tile half's scales for a block, as rf_q_scales_avx512's */
RF_AVX2 RF_INLINE256 void rf_q_scales_avx2(const rf_qweights *q, int64_t g, int h, __m256 *sa, __m256 *sb, __m256 *mv) {
    int fmt = q->fmt, r = 8 * h;
    if (!rf_q_kformat(fmt)) {
        *sa = *sb = rf_q_half8(q->d + g * RF_QROWS + r);
        *mv = rf_q_has_min(fmt) ? rf_q_half8(q->m + g * RF_QROWS + r) : _mm256_setzero_ps();
        return;
    }
    __m256 d = rf_q_half8(q->d + (g / 8) * RF_QROWS + r);
    if (fmt == RF_FMT_Q6_K) {
        *sa = _mm256_mul_ps(d, rf_q_i8x8(q->sc + 2 * g * RF_QROWS + r));
        *sb = _mm256_mul_ps(d, rf_q_i8x8(q->sc + (2 * g + 1) * RF_QROWS + r));
        *mv = _mm256_setzero_ps();
        return;
    }
    *sa = *sb = _mm256_mul_ps(d, rf_q_u8x8(q->sc + g * RF_QROWS + r));
    *mv = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(rf_q_half8(q->m + (g / 8) * RF_QROWS + r),
                                                           rf_q_u8x8(q->mn + g * RF_QROWS + r)));
}

#define RF_SIGNED_avx2 1      /* Q8_0 weights back to signed for the sign trick */
#define RF_SIGNED_avxvnni 0   /* kept + 128: vpdpbusd's unsigned operand, the activations' sums undo it */
/* s, t: a digit's products over weight vectors o .. o + n, started from s0, t0 */
#define RF_DOTS_avxvnni(s, t, s0, t0, o, n) do {                                                            \
        s = rf_dot_avxvnni(s0, c + o, w1 + o, n);                                                           \
        t = rf_dot_avxvnni(t0, c + o, w2 + o, n);                                                           \
    } while (0)
#define RF_DOTS_U(s, t, s0, t0, o, n, per_) do {                                                           \
        s = rf_dot_avx2_u(s0, c + o, w1 + o, n, per_);                                                      \
        t = rf_dot_avx2_u(t0, c + o, w2 + o, n, per_);                                                      \
    } while (0)
#define RF_DOTS_avx2(s, t, s0, t0, o, n) do {                                                               \
        if (q8) rf_dot8_avx2_q8(c, w1, w2, &s, &t);                                                        \
        else if (per == 8) RF_DOTS_U(s, t, s0, t0, o, n, 8);                                                \
        else if (per == 4) RF_DOTS_U(s, t, s0, t0, o, n, 4);                                                \
        else RF_DOTS_U(s, t, s0, t0, o, n, 2);                                                              \
    } while (0)

/* the tile on 256-bit vectors: rows 0-7 and 8-15 of each block are two halves (see the scalar tile); its body for
 * each format and row count (RF_BY_SHAPE: as one function, one Q4_1 row took 1.66x as long) */
#define RF_DEFINE_TILE256(V, ATTR)                                                                          \
/* one activation row's products with a tile half's block (c: its weight vectors; sa, sb, mv: its scales) added to  \
 * acc: the tiles below share it, so every row count computes the same numbers */                                  \
ATTR RF_INLINE256 __m256 rf_q_row_##V(__m256 acc, const __m256i *c, const rf_qacts *a, int64_t b, int64_t g,       \
                                      __m256 sa, __m256 sb, __m256 mv, int fmt) {                                  \
    const __m256 inv254 = _mm256_set1_ps(1.f / 254.f);                                                      \
    const int q6 = fmt == RF_FMT_Q6_K, q8 = fmt == RF_FMT_Q8_0;                                             \
    const int has_min = rf_q_has_min(fmt), per = 8 >> rf_q_planes(fmt);                                     \
    const int64_t K = a->K, G = a->G, sg = b * G + g;                                                       \
    const int32_t *w1 = (const int32_t *)(a->x1 + b * K + g * RF_QG);                                       \
    const int32_t *w2 = (const int32_t *)(a->x2 + b * K + g * RF_QG);                                       \
    const int32_t *is = a->isum + b * 2 * G + g, *ih = a->ihalf + b * 2 * G + g;                            \
    __m256 sxv = _mm256_set1_ps(a->sx[sg]);                                                                 \
    __m256i s, t;                                                                                           \
    (void)per;                                                                                              \
    if (q6) {                                                                                               \
        __m256i s1, t1;                                                                                     \
        RF_DOTS_##V(s, t, _mm256_set1_epi32(-32 * ih[0]), _mm256_set1_epi32(-32 * ih[G]), 0, 4);            \
        RF_DOTS_##V(s1, t1, _mm256_set1_epi32(-32 * (is[0] - ih[0])),                                       \
                    _mm256_set1_epi32(-32 * (is[G] - ih[G])), 4, 4);                                        \
        __m256 d0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), inv254, _mm256_cvtepi32_ps(s));                 \
        __m256 d1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t1), inv254, _mm256_cvtepi32_ps(s1));               \
        acc = _mm256_fmadd_ps(d0, _mm256_mul_ps(sa, sxv), acc);                                             \
        return _mm256_fmadd_ps(d1, _mm256_mul_ps(sb, sxv), acc);                                            \
    }                                                                                                       \
    const int o_ = q8 && RF_SIGNED_##V ? 0 : rf_q_offset(fmt);                                              \
    __m256i s0 = _mm256_set1_epi32(-o_ * is[0]), t0 = _mm256_set1_epi32(-o_ * is[G]);                       \
    RF_DOTS_##V(s, t, s0, t0, 0, 8);                                                                        \
    __m256 dot = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), inv254, _mm256_cvtepi32_ps(s));                    \
    acc = _mm256_fmadd_ps(dot, _mm256_mul_ps(sa, sxv), acc);                                                \
    if (has_min) acc = _mm256_fmadd_ps(mv, _mm256_set1_ps(a->sumx[sg]), acc);                               \
    return acc;                                                                                             \
}                                                                                                           \
/* a tile half's weight vectors of block g and its scales */                                                \
ATTR RF_INLINE256 void rf_q_half_##V(const rf_qweights *q, int64_t g, int h, __m256i *c, __m256 *sa, __m256 *sb,  \
                                     __m256 *mv, int fmt) {                                                 \
    rf_q_load_avx2(fmt, q->w + g * rf_q_block_bytes(fmt), h, c);                                            \
    if (fmt == RF_FMT_Q8_0 && RF_SIGNED_##V)                                                                \
        for (int i = 0; i < 8; i++) c[i] = _mm256_xor_si256(c[i], _mm256_set1_epi8((char)0x80));            \
    rf_q_scales_avx2(q, g, h, sa, sb, mv);                                                                  \
}                                                                                                           \
ATTR RF_INLINE256 void rf_quant_tile_##V##_n(const rf_qweights *q, const rf_qacts *a, int64_t b0, int nb,    \
                                           float *out, int fmt) {                                           \
    const int bytes = rf_q_block_bytes(fmt);                                                                \
    __m256 acc[RF_QB][2];                                                                                   \
    for (int bb = 0; bb < nb; bb++) acc[bb][0] = acc[bb][1] = _mm256_setzero_ps();                         \
    for (int64_t g = 0; g < a->G; g++) {                                                                    \
        for (int i = 0; i < bytes / 64; i++)                                                                \
            _mm_prefetch((const char *)q->w + g * bytes + RF_Q_PREFETCH + 64 * i, _MM_HINT_T0);            \
        _Pragma("GCC unroll 2")   /* the halves unrolled: acc[bb][h] in registers */                        \
        for (int h = 0; h < 2; h++) {                                                                       \
            __m256i c[8];                                                                                   \
            __m256 sa, sb, mv;                                                                              \
            rf_q_half_##V(q, g, h, c, &sa, &sb, &mv, fmt);                                                  \
            _Pragma("GCC unroll 4")                                                                         \
            for (int bb = 0; bb < nb; bb++)                                                                 \
                acc[bb][h] = rf_q_row_##V(acc[bb][h], c, a, b0 + bb, g, sa, sb, mv, fmt);                  \
        }                                                                                                   \
    }                                                                                                       \
    for (int bb = 0; bb < nb; bb++) {                                                                       \
        _mm256_storeu_ps(out + bb * RF_QROWS, acc[bb][0]);                                                  \
        _mm256_storeu_ps(out + bb * RF_QROWS + 8, acc[bb][1]);                                              \
    }                                                                                                       \
}                                                                                                           \
ATTR static void rf_quant_tile_##V(const rf_qweights *q, const rf_qacts *a, int64_t b0, int nb, float *out) { \
    RF_BY_SHAPE(q->fmt, nb, RF_TILE256_##V);                                                                \
}

#define RF_TILE256_avx2(f, n) rf_quant_tile_avx2_n(q, a, b0, n, out, f)
#define RF_TILE256_avxvnni(f, n) rf_quant_tile_avxvnni_n(q, a, b0, n, out, f)
RF_DEFINE_TILE256(avx2, RF_AVX2)
RF_DEFINE_TILE256(avxvnni, RF_AVXVNNI)
#undef RF_DEFINE_TILE256
#undef RF_TILE256_avx2
#undef RF_TILE256_avxvnni
#undef RF_DOTS_avx2
#undef RF_DOTS_U
#undef RF_DOTS_avxvnni
#undef RF_SIGNED_avx2
#undef RF_SIGNED_avxvnni

/* The AVX2 tier's integer path from RF_Q_MANY_MIN rows (below its FMAs, or where a step's sequences keep it): the
 * same numbers as its tile (rf_q_row_avx2 for each row), but a block half's weights unpacked once for up to RF_Q_MANY
 * rows and each row's accumulators in memory, where the tile unpacks them once per RF_QB rows and keeps them with 8
 * accumulators in the 16 registers: a 3072x576 Q4_1 linear at 4, 5, 7 rows (2 threads) 88, 113, 156 against 97, 125,
 * 173 us; 4-6-bit formats 1.05-1.2x; level at 3 rows. Q8_0 stays on the tile, whose |w| (the sign trick) serves 4
 * rows. */
RF_AVX2 RF_INLINE256 void rf_quant_many_avx2_f(const rf_qweights *q, const rf_qacts *a, int64_t b0, int nb, float *out,
                                               int fmt) {
    const int bytes = rf_q_block_bytes(fmt);
    for (int i = 0; i < nb * RF_QROWS; i++) out[i] = 0.f;
    for (int64_t g = 0; g < a->G; g++) {
        for (int i = 0; i < bytes / 64; i++)
            _mm_prefetch((const char *)q->w + g * bytes + RF_Q_PREFETCH + 64 * i, _MM_HINT_T0);
        for (int h = 0; h < 2; h++) {
            __m256i c[8];
            __m256 sa, sb, mv;
            rf_q_half_avx2(q, g, h, c, &sa, &sb, &mv, fmt);
            for (int bb = 0; bb < nb; bb++) {
                float *o = out + bb * RF_QROWS + 8 * h;
                _mm256_storeu_ps(o, rf_q_row_avx2(_mm256_loadu_ps(o), c, a, b0 + bb, g, sa, sb, mv, fmt));
            }
        }
    }
}
#define RF_MANY_avx2(f, n) rf_quant_many_avx2_f(q, a, b0, nb, out, f)
RF_AVX2 static void rf_quant_many_avx2(const rf_qweights *q, const rf_qacts *a, int64_t b0, int nb, float *out) {
    RF_BY_FORMAT(q->fmt, RF_MANY_avx2, 0);
}
#undef RF_MANY_avx2

/* The AVX2 tier's float path: from RF_AVX2_MIN_ROWS activation rows (a decode step of many sequences, speculation's
 * verification, a prefill) the products are fp32 FMAs on the weights' values, not the two int8 digits. On AVX2 an
 * integer product of a digit costs three instructions (vpmaddubsw, its int16 sums, vpmaddwd: 32 products of one row
 * in ~6.5 operations with the scaling), so the two digits make ~5 products an operation where an FMA makes 8. Per
 * tile of 16 output rows, its blocks are made once a call into their values (s q + m in fp32, as the scalar
 * reference computes them: v [K][16], 36 KB at K = 576) and every activation row passes over them 4 at a time (8
 * accumulators of 8 outputs: 8 FMAs to 2 weight loads and 4 broadcasts an input; 6 rows' 12 accumulators were
 * spilled). bf16 activations are widened to fp32 first. Its numbers are the weights' exact values times the
 * activations, summed in fp32: closer to the exact sums than the two digits', and other last bits (about 1e-6 of the
 * sum of |w x|), so which rows a step holds decides the path, as on the AMX tier. */
#define RF_AVX2_MIN_ROWS 8   /* from here the FMAs are level or faster (SmolLM2's shapes, 2 threads) */
#define RF_AVX2_PASS 4      /* activation rows a pass over a tile's values takes */

/* block g of tile q -> v [32 inputs][16 rows] fp32: the weights' values */
RF_AVX2 static inline void rf_q_values_avx2(const rf_qweights *q, int64_t g, float *v) {
    const int fmt = q->fmt, offset = rf_q_offset(fmt);
    const __m256i byte = _mm256_set1_epi32(0xFF), off = _mm256_set1_epi32(offset);
    for (int h = 0; h < 2; h++) {
        __m256i c[8];
        __m256 sa, sb, mv;
        /* c[k]: byte b of row j's lane is its weight 4 k + b */
        rf_q_load_avx2(fmt, q->w + g * rf_q_block_bytes(fmt), h, c);
        rf_q_scales_avx2(q, g, h, &sa, &sb, &mv);
        for (int k = 0; k < 8; k++) {
            __m256 s = k < 4 ? sa : sb;
            for (int b = 0; b < 4; b++) {
                __m256i e = _mm256_and_si256(_mm256_srli_epi32(c[k], 8 * b), byte);
                if (offset) e = _mm256_sub_epi32(e, off);
                _mm256_store_ps(v + (4 * k + b) * RF_QROWS + 8 * h, _mm256_fmadd_ps(_mm256_cvtepi32_ps(e), s, mv));
            }
        }
    }
}

/* nr (<= RF_AVX2_PASS) rows of x [.., K] fp32 times a tile's values v [K][16] -> out [nr][16] */
RF_AVX2 RF_INLINE256 void rf_fma_pass_avx2(const float *x, int64_t K, const float *v, int nr, float *out) {
    __m256 acc[RF_AVX2_PASS][2];
    for (int r = 0; r < nr; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t i = 0; i < K; i++) {
        __m256 w0 = _mm256_load_ps(v + i * RF_QROWS), w1 = _mm256_load_ps(v + i * RF_QROWS + 8);
        for (int r = 0; r < nr; r++) {
            __m256 xb = _mm256_broadcast_ss(x + r * K + i);
            acc[r][0] = _mm256_fmadd_ps(xb, w0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(xb, w1, acc[r][1]);
        }
    }
    for (int r = 0; r < nr; r++) {
        _mm256_storeu_ps(out + r * RF_QROWS, acc[r][0]);
        _mm256_storeu_ps(out + r * RF_QROWS + 8, acc[r][1]);
    }
}

/* one tile's 16 output rows (c0 .. c0 + rows of y's N columns) for every activation row; v: K x 16 floats */
RF_AVX2 static void rf_quant_tile_fma(const rf_qweights *q, const float *x, int64_t B, int64_t K, void *y, int y_bf16,
                                      int64_t N, int64_t c0, int rows, const float *bias, float *v) {
    float out[RF_AVX2_PASS * RF_QROWS] __attribute__((aligned(32)));
    for (int64_t g = 0; g < K / RF_QG; g++) rf_q_values_avx2(q, g, v + g * RF_QG * RF_QROWS);
    for (int64_t r0 = 0; r0 < B; r0 += RF_AVX2_PASS) {
        int nr = B - r0 < RF_AVX2_PASS ? (int)(B - r0) : RF_AVX2_PASS;
        switch (nr) {   /* a count the compiler knows: the accumulators stay in registers */
        case 4: rf_fma_pass_avx2(x + r0 * K, K, v, 4, out); break;
        case 3: rf_fma_pass_avx2(x + r0 * K, K, v, 3, out); break;
        case 2: rf_fma_pass_avx2(x + r0 * K, K, v, 2, out); break;
        default: rf_fma_pass_avx2(x + r0 * K, K, v, 1, out); break;
        }
        for (int r = 0; r < nr; r++)
            rf_q_store(y, y_bf16, (r0 + r) * N + c0, out + r * RF_QROWS, bias ? bias + c0 : 0, rows);
    }
}

/* rf_quant_linear's AVX2 float path (its parts laid out as there: first[p] the part's first tile, col[p] its first
 * column of N). Returns -1 when there is no memory for the widened activations or a thread's tile values. */
RF_AVX2 static int rf_quant_linear_fma(const rf_qweights *parts, int nparts, const int64_t *first, const int64_t *col,
                                       const float *bias, const void *x, int x_bf16, int64_t B, int64_t K, void *y,
                                       int y_bf16, int64_t N) {
    int64_t G = K / RF_QG, tiles = first[nparts];
    float *xf = (float *)x;
    if (x_bf16) {
        if (!(xf = (float *)malloc((size_t)(B * K) * 4))) return -1;
        const uint16_t *xb = (const uint16_t *)x;
        for (int64_t i = 0; i < B * K; i += 8)   /* K is a multiple of 32 */
            _mm256_storeu_ps(xf + i, _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(xb + i))), 16)));
    }
    int failed = 0;
    #pragma omp parallel if (tiles * RF_QROWS * K * B >= RF_Q_PARALLEL_MIN)
    {
        float *v = (float *)aligned_alloc(64, (size_t)(K * RF_QROWS) * 4);
        if (!v) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(static)
        for (int64_t u = 0; u < tiles; u++) {
            int p, rows;
            int64_t t;
            rf_qweights tw = rf_q_unit(parts, first, u, G, &p, &t, &rows);
            if (v) rf_quant_tile_fma(&tw, xf, B, K, y, y_bf16, N, col[p] + t * RF_QROWS, rows, bias, v);
        }
        free(v);
    }
    if (x_bf16) free(xf);
    return failed ? -1 : 0;
}

/* The AMX tier (Intel Sapphire Rapids and later: AMX-TILE, AMX-BF16): the AVX-512 VNNI tier's kernels for up to
 * RF_AMX_MIN_ROWS_* - 1 activation rows (a decode step of a few sequences: there the weights' bytes bound the time),
 * and from there the tile unit's bf16 dot products (tdpbf16ps: 16 x 16 x 32 products in one instruction). The
 * per-block scales of the formats would make every block's integer products leave the tiles to be scaled (the cost
 * of AVX-512's own products: an int8 AMX path measured no faster), so here each block of 16 rows x 32 inputs is
 * made into its weights' values once, s q + m in fp32 as the scalar reference computes them, written as two bf16
 * planes (hi: the value cut to bf16, lo: what is left, to bf16: 16 significant bits in all, finer than the file's
 * fp16 scales) in the tile's pair layout (one dword: two consecutive inputs of one row), and the products of a
 * tile's whole row accumulate in the tiles' fp32. bf16 activations go in as they are; fp32 ones as hi + lo too
 * (all four products of hi and lo). More exact than the two int8 digits, but other numbers: a row's outputs on this
 * path differ from the VNNI path's in the last bits (about 1e-6 of the sum of |w x|), so which rows a step holds
 * decides which path computes them. */
#define RF_AMX_MIN_ROWS_BF16 12   /* from here the tiles are faster (SmolLM2's shapes, 2 threads: 1.16x at 12 rows) */
#define RF_AMX_MIN_ROWS_F32 14    /* (fp32 activations: four products, 1.05x at 14 rows) */
#define RF_AMX_CHUNK 64   /* activation rows a pass over a tile's blocks takes: four 16-row accumulator tiles */
#define RF_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c")))

static int rf_cpu_has_amx(void) {
    static int known = -1;
    if (known < 0) {
        unsigned a = 0, b = 0, c = 0, d = 0;
        int ok = rf_cpu_has_avx512vnni() && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1) && (d >> 24 & 1);
        /* Linux gives the tiles' 8 KB of register state only to a process that asks for it (once, for every thread) */
        if (ok) ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
        known = ok;
    }
    return known;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} rf_amx_config;

/* tiles 0-3: fp32 accumulators of 16 activation rows x 16 outputs; 4, 5: activations (16 rows x 32 bf16); 6, 7:
 * a block's weights, hi and lo (16 input pairs x 16 rows) */
RF_AMX static void rf_amx_start(void) {
    rf_amx_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.rows[i] = 16;
        cfg.colsb[i] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* block g of tile q (16 rows x 32 inputs) -> hi, lo [16 pairs][16 rows] dwords: pair r of row j holds inputs 2 r and
 * 2 r + 1 (low, high half) as bf16 */
RF_AMX static inline void rf_q_pairs_amx(const rf_qweights *q, int64_t g, uint32_t *hi, uint32_t *lo) {
    __m512i c[8];
    __m512 sa, sb, mv;
    const int fmt = q->fmt;
    rf_q_load_avx512(fmt, q->w + g * rf_q_block_bytes(fmt), c);
    rf_q_scales_avx512(q, g, &sa, &sb, &mv);
    const int offset = rf_q_offset(fmt);
    const __m512i top = _mm512_set1_epi32((int)0xFFFF0000u), off = _mm512_set1_epi32(offset);
    const __mmask32 low_words = 0x55555555u;
    __m512i byte[4];   /* vpshufb controls: byte b of each dword, zero-extended */
    for (int b = 0; b < 4; b++)
        byte[b] = _mm512_set4_epi32((int)(0x80808000u | (12 + b)), (int)(0x80808000u | (8 + b)),
                                    (int)(0x80808000u | (4 + b)), (int)(0x80808000u | b));
    for (int k = 0; k < 8; k++) {   /* c[k]: bytes b of row j's lane are its weights 4 k + b */
        __m512 s = k < 4 ? sa : sb, f[4];
        for (int b = 0; b < 4; b++) {
            __m512i e = _mm512_shuffle_epi8(c[k], byte[b]);
            if (offset) e = _mm512_sub_epi32(e, off);
            f[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(e), s, mv);
        }
        for (int h = 0; h < 2; h++) {   /* pair 2 k + h: weights 4 k + 2 h and 4 k + 2 h + 1 */
            __m512 f0 = f[2 * h], f1 = f[2 * h + 1];
            __m512i h0 = _mm512_and_si512(_mm512_castps_si512(f0), top);
            __m512i h1 = _mm512_and_si512(_mm512_castps_si512(f1), top);
            __m512i l0 = _mm512_castps_si512(_mm512_sub_ps(f0, _mm512_castsi512_ps(h0)));
            __m512i l1 = _mm512_castps_si512(_mm512_sub_ps(f1, _mm512_castsi512_ps(h1)));
            _mm512_store_si512((void *)(hi + (2 * k + h) * 16),
                               _mm512_mask_blend_epi16(low_words, h1, _mm512_srli_epi32(h0, 16)));
            _mm512_store_si512((void *)(lo + (2 * k + h) * 16),
                               _mm512_mask_blend_epi16(low_words, l1, _mm512_srli_epi32(l0, 16)));
        }
    }
}

/* v's 16 floats rounded to bf16 (nearest even), one to a dword's low half */
RF_AMX static inline __m512i rf_amx_bf16(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i even = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    return _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), even)), 16);
}

/* x [B, K] (fp32 or bf16) -> hi [Bp, K] bf16 (Bp: B up to a multiple of 16, the rows past B zero) and, for fp32,
 * lo: x - hi to bf16 (both rounded to nearest even) */
RF_AMX static void rf_amx_activations(const void *x, int x_bf16, int64_t B, int64_t K, uint16_t *hi, uint16_t *lo) {
    int64_t Bp = (B + 15) & ~(int64_t)15;
    memset(hi + B * K, 0, (size_t)((Bp - B) * K) * 2);
    if (x_bf16) {
        memcpy(hi, x, (size_t)(B * K) * 2);
        return;
    }
    memset(lo + B * K, 0, (size_t)((Bp - B) * K) * 2);
    for (int64_t i = 0; i < B * K; i += 16) {   /* K is a multiple of 32 */
        __m512 v = _mm512_loadu_ps((const float *)x + i);
        __m512i h = rf_amx_bf16(v);
        __m512i l = rf_amx_bf16(_mm512_sub_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16))));
        _mm256_storeu_si256((__m256i *)(hi + i), _mm512_cvtepi32_epi16(h));
        _mm256_storeu_si256((__m256i *)(lo + i), _mm512_cvtepi32_epi16(l));
    }
}

/* one tile's 16 output rows (c0 .. c0 + rows of y's N columns) for every activation row, on the tiles. `pairs`
 * [G][2][256]: where the tile's blocks are made once for every pass when there are several (more than
 * RF_AMX_CHUNK rows: a prompt's prefill), else NULL (each block made as the one pass reaches it) */
RF_AMX static void rf_quant_tile_amx(const rf_qweights *q, const uint16_t *ahi, const uint16_t *alo, int64_t B,
                                     int64_t K, void *y, int y_bf16, int64_t N, int64_t c0, int rows, const float *bias,
                                     uint32_t *pairs) {
    const int64_t G = K / RF_QG, Bp = (B + 15) & ~(int64_t)15;
    uint32_t wb[2][2][256] __attribute__((aligned(64)));   /* two blocks' hi and lo, in turn */
    float out[256] __attribute__((aligned(64)));
    if (pairs)
        for (int64_t g = 0; g < G; g++) rf_q_pairs_amx(q, g, pairs + g * 512, pairs + g * 512 + 256);
    for (int64_t r0 = 0; r0 < Bp; r0 += RF_AMX_CHUNK) {
        int groups = (Bp - r0) / 16 < RF_AMX_CHUNK / 16 ? (int)((Bp - r0) / 16) : RF_AMX_CHUNK / 16;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t g = 0; g < G; g++) {
            uint32_t *hi = pairs ? pairs + g * 512 : wb[g & 1][0], *lo = hi + 256;
            if (!pairs) {
                lo = wb[g & 1][1];
                rf_q_pairs_amx(q, g, hi, lo);
            }
            _tile_loadd(6, hi, 64);
            _tile_loadd(7, lo, 64);
            const uint16_t *a = ahi + r0 * K + g * RF_QG, *l = alo ? alo + r0 * K + g * RF_QG : 0;
            /* bf16 activations: groups take tiles 4 and 5 in turn; fp32 ones: 4 holds hi, 5 lo */
#define RF_AMX_GROUP(i, A)                                                                                   \
            if (groups > i) {                                                                                \
                if (l) {                                                                                     \
                    _tile_loadd(4, a + (i) * 16 * K, K * 2);                                                 \
                    _tile_loadd(5, l + (i) * 16 * K, K * 2);                                                 \
                    _tile_dpbf16ps(i, 4, 6);                                                                 \
                    _tile_dpbf16ps(i, 4, 7);                                                                 \
                    _tile_dpbf16ps(i, 5, 6);                                                                 \
                    _tile_dpbf16ps(i, 5, 7);                                                                 \
                } else {                                                                                     \
                    _tile_loadd(A, a + (i) * 16 * K, K * 2);                                                 \
                    _tile_dpbf16ps(i, A, 6);                                                                 \
                    _tile_dpbf16ps(i, A, 7);                                                                 \
                }                                                                                            \
            }
            RF_AMX_GROUP(0, 4)
            RF_AMX_GROUP(1, 5)
            RF_AMX_GROUP(2, 4)
            RF_AMX_GROUP(3, 5)
#undef RF_AMX_GROUP
        }
#define RF_AMX_STORE(i)                                                                                      \
        if (groups > i) {                                                                                    \
            _tile_stored(i, out, 64);                                                                        \
            for (int m = 0; m < 16 && r0 + (i) * 16 + m < B; m++)                                            \
                rf_q_store(y, y_bf16, (r0 + (i) * 16 + m) * N + c0, out + 16 * m, bias ? bias + c0 : 0, rows); \
        }
        RF_AMX_STORE(0)
        RF_AMX_STORE(1)
        RF_AMX_STORE(2)
        RF_AMX_STORE(3)
#undef RF_AMX_STORE
    }
}

/* rf_quant_linear's AMX path for B >= RF_AMX_MIN_ROWS_* (its parts laid out as there: first[p] the part's first
 * tile, col[p] its first column of N). Returns -1 when there is no memory for the activations' planes or, past
 * RF_AMX_CHUNK rows, a thread's made blocks. */
RF_AMX static int rf_quant_linear_amx(const rf_qweights *parts, int nparts, const int64_t *first, const int64_t *col,
                                      const float *bias, const void *x, int x_bf16, int64_t B, int64_t K, void *y,
                                      int y_bf16, int64_t N) {
    int64_t Bp = (B + 15) & ~(int64_t)15, G = K / RF_QG, tiles = first[nparts];
    uint16_t *ahi = (uint16_t *)aligned_alloc(64, (size_t)(Bp * K) * 2 * (x_bf16 ? 1 : 2));
    if (!ahi) return -1;
    uint16_t *alo = x_bf16 ? 0 : ahi + Bp * K;
    rf_amx_activations(x, x_bf16, B, K, ahi, alo);
    int failed = 0;
    #pragma omp parallel
    {
        uint32_t *pairs = 0;
        if (B > RF_AMX_CHUNK && !(pairs = (uint32_t *)aligned_alloc(64, (size_t)G * 2048))) {
            #pragma omp atomic write
            failed = 1;
        }
        rf_amx_start();
        #pragma omp for schedule(static)
        for (int64_t u = 0; u < tiles; u++) {
            int p, rows;
            int64_t t;
            rf_qweights tw = rf_q_unit(parts, first, u, G, &p, &t, &rows);
            if (B <= RF_AMX_CHUNK || pairs)
                rf_quant_tile_amx(&tw, ahi, alo, B, K, y, y_bf16, N, col[p] + t * RF_QROWS, rows, bias, pairs);
        }
        _tile_release();
        free(pairs);
    }
    free(ahi);
    return failed ? -1 : 0;
}
#endif   /* x86-64 */

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
#endif   /* aarch64 */

typedef void (*rf_quant_tile_fn)(const rf_qweights *, const rf_qacts *, int64_t, int, float *);

/* whether this CPU runs `tier` */
static int rf_quant_tier_ok(int tier) {
    switch (tier) {
    case RF_TIER_SCALAR: return 1;
#ifdef RF_X86_TIERS
    case RF_TIER_AVX2: return rf_cpu_has_avx2();
    case RF_TIER_AVXVNNI: return rf_cpu_has_avxvnni();
    case RF_TIER_AVX512VNNI: return rf_cpu_has_avx512vnni();
    case RF_TIER_AMX: return rf_cpu_has_amx();
#endif
#ifdef RF_NEON_TIERS
    case RF_TIER_NEON: return rf_cpu_has_dotprod();
#endif
    default: return 0;
    }
}

/* the activation rows from which `tier` computes with numbers of its own, not the two digits' (the AMX tier's bf16
 * tiles: outputs that differ in their last bits), for fp32 or bf16 activations; 0: never */
static int rf_quant_own_rows(int tier, int x_bf16) {
#ifdef RF_X86_TIERS
    if (tier == RF_TIER_AMX) return x_bf16 ? RF_AMX_MIN_ROWS_BF16 : RF_AMX_MIN_ROWS_F32;
    if (tier == RF_TIER_AVX2) return RF_AVX2_MIN_ROWS;
#endif
    (void)tier;
    (void)x_bf16;
    return 0;
}

/* y [B, N] (fp32 or bf16, + bias [N] fp32 when given) = x [B, K] (fp32 or bf16) W^T, W's rows given as `nparts`
 * parts one after another (N = their rows; each in its own format, tiles as above: a fused q|k|v whose q, k and v
 * are of three types), on `tier`; the activations' digits are made once for all parts. `path_rows` (0: B) is the
 * row count that picks the tier's path where it has two (the AMX tier: its VNNI kernels or the tiles): a
 * speculative step's rows computed as its sequences' decode step would compute them. Returns -1 when there is no
 * memory for the digits, -2 when this CPU does not run the tier, -3 when the parts do not fit (a K format needs
 * K % 256 == 0; at most RF_QPARTS parts). */
static int rf_quant_linear_rows(int tier, const rf_qweights *parts, int nparts, const float *bias, const void *x,
                                int x_bf16, int64_t B, int64_t K, void *y, int y_bf16, int64_t path_rows) {
    if (tier < 0 || tier >= RF_TIERS || !rf_quant_tier_ok(tier)) return -2;
    if (nparts < 1 || nparts > RF_QPARTS || K % RF_QG) return -3;
    int64_t G = K / RF_QG, first[RF_QPARTS + 1], col[RF_QPARTS], N = 0;
    first[0] = 0;
    for (int p = 0; p < nparts; p++) {
        int fmt = parts[p].fmt;
        if (fmt < 0 || fmt >= RF_FMTS || parts[p].n < 0 || (rf_q_kformat(fmt) && G % 8)) return -3;
        col[p] = N;
        N += parts[p].n;
        first[p + 1] = first[p] + (parts[p].n + RF_QROWS - 1) / RF_QROWS;
    }
#ifdef RF_X86_TIERS
    /* a tier with a path of its own (rf_quant_own_rows) takes it from its row count */
    int own = rf_quant_own_rows(tier, x_bf16);
    if (own && (path_rows > 0 ? path_rows : B) >= own)
        return (tier == RF_TIER_AMX ? rf_quant_linear_amx : rf_quant_linear_fma)(parts, nparts, first, col, bias, x,
                                                                                 x_bf16, B, K, y, y_bf16, N);
    if (tier == RF_TIER_AMX) tier = RF_TIER_AVX512VNNI;   /* below its tiles: the VNNI kernels */
#endif
    rf_quant_tile_fn tile = rf_quant_tile_scalar;
    void (*quantize)(const void *, int, int64_t, int8_t *, int8_t *, float *, float *, int32_t *, int32_t *) =
        rf_quantize_row_c;
#ifdef RF_X86_TIERS
    int many = 0;   /* the AVX2 tier's tile of many rows (rf_quant_many_avx2), for its formats but Q8_0 */
    if (tier == RF_TIER_AVX2 || tier == RF_TIER_AVXVNNI) {
        tile = tier == RF_TIER_AVX2 ? rf_quant_tile_avx2 : rf_quant_tile_avxvnni;
        many = tier == RF_TIER_AVX2 && B >= RF_Q_MANY_MIN;
        quantize = rf_quantize_row_avx2;
    } else if (tier == RF_TIER_AVX512VNNI) {
        tile = rf_quant_tile_avx512;
        quantize = rf_quantize_row_avx512;
    }
#endif
#ifdef RF_NEON_TIERS
    if (tier == RF_TIER_NEON) tile = rf_cpu_has_i8mm() ? rf_quant_tile_neon_i8mm : rf_quant_tile_neon;
#endif
    /* the digits: on the stack for a few rows (a decode step's), else from the heap */
    char local[16384] __attribute__((aligned(64)));
    int64_t need = rf_quant_work_bytes(B, K);
    void *work = need <= (int64_t)sizeof local ? (void *)local : malloc((size_t)need);
    if (!work) return -1;
    int64_t bytes = (B * K + 63) & ~(int64_t)63;
    rf_qacts acts;
    int8_t *x1 = (int8_t *)work, *x2 = x1 + bytes;
    float *sx = (float *)(x2 + bytes);
    float *sumx = sx + B * G;
    int32_t *isum = (int32_t *)(sumx + B * G), *ihalf = isum + B * 2 * G;
    for (int64_t b = 0; b < B; b++)
        quantize((const char *)x + b * K * (x_bf16 ? 2 : 4), x_bf16, K, x1 + b * K, x2 + b * K, sx + b * G,
                 sumx + b * G, isum + b * 2 * G, ihalf + b * 2 * G);
    acts.x1 = x1;
    acts.x2 = x2;
    acts.sx = sx;
    acts.sumx = sumx;
    acts.isum = isum;
    acts.ihalf = ihalf;
    acts.K = K;
    acts.G = G;
    int parallel = N * K * B >= RF_Q_PARALLEL_MIN;
    /* work units: tiles, or on the AVX-512 tier with several activation rows pairs of a part's tiles */
    int64_t unit_first[RF_QPARTS + 1], per[RF_QPARTS];
    unit_first[0] = 0;
    for (int p = 0; p < nparts; p++) {
        per[p] = 1;
#ifdef RF_X86_TIERS
        if (tier == RF_TIER_AVX512VNNI && B >= 2 && parts[p].fmt != RF_FMT_Q6_K) per[p] = 2;
#endif
        unit_first[p + 1] = unit_first[p] + (first[p + 1] - first[p] + per[p] - 1) / per[p];
    }
    int64_t units = unit_first[nparts];
    #pragma omp parallel for schedule(static) if (parallel)
    for (int64_t uu = 0; uu < units; uu++) {
        int p = 0;
        while (uu >= unit_first[p + 1]) p++;
        int64_t t = (uu - unit_first[p]) * per[p], n = parts[p].n, count = first[p + 1] - first[p];
        int pair = per[p] == 2 && t + 1 < count;
        rf_qweights tw = rf_q_tile_of(&parts[p], t, G), tw2 = pair ? rf_q_tile_of(&parts[p], t + 1, G) : tw;
#ifdef RF_X86_TIERS
        if (many && parts[p].fmt != RF_FMT_Q8_0) {
            float v[RF_Q_MANY * RF_QROWS] __attribute__((aligned(64)));
            int64_t c0 = col[p] + t * RF_QROWS;
            int rows = n - t * RF_QROWS < RF_QROWS ? (int)(n - t * RF_QROWS) : RF_QROWS;
            for (int64_t b0 = 0; b0 < B; b0 += RF_Q_MANY) {
                int nb = B - b0 < RF_Q_MANY ? (int)(B - b0) : RF_Q_MANY;
                rf_quant_many_avx2(&tw, &acts, b0, nb, v);
                for (int bb = 0; bb < nb; bb++)
                    rf_q_store(y, y_bf16, (b0 + bb) * N + c0, v + bb * RF_QROWS, bias ? bias + c0 : 0, rows);
            }
            continue;
        }
#endif
        for (int64_t b0 = 0; b0 < B; b0 += RF_QB) {
            int nb = B - b0 < RF_QB ? (int)(B - b0) : RF_QB;
            float v[2][RF_QB * RF_QROWS] __attribute__((aligned(64)));
#ifdef RF_X86_TIERS
            if (pair)
                rf_quant_tile2_avx512(&tw, &tw2, &acts, b0, nb, v[0], v[1]);
            else
#endif
                tile(&tw, &acts, b0, nb, v[0]);
            for (int j = 0; j <= pair; j++) {
                int64_t tj = t + j, c0 = col[p] + tj * RF_QROWS;
                int rows = n - tj * RF_QROWS < RF_QROWS ? (int)(n - tj * RF_QROWS) : RF_QROWS;
                for (int bb = 0; bb < nb; bb++)
                    rf_q_store(y, y_bf16, (b0 + bb) * N + c0, v[j] + bb * RF_QROWS, bias ? bias + c0 : 0, rows);
            }
        }
    }
    if (work != (void *)local) free(work);
    return 0;
}

/* rf_quant_linear_rows with the path picked by B itself */
static int rf_quant_linear(int tier, const rf_qweights *parts, int nparts, const float *bias, const void *x,
                           int x_bf16, int64_t B, int64_t K, void *y, int y_bf16) {
    return rf_quant_linear_rows(tier, parts, nparts, bias, x, x_bf16, B, K, y, y_bf16, 0);
}

/* rows `ids` [n] of one part's weight -> out [n, K] (fp32 or bf16): the weight's own numbers, as the format's
 * dequantization computes them (s q + m in fp32, s = d or d sc): a tied model's embedding looked up in its head's
 * blocks. Returns -3 when an id is out of the part's rows. */
static int rf_quant_rows(const rf_qweights *q, const int64_t *ids, int64_t n, int64_t K, void *out, int out_bf16) {
    int64_t G = K / RF_QG, bytes = rf_q_block_bytes(q->fmt);
    for (int64_t r = 0; r < n; r++)
        if (ids[r] < 0 || ids[r] >= q->n) return -3;
    #pragma omp parallel for schedule(static) if (n * K >= RF_Q_PARALLEL_MIN)
    for (int64_t r = 0; r < n; r++) {
        int64_t t = ids[r] / RF_QROWS;
        int j = (int)(ids[r] % RF_QROWS);
        rf_qweights tw = rf_q_tile_of(q, t, G);
        for (int64_t g = 0; g < G; g++) {
            int16_t w[RF_QG];
            float v[RF_QG], sa, sb, mj;
            rf_q_weights_c(q->fmt, tw.w + g * bytes, j, w);
            rf_q_scales_c(&tw, g, j, &sa, &sb, &mj);
            for (int i = 0; i < RF_QG; i++) v[i] = (float)w[i] * (i < RF_QG / 2 ? sa : sb) + mj;
            rf_q_store(out, out_bf16, r * K + g * RF_QG, v, 0, RF_QG);
        }
    }
    return 0;
}

#endif
