/* A mixture-of-experts layer's routed experts over one step's rows in one call, on the block kernels
 * (rosefast/models/moe.py's per-op loop is its reference: the same numbers).
 *
 * The step's T rows each picked top_k experts; `order` [T * top_k] lists the flattened picks (row * top_k + slot)
 * sorted by expert, stably, and `counts` [E] how many each expert has. Each expert with picks runs over its rows
 * (gathered into one block, in `order`): its fused gate|up, SiLU(gate) * up, its down, each a call of
 * rf_quant_linear_rows on that many rows, so one read of its weights per step. Each pick's output, times its
 * routing weight (`weights` [T * top_k], in the model's dtype), is added into its row in `order` (ascending expert),
 * rounding where the per-op path rounds: bf16 after every linear, the activation, the product and each add. */
#ifndef ROSEFAST_QUANT_EXPERTS_H
#define ROSEFAST_QUANT_EXPERTS_H

#include "decode_kernels.h"
#include "quant_kernels.h"

#define RF_EXPERT_CHUNK 2048   /* picks a pass takes (whole experts; one with more takes a pass alone) */

/* One linear of every expert of a pass over its rows (xs [P, K], each expert's block of rows in order): the
 * activations' digits made once for all P rows (into `work`: rf_quant_work_bytes(P, K) bytes), then one parallel
 * loop over every expert's work units (an expert on its tier's own path, AVX2's FMAs or AMX's tiles, runs alone
 * first) -> ys [P, N]. The numbers of rf_quant_linear_rows on each expert's rows. */
static int rf_quant_expert_linears(int tier, const rf_qweights *const *w, const int *nparts, int64_t E,
                                   const int64_t *counts, const char *xs, int bf16, int64_t P, int64_t K, int64_t N,
                                   char *ys, int64_t path_rows, int digits, rf_qplan *plans, int64_t *unit_end,
                                   int64_t *starts, void *work) {
    int64_t es = bf16 ? 2 : 4, units = 0, work_rows = 0, first = -1;
    for (int64_t e = 0, s = 0; e < E; s += counts[e], e++) {
        unit_end[e] = units;
        starts[e] = s;
        if (!counts[e]) continue;
        int rc = rf_quant_plan(tier, w[e], nparts[e], bf16, counts[e], K, path_rows, digits, &plans[e]);
        if (rc < 0) return rc;
        if (plans[e].N != N) return -3;
        if (rc == 1) {   /* the tier's own path over these rows */
            rc = rf_quant_own(&plans[e], 0, xs + s * K * es, bf16, counts[e], K, ys + s * N * es, bf16);
            if (rc) return rc;
            continue;
        }
        if (first < 0) first = e;
        units += plans[e].unit_first[plans[e].nparts];
        unit_end[e] = units;
        work_rows += counts[e];
    }
    if (!units) return 0;
    rf_qacts acts;
    rf_quant_acts(plans[first].tier, xs, bf16, P, K, digits, work, &acts);
    #pragma omp parallel for schedule(dynamic, 4) if (work_rows * N * K >= RF_Q_PARALLEL_MIN)
    for (int64_t u = 0; u < units; u++) {
        int64_t lo = 0, hi = E - 1;   /* the expert whose units hold u: the first e with unit_end[e] > u */
        while (lo < hi) {
            int64_t mid = (lo + hi) / 2;
            if (unit_end[mid] > u) hi = mid;
            else lo = mid + 1;
        }
        int64_t e = lo, before = e ? unit_end[e - 1] : 0;
        rf_quant_unit(&plans[e], &acts, u - before, starts[e], counts[e], 0, ys + starts[e] * N * es, bf16);
    }
    return 0;
}

/* This thread's scratch of at least `bytes`, kept between calls (a step's passes are bounded by RF_EXPERT_CHUNK
 * picks: no page faults of fresh memory every layer); NULL when there is no memory. */
static void *rf_expert_scratch(size_t bytes) {
    static __thread void *buf = 0;
    static __thread size_t cap = 0;
    if (bytes > cap) {
        free(buf);
        cap = 0;
        if (!(buf = malloc(bytes))) return 0;
        cap = bytes;
    }
    return buf;
}

/* out [T, H] (x's dtype) = the weighted sum of each row's routed experts; gate_up[e] / down[e]: expert e's parts
 * (gate_up_parts[e] / down_parts[e] of them), I its width. path_rows as rf_quant_linear_rows'. The picks are taken
 * in passes of whole experts (RF_EXPERT_CHUNK picks at most, unless one expert has more). Returns
 * rf_quant_linear_rows' codes, -1 also when there is no memory for a pass, -3 for an order that is not a
 * permutation's picks. */
static int rf_quant_experts(int tier, const rf_qweights *const *gate_up, const int *gate_up_parts,
                            const rf_qweights *const *down, const int *down_parts, int64_t E, const void *x,
                            int bf16, int64_t T, int64_t H, int64_t I, const int64_t *order, const int64_t *counts,
                            const void *weights, int64_t top_k, void *out, int64_t path_rows, int digits) {
    int64_t P = T * top_k, es = bf16 ? 2 : 4, total = 0;
    for (int64_t e = 0; e < E; e++) total += counts[e];
    if (total != P) return -3;
    for (int64_t p = 0; p < P; p++)
        if (order[p] < 0 || order[p] >= P) return -3;
    rf_qplan *plans = (rf_qplan *)malloc((size_t)E * sizeof(rf_qplan));
    int64_t *unit_end = (int64_t *)malloc((size_t)E * 2 * sizeof(int64_t));
    int rc = plans && unit_end ? 0 : -1;
    memset(out, 0, (size_t)(T * H * es));
    for (int64_t e0 = 0, s0 = 0; e0 < E && !rc;) {
        int64_t e1 = e0, Pc = 0;   /* this pass: experts e0 .. e1 - 1, picks s0 .. s0 + Pc - 1 */
        while (e1 < E && (Pc == 0 || Pc + counts[e1] <= RF_EXPERT_CHUNK)) Pc += counts[e1++];
        int64_t wb = rf_quant_work_bytes(Pc, H > I ? H : I);
        size_t bytes = (size_t)(Pc * (H + 3 * I) * es) + (size_t)wb + 128;
        char *xs = (char *)rf_expert_scratch(bytes);
        if (!xs) {
            rc = -1;
            break;
        }
        char *h1 = xs + Pc * H * es, *act = h1 + Pc * 2 * I * es;
        void *work = (void *)(((uintptr_t)(act + Pc * I * es) + 63) & ~(uintptr_t)63);
        const int64_t *ord = order + s0;
        #pragma omp parallel for if (Pc * H >= RF_Q_PARALLEL_MIN)
        for (int64_t p = 0; p < Pc; p++)
            memcpy(xs + p * H * es, (const char *)x + ord[p] / top_k * H * es, (size_t)(H * es));
        rc = rf_quant_expert_linears(tier, gate_up + e0, gate_up_parts + e0, e1 - e0, counts + e0, xs, bf16, Pc, H,
                                     2 * I, h1, path_rows, digits, plans, unit_end, unit_end + E, work);
        if (!rc) {
            if (bf16) rf_silu_mul_bf16((const uint16_t *)h1, (uint16_t *)act, Pc, I);
            else rf_silu_mul_f32((const float *)h1, (float *)act, Pc, I);
            /* the down linear's outputs over xs (no longer needed) */
            rc = rf_quant_expert_linears(tier, down + e0, down_parts + e0, e1 - e0, counts + e0, act, bf16, Pc, I, H,
                                         xs, path_rows, digits, plans, unit_end, unit_end + E, work);
        }
        if (!rc) {   /* each pick's output times its weight, added into its row in the picks' order (a column
                      * block a thread: every element's adds in that order) */
            #pragma omp parallel for if (Pc * H >= RF_Q_PARALLEL_MIN)
            for (int64_t c0 = 0; c0 < H; c0 += 64) {
                int64_t c1 = c0 + 64 < H ? c0 + 64 : H;
                for (int64_t p = 0; p < Pc; p++) {
                    int64_t row = ord[p] / top_k;
                    if (bf16) {
                        const uint16_t *y = (const uint16_t *)xs + p * H;
                        uint16_t *o = (uint16_t *)out + row * H;
                        float w = rf_bf16_load(((const uint16_t *)weights)[ord[p]]);
                        for (int64_t i = c0; i < c1; i++)
                            o[i] = rf_bf16_round(rf_bf16_load(o[i]) +
                                                 rf_bf16_load(rf_bf16_round(rf_bf16_load(y[i]) * w)));
                    } else {   /* the product stored first: never contracted into an FMA with the add */
                        float *y = (float *)xs + p * H, w = ((const float *)weights)[ord[p]];
                        float *o = (float *)out + row * H;
                        for (int64_t i = c0; i < c1; i++) y[i] *= w;
                        for (int64_t i = c0; i < c1; i++) o[i] += y[i];
                    }
                }
            }
        }
        s0 += Pc;
        e0 = e1;
    }
    free(plans);
    free(unit_end);
    return rc;
}

#endif
