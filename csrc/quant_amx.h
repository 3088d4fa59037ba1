/* x86-64: the AMX tier (Intel's tile unit in bf16, many rows). Included by quant_kernels.h, after
 * quant_avx2.h. */
#ifndef ROSEFAST_QUANT_AMX_H
#define ROSEFAST_QUANT_AMX_H

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
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
#endif

#endif   /* ROSEFAST_QUANT_AMX_H */
