/* Decode attention for one (sequence, kv head) with AVX-512 intrinsics (attention_simd.h's kernel on 512-bit
 * vectors): four query heads a pass, their accumulators of 4 tokens or 4 x 16 dims in registers. Used when the
 * CPU has AVX-512 and head_dim is a multiple of 16 (<= 256); attention_avx2.h and the portable C of
 * decode_kernels.h cover everything else. Included by decode_kernels.h only. */
#ifndef ROSEFAST_ATTENTION_AVX512_H
#define ROSEFAST_ATTENTION_AVX512_H

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#include <immintrin.h>
#include "attention_simd.h"
#define RF_HAVE_AVX512_KERNELS 1
#define RF_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

static int rf_cpu_has_avx512(void) {
    static int known = -1;
    if (known < 0) known = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
                           && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    return known;
}

#define RF_VEC_avx512 __m512
#define RF_W_avx512 16
#define RF_GROUP_avx512 4
#define RF_ATT_ATTR_avx512 RF_AVX512
RF_ATT_PLAIN_HELPERS(avx512, __m512, _mm512)
RF_AVX512 static inline float rf_hsum_avx512(__m512 v) { return _mm512_reduce_add_ps(v); }
RF_AVX512 static inline __m512 rf_load_avx512_bf16(const uint16_t *p) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

/* the four horizontal sums of a, b, c, d as one 4-lane vector */
RF_AVX512 static inline __m128 rf_hsum4_avx512(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));   /* per 128-bit lane */
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    __m512 abcd = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 half = _mm256_add_ps(_mm512_castps512_ps256(abcd), _mm512_extractf32x8_ps(abcd, 1));
    return _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
}

RF_ATT_KERNELS(avx512, f32, float)
RF_ATT_KERNELS(avx512, bf16, uint16_t)
#else
#define RF_HAVE_AVX512_KERNELS 0
#endif

#endif
