/* Decode attention for one (sequence, kv head) with AVX2 intrinsics (attention_simd.h's kernel on 256-bit
 * vectors), for CPUs without AVX-512 (AMD Zen 2/3, Intel client cores): three query heads a pass — their
 * accumulators of 4 tokens or 4 x 8 dims and the 4 K or V vectors are one more than the 16 registers, and still
 * 1.33x two heads a pass (SmolLM2's G = 3). Used when the CPU has AVX2 and FMA but not AVX-512 (or
 * ROSEFAST_CPU_KERNELS keeps to it, decode_kernels.h) and head_dim is a multiple of 8 (<= 256); 3.5-3.7x (bf16),
 * 1.9-2.2x (fp32) the portable C's AVX2 build at 32 sequences. Included by decode_kernels.h only. */
#ifndef ROSEFAST_ATTENTION_AVX2_H
#define ROSEFAST_ATTENTION_AVX2_H

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#include <immintrin.h>
#include "attention_simd.h"
#define RF_HAVE_AVX2_KERNELS 1
#define RF_ATT_AVX2 __attribute__((target("avx2,fma")))

static int rf_att_cpu_has_avx2(void) {
    static int known = -1;
    if (known < 0) known = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return known;
}

#define RF_VEC_avx2 __m256
#define RF_W_avx2 8
#define RF_GROUP_avx2 3
#define RF_ATT_ATTR_avx2 RF_ATT_AVX2
RF_ATT_PLAIN_HELPERS(avx2, __m256, _mm256)
RF_ATT_AVX2 static inline __m256 rf_load_avx2_bf16(const uint16_t *p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

/* the four horizontal sums of a, b, c, d as one 4-lane vector */
RF_ATT_AVX2 static inline __m128 rf_hsum4_avx2(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));   /* per 128-bit half */
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

RF_ATT_AVX2 static inline float rf_hsum_avx2(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

RF_ATT_KERNELS(avx2, f32, float)
RF_ATT_KERNELS(avx2, bf16, uint16_t)
#else
#define RF_HAVE_AVX2_KERNELS 0
#endif

#endif
