/* fast.c - the fast CPU path: glm.c's heavy ops on the CPU's SIMD units.
 *
 * glm.c is the reference; this file computes the same ops faster, with the kernels
 * of simd.c (AVX-512, AVX-512 BF16, AVX2). fast_init() runs once at start: it picks
 * the kernel set and puts these functions into the table `ops` that forward() calls
 * through, so forward() has no branches for them. Where a kernel is missing (another
 * CPU, GLM_KERNELS=c) or a shape does not fit, glm.c's op stays.
 *
 *   fast_matmul        one token (decode): the rows of W in runs handed to threads as
 *                      they free up (matvec_jobs), each row dotted from its packed form;
 *                      a prompt chunk: 32 rows at a time decoded once into a panel that
 *                      every token streams through (fp32, or bf16 products);
 *                      a few tokens (a serve batch): each row decoded once for all
 *   fast_matmul_group  one token: every product of the group in one pool of runs
 *   fast_index_scores  the indexer's keys x heads as a GEMM, 256 keys at a time
 *   fast_mla_absorb    the absorb head by head; fast_mla_unabsorb: a pool of runs
 *   fast_mla_attend    absorbed MLA with GEMMs over blocks of keys and heads
 *   fast_moe_experts   one token: the chosen experts and the shared one as one pool;
 *                      a few tokens: every chosen expert on its tokens as one pool
 *
 * These pick their kernels by the number of rows, except for a prompt's rows under glm
 * serve (ops.prompt_rows): then every op computes each row the same in a chunk of any
 * length (prompt_rows_product, moe_prompt_rows), so that the prefix cache can hand out
 * any whole block of a prompt.
 *
 * Each is tested against the reference: tests/test_forward.py compares both paths'
 * logits with the NumPy reference, tests/kernels_test.c every kernel with plain loops.
 * The numbers in the comments were measured on the 2-vCPU AMD EPYC (Zen 5) VM this
 * project is developed on; the README's Speed table has the current ones.
 */
#include "glm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define PANEL_KC 512          /* columns of a panel chunk: 32 rows x 512 stay in L1/L2 with the tokens' slice */
/* MATVEC_MAX_TOKENS (glm.h): up to this many tokens a bf16 product streams the rows once for all (matvec_bf16_n) */
#define ROWS_MAX_TOKENS 64    /* up to this many a bf16 product skips the panel (gemm_rows_bf16) */
#define ATTN_HEAD_BLOCK 32    /* heads that share one pass over the selected cache rows */
#define KEY_BLOCK 128         /* cached rows per attention GEMM call: a block of keys */

static int g_threads = 1;
/* Below this much work (multiply-adds, counting at most 8 tokens) a product runs on
 * one thread: waking the others costs more. GLM_PARALLEL_MIN=0 makes every product
 * parallel, which the tests use to catch races on tiny models. */
static double g_parallel_min = 65536;
/* Weight products with activations rounded to bf16 (vdpbf16ps; ~1e-3 relative error per
 * product, as llama.cpp's bf16 path): the default where the CPU's vdpbf16ps outpaces its
 * fp32 FMA (kernels.bf16_speedup, AMD Zen 4/5). Prompts: twice the fp32 FMA rate there.
 * Decode: the weights go into the instruction as they are stored (after a shift or a
 * table lookup), a few instructions per 64 bytes fewer than widening them to fp32, which
 * keeps a core that is slow or shared up with memory. --fp32 keeps fp32 products. */
static int g_act_bf16 = 1;

/* Scratch, allocated by fast_prepare for the session's widths, chunk and context. */
static float *g_row_scratch;      /* [g_threads][g_scratch_cols] one decoded row */
static int g_scratch_cols;        /* the widest matrix's columns */
/* x as a SIMD matvec reads it (matvec_split_x / matvec_order_bf16): up to the widest
 * matrix rounded up to 128 columns */
#define XS_FOR(cols) (((size_t)(cols) + 128 + 15) & ~(size_t)15) /* floats of x's layout for a matrix of cols columns (64-byte rows) */
#define XS_COLS XS_FOR(g_scratch_cols)
static float *g_x_split;          /* [g_threads][XS_COLS] */
static float *g_panel;            /* [g_threads][g_panel_stride] a 32-row k-major panel, its rows, a spare row */
static size_t g_panel_stride;     /* max(65 * g_scratch_cols, PANEL_KC * 32 + PREFILL_CHUNK * 32) floats */
static uint16_t *g_x_bf16;        /* [cap][g_scratch_cols + 64] activations rounded to bf16 */
static float *g_pool_xs;          /* [max(2(n_active+1), 4)][XS_COLS] decode: each product's x as its kernel reads it */
static float *g_tokens_xs;        /* [g_threads][MATVEC_MAX_TOKENS][XS_COLS] a few tokens' x as their kernels read it */
static void *g_moe_x;             /* [MATVEC_MAX_TOKENS * (n_active + 1)][XS_COLS] a few tokens' MoE inputs, per expert (bf16, or fp32) */
static float *g_prompt_xs;        /* [cap rounded up to MATVEC_MAX_TOKENS][XS_COLS] a prompt's tokens of one expert as token_rows reads them */
static int g_moe_rows;            /* its rows */
static float *g_uv_xs;            /* [NH * MATVEC_MAX_TOKENS][XS_FOR(KR)] decode: each head's o_lat as W_UV's kernel reads it */
static float *g_scores;           /* [g_threads][ATTN_HEAD_BLOCK][PROBS_STRIDE(T)] attention scores of a head block */
static uint16_t *g_lat_bf16;      /* [T][KR+DR] the layer's cached latents rounded to bf16, or NULL */
static uint16_t *g_attn_bf16;     /* [g_threads][g_attn_bf16_stride] scratch: see attn_bf16_scratch */
static size_t g_attn_bf16_stride;
static int g_cap;                 /* tokens per chunk */

static void dequant_row(const Mat *W, int r, float *out) {
    if (kernels.dequant_row) kernels.dequant_row(W, r, out);
    else mat_dequant_row(W, r, out);
}

static float fdot(const float *a, const float *b, int n) {
    if (kernels.dot) return kernels.dot(a, b, n);
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void faxpy(float *y, float a, const float *x, int n) { /* y += a·x */
    if (kernels.axpy) { kernels.axpy(y, a, x, n); return; }
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* ======================================================================== */
/* weight products                                                          */

/* Rows r..r+nj-1 of W (nj <= 32) decoded into rows[32][cols], then transposed into
 * the k-major panel[k*32 + j] the prefill micro-kernels stream through; lanes past nj
 * hold zeros. */
static void build_panel(const Mat *W, int r, int nj, float *rows, float *panel) {
    const int K = W->cols;
    int k0 = 0;
    for (int j = 0; j < 32; j++) {
        if (j < nj) dequant_row(W, r + j, rows + (size_t)j * K);
        else memset(rows + (size_t)j * K, 0, (size_t)K * sizeof(float));
    }
    if (kernels.pack_panel) { /* SIMD transposes of whole 16x16 blocks */
        kernels.pack_panel(rows, K, K, panel);
        k0 = K & ~15;
    }
    for (int j = 0; j < 32; j++)
        for (int k = k0; k < K; k++) panel[(size_t)k * 32 + j] = rows[(size_t)j * K + k];
}

/* Whether one-token products with W go through the bf16 kernel (which then reads x as
 * matvec_order_bf16 lays it out) rather than the fp32 one (matvec_split_x). */
static int matvec_in_bf16(const Mat *W) { return g_act_bf16 && kernels.matvec_bf16 && W->fmt != WF_F32; }

/* One token's product y[i] = W[r0+i] · x, i < nr: a job for matvec_jobs. */
typedef struct {
    const Mat *W;
    int r0, nr;
    const float *x; /* [W->cols] */
    float *y;       /* [nr] */
} Matvec;

#ifndef RUN_MIN /* bytes of weights per run handed to a thread (-D to re-measure) */
#define RUN_MIN (1 << 20)
#endif
#ifndef RUN_MAX
#define RUN_MAX (8 << 20)
#endif
#ifndef RUN_TAIL /* the shortest run at the end of a call */
#define RUN_TAIL (256 << 10)
#endif

/* x of each job in its kernel's layout (xl[j]), into xs[j] ([njobs][xs_cols]); jobs with
 * the same x, format and width share one. Returns the jobs' bytes of weights. */
static double matvec_layouts(const Matvec *job, int njobs, float *xs, size_t xs_cols, const float **xl) {
    double total = 0;
    for (int j = 0; j < njobs; j++) {
        const Mat *W = job[j].W;
        total += (double)W->bytes * job[j].nr / W->rows;
        xl[j] = NULL;
        for (int i = 0; i < j && !xl[j]; i++)
            if (job[i].x == job[j].x && job[i].W->fmt == W->fmt && job[i].W->cols == W->cols) xl[j] = xl[i];
        if (!xl[j]) {
            float *buf = xs + (size_t)j * xs_cols;
            if (matvec_in_bf16(W)) matvec_order_bf16(W, job[j].x, buf);
            else matvec_split_x(W, job[j].x, buf);
            xl[j] = buf;
        }
    }
    return total;
}

/* Runs one-token products (decode) together: the rows of all of them in runs of up to
 * RUN_MAX bytes of weights, shorter toward the end, handed out as threads free up (with
 * runs of one size the threads spent 2.6-3.1% of a decode's products waiting for the last
 * one, 1.1-1.6% this way). Each run is one sequential stream, a thread the machine slows
 * down does not keep the other waiting at the end (1.10x over one fixed half per thread),
 * and several small products (the chosen experts) keep every thread busy however many
 * there are. xs: scratch [njobs][xs_cols], xs_cols >= XS_FOR(the widest job's columns). */
static void matvec_jobs(const Matvec *job, int njobs, float *xs, size_t xs_cols, int parallel) {
    const float *xl[njobs]; /* x of job j in its kernel's layout */
    const int threads = parallel ? g_threads : 1;
    const double total = matvec_layouts(job, njobs, xs, xs_cols, xl);
    /* Runs as long as the balance allows: each run restarts a prefetch stream (the first
     * few KB wait for memory), so 8 MB runs read the lm_head 5-10% faster than 1 MB ones.
     * But the threads should finish together: a run is ~1/(4 x threads) of the bytes not
     * yet handed out, at most run_bytes and at least RUN_TAIL, so runs shrink toward
     * the end. Threads take them in order from a cursor (job cj, row crow) as they free up. */
    double run_bytes = total / (8.0 * threads);
    run_bytes = run_bytes < RUN_MIN ? RUN_MIN : run_bytes > RUN_MAX ? RUN_MAX : run_bytes;
    int cj = 0, crow = 0;
    double left = total;
#pragma omp parallel if (parallel)
    for (;;) {
        int j, lo, hi;
#pragma omp critical(matvec_runs)
        {
            while (cj < njobs && crow >= job[cj].nr) { cj++; crow = 0; }
            j = cj;
            lo = hi = crow;
            if (j < njobs) {
                const double row_bytes = (double)job[j].W->bytes / job[j].W->rows;
                double want = left / (4.0 * threads);
                want = want > run_bytes ? run_bytes : want < RUN_TAIL ? RUN_TAIL : want;
                int rows = (int)(want / row_bytes) & ~3;
                if (rows < 4) rows = 4;
                hi = lo + rows < job[j].nr ? lo + rows : job[j].nr;
                crow = hi;
                left -= (hi - lo) * row_bytes;
            }
        }
        if (j >= njobs) break;
        const Matvec *jb = &job[j];
        if (matvec_in_bf16(jb->W)) kernels.matvec_bf16(jb->W, jb->r0 + lo, hi - lo, xl[j], jb->y + lo);
        else kernels.matvec(jb->W, jb->r0 + lo, hi - lo, jb->x, xl[j], jb->y + lo);
    }
}

/* The bf16 product of a prompt chunk, X already rounded (g_x_bf16, rows LDX apart): 32
 * rows by one k-chunk at a time, the chunk's panel (32 KB) built straight from the file
 * format and streamed through by every token while it sits in L1/L2. */
static void gemm_bf16_panels(float *y, int ldy, const Mat *W, int r0, int nr, int n, int LDX, int parallel) {
    const int K = W->cols, KP = (K + 31) & ~31, KC = PANEL_KC;
    (void)parallel; /* read only by the pragma: unused in a build without OpenMP (make fuzz) */
#pragma omp parallel if (parallel)
    {
        float *scratch = g_panel + (size_t)thread_id() * g_panel_stride;
        uint32_t *panel = (uint32_t *)scratch, *stage = panel + (size_t)KC / 2 * 32;
        /* the 32 rows' sums for every token, 32 floats apart: y's own rows are W->rows
         * floats apart, a multiple of 4 KB at GLM widths, so a tile's 12 token rows
         * would share one L1 set (summing into y directly cost 20% of the products) */
        float *ytile = (float *)(stage + (size_t)KC / 2 * 32);
        uint16_t *block = (uint16_t *)(ytile + (size_t)PREFILL_CHUNK * 32); /* [32][K] copy of BF16 rows */
#pragma omp for schedule(dynamic, 1)
        for (int rb = 0; rb < nr; rb += 32) {
            int nj = nr - rb < 32 ? nr - rb : 32;
            memset(ytile, 0, (size_t)n * 32 * sizeof(float));
            /* BF16 rows are used as they are, and 32 of them are one contiguous run of the
             * file: copied in one sequential pass (which the hardware prefetcher streams),
             * the chunks are then cut from cache instead of from 32 strided DRAM streams */
            Mat blk = *W;
            int rs = r0 + rb;
            if (W->fmt == WF_BF16 && block + (size_t)32 * K <= (uint16_t *)(scratch + g_panel_stride)) {
                memcpy(block, (const uint16_t *)W->w + (size_t)rs * K, (size_t)nj * K * sizeof(uint16_t));
                blk.w = (const uint8_t *)block;
                rs = 0;
            }
            for (int k0 = 0; k0 < KP; k0 += KC) {
                int kc = KP - k0 < KC ? KP - k0 : KC;
                kernels.build_panel_bf16(&blk, rs, nj, k0, kc, stage, panel);
                kernels.gemm_panel_bf16((const uint16_t *)panel, kc, g_x_bf16 + k0, LDX, n, ytile, 32, nj);
            }
            for (int t = 0; t < n; t++) memcpy(y + (size_t)t * ldy + rb, ytile + (size_t)t * 32, (size_t)nj * sizeof(float));
        }
    }
}

/* x's rows as W's kernel reads them (rows: which rows of x, NULL for the first n), into
 * rows XS_COLS apart: bf16 products: matvec_order_bf16's layout rounded (matvec_bf16_n's
 * xb); fp32: pack_tokens_x's layout where the CPU has matvec_n_packed, else for MXFP4
 * matvec_split_x's layout, its only reader, and x itself for the other formats, so that
 * one buffer serves matvec_n as both x and xs. */
static void token_layouts(const Mat *W, const float *x, int ldx, const int *rows, int n, void *out) {
    const int np = (W->cols + 127) & ~127;
    float *layout = g_x_split + (size_t)thread_id() * XS_COLS;
    if (!matvec_in_bf16(W) && kernels.matvec_n_packed) {
        pack_tokens_x(W, x, (size_t)ldx, rows, n, out);
        return;
    }
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)(rows ? rows[t] : t) * ldx;
        if (matvec_in_bf16(W)) {
            matvec_order_bf16(W, xt, layout);
            kernels.round_bf16(layout, np, (uint16_t *)out + (size_t)t * XS_COLS, np);
        } else if (W->fmt == WF_MXFP4) matvec_split_x(W, xt, (float *)out + (size_t)t * XS_COLS);
        else memcpy((float *)out + (size_t)t * XS_COLS, xt, (size_t)W->cols * sizeof(float));
    }
}

/* bytes per element of token_layouts' rows for W */
static size_t layout_bytes(const Mat *W) { return matvec_in_bf16(W) ? sizeof(uint16_t) : sizeof(float); }

/* whether a few tokens' product with W has a kernel that gives each token its lone sums */
static int few_tokens_kernel(const Mat *W) {
    return matvec_in_bf16(W) ? kernels.matvec_bf16_n != NULL : kernels.matvec_n_packed || kernels.matvec_n;
}

/* Rows per run of a few tokens' product over nr rows of W: ~8 runs per thread, 256 KB
 * .. 1 MB each, which threads take as they free up. */
static int token_run_rows(const Mat *W, int nr, int parallel) {
    const int threads = parallel ? g_threads : 1;
    double run = (double)W->bytes * nr / W->rows / (8.0 * threads);
    run = run < RUN_TAIL ? RUN_TAIL : run > RUN_MIN ? RUN_MIN : run;
    const int rows = (int)(run / ((double)W->bytes / W->rows));
    return rows < 1 ? 1 : rows;
}

/* Rows [r0, r0+nr) of W for n tokens whose x token_layouts laid out in xb: y[t*ldy + i],
 * each token's sums its one-token product's (few_tokens_kernel said there is a kernel). */
static void token_rows(const Mat *W, int r0, int nr, const void *xb, int n, float *y, size_t ldy) {
    if (matvec_in_bf16(W)) kernels.matvec_bf16_n(W, r0, nr, xb, XS_COLS, n, y, ldy);
    else if (kernels.matvec_n_packed) kernels.matvec_n_packed(W, r0, nr, xb, n, y, ldy);
    else kernels.matvec_n(W, r0, nr, xb, XS_COLS, xb, XS_COLS, n, y, ldy);
}

/* A few tokens (the sequences of a serve batch, a draft being checked, an expert's share
 * of them): every row streams from memory once and serves all tokens (matvec_bf16_n), in
 * runs over the threads as in matvec_jobs. Each token's x is laid out and rounded once. A
 * token's results are bit for bit those of its one-token product: a batch changes no bit
 * of a sequence's decode (glm serve's batch invariance). */
static void matvec_tokens(float *y, int ldy, const float *x, int ldx, const Mat *W, int r0, int nr, int n, int parallel) {
    uint16_t *xb = (uint16_t *)(g_tokens_xs + (size_t)thread_id() * MATVEC_MAX_TOKENS * XS_COLS);
    token_layouts(W, x, ldx, NULL, n, xb);
    const int rows = token_run_rows(W, nr, parallel);
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
    for (int lo = 0; lo < nr; lo += rows)
        kernels.matvec_bf16_n(W, r0 + lo, nr - lo < rows ? nr - lo : rows, xb, XS_COLS, n, y + lo, (size_t)ldy);
}

/* matvec_tokens for products in fp32 where the CPU has kernels.matvec_n_packed (AVX-512)
 * or matvec_n (AVX2): each token's x laid out once for W's format, every row decoded once
 * for all tokens, and each token's results bit for bit its one-token matvec's. */
static void matvec_tokens_f32(float *y, int ldy, const float *x, int ldx, const Mat *W, int r0, int nr, int n, int parallel) {
    float *xs = g_tokens_xs + (size_t)thread_id() * MATVEC_MAX_TOKENS * XS_COLS;
    const int packed = kernels.matvec_n_packed != NULL;
    if (packed) pack_tokens_x(W, x, (size_t)ldx, NULL, n, xs);
    else
        for (int t = 0; t < n; t++) matvec_split_x(W, x + (size_t)t * ldx, xs + (size_t)t * XS_COLS);
    const int rows = token_run_rows(W, nr, parallel);
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
    for (int lo = 0; lo < nr; lo += rows) {
        const int nrun = nr - lo < rows ? nr - lo : rows;
        if (packed) kernels.matvec_n_packed(W, r0 + lo, nrun, xs, n, y + lo, (size_t)ldy);
        else kernels.matvec_n(W, r0 + lo, nrun, x, (size_t)ldx, xs, XS_COLS, n, y + lo, (size_t)ldy);
    }
}

/* x's n rows rounded to bf16 into g_x_bf16 (zero-padded to KP = cols rounded up to 32);
 * returns their stride. Token rows are KP + 32 apart: at a multiple of 4 KB (GLM widths)
 * the rows a tile reads would share L1 sets and evict each other (measured 20% slower). */
static int round_rows_bf16(const float *x, int ldx, int K, int n, int parallel) {
    const int KP = (K + 31) & ~31, LDX = KP + 32;
    (void)parallel; /* read only by the pragma: unused in a build without OpenMP (make fuzz) */
#pragma omp parallel for schedule(static) if (parallel) /* one thread alone: ~1% of a prefill */
    for (int t = 0; t < n; t++) kernels.round_bf16(x + (size_t)t * ldx, K, g_x_bf16 + (size_t)t * LDX, KP);
    return LDX;
}

/* The bf16 product of a few dozen tokens already in g_x_bf16, without a panel: 4 rows
 * of W at a time dequantized once into a small buffer, each token's dot products with
 * them summed along k (gemm_rows_bf16). */
static void rows_bf16(float *y, int ldy, const Mat *W, int r0, int nr, int n, int LDX, int parallel) {
    (void)parallel;
#pragma omp parallel if (parallel)
    {
        uint16_t *wbuf = (uint16_t *)(g_panel + (size_t)thread_id() * g_panel_stride);
#pragma omp for schedule(dynamic, 4)
        for (int i = 0; i < nr; i += 4)
            kernels.gemm_rows_bf16(W, r0 + i, nr - i < 4 ? nr - i : 4, g_x_bf16, LDX, n, y + i, ldy, wbuf);
    }
}

/* The fp32 product of a chunk: 32 rows at a time are decoded once into a k-major panel;
 * then every token streams through it in k-chunks small enough to stay in L2. */
static void panel_f32(float *y, int ldy, const float *x, int ldx, const Mat *W, int r0, int nr, int n, int parallel) {
    const int K = W->cols, KC = 512;
    (void)parallel;
#pragma omp parallel if (parallel)
    {
        float *panel = g_panel + (size_t)thread_id() * g_panel_stride, *rows = panel + (size_t)32 * g_scratch_cols;
#pragma omp for schedule(dynamic, 1)
        for (int rb = 0; rb < nr; rb += 32) {
            int nj = nr - rb < 32 ? nr - rb : 32;
            build_panel(W, r0 + rb, nj, rows, panel);
            for (int t = 0; t < n; t++) memset(y + (size_t)t * ldy + rb, 0, (size_t)nj * sizeof(float));
            for (int k0 = 0; k0 < K; k0 += KC)
                kernels.gemm_panel(panel + (size_t)k0 * 32, 32, K - k0 < KC ? K - k0 : KC, x + k0, ldx, n, y + rb, ldy, nj);
        }
    }
}

/* Without a panel kernel: a row decoded once, dotted with each token. */
static void dot_rows(float *y, int ldy, const float *x, int ldx, const Mat *W, int r0, int nr, int n, int parallel) {
    (void)parallel;
#pragma omp parallel if (parallel)
    {
        float *row = g_row_scratch + (size_t)thread_id() * g_scratch_cols;
#pragma omp for schedule(static)
        for (int i = 0; i < nr; i++) {
            dequant_row(W, r0 + i, row);
            for (int t = 0; t < n; t++) y[(size_t)t * ldy + i] = fdot(row, x + (size_t)t * ldx, W->cols);
        }
    }
}

/* threads only pay off when there is real work: a tiny product runs on one */
static int worth_threads(const Mat *W, int nr, int n) { return (double)nr * W->cols * (n < 8 ? n : 8) > g_parallel_min; }

/* A product of a prompt's rows (ops.prompt_rows, glm serve): the kernel may not depend
 * on n, for a row's sums must come out the same in a chunk of any length and with any
 * rows beside it (the prefix cache hands out any whole block of a prompt, and the rows
 * after it then run in chunks that start elsewhere). Each kernel below computes every
 * (token, row) sum by the same operations whatever the other tokens are, so one kernel
 * per matrix is enough: the panel (bf16 or fp32; a short last chunk pays for building
 * one), or where the CPU has none one dot product per row and token. The routed
 * experts take another (expert_product). */
static void prompt_rows_product(float *y, int ldy, const float *x, int ldx, const Mat *W, int r0, int nr, int n) {
    const int parallel = worth_threads(W, nr, n);
    if (g_act_bf16 && kernels.gemm_panel_bf16)
        gemm_bf16_panels(y, ldy, W, r0, nr, n, round_rows_bf16(x, ldx, W->cols, n, parallel), parallel);
    else if (kernels.gemm_panel) panel_f32(y, ldy, x, ldx, W, r0, nr, n, parallel);
    else dot_rows(y, ldy, x, ldx, W, r0, nr, n, parallel);
}

/* y[t*ldy + i] = Σ_k x[t*ldx + k] · W[r0+i][k] for rows i in [0, nr), tokens t in [0, n):
 * a prompt's rows as above, else the kernel that is fastest for n tokens. */
static void matmul_rows(float *y, int ldy, const float *x, int ldx, const Mat *W, int r0, int nr, int n) {
    if (n <= 0) return;
    if (ops.prompt_rows) { prompt_rows_product(y, ldy, x, ldx, W, r0, nr, n); return; }
    const int parallel = worth_threads(W, nr, n);
    if (n == 1) {
        Matvec job = {W, r0, nr, x, y};
        matvec_jobs(&job, 1, g_x_split + (size_t)thread_id() * XS_COLS, XS_COLS, parallel);
        return;
    }
    if (n <= MATVEC_MAX_TOKENS && matvec_in_bf16(W) && kernels.matvec_bf16_n) {
        matvec_tokens(y, ldy, x, ldx, W, r0, nr, n, parallel);
        return;
    }
    if (n <= MATVEC_MAX_TOKENS && !matvec_in_bf16(W)) {
        /* products in fp32 of a few tokens (--fp32, a CPU without bf16 products, an F32
         * matrix): each token's sums are its decode's whatever runs beside it (glm serve's
         * batch invariance, --draft's verify pass): the multi-token kernel where the CPU
         * has one, else one one-token product each (the rows read once per token) */
        if (kernels.matvec_n_packed || kernels.matvec_n) {
            matvec_tokens_f32(y, ldy, x, ldx, W, r0, nr, n, parallel);
            return;
        }
        Matvec job[MATVEC_MAX_TOKENS];
        for (int t = 0; t < n; t++) job[t] = (Matvec){W, r0, nr, x + (size_t)t * ldx, y + (size_t)t * ldy};
        matvec_jobs(job, n, g_tokens_xs + (size_t)thread_id() * MATVEC_MAX_TOKENS * XS_COLS, XS_COLS, parallel);
        return;
    }
    if (g_act_bf16 && kernels.gemm_panel_bf16) {
        const int LDX = round_rows_bf16(x, ldx, W->cols, n, parallel);
        /* few tokens (an expert's share of a chunk): 4 rows at a time, no panel */
        if (n <= ROWS_MAX_TOKENS && kernels.gemm_rows_bf16) rows_bf16(y, ldy, W, r0, nr, n, LDX, parallel);
        else gemm_bf16_panels(y, ldy, W, r0, nr, n, LDX, parallel);
        return;
    }
    /* fp32: the panel from 8 tokens on; fewer (an expert's share of a chunk), or no panel kernel: a row at a time */
    if (kernels.gemm_panel && n >= 8) panel_f32(y, ldy, x, ldx, W, r0, nr, n, parallel);
    else dot_rows(y, ldy, x, ldx, W, r0, nr, n, parallel);
}

static void fast_matmul(float *y, const float *x, const Mat *W, int n) {
    matmul_rows(y, W->rows, x, W->cols, W, 0, W->rows, n);
}

/* For one token the products are one pool of runs in matvec_jobs: one parallel region
 * and one tail where each alone had its own, and the small ones (the indexer's key and
 * gate rows, 0.4-1.6 MB) stream beside the big ones instead of each paying a call's
 * start and end. */
static void fast_matmul_group(const Product *p, int np, int n) {
    if (n > 1 || ops.prompt_rows) {
        for (int i = 0; i < np; i++) fast_matmul(p[i].y, p[i].x, p[i].W, n);
        return;
    }
    Matvec job[np];
    double work = 0; /* threads only pay off when there is real work, as in matmul_rows */
    for (int i = 0; i < np; i++) {
        job[i] = (Matvec){p[i].W, 0, p[i].W->rows, p[i].x, p[i].y};
        work += (double)p[i].W->rows * p[i].W->cols;
    }
    matvec_jobs(job, np, g_pool_xs, XS_COLS, work > g_parallel_min);
}

/* ======================================================================== */
/* the indexer                                                              */

/* out[j] = Σ_h wh[h]·ReLU(d[j*32 + h]·q_scale): a key's score from its 32 heads' dot
 * products (the GEMM's output; wh zero past the real heads). */
static void relu_sums(const float *d, int n, const float *wh, float q_scale, float *out) {
    if (kernels.index_relu_sums) { kernels.index_relu_sums(d, n, wh, q_scale, out); return; }
    for (int j = 0; j < n; j++) {
        float sum = 0.0f;
        for (int h = 0; h < 32; h++) {
            float x = d[(size_t)j * 32 + h] * q_scale;
            sum += wh[h] * (x > 0.0f ? x : 0.0f);
        }
        out[j] = sum;
    }
}

/* Keys x heads dot products as a GEMM: the keys are the "tokens", the heads the rows
 * of a panel of q transposed; 256 keys at a time, split across threads for decode. */
static void fast_index_scores(const Config *c, const float *q, const float *w, const float *keys, int n_keys, float *score) {
    const int IH = c->index_n_heads, ID = c->index_head_dim;
    float *qt = g_panel + (size_t)thread_id() * g_panel_stride, *qh = qt + (size_t)ID * 32; /* [ID][32], then [256][32] per thread */
    for (int h = 0; h < 32; h++) /* pack_panel wants 32 rows; heads past IH are zero */
        if (h >= IH) memset(qh + (size_t)h * ID, 0, (size_t)ID * sizeof(float));
        else memcpy(qh + (size_t)h * ID, q + (size_t)h * ID, (size_t)ID * sizeof(float));
    kernels.pack_panel(qh, ID, ID, qt);
    const float q_scale = 1.0f / sqrtf((float)ID), w_scale = 1.0f / sqrtf((float)IH);
    float wh[32] = {0}; /* the heads' weights as glm.c's index_score scales them; zero past IH */
    for (int h = 0; h < IH; h++) wh[h] = w[h] * w_scale;
    /* in a parallel region of its own for decode (one inside the chunk's token loop
     * runs serially): a nested team on the 2-core VM waited for the outer team's
     * spinning threads, and two threads scanned 4096 keys slower than one */
#pragma omp parallel for schedule(dynamic, 1) if (n_keys > 512)
    for (int j0 = 0; j0 < n_keys; j0 += 256) {
        int nk = n_keys - j0 < 256 ? n_keys - j0 : 256;
        float *kh = g_panel + (size_t)thread_id() * g_panel_stride + (size_t)ID * 32; /* after qt */
        memset(kh, 0, (size_t)nk * 32 * sizeof(float));
        kernels.gemm_panel(qt, 32, ID, keys + (size_t)j0 * ID, ID, nk, kh, 32, IH);
        relu_sums(kh, nk, wh, q_scale, score + j0);
    }
}

/* ======================================================================== */
/* MLA attention                                                            */

/* Row stride (in elements) of the heads' scores and probabilities over ns keys: past ns,
 * and never a multiple of 4 KB. The value sums broadcast 12 heads' probabilities at once;
 * rows 2048 keys apart (8 KB in fp32, 4 KB in bf16) all fell in one L1 set, and the
 * decode attention of 2048 keys ran at a tenth of the FMA peak. */
#define PROBS_STRIDE(ns) ((((size_t)(ns) + 31) & ~(size_t)31) + 16)

/* One thread's scratch for the bf16 attention products, in bf16 words; each part starts
 * on a 64-byte boundary. Returns the words needed; with base set, points the parts into it.
 *   absorb (per head):  w_uk [DN][KR] its W_UK rows, xq [cap][DN even] the q_nope of the
 *                       chunk's tokens, pairs [DN/2][32] words of one 32-column panel
 *   attend (per token and head block): qa [32][AD] the heads' q_abs, panel [ADP/2][32]
 *                       words of it (ADP = AD rounded up to 32) with stage [32][ADP/2] words
 *                       to build it, keys [KEY_BLOCK][AD] gathered rows, pairs
 *                       [KEY_BLOCK/2][32] words of value panel, probs [32][topk even] */
typedef struct { uint16_t *w_uk, *xq, *qa, *keys, *probs; uint32_t *absorb_pairs, *panel, *stage, *value_pairs; } AttnBf16;

static size_t attn_bf16_scratch(const Config *c, int cap, size_t topk, uint16_t *base, AttnBf16 *p) {
    const size_t DN = (size_t)c->qk_nope, DNE = (DN + 1) & ~(size_t)1, KR = (size_t)c->kv_lora_rank;
    const size_t AD = KR + (size_t)c->qk_rope, ADP = (AD + 31) & ~(size_t)31;
    size_t off = 0;
#define PART(ptr, type, words) do { if (p) p->ptr = (type *)(base + off); off += ((size_t)(words) + 31) & ~(size_t)31; } while (0)
    PART(w_uk, uint16_t, DN * KR);
    PART(xq, uint16_t, (size_t)cap * DNE);
    PART(absorb_pairs, uint32_t, DNE * 32);
    size_t absorb = off;
    off = 0;
    PART(qa, uint16_t, 32 * AD);
    PART(panel, uint32_t, ADP * 32);
    PART(stage, uint32_t, ADP * 32);
    PART(keys, uint16_t, (size_t)KEY_BLOCK * AD);
    PART(value_pairs, uint32_t, (size_t)KEY_BLOCK * 32);
    PART(probs, uint16_t, 32 * PROBS_STRIDE(topk));
#undef PART
    return absorb > off ? absorb : off;
}

/* This thread's bf16 attention scratch. */
static AttnBf16 thread_attn_bf16(const Config *c, int ctx) {
    AttnBf16 b;
    const int K = c->index_topk;
    attn_bf16_scratch(c, g_cap, (size_t)(K < ctx ? K : ctx), g_attn_bf16 + (size_t)thread_id() * g_attn_bf16_stride, &b);
    return b;
}

/* The cached latent rows of keys sel[0..nk) as nk rows of AD floats: in place when they
 * are consecutive positions (a prompt attending to its own prefix), else copied into buf. */
static const float *key_rows(const float *latent, int AD, const int *sel, int nk, float *buf) {
    int consecutive = sel[nk - 1] - sel[0] == nk - 1;
    for (int j = 1; j < nk && consecutive; j++) consecutive = sel[j] == sel[j - 1] + 1;
    if (consecutive) return latent + (size_t)sel[0] * AD;
    for (int j = 0; j < nk; j++) memcpy(buf + (size_t)j * AD, latent + (size_t)sel[j] * AD, (size_t)AD * sizeof(float));
    return buf;
}

/* The same for the bf16 copy of the rows (g_lat_bf16). */
static const uint16_t *key_rows_bf16(const uint16_t *lat, int AD, const int *sel, int nk, uint16_t *buf) {
    int consecutive = sel[nk - 1] - sel[0] == nk - 1;
    for (int j = 1; j < nk && consecutive; j++) consecutive = sel[j] == sel[j - 1] + 1;
    if (consecutive) return lat + (size_t)sel[0] * AD;
    for (int j = 0; j < nk; j++) memcpy(buf + (size_t)j * AD, lat + (size_t)sel[j] * AD, (size_t)AD * sizeof(uint16_t));
    return buf;
}

/* absorb for head h: q_abs[t][h][0:KR] = Σ_i q_nope[t][h][i] · W_UK[h][i][:]. W_UK[h] is
 * already k-major (row i, latent column j), so for a prompt the GEMM micro-kernel reads
 * 32 of its columns at a time in place (ldp = KR). bf16: a prompt chunk with bf16
 * products; the k of this product runs down W_UK's rows: 32 columns at a time are
 * interleaved into row pairs, the tokens' q_nope streams through them. Up to
 * MATVEC_MAX_TOKENS tokens (decode steps) take the one-token arithmetic each. */
static void absorb_head(const Config *c, const Layer *L, RunState *s, int n, int h, int bf16, const AttnBf16 *b) {
    const int NH = c->n_heads, DN = c->qk_nope, DR = c->qk_rope, DV = c->v_head, KR = c->kv_lora_rank;
    const int QD = DN + DR, AD = KR + DR;
    float *row = g_row_scratch + (size_t)thread_id() * g_scratch_cols;
    for (int t = 0; t < n; t++) {
        memset(s->q_abs + ((size_t)t * NH + h) * AD, 0, (size_t)KR * sizeof(float));
        memcpy(s->q_abs + ((size_t)t * NH + h) * AD + KR, s->q + ((size_t)t * NH + h) * QD + DN, (size_t)DR * sizeof(float));
    }
    if (bf16) {
        const int DNE = (DN + 1) & ~1;
        for (int i = 0; i < DN; i++) {
            dequant_row(&L->kv_b, h * (DN + DV) + i, row);
            kernels.round_bf16(row, KR, b->w_uk + (size_t)i * KR, KR);
        }
        for (int t = 0; t < n; t++) kernels.round_bf16(s->q + ((size_t)t * NH + h) * QD, DN, b->xq + (size_t)t * DNE, DNE);
        for (int j0 = 0; j0 < KR; j0 += 32) {
            int nj = KR - j0 < 32 ? KR - j0 : 32;
            kernels.pack_pairs_bf16(b->w_uk + j0, KR, NULL, DN, nj, b->absorb_pairs);
            kernels.gemm_panel_bf16((const uint16_t *)b->absorb_pairs, DNE, b->xq, DNE, n, s->q_abs + (size_t)h * AD + j0, NH * AD, nj);
        }
    } else if ((n > MATVEC_MAX_TOKENS || ops.prompt_rows) && kernels.gemm_panel && (size_t)DN * KR <= g_panel_stride) {
        float *w_uk = g_panel + (size_t)thread_id() * g_panel_stride; /* [DN][KR] */
        for (int i = 0; i < DN; i++) dequant_row(&L->kv_b, h * (DN + DV) + i, w_uk + (size_t)i * KR);
        for (int j0 = 0; j0 < KR; j0 += 32)
            kernels.gemm_panel(w_uk + j0, KR, DN, s->q + (size_t)h * QD, NH * QD, n, s->q_abs + (size_t)h * AD + j0, NH * AD,
                               KR - j0 < 32 ? KR - j0 : 32);
    } else if (L->kv_b.fmt == WF_BF16 && kernels.matvec_transposed_bf16) {
        /* a decode step's few tokens: each token's own pass (the 192 KB of W_UK[h] stay in
         * L2 for the next), so its q_abs is the same whatever runs beside it */
        for (int t = 0; t < n; t++)
            kernels.matvec_transposed_bf16(&L->kv_b, h * (DN + DV), DN, s->q + ((size_t)t * NH + h) * QD, s->q_abs + ((size_t)t * NH + h) * AD);
    } else {
        for (int i = 0; i < DN; i++) {
            dequant_row(&L->kv_b, h * (DN + DV) + i, row);
            for (int t = 0; t < n; t++) faxpy(s->q_abs + ((size_t)t * NH + h) * AD, s->q[((size_t)t * NH + h) * QD + i], row, KR);
        }
    }
}

/* Scores of heads h0..h0+nh-1 of token t over its selected keys into score[nh][lds]:
 * GEMMs over blocks of KEY_BLOCK keys (in place when consecutive) with the block's heads
 * as the panel (their q_abs packed k-major once, the cached rows streaming through it as
 * "tokens"); bf16 from the bf16 copy of the rows. */
static void head_block_scores(const Config *c, const float *latent, const float *qa, const int *sel, int ns, int nh,
                              float scale, int bf16, const AttnBf16 *b, float *score, size_t lds) {
    const int AD = c->kv_lora_rank + c->qk_rope;
    float *qp = g_panel + (size_t)thread_id() * g_panel_stride; /* [AD][32] the heads, k-major */
    float *keys = qp + (size_t)AD * 32;                          /* [32][AD] staging, then [KEY_BLOCK][AD] rows */
    float *st = keys + (size_t)AD * (32 + KEY_BLOCK);            /* [ns][32] scores, key-major */
    memset(st, 0, (size_t)ns * 32 * sizeof(float));
    if (bf16) { /* the heads' q_abs in bf16 are a small BF16 matrix [nh][AD]: its panel is built like a weight's */
        for (int h = 0; h < nh; h++) kernels.round_bf16(qa + (size_t)h * AD, AD, b->qa + (size_t)h * AD, AD);
        const Mat heads = {.fmt = WF_BF16, .rows = nh, .cols = AD, .w = (const uint8_t *)b->qa};
        kernels.build_panel_bf16(&heads, 0, nh, 0, (AD + 31) & ~31, b->stage, b->panel);
        for (int j0 = 0; j0 < ns; j0 += KEY_BLOCK) {
            int nk = ns - j0 < KEY_BLOCK ? ns - j0 : KEY_BLOCK;
            kernels.gemm_panel_bf16((const uint16_t *)b->panel, AD, key_rows_bf16(g_lat_bf16, AD, sel + j0, nk, b->keys), AD, nk,
                                    st + (size_t)j0 * 32, 32, nh);
        }
    } else {
        const float *heads = qa;
        if (nh < 32) { /* pack_panel reads 32 rows */
            memcpy(keys, qa, (size_t)nh * AD * sizeof(float));
            memset(keys + (size_t)nh * AD, 0, (size_t)(32 - nh) * AD * sizeof(float));
            heads = keys;
        }
        kernels.pack_panel(heads, AD, AD, qp);
        for (int j0 = 0; j0 < ns; j0 += KEY_BLOCK) {
            int nk = ns - j0 < KEY_BLOCK ? ns - j0 : KEY_BLOCK;
            kernels.gemm_panel(qp, 32, AD, key_rows(latent, AD, sel + j0, nk, keys + (size_t)AD * 32), AD, nk, st + (size_t)j0 * 32, 32, nh);
        }
    }
    for (int h = 0; h < nh; h++)
        for (int j = 0; j < ns; j++) score[(size_t)h * lds + j] = st[(size_t)j * 32 + h] * scale;
}

/* o[h] = Σ_j p[h][j] · row j[0:KR] for the block's heads: the rows are the panel
 * (k-major already, ldp = AD) and the heads' probabilities the tokens; bf16: the k of
 * this product runs down the key rows, interleaved in pairs 32 columns at a time. */
static void head_block_values(const Config *c, const float *latent, const int *sel, int ns, int nh, int bf16,
                              const AttnBf16 *b, float *score, size_t lds, float *o) {
    const int KR = c->kv_lora_rank, AD = KR + c->qk_rope;
    memset(o, 0, (size_t)nh * KR * sizeof(float));
    if (bf16) {
        const int nsp = (int)lds; /* even */
        for (int h = 0; h < nh; h++) kernels.round_bf16(score + (size_t)h * lds, ns, b->probs + (size_t)h * nsp, nsp);
        for (int j0 = 0; j0 < ns; j0 += KEY_BLOCK) {
            int nk = ns - j0 < KEY_BLOCK ? ns - j0 : KEY_BLOCK;
            for (int d0 = 0; d0 < KR; d0 += 32) {
                int nj = KR - d0 < 32 ? KR - d0 : 32;
                kernels.pack_pairs_bf16(g_lat_bf16 + d0, AD, sel + j0, nk, nj, b->value_pairs);
                kernels.gemm_panel_bf16((const uint16_t *)b->value_pairs, (nk + 1) & ~1, b->probs + j0, nsp, nh, o + d0, KR, nj);
            }
        }
        return;
    }
    float *keys = g_panel + (size_t)thread_id() * g_panel_stride + (size_t)AD * 32;
    for (int j0 = 0; j0 < ns; j0 += KEY_BLOCK) {
        int nk = ns - j0 < KEY_BLOCK ? ns - j0 : KEY_BLOCK;
        const float *rows = key_rows(latent, AD, sel + j0, nk, keys + (size_t)AD * 32);
        for (int d0 = 0; d0 < KR; d0 += 32)
            kernels.gemm_panel(rows + d0, AD, nk, score + j0, (int)lds, nh, o + d0, KR, KR - d0 < 32 ? KR - d0 : 32);
    }
}

/* un-absorb: o_heads[t][h] = W_UV[h] · o_lat[t][h]. One token: NH small products (DV
 * rows) as one matvec_jobs pool (1.8x the GB/s of a parallel loop over heads of one
 * product each, whose per-call costs, x's layout and a nested parallel region, weigh on
 * 256 KB of weights). A decode batch's few tokens: a head per job, its rows decoded once
 * for all the tokens by the few-token kernel (token_rows), each token's sums its
 * one-token product's. A prompt chunk: a product of its tokens per head. */
static void fast_mla_unabsorb(const Config *c, const Layer *L, RunState *s, int n) {
    const int NH = c->n_heads, DN = c->qk_nope, DV = c->v_head, KR = c->kv_lora_rank;
    if (ops.prompt_rows) /* a product of its tokens per head, as a longer chunk's (matmul_rows) */
        for (int h = 0; h < NH; h++)
            matmul_rows(s->o_heads + (size_t)h * DV, NH * DV, s->o_lat + (size_t)h * KR, NH * KR, &L->kv_b, h * (DN + DV) + DN, DV, n);
    else if (n > 1 && n <= MATVEC_MAX_TOKENS && few_tokens_kernel(&L->kv_b)) {
#pragma omp parallel for schedule(dynamic, 1)
        for (int h = 0; h < NH; h++) {
            void *xb = g_tokens_xs + (size_t)thread_id() * MATVEC_MAX_TOKENS * XS_COLS;
            token_layouts(&L->kv_b, s->o_lat + (size_t)h * KR, NH * KR, NULL, n, xb);
            token_rows(&L->kv_b, h * (DN + DV) + DN, DV, xb, n, s->o_heads + (size_t)h * DV, (size_t)NH * DV);
        }
    } else if (n <= MATVEC_MAX_TOKENS) {
        Matvec job[NH * n];
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < n; t++)
                job[h * n + t] = (Matvec){&L->kv_b, h * (DN + DV) + DN, DV, s->o_lat + ((size_t)t * NH + h) * KR, s->o_heads + ((size_t)t * NH + h) * DV};
        matvec_jobs(job, NH * n, g_uv_xs, XS_FOR(KR), 1);
    } else
        for (int h = 0; h < NH; h++)
            matmul_rows(s->o_heads + (size_t)h * DV, NH * DV, s->o_lat + (size_t)h * KR, NH * KR, &L->kv_b, h * (DN + DV) + DN, DV, n);
}

/* glm.c's mla_absorb, head by head on the threads (absorb_head). */
static void fast_mla_absorb(const Config *c, const Layer *L, RunState *s, int n) {
    const int bf16 = (n > MATVEC_MAX_TOKENS || ops.prompt_rows) && g_lat_bf16 && (c->kv_lora_rank + c->qk_rope) % 2 == 0;
#pragma omp parallel
    {
        AttnBf16 b = {0};
        if (bf16) b = thread_attn_bf16(c, c->index_topk); /* (the absorb's parts do not depend on the context) */
#pragma omp for schedule(static)
        for (int h = 0; h < c->n_heads; h++) absorb_head(c, L, s, n, h, bf16, &b);
    }
}

/* glm.c's mla_attend_absorbed, with the products as GEMMs: scores, softmax and the
 * latent value sum per (token, block of heads), so the heads of a block share each
 * cached row while it is in L1 and a long context is read once per block rather than
 * once per head. A prompt chunk with bf16 products runs them in bf16 (vdpbf16ps), from
 * the cached latents rounded to bf16. */
static void fast_mla_attend(const Model *m, const Layer *L, const KVCache *kv, RunState *s, int layer, int n, int pos0) {
    (void)L;
    const Config *c = &m->cfg;
    const int NH = c->n_heads, KR = c->kv_lora_rank, AD = KR + c->qk_rope, K = c->index_topk;
    const float *latent = kv->latent + (size_t)layer * kv->ctx * AD;
    const float scale = 1.0f / sqrtf((float)(c->qk_nope + c->qk_rope)); /* pitfall 7 */
    const int bf16 = (n >= 8 || ops.prompt_rows) && g_lat_bf16 && AD % 2 == 0;
    if (bf16) { /* the rows this chunk may read, once per layer and chunk */
#pragma omp parallel for schedule(static)
        for (int r = 0; r < pos0 + n; r++) kernels.round_bf16(latent + (size_t)r * AD, AD, g_lat_bf16 + (size_t)r * AD, AD);
    }
    const int HB = ATTN_HEAD_BLOCK, n_blocks = (NH + HB - 1) / HB;
#pragma omp parallel for schedule(dynamic, 1) collapse(2)
    for (int t = 0; t < n; t++) {
        for (int hb = 0; hb < n_blocks; hb++) {
            const int h0 = hb * HB, nh = NH - h0 < HB ? NH - h0 : HB;
            const int *sel = s->sel + (size_t)t * K, ns = s->n_sel[t];
            const size_t lds = PROBS_STRIDE(ns);
            float *score = g_scores + (size_t)thread_id() * ATTN_HEAD_BLOCK * PROBS_STRIDE(kv->ctx); /* [nh][lds] */
            AttnBf16 b = {0};
            if (bf16) b = thread_attn_bf16(c, kv->ctx);
            head_block_scores(c, latent, s->q_abs + ((size_t)t * NH + h0) * AD, sel, ns, nh, scale, bf16, &b, score, lds);
            for (int h = 0; h < nh; h++) {
                if (kernels.softmax) kernels.softmax(score + (size_t)h * lds, ns);
                else softmax(score + (size_t)h * lds, ns);
            }
            head_block_values(c, latent, sel, ns, nh, bf16, &b, score, lds, s->o_lat + ((size_t)t * NH + h0) * KR);
        }
    }
}

/* ======================================================================== */
/* the MoE                                                                  */

/* One product of a few tokens for moe_tokens' pool: y[t*ldy + i] = W[i]·x_t, t < n, x_t at
 * row t (XS_COLS apart) of x, as W's kernel reads it (token_layouts). */
typedef struct {
    const Mat *W;
    const void *x; /* bf16 products: matvec_order_bf16's layout, rounded; fp32: see token_layouts */
    int n, ldy;
    float *y;
} TokenProduct;

/* All the products in one parallel region, each cut into runs of rows that threads take
 * as they free up: a chunk's chosen experts are dozens of small products, each of which
 * alone would wake the threads and wait for the slowest. */
static void token_products(const TokenProduct *p, int np) {
    int runs = 0, rows_of[np];
    for (int i = 0; i < np; i++) {
        const double row_bytes = (double)p[i].W->bytes / p[i].W->rows;
        rows_of[i] = (int)(RUN_TAIL / row_bytes) > 0 ? (int)(RUN_TAIL / row_bytes) : 1;
        runs += (p[i].W->rows + rows_of[i] - 1) / rows_of[i];
    }
    int (*run)[2] = xmalloc((size_t)runs * sizeof *run); /* (product, first row) */
    for (int i = 0, k = 0; i < np; i++)
        for (int r = 0; r < p[i].W->rows; r += rows_of[i]) { run[k][0] = i; run[k][1] = r; k++; }
#pragma omp parallel for schedule(dynamic, 1)
    for (int k = 0; k < runs; k++) {
        const TokenProduct *q = &p[run[k][0]];
        const int r = run[k][1], nr = q->W->rows - r < rows_of[run[k][0]] ? q->W->rows - r : rows_of[run[k][0]];
        token_rows(q->W, r, nr, q->x, q->n, q->y + r, (size_t)q->ldy);
    }
    free(run);
}

/* A few tokens (a serve batch's decodes, a --draft verify pass): the shared expert and
 * every chosen expert on its tokens, gate and up as one pool of runs, then down as
 * another, instead of three parallel products per expert. The sums are those of
 * moe_experts: each product's rows per token are matvec_bf16_n's (bit for bit a lone
 * token's), and the experts are added in the order of their ids. */
static int moe_tokens(const Model *m, const Layer *L, RunState *s, const float *x, float *y, int n) {
    const Config *c = &m->cfg;
    const int H = c->hidden, A = c->n_active, E = c->n_experts, FI = c->moe_inter, SF = c->n_shared * FI;
    const int rows = s->cap > A + 1 ? s->cap : A + 1; /* h1, h2, ex_y: rows as runstate_init sizes them */
    int width = c->dense_inter > SF ? c->dense_inter : SF;
    if (width < FI) width = FI;
    const size_t room = (size_t)rows * width;
    int pair_e[n * A], pair_t[n * A], P = 0; /* (expert, token) pairs in the order of the expert ids */
    float pair_w[n * A];
    for (int e = 0; e < E; e++)
        for (int t = 0; t < n; t++)
            for (int k = 0; k < A; k++)
                if (s->ex_idx[t * A + k] == e) { pair_e[P] = e; pair_t[P] = t; pair_w[P] = s->ex_w[t * A + k]; P++; }
    if (n + P > g_moe_rows || (size_t)n * SF + (size_t)P * FI > room || P > rows) return 0;
    float *h1s = s->h1, *h2s = s->h2, *h1r = s->h1 + (size_t)n * SF, *h2r = s->h2 + (size_t)n * SF; /* shared rows, then the pairs' */
    TokenProduct job[2 * (E + 1)];
    int nj = 0;
    /* gate and up: the shared expert on all n tokens, each chosen expert on its tokens */
    char *xb = g_moe_x;
    if (c->n_shared) {
        token_layouts(&L->sh_gate, x, H, NULL, n, xb);
        job[nj++] = (TokenProduct){&L->sh_gate, xb, n, SF, h1s};
        job[nj++] = (TokenProduct){&L->sh_up, xb, n, SF, h2s};
        xb += (size_t)n * XS_COLS * layout_bytes(&L->sh_gate);
    }
    for (int p = 0; p < P;) {
        int q = p;
        while (q < P && pair_e[q] == pair_e[p]) q++;
        const int e = pair_e[p];
        token_layouts(&L->ex_gate[e], x, H, pair_t + p, q - p, xb);
        job[nj++] = (TokenProduct){&L->ex_gate[e], xb, q - p, FI, h1r + (size_t)p * FI};
        job[nj++] = (TokenProduct){&L->ex_up[e], xb, q - p, FI, h2r + (size_t)p * FI};
        xb += (size_t)(q - p) * XS_COLS * layout_bytes(&L->ex_gate[e]);
        p = q;
    }
    token_products(job, nj);
    if (c->n_shared) swiglu_act(h1s, h2s, n, SF);
    swiglu_act(h1r, h2r, P, FI);
    /* down: into y (the shared expert, unscaled: pitfall 8) and each pair's row of ex_y */
    nj = 0;
    xb = g_moe_x;
    if (c->n_shared) {
        token_layouts(&L->sh_down, h1s, SF, NULL, n, xb);
        job[nj++] = (TokenProduct){&L->sh_down, xb, n, H, y};
        xb += (size_t)n * XS_COLS * layout_bytes(&L->sh_down);
    } else memset(y, 0, (size_t)n * H * sizeof(float));
    for (int p = 0; p < P;) {
        int q = p;
        while (q < P && pair_e[q] == pair_e[p]) q++;
        token_layouts(&L->ex_down[pair_e[p]], h1r + (size_t)p * FI, FI, NULL, q - p, xb);
        job[nj++] = (TokenProduct){&L->ex_down[pair_e[p]], xb, q - p, H, s->ex_y + (size_t)p * H};
        xb += (size_t)(q - p) * XS_COLS * layout_bytes(&L->ex_down[pair_e[p]]);
        p = q;
    }
    token_products(job, nj);
    for (int p = 0; p < P; p++) { /* by expert id, as moe_experts adds them */
        float *yt = y + (size_t)pair_t[p] * H;
        const float *ey = s->ex_y + (size_t)p * H;
        for (int j = 0; j < H; j++) yt[j] += pair_w[p] * ey[j];
    }
    return 1;
}

/* y[n][W.rows] = x[n][W.cols] · Wᵀ for a routed expert's tokens of a prompt
 * (ops.prompt_rows): each token's sums are its one-token product's, whatever n, from the
 * few-token kernel (token_rows) on groups of up to MATVEC_MAX_TOKENS tokens. An expert's
 * share of a chunk is mostly that few (n·A/E tokens: 8 of a 256-token chunk for GLM-5.2),
 * where a panel costs more to build than it saves; for more, each thread's run of rows
 * (<= RUN_MIN bytes) stays in L2 while every group passes. */
static void expert_product(float *y, const float *x, const Mat *W, int n) {
    if (!few_tokens_kernel(W)) { prompt_rows_product(y, W->rows, x, W->cols, W, 0, W->rows, n); return; }
    const size_t group_bytes = (size_t)MATVEC_MAX_TOKENS * XS_COLS * layout_bytes(W);
    for (int t0 = 0; t0 < n; t0 += MATVEC_MAX_TOKENS)
        token_layouts(W, x + (size_t)t0 * W->cols, W->cols, NULL, n - t0 < MATVEC_MAX_TOKENS ? n - t0 : MATVEC_MAX_TOKENS,
                      (char *)g_prompt_xs + (size_t)t0 / MATVEC_MAX_TOKENS * group_bytes);
    const int parallel = worth_threads(W, W->rows, n), rows = token_run_rows(W, W->rows, parallel);
    (void)parallel;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
    for (int lo = 0; lo < W->rows; lo += rows)
        for (int t0 = 0; t0 < n; t0 += MATVEC_MAX_TOKENS)
            token_rows(W, lo, W->rows - lo < rows ? W->rows - lo : rows, (char *)g_prompt_xs + (size_t)t0 / MATVEC_MAX_TOKENS * group_bytes,
                       n - t0 < MATVEC_MAX_TOKENS ? n - t0 : MATVEC_MAX_TOKENS, y + (size_t)t0 * W->rows + lo, (size_t)W->rows);
}

/* A prompt's rows (ops.prompt_rows): glm.c's moe_experts, the shared expert's products
 * as any other matrix's (the panel), each routed expert's by expert_product. */
static void moe_prompt_rows(const Model *m, const Layer *L, RunState *s, const float *x, float *y, int n) {
    const Config *c = &m->cfg;
    if (c->n_shared) swiglu(y, x, &L->sh_gate, &L->sh_up, &L->sh_down, s->h1, s->h2, n); /* unscaled (pitfall 8) */
    else memset(y, 0, (size_t)n * c->hidden * sizeof(float));
    for (int e = 0; e < c->n_experts; e++) {
        const int cnt = expert_gather(c, s, x, n, e);
        if (!cnt) continue;
        expert_product(s->h1, s->ex_x, &L->ex_gate[e], cnt);
        expert_product(s->h2, s->ex_x, &L->ex_up[e], cnt);
        swiglu_act(s->h1, s->h2, cnt, c->moe_inter);
        expert_product(s->ex_y, s->h1, &L->ex_down[e], cnt);
        expert_scatter(c, s, y, cnt);
    }
}

/* For one token, the chosen experts and the shared one as one pool of rows: their gate
 * and up products in one matvec_jobs, their down products in another; a few tokens go
 * to moe_tokens, longer chunks to glm.c's moe_experts (one GEMM per chosen expert), a
 * prompt's rows to moe_prompt_rows. */
static void fast_moe_experts(const Model *m, const Layer *L, RunState *s, const float *x, float *y, int n) {
    const Config *c = &m->cfg;
    if (ops.prompt_rows) {
        moe_prompt_rows(m, L, s, x, y, n);
        return;
    }
    if (n > 1) {
        const int fits = n <= MATVEC_MAX_TOKENS && few_tokens_kernel(&L->ex_gate[0]) && few_tokens_kernel(&L->ex_down[0]) &&
                         (!c->n_shared || (few_tokens_kernel(&L->sh_gate) && few_tokens_kernel(&L->sh_down)));
        if (!fits || !moe_tokens(m, L, s, x, y, n)) moe_experts(m, L, s, x, y, n);
        return;
    }
    const int H = c->hidden, A = c->n_active;
    const size_t slot = (size_t)c->moe_inter * (c->n_shared > 1 ? c->n_shared : 1); /* hidden width of one expert */
    const int J = A + (c->n_shared ? 1 : 0);
    Matvec job[2 * J];
    memset(job, 0, sizeof job); /* every entry is set below; this keeps gcc's -Wmaybe-uninitialized quiet */
    for (int k = 0; k < J; k++) { /* k == A: the shared expert, whose output is y itself, unscaled (pitfall 8) */
        const Mat *gate = k < A ? &L->ex_gate[s->ex_idx[k]] : &L->sh_gate, *up = k < A ? &L->ex_up[s->ex_idx[k]] : &L->sh_up;
        job[2 * k] = (Matvec){gate, 0, gate->rows, x, s->h1 + k * slot};
        job[2 * k + 1] = (Matvec){up, 0, up->rows, x, s->h2 + k * slot};
    }
    matvec_jobs(job, 2 * J, g_pool_xs, XS_COLS, 1);
    for (int k = 0; k < J; k++) {
        float *h1 = s->h1 + k * slot, *h2 = s->h2 + k * slot;
        swiglu_act(h1, h2, 1, job[2 * k].nr);
        const Mat *down = k < A ? &L->ex_down[s->ex_idx[k]] : &L->sh_down;
        job[k] = (Matvec){down, 0, down->rows, h1, k < A ? s->ex_y + (size_t)k * H : y};
    }
    matvec_jobs(job, J, g_pool_xs, XS_COLS, 1);
    if (!c->n_shared) memset(y, 0, (size_t)H * sizeof(float));
    /* added in the order of the expert ids, as moe_experts adds them for a chunk: the same
     * sums whether the token runs alone or in a batch */
    int order[A];
    for (int k = 0; k < A; k++) {
        int i = k;
        for (; i > 0 && s->ex_idx[order[i - 1]] > s->ex_idx[k]; i--) order[i] = order[i - 1];
        order[i] = k;
    }
    for (int i = 0; i < A; i++) {
        const int k = order[i];
        for (int j = 0; j < H; j++) y[j] += s->ex_w[k] * s->ex_y[(size_t)k * H + j];
    }
}

/* ======================================================================== */
/* choosing the path                                                        */

/* x's layouts start on cache lines: a kernel's 64-byte loads would otherwise each touch two */
static void *xmalloc64(size_t n) {
    void *p = aligned_alloc(64, (n + 63) & ~(size_t)63);
    if (!p) glm_fatal("out of memory (%zu bytes)", n);
    return p;
}

static void fast_release(void) {
    void *all[] = {g_row_scratch, g_x_split, g_panel, g_x_bf16, g_pool_xs, g_tokens_xs, g_moe_x, g_prompt_xs, g_uv_xs, g_scores, g_lat_bf16, g_attn_bf16};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    g_row_scratch = g_x_split = g_panel = g_pool_xs = g_tokens_xs = g_prompt_xs = g_uv_xs = g_scores = NULL;
    g_x_bf16 = g_lat_bf16 = g_attn_bf16 = NULL;
    g_moe_x = NULL;
}

static int widest_matrix(const Config *c) { /* columns of the widest matrix, or 2H */
    int v[] = {c->hidden, c->q_lora_rank, c->kv_lora_rank, c->n_heads * c->v_head, c->dense_inter,
               c->n_shared * c->moe_inter, c->moe_inter, 2 * c->hidden};
    int mx = 0;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) if (v[i] > mx) mx = v[i];
    return mx;
}

/* Scratch for the session's widths, chunk and context; the attention and indexer
 * entries only where their kernels and this model's shapes fit. */
static void fast_prepare(const Config *c, int cap, int ctx) {
    fast_release();
    g_threads = 1;
#ifdef _OPENMP
    g_threads = omp_get_max_threads();
#endif
    const char *pm = getenv("GLM_PARALLEL_MIN");
    if (pm && *pm) g_parallel_min = atof(pm);
    const int max_cols = widest_matrix(c);
    const size_t AD = (size_t)c->kv_lora_rank + c->qk_rope, T = (size_t)ctx;
    g_cap = cap;
    g_scratch_cols = max_cols;
    g_row_scratch = xmalloc((size_t)g_threads * (size_t)max_cols * sizeof(float));
    g_x_split = xmalloc64((size_t)g_threads * XS_COLS * sizeof(float));
    const size_t bf16_gemm = (size_t)PANEL_KC * 32 + (size_t)PREFILL_CHUNK * 32; /* panel, stage, y tile */
    g_panel_stride = (size_t)65 * max_cols > bf16_gemm ? (size_t)65 * max_cols : bf16_gemm;
    g_panel = xcalloc((size_t)g_threads * g_panel_stride, sizeof(float));
    g_x_bf16 = xcalloc((size_t)PREFILL_CHUNK * (max_cols + 64), sizeof(uint16_t));
    g_pool_xs = xmalloc64((size_t)(c->n_active + 1 > 2 ? 2 * (c->n_active + 1) : 4) * XS_COLS * sizeof(float));
    g_tokens_xs = xmalloc64((size_t)g_threads * MATVEC_MAX_TOKENS * XS_COLS * sizeof(float));
    g_moe_rows = MATVEC_MAX_TOKENS * (c->n_active + 1);
    g_moe_x = xmalloc64((size_t)g_moe_rows * XS_COLS * sizeof(float)); /* fp32 layouts or bf16 ones */
    g_prompt_xs = xmalloc64(((size_t)cap + MATVEC_MAX_TOKENS) * XS_COLS * sizeof(float)); /* (pages untouched until a prompt uses them) */
    g_uv_xs = xmalloc64((size_t)c->n_heads * MATVEC_MAX_TOKENS * XS_FOR(c->kv_lora_rank) * sizeof(float));
    g_scores = xmalloc((size_t)g_threads * ATTN_HEAD_BLOCK * PROBS_STRIDE(ctx) * sizeof(float));
    if (g_act_bf16 && kernels.gemm_panel_bf16 && kernels.pack_pairs_bf16 && kernels.build_panel_bf16 && kernels.round_bf16) {
        const size_t topk = (size_t)(c->index_topk < ctx ? c->index_topk : ctx);
        g_lat_bf16 = xmalloc(T * AD * sizeof(uint16_t));
        g_attn_bf16_stride = attn_bf16_scratch(c, cap, topk, NULL, NULL);
        g_attn_bf16 = xmalloc((size_t)g_threads * g_attn_bf16_stride * sizeof(uint16_t));
    }
    const int IH = c->index_n_heads, ID = c->index_head_dim;
    const int ix_fits = kernels.gemm_panel && kernels.pack_panel && IH <= 32 && ID % 16 == 0 &&
                        (size_t)ID * 64 + 256 * 32 <= g_panel_stride;
    const int attn_fits = kernels.gemm_panel && kernels.pack_panel && AD % 16 == 0 &&
                          AD * (64 + KEY_BLOCK) + (size_t)c->index_topk * 32 <= g_panel_stride;
    ops.index_scores = ix_fits ? fast_index_scores : index_scores;
    ops.mla_attend = attn_fits ? fast_mla_attend : mla_attend_absorbed;
    ops.mla_absorb = fast_mla_absorb;
    ops.mla_unabsorb = fast_mla_unabsorb;
}

void fast_init(const char *want, int bf16) {
    kernels_init(want);
    if (!kernels.matvec) return; /* no SIMD set: glm.c's ops end to end */
    if (bf16 < 0) bf16 = kernels.bf16_speedup && kernels.bf16_speedup() > 1.0;
    g_act_bf16 = bf16;
    ops.name = kernels.name;
    ops.precision = g_act_bf16 && kernels.gemm_panel_bf16 ? "bf16" : "fp32";
    ops.matmul = fast_matmul;
    ops.matmul_group = fast_matmul_group;
    ops.moe_experts = fast_moe_experts;
    ops.prepare = fast_prepare;
    ops.release = fast_release;
}
