/* A Gated DeltaNet's decode step after its projections, in one call (rosefast/models/delta_net.py): for each row,
 * the causal conv's step over its slot's tail (updated), SiLU; then for each (row, v head) the q and k of its k head
 * L2-normed (q scaled by 1/sqrt(dk)), the decay and beta from a and b, the gated delta rule on the head's state in
 * the row's slot (rf_delta_head, delta_rule.h), the gated RMSNorm of the head's output times SiLU(z). Two phases in
 * one OpenMP region (a barrier between them), where the ops one at a time were ~20 small torch calls a layer and
 * step (3-5x the state's bytes floor at one row). fp32 inside; the activations, weights and tails fp32 or bf16 (one
 * dtype for all of them). Plain C, no Python API: the caller releases the GIL.
 */
#ifndef ROSEFAST_DELTA_DECODE_H
#define ROSEFAST_DELTA_DECODE_H

#include "decode_kernels.h"
#include "delta_rule.h"

static inline float rf_dd_load(const void *p, int64_t i, int bf16)
{
    return bf16 ? rf_bf16_load(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline void rf_dd_store(void *p, int64_t i, float x, int bf16)
{
    if (bf16)
        ((uint16_t *)p)[i] = rf_bf16_round(x);
    else
        ((float *)p)[i] = x;
}

static inline float rf_dd_silu(float x) { return x / (1.0f + expf(-x)); }

/* one row's conv channels [c0, c1): tail [K - 1][C] shifted by the row's new input, x = SiLU(conv) (fp32) */
static void rf_dd_conv(const void *in, const void *conv, int64_t K, void *tail, int64_t C, int64_t c0, int64_t c1,
                       int bf16, float *x)
{
    for (int64_t c = c0; c < c1; c++) {
        const float now = rf_dd_load(in, c, bf16);
        float acc = rf_dd_load(conv, c * K + K - 1, bf16) * now;
        for (int64_t j = 0; j < K - 1; j++)
            acc += rf_dd_load(conv, c * K + j, bf16) * rf_dd_load(tail, j * C + c, bf16);
        for (int64_t j = 0; j + 1 < K - 1; j++)
            rf_dd_store(tail, j * C + c, rf_dd_load(tail, (j + 1) * C + c, bf16), bf16);
        if (K > 1)
            rf_dd_store(tail, (K - 2) * C + c, now, bf16);
        x[c] = rf_dd_silu(acc);
    }
}

static void rf_dd_l2norm(const float *src, float *dst, int64_t n, float scale)
{
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++)
        ss += src[i] * src[i];
    const float s = scale / sqrtf(ss + 1e-6f);
    for (int64_t i = 0; i < n; i++)
        dst[i] = src[i] * s;
}

/* proj [rows] of row_stride: q|k|v (the conv's C = 2 hk dk + hv dv channels) then z [hv dv]; ba [rows] of
 * ba_stride: b [hv] then a [hv]; conv [C][K]; tails [slots][K - 1][C]; pool [slots][hv][dk][dv] fp32; A_log,
 * dt_bias [hv]; norm [dv]; x: scratch [rows][C] fp32; out [rows][hv dv]. v head h reads k head h % hk (`tiled`,
 * llama.cpp's order) or h / (hv / hk). Rows naming one slot (padding on the scratch slot) race on it. */
static void rf_delta_decode(const void *proj, int64_t row_stride, const void *ba, int64_t ba_stride,
                            const void *conv, int64_t K, void *tails, float *pool, const int64_t *slots,
                            int64_t rows, const void *A_log, const void *dt_bias, const void *norm, float eps,
                            int64_t hk, int64_t hv, int64_t dk, int64_t dv, int tiled, int bf16, float *x,
                            void *out)
{
    const int64_t C = 2 * hk * dk + hv * dv, chunk = 512, chunks = (C + chunk - 1) / chunk;
    const int64_t per_k = hv / hk, es = bf16 ? 2 : 4;
#pragma omp parallel if (rows * hv > 1 && rows * hv * dk * dv >= 32768)
    {
#pragma omp for schedule(static)
        for (int64_t u = 0; u < rows * chunks; u++) {
            const int64_t r = u / chunks, c0 = (u % chunks) * chunk, c1 = c0 + chunk < C ? c0 + chunk : C;
            rf_dd_conv((const char *)proj + r * row_stride * es, conv, K,
                       (char *)tails + slots[r] * (K - 1) * C * es, C, c0, c1, bf16, x + r * C);
        }
#pragma omp for schedule(static)
        for (int64_t u = 0; u < rows * hv; u++) {
            const int64_t r = u / hv, h = u % hv, kh = tiled ? h % hk : h / per_k;
            const float *xr = x + r * C;
            float q[RF_DELTA_MAX_DV], k[RF_DELTA_MAX_DV], o[RF_DELTA_MAX_DV];
            rf_dd_l2norm(xr + kh * dk, q, dk, 1.0f / sqrtf((float)dk));
            rf_dd_l2norm(xr + hk * dk + kh * dk, k, dk, 1.0f);
            const char *gates = (const char *)ba + r * ba_stride * es;
            const float b = rf_dd_load(gates, h, bf16), a = rf_dd_load(gates, hv + h, bf16);
            const float sp = a + rf_dd_load(dt_bias, h, bf16);
            const float g = -expf(rf_dd_load(A_log, h, bf16)) * (sp > 20.0f ? sp : log1pf(expf(sp)));
            rf_delta_head(pool + (slots[r] * hv + h) * dk * dv, dk, dv, q, k, xr + 2 * hk * dk + h * dv, expf(g),
                          1.0f / (1.0f + expf(-b)), o);
            float ss = 0.0f;
            for (int64_t j = 0; j < dv; j++)
                ss += o[j] * o[j];
            const float rms = 1.0f / sqrtf(ss / (float)dv + eps);
            const char *z = (const char *)proj + (r * row_stride + C + h * dv) * es;
            for (int64_t j = 0; j < dv; j++)
                rf_dd_store(out, (r * hv + h) * dv + j,
                            rf_dd_load(norm, j, bf16) * o[j] * rms * rf_dd_silu(rf_dd_load(z, j, bf16)), bf16);
        }
    }
}

#endif
