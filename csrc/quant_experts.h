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

/* One linear of every expert with picks over its rows (xs [P, K], each expert's block of rows in order): the
 * activations' digits made once for all P rows, then one parallel loop over every expert's work units (an expert
 * on its tier's own path, AVX2's FMAs or AMX's tiles, runs alone first) -> ys [P, N]. The numbers of
 * rf_quant_linear_rows on each expert's rows. */
static int rf_quant_expert_linears(int tier, const rf_qweights *const *w, const int *nparts, int64_t E,
                                   const int64_t *counts, const char *xs, int bf16, int64_t P, int64_t K, int64_t N,
                                   char *ys, int64_t path_rows, int digits, rf_qplan *plans, int64_t *unit_end) {
    int64_t es = bf16 ? 2 : 4, units = 0, work_rows = 0;
    for (int64_t e = 0, s = 0; e < E; s += counts[e], e++) {
        unit_end[e] = units;
        if (!counts[e]) continue;
        int rc = rf_quant_plan(tier, w[e], nparts[e], bf16, counts[e], K, path_rows, digits, &plans[e]);
        if (rc < 0) return rc;
        if (plans[e].N != N) return -3;
        if (rc == 1) {   /* the tier's own path over these rows */
            rc = rf_quant_own(&plans[e], 0, xs + s * K * es, bf16, counts[e], K, ys + s * N * es, bf16);
            if (rc) return rc;
            continue;
        }
        units += plans[e].unit_first[plans[e].nparts];
        unit_end[e] = units;
        work_rows += counts[e];
    }
    if (!units) return 0;
    void *work = malloc((size_t)rf_quant_work_bytes(P, K));
    if (!work) return -1;
    rf_qacts acts;
    int first = 0;
    while (!counts[first] || unit_end[first] == (first ? unit_end[first - 1] : 0)) first++;
    rf_quant_acts(plans[first].tier, xs, bf16, P, K, digits, work, &acts);
    int64_t starts[E];
    for (int64_t e = 0, s = 0; e < E; s += counts[e], e++) starts[e] = s;
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
    free(work);
    return 0;
}

/* out [T, H] (x's dtype) = the weighted sum of each row's routed experts; gate_up[e] / down[e]: expert e's parts
 * (gate_up_parts[e] / down_parts[e] of them), I its width. path_rows as rf_quant_linear_rows'. Returns
 * rf_quant_linear_rows' codes, -1 also when there is no memory for the step's rows, -3 for an order that is not a
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
    char *buf = (char *)malloc((size_t)(P * (2 * H + 3 * I) * es) + 64);
    rf_qplan *plans = (rf_qplan *)malloc((size_t)E * sizeof(rf_qplan));
    int64_t *unit_end = (int64_t *)malloc((size_t)E * sizeof(int64_t));
    int rc = buf && plans && unit_end ? 0 : -1;
    if (!rc) {
        char *xs = buf, *h1 = xs + P * H * es, *act = h1 + P * 2 * I * es, *ys = act + P * I * es;
        for (int64_t p = 0; p < P; p++)
            memcpy(xs + p * H * es, (const char *)x + order[p] / top_k * H * es, (size_t)(H * es));
        rc = rf_quant_expert_linears(tier, gate_up, gate_up_parts, E, counts, xs, bf16, P, H, 2 * I, h1, path_rows,
                                     digits, plans, unit_end);
        if (!rc) {
            if (bf16) rf_silu_mul_bf16((const uint16_t *)h1, (uint16_t *)act, P, I);
            else rf_silu_mul_f32((const float *)h1, (float *)act, P, I);
            rc = rf_quant_expert_linears(tier, down, down_parts, E, counts, act, bf16, P, I, H, ys, path_rows, digits,
                                         plans, unit_end);
        }
        if (!rc) {
            memset(out, 0, (size_t)(T * H * es));
            for (int64_t p = 0; p < P; p++) {
                if (bf16) {
                    const uint16_t *y = (const uint16_t *)ys + p * H;
                    uint16_t *o = (uint16_t *)out + order[p] / top_k * H;
                    float w = rf_bf16_load(((const uint16_t *)weights)[order[p]]);
                    for (int64_t i = 0; i < H; i++)
                        o[i] = rf_bf16_round(rf_bf16_load(o[i]) + rf_bf16_load(rf_bf16_round(rf_bf16_load(y[i]) * w)));
                } else {   /* the product stored first: never contracted into an FMA with the add */
                    float *y = (float *)ys + p * H, w = ((const float *)weights)[order[p]];
                    for (int64_t i = 0; i < H; i++) y[i] *= w;
                }
            }
            for (int64_t p = 0; p < P && !bf16; p++) {
                const float *y = (const float *)ys + p * H;
                float *o = (float *)out + order[p] / top_k * H;
                for (int64_t i = 0; i < H; i++) o[i] += y[i];
            }
        }
    }
    free(buf);
    free(plans);
    free(unit_end);
    return rc;
}

#endif
