/* x86-64: the AVX-512 VNNI tier (vpdpbusd on 512 bits) and the CPU checks the x86 tiers share.
 * Included by quant_kernels.h, after quant_scalar.h. */
#ifndef ROSEFAST_QUANT_AVX512_H
#define ROSEFAST_QUANT_AVX512_H

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
#endif

#endif   /* ROSEFAST_QUANT_AVX512_H */
