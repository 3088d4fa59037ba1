/* The gated delta rule's decode step (Gated DeltaNet, rosefast/models/delta_net.py): one token of each row, each v
 * head's d_k x d_v fp32 state updated in place in the row's slot of the pool. Plain C, no Python API: the caller
 * releases the GIL.
 *
 *     S <- a S;   delta = beta (v - S^T k);   S <- S + k delta^T;   out = S^T q        (a = exp(g))
 *
 * in two passes over a head's state (64 KiB at 128 x 128: it stays in L2 between them): the first reads S for
 * what it recalls of k (a S^T k), the second decays, updates and reads it out with q while writing it back. So the
 * state moves through memory once each way, which is the step's bytes floor. Rows x heads split with OpenMP.
 */
#ifndef ROSEFAST_DELTA_RULE_H
#define ROSEFAST_DELTA_RULE_H

#include <math.h>
#include <stdint.h>

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define RF_DELTA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define RF_DELTA_CLONES
#endif

#define RF_DELTA_MAX_DV 1024   /* the widest v head a call takes (the caller checks) */

RF_DELTA_CLONES
static void rf_delta_head(float *restrict state, int64_t dk, int64_t dv, const float *restrict q,
                          const float *restrict k, const float *restrict v, float a, float beta, float *restrict out)
{
    float delta[RF_DELTA_MAX_DV];
    for (int64_t j = 0; j < dv; j++)
        delta[j] = 0.0f;
    for (int64_t i = 0; i < dk; i++) {
        const float *row = state + i * dv;
        const float ki = k[i];
        for (int64_t j = 0; j < dv; j++)
            delta[j] += row[j] * ki;
    }
    for (int64_t j = 0; j < dv; j++) {
        delta[j] = beta * (v[j] - a * delta[j]);
        out[j] = 0.0f;
    }
    for (int64_t i = 0; i < dk; i++) {
        float *row = state + i * dv;
        const float ki = k[i], qi = q[i];
        for (int64_t j = 0; j < dv; j++) {
            const float s = a * row[j] + ki * delta[j];
            row[j] = s;
            out[j] += s * qi;
        }
    }
}

/* pool [slots][heads][dk][dv]; slots [rows]; q, k [rows][heads][dk]; v, out [rows][heads][dv]; g, beta
 * [rows][heads]. A slot that several rows name (padding rows on a scratch slot) is theirs to race on. */
static void rf_delta_step(float *pool, const int64_t *slots, int64_t rows, int64_t heads, int64_t dk, int64_t dv,
                          const float *q, const float *k, const float *v, const float *g, const float *beta,
                          float *out)
{
    const int64_t units = rows * heads;
#pragma omp parallel for schedule(static) if (units > 1 && units * dk * dv >= 32768)
    for (int64_t u = 0; u < units; u++) {
        const int64_t r = u / heads, h = u % heads;
        rf_delta_head(pool + (slots[r] * heads + h) * dk * dv, dk, dv, q + u * dk, k + u * dk, v + u * dv,
                      expf(g[u]), beta[u], out + u * dv);
    }
}

/* One sequence's n tokens from `state` [heads][dk][dv] (updated in place): q, k [n][heads][dk]; v, out
 * [n][heads][dv]; g, beta [n][heads]. Each head's tokens in order, its 64 KiB state staying in L2 from one to the
 * next: the chunked form's arithmetic (about 4 dk dv a token and head either way) without its triangular solves;
 * heads split with OpenMP. */
static void rf_delta_sequence(float *state, int64_t n, int64_t heads, int64_t dk, int64_t dv, const float *q,
                              const float *k, const float *v, const float *g, const float *beta, float *out)
{
#pragma omp parallel for schedule(static) if (heads > 1 && n * dk * dv >= 32768)
    for (int64_t h = 0; h < heads; h++) {
        float *s = state + h * dk * dv;
        for (int64_t t = 0; t < n; t++) {
            const int64_t u = t * heads + h;
            rf_delta_head(s, dk, dv, q + u * dk, k + u * dk, v + u * dv, expf(g[u]), beta[u], out + u * dv);
        }
    }
}

#endif
