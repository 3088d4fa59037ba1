/* Quantized linears on GGUF's own block formats with integer dot products (AVX-512 VNNI's vpdpbusd, 64 byte
 * products an instruction), the activations as two int8 digits per value, per 32 inputs:
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
 * one int32 lane of a vpdpbusd accumulates one row's whole block: for tile t and block g,
 *   Q4_1: 256 bytes, 4 chunks of 64; byte 4 j + b of chunk c holds row j's weight 8 c + b in its low nibble
 *         and 8 c + 4 + b in its high nibble; d and m fp16 [tiles, G, 16].
 *   Q8_0: 512 bytes, 8 chunks of 64; byte 4 j + b of chunk i holds row j's weight 4 i + b, plus 128 (so the
 *         weights are the instruction's unsigned operand; the activations' integer sum undoes the shift).
 * A block's result for 16 rows is then one vector: no horizontal sums, the scales loaded as they lie.
 * Rows (tiles) are split over OpenMP threads (torch's libgomp pool). The caller checks the CPU
 * (rf_quant_cpu_ok) and takes torch's weight-only ops where these cannot run. */
#ifndef ROSEFAST_QUANT_KERNELS_H
#define ROSEFAST_QUANT_KERNELS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RF_QG 32          /* inputs per block */
#define RF_QROWS 16       /* output rows per tile */
#define RF_QB 4           /* activation rows sharing one unpacking of a tile's block */
#define RF_Q_PARALLEL_MIN 65536
#ifndef RF_Q_PREFETCH
#define RF_Q_PREFETCH 4096   /* bytes ahead in the weights' stream */
#endif   /* below this many weights x rows a call stays on one thread */

static int64_t rf_quant_work_bytes(int64_t B, int64_t K) {
    return 2 * ((B * K + 63) & ~(int64_t)63) + 4 * B * (K / RF_QG) * 4;
}

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#include <immintrin.h>
#define RF_HAVE_QUANT_KERNELS 1
#define RF_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c")))

static int rf_quant_cpu_ok(void) {
    static int known = -1;
    if (known < 0) known = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
                           && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")
                           && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("f16c");
    return known;
}

static inline float rf_q_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* one row of x (fp32 or bf16) -> its two digits x1, x2 [K] int8, sx, sumx [K / 32]; isum [2, K / 32]: the sums
 * of x1 and of x2 per group */
RF_VNNI static void rf_quantize_row(const void *x, int bf16, int64_t K, int8_t *x1, int8_t *x2, float *sx,
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
RF_VNNI static inline void rf_quant_tile(int q8, const uint8_t *w, const uint16_t *d, const uint16_t *m,
                                         const int8_t *x1, const int8_t *x2, const float *sx, const float *sumx,
                                         const int32_t *isum, int64_t b0, int nb, int64_t K, int64_t G,
                                         __m512 *acc) {
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
}

/* y [B, N] (fp32 or bf16, + bias [N] fp32 when given) = x [B, K] (fp32 or bf16) W^T, W in tiles (see above);
 * q8: the Q8_0 layout (m unused), else Q4_1. Returns -1 when there is no memory for the activations' digits. */
RF_VNNI static int rf_quant_linear(int q8, const uint8_t *w, const uint16_t *d, const uint16_t *m,
                                   const float *bias, const void *x, int x_bf16, int64_t B, int64_t N,
                                   int64_t K, void *y, int y_bf16) {
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
        rf_quantize_row((const char *)x + b * K * (x_bf16 ? 2 : 4), x_bf16, K, x1 + b * K, x2 + b * K, sx + b * G,
                        sumx + b * G, isum + b * 2 * G);
    int parallel = N * K * B >= RF_Q_PARALLEL_MIN;
    #pragma omp parallel for schedule(static) if (parallel)
    for (int64_t t = 0; t < tiles; t++) {
        int rows = N - t * RF_QROWS < RF_QROWS ? (int)(N - t * RF_QROWS) : RF_QROWS;
        for (int64_t b0 = 0; b0 < B; b0 += RF_QB) {
            int nb = B - b0 < RF_QB ? (int)(B - b0) : RF_QB;
            __m512 acc[RF_QB];
            rf_quant_tile(q8, w + t * tile_bytes, d + t * scale_len, q8 ? 0 : m + t * scale_len, x1, x2, sx, sumx,
                          isum, b0, nb, K, G, acc);
            for (int bb = 0; bb < nb; bb++) {
                float v[RF_QROWS];
                _mm512_storeu_ps(v, acc[bb]);
                rf_q_store(y, y_bf16, (b0 + bb) * N + t * RF_QROWS, v, bias ? bias + t * RF_QROWS : 0, rows);
            }
        }
    }
    if (work != (void *)local) free(work);
    return 0;
}
#undef RF_DOT8
#undef RF_XB
#else
static int rf_quant_cpu_ok(void) { return 0; }
static int rf_quant_linear(int q8, const uint8_t *w, const uint16_t *d, const uint16_t *m, const float *bias,
                           const void *x, int x_bf16, int64_t B, int64_t N, int64_t K, void *y, int y_bf16) {
    (void)q8; (void)w; (void)d; (void)m; (void)bias; (void)x; (void)x_bf16; (void)B; (void)N; (void)K; (void)y;
    (void)y_bf16;
    return -1;
}
#endif


#endif
