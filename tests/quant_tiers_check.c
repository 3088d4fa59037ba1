/* Every tier of csrc/quant_kernels.h that this CPU runs against the portable scalar tier (the AMX tier, from the
 * rows where it takes numbers of its own (rf_quant_own_rows), against the exact sums of the weights' values), on
 * random tiles (the kernels read tiles as bytes: any bytes are a valid tile) with fp16 scales and random integer
 * sub-scales and mins (their whole range, the 6-bit edges included), fp32 and bf16 activations and outputs, every
 * format, 1, 6, 7 and 31 rows (the 256-bit tiles' bodies of 1-4 rows; and 77 where a tier has a path of its own: AMX's
 * passes take 64, AVX2's FMAs 4 rows), a partial tile, an all-zero block, and a linear of three parts in three
 * formats; the activations as two digits and as one (each against the scalar tier's same digits); a mixture of
 * experts' one call (rf_quant_experts) against the scalar tier's. Built by the suite natively and with an aarch64 cross compiler (run
 * under qemu-user) to check the NEON tier where no ARM machine is at hand.
 *
 *     quant_tiers_check [--quick] [TIER ...]    exit 0: every tier agrees; 1: one does not; 2: a named tier does
 *                                               not run (--quick: the two smaller shapes and 1-31 rows)
 * Its last line is "N passed, N failed" (one per tier and case). */
#include <stdio.h>
#include <string.h>

#include "quant_experts.h"   /* quant_kernels.h and a mixture of experts' one call over them */

static const char *NAMES[RF_TIERS] = {"scalar", "avx2", "avxvnni", "avx512vnni", "neon", "amx"};
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

/* y [B, N] in double: the weights' own numbers (s q + m in fp32, as the scalar tier's rf_quant_rows makes them)
 * times the activations, + bias: what the AMX tier, whose numbers are not the two digits', is checked against */
static double *sums(const rf_qweights *parts, int nparts, const void *x, int bf16, const float *bias, int64_t B,
                    int64_t K) {
    int64_t N = 0, G = K / RF_QG;
    for (int p = 0; p < nparts; p++) N += parts[p].n;
    double *y = calloc((size_t)(B * N), sizeof *y);
    float *w = malloc((size_t)K * 4);
    for (int p = 0, c0 = 0; p < nparts; c0 += (int)parts[p].n, p++)
        for (int64_t n = 0; n < parts[p].n; n++) {
            int64_t id = n;
            rf_quant_rows(&parts[p], &id, 1, K, w, 0);
            for (int64_t b = 0; b < B; b++) {
                double acc = bias[c0 + n];
                for (int64_t k = 0; k < K; k++) acc += (double)w[k] * value(x, bf16, b * K + k);
                y[b * N + c0 + n] = acc;
            }
        }
    free(w);
    return y;
}

/* A mixture of experts' one call (rf_quant_experts) on tier t against the scalar tier's: 5 experts (Q4_K gate|up,
 * Q6_K down, H = I = 256; expert 3 never picked), top-2 of T rows (7: a few rows an expert; 40: enough for a tier's
 * own path), fp32 and bf16, two digits and one. Returns the failures; adds the cases to *cases. */
static int check_experts(int t, int *cases, double *worst) {
    enum { E = 5, H = 256, I = 256, TOPK = 2 };
    int64_t G = H / RF_QG, tiles[2] = {2 * I / RF_QROWS, H / RF_QROWS};
    int fmts[2] = {RF_FMT_Q4_K, RF_FMT_Q6_K}, failed = 0;
    rf_qweights w[2][E];
    const rf_qweights *pw[2][E];
    int np[E];
    void *owned[2 * E * 3];
    int nowned = 0;
    for (int l = 0; l < 2; l++)
        for (int e = 0; e < E; e++) {
            int fmt = fmts[l];
            size_t wn = (size_t)(tiles[l] * G * rf_q_block_bytes(fmt)), sn = (size_t)(tiles[l] * (G / 8) * RF_QROWS);
            size_t cn = (size_t)(tiles[l] * G * RF_QROWS * 2);
            uint8_t *b = malloc(wn + 2 * cn);
            uint16_t *d = malloc(sn * 4);
            for (size_t i = 0; i < wn + 2 * cn; i++) b[i] = (uint8_t)(i >= wn && fmt != RF_FMT_Q6_K ? next32() % 64 : next32());
            for (size_t i = 0; i < 2 * sn; i++) d[i] = half(0);
            rf_qweights q = {fmt, tiles[l] * RF_QROWS, b, d, fmt == RF_FMT_Q4_K ? d + sn : 0, b + wn,
                             fmt == RF_FMT_Q4_K ? b + wn + cn : 0};
            w[l][e] = q;
            pw[l][e] = &w[l][e];
            np[e] = 1;
            owned[nowned++] = b;
            owned[nowned++] = d;
        }
    static const int64_t rows[2] = {7, 40};
    for (int r = 0; r < 2; r++)
        for (int bf16 = 0; bf16 < 2; bf16++)
            for (int dg = 2; dg >= 1; dg--) {
                int64_t T = rows[r], P = T * TOPK, counts[E] = {0}, order[2 * 40];
                float *x = malloc((size_t)(T * H) * 4), *wt = malloc((size_t)P * 4);
                uint16_t *xb = malloc((size_t)(T * H) * 2), *wb = malloc((size_t)P * 2);
                void *ys = malloc((size_t)(T * H) * 4), *yt = malloc((size_t)(T * H) * 4);
                int64_t picks[2 * 40];
                for (int64_t i = 0; i < T * H; i++) {
                    x[i] = uniform();
                    uint32_t u;
                    memcpy(&u, &x[i], 4);
                    xb[i] = (uint16_t)(u >> 16);
                }
                for (int64_t p = 0; p < P; p++) {   /* row p / 2's two experts: distinct, never 3 */
                    int64_t first = (p / TOPK) % 3, e = p % TOPK ? (first + 1 + (p / TOPK) % 2) % 3 : first;
                    picks[p] = e == 3 ? 4 : e;
                    if (p % TOPK && picks[p] == picks[p - 1]) picks[p] = 4;
                    counts[picks[p]]++;
                    wt[p] = (uniform() + 1.5f) / 3;
                    uint32_t u;
                    memcpy(&u, &wt[p], 4);
                    wb[p] = (uint16_t)(u >> 16);
                }
                for (int64_t e = 0, k = 0; e < E; e++)   /* the picks sorted by expert, stably */
                    for (int64_t p = 0; p < P; p++)
                        if (picks[p] == e) order[k++] = p;
                const void *xin = bf16 ? (const void *)xb : (const void *)x, *win = bf16 ? (const void *)wb : (const void *)wt;
                int rs = rf_quant_experts(RF_TIER_SCALAR, pw[0], np, pw[1], np, E, xin, bf16, T, H, I, order, counts, win,
                                          TOPK, ys, 0, dg);
                int rt = rf_quant_experts(t, pw[0], np, pw[1], np, E, xin, bf16, T, H, I, order, counts, win, TOPK, yt, 0,
                                          dg);
                double big = 0, diff = 0;
                for (int64_t i = 0; i < T * H; i++) {
                    double a = value(ys, bf16, i), v = value(yt, bf16, i);
                    big = fabs(a) > big ? fabs(a) : big;
                    diff = fabs(a - v) > diff ? fabs(a - v) : diff;
                }
                /* the activation's exp and a tier's own path (FMAs, tiles) round apart: the down linear's digits may
                 * then part by a step of 1/254 (two digits) or 1 (one) of a block's largest input */
                double tol = (bf16 ? 2e-2 : 1e-3) * (dg == 1 ? 8 : 1), rel = big > 0 ? diff / big : diff;
                *worst = rel > *worst ? rel : *worst;
                (*cases)++;
                if (rs || rt || rel > tol || big == 0) {
                    failed++;
                    printf("FAILED %s: experts, T=%lld %s, %d digit%s: rc %d/%d, max error %.3g of %.3g\n", NAMES[t],
                           (long long)T, bf16 ? "bf16" : "fp32", dg, dg == 1 ? "" : "s", rs, rt, diff, big);
                }
                free(x); free(wt); free(xb); free(wb); free(ys); free(yt);
            }
    for (int i = 0; i < nowned; i++) free(owned[i]);
    return failed;
}

int main(int argc, char **argv) {
    int quick = 0;   /* --quick: the two smaller shapes and 1-31 rows (under an x86 emulator) */
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--quick")) {
            quick = 1;
            continue;
        }
        int found = 0;
        for (int t = 0; t < RF_TIERS; t++)
            if (!strcmp(argv[a], NAMES[t])) found = rf_quant_tier_ok(t) ? 1 : -1;
        if (found != 1) {
            printf("%s: %s\n", argv[a], found ? "this CPU does not run it" : "no such tier");
            return 2;
        }
    }
    static const int64_t shapes[][2] = {{40, 256}, {96, 768}, {576, 1536}};
    static const int64_t batches[] = {1, 6, 7, 31, 77};   /* 6 = 4 + 2, 7 = 4 + 3 */
    static const char *FMT[RF_FMTS + 1] = {"Q4_1", "Q8_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1|Q6_K|Q5_0"};
    int passed = 0, failed = 0;
    for (int t = 1; t < RF_TIERS; t++) {
        if (!rf_quant_tier_ok(t)) {
            printf("%s: not run by this CPU\n", NAMES[t]);
            continue;
        }
        double worst = 0;
        int cases = 0;
        uint64_t hash = 1469598103934665603ull;   /* FNV-1a over every output's bytes: two paths that must make the
                                                   * same outputs (the NEON tier's sdot and smmla) compare by it */
        for (int s = 0; s < (quick ? 2 : 3); s++)
            for (int bi = 0; bi < (rf_quant_own_rows(t, 0, 2) && !quick ? 5 : 4); bi++)   /* 77: AMX's 64-row passes, AVX2's 4 */
                for (int f = 0; f <= RF_FMTS; f++)   /* the last: three parts of three formats */
                    for (int bf16 = 0; bf16 < 2; bf16++) {
                        int64_t N = shapes[s][0], K = shapes[s][1], B = batches[bi], G = K / RF_QG;
                        int nparts = f < RF_FMTS ? 1 : 3;
                        static const int mixed[3] = {RF_FMT_Q5_1, RF_FMT_Q6_K, RF_FMT_Q5_0};
                        rf_qweights parts[3];
                        void *owned[16];
                        int nowned = 0;
                        for (int p = 0; p < nparts; p++) {
                            int fmt = f < RF_FMTS ? f : mixed[p];
                            int64_t n = nparts == 1 ? N : (p == 1 ? N / 2 + 3 : N / 4), tiles = (n + RF_QROWS - 1) / RF_QROWS;
                            int64_t per = rf_q_kformat(fmt) ? G / 8 : G;
                            size_t wn = (size_t)(tiles * G * rf_q_block_bytes(fmt)), sn = (size_t)(tiles * per * RF_QROWS);
                            size_t cn = (size_t)(tiles * G * RF_QROWS * 2);
                            uint8_t *w = malloc(wn), *sc = malloc(cn), *mn = malloc(cn);
                            uint16_t *d = malloc(sn * 2), *m = malloc(sn * 2);
                            for (size_t i = 0; i < wn; i++) w[i] = (uint8_t)next32();
                            for (size_t i = 0; i < sn; i++) {
                                d[i] = half(0);
                                m[i] = half(fmt < RF_FMT_Q4_K);   /* Q4_1/Q5_1 mins are negative; K's dmin positive */
                            }
                            for (size_t i = 0; i < cn; i++) {   /* 6-bit K scales and mins, 0 and 63 included */
                                sc[i] = (uint8_t)(fmt == RF_FMT_Q6_K ? next32() : (i % 7 ? next32() % 64 : (i % 2) * 63));
                                mn[i] = (uint8_t)(i % 5 ? next32() % 64 : (i % 2) * 63);
                            }
                            rf_qweights q = {fmt, n, w, d, rf_q_has_min(fmt) ? m : 0,
                                             rf_q_kformat(fmt) ? sc : 0, fmt == RF_FMT_Q4_K || fmt == RF_FMT_Q5_K ? mn : 0};
                            parts[p] = q;
                            owned[nowned++] = w; owned[nowned++] = sc; owned[nowned++] = mn;
                            owned[nowned++] = d; owned[nowned++] = m;
                        }
                        int64_t NT = 0;
                        for (int p = 0; p < nparts; p++) NT += parts[p].n;
                        float *x = malloc((size_t)(B * K) * 4), *bias = malloc((size_t)NT * 4);
                        uint16_t *xb = malloc((size_t)(B * K) * 2);
                        void *ys = malloc((size_t)(B * NT) * 4), *yt = malloc((size_t)(B * NT) * 4);
                        for (int64_t i = 0; i < B * K; i++) {
                            x[i] = uniform() * (1 + (float)(i / K % 4));
                            if (i < RF_QG) x[i] = 0.f;   /* an all-zero block: scale 0 */
                            uint32_t u;
                            memcpy(&u, &x[i], 4);
                            xb[i] = (uint16_t)(u >> 16);
                        }
                        for (int64_t i = 0; i < NT; i++) bias[i] = uniform();
                        const void *xin = bf16 ? (const void *)xb : (const void *)x;
                        for (int dg = 2; dg >= 1; dg--) {   /* the activations' digits: two, then one */
                        int rs = rf_quant_linear_rows(RF_TIER_SCALAR, parts, nparts, bias, xin, bf16, B, K, ys, bf16, 0, dg);
                        int own = rf_quant_own_rows(t, bf16, dg), two = own && B >= own;
                        double *exact = two ? sums(parts, nparts, xin, bf16, bias, B, K) : 0;
                        /* where the rows pick the tier's own path, the same rows on its other path too (path_rows 1:
                         * a one-sequence step's), against the scalar tier */
                        for (int other = 0; other <= two; other++) {
                            int rt = rf_quant_linear_rows(t, parts, nparts, bias, xin, bf16, B, K, yt, bf16, other, dg);
                            double big = 0, diff = 0;
                            for (int64_t i = 0; i < B * NT; i++) {
                                double r = exact && !other ? exact[i] : value(ys, bf16, i), v = value(yt, bf16, i);
                                big = fabs(r) > big ? fabs(r) : big;
                                diff = fabs(r - v) > diff ? fabs(r - v) : diff;
                            }
                            for (int64_t i = 0; i < B * NT * (bf16 ? 2 : 4); i++)
                                hash = (hash ^ ((const uint8_t *)yt)[i]) * 1099511628211ull;
                            double tol = bf16 ? 8e-3 : 2e-5, rel = big > 0 ? diff / big : diff;
                            worst = rel > worst ? rel : worst;
                            cases++;
                            if (rs || rt || rel > tol) {
                                failed++;
                                printf("FAILED %s: N=%lld K=%lld B=%lld%s %s %s, %d digit%s: rc %d/%d, max error %.3g of %.3g\n",
                                       NAMES[t], (long long)NT, (long long)K, (long long)B, other ? " (path of 1 row)" : "",
                                       FMT[f], bf16 ? "bf16" : "fp32", dg, dg == 1 ? "" : "s", rs, rt, diff, big);
                            } else {
                                passed++;
                            }
                        }
                        free(exact);
                        }
                        for (int i = 0; i < nowned; i++) free(owned[i]);
                        free(x); free(xb); free(bias); free(ys); free(yt);
                    }
        int before = cases, wrong = check_experts(t, &cases, &worst);
        failed += wrong;
        passed += cases - before - wrong;
        const char *path = "";
#ifdef RF_NEON_TIERS
        if (t == RF_TIER_NEON) path = rf_cpu_has_i8mm() ? " (smmla for row pairs)" : " (sdot)";
#endif
        printf("%s: %d cases against scalar%s, worst relative error %.2g, outputs' hash %016llx\n", NAMES[t], cases,
               path, worst, (unsigned long long)hash);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
