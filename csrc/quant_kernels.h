/* Quantized linears on GGUF's own block formats with integer dot products, the activations as two int8 digits
 * per value, per 32 inputs:
 *
 *   x ~ sx (x1 + x2 / 254),  x1 = round(x / sx), x2 = round((x - sx x1) 254 / sx),  sx = max |x| / 127
 *
 * (one digit, llama.cpp's Q8 activations, is off by up to sx / 2: 1-3 % per linear on SmolLM2's activations,
 * enough to part greedy texts within a few tokens; two are off by sx / 508, finer than bf16; one digit is a setting,
 * rf_quant_linear_rows' `digits`: x2 = 0, half the integer products). Per block g of 32
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

#include "quant_common.h"
#include "quant_scalar.h"
#include "quant_avx512.h"   /* x86-64 (each ISA's header is empty elsewhere) */
#include "quant_avx2.h"
#include "quant_amx.h"
#include "quant_neon.h"     /* aarch64 */

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

/* the activation rows from which `tier` computes with numbers of its own, not the digits' (the AMX tier's bf16
 * tiles: outputs that differ in their last bits; the AVX2 tier's FMAs, with two digits only: one digit's integer
 * products are cheaper than them), for fp32 or bf16 activations and 1 or 2 digits; 0: never */
static int rf_quant_own_rows(int tier, int x_bf16, int digits) {
#ifdef RF_X86_TIERS
    if (tier == RF_TIER_AMX) return x_bf16 ? RF_AMX_MIN_ROWS_BF16 : RF_AMX_MIN_ROWS_F32;
    if (tier == RF_TIER_AVX2 && digits == 2) return RF_AVX2_MIN_ROWS;
#endif
    (void)tier;
    (void)x_bf16;
    (void)digits;
    return 0;
}

/* A call's plan: its parts' tiles and output columns, the tile kernel its tier and row count pick, its work units
 * (tiles, or on the AVX-512 tier with several activation rows pairs of a part's tiles). */
typedef struct {
    int tier, nparts, many, digits;
    rf_quant_tile_fn tile;
    const rf_qweights *parts;
    int64_t G, N, first[RF_QPARTS + 1], col[RF_QPARTS], unit_first[RF_QPARTS + 1], per[RF_QPARTS];
} rf_qplan;

/* The plan of rf_quant_linear_rows' call (its arguments, below) -> 0; 1 when the tier's own path (rf_quant_own_rows:
 * AMX's tiles, AVX2's FMAs) takes these rows (plan->first, col and N still set for it); < 0: its error codes. */
static int rf_quant_plan(int tier, const rf_qweights *parts, int nparts, int x_bf16, int64_t B, int64_t K,
                         int64_t path_rows, int digits, rf_qplan *plan) {
    if (tier < 0 || tier >= RF_TIERS || !rf_quant_tier_ok(tier)) return -2;
    if (nparts < 1 || nparts > RF_QPARTS || K % RF_QG || (digits != 1 && digits != 2)) return -3;
    int64_t G = K / RF_QG, N = 0;
    plan->first[0] = 0;
    for (int p = 0; p < nparts; p++) {
        int fmt = parts[p].fmt;
        if (fmt < 0 || fmt >= RF_FMTS || parts[p].n < 0 || (rf_q_kformat(fmt) && G % 8)) return -3;
        plan->col[p] = N;
        N += parts[p].n;
        plan->first[p + 1] = plan->first[p] + (parts[p].n + RF_QROWS - 1) / RF_QROWS;
    }
    plan->parts = parts;
    plan->nparts = nparts;
    plan->G = G;
    plan->N = N;
    plan->digits = digits;
    plan->many = 0;
    plan->tile = rf_quant_tile_scalar;
#ifdef RF_X86_TIERS
    /* a tier with a path of its own (rf_quant_own_rows) takes it from its row count */
    int own = rf_quant_own_rows(tier, x_bf16, digits);
    if (own && (path_rows > 0 ? path_rows : B) >= own) {
        plan->tier = tier;
        return 1;
    }
    if (tier == RF_TIER_AMX) tier = RF_TIER_AVX512VNNI;   /* below its tiles: the VNNI kernels */
    /* the AVX2 tier's tile of many rows (rf_quant_many_avx2; one digit: rf_quant_many1_avx2 at every row count),
     * for its formats but Q8_0 */
    if (tier == RF_TIER_AVX2 || tier == RF_TIER_AVXVNNI) {
        plan->tile = tier == RF_TIER_AVX2 ? rf_quant_tile_avx2 : rf_quant_tile_avxvnni;
        plan->many = tier == RF_TIER_AVX2 && (B >= RF_Q_MANY_MIN || digits == 1);
    } else if (tier == RF_TIER_AVX512VNNI) {
        plan->tile = rf_quant_tile_avx512;
    }
#else
    (void)x_bf16;
    (void)path_rows;
#endif
#ifdef RF_NEON_TIERS
    if (tier == RF_TIER_NEON) plan->tile = rf_cpu_has_i8mm() ? rf_quant_tile_neon_i8mm : rf_quant_tile_neon;
#endif
    plan->tier = tier;
    plan->unit_first[0] = 0;
    for (int p = 0; p < nparts; p++) {
        plan->per[p] = 1;
#ifdef RF_X86_TIERS
        if (tier == RF_TIER_AVX512VNNI && B >= 2 && parts[p].fmt != RF_FMT_Q6_K) plan->per[p] = 2;
#endif
        plan->unit_first[p + 1] = plan->unit_first[p] + (plan->first[p + 1] - plan->first[p] + plan->per[p] - 1) /
                                  plan->per[p];
    }
    return 0;
}

/* The digits of B rows of x [B, K] into `work` (rf_quant_work_bytes(B, K) bytes, 64-byte aligned) -> acts, made
 * as `tier`'s kernels make them (a plan's tier). */
static void rf_quant_acts(int tier, const void *x, int x_bf16, int64_t B, int64_t K, int digits, void *work,
                          rf_qacts *acts) {
    void (*quantize)(const void *, int, int64_t, int8_t *, int8_t *, float *, float *, int32_t *, int32_t *) =
        rf_quantize_row_c;
#ifdef RF_X86_TIERS
    if (tier == RF_TIER_AVX2 || tier == RF_TIER_AVXVNNI) quantize = rf_quantize_row_avx2;
    else if (tier == RF_TIER_AVX512VNNI) quantize = rf_quantize_row_avx512;
#else
    (void)tier;
#endif
    int64_t G = K / RF_QG, bytes = (B * K + 63) & ~(int64_t)63;
    int8_t *x1 = (int8_t *)work, *x2 = x1 + bytes;
    float *sx = (float *)(x2 + bytes);
    float *sumx = sx + B * G;
    int32_t *isum = (int32_t *)(sumx + B * G), *ihalf = isum + B * 2 * G;
    for (int64_t b = 0; b < B; b++) {
        quantize((const char *)x + b * K * (x_bf16 ? 2 : 4), x_bf16, K, x1 + b * K, x2 + b * K, sx + b * G,
                 sumx + b * G, isum + b * 2 * G, ihalf + b * 2 * G);
        if (digits == 1) {   /* the second digit and its sums 0: every kernel's one-digit numbers */
            memset(x2 + b * K, 0, (size_t)K);
            memset(isum + b * 2 * G + G, 0, (size_t)G * 4);
            memset(ihalf + b * 2 * G + G, 0, (size_t)G * 4);
        }
    }
    acts->x1 = x1;
    acts->x2 = x2;
    acts->sx = sx;
    acts->sumx = sumx;
    acts->isum = isum;
    acts->ihalf = ihalf;
    acts->K = K;
    acts->G = G;
}

/* The plan's work unit uu over acts' rows a0 .. a0 + B - 1 -> y's rows 0 .. B - 1 ([B, N], + bias) */
static void rf_quant_unit(const rf_qplan *plan, const rf_qacts *acts, int64_t uu, int64_t a0, int64_t B,
                          const float *bias, void *y, int y_bf16) {
    int p = 0;
    while (uu >= plan->unit_first[p + 1]) p++;
    const rf_qweights *parts = plan->parts;
    int64_t G = plan->G, N = plan->N, per = plan->per[p];
    int64_t t = (uu - plan->unit_first[p]) * per, n = parts[p].n, count = plan->first[p + 1] - plan->first[p];
    int pair = per == 2 && t + 1 < count;
    rf_qweights tw = rf_q_tile_of(&parts[p], t, G), tw2 = pair ? rf_q_tile_of(&parts[p], t + 1, G) : tw;
#ifdef RF_X86_TIERS
    if (plan->many && parts[p].fmt != RF_FMT_Q8_0) {
        float v[RF_Q_MANY * RF_QROWS] __attribute__((aligned(64)));
        int64_t c0 = plan->col[p] + t * RF_QROWS;
        int rows = n - t * RF_QROWS < RF_QROWS ? (int)(n - t * RF_QROWS) : RF_QROWS;
        for (int64_t b0 = 0; b0 < B; b0 += RF_Q_MANY) {
            int nb = B - b0 < RF_Q_MANY ? (int)(B - b0) : RF_Q_MANY;
            (plan->digits == 1 ? rf_quant_many1_avx2 : rf_quant_many_avx2)(&tw, acts, a0 + b0, nb, v);
            for (int bb = 0; bb < nb; bb++)
                rf_q_store(y, y_bf16, (b0 + bb) * N + c0, v + bb * RF_QROWS, bias ? bias + c0 : 0, rows);
        }
        return;
    }
#endif
    for (int64_t b0 = 0; b0 < B; b0 += RF_QB) {
        int nb = B - b0 < RF_QB ? (int)(B - b0) : RF_QB;
        float v[2][RF_QB * RF_QROWS] __attribute__((aligned(64)));
#ifdef RF_X86_TIERS
        if (pair)
            rf_quant_tile2_avx512(&tw, &tw2, acts, a0 + b0, nb, v[0], v[1]);
        else
#endif
            plan->tile(&tw, acts, a0 + b0, nb, v[0]);
        for (int j = 0; j <= pair; j++) {
            int64_t tj = t + j, c0 = plan->col[p] + tj * RF_QROWS;
            int rows = n - tj * RF_QROWS < RF_QROWS ? (int)(n - tj * RF_QROWS) : RF_QROWS;
            for (int bb = 0; bb < nb; bb++)
                rf_q_store(y, y_bf16, (b0 + bb) * N + c0, v[j] + bb * RF_QROWS, bias ? bias + c0 : 0, rows);
        }
    }
}

/* the tier's own path (rf_quant_plan's 1) */
static int rf_quant_own(const rf_qplan *plan, const float *bias, const void *x, int x_bf16, int64_t B, int64_t K,
                        void *y, int y_bf16) {
#ifdef RF_X86_TIERS
    return (plan->tier == RF_TIER_AMX ? rf_quant_linear_amx : rf_quant_linear_fma)(
        plan->parts, plan->nparts, plan->first, plan->col, bias, x, x_bf16, B, K, y, y_bf16, plan->N);
#else
    (void)plan; (void)bias; (void)x; (void)x_bf16; (void)B; (void)K; (void)y; (void)y_bf16;
    return -2;
#endif
}

/* y [B, N] (fp32 or bf16, + bias [N] fp32 when given) = x [B, K] (fp32 or bf16) W^T, W's rows given as `nparts`
 * parts one after another (N = their rows; each in its own format, tiles as above: a fused q|k|v whose q, k and v
 * are of three types), on `tier`; the activations' digits are made once for all parts. `path_rows` (0: B) is the
 * row count that picks the tier's path where it has two (the AMX tier: its VNNI kernels or the tiles): a
 * speculative step's rows computed as its sequences' decode step would compute them. `digits`: the activations'
 * digits, 2 (above) or 1 (x1 alone: llama.cpp's Q8 activations, half the integer products, off by up to sx / 2;
 * every tier computes it as its two-digit kernels would with x2 = 0, the AVX2 tier's many-row path without the
 * second digit's products). Returns -1 when there is no memory for the digits, -2 when this CPU does not run the
 * tier, -3 when the parts do not fit (a K format needs K % 256 == 0; at most RF_QPARTS parts; digits 1 or 2). */
static int rf_quant_linear_rows(int tier, const rf_qweights *parts, int nparts, const float *bias, const void *x,
                                int x_bf16, int64_t B, int64_t K, void *y, int y_bf16, int64_t path_rows, int digits) {
    rf_qplan plan;
    int rc = rf_quant_plan(tier, parts, nparts, x_bf16, B, K, path_rows, digits, &plan);
    if (rc < 0) return rc;
    if (rc == 1) return rf_quant_own(&plan, bias, x, x_bf16, B, K, y, y_bf16);
    /* the digits: on the stack for a few rows (a decode step's), else from the heap */
    char local[16384] __attribute__((aligned(64)));
    int64_t need = rf_quant_work_bytes(B, K);
    void *work = need <= (int64_t)sizeof local ? (void *)local : malloc((size_t)need);
    if (!work) return -1;
    rf_qacts acts;
    rf_quant_acts(plan.tier, x, x_bf16, B, K, digits, work, &acts);
    int64_t units = plan.unit_first[nparts];
    #pragma omp parallel for schedule(static) if (plan.N * K * B >= RF_Q_PARALLEL_MIN)
    for (int64_t uu = 0; uu < units; uu++) rf_quant_unit(&plan, &acts, uu, 0, B, bias, y, y_bf16);
    if (work != (void *)local) free(work);
    return 0;
}

/* rf_quant_linear_rows with the path picked by B itself, two digits */
static int rf_quant_linear(int tier, const rf_qweights *parts, int nparts, const float *bias, const void *x,
                           int x_bf16, int64_t B, int64_t K, void *y, int y_bf16) {
    return rf_quant_linear_rows(tier, parts, nparts, bias, x, x_bf16, B, K, y, y_bf16, 0, 2);
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
