/* tests/gpu/kernel_test.c - every kernel of glm_hip.hip against glm.c's own op.
 *
 *   build/gpu_ktest64 [MODEL_DIR ...]   (also build/gpu_ktest32, build/hip-<arch>/gpu_ktest, build/cuda-<arch>/gpu_ktest)
 *
 * glm.c (the reference) is included whole, so the CPU side of each check is the very
 * function forward() uses, not a copy: matmul, rmsnorm, layernorm, rope, topk_select,
 * moe_route, sample, attention, swiglu, moe; `ops` keeps glm.c's plain entries here
 * (fast_init is not called), so the GPU is held to the reference itself. The GPU side goes through
 * the gpuk_* entry points at the end of glm_hip.hip. Under the emulation (make emu)
 * this runs on the CPU; linked against the HIP or CUDA build it runs on the GPU.
 *
 * Inputs are random (fixed seeds). Matrices are built in memory in every format,
 * with shapes that hit the vector and the element-by-element paths, row offsets, and
 * token counts for the matrix-vector (1, 3, 8) and the tiled kernels (9, 40). The
 * blocks of the forward pass (attention, MLP/MoE) run on each model given, layer by
 * layer, through a prefill chunk and then decode steps, so the indexer's top-k, the
 * shared-selection layers and the KV cache are exercised as forward() does.
 *
 * Prints "PASS name" / "FAIL name: why" per check, then "N passed, N failed".
 * GPU_KTEST_TOL scales every tolerance (a real GPU fuses multiply-adds).
 * GPU_KTEST_SAMPLE_BIG=0 leaves out the sampler's 200k-vocabulary draws (the emulation runs
 * them at one wave width only: their grid-stride loops are the same code at both).
 */
#include "../../glm.c"

#include <stdarg.h>

void gpuk_matmul_rows(float *y, const float *x, const Mat *W, int r0, int nr, int n);
void gpuk_embed(float *y, const Mat *E, const int *tokens, int n);
void gpuk_rmsnorm(float *y, const float *x, const float *w, int dim, int n, float eps);
void gpuk_add_rmsnorm(float *a, float *a_ref, float *x_out, const float *x, const float *y, const float *w, int dim, int n, float eps);
void gpuk_layernorm_rope(float *y, const float *x, const float *w, const float *b, int dim, int rope_dims, int pos, const float *table);
void gpuk_rope(float *v, int nvec, int stride, int off, int dims, int pos, const float *table);
void gpuk_topk(int *sel, const float *score, int n, int k);
void gpuk_moe_route(int *idx, float *w, const Config *c, const float *logits, const float *bias, int n);
void gpuk_silu_mul(float *h1, const float *h2, int n);
int gpuk_sample(const float *logits, int V, float temperature, float top_p, float u, float *probs);
void gpuk_argmax_rows(const float *logits, int V, int n, int *out);
double gpuk_time_gemm(const Mat *W, int n, int iters);
void gpuk_use_plain(int on);
void gpuk_gemv_split_min(int chunks);
void gpuk_sample_start_higher(int bins);
void gpuk_attention(GpuModel *g, int layer, const float *a, int n, int pos0, float *out, int *sel, int *n_sel);
void gpuk_mlp(GpuModel *g, int layer, const float *a, int n, float *out);
void gpuk_q_absorb(float *q_abs, const float *q, const Mat *kv_b, const Config *c, int n);
void gpuk_mla_attend(float *o_lat, const float *q_abs, const float *latent, int T, const int *sel, const int *n_sel, const Config *c, int n, int kmax,
                     int cus, int slices);
void gpuk_ix_scores(float *scores, const float *ix_q, const float *ix_w, const float *keys, int T, const Config *c, int n, int pos0);
void gpuk_mma_shape(int *m, int *n, int *k);
void gpuk_mma(float *d, const uint16_t *a, const uint16_t *b, const float *c);
void gpuk_gemm_mma(float *y, int ldy, size_t y_floats, const float *x, int ldx, size_t x_floats, const int *x_rows, const Mat *W, int r0, int nr, int n,
                   int nz, int zr, int zx, int zy, int skinny);

static int n_pass, n_fail;
static double g_tol = 1.0;

static void report(int ok, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void report(int ok, const char *name, const char *fmt, ...) {
    if (ok) { printf("PASS %s\n", name); n_pass++; return; }
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    printf("FAIL %s: %s\n", name, why);
    n_fail++;
}

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd32(void) { g_rng ^= g_rng >> 12; g_rng ^= g_rng << 25; g_rng ^= g_rng >> 27; return (uint32_t)((g_rng * 0x2545F4914F6CDD1Dull) >> 32); }
static float rndu(void) { return (float)(rnd32() >> 8) / 16777216.0f; }              /* [0, 1) */
static float rndn(void) { float s = 0; for (int i = 0; i < 4; i++) s += rndu(); return (s - 2.0f) * 1.7f; } /* ~N(0, 1) */
static void fill_n(float *x, size_t n, float scale) { for (size_t i = 0; i < n; i++) x[i] = rndn() * scale; }

/* worst relative L2 error over rows of `cols` */
static double rel_rows(const float *ref, const float *got, int rows, int cols) {
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        double d = 0, n = 0;
        for (int i = 0; i < cols; i++) {
            double a = ref[(size_t)r * cols + i], b = got[(size_t)r * cols + i];
            if (b != b) return INFINITY;
            d += (a - b) * (a - b);
            n += a * a;
        }
        double e = n > 0 ? sqrt(d / n) : sqrt(d);
        if (e > worst) worst = e;
    }
    return worst;
}

/* A random matrix in memory, in one of the file formats. */
typedef struct { Mat W; void *w, *s; } TMat;

static TMat make_mat(WeightFormat fmt, int rows, int cols) {
    TMat t;
    memset(&t, 0, sizeof t);
    t.W.fmt = fmt; t.W.rows = rows; t.W.cols = cols;
    size_t rc = (size_t)rows * cols;
    switch (fmt) {
    case WF_F32: { float *w = xmalloc(rc * 4); fill_n(w, rc, 0.1f); t.w = w; break; }
    case WF_BF16: { uint16_t *w = xmalloc(rc * 2); for (size_t i = 0; i < rc; i++) w[i] = f32_to_bf16(rndn() * 0.1f); t.w = w; break; }
    case WF_FP8: {
        uint8_t *w = xmalloc(rc);
        for (size_t i = 0; i < rc; i++) { uint8_t b = (uint8_t)rnd32(); if ((b & 0x7f) == 0x7f) b ^= 1; w[i] = b; } /* no NaN codes */
        int br = (rows + 127) / 128, bc = (cols + 127) / 128;
        float *s = xmalloc((size_t)br * bc * 4);
        for (int i = 0; i < br * bc; i++) s[i] = 0.001f * (1 + (int)(rnd32() % 8));
        t.w = w; t.s = s; t.W.fp8_scale = s;
        break;
    }
    case WF_MXFP4: {
        uint8_t *w = xmalloc(rc / 2), *s = xmalloc(rc / 32);
        for (size_t i = 0; i < rc / 2; i++) w[i] = (uint8_t)rnd32();
        for (size_t i = 0; i < rc / 32; i++) s[i] = (uint8_t)(120 + rnd32() % 8);
        t.w = w; t.s = s; t.W.mx_scale = s;
        break;
    }
    }
    t.W.w = t.w;
    t.W.bytes = fmt == WF_MXFP4 ? rc / 2 + rc / 32 : fmt == WF_FP8 ? rc : fmt == WF_BF16 ? rc * 2 : rc * 4;
    return t;
}
static void free_mat(TMat *t) { free(t->w); free(t->s); }

static const char *fmt_name[] = {"f32", "bf16", "fp8", "mxfp4"};

/* glm.c's matmul restricted to rows r0..r0+nr of W: y [n][nr]. */
static void matmul_row_range(float *y, const float *x, const Mat *W, int r0, int nr, int n) {
    float *all = xmalloc((size_t)n * W->rows * sizeof(float));
    matmul(all, x, W, n);
    for (int t = 0; t < n; t++) memcpy(y + (size_t)t * nr, all + (size_t)t * W->rows + r0, (size_t)nr * sizeof(float));
    free(all);
}

/* matmul: matrix-vector (n <= 8) and tiled (n > 8) kernels, every format, full
 * matrices and row ranges (the un-absorb reads rows of kv_b from an offset), with the
 * plain kernels, the fast ones (section 3b) and the fast ones split along k into as many
 * blocks as the shape allows. The plain ones sum in glm.c's order (2e-6 covers the
 * emulator's contracted multiply-adds); the fast ones in another (several partial sums
 * per lane, the splits): 1e-5. */
/* The prefill product on matrix cores (glm_hip.hip section 3c) takes x as bf16: against
 * glm.c's fp32 matmul it is off by the rounding of x (and of FP8/F32 weights): measured
 * up to 6.2e-3 relative L2 (the worst row) on these random inputs; against the same product
 * with x and W rounded to bf16 first it is off by the order of the fp32 sums only
 * (measured up to 1.0e-6, at 1024 columns). */
#define MMA_TOL_FP32 1e-2
#define MMA_TOL_BF16 4e-6

static void test_matmul_mode(const char *mode, double tol);
static void test_matmul(void) {
    static const char *mode_name[] = {"plain", "fast", "fast split"};
    for (int mode = 0; mode < 3; mode++) {
        gpuk_use_plain(mode == 0);
        gpuk_gemv_split_min(mode == 2 ? 1 : 0);
        test_matmul_mode(mode_name[mode], mode == 0 ? 2e-6 : 1e-5);
    }
    gpuk_use_plain(0);
    gpuk_gemv_split_min(0);
}

static void test_matmul_mode(const char *mode, double tol) {
    const int shapes[][2] = {{100, 160}, {37, 200}, {130, 96}, {64, 256}, {21, 1024}};
    const int ns[] = {1, 3, 8, 9, 40};
    for (int f = 0; f < 4; f++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            int rows = shapes[si][0], cols = shapes[si][1];
            if (f == WF_MXFP4 && cols % 32) continue;
            TMat t = make_mat((WeightFormat)f, rows, cols);
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                int n = ns[ni], r0 = si == 1 ? 5 : 0, nr = rows - r0 - (si == 1 ? 3 : 0);
                float *x = xmalloc((size_t)n * cols * 4), *ref = xmalloc((size_t)n * nr * 4), *got = xmalloc((size_t)n * nr * 4);
                fill_n(x, (size_t)n * cols, 1.0f);
                matmul_row_range(ref, x, &t.W, r0, nr, n);
                gpuk_matmul_rows(got, x, &t.W, r0, nr, n);
                double e = rel_rows(ref, got, n, nr);
                char name[96];
                snprintf(name, sizeof name, "matmul %s %s %dx%d rows %d+%d n=%d", mode, fmt_name[f], rows, cols, r0, nr, n);
                /* the fast modes' tiled product is the bf16 one (test_gemm_mma holds it to the bf16 product) */
                const double t = strcmp(mode, "plain") && n > 8 ? MMA_TOL_FP32 : tol;
                report(e <= t * g_tol, name, "rel L2 %.3g", e);
                free(x); free(ref); free(got);
            }
            free_mat(&t);
        }
}

/* A few tokens' product (a --draft verify step, n <= 8) gives each token the bits of its
 * one-token product (decode), for every format, at widths that take several of the fast
 * kernel's shared-memory pieces of x (fewer columns fit a piece for 8 tokens than for one)
 * and with the product split along k: then drafting changes no greedy token on the GPU
 * either. */
static void test_gemv_tokens_as_one(void) {
    const int shapes[][2] = {{24, 4096}, {9, 8192}};
    const int ns[] = {3, 8};
    for (int split = 0; split < 2; split++) {
        gpuk_gemv_split_min(split ? 1 : 0);
        for (int f = 1; f < 4; f++)
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                const int rows = shapes[si][0], cols = shapes[si][1];
                TMat t = make_mat((WeightFormat)f, rows, cols);
                for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                    const int n = ns[ni];
                    float *x = xmalloc((size_t)n * cols * 4), *yn = xmalloc((size_t)n * rows * 4), *y1 = xmalloc((size_t)rows * 4);
                    fill_n(x, (size_t)n * cols, 1.0f);
                    gpuk_matmul_rows(yn, x, &t.W, 0, rows, n);
                    int differ = 0;
                    for (int k = 0; k < n; k++) {
                        gpuk_matmul_rows(y1, x + (size_t)k * cols, &t.W, 0, rows, 1);
                        differ += memcmp(y1, yn + (size_t)k * rows, (size_t)rows * 4) != 0;
                    }
                    char name[96];
                    snprintf(name, sizeof name, "gemv %s%s %dx%d n=%d: each token's rows as its one-token product", fmt_name[f],
                             split ? " split" : "", rows, cols, n);
                    report(!differ, name, "%d of %d tokens differ", differ, n);
                    free(x); free(yn); free(y1);
                }
                free_mat(&t);
            }
    }
    gpuk_gemv_split_min(0);
}

/* The matrix instruction itself (gpuk_mma: one wave, one instruction, operands placed
 * per the documented layouts by mma_step): wave 64 runs AMD's v_mfma_f32_32x32x8_bf16,
 * wave 32 NVIDIA's mma.m16n8k16. Small integers (exact in bf16, every sum exact in fp32)
 * must come out exactly as plain loops give them; random bf16 values within fp32 rounding. */
static void test_mma_instr(void) {
    int M, N, K;
    gpuk_mma_shape(&M, &N, &K);
    uint16_t *a = xmalloc((size_t)M * K * 2), *b = xmalloc((size_t)K * N * 2);
    float *c = xmalloc((size_t)M * N * 4), *d = xmalloc((size_t)M * N * 4), *ref = xmalloc((size_t)M * N * 4);
    for (int kind = 0; kind < 2; kind++) {
        for (int i = 0; i < M * K; i++) a[i] = f32_to_bf16(kind ? rndn() : (float)((int)(rnd32() % 17) - 8));
        for (int i = 0; i < K * N; i++) b[i] = f32_to_bf16(kind ? rndn() : (float)((int)(rnd32() % 17) - 8));
        for (int i = 0; i < M * N; i++) c[i] = kind ? rndn() : (float)((int)(rnd32() % 201) - 100);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double s = c[i * N + j];
                for (int k = 0; k < K; k++) s += (double)bf16_to_f32(a[i * K + k]) * bf16_to_f32(b[k * N + j]);
                ref[i * N + j] = (float)s;
            }
        gpuk_mma(d, a, b, c);
        char name[96];
        snprintf(name, sizeof name, "matrix instruction %dx%dx%d bf16 (wave %s), %s", M, N, K, M == 32 ? "64: v_mfma_f32_32x32x8_bf16" : "32: mma.m16n8k16",
                 kind ? "random values" : "small integers, exact");
        if (!kind) {
            int bad = 0, first = -1;
            for (int i = 0; i < M * N; i++) if (d[i] != ref[i]) { bad++; if (first < 0) first = i; }
            report(!bad, name, "%d of %d results differ from the loops (first [%d][%d]: %g, want %g)", bad, M * N, first / N, first % N,
                   first >= 0 ? d[first] : 0.0, first >= 0 ? ref[first] : 0.0);
        } else {
            double e = rel_rows(ref, d, 1, M * N);
            report(e <= 1e-6 * g_tol, name, "rel L2 %.3g", e);
        }
    }
    free(a); free(b); free(c); free(d); free(ref);
}

/* y[t][i] = Σ_k bf16(x[t][k]) · bf16(W[r0+i][k]) in double: what the matrix-core product computes. */
static void matmul_bf16_ref(float *y, int ldy, const float *x, int ldx, const int *x_rows, const Mat *W, int r0, int nr, int n) {
    float *row = xmalloc((size_t)W->cols * 4);
    for (int i = 0; i < nr; i++) {
        mat_dequant_row(W, r0 + i, row);
        for (int k = 0; k < W->cols; k++) row[k] = bf16_to_f32(f32_to_bf16(row[k]));
        for (int t = 0; t < n; t++) {
            const float *xt = x + (size_t)(x_rows ? x_rows[t] : t) * ldx;
            double s = 0;
            for (int k = 0; k < W->cols; k++) s += (double)row[k] * bf16_to_f32(f32_to_bf16(xt[k]));
            y[(size_t)t * ldy + i] = (float)s;
        }
    }
    free(row);
}

/* k_gemm_mma (the default prefill product) on every format: matrices whose rows, columns
 * and tokens are not tile multiples, row offsets, both tile shapes, z batches (the per-head
 * un-absorb) and gathered x rows (mma_tile's x_rows, for grouped experts). Each result
 * against the bf16 product (MMA_TOL_BF16) and against glm.c's fp32 matmul (MMA_TOL_FP32). */
static void test_gemm_mma(void) {
    const int shapes[][2] = {{100, 160}, {37, 200}, {130, 96}, {64, 256}, {21, 1024}, {70, 36}};
    const int ns[] = {9, 33, 40, 100};
    double worst_bf16 = 0, worst_fp32 = 0;
    gpuk_use_plain(0);
    for (int f = 0; f < 4; f++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            int rows = shapes[si][0], cols = shapes[si][1];
            if (f == WF_MXFP4 && cols % 32) continue;
            TMat t = make_mat((WeightFormat)f, rows, cols);
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                int n = ns[ni], r0 = si % 2 ? 5 : 0, nr = rows - r0 - (si % 2 ? 3 : 0);
                float *x = xmalloc((size_t)n * cols * 4), *ref = xmalloc((size_t)n * nr * 4), *ref32 = xmalloc((size_t)n * nr * 4), *got = xmalloc((size_t)n * nr * 4);
                fill_n(x, (size_t)n * cols, 1.0f);
                matmul_bf16_ref(ref, nr, x, cols, NULL, &t.W, r0, nr, n);
                matmul_row_range(ref32, x, &t.W, r0, nr, n);
                /* pass 0: matmul_rows' choice (skinny for n <= 32); pass 1: the other shape */
                for (int pass = 0; pass < 2; pass++) {
                    const int skinny = (n <= 32) != pass;
                    if (!pass) gpuk_matmul_rows(got, x, &t.W, r0, nr, n);
                    else gpuk_gemm_mma(got, nr, (size_t)n * nr, x, cols, (size_t)n * cols, NULL, &t.W, r0, nr, n, 1, 0, 0, 0, skinny);
                    double e = rel_rows(ref, got, n, nr), e32 = rel_rows(ref32, got, n, nr);
                    if (e > worst_bf16) worst_bf16 = e;
                    if (e32 > worst_fp32) worst_fp32 = e32;
                    char name[128];
                    snprintf(name, sizeof name, "gemm mma %s %s %dx%d rows %d+%d n=%d%s", skinny ? "skinny" : "square", fmt_name[f], rows, cols, r0, nr, n,
                             pass ? "" : " (matmul_rows)");
                    report(e <= MMA_TOL_BF16 * g_tol && e32 <= MMA_TOL_FP32 * g_tol, name, "rel L2 %.3g vs bf16 (tol %g), %.3g vs fp32 (tol %g)", e, MMA_TOL_BF16, e32,
                           MMA_TOL_FP32);
                }
                free(x); free(ref); free(ref32); free(got);
            }
            free_mat(&t);
        }
    /* z batches: 3 products of 24 rows each, rows 40 apart from row 7, x and y with strides */
    for (int f = 0; f < 4; f++) {
        const int rows = 130, cols = 64, nz = 3, zr = 40, nr = 24, n = 40, ldx = nz * cols + 8, ldy = nz * nr + 5, r0 = 7;
        TMat t = make_mat((WeightFormat)f, rows, cols);
        float *x = xmalloc((size_t)n * ldx * 4), *got = xmalloc((size_t)n * ldy * 4), *ref = xmalloc((size_t)n * ldy * 4);
        fill_n(x, (size_t)n * ldx, 1.0f);
        for (size_t i = 0; i < (size_t)n * ldy; i++) got[i] = ref[i] = 12345.0f; /* untouched past the products */
        for (int z = 0; z < nz; z++) matmul_bf16_ref(ref + z * nr, ldy, x + z * cols, ldx, NULL, &t.W, r0 + z * zr, nr, n);
        gpuk_gemm_mma(got, ldy, (size_t)n * ldy, x, ldx, (size_t)n * ldx, NULL, &t.W, r0, nr, n, nz, zr, cols, nr, -1);
        double e = rel_rows(ref, got, n, ldy);
        char name[96];
        snprintf(name, sizeof name, "gemm mma %s z batches (3 x %d rows, strided x and y)", fmt_name[f], nr);
        report(e <= MMA_TOL_BF16 * g_tol, name, "rel L2 %.3g vs bf16", e);
        free(x); free(got); free(ref); free_mat(&t);
    }
    /* gathered x rows: tokens read rows of a larger x in a scattered order, both tile shapes */
    for (int f = 0; f < 4; f++)
        for (int ni = 0; ni < 2; ni++) {
            const int rows = 100, cols = 96, nx = 150, n = ni ? 70 : 20;
            TMat t = make_mat((WeightFormat)f, rows, cols);
            int *xr = xmalloc((size_t)n * 4);
            for (int i = 0; i < n; i++) xr[i] = (int)((i * 37 + 11) % nx);
            float *x = xmalloc((size_t)nx * cols * 4), *got = xmalloc((size_t)n * rows * 4), *ref = xmalloc((size_t)n * rows * 4);
            fill_n(x, (size_t)nx * cols, 1.0f);
            matmul_bf16_ref(ref, rows, x, cols, xr, &t.W, 0, rows, n);
            gpuk_gemm_mma(got, rows, (size_t)n * rows, x, cols, (size_t)nx * cols, xr, &t.W, 0, rows, n, 1, 0, 0, 0, -1);
            double e = rel_rows(ref, got, n, rows);
            char name[96];
            snprintf(name, sizeof name, "gemm mma %s gathered x rows (x_rows), n=%d", fmt_name[f], n);
            report(e <= MMA_TOL_BF16 * g_tol, name, "rel L2 %.3g vs bf16", e);
            free(xr); free(x); free(got); free(ref); free_mat(&t);
        }
    printf("NOTE gemm mma: worst rel L2 %.3g against the bf16 product, %.3g against the fp32 product\n", worst_bf16, worst_fp32);
}

static void test_embed(void) {
    for (int f = 1; f < 4; f++) {
        TMat t = make_mat((WeightFormat)f, 50, 64);
        int tok[5] = {0, 49, 7, 7, 23};
        float ref[5 * 64], got[5 * 64];
        for (int i = 0; i < 5; i++) mat_dequant_row(&t.W, tok[i], ref + i * 64);
        gpuk_embed(got, &t.W, tok, 5);
        char name[64];
        snprintf(name, sizeof name, "embed %s", fmt_name[f]);
        report(!memcmp(ref, got, sizeof ref), name, "rows differ from mat_dequant_row");
        free_mat(&t);
    }
}

static void test_norms_rope(void) {
    const int dims[] = {64, 96, 160, 1000};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        int d = dims[i], n = 3;
        float *x = xmalloc((size_t)n * d * 4), *w = xmalloc((size_t)d * 4), *ref = xmalloc((size_t)n * d * 4), *got = xmalloc((size_t)n * d * 4);
        fill_n(x, (size_t)n * d, 3.0f);
        fill_n(w, d, 1.0f);
        for (int t = 0; t < n; t++) rmsnorm(ref + (size_t)t * d, x + (size_t)t * d, w, d, 1e-6f);
        gpuk_rmsnorm(got, x, w, d, n, 1e-6f);
        char name[64];
        snprintf(name, sizeof name, "rmsnorm dim %d", d);
        double e = rel_rows(ref, got, n, d);
        report(e <= 1e-6 * g_tol, name, "rel L2 %.3g", e);
        free(x); free(w); free(ref); free(got);
    }
    /* the fused residual add + RMSNorm: bit for bit its two plain kernels, and the CPU's within tolerance */
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        int d = dims[i], n = 3;
        float *x = xmalloc((size_t)n * d * 4), *y = xmalloc((size_t)n * d * 4), *w = xmalloc((size_t)d * 4);
        float *a = xmalloc((size_t)n * d * 4), *a2 = xmalloc((size_t)n * d * 4), *xo = xmalloc((size_t)n * d * 4), *ref = xmalloc((size_t)n * d * 4);
        fill_n(x, (size_t)n * d, 3.0f); fill_n(y, (size_t)n * d, 2.0f); fill_n(w, d, 1.0f);
        gpuk_add_rmsnorm(a, a2, xo, x, y, w, d, n, 1e-5f);
        for (size_t k = 0; k < (size_t)n * d; k++) x[k] += y[k];
        for (int t = 0; t < n; t++) rmsnorm(ref + (size_t)t * d, x + (size_t)t * d, w, d, 1e-5f);
        char name[80];
        snprintf(name, sizeof name, "add_rmsnorm dim %d: the plain kernels' bits, the sum", d);
        report(!memcmp(a, a2, (size_t)n * d * 4) && !memcmp(xo, x, (size_t)n * d * 4), name, "differs from k_add + k_rmsnorm");
        snprintf(name, sizeof name, "add_rmsnorm dim %d: the CPU's", d);
        double e = rel_rows(ref, a, n, d);
        report(e <= 1e-6 * g_tol, name, "rel L2 %.3g", e);
        free(x); free(y); free(w); free(a); free(a2); free(xo); free(ref);
    }
    /* the indexer key: LayerNorm with bias then RoPE of the first dims, at a far position */
    const double theta = 5000.0;
    for (int pos = 0; pos < 3000; pos += 1499) {
        int d = 128, dr = 64;
        float x[128], w[128], b[128], ref[128], got[128], *table = xmalloc((size_t)(pos + 1) * dr * 4);
        fill_n(x, d, 2.0f); fill_n(w, d, 1.0f); fill_n(b, d, 0.5f);
        Config c;
        memset(&c, 0, sizeof c);
        c.qk_rope = dr; c.rope_theta = theta;
        for (int p = 0; p <= pos; p++) rope_angles(table + (size_t)p * dr, dr, p, theta);
        layernorm(ref, x, w, b, d, 1e-6f);
        float cs[64];
        rope_angles(cs, dr, pos, theta);
        rope(ref, dr, cs);
        gpuk_layernorm_rope(got, x, w, b, d, dr, pos, table);
        char name[64];
        snprintf(name, sizeof name, "layernorm + rope pos %d", pos);
        double e = rel_rows(ref, got, 1, d);
        report(e <= 1e-6 * g_tol, name, "rel L2 %.3g", e);
        /* q heads: rope on the last dr of each (nope + rope) head */
        int nh = 5, qd = 48, off = 32, qdr = 16;
        float q[5 * 48], qr[5 * 48];
        fill_n(q, (size_t)nh * qd, 1.0f);
        memcpy(qr, q, sizeof q);
        rope_angles(cs, qdr, pos, theta);
        for (int h = 0; h < nh; h++) rope(qr + h * qd + off, qdr, cs);
        for (int p = 0; p <= pos; p++) rope_angles(table + (size_t)p * qdr, qdr, p, theta);
        gpuk_rope(q, nh, qd, off, qdr, pos, table);
        snprintf(name, sizeof name, "rope q heads pos %d", pos);
        e = rel_rows(qr, q, nh, qd);
        report(e <= 1e-6 * g_tol, name, "rel L2 %.3g", e);
        free(table);
    }
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* top-k: the kept set must equal topk_select's exactly, ties (many zeros, -0 and +0,
 * repeated values) included. */
static void test_topk(void) {
    const int cases[][2] = {{20, 8}, {300, 8}, {1000, 64}, {5000, 2048}, {700, 699}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int kind = 0; kind < 5; kind++) {
            int n = cases[ci][0], k = cases[ci][1];
            float *s = xmalloc((size_t)n * 4);
            for (int i = 0; i < n; i++) {
                float v = rndn();
                if (kind == 1) v = (float)((int)(v * 3)) / 3.0f;          /* few distinct values */
                if (kind == 2) v = rnd32() % 3 == 0 ? v : (rnd32() & 1 ? 0.0f : -0.0f); /* ReLU zeros */
                if (kind == 3 && (i == 0 || rnd32() % 3 == 0)) v = NAN;   /* some NaN: they rank last */
                if (kind == 4) v = NAN;                                   /* all NaN: the first k */
                s[i] = v;
            }
            int *ref = xmalloc((size_t)k * 4), *got = xmalloc((size_t)k * 4);
            topk_select(s, n, k, ref);
            gpuk_topk(got, s, n, k);
            qsort(ref, (size_t)k, sizeof(int), cmp_int);
            int sorted_ok = 1;
            for (int i = 1; i < k; i++) sorted_ok &= got[i - 1] < got[i];
            qsort(got, (size_t)k, sizeof(int), cmp_int);
            char name[64];
            const char *kn[] = {"distinct", "ties", "zeros", "some NaN", "all NaN"};
            snprintf(name, sizeof name, "topk n=%d k=%d %s", n, k, kn[kind]);
            int range_ok = 1;
            for (int i = 0; i < k; i++) range_ok &= got[i] >= 0 && got[i] < n;
            report(range_ok && sorted_ok && !memcmp(ref, got, (size_t)k * 4), name,
                   !range_ok ? "index out of range" : sorted_ok ? "kept set differs from topk_select" : "not in index order");
            free(s); free(ref); free(got);
        }
}

static void test_moe_route(void) {
    const int cfgs[][4] = {{8, 2, 1, 1}, {16, 3, 4, 2}, {256, 8, 8, 4}, {64, 6, 1, 1}}; /* E, A, groups, topk_group */
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++)
        for (int norm = 0; norm < 2; norm++) {
            Config c;
            memset(&c, 0, sizeof c);
            c.n_experts = cfgs[ci][0]; c.n_active = cfgs[ci][1]; c.n_group = cfgs[ci][2]; c.topk_group = cfgs[ci][3];
            c.norm_topk_prob = norm; c.routed_scale = 2.5f;
            int n = 7, E = c.n_experts, A = c.n_active, ok = 1;
            float *lg = xmalloc((size_t)n * E * 4), *bias = xmalloc((size_t)E * 4), *w = xmalloc((size_t)n * A * 4), rw[64];
            int *idx = xmalloc((size_t)n * A * 4), ri[64];
            fill_n(lg, (size_t)n * E, 2.0f);
            fill_n(bias, E, 0.1f);
            for (int i = 0; i < E; i += 5) lg[i] = lg[0]; /* ties among scores */
            gpuk_moe_route(idx, w, &c, lg, bias, n);
            double werr = 0;
            for (int t = 0; t < n && ok; t++) {
                moe_route(&c, lg + (size_t)t * E, bias, ri, rw);
                for (int a = 0; a < A; a++) { /* same set; weights matched by expert */
                    int found = -1;
                    for (int b = 0; b < A; b++) if (idx[t * A + b] == ri[a]) found = b;
                    if (found < 0) { ok = 0; break; }
                    double e = fabs(w[t * A + found] - rw[a]) / fabs(rw[a]);
                    if (e > werr) werr = e;
                }
                for (int a = 1; a < A; a++) ok &= idx[t * A + a - 1] < idx[t * A + a];
            }
            char name[64];
            snprintf(name, sizeof name, "moe_route E=%d A=%d groups %d/%d norm %d", E, A, c.topk_group, c.n_group, norm);
            if (!ok) report(0, name, "chosen experts differ from moe_route (or are not sorted)");
            else report(werr <= 1e-6 * g_tol, name, "weights rel err %.3g", werr);
            free(lg); free(bias); free(w); free(idx);
        }
}

/* NaN router logits (all of a row, some, the first ones): every chosen index in
 * [0, E), distinct, sorted, the same set as moe_route (NaN ranks last); weights equal
 * where they are numbers. */
static void test_moe_route_nan(void) {
    const int cfgs[][4] = {{8, 2, 1, 1}, {16, 3, 4, 2}, {256, 8, 8, 4}}; /* E, A, groups, topk_group */
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
        Config c;
        memset(&c, 0, sizeof c);
        c.n_experts = cfgs[ci][0]; c.n_active = cfgs[ci][1]; c.n_group = cfgs[ci][2]; c.topk_group = cfgs[ci][3];
        c.norm_topk_prob = 1; c.routed_scale = 2.5f;
        const int n = 5, E = c.n_experts, A = c.n_active;
        float *lg = xmalloc((size_t)n * E * 4), *bias = xmalloc((size_t)E * 4), *w = xmalloc((size_t)n * A * 4), rw[64];
        int *idx = xmalloc((size_t)n * A * 4), ri[64], ok = 1;
        fill_n(lg, (size_t)n * E, 2.0f);
        fill_n(bias, E, 0.1f);
        for (int e = 0; e < E; e++) {
            lg[0 * E + e] = NAN;                               /* row 0: all NaN */
            if (e % 3 == 1) lg[1 * E + e] = NAN;               /* row 1: a third NaN */
            if (e < E - A + 1) lg[2 * E + e] = NAN;            /* row 2: fewer numbers than A */
            if (e < 2) lg[3 * E + e] = NAN;                    /* row 3: the first ones NaN */
        }
        gpuk_moe_route(idx, w, &c, lg, bias, n);
        const char *why = "";
        for (int t = 0; t < n && ok; t++) {
            moe_route(&c, lg + (size_t)t * E, bias, ri, rw);
            for (int a = 0; a < A; a++) if (idx[t * A + a] < 0 || idx[t * A + a] >= E) { ok = 0; why = "expert index out of range"; }
            for (int a = 1; a < A && ok; a++) if (idx[t * A + a - 1] >= idx[t * A + a]) { ok = 0; why = "not distinct and sorted"; }
            for (int a = 0; a < A && ok; a++) {
                int found = -1;
                for (int b = 0; b < A; b++) if (idx[t * A + b] == ri[a]) found = b;
                if (found < 0) { ok = 0; why = "chosen experts differ from moe_route"; break; }
                float x = w[t * A + found], y = rw[a];
                if ((x != x) != (y != y) || (y == y && fabsf(x - y) > 1e-5f * fabsf(y) * (float)g_tol)) { ok = 0; why = "weights differ"; }
            }
        }
        char name[64];
        snprintf(name, sizeof name, "moe_route NaN logits E=%d A=%d groups %d/%d", E, A, c.topk_group, c.n_group);
        report(ok, name, "%s", why);
        free(lg); free(bias); free(w); free(idx);
    }
    /* greedy sampling: glm.c's argmax (a NaN first logit wins; other NaNs never do) */
    const int V = 300;
    float *lg = xmalloc((size_t)V * 4);
    int ok = 1;
    for (int kind = 0; kind < 3; kind++) {
        fill_n(lg, V, 1.0f);
        for (int i = 0; i < V; i++) if (kind == 0 || (kind == 1 && i % 2 == 1) || (kind == 2 && i == 0)) lg[i] = NAN;
        for (int plain = 0; plain < 2; plain++) {
            gpuk_use_plain(plain);
            ok &= gpuk_sample(lg, V, 0.0f, 1.0f, 0.5f, NULL) == argmax(lg, V);
        }
    }
    gpuk_use_plain(0);
    report(ok, "sample greedy with NaN logits", "differs from argmax");
    free(lg);
}

static void test_silu_mul(void) {
    int n = 1000;
    float *a = xmalloc((size_t)n * 4), *b = xmalloc((size_t)n * 4), *ref = xmalloc((size_t)n * 4);
    fill_n(a, n, 4.0f); fill_n(b, n, 1.0f);
    for (int i = 0; i < n; i++) ref[i] = silu(a[i]) * b[i];
    gpuk_silu_mul(a, b, n);
    double e = rel_rows(ref, a, 1, n);
    report(e <= 1e-6 * g_tol, "silu_mul", "rel L2 %.3g", e);
    free(a); free(b); free(ref);
}

/* A generator seed whose first draw falls in [lo, hi): glm.c's own u near 0 or near 1. */
static uint64_t seed_with_draw(uint64_t seed, float lo, float hi) {
    for (;; seed++) {
        Sampler probe = {1.0f, 1.0f, seed, NULL};
        float u = random_f32(&probe);
        if (u >= lo && u < hi) return seed;
    }
}

/* Logits of one kind: 0 random, 1 peaked, 2 few distinct values (many ties), 3 flat (every
 * candidate tied), 4 one dominant logit, 5 a NaN first logit, 6 a NaN elsewhere, 7 nearly
 * flat but distinct (a nucleus of most of the vocabulary). */
#define SAMPLE_KINDS 8
static const char *const sample_kind_name[SAMPLE_KINDS] = {"random", "peaked", "ties", "flat", "dominant", "NaN first", "NaN inside", "near-flat"};
static void sample_logits(float *lg, int V, int kind) {
    for (int i = 0; i < V; i++) {
        switch (kind) {
        case 1: lg[i] = rndn() * 6.0f; break;
        case 2: lg[i] = (float)(rnd32() % 4) * 1.5f; break;
        case 3: lg[i] = 0.5f; break;
        case 7: lg[i] = rndn() * 0.01f; break;
        default: lg[i] = rndn() * 2.0f;
        }
    }
    if (kind == 0) lg[rnd32() % V] = lg[rnd32() % V]; /* a tie */
    if (kind == 4) lg[rnd32() % V] = 40.0f;
    if (kind == 5) lg[0] = NAN;
    if (kind == 6) lg[V / 3] = NAN;
}

/* x and y hold the same floats, bit for bit (any NaN equals any NaN) */
static int same_bits(const float *x, const float *y, int n) {
    for (int i = 0; i < n; i++)
        if (memcmp(&x[i], &y[i], 4) && !(x[i] != x[i] && y[i] != y[i])) return 0;
    return 1;
}

/* The probability mass between picks a and b in sample()'s own walk order (order[0..n),
 * its probabilities prob): 0 when a == b, INFINITY when either is not in the order. */
static double walk_distance(const float *prob, const int *order, int n, int a, int b) {
    int pa = -1, pb = -1;
    for (int k = 0; k < n; k++) { if (order[k] == a) pa = k; if (order[k] == b) pb = k; }
    if (pa < 0 || pb < 0) return INFINITY;
    double d = 0;
    for (int k = pa < pb ? pa : pb; k < (pa < pb ? pb : pa); k++) d += prob[order[k]];
    return d;
}

/* glm serve's greedy decode rows (gpu_argmax_rows): each of n rows' token is glm.c's
 * argmax of that row, by the plain kernels and the fast ones, for 1..8 rows mixing every
 * kind of sample_logits (ties, flat rows, NaN first and inside), at a vocabulary smaller
 * than one sweep of the grid and at GLM-5.2's. */
static void test_argmax_rows(void) {
    const int sizes[2] = {300, 154880};
    for (int si = 0; si < 2; si++) {
        const int V = sizes[si];
        float *lg = xmalloc((size_t)8 * V * 4);
        int bad = 0, total = 0, out[8];
        char first[160] = "";
        for (int n = 1; n <= 8; n++) {
            for (int r = 0; r < n; r++) sample_logits(lg + (size_t)r * V, V, (n + r) % SAMPLE_KINDS);
            for (int plain = 0; plain < 2; plain++) {
                gpuk_use_plain(plain);
                gpuk_argmax_rows(lg, V, n, out);
                for (int r = 0; r < n; r++, total++) {
                    const int want = argmax(lg + (size_t)r * V, V);
                    if (out[r] != want && !bad++)
                        snprintf(first, sizeof first, "first: %d rows, row %d (%s), %s: %d, argmax %d", n, r, sample_kind_name[(n + r) % SAMPLE_KINDS],
                                 plain ? "plain" : "fast", out[r], want);
                }
            }
        }
        gpuk_use_plain(0);
        char name[96];
        snprintf(name, sizeof name, "argmax_rows V=%d, 1..8 rows, plain and fast (%d rows)", V, total);
        report(!bad, name, "%d rows differ from argmax; %s", bad, first);
        free(lg);
    }
}

/* sampling: the fast kernels against k_sample (the same pick, always: the same softmax,
 * compared bit for bit, and the same sequential walks) and against glm.c's sample() with the same draw u. sample()
 * sums the softmax in one sequential pass, the device in 256 strided ones; over 200k
 * terms the two sums differ by ~1e-4 relative, which moves the CDF by as much, so a pick
 * may differ from sample()'s by at most SAMPLE_CDF_TOL of probability in sample()'s own
 * order past V = 1000, SAMPLE_CDF_TOL_SMALL up to it (and greedy never). NaN logits at a temperature make every
 * probability NaN: no candidate, and all three give the last id. */
#define SAMPLE_CDF_TOL 5e-3
#define SAMPLE_CDF_TOL_SMALL 1e-4 /* V = 1000: the two sums still differ in the last bits, which can move a u near a CDF step */
static void test_sample(void) {
    const char *big_env = getenv("GPU_KTEST_SAMPLE_BIG");
    const int Vs[] = {1000, 4099, 200003}, n_v = big_env && !strcmp(big_env, "0") ? 2 : 3;
    const float temps[] = {0.0f, 0.6f, 1.0f, 1.5f}, tops[] = {1.0f, 0.95f, 0.5f, 0.01f};
    const float u_lo[] = {0.0f, 1.0f - 1.0f / 1024, 0.0f}, u_hi[] = {1.0f / 1024, 1.0f, 1.0f}; /* near 0, near 1, anywhere */
    for (int vi = 0; vi < n_v; vi++) {
        const int V = Vs[vi], big = V > 100000;
        const double tol = V <= 1000 ? SAMPLE_CDF_TOL_SMALL : SAMPLE_CDF_TOL;
        float *lg = xmalloc((size_t)V * 4), *tmp = xmalloc((size_t)V * 4);
        float *probs_plain = xmalloc((size_t)V * 4), *probs_fast = xmalloc((size_t)V * 4);
        int *order = xmalloc((size_t)V * 4);
        int vs_plain = 0, probs_differ = 0, vs_ref = 0, off_ref = 0, total = 0, held_to_ref = 0;
        double worst = 0;
        char first[160] = "";
        for (int kind = 0; kind < SAMPLE_KINDS; kind++)
            for (size_t ti = 0; ti < 4; ti++)
                for (size_t pi = 0; pi < 4; pi++)
                    for (int ui = 0; ui < 3; ui++) {
                        /* greedy ignores top_p and u; the emulation is slow at V = 200k: there one
                         * temperature (1), a random u, top_p 1 (the full walk), 0.5 and 0.01 */
                        if (temps[ti] == 0.0f ? pi > 0 || ui > 0 : big && (ui != 2 || ti != 2 || pi == 1)) continue;
                        sample_logits(lg, V, kind);
                        uint64_t seed = seed_with_draw(0x1234567ull + rnd32(), u_lo[ui], u_hi[ui]);
                        Sampler sp = {temps[ti], tops[pi], seed, order}, probe = sp;
                        float u = temps[ti] > 0 ? random_f32(&probe) : 0.0f;
                        const int with_probs = temps[ti] > 0 && tops[pi] < 1.0f;
                        gpuk_use_plain(1);
                        int plain = gpuk_sample(lg, V, temps[ti], tops[pi], u, with_probs ? probs_plain : NULL);
                        gpuk_use_plain(0);
                        int fast = gpuk_sample(lg, V, temps[ti], tops[pi], u, with_probs ? probs_fast : NULL);
                        probs_differ += with_probs && !same_bits(probs_plain, probs_fast, V);
                        int ref = -1;
                        {
                            memcpy(tmp, lg, (size_t)V * 4);
                            ref = sample(&sp, tmp, V); /* tmp: its probabilities; order: its candidates, sorted */
                            held_to_ref++;
                            if (fast != ref) {
                                vs_ref++;
                                int n = V;
                                if (tops[pi] < 1.0f) {
                                    const float cutoff = (1.0f - tops[pi]) / (float)(V - 1);
                                    n = 0;
                                    for (int i = 0; i < V; i++) n += tmp[i] >= cutoff;
                                }
                                double d = temps[ti] > 0 ? walk_distance(tmp, order, n, fast, ref) : INFINITY;
                                if (d > worst) worst = d;
                                off_ref += d > tol;
                            }
                        }
                        vs_plain += fast != plain;
                        total++;
                        if ((fast != plain || (ref >= 0 && fast != ref)) && !first[0])
                            snprintf(first, sizeof first, "first: %s T=%g top_p=%g u=%.9g: fast %d, k_sample %d, sample() %d", sample_kind_name[kind], temps[ti],
                                     tops[pi], u, fast, plain, ref);
                    }
        char name[192];
        snprintf(name, sizeof name, "sample V=%d fast = k_sample, ~ sample() (%d draws, %d kinds; %d of %d differ from sample() by <= %.3g)", V, total, SAMPLE_KINDS,
                 vs_ref, held_to_ref, worst);
        report(!vs_plain && !probs_differ && !off_ref, name, "%d of %d differ from k_sample (%d softmaxes not bit for bit), %d of %d from sample() by more than %g; %s",
               vs_plain, total, probs_differ, off_ref, held_to_ref, tol, first);
        free(lg); free(tmp); free(order); free(probs_plain); free(probs_fast);
    }
    /* the widening: the first group starts too high, so the exact walk runs out of
     * candidates before top_p and the next bins are appended, one at a time */
    const int V = 4099;
    float *lg = xmalloc((size_t)V * 4);
    int bad = 0, total = 0;
    for (int higher = 1; higher <= 6; higher += 5)
        for (int kind = 0; kind < SAMPLE_KINDS; kind++)
            for (int pi = 1; pi < 4; pi++) {
                const float top_p = pi == 1 ? 0.95f : pi == 2 ? 0.5f : 0.01f, u = rndu();
                sample_logits(lg, V, kind);
                gpuk_use_plain(1);
                int plain = gpuk_sample(lg, V, 1.0f, top_p, u, NULL);
                gpuk_use_plain(0);
                gpuk_sample_start_higher(higher);
                bad += gpuk_sample(lg, V, 1.0f, top_p, u, NULL) != plain;
                gpuk_sample_start_higher(0);
                total++;
            }
    report(!bad, "sample fast, first group started 1 and 6 bins too high", "%d of %d differ from k_sample", bad, total);
    free(lg);
}

static Config mla_config(int NH, int DN, int DR, int DV, int KR, int K) {
    Config c;
    memset(&c, 0, sizeof c);
    c.n_heads = NH; c.qk_nope = DN; c.qk_rope = DR; c.v_head = DV; c.kv_lora_rank = KR; c.index_topk = K;
    return c;
}

/* The q absorb (q_abs = W_UKᵀ·q_nope, then q_pe), fast and plain, against glm.c's
 * mla_absorb: every format, GLM-5.2's shapes and small ones (columns not a multiple of
 * the fast kernel's 64 or 8), token counts across its 8-token groups. */
static void test_q_absorb(void) {
    const int shapes[][5] = {{64, 192, 64, 256, 512}, {8, 64, 16, 32, 96}, {4, 32, 16, 48, 76}}; /* NH, DN, DR, DV, KR */
    const int ns[] = {1, 3, 9};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int f = 0; f < 4; f++) {
            const int NH = shapes[si][0], DN = shapes[si][1], DR = shapes[si][2], DV = shapes[si][3], KR = shapes[si][4], AD = KR + DR;
            if ((f == WF_MXFP4 && KR % 32) || (si == 0 && f != WF_BF16)) continue; /* GLM-5.2's shape: one format (time) */
            Config c = mla_config(NH, DN, DR, DV, KR, 8);
            TMat t = make_mat((WeightFormat)f, NH * (DN + DV), KR);
            Layer L;
            memset(&L, 0, sizeof L);
            L.kv_b = t.W;
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                const int n = ns[ni];
                if (si == 0 && n == 9) continue;
                float *q = xmalloc((size_t)n * NH * (DN + DR) * 4), *ref = xmalloc((size_t)n * NH * AD * 4), *got = xmalloc((size_t)n * NH * AD * 4);
                fill_n(q, (size_t)n * NH * (DN + DR), 1.0f);
                RunState rs;
                memset(&rs, 0, sizeof rs);
                rs.q = q; rs.q_abs = ref;
                mla_absorb(&c, &L, &rs, n);
                for (int plain = 0; plain < 2; plain++) {
                    gpuk_use_plain(plain);
                    gpuk_q_absorb(got, q, &t.W, &c, n);
                    double e = rel_rows(ref, got, n * NH, AD);
                    char name[128];
                    snprintf(name, sizeof name, "q absorb %s %s NH %d DN %d KR %d n=%d", plain ? "plain" : "fast", fmt_name[f], NH, DN, KR, n);
                    report(e <= 2e-6 * g_tol, name, "rel L2 %.3g against mla_absorb", e);
                }
                gpuk_use_plain(0);
                free(q); free(ref); free(got);
            }
            free_mat(&t);
        }
}

/* The selected-key attention (scores, softmax, latent value sum), the split kernel
 * with its combine and the plain one, against glm.c's mla_attend_head per (token,
 * head) on random inputs: GLM-5.2's shapes with the full 2048 keys; several slices
 * (the host's choice for 1 and 64 compute units, and forced counts); tokens whose
 * selection is shorter than a slice (40 keys, one key), keys in any order, n = 1 and
 * n > 1. Any NaN fails (rel_rows). */
static void test_mla_attend(void) {
    typedef struct { int NH, DR, KR, K, T, n, cus, slices, nsel[4], kmax; } Case; /* kmax 0: the largest n_sel */
    const Case cases[] = {
        {64, 64, 512, 2048, 3000, 1, 64, 0, {2048}, 0},          /* GLM-5.2 decode: 32 slices of one tile */
        {64, 64, 512, 2048, 3000, 1, 1, 0, {2048}, 0},           /* 2 slices of 16 tiles */
        {16, 32, 128, 700, 1000, 3, 1, 0, {700, 40, 1}, 0},      /* one slice: no combine */
        {16, 32, 128, 700, 1000, 3, 0, 4, {700, 40, 1}, 0},      /* 4 slices of 192 keys: 40 and 1 end in slice 0 */
        {16, 32, 128, 700, 1000, 4, 0, 11, {700, 65, 64, 130}, 0}, /* one tile per slice, tiles cut at 64 keys */
        {4, 16, 64, 8, 20, 2, 0, 2, {8, 3}, 0},                  /* the tiny checkpoints' shapes */
        {40, 16, 200, 300, 400, 2, 0, 3, {300, 299}, 0},         /* heads and columns the thread map does not fill */
        {16, 32, 128, 700, 1000, 2, 64, 0, {700, 300}, 200},  /* n_sel beyond the host's bound: the last slice takes the rest */
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const Case *C = &cases[ci];
        const int NH = C->NH, KR = C->KR, AD = KR + C->DR, K = C->K, n = C->n;
        Config c = mla_config(NH, 192 - C->DR, C->DR, 0, KR, K);
        float *q = xmalloc((size_t)n * NH * AD * 4), *lat = xmalloc((size_t)C->T * AD * 4), *ref = xmalloc((size_t)n * NH * KR * 4),
              *got = xmalloc((size_t)n * NH * KR * 4), *score = xmalloc((size_t)K * 4);
        int *sel = xmalloc((size_t)n * K * 4), *perm = xmalloc((size_t)C->T * 4), kmax = 0;
        fill_n(q, (size_t)n * NH * AD, 1.0f);
        fill_n(lat, (size_t)C->T * AD, 1.0f);
        for (int t = 0; t < n; t++) { /* distinct random rows, in random order */
            for (int i = 0; i < C->T; i++) perm[i] = i;
            for (int i = 0; i < C->nsel[t]; i++) { int j = i + (int)(rnd32() % (uint32_t)(C->T - i)), x = perm[i]; perm[i] = perm[j]; perm[j] = x; }
            memcpy(sel + (size_t)t * K, perm, (size_t)C->nsel[t] * 4);
            if (C->nsel[t] > kmax) kmax = C->nsel[t];
        }
        const float scale = 1.0f / sqrtf(192.0f);
        for (int t = 0; t < n; t++)
            for (int h = 0; h < NH; h++)
                mla_attend_head(q + ((size_t)t * NH + h) * AD, lat, sel + (size_t)t * K, C->nsel[t], KR, AD, scale, score, ref + ((size_t)t * NH + h) * KR);
        for (int plain = 0; plain < 2; plain++) {
            if (plain && ci == 1) continue; /* the same inputs as case 0 */
            gpuk_use_plain(plain);
            gpuk_mla_attend(got, q, lat, C->T, sel, C->nsel, &c, n, C->kmax ? C->kmax : kmax, C->cus, C->slices);
            double e = rel_rows(ref, got, n * NH, KR);
            char name[160];
            snprintf(name, sizeof name, "mla attend %s NH %d KR %d DR %d n=%d n_sel %d%s%s (%s %d%s)", plain ? "plain" : "split", NH, KR, C->DR, n, C->nsel[0],
                     n > 1 ? "," : "", n > 1 ? " ..." : "", C->slices ? "slices" : "compute units", C->slices ? C->slices : C->cus, C->kmax ? ", bound below n_sel" : "");
            report(e <= 1e-5 * g_tol, name, "rel L2 %.3g against mla_attend_head", e);
        }
        gpuk_use_plain(0);
        free(q); free(lat); free(ref); free(got); free(score); free(sel); free(perm);
    }
}

/* Attention and the indexer's scores for n tokens (a --draft verify step) give each token
 * the bits it gets alone (its decode step): GLM-5.2's shapes, on a GPU of 8 compute units
 * (where the host would otherwise split 4 tokens' keys into fewer slices than one's) and of
 * 256, and the indexer at a context past index_topk. */
static void test_attend_tokens_as_one(void) {
    const int NH = 64, DR = 64, KR = 512, AD = KR + DR, K = 2048, T = 2600, n = 4, cus_list[] = {8, 256};
    Config c = mla_config(NH, 192 - DR, DR, 0, KR, K);
    float *q = xmalloc((size_t)n * NH * AD * 4), *lat = xmalloc((size_t)T * AD * 4), *gn = xmalloc((size_t)n * NH * KR * 4), *g1 = xmalloc((size_t)NH * KR * 4);
    int *sel = xmalloc((size_t)n * K * 4), nsel[4] = {2048, 2048, 1500, 2048};
    fill_n(q, (size_t)n * NH * AD, 1.0f);
    fill_n(lat, (size_t)T * AD, 1.0f);
    for (int i = 0; i < n * K; i++) sel[i] = (int)(rnd32() % (uint32_t)T);
    for (int ci = 0; ci < 2; ci++) {
        gpuk_mla_attend(gn, q, lat, T, sel, nsel, &c, n, K, cus_list[ci], 0);
        int differ = 0;
        for (int t = 0; t < n; t++) {
            gpuk_mla_attend(g1, q + (size_t)t * NH * AD, lat, T, sel + (size_t)t * K, nsel + t, &c, 1, K, cus_list[ci], 0);
            differ += memcmp(g1, gn + (size_t)t * NH * KR, (size_t)NH * KR * 4) != 0;
        }
        char name[128];
        snprintf(name, sizeof name, "mla attend n=%d, %d compute units: each token as alone", n, cus_list[ci]);
        report(!differ, name, "%d of %d tokens differ", differ, n);
    }
    free(q); free(lat); free(gn); free(g1); free(sel);
    const int IH = 32, ID = 128, pos0 = 2100, m = 5, TT = pos0 + m;
    Config ci;
    memset(&ci, 0, sizeof ci);
    ci.index_n_heads = IH; ci.index_head_dim = ID; ci.index_topk = K;
    float *iq = xmalloc((size_t)m * IH * ID * 4), *iw = xmalloc((size_t)m * IH * 4), *keys = xmalloc((size_t)TT * ID * 4);
    float *sn = xmalloc((size_t)m * TT * 4), *s1 = xmalloc((size_t)TT * 4);
    fill_n(iq, (size_t)m * IH * ID, 1.0f); fill_n(iw, (size_t)m * IH, 1.0f); fill_n(keys, (size_t)TT * ID, 1.0f);
    gpuk_ix_scores(sn, iq, iw, keys, TT, &ci, m, pos0);
    int differ = 0;
    for (int t = 0; t < m; t++) {
        gpuk_ix_scores(s1, iq + (size_t)t * IH * ID, iw + (size_t)t * IH, keys, TT, &ci, 1, pos0 + t);
        differ += memcmp(s1, sn + (size_t)t * TT, (size_t)(pos0 + t + 1) * 4) != 0; /* the keys it sees */
    }
    report(!differ, "indexer scores n=5 past index_topk: each token as alone", "%d of %d tokens differ", differ, m);
    free(iq); free(iw); free(keys); free(sn); free(s1);
}

/* The indexer's scores, tiled and plain, against glm.c's index_scores, and the top-k
 * they give against topk_select of glm.c's scores: GLM-5.2's 32 heads x 128 and the tiny
 * checkpoints' 4 x 32; a chunk where some tokens still see <= index_topk keys (no scores). */
static void test_ix_scores(void) {
    /* IH, ID, K, pos0, n: n past the fast kernel's 8-token groups too, and a group whose first
     * tokens still see <= K keys (no scores) while its last ones do */
    const int cases[][5] = {{32, 128, 64, 250, 3}, {32, 128, 2048, 2100, 2}, {4, 32, 8, 5, 6}, {8, 64, 64, 60, 7}, {8, 64, 64, 50, 27}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int IH = cases[ci][0], ID = cases[ci][1], K = cases[ci][2], pos0 = cases[ci][3], n = cases[ci][4], T = pos0 + n + 3;
        Config c;
        memset(&c, 0, sizeof c);
        c.index_n_heads = IH; c.index_head_dim = ID; c.index_topk = K;
        float *q = xmalloc((size_t)n * IH * ID * 4), *w = xmalloc((size_t)n * IH * 4), *keys = xmalloc((size_t)T * ID * 4);
        float *ref = xmalloc((size_t)T * 4), *got = xmalloc((size_t)n * T * 4);
        int *rsel = xmalloc((size_t)K * 4), *gsel = xmalloc((size_t)K * 4);
        fill_n(q, (size_t)n * IH * ID, 1.0f); fill_n(w, (size_t)n * IH, 1.0f); fill_n(keys, (size_t)T * ID, 1.0f);
        for (int plain = 0; plain < 2; plain++) {
            gpuk_use_plain(plain);
            gpuk_ix_scores(got, q, w, keys, T, &c, n, pos0);
            double worst = 0;
            int sel_bad = 0, scored = 0;
            for (int t = 0; t < n; t++) {
                const int visible = pos0 + t + 1;
                if (visible <= K) continue;
                scored++;
                index_scores(&c, q + (size_t)t * IH * ID, w + (size_t)t * IH, keys, visible, ref);
                double e = rel_rows(ref, got + (size_t)t * T, 1, visible);
                if (e > worst) worst = e;
                topk_select(ref, visible, K, rsel);
                topk_select(got + (size_t)t * T, visible, K, gsel);
                qsort(rsel, (size_t)K, sizeof(int), cmp_int);
                qsort(gsel, (size_t)K, sizeof(int), cmp_int);
                sel_bad += memcmp(rsel, gsel, (size_t)K * 4) != 0;
            }
            char name[128];
            snprintf(name, sizeof name, "indexer scores %s IH %d ID %d topk %d pos0 %d n=%d (%d scored)", plain ? "plain" : "tiled", IH, ID, K, pos0, n, scored);
            report(scored > 0 && worst <= 1e-6 * g_tol && !sel_bad, name, "rel L2 %.3g, %d top-k selections differ", worst, sel_bad);
        }
        gpuk_use_plain(0);
        free(q); free(w); free(keys); free(ref); free(got); free(rsel); free(gsel);
    }
}

/* The blocks of forward() on a real (tiny) checkpoint: each layer's attention and
 * MLP, fed the same random normalised input, through a prefill chunk of 12 tokens,
 * four decode steps and a chunk of 3; with the plain kernels (fp32 throughout: 1e-5 of
 * glm.c's ops) and with the fast ones, whose 12-token chunk runs its products on the
 * matrix cores with bf16 activations (section 3c): BLOCKS_TOL_MMA of glm.c's ops with the
 * same products in bf16 (below; measured up to 9.7e-4 on the tiny checkpoints: x near a
 * bf16 rounding boundary rounds either way), the same token selections. */
#define BLOCKS_TOL_MMA 2e-3

/* glm.c's ops at the precision of the GPU's fast kernels, for the blocks: every product of
 * more than GEMV_MAXN (8) tokens with x and W rounded to bf16 (as k_gemm_mma computes it),
 * the un-absorb too (the GPU runs it through the same product), and in such a chunk every
 * routed expert's products (the grouped experts run on the same tiles). Against glm.c's fp32 ops the
 * bf16 prefill differs by ~5e-3, and discrete choices (the indexer's top-k, the experts)
 * flip on some inputs, which no tolerance on the outputs could cover. */
static int g_ref_bf16; /* every product in bf16, whatever its token count: a prefill chunk's experts */
static void matmul_mma_ref(float *y, const float *x, const Mat *W, int n) {
    if (n <= 8 && !g_ref_bf16) matmul(y, x, W, n);
    else matmul_bf16_ref(y, W->rows, x, W->cols, NULL, W, 0, W->rows, n);
}
static void matmul_group_mma_ref(const Product *p, int np, int n) {
    for (int i = 0; i < np; i++) matmul_mma_ref(p[i].y, p[i].x, p[i].W, n);
}
static void mla_unabsorb_mma_ref(const Config *c, const Layer *L, RunState *s, int n) {
    const int NH = c->n_heads, DN = c->qk_nope, DV = c->v_head, KR = c->kv_lora_rank;
    if (n <= 8) mla_unabsorb(c, L, s, n);
    else
        for (int h = 0; h < NH; h++) matmul_bf16_ref(s->o_heads + (size_t)h * DV, NH * DV, s->o_lat + (size_t)h * KR, NH * KR, NULL, &L->kv_b, h * (DN + DV) + DN, DV, n);
}
static void moe_experts_mma_ref(const Model *m, const Layer *L, RunState *s, const float *x, float *y, int n) {
    /* a prefill chunk (n > 8) runs every expert on the matrix cores (k_gemm_grouped), however
     * few of its tokens chose it; a decode step in fp32 (k_mlp_*) */
    g_ref_bf16 = n > 8;
    moe_experts(m, L, s, x, y, n);
    g_ref_bf16 = 0;
}

static void test_blocks_mode(const char *dir, int plain) {
    Model m;
    model_load(&m, dir);
    const Config *c = &m.cfg;
    const int ctx = 64, H = c->hidden, K = c->index_topk;
    KVCache kv;
    kvcache_init(&kv, &m, ctx);
    RunState s;
    runstate_init(&s, c, 64, ctx);
    GpuModel *g = gpu_load(&m, 1, ctx);
    gpuk_use_plain(plain); /* (gpu_load chose from GLM_GPU_KERNELS) */
    const Ops saved = ops;
    if (!plain) {
        ops.matmul = matmul_mma_ref;
        ops.matmul_group = matmul_group_mma_ref;
        ops.mla_unabsorb = mla_unabsorb_mma_ref;
        ops.moe_experts = moe_experts_mma_ref;
    }
    const int steps[] = {12, 1, 1, 1, 1, 3};
    float *a = xmalloc((size_t)64 * H * 4), *out = xmalloc((size_t)64 * H * 4);
    int *sel = xmalloc((size_t)64 * K * 4), *nsel = xmalloc(64 * 4);
    double att_worst = 0, mlp_worst = 0;
    int sel_bad = 0, pos0 = 0;
    for (size_t si = 0; si < sizeof steps / sizeof steps[0]; si++) {
        int n = steps[si];
        for (int l = 0; l < c->n_layers; l++) {
            const Layer *L = &m.layers[l];
            fill_n(a, (size_t)n * H, 1.0f);
            memcpy(s.a, a, (size_t)n * H * 4);
            const Span one = {&kv, 0, n, pos0};
            attention(&m, L, &s, l, &one, 1, n);
            gpuk_attention(g, l, a, n, pos0, out, sel, nsel);
            double e = rel_rows(s.out, out, n, H);
            if (e > att_worst) att_worst = e;
            for (int t = 0; t < n; t++) {
                if (nsel[t] != s.n_sel[t]) { sel_bad++; continue; }
                int ref[4096];
                memcpy(ref, s.sel + (size_t)t * K, (size_t)nsel[t] * 4);
                qsort(ref, (size_t)nsel[t], sizeof(int), cmp_int);
                qsort(sel + (size_t)t * K, (size_t)nsel[t], sizeof(int), cmp_int);
                sel_bad += memcmp(ref, sel + (size_t)t * K, (size_t)nsel[t] * 4) != 0;
            }
            fill_n(a, (size_t)n * H, 1.0f);
            memcpy(s.a, a, (size_t)n * H * 4);
            if (c->dense[l]) swiglu(s.out, s.a, &L->gate, &L->up, &L->down, s.h1, s.h2, n);
            else moe(&m, L, &s, s.a, s.out, n);
            gpuk_mlp(g, l, a, n, out);
            e = rel_rows(s.out, out, n, H);
            if (e > mlp_worst) mlp_worst = e;
        }
        pos0 += n;
    }
    char name[300];
    const double tol = plain ? 1e-5 : BLOCKS_TOL_MMA;
    const char *kind = plain ? "plain kernels" : "fast kernels, bf16 prefill vs glm.c with bf16 prefill products";
    snprintf(name, sizeof name, "attention (all layers, prefill + decode, %s) %s", kind, dir);
    report(att_worst <= tol * g_tol && !sel_bad, name, "rel L2 %.3g, %d token selections differ", att_worst, sel_bad);
    snprintf(name, sizeof name, "mlp / moe (all layers, prefill + decode, %s) %s", kind, dir);
    report(mlp_worst <= tol * g_tol, name, "rel L2 %.3g", mlp_worst);
    if (!plain) printf("NOTE blocks with bf16 prefill %s: attention rel L2 %.3g, mlp %.3g\n", dir, att_worst, mlp_worst);
    ops = saved;
    gpu_free(g);
    gpuk_use_plain(0);
    free(a); free(out); free(sel); free(nsel);
    runstate_free(&s);
    kvcache_free(&kv);
    model_free(&m);
}

/* A whole file into memory (malloc'd), or NULL. */
static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
    fclose(f);
    *len = buf ? (size_t)n : 0;
    return buf;
}

/* --compare REF GOT V TOL: two float32 [n][V] logits files; relative L2 per position
 * and argmax. For tests/gpu_check.sh, which must not need Python on the GPU machine. */
static int compare_files(const char *ref_path, const char *got_path, int V, double tol) {
    size_t na, nb;
    char *a = read_file(ref_path, &na), *b = read_file(got_path, &nb);
    if (!a || !b || na != nb || na == 0 || na % ((size_t)V * 4)) { printf("FAIL compare %s %s: missing or different sizes\n", ref_path, got_path); return 1; }
    int n = (int)(na / ((size_t)V * 4)), argmax_bad = 0;
    double worst = 0;
    for (int t = 0; t < n; t++) {
        const float *x = (const float *)a + (size_t)t * V, *y = (const float *)b + (size_t)t * V;
        double e = rel_rows(x, y, 1, V);
        if (e > worst) worst = e;
        argmax_bad += argmax(x, V) != argmax(y, V);
    }
    int ok = worst <= tol && !argmax_bad;
    printf("%s max rel L2 %.2e over %d positions, argmax differs at %d\n", ok ? "ok" : "bad", worst, n, argmax_bad);
    free(a); free(b);
    return !ok;
}

double gpuk_time_gemv(const Mat *W, int iters);
double gpuk_copy_bandwidth(size_t bytes, int iters);

/* --serve-launches DIR: the kernels glm serve's decode step of n = 1..8 sequences launches
 * (gpu_forward_rows, each sequence one token at position 0 in its own cache slot), on one
 * line, for tests/test_gpu_emu.sh to hold against glm plan's launches_serve_rows_1_8. */
static int serve_launches(const char *dir) {
    Model m;
    model_load(&m, dir);
    GpuModel *g = gpu_load_slots(&m, 1, 64, GPU_BATCH_MAX);
    float *logits = xmalloc((size_t)GPU_BATCH_MAX * m.cfg.vocab_size * sizeof(float));
    int slot[GPU_BATCH_MAX], pos[GPU_BATCH_MAX], tok[GPU_BATCH_MAX];
    for (int n = 1; n <= GPU_BATCH_MAX; n++) {
        for (int i = 0; i < n; i++) { slot[i] = i; pos[i] = 0; tok[i] = 1 + i; }
        const long before = gpu_launch_count();
        gpu_forward_rows(g, slot, pos, tok, n, logits);
        printf(n > 1 ? " %ld" : "%ld", gpu_launch_count() - before);
    }
    printf("\n");
    free(logits);
    gpu_free(g);
    model_free(&m);
    return 0;
}

/* --bench [DIR]: device copy bandwidth, the decode matrix-vector product at GLM-5.2's
 * width (MXFP4 and BF16, 6144 inputs, far larger than any cache), and decode steps on
 * the checkpoint in DIR (glm synth). Prints "BENCH key value" lines. */
static int bench(const char *dir) {
    double copy = gpuk_copy_bandwidth(getenv("GPU_BENCH_ROWS") ? (size_t)1 << 24 : (size_t)1 << 30, 20);
    printf("BENCH copy_GBps %.1f\n", copy / 1e9);
    for (int f = WF_BF16; f <= WF_MXFP4; f += WF_MXFP4 - WF_BF16) {
        int rows = f == WF_MXFP4 ? 131072 : 32768, cols = 6144;
        if (getenv("GPU_BENCH_ROWS")) rows = atoi(getenv("GPU_BENCH_ROWS")); /* to try the bench under the emulation */
        TMat t = make_mat((WeightFormat)f, rows, cols);
        double sec = gpuk_time_gemv(&t.W, 50);
        printf("BENCH gemv_%s_GBps %.1f\nBENCH gemv_%s_us %.1f\nBENCH gemv_%s_MB %.1f\nBENCH gemv_%s_shape %dx%d\n", fmt_name[f], t.W.bytes / sec / 1e9,
               fmt_name[f], sec * 1e6, fmt_name[f], t.W.bytes / 1e6, fmt_name[f], rows, cols);
        free_mat(&t);
    }
    /* prefill products at GLM-5.2's shapes: an expert's gate (2048 x 6144, MXFP4) over the
     * tokens routed to it in a 2048-token chunk (64 on average) and over 512; q_b (16384 x
     * 2048) and o_proj (6144 x 16384) in BF16 over a whole chunk */
    const int small = getenv("GPU_BENCH_ROWS") != NULL;
    const struct { const char *name; int fmt, rows, cols, n; } gemms[] = {
        {"expert_mxfp4_n64", WF_MXFP4, 2048, 6144, 64}, {"expert_mxfp4_n512", WF_MXFP4, 2048, 6144, 512},
        {"q_b_bf16_n2048", WF_BF16, 16384, 2048, 2048}, {"o_proj_bf16_n2048", WF_BF16, 6144, 16384, 2048}};
    for (size_t i = 0; i < sizeof gemms / sizeof gemms[0]; i++) {
        const int rows = small ? 64 : gemms[i].rows, cols = small ? 256 : gemms[i].cols, n = small ? 40 : gemms[i].n;
        TMat t = make_mat((WeightFormat)gemms[i].fmt, rows, cols);
        double sec = gpuk_time_gemm(&t.W, n, small ? 2 : 20);
        printf("BENCH gemm_%s_TFLOPs %.2f\nBENCH gemm_%s_us %.1f\nBENCH gemm_%s_shape %dx%dx%d\n", gemms[i].name, 2.0 * rows * cols * n / sec / 1e12,
               gemms[i].name, sec * 1e6, gemms[i].name, rows, cols, n);
        free_mat(&t);
    }
    if (!dir) return 0;
    Model m;
    model_load(&m, dir);
    const int P = small ? 64 : 2048; /* the prefill timed: one chunk of P tokens */
    GpuModel *g = gpu_load(&m, 1, P + 64);
    {
        int *pp = xmalloc((size_t)P * sizeof(int));
        for (int i = 0; i < P; i++) pp[i] = (int)(rnd32() % (uint32_t)m.cfg.vocab_size);
        gpu_forward(g, 0, pp, P, NULL, 0); /* warm-up */
        gpu_sample(g, 0.0f, 1.0f, 0.0f);
        double t0 = now_s();
        gpu_forward(g, 0, pp, P, NULL, 0);
        gpu_sample(g, 0.0f, 1.0f, 0.0f); /* the token back: the prefill is finished */
        double sec = now_s() - t0;
        printf("BENCH prefill_tokens %d\nBENCH prefill_ms %.1f\nBENCH prefill_tok_s %.0f\n", P, sec * 1e3, P / sec);
        free(pp);
    }
    int prompt[16];
    for (int i = 0; i < 16; i++) prompt[i] = (int)(rnd32() % (uint32_t)m.cfg.vocab_size);
    gpu_forward(g, 0, prompt, 16, NULL, 0);
    int tok = gpu_sample(g, 0.0f, 1.0f, 0.0f), steps = 32;
    gpu_forward(g, 16, &tok, 1, NULL, 0); /* warm-up */
    tok = gpu_sample(g, 0.0f, 1.0f, 0.0f);
    double t0 = now_s();
    for (int i = 0; i < steps; i++) {
        gpu_forward(g, 17 + i, &tok, 1, NULL, 0);
        tok = gpu_sample(g, 0.0f, 1.0f, 0.0f); /* returns the token: the step is finished */
    }
    double sec = (now_s() - t0) / steps, bytes = decode_bytes(&m, 17 + steps / 2); /* glm.c: weights and cache of a step */
    printf("BENCH decode_ms %.3f\nBENCH decode_MB %.1f\nBENCH decode_GBps %.1f\nBENCH decode_layers %d\n", sec * 1e3, bytes / 1e6, bytes / sec / 1e9, m.cfg.n_layers);
    gpu_free(g);
    model_free(&m);
    return 0;
}

int main(int argc, char **argv) {
    number_tables_init();
    if (argc == 6 && !strcmp(argv[1], "--compare")) return compare_files(argv[2], argv[3], atoi(argv[4]), atof(argv[5]));
    if (argc >= 2 && !strcmp(argv[1], "--bench")) return bench(argc > 2 ? argv[2] : NULL);
    if (argc == 3 && !strcmp(argv[1], "--serve-launches")) return serve_launches(argv[2]);
    if (getenv("GPU_KTEST_TOL")) g_tol = atof(getenv("GPU_KTEST_TOL"));
    /* GPU_KTEST_ONLY=conversions: the tests whose kernels decode weights with a GPU's
     * conversion instructions (the products and the blocks with the fast kernels), for the
     * builds that emulate them (build/gpu_ktest_gfx942, _gfx950); the rest are the same code */
    const char *only = getenv("GPU_KTEST_ONLY");
    const int all = !only || !*only;
    if (!all && strcmp(only, "conversions")) { fprintf(stderr, "GPU_KTEST_ONLY=%s: expected conversions\n", only); return 1; }
    test_matmul();
    test_gemv_tokens_as_one();
    if (all) {
        test_mma_instr();
        test_gemm_mma();
        test_embed();
        test_norms_rope();
        test_topk();
        test_moe_route();
        test_moe_route_nan();
        test_silu_mul();
        test_sample();
        test_argmax_rows();
        test_q_absorb();
        test_mla_attend();
        test_ix_scores();
        test_attend_tokens_as_one();
    }
    for (int i = 1; i < argc; i++) test_blocks_mode(argv[i], 0);
    if (argc > 1 && all) test_blocks_mode(argv[1], 1); /* the plain kernels, once */
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail != 0;
}
