/* Every tier of csrc/quant_kernels.h that this CPU runs against the portable scalar tier, on random tiles (the
 * kernels read tiles as bytes: any bytes are a valid tile) with fp16 scales, fp32 and bf16 activations and
 * outputs, Q4_1 and Q8_0, 1, 5 and 32 rows, a partial tile and an all-zero block. Built by the suite natively and
 * with an aarch64 cross compiler (run under qemu-user) to check the NEON tier where no ARM machine is at hand.
 *
 *     quant_tiers_check [TIER ...]    exit 0: every tier agrees; 1: one does not; 2: a named tier does not run
 * Its last line is "N passed, N failed" (one per tier and case). */
#include <stdio.h>
#include <string.h>

#include "quant_kernels.h"

static const char *NAMES[RF_TIERS] = {"scalar", "avx2", "avxvnni", "avx512vnni", "neon"};
static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint32_t next32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static float uniform(void) { return (float)(next32() & 0xFFFFFF) / 16777216.0f * 2.f - 1.f; }

/* an fp16 of magnitude 2^-8 .. 2^-4 (a Q4_1 / Q8_0 scale's range for weights near 0.05), sign as asked */
static uint16_t half(int negative) {
    return (uint16_t)((negative ? 0x8000u : 0u) | ((7u + next32() % 5u) << 10) | (next32() & 0x3FFu));
}

static float value(const void *y, int bf16, int64_t i) {
    if (!bf16) return ((const float *)y)[i];
    uint32_t u = (uint32_t)((const uint16_t *)y)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

int main(int argc, char **argv) {
    for (int a = 1; a < argc; a++) {
        int found = 0;
        for (int t = 0; t < RF_TIERS; t++)
            if (!strcmp(argv[a], NAMES[t])) found = rf_quant_tier_ok(t) ? 1 : -1;
        if (found != 1) {
            printf("%s: %s\n", argv[a], found ? "this CPU does not run it" : "no such tier");
            return 2;
        }
    }
    static const int64_t shapes[][2] = {{40, 64}, {96, 576}, {576, 1536}};
    static const int64_t batches[] = {1, 5, 32};
    int passed = 0, failed = 0;
    for (int t = 1; t < RF_TIERS; t++) {
        if (!rf_quant_tier_ok(t)) {
            printf("%s: not run by this CPU\n", NAMES[t]);
            continue;
        }
        double worst = 0;
        for (int s = 0; s < 3; s++)
            for (int bi = 0; bi < 3; bi++)
                for (int q8 = 0; q8 < 2; q8++)
                    for (int bf16 = 0; bf16 < 2; bf16++) {
                        int64_t N = shapes[s][0], K = shapes[s][1], B = batches[bi], G = K / RF_QG;
                        int64_t tiles = (N + RF_QROWS - 1) / RF_QROWS;
                        size_t wn = (size_t)(tiles * G * (q8 ? 512 : 256)), sn = (size_t)(tiles * G * RF_QROWS);
                        uint8_t *w = malloc(wn);
                        uint16_t *d = malloc(sn * 2), *m = malloc(sn * 2);
                        float *x = malloc((size_t)(B * K) * 4), *bias = malloc((size_t)N * 4);
                        uint16_t *xb = malloc((size_t)(B * K) * 2);
                        void *ys = malloc((size_t)(B * N) * 4), *yt = malloc((size_t)(B * N) * 4);
                        for (size_t i = 0; i < wn; i++) w[i] = (uint8_t)next32();
                        for (size_t i = 0; i < sn; i++) {
                            d[i] = half(0);
                            m[i] = half(1);
                        }
                        for (int64_t i = 0; i < B * K; i++) {
                            x[i] = uniform() * (1 + (float)(i / K % 4));
                            if (i < RF_QG) x[i] = 0.f;   /* an all-zero block: scale 0 */
                            uint32_t u;
                            memcpy(&u, &x[i], 4);
                            xb[i] = (uint16_t)(u >> 16);
                        }
                        for (int64_t i = 0; i < N; i++) bias[i] = uniform();
                        const void *xin = bf16 ? (const void *)xb : (const void *)x;
                        int rs = rf_quant_linear(RF_TIER_SCALAR, q8, w, d, q8 ? 0 : m, bias, xin, bf16, B, N, K, ys, bf16);
                        int rt = rf_quant_linear(t, q8, w, d, q8 ? 0 : m, bias, xin, bf16, B, N, K, yt, bf16);
                        double big = 0, diff = 0;
                        for (int64_t i = 0; i < B * N; i++) {
                            double r = value(ys, bf16, i), v = value(yt, bf16, i);
                            big = fabs(r) > big ? fabs(r) : big;
                            diff = fabs(r - v) > diff ? fabs(r - v) : diff;
                        }
                        double tol = bf16 ? 8e-3 : 2e-5, rel = big > 0 ? diff / big : diff;
                        worst = rel > worst ? rel : worst;
                        if (rs || rt || rel > tol) {
                            failed++;
                            printf("FAILED %s: N=%lld K=%lld B=%lld %s %s: rc %d/%d, max error %.3g of %.3g\n", NAMES[t],
                                   (long long)N, (long long)K, (long long)B, q8 ? "Q8_0" : "Q4_1", bf16 ? "bf16" : "fp32",
                                   rs, rt, diff, big);
                        } else {
                            passed++;
                        }
                        free(w); free(d); free(m); free(x); free(xb); free(bias); free(ys); free(yt);
                    }
        printf("%s: 36 cases against scalar, worst relative error %.2g\n", NAMES[t], worst);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
