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
    if (!buf) return -1;
    char *xs = buf, *h1 = xs + P * H * es, *act = h1 + P * 2 * I * es, *ys = act + P * I * es;
    for (int64_t p = 0; p < P; p++)
        memcpy(xs + p * H * es, (const char *)x + order[p] / top_k * H * es, (size_t)(H * es));
    int rc = 0;
    for (int64_t e = 0, s = 0; e < E && !rc; s += counts[e], e++) {
        int64_t c = counts[e];
        if (!c) continue;
        rc = rf_quant_linear_rows(tier, gate_up[e], gate_up_parts[e], 0, xs + s * H * es, bf16, c, H,
                                  h1 + s * 2 * I * es, bf16, path_rows, digits);
        if (rc) break;
        if (bf16)
            rf_silu_mul_bf16((const uint16_t *)(h1 + s * 2 * I * es), (uint16_t *)(act + s * I * es), c, I);
        else
            rf_silu_mul_f32((const float *)(h1 + s * 2 * I * es), (float *)(act + s * I * es), c, I);
        rc = rf_quant_linear_rows(tier, down[e], down_parts[e], 0, act + s * I * es, bf16, c, I, ys + s * H * es,
                                  bf16, path_rows, digits);
    }
    if (!rc) {
        memset(out, 0, (size_t)(T * H * es));
        for (int64_t p = 0; p < P; p++) {
            int64_t row = order[p] / top_k;
            if (bf16) {
                const uint16_t *y = (const uint16_t *)ys + p * H;
                uint16_t *o = (uint16_t *)out + row * H;
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
    free(buf);
    return rc;
}

#endif
