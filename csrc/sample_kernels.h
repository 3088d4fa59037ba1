/* CPU kernels for the sampler's per-row work, fp32 and bf16 logits: the argmax, and one draw per row
 * under temperature, top_k, top_p and min_p. Plain C, no Python API: the caller releases the GIL.
 *
 * A row is read once into an fp32 buffer of exp((logit - max) / temperature) (the largest is exactly 1).
 * top_k and top_p need a threshold among those values, not a sort: a 1024-bucket histogram of their
 * float bits (positive floats order as their bits do) finds the bucket the threshold falls in, and only
 * that bucket's values are sorted. top_p keeps the smallest prefix, in descending order, whose mass
 * reaches top_p (the value that crosses it included); min_p keeps values >= min_p (x the largest, 1).
 * The draw is an inverse CDF in vocabulary order: the first kept token whose running mass reaches
 * u x the kept total. Ties at a threshold are all kept. Rows run in parallel with OpenMP.
 */
#ifndef ROSEFAST_SAMPLE_KERNELS_H
#define ROSEFAST_SAMPLE_KERNELS_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "decode_kernels.h"   /* rf_bf16_load, rf_exp, RF_SIMD_CLONES, RF_PARALLEL_MIN */

#define RF_BUCKETS 1024

static inline int rf_bucket(float e) {
    uint32_t b;
    memcpy(&b, &e, 4);
    b >>= 20;   /* sign (0), exponent, 3 mantissa bits; values <= 1 land in buckets <= 1016 */
    return b >= RF_BUCKETS ? RF_BUCKETS - 1 : (int)b;
}

static int rf_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* The histogram is kept four times over (by j % 4): consecutive values mostly fall in the same few
 * buckets, and one copy would make every update wait for the previous one. */
#define RF_WAYS 4

/* The smallest value kept among e[j] >= floor (e[j] > 0): by count, the `target` largest; by mass, the
 * shortest descending prefix whose mass reaches `target`. 0 when every such value is kept. */
typedef struct {
    double mass[RF_WAYS][RF_BUCKETS];
    int64_t count[RF_WAYS][RF_BUCKETS];
} rf_histogram;

static float rf_threshold(const float *e, int64_t V, int by_mass, double target, float floor, float *scratch,
                          rf_histogram *h) {
    double (*mass)[RF_BUCKETS] = h->mass;
    int64_t (*count)[RF_BUCKETS] = h->count;
    memset(h, 0, sizeof *h);
    for (int64_t j = 0; j < V; j++) {
        float v = e[j];
        if (v > 0.0f && v >= floor) {
            int b = rf_bucket(v);
            mass[j & (RF_WAYS - 1)][b] += v;
            count[j & (RF_WAYS - 1)][b]++;
        }
    }
    double acc = 0.0;
    int b;
    for (b = RF_BUCKETS - 1; b >= 0; b--) {
        double add = 0.0;
        for (int w = 0; w < RF_WAYS; w++)
            add += by_mass ? mass[w][b] : (double)count[w][b];
        if (acc + add >= target)
            break;
        acc += add;
    }
    if (b < 0)
        return 0.0f;
    int64_t n = 0;
    for (int64_t j = 0; j < V; j++) {
        float v = e[j];
        if (v > 0.0f && v >= floor && rf_bucket(v) == b)
            scratch[n++] = v;
    }
    qsort(scratch, (size_t)n, sizeof(float), rf_desc);
    int64_t keep = 0;
    if (by_mass) {
        while (keep < n && acc < target)
            acc += scratch[keep++];
    } else {
        keep = (int64_t)(target - acc);
    }
    if (keep < 1)
        keep = 1;
    return scratch[keep - 1];
}

/* The sum of e[j] >= cut over [0, n): eight independent lanes, so the loop vectorizes. */
RF_SIMD_CLONES
static double rf_kept_sum(const float *e, int64_t n, float cut) {
    double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++)
            lanes[l] += e[j + l] >= cut ? (double)e[j + l] : 0.0;
    double total = 0.0;
    for (; j < n; j++)
        total += e[j] >= cut ? (double)e[j] : 0.0;
    for (int l = 0; l < 8; l++)
        total += lanes[l];
    return total;
}

/* e[j] = exp((x[j] - max) * inv_t) for one row already widened to fp32 in e, whose max is given. */
RF_SIMD_CLONES
static void rf_softmax_numerators(float *e, int64_t V, float m, float inv_t) {
    for (int64_t j = 0; j < V; j++) {
        float z = (e[j] - m) * inv_t;
        float v = rf_exp(z);
        e[j] = z < -87.0f ? 0.0f : v;   /* a masked (-inf) logit, or one too small for fp32, has no mass */
    }
}

/* Widen one row into buf and return its max, in one pass. */
#define RF_DEFINE_LOAD_MAX(NAME, T, LOAD)                                                                     \
    RF_SIMD_CLONES                                                                                            \
    static float NAME(const T *row, int64_t V, float *buf) {                                                  \
        float lanes[16];                                                                                      \
        for (int l = 0; l < 16; l++)                                                                          \
            lanes[l] = -INFINITY;                                                                             \
        int64_t j = 0;                                                                                        \
        for (; j + 16 <= V; j += 16)                                                                          \
            for (int l = 0; l < 16; l++) {                                                                    \
                float v = LOAD(row[j + l]);                                                                   \
                buf[j + l] = v;                                                                               \
                lanes[l] = v > lanes[l] ? v : lanes[l];                                                       \
            }                                                                                                 \
        float m = -INFINITY;                                                                                  \
        for (; j < V; j++) {                                                                                  \
            buf[j] = LOAD(row[j]);                                                                            \
            m = buf[j] > m ? buf[j] : m;                                                                      \
        }                                                                                                     \
        for (int l = 0; l < 16; l++)                                                                          \
            m = lanes[l] > m ? lanes[l] : m;                                                                  \
        return m;                                                                                             \
    }

static inline float rf_f32_load(float f) { return f; }
RF_DEFINE_LOAD_MAX(rf_load_max_f32, float, rf_f32_load)
RF_DEFINE_LOAD_MAX(rf_load_max_bf16, uint16_t, rf_bf16_load)

#define RF_DRAW_BLOCK 256

static int64_t rf_draw_row(float *e, int64_t V, float m, float temperature, int64_t top_k, float top_p,
                           float min_p, float u, float *scratch, rf_histogram *h) {
    rf_softmax_numerators(e, V, m, 1.0f / temperature);
    float cut = 0.0f;
    if (top_k > 0 && top_k < V)
        cut = rf_threshold(e, V, 0, (double)top_k, 0.0f, scratch, h);
    if (top_p < 1.0f) {
        /* A kept value has at least (1 - top_p) of the mass at or below it, and that mass is at most V times
         * the value: nothing under (1 - top_p) x total / V can be kept, so the histogram skips it. */
        double total = rf_kept_sum(e, V, cut);
        float low = (float)((1.0 - (double)top_p) * total / (double)V * 0.999);   /* 0.999: rounding */
        float p_cut = rf_threshold(e, V, 1, (double)top_p * total, low > cut ? low : cut, scratch, h);
        cut = p_cut > cut ? p_cut : cut;
    }
    if (min_p > cut)                 /* the largest numerator is exp(0) = 1 */
        cut = min_p;
    if (cut <= 0.0f)
        cut = FLT_MIN;               /* never a token without mass */
    /* inverse CDF in vocabulary order: block sums first, then the one block the goal falls in */
    int64_t nblocks = (V + RF_DRAW_BLOCK - 1) / RF_DRAW_BLOCK;
    double *blocks = (double *)scratch;   /* scratch holds V floats: room for V / 2 doubles */
    double total = 0.0;
    for (int64_t k = 0; k < nblocks; k++) {
        int64_t start = k * RF_DRAW_BLOCK, len = V - start < RF_DRAW_BLOCK ? V - start : RF_DRAW_BLOCK;
        blocks[k] = rf_kept_sum(e + start, len, cut);
        total += blocks[k];
    }
    double goal = (double)u * total, acc = 0.0;
    int64_t last = -1;
    for (int64_t k = 0; k < nblocks; k++) {
        if (blocks[k] > 0.0)
            last = k;
        if (acc + blocks[k] < goal || blocks[k] == 0.0) {
            acc += blocks[k];
            continue;
        }
        int64_t start = k * RF_DRAW_BLOCK, end = start + RF_DRAW_BLOCK < V ? start + RF_DRAW_BLOCK : V;
        for (int64_t j = start; j < end; j++) {
            if (e[j] >= cut) {
                acc += e[j];
                if (acc >= goal)
                    return j;
            }
        }
        last = k;   /* rounding left the goal just past this block's sum: fall through to its last token */
        break;
    }
    if (last < 0)
        return 0;
    int64_t start = last * RF_DRAW_BLOCK, end = start + RF_DRAW_BLOCK < V ? start + RF_DRAW_BLOCK : V;
    for (int64_t j = end - 1; j >= start; j--)
        if (e[j] >= cut)
            return j;
    return start;
}

#define RF_DEFINE_SAMPLE(NAME, T, LOAD_MAX)                                                                   \
    static int NAME(const T *logits, int64_t S, int64_t V, const float *temperature, const int64_t *top_k,     \
                    const float *top_p, const float *min_p, const float *u, int64_t *out) {                   \
        int failed = 0;                                                                                       \
        _Pragma("omp parallel if (S > 1 && S * V >= RF_PARALLEL_MIN)")                                       \
        {                                                                                                     \
            float *buf = (float *)malloc(sizeof(float) * (size_t)V * 2 + sizeof(rf_histogram));               \
            if (buf == NULL) {                                                                                \
                _Pragma("omp atomic write") failed = 1;                                                       \
            }                                                                                                 \
            _Pragma("omp for schedule(static)")                                                               \
            for (int64_t i = 0; i < S; i++) {                                                                 \
                if (buf == NULL)                                                                              \
                    continue;                                                                                 \
                float m = LOAD_MAX(logits + i * V, V, buf);                                                   \
                out[i] = rf_draw_row(buf, V, m, temperature[i], top_k[i], top_p[i], min_p[i], u[i], buf + V,  \
                                     (rf_histogram *)(buf + 2 * V));                                          \
            }                                                                                                 \
            free(buf);                                                                                        \
        }                                                                                                     \
        return failed ? -1 : 0;                                                                               \
    }

RF_DEFINE_SAMPLE(rf_sample_f32, float, rf_load_max_f32)
RF_DEFINE_SAMPLE(rf_sample_bf16, uint16_t, rf_load_max_bf16)

#define RF_DEFINE_ARGMAX(NAME, T, LOAD)                                                                       \
    RF_SIMD_CLONES                                                                                            \
    static void NAME(const T *logits, int64_t S, int64_t V, int64_t *out) {                                   \
        _Pragma("omp parallel for schedule(static) if (S > 1 && S * V >= RF_PARALLEL_MIN)")                  \
        for (int64_t i = 0; i < S; i++) {                                                                     \
            const T *row = logits + i * V;                                                                    \
            float best = LOAD(row[0]);                                                                        \
            int64_t at = 0;                                                                                   \
            for (int64_t j = 1; j < V; j++) {                                                                 \
                float v = LOAD(row[j]);                                                                       \
                if (v > best) {                                                                               \
                    best = v;                                                                                 \
                    at = j;                                                                                   \
                }                                                                                             \
            }                                                                                                 \
            out[i] = at;                                                                                      \
        }                                                                                                     \
    }

RF_DEFINE_ARGMAX(rf_argmax_f32, float, rf_f32_load)
RF_DEFINE_ARGMAX(rf_argmax_bf16, uint16_t, rf_bf16_load)

/* Structured output: -inf in fp32 logits x [*, V] wherever a row's allowed-token bitmask has a 0 bit (bit j
 * of int32 word w allows token 32 w + j); rows[r] is the logits row of bitmask row r. A word of all ones
 * (most of them, for a loose grammar) is skipped; tokens past the bitmask's W x 32 are disallowed. */
RF_SIMD_CLONES
static void rf_mask_f32(float *x, int64_t V, const int64_t *rows, int64_t R, const int32_t *bitmask, int64_t W) {
    const int64_t full = (V / 32 < W ? V / 32 : W);   /* words whose 32 tokens are all in the vocabulary */
    _Pragma("omp parallel for schedule(static) if (R > 1 && R * V >= RF_PARALLEL_MIN)")
    for (int64_t r = 0; r < R; r++) {
        float *row = x + rows[r] * V;
        const uint32_t *words = (const uint32_t *)(bitmask + r * W);
        for (int64_t w = 0; w < full; w++) {
            uint32_t m = words[w];
            float *p = row + w * 32;
            if (m == 0xFFFFFFFFu) continue;
            for (int j = 0; j < 32; j++)   /* branch-free: the compiler vectorizes the select */
                p[j] = ((m >> j) & 1u) ? p[j] : -INFINITY;
        }
        for (int64_t t = full * 32; t < V; t++)
            if (t >= W * 32 || !((words[t >> 5] >> (t & 31)) & 1u)) row[t] = -INFINITY;
    }
}

#endif
