/* bench.c - glm bench: the speed of this build against what this machine can do,
 * measured in the same run.
 *
 *   prefill  FLOP/s of a P-token prompt over the fp32 FMA peak measured around it
 *   decode   GB/s of one-token steps over the read bandwidth measured before each token,
 *            at context 0 and after a long context (the slowdown between them)
 *   drafts   what speculative decoding (--draft N, spec.c) costs in decode steps: r(N), a
 *            main-model pass over N + 1 tokens, and c, one MTP draft step; and the speedup
 *            they imply for an acceptance rate a
 *   batch    glm serve's decode step of 8 sequences (forward_batch) in decode steps, and
 *            the aggregate speedup it gives: 8 / that; where both steps' time goes (the
 *            entries of the ops table, timed)
 *
 * Decode reads every weight once per token, so its bound is the memory's bandwidth;
 * prefill reuses each weight for a chunk of tokens, so its bound is the FMA rate. The
 * bytes and FLOPs are counted from the shapes (glm.c: decode_bytes, forward_flops).
 * This VM's memory speed swings by 1.5x within minutes, hence the yardsticks taken
 * around each measurement rather than once.
 */
#define _GNU_SOURCE
#include "../glm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* A line per step on a terminal (nothing in --json or in a log): "bench: what ... 3.2 s". */
static int g_quiet;
static int show_steps(void) { return !g_quiet && isatty(2); }
static void step_begin(const char *what) { if (show_steps()) { fprintf(stderr, "bench: %s ...", what); fflush(stderr); } }
static void step_end(double t0) { if (show_steps()) fprintf(stderr, " %.1f s\n", now_s() - t0); }

/* Touches every page of every shard so no timed step pays for page faults. */
static void prefault_weights(const Model *m) {
    volatile uint8_t sink = 0;
    for (int s = 0; s < m->ck.n_shards; s++)
        for (size_t i = 0; i < m->ck.shards[s].size; i += 4096) sink ^= m->ck.shards[s].map[i];
    (void)sink;
}

/* Fraction of the checkpoint's mappings backed by 2 MB pages (Linux /proc/self/smaps:
 * FilePmdMapped for mapped files, AnonHugePages for --no-mmap), or -1 where unknown.
 * Decode reads every weight once per token, so on 4 KB pages each 4 KB costs a TLB miss
 * (a two-level page walk in a VM): measured here up to 1.4x slower decode. */
static double huge_page_fraction(const Checkpoint *ck) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    double huge = 0, total = 0;
    int in_shard = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        double kb;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2) { /* a mapping's first line; its fields follow */
            in_shard = 0;
            for (int i = 0; i < ck->n_shards; i++)
                if ((uintptr_t)ck->shards[i].map_base == lo) { in_shard = 1; total += (double)(hi - lo) / 1024; }
        } else if (in_shard && (sscanf(line, "FilePmdMapped: %lf kB", &kb) == 1 || sscanf(line, "AnonHugePages: %lf kB", &kb) == 1))
            huge += kb;
    }
    fclose(f);
    return total > 0 ? huge / total : -1;
}

/* What one streaming read covers: runs of at most READ_RUN bytes (8 MB, the longest of
 * decode's runs, RUN_MAX), handed to the threads as they free up. */
#define READ_RUN ((size_t)8 << 20)
typedef struct {
    ReadRun *run; /* [n] */
    int n;
} ReadSet;

/* Adds runs starting every `stride` bytes of p[0..len) (p 64-byte aligned), each READ_RUN
 * bytes or up to the end, rounded down to the read's 256-byte step. set->run has room. */
static void add_runs(ReadSet *set, const uint8_t *p, size_t len, size_t stride) {
    for (size_t off = 0; off < len; off += stride) {
        size_t left = len - off, n = (left < READ_RUN ? left : READ_RUN) & ~(size_t)255;
        if (n) set->run[set->n++] = (ReadRun){p + off, n};
    }
}

/* buf[0..n) as runs, end to end. */
static ReadSet buffer_runs(const uint8_t *buf, size_t n) {
    ReadSet s = {xmalloc((n / READ_RUN + 1) * sizeof(ReadRun)), 0};
    add_runs(&s, buf, n, READ_RUN);
    return s;
}

/* Up to 1 GB of the checkpoint's own pages: runs spaced evenly through every shard (all of
 * a small checkpoint). On a VM the memory behind different guest-physical pages differs
 * in speed, and which memory is the faster one changes from minute to minute: measured
 * here (on this VM), 1 GB in one place read 1.22x faster than the
 * page cache holding the weights in the same seconds, and 0.89x a few minutes before.
 * A read of the weights' own pages in the same moments as the decode says how close
 * decode comes to the memory it reads, whatever the fresh buffer happened to get. The
 * sample keeps that read the same size on a 700 GB checkpoint as on the bench one. */
static ReadSet weights_runs(const Checkpoint *ck) {
    const size_t sample = (size_t)1 << 30;
    double total = 0;
    for (int s = 0; s < ck->n_shards; s++) total += (double)ck->shards[s].map_len;
    size_t stride = READ_RUN; /* the distance between runs' starts: the sample spread evenly */
    if (total > (double)sample) stride = (size_t)(total / (double)sample * (double)READ_RUN) & ~(size_t)4095;
    int cap = 0;
    for (int s = 0; s < ck->n_shards; s++) cap += (int)(ck->shards[s].map_len / stride) + 1;
    ReadSet set = {xmalloc((size_t)cap * sizeof(ReadRun)), 0};
    for (int s = 0; s < ck->n_shards; s++) /* map_base is page-aligned */
        add_runs(&set, ck->shards[s].map_base, ck->shards[s].map_len, stride);
    return set;
}

/* A streaming read's speed at one moment, over three passes. */
typedef struct {
    double mean; /* bytes/s: all the passes' bytes over all their time */
    double best; /* bytes/s of the fastest pass */
} ReadRate;

/* The mean is the yardstick decode is held to: decode's tok/s is a mean over its tokens,
 * so it is compared with what the read got on average in the same moments. The fastest
 * pass picks the moments when the host left both cores alone: with a process taking 30%
 * of one core  the best pass read 75 GB/s, the mean 64,
 * and decode 53, which the best pass would have called 0.71 of the machine's bandwidth
 * when a read in the same conditions got only 1.2x more. Both are printed. */
static ReadRate read_rate(const ReadSet *set) {
    ReadRate r = {0, 0};
    if (set->n == 0) return r; /* a checkpoint smaller than one 256-byte step */
    double secs_per_byte = 0; /* each pass reads the same bytes: their mean is 3 over this */
    for (int i = 0; i < 3; i++) {
        double b = kernels.read_bandwidth(set->run, set->n);
        secs_per_byte += 1.0 / b;
        if (b > r.best) r.best = b;
    }
    r.mean = 3.0 / secs_per_byte;
    return r;
}

#define BUFFER_BYTES ((size_t)1 << 30) /* the bandwidth buffer: larger than any cache */

/* The two reads a decoded token is measured against, taken just before it. */
typedef struct {
    ReadSet buffer;      /* a fresh 1 GB buffer: the machine's read bandwidth (issue 6's yardstick) */
    ReadSet weights;     /* the checkpoint's own pages, sampled */
    uint8_t *buffer_mem; /* that buffer (mmap'd, BUFFER_BYTES) */
} Yardsticks;

/* One decode being timed, a token at a time (glm bench). */
typedef struct {
    KVCache *kv;      /* its cache: empty (context 0), or filled by a long prompt */
    int tok;          /* the next input token: greedy, the last output */
    int n;            /* tokens decoded so far */
    double secs;      /* time spent in them (only the tokens are timed) */
    ReadRate read;    /* sums over its tokens of the buffer reads taken just before each */
    double weights;   /* the same for the reads of the weights' own pages (their means) */
    double bytes;     /* weight and cache bytes they read */
} TimedDecode;

/* Decodes one token of d, after measuring the read bandwidth: on a shared VM it swings
 * by 1.5x within seconds, so one measurement before and one after a 3-second decode can
 * miss what the decode saw; one before every token cannot. The weights' pages are read
 * first, so the cache holds the buffer's last bytes, not weights, when the token starts. */
static void timed_decode_token(Session *S, TimedDecode *d, const Yardsticks *y) {
    d->weights += read_rate(&y->weights).mean;
    ReadRate r = read_rate(&y->buffer);
    d->read.mean += r.mean;
    d->read.best += r.best;
    d->bytes += decode_bytes(&S->model, d->kv->pos);
    double t0 = now_s();
    session_forward(S, d->kv, &d->tok, 1, S->state.logits, 0);
    d->tok = argmax(S->state.logits, S->model.cfg.vocab_size);
    d->secs += now_s() - t0;
    d->n++;
}

/* Pages in the weights (so no timed step pays for page faults) and sets up both reads. */
static Yardsticks yardsticks_open(const Model *m) {
    double t0 = now_s();
    step_begin("paging in the weights, measuring the read bandwidth");
    prefault_weights(m);
    /* on 2 MB pages where the kernel offers them, like the weights: the bandwidth the
     * decode is compared with is the best a streaming read gets on this machine */
    uint8_t *buf = mmap(NULL, BUFFER_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) glm_fatal("out of memory allocating the bandwidth buffer");
    madvise(buf, BUFFER_BYTES, MADV_HUGEPAGE);
    memset(buf, 1, BUFFER_BYTES);
    const Yardsticks y = {buffer_runs(buf, BUFFER_BYTES), weights_runs(&m->ck), buf};
    step_end(t0);
    return y;
}

/* Frees what yardsticks_open set up. */
static void yardsticks_close(Yardsticks *y) {
    free(y->buffer.run);
    free(y->weights.run);
    munmap(y->buffer_mem, BUFFER_BYTES);
}

/* n random token ids below V, the same every run: the prompts of the prefill and of the
 * long context. */
static int *random_ids(int n, int V) {
    int *ids = xmalloc((size_t)n * sizeof(int));
    uint64_t rng = 12345;
    for (int i = 0; i < n; i++) { rng = rng * 6364136223846793005ull + 1442695040888963407ull; ids[i] = (int)((rng >> 33) % (uint64_t)V); }
    return ids;
}

/* PREFILL_RUNS timed runs, each against the FMA peak measured just before and after
 * it (like the bandwidth around each decoded token); the run with the median ratio is
 * reported. With one run, 1 in 8 glm bench runs of the same build once read 0.98x
 * where the 7 others read 1.32-1.40x: the host took the cores away during it, and its
 * prefill ran 36% slower than theirs while the short peak loops around it lost only
 * 10%. */
enum { PREFILL_RUNS = 3 };
_Static_assert(PREFILL_RUNS == 3, "the table and --json below print three runs' ratios");

/* The prefill as reported: the median run's numbers, and every run's ratio. */
typedef struct {
    double secs;                /* the median run's time */
    double flops;               /* its FLOP/s */
    double peak;                /* the FMA peak around it (FLOP/s) */
    double ratio[PREFILL_RUNS]; /* each run's flops / peak, in run order */
} PrefillResult;

/* The run whose ratio has as many runs above it as below. */
static int median_run(const double *ratio) {
    int med = 0;
    for (int r = 0; r < PREFILL_RUNS; r++) {
        int below = 0, above = 0;
        for (int q = 0; q < PREFILL_RUNS; q++) below += ratio[q] < ratio[r], above += ratio[q] > ratio[r];
        if (below <= PREFILL_RUNS / 2 && above <= PREFILL_RUNS / 2) med = r;
    }
    return med;
}

/* Prefills ids[0..P) PREFILL_RUNS times, each timed and held to the FMA peak around it. */
static PrefillResult timed_prefill(Session *S, const int *ids, int P) {
    /* warm-up: the same prefill once untimed, so its scratch buffers are paged in (calloc'd
     * memory is mapped on first write: a cold first prompt spent ~20% of its time in page
     * faults, which is start-up cost, not prefill speed) */
    double t0 = now_s();
    step_begin("prefill, a warm-up and three timed runs");
    session_forward(S, &S->kv, ids, P, NULL, 0);
    double t_run[PREFILL_RUNS], flops_run[PREFILL_RUNS], peak_run[PREFILL_RUNS];
    PrefillResult p;
    double peak_before = kernels.fma_peak();
    for (int r = 0; r < PREFILL_RUNS; r++) {
        S->kv.pos = 0;
        double t1 = now_s();
        session_forward(S, &S->kv, ids, P, S->state.logits, 0);
        t_run[r] = now_s() - t1;
        flops_run[r] = forward_flops(&S->model, P, 0, 1) / t_run[r];
        double peak_after = kernels.fma_peak();
        peak_run[r] = 0.5 * (peak_before + peak_after);
        p.ratio[r] = flops_run[r] / peak_run[r];
        peak_before = peak_after;
    }
    const int med = median_run(p.ratio);
    p.secs = t_run[med];
    p.flops = flops_run[med];
    p.peak = peak_run[med];
    step_end(t0);
    return p;
}

/* The decode as reported: both contexts, and the reads taken around them. */
typedef struct {
    double tps0, bytes0;  /* context 0: tok/s, bytes read per token */
    double bw0, best0;    /* the buffer's read around it: the mean passes, the fastest passes */
    double weights_bw;    /* the read of the weights' own pages around it */
    double tpsL, bytesL;  /* the long context: tok/s, bytes read per token */
    double bwL;           /* the buffer's read around it */
} DecodeResult;

/* Decodes N tokens at context 0 and N after the long context ids[0..L). */
static DecodeResult timed_decodes(Session *S, const int *ids, int L, int N, const Yardsticks *yard) {
    /* decode at context 0 and after a long context (a cache filled by a prefill), a token
     * of each in turn: both see the same moments of the host, so the slowdown between
     * them is the code's. Run one after the other, a fall of the host's read between
     * them (62.8 to 28.2 GB/s seen here) showed as a 2x slowdown. The GPU keeps one cache
     * on the device, so there they still run one after the other. */
    int interleave = 1;
#ifdef GLM_GPU
    interleave = !S->gpu;
#endif
    KVCache near; /* context 0 when interleaved: a cache of its own, N + 1 tokens */
    kvcache_init(&near, &S->model, N + 1);
    TimedDecode d0 = {.kv = interleave ? &near : &S->kv, .tok = 1}, dL = {.kv = &S->kv, .tok = 1};
    S->kv.pos = 0;
    double t0 = now_s();
    step_begin("decode at context 0 and after a long context, the read bandwidth before each token");
    if (interleave) session_forward(S, &S->kv, ids, L, NULL, 0); /* dL's long context */
    for (int i = 0; i < N; i++) {
        timed_decode_token(S, &d0, yard);
        if (interleave) timed_decode_token(S, &dL, yard);
    }
    const double end_weights = read_rate(&yard->weights).mean; /* after the last token */
    ReadRate end0 = read_rate(&yard->buffer), endL = end0;
    if (!interleave) {
        S->kv.pos = 0;
        session_forward(S, &S->kv, ids, L, NULL, 0);
        for (int i = 0; i < N; i++) timed_decode_token(S, &dL, yard);
        endL = read_rate(&yard->buffer);
    }
    step_end(t0);
    kvcache_free(&near);
    /* each decode's read bandwidth: the reads before its tokens and one after the last */
    return (DecodeResult){
        .tps0 = N / d0.secs, .bytes0 = d0.bytes / N,
        .bw0 = (d0.read.mean + end0.mean) / (N + 1),
        .best0 = (d0.read.best + end0.best) / (N + 1), /* the fastest passes: a stricter yardstick */
        .weights_bw = (d0.weights + end_weights) / (N + 1),
        .tpsL = N / dL.secs, .bytesL = dL.bytes / N,
        .bwL = (dL.read.mean + endL.mean) / (N + 1),
    };
}

/* Drafting's costs in decode steps (spec.c's default comes from them). A verify step is
 * one main-model pass over x and N drafts with every row's logits and hidden state: the
 * weights are read once for the N + 1 tokens, but with MoE each token routes to its own
 * experts, so the experts read grow with N (and every row goes through the lm_head). A
 * draft step is the MTP layer on one row and the lm_head. */
enum { SPEC_MAX_N = 4, SPEC_RUNS = 7 };
static const double SPEC_ACCEPT[4] = {0.6, 0.7, 0.8, 0.9};

typedef struct {
    int measured;               /* 0 with --gpu: the GPU path runs neither pass */
    double decode_s;            /* the median decode step */
    double r[SPEC_MAX_N + 1];   /* r[N], N >= 1: the median over the runs of verify time / that run's decode time */
    double r_lo[SPEC_MAX_N + 1], r_hi[SPEC_MAX_N + 1]; /* their spread: the fastest and slowest run's ratio */
    double c, c_lo, c_hi;       /* the draft step's ratio and spread; -1 without the MTP layer */
} SpecCost;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of x[0..n) (n odd), and its extremes. */
static double median_spread(double *x, int n, double *lo, double *hi) {
    qsort(x, (size_t)n, sizeof(double), cmp_double);
    *lo = x[0];
    *hi = x[n - 1];
    return x[n / 2];
}

/* The speedup of --draft N at acceptance a: expected tokens per step over its cost. */
static double spec_speedup(const SpecCost *sc, int N, double a) {
    return (1 - pow(a, N + 1)) / ((1 - a) * (sc->r[N] + N * sc->c));
}

/* The passes at context P (the prefill's cache), each round timing a decode step, the N + 1
 * token passes and a draft step one after another, so that the host's swings hit all of
 * them alike; each ratio is taken within a round and the median round reported. The
 * caches are rolled back after each pass. A first round is untimed (scratch paging). */
static SpecCost timed_spec_costs(Session *S, const int *ids, int P) {
    SpecCost sc = {0};
    if (S->gpu || P + SPEC_MAX_N + 1 > S->kv.ctx) return sc;
    const Model *m = &S->model;
    const int H = m->cfg.hidden, V = m->cfg.vocab_size;
    double t0 = now_s();
    step_begin("drafting: decode, verify passes of 2-5 tokens, MTP draft steps");
    float *logits = xmalloc((size_t)(SPEC_MAX_N + 1) * V * sizeof(float));
    float *hidden = xmalloc((size_t)(SPEC_MAX_N + 1) * H * sizeof(float)), *g = xmalloc((size_t)H * sizeof(float));
    int *sel = xmalloc((size_t)m->cfg.index_topk * sizeof(int));
    MtpSelection keep = {sel, 0, 0};
    double ratio[SPEC_MAX_N + 2][SPEC_RUNS], dec[SPEC_RUNS];
    for (int run = -1; run < SPEC_RUNS; run++) {
        double t = now_s(), td;
        S->kv.pos = P;
        forward(m, &S->kv, &S->state, ids + P % 7, 1, logits, 0);
        td = now_s() - t;
        for (int N = 1; N <= SPEC_MAX_N; N++) {
            S->kv.pos = P;
            t = now_s();
            forward_hidden(m, &S->kv, &S->state, ids + N, N + 1, logits, 1, hidden);
            if (run >= 0) ratio[N][run] = (now_s() - t) / td;
        }
        if (m->mtp) {
            S->kv.mtp_pos = P - 1;
            t = now_s();
            mtp_forward_hidden(m, &S->kv, &S->state, hidden, ids + 1, 1, logits, 0, g, m->cfg.index_share_mtp ? &keep : NULL);
            if (run >= 0) ratio[0][run] = (now_s() - t) / td;
        }
        if (run >= 0) dec[run] = td;
    }
    S->kv.pos = P;
    S->kv.mtp_pos = 0;
    double lo, hi;
    sc.measured = 1;
    sc.decode_s = median_spread(dec, SPEC_RUNS, &lo, &hi);
    for (int N = 1; N <= SPEC_MAX_N; N++) sc.r[N] = median_spread(ratio[N], SPEC_RUNS, &sc.r_lo[N], &sc.r_hi[N]);
    sc.c = sc.c_lo = sc.c_hi = -1;
    if (m->mtp) sc.c = median_spread(ratio[0], SPEC_RUNS, &sc.c_lo, &sc.c_hi);
    free(logits); free(hidden); free(g); free(sel);
    step_end(t0);
    return sc;
}

/* glm serve's continuous batching: one decode step of BATCH_SEQS sequences, each over its
 * own cache (forward_batch), against one sequence's decode step, timed one after the
 * other in each round as the drafts are. Each weight is read once for all the sequences,
 * so the step costs far less than BATCH_SEQS decode steps; its arithmetic grows with the
 * sequences, and with MoE so do the experts read. */
enum { BATCH_SEQS = 8, BATCH_CTX = 64, BATCH_PROMPT = 16 };

/* Where a step's time goes: the heavy ops (glm.h's ops table) by what they compute, and
 * the rest of glm.c's step between them (norms, RoPE, the cache rows, routing, residuals). */
enum { PART_LM_HEAD, PART_PRODUCTS, PART_EXPERTS, PART_ABSORB, PART_ATTEND, PART_REST, N_PARTS };
static const char *const part_name[N_PARTS] = {"lm_head", "products", "experts", "absorb", "attention", "rest"};
static const char *const part_what[N_PARTS] = {
    "the lm_head", "the other weight products (attention's projections, o_proj, dense MLP, router)",
    "the MoE's shared and routed experts", "MLA's absorb and un-absorb", "the attention over the cache", "the rest"};

typedef struct {
    int measured;           /* 0 with --gpu */
    double cost, lo, hi;    /* the batch step in decode steps: median round, fastest, slowest */
    double part[2][N_PARTS];/* [one sequence, BATCH_SEQS] seconds per step in each part (mean over the rounds) */
    double step[2];         /* the same steps' mean time */
} BatchCost;

/* The timing wrappers: while g_part points at a step's parts, each op adds its time there,
 * then calls the table bench found (g_inner). The ops run from the main thread, each
 * parallel inside, so one clock around each call measures it. */
static Ops g_inner;
static const Mat *g_lm_head;
static double *g_part; /* [N_PARTS] */

static void add_part(int part, double t0) { g_part[part] += now_s() - t0; }
static void timed_matmul(float *y, const float *x, const Mat *W, int n) {
    const double t = now_s();
    g_inner.matmul(y, x, W, n);
    add_part(W == g_lm_head ? PART_LM_HEAD : PART_PRODUCTS, t);
}
static void timed_matmul_group(const Product *p, int np, int n) {
    const double t = now_s();
    g_inner.matmul_group(p, np, n);
    add_part(PART_PRODUCTS, t);
}
static void timed_moe_experts(const Model *m, const Layer *L, RunState *s, const float *x, float *y, int n) {
    const double t = now_s();
    g_inner.moe_experts(m, L, s, x, y, n);
    add_part(PART_EXPERTS, t);
}
static void timed_mla_absorb(const Config *c, const Layer *L, RunState *s, int n) {
    const double t = now_s();
    g_inner.mla_absorb(c, L, s, n);
    add_part(PART_ABSORB, t);
}
static void timed_mla_unabsorb(const Config *c, const Layer *L, RunState *s, int n) {
    const double t = now_s();
    g_inner.mla_unabsorb(c, L, s, n);
    add_part(PART_ABSORB, t);
}
static void timed_mla_attend(const Model *m, const Layer *L, const KVCache *kv, RunState *s, int layer, int n, int pos0) {
    const double t = now_s();
    g_inner.mla_attend(m, L, kv, s, layer, n, pos0);
    add_part(PART_ATTEND, t);
}

/* Puts the timing wrappers into the ops table (parts: where they add), or (NULL) puts
 * the table back. */
static void time_ops(const Model *m, double *parts) {
    if (!parts) { ops = g_inner; g_part = NULL; return; }
    g_inner = ops;
    g_lm_head = &m->lm_head;
    g_part = parts;
    ops.matmul = timed_matmul;
    ops.matmul_group = timed_matmul_group;
    ops.moe_experts = timed_moe_experts;
    ops.mla_absorb = timed_mla_absorb;
    ops.mla_unabsorb = timed_mla_unabsorb;
    ops.mla_attend = timed_mla_attend;
}

static BatchCost timed_batch_cost(Session *S, const int *ids) {
    BatchCost bc = {0};
    if (S->gpu || S->state.cap < BATCH_SEQS) return bc;
    const Model *m = &S->model;
    const int V = m->cfg.vocab_size;
    double t0 = now_s();
    step_begin("batch: decode steps of 8 sequences and of one");
    KVCache kv[BATCH_SEQS];
    float *logits = xmalloc((size_t)BATCH_SEQS * V * sizeof(float));
    for (int i = 0; i < BATCH_SEQS; i++) { /* each sequence a prompt of its own */
        kvcache_init(&kv[i], m, BATCH_CTX);
        forward(m, &kv[i], &S->state, ids + 3 * i, BATCH_PROMPT, logits, 0);
    }
    double ratio[SPEC_RUNS], part[2][N_PARTS] = {{0}}, step[2] = {0};
    for (int run = -1; run < SPEC_RUNS; run++) {
        kv[0].pos = BATCH_PROMPT;
        time_ops(m, part[0]);
        double t = now_s();
        forward(m, &kv[0], &S->state, ids + 1, 1, logits, 0);
        const double td = now_s() - t;
        time_ops(m, NULL);
        SeqTokens seq[BATCH_SEQS];
        for (int i = 0; i < BATCH_SEQS; i++) {
            kv[i].pos = BATCH_PROMPT;
            seq[i] = (SeqTokens){&kv[i], ids + 2 + i, 1, 0, NULL};
        }
        time_ops(m, part[1]);
        t = now_s();
        forward_batch(m, &S->state, seq, BATCH_SEQS, logits);
        const double tb = now_s() - t;
        time_ops(m, NULL);
        if (run < 0) { memset(part, 0, sizeof part); continue; } /* the untimed first round */
        ratio[run] = tb / td;
        step[0] += td;
        step[1] += tb;
    }
    bc.measured = 1;
    bc.cost = median_spread(ratio, SPEC_RUNS, &bc.lo, &bc.hi);
    for (int k = 0; k < 2; k++) {
        double ops_s = 0;
        for (int p = 0; p < PART_REST; p++) ops_s += part[k][p];
        part[k][PART_REST] = step[k] - ops_s;
        for (int p = 0; p < N_PARTS; p++) bc.part[k][p] = part[k][p] / SPEC_RUNS;
        bc.step[k] = step[k] / SPEC_RUNS;
    }
    for (int i = 0; i < BATCH_SEQS; i++) kvcache_free(&kv[i]);
    free(logits);
    step_end(t0);
    return bc;
}

/* What the run measured, for the two printers. */
typedef struct {
    const char *model_dir;
    int threads, P, L;
    double huge; /* huge_page_fraction */
    PrefillResult pre;
    DecodeResult dec;
    SpecCost spec;
    BatchCost batch;
} BenchResult;

/* The drafting keys of --json (after the others): r(N) and c with their spread, and the
 * speedups they imply, "spec_speedup": {"0.6": [N = 1..4], ...}; null where not measured. */
static void print_spec_json(const SpecCost *sc) {
    if (!sc->measured) { printf(", \"spec_decode_ms\": null, \"spec_verify_cost\": null, \"spec_draft_cost\": null, \"spec_speedup\": null"); return; }
    printf(", \"spec_decode_ms\": %.3f, \"spec_verify_cost\": [", sc->decode_s * 1e3);
    for (int N = 1; N <= SPEC_MAX_N; N++) printf("%s%.4g", N > 1 ? ", " : "", sc->r[N]);
    printf("], \"spec_verify_cost_range\": [");
    for (int N = 1; N <= SPEC_MAX_N; N++) printf("%s[%.4g, %.4g]", N > 1 ? ", " : "", sc->r_lo[N], sc->r_hi[N]);
    printf("]");
    if (sc->c < 0) { printf(", \"spec_draft_cost\": null, \"spec_speedup\": null"); return; }
    printf(", \"spec_draft_cost\": %.4g, \"spec_draft_cost_range\": [%.4g, %.4g], \"spec_speedup\": {", sc->c, sc->c_lo, sc->c_hi);
    for (int i = 0; i < 4; i++) {
        printf("%s\"%.1f\": [", i ? ", " : "", SPEC_ACCEPT[i]);
        for (int N = 1; N <= SPEC_MAX_N; N++) printf("%s%.4g", N > 1 ? ", " : "", spec_speedup(sc, N, SPEC_ACCEPT[i]));
        printf("]");
    }
    printf("}");
}

/* The drafting lines of the table. */
static void print_spec_table(const SpecCost *sc, int P) {
    if (!sc->measured) { printf("  drafts    not measured (--gpu: drafting is not timed on the GPU yet; or --ctx too short)\n"); return; }
    printf("  drafts    at context %d, in decode steps (%.1f ms; median of %d rounds, [fastest, slowest]):\n", P, sc->decode_s * 1e3, SPEC_RUNS);
    printf("            verify r(N), a pass over N+1 tokens:");
    for (int N = 1; N <= SPEC_MAX_N; N++) printf("  N=%d %.2f [%.2f, %.2f]", N, sc->r[N], sc->r_lo[N], sc->r_hi[N]);
    printf("\n");
    if (sc->c < 0) { printf("            draft step c: no MTP layer in this checkpoint (glm synth --mtp writes one)\n"); return; }
    printf("            draft step c, the MTP layer on one row: %.2f [%.2f, %.2f]\n", sc->c, sc->c_lo, sc->c_hi);
    printf("            speedup (1-a^(N+1)) / ((1-a)(r(N)+N c)):");
    for (int i = 0; i < 4; i++) {
        printf("%s a=%.1f", i ? "," : "", SPEC_ACCEPT[i]);
        for (int N = 1; N <= SPEC_MAX_N; N++) printf(" %.2f", spec_speedup(sc, N, SPEC_ACCEPT[i]));
    }
    printf(" (N = 1..%d)\n", SPEC_MAX_N);
}

/* One line of JSON; ratios to 4 significant digits: a tiny test model's are ~1e-4, not 0.000 */
static void print_json(const BenchResult *b) {
    const PrefillResult *p = &b->pre;
    const DecodeResult *d = &b->dec;
    const double gbs0 = d->bytes0 * d->tps0, gbsL = d->bytesL * d->tpsL; /* decode's reads, bytes/s */
    printf("{\"model\": \"%s\", \"threads\": %d, \"kernels\": \"%s\", \"read_bw_gbs\": %.2f, \"read_bw_best_gbs\": %.2f, \"fma_peak_gflops\": %.1f, "
           "\"prefill_tokens\": %d, \"precision\": \"%s\", \"prefill_tps\": %.2f, \"prefill_gflops\": %.1f, \"prefill_peak_ratio\": %.4g, "
           "\"prefill_peak_ratio_runs\": [%.4g, %.4g, %.4g], "
           "\"decode_tps_ctx0\": %.3f, \"decode_bytes_per_token\": %.0f, \"decode_gbs\": %.2f, \"decode_bw_ratio\": %.4g, \"decode_best_bw_ratio\": %.4g, "
           "\"weights_read_gbs\": %.2f, \"decode_weights_bw_ratio\": %.4g, "
           "\"long_ctx\": %d, \"decode_tps_long\": %.3f, \"decode_long_bw_ratio\": %.4g, \"read_bw_long_gbs\": %.2f, \"huge_page_fraction\": %.3f",
           b->model_dir, b->threads, ops.name, d->bw0 / 1e9, d->best0 / 1e9, p->peak / 1e9,
           b->P, ops.precision, b->P / p->secs, p->flops / 1e9, p->flops / p->peak,
           p->ratio[0], p->ratio[1], p->ratio[2],
           d->tps0, d->bytes0, gbs0 / 1e9, gbs0 / d->bw0, gbs0 / d->best0,
           d->weights_bw / 1e9, gbs0 / d->weights_bw,
           b->L, d->tpsL, gbsL / d->bwL, d->bwL / 1e9, b->huge);
    if (kernels.bf16_speedup) printf(", \"bf16_speedup\": %.3f", kernels.bf16_speedup());
    if (b->batch.measured) {
        const BatchCost *bc = &b->batch;
        printf(", \"batch_seqs\": %d, \"batch_cost\": %.4g, \"batch_cost_range\": [%.4g, %.4g], \"batch_speedup\": %.4g", BATCH_SEQS,
               bc->cost, bc->lo, bc->hi, BATCH_SEQS / bc->cost);
        printf(", \"batch_step_ms\": [%.3f, %.3f], \"batch_parts_ms\": {", bc->step[0] * 1e3, bc->step[1] * 1e3);
        for (int p = 0; p < N_PARTS; p++) printf("%s\"%s\": [%.3f, %.3f]", p ? ", " : "", part_name[p], bc->part[0][p] * 1e3, bc->part[1][p] * 1e3);
        printf("}");
    } else printf(", \"batch_seqs\": %d, \"batch_cost\": null, \"batch_speedup\": null", BATCH_SEQS);
    print_spec_json(&b->spec);
    printf("}\n");
}

/* The same numbers as a table for a person. */
static void print_table(const BenchResult *b) {
    const PrefillResult *p = &b->pre;
    const DecodeResult *d = &b->dec;
    const double gbs0 = d->bytes0 * d->tps0, gbsL = d->bytesL * d->tpsL; /* decode's reads, bytes/s */
    printf("glm bench: %s (%d threads, %s kernels)\n", b->model_dir, b->threads, ops.name);
    printf("  machine   read bandwidth %.1f GB/s (around the decode; its fastest passes %.1f), fp32 FMA peak %.1f GFLOP/s (around the prefill)\n",
           d->bw0 / 1e9, d->best0 / 1e9, p->peak / 1e9);
    if (kernels.bf16_speedup) /* what chose the default precision (fast_init) */
        printf("            vdpbf16ps runs at %.2f x the fp32 FMA's FLOP rate here\n", kernels.bf16_speedup());
    if (b->huge >= 0) printf("  weights   %.0f%% on 2 MB pages%s\n", 100 * b->huge, b->huge < 0.9 ? " (4 KB pages slow decode: see README, Performance)" : "");
    printf("  prefill   %d tokens (%s products): %.2f tok/s, %.1f GFLOP/s = %.2f x FMA peak (the median of %d runs: %.2f, %.2f, %.2f)\n", b->P,
           ops.precision, b->P / p->secs, p->flops / 1e9, p->flops / p->peak, PREFILL_RUNS, p->ratio[0], p->ratio[1], p->ratio[2]);
    printf("  decode    context 0: %.2f tok/s, %.3f GB/token, %.1f GB/s = %.2f x read bandwidth (%.2f x its fastest passes)\n", d->tps0,
           d->bytes0 / 1e9, gbs0 / 1e9, gbs0 / d->bw0, gbs0 / d->best0);
    printf("            (a streaming read of the weights' own pages, before each token too: %.1f GB/s; decode = %.2f x that)\n",
           d->weights_bw / 1e9, gbs0 / d->weights_bw);
    printf("  decode    context %d: %.2f tok/s, %.3f GB/token, %.1f GB/s = %.2f x read bandwidth (%.1f GB/s around it)\n", b->L, d->tpsL,
           d->bytesL / 1e9, gbsL / 1e9, gbsL / d->bwL, d->bwL / 1e9);
    printf("  slowdown  context 0 -> %d: %.2fx\n", b->L, d->tps0 / d->tpsL);
    print_spec_table(&b->spec, b->P);
    if (b->batch.measured) {
        const BatchCost *bc = &b->batch;
        printf("  batch     a decode step of %d sequences (glm serve): %.2f decode steps [%.2f, %.2f], so %.2fx one sequence's tok/s\n",
               BATCH_SEQS, bc->cost, bc->lo, bc->hi, BATCH_SEQS / bc->cost);
        printf("            ms per step, one sequence -> %d (mean of %d rounds): %.1f -> %.1f\n", BATCH_SEQS, SPEC_RUNS, bc->step[0] * 1e3, bc->step[1] * 1e3);
        for (int p = 0; p < N_PARTS; p++)
            printf("              %-9s %7.1f -> %7.1f  %s\n", part_name[p], bc->part[0][p] * 1e3, bc->part[1][p] * 1e3, part_what[p]);
    } else printf("  batch     not measured (--gpu)\n");
}

/* glm bench: the steps in the order the header describes, then one report. */
int bench_run(const BenchArgs *a) {
    const int P = a->prompt, L = a->long_ctx, N = a->n_decode;
    g_quiet = a->json;
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    const int ctx = a->ctx ? a->ctx : (P > L ? P : L) + (N > SPEC_MAX_N ? N : SPEC_MAX_N) + 1; /* room for the verify passes after P */
    Session S;
    session_open(&S, a->model_dir, ctx, a->n_gpus);
    if (P > S.kv.ctx || L + N > S.kv.ctx) glm_fatal("--ctx %d: too small for -P %d and --long %d + %d tokens", S.kv.ctx, P, L, N);

    /* the weights paged in before anything is timed; then the prefill, then the decodes */
    Yardsticks yard = yardsticks_open(&S.model);
    BenchResult b = {.model_dir = a->model_dir, .threads = threads, .P = P, .L = L};
    b.huge = huge_page_fraction(&S.model.ck);
    int *ids = random_ids(P > L ? P : L, S.model.cfg.vocab_size);
    b.pre = timed_prefill(&S, ids, P);
    b.spec = timed_spec_costs(&S, ids, P);
    b.batch = timed_batch_cost(&S, ids);
    b.dec = timed_decodes(&S, ids, L, N, &yard);

    if (a->json) print_json(&b);
    else print_table(&b);
    yardsticks_close(&yard);
    free(ids);
    session_close(&S);
    return 0;
}
