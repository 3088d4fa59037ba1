/* x86-64: the AVX-VNNI and AVX2 tiers (256 bits), the AVX2 tier's many-row integer path and its fp32
 * FMA path from RF_AVX2_MIN_ROWS rows. Included by quant_kernels.h, after quant_avx512.h. */
#ifndef ROSEFAST_QUANT_AVX2_H
#define ROSEFAST_QUANT_AVX2_H

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
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

/* The AVX2 tier's one-digit path (rf_quant_linear_rows' digits = 1), at every row count: the numbers of
 * rf_q_row_avx2 without the second digit (the same integer sums, the same float order), but per block both halves'
 * weight vectors are unpacked once into a stash and each row's 8 activation words broadcast once for both halves
 * (the broadcasts cost more than the stash's loads: a 4096x2048 Q4_K linear at 32 rows, one thread on a Zen 3,
 * 5.3-5.5 against 6.3 ms; Q6_K 6.4 against 8.5; Q4_1 4.0 against 5.0). */
RF_AVX2 RF_INLINE256 void rf_quant_many1_avx2_f(const rf_qweights *q, const rf_qacts *a, int64_t b0, int nb,
                                                float *out, int fmt) {
    const int bytes = rf_q_block_bytes(fmt), per = 8 >> rf_q_planes(fmt), q6 = fmt == RF_FMT_Q6_K;
    const int has_min = rf_q_has_min(fmt), o_ = rf_q_offset(fmt);
    const int8_t *x1 = a->x1;
    const float *sx = a->sx, *sumx = a->sumx;
    const int32_t *isum = a->isum, *ihalf = a->ihalf;
    const int64_t K = a->K, G = a->G;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i cs[2][8];
    for (int i = 0; i < nb * RF_QROWS; i++) out[i] = 0.f;
    for (int64_t g = 0; g < G; g++) {
        for (int i = 0; i < bytes / 64; i++)
            _mm_prefetch((const char *)q->w + g * bytes + RF_Q_PREFETCH + 64 * i, _MM_HINT_T0);
        __m256 sa[2], sb[2], mv[2];
        for (int h = 0; h < 2; h++) rf_q_half_avx2(q, g, h, cs[h], &sa[h], &sb[h], &mv[h], fmt);
        for (int bb = 0; bb < nb; bb++) {
            const int64_t b = b0 + bb, sg = b * G + g;
            const int32_t *w1 = (const int32_t *)(x1 + b * K + g * RF_QG), is = isum[b * 2 * G + g];
            __m256i xw[8];
            for (int k = 0; k < 8; k++) xw[k] = _mm256_set1_epi32(w1[k]);
            __m256 sxv = _mm256_set1_ps(sx[sg]), sumv = _mm256_set1_ps(sumx[sg]);
            for (int h = 0; h < 2; h++) {
                float *o = out + bb * RF_QROWS + 8 * h;
                __m256 acc = _mm256_loadu_ps(o);
                if (q6) {   /* per 16 inputs: words 0-3 and 4-7, each less 32 times its half's digit sum */
                    int ih = ihalf[b * 2 * G + g];
                    __m256i s0 = _mm256_set1_epi32(-32 * ih), s1 = _mm256_set1_epi32(-32 * (is - ih));
                    for (int k = 0; k < 4; k += 2) {
                        s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_add_epi16(
                            _mm256_maddubs_epi16(cs[h][k], xw[k]), _mm256_maddubs_epi16(cs[h][k + 1], xw[k + 1])), ones));
                        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_add_epi16(
                            _mm256_maddubs_epi16(cs[h][k + 4], xw[k + 4]),
                            _mm256_maddubs_epi16(cs[h][k + 5], xw[k + 5])), ones));
                    }
                    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_mul_ps(sa[h], sxv), acc);
                    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_mul_ps(sb[h], sxv), acc);
                } else {
                    __m256i s = _mm256_set1_epi32(-o_ * is);
                    for (int k0 = 0; k0 < 8; k0 += per) {   /* rf_dot_avx2_u's int16 sums */
                        __m256i p = _mm256_maddubs_epi16(cs[h][k0], xw[k0]);
                        for (int k = k0 + 1; k < k0 + per; k++)
                            p = _mm256_add_epi16(p, _mm256_maddubs_epi16(cs[h][k], xw[k]));
                        s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
                    }
                    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(sa[h], sxv), acc);
                    if (has_min) acc = _mm256_fmadd_ps(mv[h], sumv, acc);
                }
                _mm256_storeu_ps(o, acc);
            }
        }
    }
}
#define RF_MANY1_avx2(f, n) rf_quant_many1_avx2_f(q, a, b0, nb, out, f)
RF_AVX2 static void rf_quant_many1_avx2(const rf_qweights *q, const rf_qacts *a, int64_t b0, int nb, float *out) {
    RF_BY_FORMAT(q->fmt, RF_MANY1_avx2, 0);
}
#undef RF_MANY1_avx2

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
#endif

#endif   /* ROSEFAST_QUANT_AVX2_H */
