/* The block kernels' shared declarations: tile and format constants, the tiers and formats (each
 * list declared once here), the weights' and activations' structs, the per-format dispatch macros. */
#ifndef ROSEFAST_QUANT_COMMON_H
#define ROSEFAST_QUANT_COMMON_H

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

/* the tiers (names: rf_tier_name) */
enum { RF_TIER_SCALAR = 0, RF_TIER_AVX2 = 1, RF_TIER_AVXVNNI = 2, RF_TIER_AVX512VNNI = 3, RF_TIER_NEON = 4,
       RF_TIER_AMX = 5, RF_TIERS = 6 };

/* the weights' formats (names: rf_format_name) */
enum { RF_FMT_Q4_1 = 0, RF_FMT_Q8_0 = 1, RF_FMT_Q5_1 = 2, RF_FMT_Q4_K = 3, RF_FMT_Q5_K = 4, RF_FMT_Q6_K = 5,
       RF_FMT_Q5_0 = 6, RF_FMTS = 7 };
#define RF_QPARTS 8       /* formats one linear may mix (a fused q|k|v of three types) */

/* the tiers' and formats' names, by number: the one list each (rosefast/kernels/_quant_ops_c.pyx reads them and
 * checks rosefast.config.CPU_KERNELS and rosefast/quant/tiles.py's FORMATS against them at import) */
static inline const char *rf_tier_name(int tier) {
    static const char *const names[RF_TIERS] = {"scalar", "avx2", "avxvnni", "avx512vnni", "neon", "amx"};
    return tier >= 0 && tier < RF_TIERS ? names[tier] : "";
}
static inline const char *rf_format_name(int fmt) {
    static const char *const names[RF_FMTS] = {"q4_1", "q8_0", "q5_1", "q4_k", "q5_k", "q6_k", "q5_0"};
    return fmt >= 0 && fmt < RF_FMTS ? names[fmt] : "";
}

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

#endif   /* ROSEFAST_QUANT_COMMON_H */
