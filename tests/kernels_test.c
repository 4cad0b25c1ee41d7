/* kernels_test.c - every SIMD kernel in simd.c against the plain C loops in glm.c, on
 * random inputs whose lengths are not multiples of the vector width.
 * Built and run by tests/test_kernels.sh. */
#undef main /* the build renames glm.c's main so this one links */
#include "../glm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t)(rng >> 11); }
static float rndf(void) { return (float)((rnd() & 0xFFFFFF) / 8388608.0 - 1.0); }

static void check(const char *what, int ok, double err) {
    if (ok) passed++;
    else { failed++; printf("FAIL %s (error %.3g)\n", what, err); }
}

/* A random matrix in one format; the caller frees w and scale. */
static Mat make_mat(WeightFormat fmt, int rows, int cols, void **w, void **scale) {
    Mat W = {0};
    W.fmt = fmt; W.rows = rows; W.cols = cols;
    size_t n = (size_t)rows * cols;
    if (fmt == WF_F32) { float *p = malloc(n * 4); for (size_t i = 0; i < n; i++) p[i] = rndf(); *w = p; *scale = NULL; }
    if (fmt == WF_BF16) { uint16_t *p = malloc(n * 2); for (size_t i = 0; i < n; i++) p[i] = f32_to_bf16(rndf()); *w = p; *scale = NULL; }
    if (fmt == WF_FP8) { /* every code but NaN, subnormals included; block scales vary */
        uint8_t *p = malloc(n); for (size_t i = 0; i < n; i++) { do p[i] = (uint8_t)rnd(); while ((p[i] & 0x7F) == 0x7F); }
        int nb = ((rows + 127) / 128) * ((cols + 127) / 128);
        float *s = malloc((size_t)nb * 4); for (int i = 0; i < nb; i++) s[i] = ldexpf(1.0f + rndf() * 0.5f, -(int)(rnd() % 12));
        *w = p; *scale = s; W.fp8_scale = s;
    }
    if (fmt == WF_MXFP4) {
        uint8_t *p = malloc(n / 2); for (size_t i = 0; i < n / 2; i++) p[i] = (uint8_t)rnd();
        uint8_t *s = malloc(n / 32); for (size_t i = 0; i < n / 32; i++) s[i] = (uint8_t)(115 + rnd() % 20);
        *w = p; *scale = s; W.mx_scale = s;
    }
    W.w = *w;
    return W;
}

static int test_set(const char *want);

static int g_sanitized; /* under ASan + UBSan (SAN=1): the widest rows left to the plain run */

int main(int argc, char **argv) {
    g_sanitized = argc > 1 && !strcmp(argv[1], "--sanitized");
    number_tables_init();
    test_set("avx2"); /* the fallback set, forced */
    test_set(NULL);   /* the best set this CPU has */
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}

/* Compares one kernel set with the plain loops; entries it lacks are skipped. */
static int test_set(const char *want) {
    kernels_init(want);
    Kernels simd = kernels;
    if (!simd.matvec) { printf("no SIMD kernels for '%s' on this CPU\n", want ? want : "best"); return 0; }
    printf("comparing %s kernels with the plain C loops\n", simd.name);
    const char *names[] = {"F32", "BF16", "FP8", "MXFP4"};
    const int rows_list[] = {1, 3, 4, 5, 9, 130};
    const int cols_any[] = {1, 7, 16, 17, 31, 100, 128, 129, 300, 1000, 384, 6144, 8225, 16384}; /* wide rows: x no longer fits L1 beside the stream */
    const int cols_32[] = {32, 64, 96, 160, 288, 544, 1024, 2080};
    for (int f = 0; f < 4; f++) {
        const int *cl = f == WF_MXFP4 ? cols_32 : cols_any;
        int ncl = f == WF_MXFP4 ? (int)(sizeof cols_32 / sizeof *cols_32) : (int)(sizeof cols_any / sizeof *cols_any);
        for (int ri = 0; ri < (int)(sizeof rows_list / sizeof *rows_list); ri++)
            for (int ci = 0; ci < ncl; ci++) {
                int rows = rows_list[ri], cols = cl[ci];
                if (g_sanitized && rows * cols > 130 * 1000) continue; /* ~10x slower there; the plain run has them */
                void *w = NULL, *sc = NULL;
                Mat W = make_mat((WeightFormat)f, rows, cols, &w, &sc);
                float *x = malloc((size_t)cols * 4), *xs = malloc((size_t)cols * 4 + 4), *y = malloc((size_t)rows * 4);
                float *plain = malloc((size_t)cols * 4), *fast = malloc((size_t)cols * 4);
                for (int i = 0; i < cols; i++) x[i] = rndf() * 4;
                matvec_split_x(&W, x, xs);
                /* matvec over a row range that does not start at 0 */
                int r0 = rows > 2 ? 1 : 0, nr = rows - r0;
                simd.matvec(&W, r0, nr, x, xs, y);
                double worst = 0, worst_deq = 0;
                for (int r = r0; r < rows; r++) {
                    kernels.dequant_row = NULL; /* the plain loop */
                    mat_dequant_row(&W, r, plain);
                    kernels = simd;
                    if (simd.dequant_row) simd.dequant_row(&W, r, fast);
                    else memcpy(fast, plain, (size_t)cols * 4);
                    double ref = 0, mag = 0;
                    for (int i = 0; i < cols; i++) {
                        ref += (double)plain[i] * x[i];
                        mag += fabs((double)plain[i] * x[i]);
                        double d = fabs((double)plain[i] - fast[i]);
                        if (d > worst_deq && !(isnan(plain[i]) && isnan(fast[i]))) worst_deq = d;
                    }
                    double e = fabs(ref - y[r - r0]) / (mag + 1e-30);
                    if (e > worst) worst = e;
                }
                char what[96];
                snprintf(what, sizeof what, "%s matvec %s %dx%d", simd.name, names[f], rows, cols);
                check(what, worst < 1e-5, worst);
                snprintf(what, sizeof what, "dequant_row %s %dx%d", names[f], rows, cols);
                check(what, worst_deq == 0, worst_deq);
                if (simd.matvec_n) {
                    /* n tokens at once: each token's results bit for bit its one-token
                     * matvec's, for n around the kernel's groups of 4 up to 16 */
                    const int ns[] = {3, 5, 16};
                    for (int q = 0; q < 3; q++) {
                        const int n = ns[q];
                        const size_t ld = (size_t)cols + 8; /* rows of x and xs apart, not the width */
                        float *xt = malloc((size_t)n * ld * 4), *st = malloc((size_t)n * ld * 4);
                        float *yn = malloc((size_t)n * nr * 4), *y1 = malloc((size_t)nr * 4);
                        for (int t = 0; t < n; t++) {
                            for (int i = 0; i < cols; i++) xt[(size_t)t * ld + i] = rndf();
                            matvec_split_x(&W, xt + (size_t)t * ld, st + (size_t)t * ld);
                        }
                        simd.matvec_n(&W, r0, nr, xt, ld, st, ld, n, yn, (size_t)nr);
                        int same = 1;
                        for (int t = 0; t < n; t++) {
                            simd.matvec(&W, r0, nr, xt + (size_t)t * ld, st + (size_t)t * ld, y1);
                            same &= !memcmp(y1, yn + (size_t)t * nr, (size_t)nr * 4);
                        }
                        snprintf(what, sizeof what, "%s matvec_n %s %dx%d n=%d", simd.name, names[f], rows, cols, n);
                        check(what, same, same ? 0 : 1);
                        free(xt); free(st); free(yn); free(y1);
                    }
                }
                if (simd.matvec_n_packed) {
                    /* the same with the tokens' x packed (pack_tokens_x), n across the
                     * kernel's groups of 8, the rows of x taken through an index */
                    const int ns[] = {2, 8, 13};
                    for (int q = 0; q < 3; q++) {
                        const int n = ns[q];
                        const size_t ld = (size_t)cols + 8;
                        float *xt = malloc((size_t)n * ld * 4), *st = malloc((size_t)n * ld * 4), *xp = malloc((size_t)n * PACKED_X_FLOATS(cols) * 4);
                        float *yn = malloc((size_t)n * nr * 4), *y1 = malloc((size_t)nr * 4);
                        int idx[16];
                        for (int t = 0; t < n; t++) {
                            idx[t] = n - 1 - t; /* token t is row n-1-t of xt */
                            for (int i = 0; i < cols; i++) xt[(size_t)t * ld + i] = rndf();
                            matvec_split_x(&W, xt + (size_t)t * ld, st + (size_t)t * ld);
                        }
                        pack_tokens_x(&W, xt, ld, idx, n, xp);
                        simd.matvec_n_packed(&W, r0, nr, xp, n, yn, (size_t)nr);
                        int same = 1;
                        for (int t = 0; t < n; t++) {
                            simd.matvec(&W, r0, nr, xt + (size_t)idx[t] * ld, st + (size_t)idx[t] * ld, y1);
                            same &= !memcmp(y1, yn + (size_t)t * nr, (size_t)nr * 4);
                        }
                        snprintf(what, sizeof what, "%s matvec_n_packed %s %dx%d n=%d", simd.name, names[f], rows, cols, n);
                        check(what, same, same ? 0 : 1);
                        free(xt); free(st); free(xp); free(yn); free(y1);
                    }
                }
                if (simd.matvec_bf16 && f != WF_F32) {
                    /* against the plain loop on x rounded to bf16 (FP8: x * 2^64 rounded, then
                     * / 2^64) with E4M3 subnormals as zero: the kernel's documented numerics */
                    const float mult = f == WF_FP8 ? 0x1p64f : 1.0f;
                    float *xo = malloc((size_t)((cols + 127) & ~127) * 4); /* exactly what it may read */
                    matvec_order_bf16(&W, x, xo);
                    simd.matvec_bf16(&W, r0, nr, xo, y);
                    double worst_b = 0;
                    for (int r = r0; r < rows; r++) {
                        kernels.dequant_row = NULL;
                        mat_dequant_row(&W, r, plain);
                        kernels = simd;
                        double ref = 0, mag = 0;
                        for (int i = 0; i < cols; i++) {
                            double xr = bf16_to_f32(f32_to_bf16(x[i] * mult)) / mult, wv = plain[i];
                            if (f == WF_FP8 && (((const uint8_t *)w)[(size_t)r * cols + i] & 0x78) == 0) wv = 0;
                            ref += wv * xr;
                            mag += fabs(wv * xr);
                        }
                        double e = fabs(ref - y[r - r0]) / (mag + 1e-30);
                        if (e > worst_b) worst_b = e;
                    }
                    snprintf(what, sizeof what, "%s matvec_bf16 %s %dx%d", simd.name, names[f], rows, cols);
                    check(what, worst_b < 1e-5, worst_b);
                    if (simd.matvec_bf16_n) {
                        /* n tokens at once: each token's results bit for bit its one-token
                         * matvec_bf16's (glm serve's batch invariance), for n around the
                         * kernel's groups of 4 up to glm serve's 16-row batches, and odd row
                         * counts (FP8 pairs rows) */
                        const int np = (cols + 127) & ~127, ns[] = {2, 3, 5, 8, 16};
                        for (int q = 0; q < 5; q++) {
                            const int n = ns[q];
                            uint16_t *xb = calloc((size_t)n * np, 2);
                            float *xt = malloc((size_t)n * cols * 4), *yn = malloc((size_t)n * nr * 4), *y1 = malloc((size_t)nr * 4);
                            for (int i = 0; i < n * cols; i++) xt[i] = rndf();
                            for (int t = 0; t < n; t++) {
                                matvec_order_bf16(&W, xt + (size_t)t * cols, xo);
                                simd.round_bf16(xo, np, xb + (size_t)t * np, np);
                            }
                            simd.matvec_bf16_n(&W, r0, nr, xb, (size_t)np, n, yn, (size_t)nr);
                            int same = 1;
                            for (int t = 0; t < n; t++) {
                                matvec_order_bf16(&W, xt + (size_t)t * cols, xo);
                                simd.matvec_bf16(&W, r0, nr, xo, y1);
                                same &= !memcmp(y1, yn + (size_t)t * nr, (size_t)nr * 4);
                            }
                            snprintf(what, sizeof what, "%s matvec_bf16_n %s %dx%d n=%d", simd.name, names[f], rows, cols, n);
                            check(what, same, same ? 0 : 1);
                            free(xb); free(xt); free(yn); free(y1);
                        }
                    }
                    free(xo);
                }
                free(w); free(sc); free(x); free(xs); free(y); free(plain); free(fast);
            }
    }
    /* x times a block of BF16 rows (the one-token MLA absorb): column counts around the
     * 16-lane vectors and the 256-column passes, row blocks that do not start at 0 */
    const int mt_shape[][3] = {{1, 1, 0}, {3, 17, 1}, {9, 255, 2}, {20, 256, 3}, {12, 257, 5}, {130, 512, 2}, {40, 600, 7}};
    for (int c = 0; c < 7 && simd.matvec_transposed_bf16; c++) {
        int rows = mt_shape[c][0] + mt_shape[c][2], cols = mt_shape[c][1], r0 = mt_shape[c][2], nr = mt_shape[c][0];
        void *w = NULL, *sc = NULL;
        Mat W = make_mat(WF_BF16, rows, cols, &w, &sc);
        float *x = malloc((size_t)nr * 4), *y = malloc((size_t)cols * 4 + 64);
        for (int i = 0; i < nr; i++) x[i] = rndf() * 4;
        for (int j = 0; j < cols + 16; j++) y[j] = 0.5f; /* past cols: must stay untouched */
        simd.matvec_transposed_bf16(&W, r0, nr, x, y);
        double worst = 0;
        for (int j = 0; j < cols; j++) {
            double ref = 0, mag = 1e-30;
            for (int i = 0; i < nr; i++) {
                float v = bf16_to_f32(((const uint16_t *)w)[(size_t)(r0 + i) * cols + j]);
                ref += (double)v * x[i];
                mag += fabs((double)v * x[i]);
            }
            double e = fabs(ref - y[j]) / mag;
            if (e > worst) worst = e;
        }
        int untouched = 1;
        for (int j = cols; j < cols + 16; j++) untouched &= y[j] == 0.5f;
        char what[80];
        snprintf(what, sizeof what, "%s matvec_transposed_bf16 rows %d..%d x %d", simd.name, r0, r0 + nr - 1, cols);
        check(what, worst < 1e-5 && untouched, worst);
        free(w); free(sc); free(x); free(y);
    }
    /* the prefill micro-kernel: every token-group path (12, 4, 1) and partial panels */
    const int gemm_cases[][3] = {{1, 1, 32}, {5, 7, 17}, {17, 33, 32}, {29, 100, 9}, {64, 512, 32}, {3, 513, 16}};
    for (int c = 0; c < 12 && simd.gemm_panel; c++) { /* each case with ldp 32, then with a row stride of nj + 13 */
        int n = gemm_cases[c % 6][0], K = gemm_cases[c % 6][1], nj = gemm_cases[c % 6][2], ldx = K + 3, ldy = nj + 5;
        int ldp = c < 6 ? 32 : nj + 13;
        /* exactly K rows of ldp: a read past the last lane used shows under ASan */
        float *P = malloc((size_t)((K - 1) * ldp + nj) * 4), *X = malloc((size_t)n * ldx * 4), *Y = malloc((size_t)n * ldy * 4);
        for (int i = 0; i < (K - 1) * ldp + nj; i++) P[i] = rndf();
        for (int i = 0; i < n * ldx; i++) X[i] = rndf();
        for (int i = 0; i < n * ldy; i++) Y[i] = 0.5f;
        simd.gemm_panel(P, ldp, K, X, ldx, n, Y, ldy, nj);
        double worst = 0;
        int untouched = 1;
        for (int t = 0; t < n; t++) {
            for (int j = 0; j < nj; j++) {
                double ref = 0.5, mag = 0.5;
                for (int k = 0; k < K; k++) { ref += (double)P[k * ldp + j] * X[t * ldx + k]; mag += fabs((double)P[k * ldp + j] * X[t * ldx + k]); }
                double e = fabs(ref - Y[t * ldy + j]) / mag;
                if (e > worst) worst = e;
            }
            for (int j = nj; j < ldy; j++) untouched &= Y[t * ldy + j] == 0.5f; /* lanes past nj stay as they were */
        }
        char what[64];
        snprintf(what, sizeof what, "gemm_panel n=%d K=%d rows=%d ldp=%d", n, K, nj, ldp);
        check(what, worst < 1e-5 && untouched, worst);
        free(P); free(X); free(Y);
    }
    /* the panel transpose */
    for (int c = 0; c < 3 && simd.pack_panel; c++) {
        int K = (int[]){16, 48, 512}[c], ld = K + 8;
        float *rows = malloc((size_t)32 * ld * 4), *P = malloc((size_t)K * 32 * 4);
        for (int i = 0; i < 32 * ld; i++) rows[i] = rndf();
        simd.pack_panel(rows, ld, K, P);
        int bad = 0;
        for (int j = 0; j < 32; j++) for (int k = 0; k < K; k++) bad += P[k * 32 + j] != rows[j * ld + k];
        char what[64];
        snprintf(what, sizeof what, "pack_panel K=%d", K);
        check(what, bad == 0, bad);
        free(rows); free(P);
    }
    /* the bf16 panel of one k-chunk, straight from each file format: pairs of bf16 (round
     * to nearest even like f32_to_bf16) of the plain dequantized rows, zeros past nj rows
     * and past the last column */
    for (int f = 0; f < 4 && simd.build_panel_bf16; f++) {
        const int cases[][4] = {{37, 96, 32, 0}, {37, 96, 5, 0}, {40, 608, 32, 512}, {40, 608, 31, 0}, {33, 1056, 32, 544}};
        for (int c = 0; c < 5; c++) {
            int rows = cases[c][0], cols = cases[c][1], nj = cases[c][2], k0 = cases[c][3], r = rows - nj > 1 ? 1 : 0;
            int KP = (cols + 31) & ~31, kc = KP - k0 < 512 ? KP - k0 : 512;
            void *w = NULL, *sc = NULL;
            Mat W = make_mat((WeightFormat)f, rows, cols, &w, &sc);
            uint32_t *stage = malloc((size_t)32 * 256 * 4), *P = malloc((size_t)256 * 32 * 4);
            float *row = malloc((size_t)cols * 4);
            simd.build_panel_bf16(&W, r, nj, k0, kc, stage, P);
            int bad = 0;
            for (int j = 0; j < 32; j++) {
                if (j < nj) { kernels.dequant_row = NULL; mat_dequant_row(&W, r + j, row); kernels = simd; }
                for (int p = 0; p < kc / 2; p++) {
                    uint32_t want = 0;
                    for (int h = 0; h < 2; h++) {
                        int k = k0 + 2 * p + h;
                        if (j < nj && k < cols) want |= (uint32_t)f32_to_bf16(row[k]) << (16 * h);
                    }
                    bad += P[(size_t)p * 32 + j] != want;
                }
            }
            char what[96];
            snprintf(what, sizeof what, "build_panel_bf16 %s %dx%d rows %d+%d cols %d+%d", names[f], rows, cols, r, nj, k0, kc);
            check(what, bad == 0, bad);
            free(w); free(sc); free(stage); free(P); free(row);
        }
    }
    /* row pairs of a bf16 matrix interleaved into a panel (attention's k-major operands):
     * in place or through an index, odd K (the missing row is zero), nj < 32 */
    for (int c = 0; c < 6 && simd.pack_pairs_bf16; c++) {
        const int cases[][4] = {{128, 32, 0, 40}, {127, 32, 1, 40}, {1, 7, 0, 9}, {96, 32, 0, 512}, {33, 17, 1, 576}, {2, 1, 1, 35}};
        int K = cases[c][0], nj = cases[c][1], use_idx = cases[c][2], lda = cases[c][3], rows = 3 * K + 2;
        uint16_t *A = malloc((size_t)rows * lda * 2);
        uint32_t *P = malloc((size_t)(K + 1) / 2 * 32 * 4);
        int *idx = malloc((size_t)K * sizeof(int));
        for (int i = 0; i < rows * lda; i++) A[i] = (uint16_t)rnd();
        for (int k = 0; k < K; k++) idx[k] = (int)(rnd() % (unsigned)rows); /* repeats and any order */
        memset(P, 0xAB, (size_t)(K + 1) / 2 * 32 * 4);
        simd.pack_pairs_bf16(A, lda, use_idx ? idx : NULL, K, nj, P);
        int bad = 0;
        for (int p = 0; p < (K + 1) / 2; p++)
            for (int j = 0; j < 32; j++) {
                uint32_t want = 0;
                for (int h = 0; h < 2; h++) {
                    int k = 2 * p + h;
                    if (k < K && j < nj) want |= (uint32_t)A[(size_t)(use_idx ? idx[k] : k) * lda + j] << (16 * h);
                }
                bad += P[(size_t)p * 32 + j] != want;
            }
        char what[80];
        snprintf(what, sizeof what, "pack_pairs_bf16 K=%d nj=%d %s", K, nj, use_idx ? "indexed" : "in place");
        check(what, bad == 0, bad);
        free(A); free(P); free(idx);
    }
    /* the few-token bf16 product: rows dequantized to bf16 in registers' order, exact
     * products of bf16 inputs, fp32 sums */
    for (int f = 0; f < 4 && simd.gemm_rows_bf16; f++) {
        /* token counts with every remainder after the 6-token tiles (13, 7: 1; 8: 2; 3: 3; 10: 4; 17: 5) */
        const int cases[][3] = {{1, 32, 1}, {5, 96, 6}, {9, 608, 13}, {4, 100, 7}, {7, 1056, 12},
                                {3, 64, 8}, {6, 160, 3}, {5, 320, 10}, {8, 2080, 17}};
        for (int c = 0; c < 9; c++) {
            int rows = cases[c][0], cols = cases[c][1], n = cases[c][2], kp = (cols + 31) & ~31, ldy = rows + 3;
            if (f == WF_MXFP4 && cols % 32) continue;
            void *w = NULL, *sc = NULL;
            Mat W = make_mat((WeightFormat)f, rows, cols, &w, &sc);
            uint16_t *X = malloc((size_t)n * kp * 2), *wbuf = malloc((size_t)4 * kp * 2);
            float *Y = malloc((size_t)n * ldy * 4), *row = malloc((size_t)cols * 4);
            for (int i = 0; i < n * kp; i++) X[i] = (i % kp) < cols ? f32_to_bf16(rndf()) : 0;
            for (int i = 0; i < n * ldy; i++) Y[i] = 0.5f;
            int r0 = rows > 2 ? 1 : 0, nr = rows - r0;
            simd.gemm_rows_bf16(&W, r0, nr, X, kp, n, Y, ldy, wbuf);
            double worst = 0;
            int untouched = 1;
            for (int i = 0; i < nr; i++) {
                kernels.dequant_row = NULL; mat_dequant_row(&W, r0 + i, row); kernels = simd;
                for (int t = 0; t < n; t++) {
                    double ref = 0, mag = 1e-30;
                    for (int k = 0; k < cols; k++) {
                        double p = (double)bf16_to_f32(f32_to_bf16(row[k])) * bf16_to_f32(X[(size_t)t * kp + k]);
                        ref += p; mag += fabs(p);
                    }
                    double e = fabs(ref - Y[(size_t)t * ldy + i]) / mag;
                    if (e > worst) worst = e;
                }
            }
            for (int t = 0; t < n; t++) for (int i = nr; i < ldy; i++) untouched &= Y[(size_t)t * ldy + i] == 0.5f;
            char what[96];
            snprintf(what, sizeof what, "gemm_rows_bf16 %s rows %d+%d cols %d tokens %d", names[f], r0, nr, cols, n);
            check(what, worst < 1e-5 && untouched, worst);
            free(w); free(sc); free(X); free(wbuf); free(Y); free(row);
        }
    }
    /* activations to bf16 */
    for (int n = 1; n < 100 && simd.round_bf16; n += 17) {
        float x[100];
        uint16_t xb[128];
        for (int i = 0; i < n; i++) x[i] = rndf() * (float)(1 << (rnd() % 20));
        memset(xb, 0xFF, sizeof xb);
        simd.round_bf16(x, n, xb, 128);
        int bad = 0;
        for (int i = 0; i < 128; i++) bad += xb[i] != (i < n ? f32_to_bf16(x[i]) : 0);
        char what[64];
        snprintf(what, sizeof what, "round_bf16 n=%d", n);
        check(what, bad == 0, bad);
    }
    /* the bf16 micro-kernel: exact products of bf16 inputs, fp32 sums; token counts that
     * reach every tile (12, 8, 4, 1 tokens: 20 = 12 + 8, 47 = 3 x 12 + 8 + 3) */
    const int bf16_cases[][3] = {{1, 1, 32}, {5, 7, 17}, {17, 33, 32}, {29, 100, 9}, {64, 512, 32}, {3, 513, 16},
                                 {20, 64, 32}, {47, 96, 19}};
    for (int c = 0; c < 8 && simd.gemm_panel_bf16; c++) {
        int n = bf16_cases[c][0], K = (bf16_cases[c][1] + 1) & ~1, nj = bf16_cases[c][2], ldx = K + 4, ldy = nj + 5;
        uint16_t *P = malloc((size_t)K * 32 * 2), *X = malloc((size_t)n * ldx * 2);
        float *Y = malloc((size_t)n * ldy * 4);
        for (int i = 0; i < K * 32; i++) P[i] = f32_to_bf16(rndf());
        for (int i = 0; i < n * ldx; i++) X[i] = f32_to_bf16(rndf());
        for (int i = 0; i < n * ldy; i++) Y[i] = 0.5f;
        simd.gemm_panel_bf16(P, K, X, ldx, n, Y, ldy, nj);
        double worst = 0;
        for (int t = 0; t < n; t++)
            for (int j = 0; j < nj; j++) {
                double ref = 0.5, mag = 0.5;
                for (int k = 0; k < K; k++) {
                    double p = bf16_to_f32(P[(k / 2) * 64 + 2 * j + (k & 1)]) * (double)bf16_to_f32(X[t * ldx + k]);
                    ref += p; mag += fabs(p);
                }
                double e = fabs(ref - Y[t * ldy + j]) / mag;
                if (e > worst) worst = e;
            }
        char what[64];
        snprintf(what, sizeof what, "gemm_panel_bf16 n=%d K=%d rows=%d", n, K, nj);
        check(what, worst < 1e-5, worst);
        free(P); free(X); free(Y);
    }
    /* dot and axpy at odd lengths */
    for (int n = 1; n < 200; n += 13) {
        float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4), *y1 = malloc((size_t)n * 4), *y2 = malloc((size_t)n * 4);
        double ref = 0, mag = 0;
        for (int i = 0; i < n; i++) { a[i] = rndf(); b[i] = rndf(); y1[i] = y2[i] = rndf(); ref += (double)a[i] * b[i]; mag += fabs((double)a[i] * b[i]); }
        double e = fabs(simd.dot(a, b, n) - ref) / (mag + 1e-30);
        char what[64];
        snprintf(what, sizeof what, "dot n=%d", n);
        check(what, e < 1e-5, e);
        simd.axpy(y1, 0.37f, a, n);
        double ea = 0;
        for (int i = 0; i < n; i++) { y2[i] += 0.37f * a[i]; double d = fabs(y1[i] - y2[i]); if (d > ea) ea = d; }
        snprintf(what, sizeof what, "axpy n=%d", n);
        check(what, ea < 1e-6, ea);
        free(a); free(b); free(y1); free(y2);
    }
    /* softmax (attention's, over the selected keys) against double exp: lengths around the
     * vector width, random scores; a ramp from 0 to -105 that takes e^x through its whole
     * range down to zero; a NaN that must stay NaN */
    enum { RANDOM, RAMP, RAMP_NAN };
    const int sm_cases[][2] = {{1, RANDOM}, {2, RANDOM}, {15, RANDOM}, {16, RANDOM}, {17, RANDOM}, {31, RANDOM},
                               {100, RANDOM}, {2048, RANDOM}, {2049, RANDOM}, {2100, RAMP}, {2100, RAMP_NAN}};
    for (int c = 0; c < (int)(sizeof sm_cases / sizeof sm_cases[0]) && simd.softmax; c++) {
        int n = sm_cases[c][0], kind = sm_cases[c][1];
        float *x = malloc((size_t)n * 4);
        double *ref = malloc((size_t)n * 8), mx = -INFINITY, sum = 0;
        for (int i = 0; i < n; i++) x[i] = kind == RANDOM ? 30.0f * rndf() : -0.05f * (float)i;
        if (kind == RAMP_NAN) x[7] = NAN;
        for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
        for (int i = 0; i < n; i++) sum += ref[i] = exp((double)(x[i] - (float)mx)); /* the difference in fp32, as both loops take it */
        simd.softmax(x, n);
        double worst = 0;
        for (int i = 0; i < n && kind != RAMP_NAN; i++) {
            double e = fabs(x[i] - ref[i] / sum) / (ref[i] / sum + 1e-37 / 2e-6);
            if (e > worst) worst = e;
        }
        char what[64];
        snprintf(what, sizeof what, kind != RAMP_NAN ? "softmax n=%d" : "softmax n=%d with a NaN", n);
        if (kind != RAMP_NAN) check(what, worst < 5e-7, worst); /* measured up to 1.8e-7 */
        else check(what, isnan(x[0]) && isnan(x[7]), 0);
        free(x); free(ref);
    }
    /* the indexer's weighted ReLU sums: 32 head products a key, heads past nh zero (as
     * the GEMM leaves them), weights of both signs */
    const int ix_cases[][2] = {{1, 32}, {5, 32}, {256, 32}, {300, 8}, {17, 1}};
    for (int c = 0; c < (int)(sizeof ix_cases / sizeof ix_cases[0]) && simd.index_relu_sums; c++) {
        int n = ix_cases[c][0], nh = ix_cases[c][1];
        float *d = malloc((size_t)n * 32 * 4), wh[32] = {0}, *out = malloc((size_t)n * 4);
        for (int i = 0; i < n * 32; i++) d[i] = i % 32 < nh ? 4 * rndf() : 0.0f;
        for (int h = 0; h < nh; h++) wh[h] = rndf();
        simd.index_relu_sums(d, n, wh, 0.0883883f, out);
        double worst = 0;
        for (int j = 0; j < n; j++) {
            double ref = 0, mag = 1e-30;
            for (int h = 0; h < 32; h++) {
                double x = (double)(d[(size_t)j * 32 + h] * 0.0883883f), p = wh[h] * (x > 0 ? x : 0);
                ref += p; mag += fabs(p);
            }
            double e = fabs(out[j] - ref) / mag;
            if (e > worst) worst = e;
        }
        char what[64];
        snprintf(what, sizeof what, "index_relu_sums n=%d heads=%d", n, nh);
        check(what, worst < 1e-6, worst);
        free(d); free(out);
    }
    return 0;
}
