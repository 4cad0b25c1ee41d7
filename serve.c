/* serve.c - glm serve: an OpenAI-compatible HTTP server with continuous batching and a
 * prefix cache.
 *
 *   connection threads                 engine thread (the only one that runs the model)
 *   ------------------                 ------------------------------------------------
 *   read a request (http.c)            admit queued jobs into free slots; the prefix
 *   parse its JSON, render the chat,     cache fills each slot's first cached positions
 *   tokenize, check, queue a Job  --->  one step: every decoding slot's next token and a
 *   wait for its tokens           <---    chunk of prefilling prompts, as ONE forward_batch
 *   text, stop strings, reasoning /       (each weight read once for all of them)
 *   content / tool calls, SSE            sample each slot's next token; finished slots free
 *                                        at once; full blocks of tokens join the cache
 *
 * A Job is shared by its connection thread and the engine under one mutex (Server.mu):
 * the engine appends tokens and sets done; the connection sets cancel (client gone, a
 * stop string matched) and frees the Job only after the engine has set done.
 *
 * Batch invariance: a decode batch computes each row as it would be computed alone, a
 * prompt's rows come out the same in any chunk (ops.prompt_rows), and the prefix cache
 * hands back rows the same computation wrote, so a request's logits do not depend on
 * what runs beside it or where its prefix came from (docs in README "glm serve";
 * tests/test_serve.sh checks it).
 */
#define _GNU_SOURCE
#include "glm.h"
#include "http.h"
#include "json.h"
#include "tokenizer.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <poll.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* ======================================================================== */
/* flags                                                                    */

typedef struct {
    const char *model_dir, *host, *api_key, *tokenizer, *alias;
    int port, ctx, parallel, chunk, queue, threads, bf16;
    int n_gpus;               /* --gpu / --gpus N: the GPU path (its caches on the devices) */
    int draft;                /* --draft N: MTP drafts per step and sequence; -1 = the backend's default */
    double cache_mb;          /* prefix cache budget; < 0 = sized from memory */
    size_t max_body;
} ServeArgs;

/* A verify step's rows (x and the drafts) must each compute as a decoded token does, so
 * that drafting changes no greedy token and no log-probability: up to 7 rows of a
 * sequence, the fast path's attention and products treat each row as alone. */
#define DRAFT_MAX 6
#define DRAFT_MAX_STR "6"

static const char SERVE_USAGE[] =
    "usage: glm serve -m DIR [--host ADDR] [--port N] [--parallel N] [--ctx N] [flags]\n"
    "  An OpenAI-compatible HTTP/1.1 server: POST /v1/chat/completions, POST /v1/completions,\n"
    "  GET /v1/models, GET /health. Many requests decode together (continuous batching), and a\n"
    "  prompt that starts like an earlier one reuses its cached positions (prefix cache).\n"
    "  -m DIR            the checkpoint folder (required)\n"
    "  --host ADDR       address to listen on (default 127.0.0.1)\n"
    "  --port N          port (default 8080)\n"
    "  --parallel N      sequences decoded together (default: from free memory, at most 8)\n"
    "  --ctx N           context per sequence in tokens (default min(4096, max_position_embeddings))\n"
    "  --chunk N         prompt tokens per step beside the running decodes (default 256)\n"
    "  --cache-mb N      prefix cache budget in MiB, 0 = off (default: from free memory)\n"
    "  --queue N         requests waiting for a slot before 503 (default 64)\n"
    "  --max-body N      largest request body in bytes (default 8388608)\n"
    "  --api-key KEY     require \"Authorization: Bearer KEY\" (GLM_API_KEY sets it too)\n"
    "  --alias NAME      the model id clients see (default: the folder's name)\n"
    "  --tokenizer FILE  tokenizer.json (default DIR/tokenizer.json)\n"
    "  --draft N         speculative decoding: N tokens (0-" DRAFT_MAX_STR ") drafted per step by the MTP layer\n"
    "                    for each sequence, verified together (default: as glm run's; needs the MTP layer)\n"
    "  --gpu, --gpus N   run on N GPUs (builds with GPU support): --parallel sequences (default 1, at\n"
    "                    most 8 decoding at once; 1 with --draft), each with its KV cache rows on the\n"
    "                    devices, where a prompt reuses the whole --chunk chunks it shares with its\n"
    "                    slot's last prompt (there is no prefix cache)\n"
    "  -t N              threads (default: one per core)\n"
    "  --bf16 / --fp32   activations of the weight products (default: whichever this CPU runs\n"
    "                    faster, bf16 on AMD Zen 4/5, fp32 on Intel Xeon; GLM_PRECISION)\n"
    "  -h, --help        this text\n"
    "Request fields: model, messages | prompt (text or token ids), max_tokens (max_completion_tokens;\n"
    "default: until the context is full), temperature and top_p (default 1 and 1, as OpenAI's), seed,\n"
    "stop, n (1), stream, stream_options.include_usage, ignore_eos, logprobs (the chosen token's);\n"
    "chat: tools, enable_thinking or chat_template_kwargs.enable_thinking or thinking.type\n"
    "(\"enabled\"/\"disabled\"), reasoning_effort (\"high\" = High, else Max). The reasoning comes back\n"
    "in reasoning_content, the answer in content, tool calls in tool_calls.";

static long flag_long(const char *f, const char *v, long lo, long hi) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi) glm_fatal("%s %s: expected an integer in %ld..%ld", f, v, lo, hi);
    return x;
}

static void serve_args(ServeArgs *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->host = "127.0.0.1";
    a->port = 8080;
    a->chunk = 256;
    a->queue = 64;
    a->cache_mb = -1;
    a->max_body = 8u << 20;
    a->draft = -1;
    a->api_key = getenv("GLM_API_KEY");
    const char *pp = getenv("GLM_PRECISION");
    if (pp && *pp && strcmp(pp, "fp32") && strcmp(pp, "bf16")) glm_fatal("GLM_PRECISION=%s: expected fp32 or bf16", pp);
    a->bf16 = pp && *pp ? !strcmp(pp, "bf16") : -1; /* -1: whichever is faster here (fast_init) */
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { puts(SERVE_USAGE); exit(0); }
        if (!strcmp(f, "--bf16")) { a->bf16 = 1; continue; }
        if (!strcmp(f, "--fp32")) { a->bf16 = 0; continue; }
        if (!strcmp(f, "--gpu")) { a->n_gpus = 1; continue; }
        static const char *const with_value[] = {"-m", "--host", "--port", "--parallel", "--ctx", "--chunk", "--cache-mb",
                                                 "--queue", "--max-body", "--api-key", "--alias", "--tokenizer", "-t", "--gpus", "--draft"};
        int known = 0;
        for (size_t k = 0; k < sizeof with_value / sizeof *with_value; k++) known |= !strcmp(f, with_value[k]);
        if (!known) glm_fatal("serve: unknown flag '%s' (see glm serve --help)", f);
        if (i + 1 >= argc) glm_fatal("%s: missing value", f);
        const char *v = argv[++i];
        if (!strcmp(f, "-m")) a->model_dir = v;
        else if (!strcmp(f, "--host")) a->host = v;
        else if (!strcmp(f, "--port")) a->port = (int)flag_long(f, v, 0, 65535);
        else if (!strcmp(f, "--parallel")) a->parallel = (int)flag_long(f, v, 1, 256);
        else if (!strcmp(f, "--ctx")) a->ctx = (int)flag_long(f, v, 2, 1 << 24);
        else if (!strcmp(f, "--chunk")) a->chunk = (int)flag_long(f, v, 1, 1 << 16);
        else if (!strcmp(f, "--cache-mb")) a->cache_mb = (double)flag_long(f, v, 0, 1L << 30);
        else if (!strcmp(f, "--queue")) a->queue = (int)flag_long(f, v, 1, 1 << 20);
        else if (!strcmp(f, "--max-body")) a->max_body = (size_t)flag_long(f, v, 1024, 1L << 30);
        else if (!strcmp(f, "--api-key")) a->api_key = v;
        else if (!strcmp(f, "--alias")) a->alias = v;
        else if (!strcmp(f, "--tokenizer")) a->tokenizer = v;
        else if (!strcmp(f, "--gpus")) a->n_gpus = (int)flag_long(f, v, 1, 64);
        else if (!strcmp(f, "--draft")) a->draft = (int)flag_long(f, v, 0, DRAFT_MAX);
        else a->threads = (int)flag_long(f, v, 1, 4096);
    }
    if (!a->model_dir) glm_fatal("serve: -m DIR is required (see glm serve --help)");
    if (a->api_key && !*a->api_key) a->api_key = NULL;
}

/* ======================================================================== */
/* the prefix cache                                                         */
/*
 * The cached state of a prompt position is what forward() left in the KV cache for it:
 * each layer's latent row and each indexer layer's key (docs/MODEL.md §4.1). Positions
 * are kept in blocks of CACHE_BLOCK tokens. A block is known by its tokens and by the
 * block before it (its parent), so a hit means the whole prefix up to it matches, as in
 * a radix tree; ids are never reused, so a child of an evicted block can no longer be
 * reached and ages out. The least recently used block goes first when the budget is
 * full. Only the engine thread touches it.
 *
 * With --draft the MTP layer's cache comes along. Its row t pairs h_t with token t+1, so
 * a block of positions p..p+15 keeps the MTP rows p-1 .. p+14: rows whose tokens all lie
 * in the block's prefix (row p+15 needs token p+16, which the next block may not share).
 * A hit of n positions then restores MTP rows 0 .. n-2, and the block keeps the main
 * model's hidden state at its last position, h_{p+15}: the one the MTP layer pairs with
 * whatever token follows the hit.
 */
#define CACHE_BLOCK 16

typedef struct {
    long id;                  /* > 0; 0 = an unused entry */
    long parent;              /* id of the block before it; 0 for the first block */
    int tokens[CACHE_BLOCK];
    uint64_t last_use;
    float *rows;              /* [n_layers][CACHE_BLOCK][KR+DR] latent rows, then [n_index][CACHE_BLOCK][ID] keys;
                                 with mtp then the MTP layer's [CACHE_BLOCK][KR+DR] rows and [CACHE_BLOCK][ID]
                                 keys (positions p-1 .. p+14) and h_{p+15} [H] */
} CacheBlock;

typedef struct {
    CacheBlock *block;        /* [cap] */
    int cap;
    long next_id;
    uint64_t clock;
    size_t block_bytes;
    int mtp;                  /* blocks carry the MTP layer's rows (--draft) */
} PrefixCache;

/* The floats of a block: the main layers' rows and keys, then (mtp) the MTP layer's and h. */
static size_t cache_main_floats(const Model *m) {
    const Config *c = &m->cfg;
    return (size_t)CACHE_BLOCK * ((size_t)c->n_layers * (c->kv_lora_rank + c->qk_rope) + (size_t)m->n_index_layers * c->index_head_dim);
}
static size_t cache_mtp_floats(const Model *m) {
    const Config *c = &m->cfg;
    return (size_t)CACHE_BLOCK * (c->kv_lora_rank + c->qk_rope + c->index_head_dim) + (size_t)c->hidden;
}

static void cache_init(PrefixCache *pc, const Model *m, size_t budget, int mtp) {
    memset(pc, 0, sizeof *pc);
    pc->mtp = mtp;
    pc->block_bytes = (cache_main_floats(m) + (mtp ? cache_mtp_floats(m) : 0)) * sizeof(float);
    const size_t blocks = budget / pc->block_bytes;
    pc->cap = blocks > (1u << 30) ? 1 << 30 : (int)blocks;
    pc->block = xcalloc(pc->cap ? (size_t)pc->cap : 1, sizeof(CacheBlock));
    pc->next_id = 1;
}

static void cache_free(PrefixCache *pc) {
    for (int i = 0; i < pc->cap; i++) free(pc->block[i].rows);
    free(pc->block);
}

static CacheBlock *cache_find(PrefixCache *pc, long parent, const int *tokens) {
    for (int i = 0; i < pc->cap; i++) { /* a linear scan: microseconds next to a forward step */
        CacheBlock *b = &pc->block[i];
        if (b->id && b->parent == parent && !memcmp(b->tokens, tokens, sizeof b->tokens)) return b;
    }
    return NULL;
}

/* n rows of width w between the KV cache (kv_rows) and a block (block_rows), either way. */
static void copy_rows(float *kv_rows, float *block_rows, int n, size_t w, int to_cache) {
    if (to_cache) memcpy(block_rows, kv_rows, (size_t)n * w * sizeof(float));
    else memcpy(kv_rows, block_rows, (size_t)n * w * sizeof(float));
}

/* Copies positions pos..pos+CACHE_BLOCK-1 of kv into rows (to_cache) or back; with the
 * cache's mtp, also the MTP layer's rows pos-1 .. pos+14 (row 0 unused at pos 0) and h,
 * the main model's hidden state at pos+15 ([H], into the block, or back into h). */
static void cache_copy(const PrefixCache *pc, const Model *m, KVCache *kv, int pos, float *rows, int to_cache, float *h) {
    const Config *c = &m->cfg;
    const size_t AD = (size_t)c->kv_lora_rank + c->qk_rope, ID = c->index_head_dim, T = kv->ctx;
    for (int l = 0; l < c->n_layers; l++)
        copy_rows(kv->latent + (l * T + pos) * AD, rows + (size_t)l * CACHE_BLOCK * AD, CACHE_BLOCK, AD, to_cache);
    float *keys = rows + (size_t)c->n_layers * CACHE_BLOCK * AD;
    for (int s = 0; s < m->n_index_layers; s++)
        copy_rows(kv->index_k + (s * T + pos) * ID, keys + (size_t)s * CACHE_BLOCK * ID, CACHE_BLOCK, ID, to_cache);
    if (!pc->mtp) return;
    float *mtp_rows = rows + cache_main_floats(m), *mtp_keys = mtp_rows + CACHE_BLOCK * AD, *block_h = mtp_keys + CACHE_BLOCK * ID;
    const int first = pos ? pos - 1 : 0, skip = pos ? 0 : 1, n = CACHE_BLOCK - skip;
    copy_rows(kv->latent + ((size_t)c->n_layers * T + first) * AD, mtp_rows + skip * AD, n, AD, to_cache);
    copy_rows(kv->index_k + ((size_t)m->n_index_layers * T + first) * ID, mtp_keys + skip * ID, n, ID, to_cache);
    copy_rows(h, block_h, 1, (size_t)c->hidden, to_cache);
}

/* How many of tokens[0..n) the cache holds as a prefix (whole blocks). */
static int cache_match(PrefixCache *pc, const int *tokens, int n) {
    int pos = 0;
    long last = 0;
    for (; pos + CACHE_BLOCK <= n; pos += CACHE_BLOCK) {
        const CacheBlock *b = cache_find(pc, last, tokens + pos);
        if (!b) break;
        last = b->id;
    }
    return pos;
}

/* Fills positions 0..n-1 of kv from the cache (n a multiple of CACHE_BLOCK that
 * cache_match found), and with mtp h [H] with h_{n-1}; returns the id of the last block
 * (0 if n is 0). */
static long cache_load(PrefixCache *pc, const Model *m, const int *tokens, int n, KVCache *kv, float *h) {
    long last = 0;
    for (int pos = 0; pos < n; pos += CACHE_BLOCK) {
        CacheBlock *b = cache_find(pc, last, tokens + pos);
        cache_copy(pc, m, kv, pos, b->rows, 0, h);
        b->last_use = ++pc->clock;
        last = b->id;
    }
    return last;
}

/* The block of positions pos.. (tokens[0..CACHE_BLOCK)) after block `parent`, taken
 * from kv (and with mtp h = h_{pos+15}); returns its id (an existing block's if it is
 * already there). */
static long cache_insert(PrefixCache *pc, const Model *m, KVCache *kv, int pos, const int *tokens, long parent, float *h) {
    CacheBlock *b = cache_find(pc, parent, tokens);
    if (!b) {
        if (!pc->cap) return 0;
        b = &pc->block[0];
        for (int i = 0; i < pc->cap && b->id; i++) /* a free entry, else the least recently used */
            if (!pc->block[i].id || pc->block[i].last_use < b->last_use) b = &pc->block[i];
        if (!b->rows) b->rows = xmalloc(pc->block_bytes);
        b->id = pc->next_id++;
        b->parent = parent;
        memcpy(b->tokens, tokens, sizeof b->tokens);
        cache_copy(pc, m, kv, pos, b->rows, 1, h);
    }
    b->last_use = ++pc->clock;
    return b->id;
}

/* ======================================================================== */
/* jobs, slots, the server                                                  */

/* One request's generation, shared by its connection thread and the engine (Server.mu). */
typedef struct Job {
    /* set by the connection thread before it queues the job */
    long id;
    int *prompt, n_prompt;
    int max_tokens;           /* already within the context */
    float temperature, top_p;
    uint64_t seed;
    int ignore_eos;
    int logprobs;             /* the response carries each token's log-probability (else it is not computed) */
    double t_arrive;
    /* written by the engine */
    int *out, n_out, cap_out; /* generated ids (an end-of-sequence id is counted in n_gen, not kept) */
    float *logprob;           /* [cap_out] log p of each generated id under the model (before temperature);
                                 NAN where the request did not ask for logprobs */
    int n_gen;                /* tokens sampled */
    int n_cached;             /* prompt tokens whose state came from the prefix cache */
    long drafted, accepted;   /* --draft: MTP drafts proposed and accepted */
    int done;                 /* no more tokens will come; the engine holds no pointer to the job */
    const char *finish;       /* "stop" (end of sequence), "length" (max_tokens, context), "cancel" (the
                                 connection asked), "abort" (shutdown) */
    double t_first;
    /* written by the connection thread */
    int cancel;               /* stop now: the client left or a stop string matched */
    int in_queue;             /* still waiting for a slot (Server.queue_head ...) */
    pthread_cond_t cond;      /* signalled when tokens arrive or done is set */
    struct Job *next;         /* the queue */
} Job;

/* A sequence being generated: its own KV cache and sampler. */
typedef struct {
    Job *job;                 /* NULL: free */
    KVCache kv;
    Sampler sp;
    int n_fed;                /* prompt tokens in kv (from the cache or computed) */
    int next;                 /* the last sampled token: fed at the next step */
    long ticket;              /* admission order: older prompts prefill first */
    int n_blocks;             /* blocks of kv already offered to the prefix cache */
    long last_block;          /* the id of the last of them */
    Speculator spec;          /* --draft: the drafts, the MTP layer's catch-up, the rollback */
    float *ends_h;            /* --draft: [chunk / CACHE_BLOCK + 2][H] the hidden states at the block ends */
    int ends_first;           /*   of the prompt chunk just run; ends_h[0]'s position */
    /* --gpu: the slot's cache rows stay on the devices between jobs: its last job's whole
     * prompt chunks (gpu_tokens[0 .. gpu_whole)) serve a next prompt that starts with
     * them, in place of the prefix cache */
    int *gpu_tokens, gpu_whole;
    float *gpu_ends_h;        /* --draft: [ctx / chunk][H] the hidden state at each whole chunk's last position */
} Slot;

typedef struct {
    ServeArgs args;
    Session S;                /* the model, the activations (RunState) and with --gpu the devices;
                                 its own kv is unused: every slot has one */
    Tokenizer *tok;
    const char *model_id;
    int drafts;               /* MTP drafts per step (--draft, or the backend's default); 0 = none */
    Slot *slot;               /* [parallel] */
    float *logits;            /* [parallel * (drafts + 1)][V] */
    float *scratch;           /* [parallel + 1][V] a sampled row's logits, kept while sample() overwrites the row */
    PrefixCache cache;
    int *script, n_script;    /* GLM_SERVE_SCRIPT (tests): every request "generates" these ids, then end of sequence */
    pthread_mutex_t mu;
    pthread_cond_t wake;      /* the engine: a job was queued or cancelled */
    pthread_cond_t conns_done;
    Job *queue_head, *queue_tail;
    int queued, n_conns;
    long next_id, next_ticket;
    long decode_steps, decode_seqs; /* engine steps that decoded, and the sequences they decoded (the log at shutdown) */
    int listen_fd;
} Server;

static Server g;
static volatile sig_atomic_t g_stop; /* SIGINT / SIGTERM */
static volatile int g_stop_int;      /* the same, as http_read polls it */

static void on_signal(int sig) { (void)sig; g_stop = 1; g_stop_int = 1; }

static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(cv, mu, &ts);
}

/* ======================================================================== */
/* the engine                                                               */

/* Under g.mu: the job is over; the engine lets go of it. */
static void job_finish(Slot *sl, Job *j, const char *why) {
    j->finish = why;
    j->done = 1;
    pthread_cond_broadcast(&j->cond);
    if (sl) sl->job = NULL;
}

/* --gpu: the part of job j's prompt that slot sl's cache rows on the devices still hold
 * from its last job, in whole chunks (a whole chunk's rows are what the new prompt's own
 * chunk would compute, as with the prefix cache), and not the last token: its logits are
 * needed. */
static int gpu_prefix(const Slot *sl, const Job *j) {
    const int C = g.args.chunk;
    int n = 0;
    while (n < sl->gpu_whole && n < j->n_prompt - 1 && sl->gpu_tokens[n] == j->prompt[n]) n++;
    return n / C * C;
}

/* --gpu: a prompt chunk of B rows ending at position end just ran; a whole chunk that
 * extends the slot's reusable prefix joins it (with drafts, with its last row's hidden
 * state, which a job resuming there needs as the MTP layer's pending h). */
static void gpu_keep_chunk(Slot *sl, int B, int end) {
    const int C = g.args.chunk, H = g.S.model.cfg.hidden;
    if (B != C || end - B != sl->gpu_whole) return; /* (gpu_whole: a multiple of C) */
    memcpy(sl->gpu_tokens + end - B, sl->job->prompt + end - B, (size_t)B * sizeof(int));
    if (g.drafts) memcpy(sl->gpu_ends_h + (size_t)(end / C - 1) * H, spec_pending_end(&sl->spec) + (size_t)(B - 1) * H, (size_t)H * sizeof(float));
    sl->gpu_whole = end;
}

/* The free slot for job j: the first one, or with --gpu the one whose cache rows on the
 * devices hold the longest part of its prompt; -1: none is free. */
static int pick_slot(const Job *j) {
    int best = -1, best_n = -1;
    for (int i = 0; i < g.args.parallel; i++) {
        if (g.slot[i].job) continue;
        if (!g.S.gpu) return i;
        const int n = gpu_prefix(&g.slot[i], j);
        if (n > best_n) { best = i; best_n = n; }
    }
    return best;
}

/* Under g.mu: free slots take queued jobs, each starting from the longest prefix the
 * cache holds in whole blocks (--gpu: in whole chunks that the slot's rows on the
 * devices hold). */
static void admit(void) {
    int i;
    while (g.queue_head && (i = pick_slot(g.queue_head)) >= 0) {
        Slot *sl = &g.slot[i];
        Job *j = g.queue_head;
        g.queue_head = j->next;
        if (!g.queue_head) g.queue_tail = NULL;
        g.queued--;
        j->in_queue = 0;
        sl->job = j;
        sl->kv.pos = sl->kv.mtp_pos = 0;
        /* not the last token: its logits are needed */
        int hit;
        if (g.S.gpu) {
            hit = gpu_prefix(sl, j);
            sl->gpu_whole = hit; /* the job overwrites the rest */
            if (g.drafts) spec_resume(&sl->spec, j->prompt, j->n_prompt, hit, hit ? sl->gpu_ends_h + (size_t)(hit / g.args.chunk - 1) * g.S.model.cfg.hidden : NULL);
        } else {
            hit = cache_match(&g.cache, j->prompt, j->n_prompt - 1);
            sl->last_block = cache_load(&g.cache, &g.S.model, j->prompt, hit, &sl->kv, sl->ends_h);
            if (g.drafts) spec_resume(&sl->spec, j->prompt, j->n_prompt, hit, sl->ends_h);
        }
        sl->n_fed = sl->kv.pos = hit;
        sl->n_blocks = sl->n_fed / CACHE_BLOCK;
        j->n_cached = sl->n_fed;
        sl->ticket = g.next_ticket++;
        sampler_free(&sl->sp);
        sampler_init(&sl->sp, j->temperature, j->top_p, j->seed, g.S.model.cfg.vocab_size);
    }
}

/* The token at position pos of a slot's sequence: the prompt, then what it generated. */
static int seq_token(const Slot *sl, int pos) {
    return pos < sl->job->n_prompt ? sl->job->prompt[pos] : sl->job->out[pos - sl->job->n_prompt];
}

/* Offers the slot's newly completed prompt blocks to the prefix cache: the prompt's
 * positions only, for a decode's rows come from other kernels than a prompt's (and a
 * later prompt that starts with them must get the rows its own chunks compute). With
 * drafts, h is the hidden state at each block's last position, from the chunk just run
 * (ends_h). */
static void offer_blocks(Slot *sl) {
    const int H = g.S.model.cfg.hidden;
    int tokens[CACHE_BLOCK];
    while ((sl->n_blocks + 1) * CACHE_BLOCK <= sl->n_fed) { /* (n_fed: prompt tokens only) */
        const int pos = sl->n_blocks * CACHE_BLOCK;
        float *h = g.drafts ? sl->ends_h + (size_t)((pos + CACHE_BLOCK - 1 - sl->ends_first) / CACHE_BLOCK) * H : NULL;
        for (int i = 0; i < CACHE_BLOCK; i++) tokens[i] = seq_token(sl, pos + i);
        sl->last_block = cache_insert(&g.cache, &g.S.model, &sl->kv, pos, tokens, sl->last_block, h);
        sl->n_blocks++;
    }
}

/* --draft, after a prompt chunk of B rows ending at position end: the hidden states at
 * its block ends are kept for offer_blocks, then the MTP layer gets its rows. */
static void prompt_chunk_mtp(Slot *sl, int B, int end) {
    const int H = g.S.model.cfg.hidden, start = end - B;
    const float *hid = spec_pending_end(&sl->spec); /* the chunk's rows, not yet counted as pending */
    sl->ends_first = (start / CACHE_BLOCK + 1) * CACHE_BLOCK - 1;
    for (int e = sl->ends_first, k = 0; e < end; e += CACHE_BLOCK, k++)
        memcpy(sl->ends_h + (size_t)k * H, hid + (size_t)(e - start) * H, (size_t)H * sizeof(float));
    spec_prompt_chunk(&sl->spec, &g.S, B);
}

/* Under g.mu: one sampled token (and its log-probability) for the slot's job. */
static void take_token(Slot *sl, int tok, float logprob) {
    Job *j = sl->job;
    const Config *c = &g.S.model.cfg;
    j->n_gen++;
    if (!j->t_first) j->t_first = now_s();
    if (!j->ignore_eos && is_eos(c, tok)) { job_finish(sl, j, "stop"); return; }
    if (j->n_out == j->cap_out) {
        int cap = j->cap_out ? 2 * j->cap_out : 64;
        int *p = realloc(j->out, (size_t)cap * sizeof(int));
        if (p) j->out = p;
        float *q = p ? realloc(j->logprob, (size_t)cap * sizeof(float)) : NULL;
        if (!q) { job_finish(sl, j, "length"); return; }
        j->logprob = q;
        j->cap_out = cap;
    }
    j->logprob[j->n_out] = logprob;
    j->out[j->n_out++] = tok;
    sl->next = tok;
    pthread_cond_broadcast(&j->cond);
    if (j->n_out >= j->max_tokens) job_finish(sl, j, "length");
}

#ifdef GLM_GPU
/* The slot whose cache a SeqTokens extends. */
static int slot_of(const SeqTokens *q) { return (int)((const Slot *)((const char *)q->kv - offsetof(Slot, kv)) - g.slot); }
#endif

/* forward_batch, or with --gpu the GPU path's: the decodes of several sequences (one
 * token each) as one gpu_forward_rows, else each sequence's forward on its cache slot
 * (its cache position is the host's kv.pos, as in session_forward). logits gets what
 * forward_batch writes: every row of a sequence with all_logits, else its last; or,
 * with --gpu and best (greedy decodes, one row each), nothing: best[i] gets row i's
 * greedy token from the device (gpu_argmax_rows). */
static void run_batch(const SeqTokens *seq, int n_seq, float *logits, int *best) {
#ifdef GLM_GPU
    if (g.S.gpu) {
        int one_each = n_seq > 1, slot[GPU_BATCH_MAX], pos[GPU_BATCH_MAX], tok[GPU_BATCH_MAX];
        for (int i = 0; i < n_seq && one_each; i++) {
            one_each = seq[i].n == 1 && !seq[i].all_logits && !seq[i].hidden;
            if (one_each) { slot[i] = slot_of(&seq[i]); pos[i] = seq[i].kv->pos; tok[i] = seq[i].tokens[0]; }
        }
        if (one_each) {
            gpu_forward_rows(g.S.gpu, slot, pos, tok, n_seq, best ? NULL : logits);
            if (best) gpu_argmax_rows(g.S.gpu, n_seq, best);
            for (int i = 0; i < n_seq; i++) seq[i].kv->pos++;
            return;
        }
        for (int i = 0; i < n_seq; i++) {
            gpu_use_slot(g.S.gpu, slot_of(&seq[i]));
            gpu_forward_hidden(g.S.gpu, seq[i].kv->pos, seq[i].tokens, seq[i].n, best ? NULL : logits, seq[i].all_logits, seq[i].hidden);
            if (best) gpu_argmax_rows(g.S.gpu, 1, best + i);
            seq[i].kv->pos += seq[i].n;
            logits += (size_t)(seq[i].all_logits ? seq[i].n : 1) * g.S.model.cfg.vocab_size;
        }
        return;
    }
#endif
    (void)best;
    forward_batch(&g.S.model, &g.S.state, seq, n_seq, logits);
}

/* The decode batch in groups of at most MATVEC_MAX_TOKENS rows, each group one
 * forward_batch: within it every row computes as a lone token's (a larger batch would
 * switch the products to the prompt's kernels). best: as run_batch's, for all rows. */
static void run_decodes(const SeqTokens *seq, int n_seq, float *logits, int *best) {
    const int V = g.S.model.cfg.vocab_size, most = g.S.gpu ? GPU_BATCH_MAX : MATVEC_MAX_TOKENS;
    for (int i = 0; i < n_seq;) {
        int n = 0, rows = 0;
        while (i + n < n_seq && (n == 0 || rows + seq[i + n].n <= most)) rows += seq[i + n++].n;
        run_batch(seq + i, n, logits, best ? best + i : NULL);
        for (int k = 0; k < n; k++) logits += (size_t)(seq[i + k].all_logits ? seq[i + k].n : 1) * V;
        i += n;
    }
}

/* The slot's next token from its row of logits lg: the argmax, or drawn by the slot's
 * sampler, which overwrites lg with probabilities (keep [V] gets the logits first, for
 * the token's log-probability). Touches only the slot's own sampler, so the rows of a
 * step pick their tokens on all threads at once. */
static int pick_token(Slot *sl, float *lg, float *keep) {
    const int V = g.S.model.cfg.vocab_size;
    if (sl->job->temperature <= 0) return argmax(lg, V);
    memcpy(keep, lg, (size_t)V * sizeof(float));
    return sample(&sl->sp, lg, V);
}

/* Under g.mu: the slot takes token tok (pick_token's from its row lg and keep; lg may be
 * NULL when the request wants no log-probabilities). lse: the row's log Σ exp
 * (log_sum_exp), for the token's log-probability. */
static void take_sampled(Slot *sl, const float *lg, const float *keep, float lse, int tok) {
    const Job *j = sl->job;
    const int t = g.script ? (j->n_gen < g.n_script ? g.script[j->n_gen] : g.S.model.cfg.eos[0]) : tok;
    take_token(sl, t, j->logprobs ? (j->temperature > 0 ? keep[t] : lg[t]) - lse : NAN);
}

/* One step: every decoding slot's next token (with --draft: its drafts, verified) as one
 * batch, then one chunk of the oldest waiting prompt as another. A chunk runs up to the
 * next multiple of C = --chunk (the GPU path keeps whole chunks on the devices) or the
 * prompt's end, and alone, with ops.prompt_rows set: the fast path then gives every row
 * the sums it would get in any other chunk (its products otherwise switch kernels with
 * the number of rows, and of tokens per expert), so a prompt's rows do not depend on
 * where its chunks start, on the prompts before it or on whether its prefix came from
 * the cache. A decode batch goes through the kernels whose per-token sums do not depend
 * on the batch (matvec_bf16_n), and so does a verify step's rows: drafting changes no
 * greedy token and no log-probability. Returns 0 when there was nothing to run. */
static int engine_step(void) {
    const int P = g.args.parallel, V = g.S.model.cfg.vocab_size, C = g.args.chunk;
    SeqTokens seq[P + 1];
    int who[P + 1], n_draft[P + 1], tokens[P + 1][DRAFT_MAX + 1], n_seq = 0, best = -1, rows = 0;
    for (int i = 0; i < P; i++) {
        Slot *sl = &g.slot[i];
        if (!sl->job) continue;
        if (sl->n_fed == sl->job->n_prompt) {
            n_draft[n_seq] = 0;
            tokens[n_seq][0] = sl->next;
            if (g.drafts) /* the MTP layer drafts (and first catches up on the last step's rows) */
                n_draft[n_seq] = spec_draft(&sl->spec, &g.S, &sl->sp, sl->next, sl->job->max_tokens - sl->job->n_out, tokens[n_seq]);
            seq[n_seq] = (SeqTokens){&sl->kv, tokens[n_seq], n_draft[n_seq] + 1, g.drafts, g.drafts ? spec_pending_end(&sl->spec) : NULL};
            rows += seq[n_seq].n;
            who[n_seq++] = i;
        } else if (best < 0 || sl->ticket < g.slot[best].ticket) best = i;
    }
    const int n_decode = n_seq;
    if (best >= 0) {
        Slot *sl = &g.slot[best];
        const int end = (sl->n_fed / C + 1) * C;
        seq[n_seq] = (SeqTokens){&sl->kv, sl->job->prompt + sl->n_fed, (end < sl->job->n_prompt ? end : sl->job->n_prompt) - sl->n_fed, 0,
                                 g.drafts ? spec_pending_end(&sl->spec) : NULL};
        who[n_seq++] = best;
    }
    if (!n_seq) return 0;
    float *prompt_logits = g.logits + (size_t)rows * V;
    /* With --gpu, when no decoding row needs its logits on the host (greedy, without
     * log-probabilities or drafts), only the rows' greedy tokens come back: copying n x V
     * floats and n argmax passes over them on one core take about as long as a fast GPU's
     * whole step. */
    int pick[n_decode + 1], on_device = g.S.gpu && !g.drafts;
    for (int k = 0; k < n_decode && on_device; k++) on_device = g.slot[who[k]].job->temperature <= 0 && !g.slot[who[k]].job->logprobs;
    if (n_decode) {
        run_decodes(seq, n_decode, g.logits, on_device ? pick : NULL);
        g.decode_steps++;
        g.decode_seqs += n_decode;
    }
    if (n_seq > n_decode) {
        Slot *sl = &g.slot[best];
        ops.prompt_rows = 1;
        run_batch(seq + n_decode, 1, prompt_logits, NULL);
        sl->n_fed += seq[n_decode].n;
        if (g.S.gpu) gpu_keep_chunk(sl, seq[n_decode].n, sl->n_fed);
        if (g.drafts) prompt_chunk_mtp(sl, seq[n_decode].n, sl->n_fed);
        ops.prompt_rows = 0;
    }
    /* each decoding row's token and, if its request wants log-probabilities, its log Σ exp
     * (before sample() turns the row into probabilities), on all threads: a row's log Σ exp
     * is 155k exponentials (~2 ms), and a draw over the flat logits of a random checkpoint
     * sorts most of the vocabulary (~40 ms; ~2 ms over a trained model's) */
    float lse[n_decode + 1];
    if (!g.drafts && !on_device) {
#pragma omp parallel for schedule(dynamic, 1)
        for (int k = 0; k < n_decode; k++) {
            Slot *sl = &g.slot[who[k]];
            float *lg = g.logits + (size_t)k * V;
            lse[k] = sl->job->logprobs ? log_sum_exp(lg, V) : NAN;
            pick[k] = pick_token(sl, lg, g.scratch + (size_t)k * V);
        }
    } else if (on_device)
        for (int k = 0; k < n_decode; k++) lse[k] = NAN;
    pthread_mutex_lock(&g.mu);
    float *lg = g.logits; /* a decoding slot's rows: 1, or with drafts N + 1 */
    for (int k = 0; k < n_decode; k++) {
        Slot *sl = &g.slot[who[k]];
        if (g.drafts) {
            int out[DRAFT_MAX + 1];
            float logprob[DRAFT_MAX + 1];
            const int n = spec_accept(&sl->spec, &sl->sp, n_draft[k], lg, out, logprob);
            sl->job->drafted += n_draft[k];
            sl->job->accepted += n - 1;
            for (int i = 0; i < n && sl->job; i++) take_token(sl, out[i], logprob[i]); /* the job may end on any of them */
        } else
            take_sampled(sl, on_device ? NULL : lg, g.scratch + (size_t)k * V, lse[k], pick[k]);
        lg += (size_t)seq[k].n * V;
    }
    if (n_seq > n_decode) {
        Slot *sl = &g.slot[best];
        offer_blocks(sl);
        if (sl->n_fed == sl->job->n_prompt) {
            float *keep = g.scratch + (size_t)g.args.parallel * V, lse_p = sl->job->logprobs ? log_sum_exp(prompt_logits, V) : NAN;
            take_sampled(sl, prompt_logits, keep, lse_p, pick_token(sl, prompt_logits, keep));
        }
    }
    pthread_mutex_unlock(&g.mu);
    return 1;
}

static void *engine_main(void *unused) {
    (void)unused;
    pthread_mutex_lock(&g.mu);
    while (!g_stop) {
        for (int i = 0; i < g.args.parallel; i++) /* a cancelled job's slot frees at once */
            if (g.slot[i].job && g.slot[i].job->cancel) job_finish(&g.slot[i], g.slot[i].job, "cancel");
        admit();
        pthread_mutex_unlock(&g.mu);
        int ran = engine_step();
        pthread_mutex_lock(&g.mu);
        if (!ran && !g_stop) timed_wait(&g.wake, &g.mu, 100);
    }
    for (int i = 0; i < g.args.parallel; i++) /* shutdown: what runs ends with what it has */
        if (g.slot[i].job) job_finish(&g.slot[i], g.slot[i].job, "abort");
    while (g.queue_head) {
        Job *j = g.queue_head;
        g.queue_head = j->next;
        j->in_queue = 0;
        job_finish(NULL, j, "abort");
    }
    g.queue_tail = NULL;
    g.queued = 0;
    pthread_mutex_unlock(&g.mu);
    return NULL;
}

/* ======================================================================== */
/* requests: the JSON body                                                  */

/* What a completion request asks for (both endpoints). */
typedef struct {
    int chat;                 /* /v1/chat/completions */
    int *prompt, n_prompt;
    int max_tokens;           /* -1: until the context is full */
    float temperature, top_p;
    uint64_t seed;
    int has_seed, stream, include_usage, ignore_eos;
    int logprobs;             /* non-streamed responses carry each generated token's log-probability */
    char *stop[4]; int n_stop;
    int thinking;             /* chat: the prompt opened <think> (the output starts as reasoning) */
    char *tools;              /* chat: the tools list as JSON text (tool calls are parsed from the answer), or NULL */
} Params;

static void params_free(Params *p) {
    free(p->prompt);
    for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
    free(p->tools);
}

/* A request error: status, the offending field (or NULL) and a message. */
typedef struct { int status; const char *param; char msg[256]; } ReqError;

static int req_error(ReqError *e, int status, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int req_error(ReqError *e, int status, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->status = status;
    e->param = param;
    return -1;
}

/* A number field in [lo, hi], or the default when absent or null. */
static int get_number(const JsonValue *root, const char *key, double lo, double hi, double *out, ReqError *e) {
    const JsonValue *v = json_get(root, key);
    if (!v || v->type == JSON_NULL) return 0;
    if (v->type != JSON_NUMBER) return req_error(e, 400, key, "%s: expected a number", key);
    if (!(v->num >= lo && v->num <= hi)) return req_error(e, 400, key, "%s: %g is outside %g..%g", key, v->num, lo, hi);
    *out = v->num;
    return 0;
}

static int get_bool(const JsonValue *root, const char *key, int *out, ReqError *e) {
    const JsonValue *v = json_get(root, key);
    if (!v || v->type == JSON_NULL) return 0;
    if (v->type != JSON_BOOL) return req_error(e, 400, key, "%s: expected true or false", key);
    *out = v->num != 0;
    return 0;
}

static int get_stop(const JsonValue *root, Params *p, ReqError *e) {
    const JsonValue *v = json_get(root, "stop");
    if (!v || v->type == JSON_NULL) return 0;
    if (v->type == JSON_STRING) {
        if (strlen(v->str) != v->str_len) return req_error(e, 400, "stop", "stop: U+0000 in a stop string");
        if (v->str_len) p->stop[p->n_stop++] = xstrdup(v->str);
        return 0;
    }
    if (v->type != JSON_ARRAY) return req_error(e, 400, "stop", "stop: expected a string or an array of strings");
    if (v->n > 4) return req_error(e, 400, "stop", "stop: at most 4 strings");
    for (const JsonValue *s = v->child; s; s = s->next) {
        if (s->type != JSON_STRING) return req_error(e, 400, "stop", "stop: expected strings");
        if (strlen(s->str) != s->str_len) return req_error(e, 400, "stop", "stop: U+0000 in a stop string");
        if (s->str_len) p->stop[p->n_stop++] = xstrdup(s->str);
    }
    return 0;
}

/* prompt: a string, an array of token ids, or an array holding one of these. */
static int completion_prompt(const JsonValue *root, Params *p, ReqError *e) {
    const JsonValue *v = json_get(root, "prompt");
    if (v && v->type == JSON_ARRAY && v->n == 1 && v->child->type != JSON_NUMBER) v = v->child;
    if (!v) return req_error(e, 400, "prompt", "prompt: required");
    const int V = g.S.model.cfg.vocab_size;
    if (v->type == JSON_STRING) {
        char err[256];
        p->n_prompt = tokenizer_encode(g.tok, v->str, v->str_len, &p->prompt, err, sizeof err);
        if (p->n_prompt < 0) return req_error(e, 500, "prompt", "prompt: %s", err);
    } else if (v->type == JSON_ARRAY) {
        p->prompt = xmalloc((v->n ? v->n : 1) * sizeof(int));
        for (const JsonValue *x = v->child; x; x = x->next) {
            if (x->type != JSON_NUMBER || !x->is_uint || x->u64 >= (uint64_t)V)
                return req_error(e, 400, "prompt", "prompt: token ids must be integers in 0..%d", V - 1);
            p->prompt[p->n_prompt++] = (int)x->u64;
        }
    } else return req_error(e, 400, "prompt", "prompt: expected a string or an array of token ids");
    if (!p->n_prompt) return req_error(e, 400, "prompt", "prompt: empty");
    return 0;
}

/* messages (and the chat switches) through the project's GLM-5.2 chat format. */
static int chat_prompt(const char *body, size_t len, const JsonValue *root, Params *p, ReqError *e) {
    const JsonValue *msgs = json_get(root, "messages");
    if (!msgs || msgs->type != JSON_ARRAY || !msgs->n) return req_error(e, 400, "messages", "messages: expected a non-empty array");
    ChatRequest cr;
    char err[256];
    if (tokenizer_chat_read_json(&cr, body, len, 0, err, sizeof err)) return req_error(e, 400, "messages", "%s", err);
    /* the switches OpenAI-compatible servers take for thinking, beside the template's own enable_thinking */
    const JsonValue *kw = json_get(root, "chat_template_kwargs"), *th = json_get(root, "thinking");
    const JsonValue *et = kw && kw->type == JSON_OBJECT ? json_get(kw, "enable_thinking") : NULL;
    if (et && et->type == JSON_BOOL) cr.opt.thinking = et->num != 0;
    const JsonValue *type = th && th->type == JSON_OBJECT ? json_get(th, "type") : NULL;
    if (type && type->type == JSON_STRING) cr.opt.thinking = strcmp(type->str, "disabled") != 0;
    p->thinking = cr.opt.thinking;
    if (cr.opt.tools && *cr.opt.tools) p->tools = xstrdup(cr.opt.tools);
    p->n_prompt = tokenizer_render_chat(g.tok, cr.msgs, cr.n, &cr.opt, 1, &p->prompt, err, sizeof err);
    tokenizer_chat_request_free(&cr);
    if (p->n_prompt < 0) { p->prompt = NULL; p->n_prompt = 0; return req_error(e, 400, "messages", "%s", err); }
    return 0;
}

static int parse_params(const char *body, size_t len, int chat, Params *p, ReqError *e) {
    memset(p, 0, sizeof *p);
    p->chat = chat;
    p->max_tokens = -1;
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    Json j;
    char err[200];
    if (json_parse(&j, body ? body : "", len, err, sizeof err)) return req_error(e, 400, NULL, "malformed JSON: %s", err);
    int rc = -1;
    const JsonValue *root = j.root, *v;
    double x;
    if (root->type != JSON_OBJECT) { req_error(e, 400, NULL, "the body must be a JSON object"); goto out; }
    if ((v = json_get(root, "model")) && v->type != JSON_STRING && v->type != JSON_NULL) { req_error(e, 400, "model", "model: expected a string"); goto out; }
    x = 1;
    if (get_number(root, "n", 1, 1, &x, e)) { snprintf(e->msg, sizeof e->msg, "n: only 1 is supported"); goto out; }
    x = -1;
    if (get_number(root, "max_tokens", 1, 1 << 30, &x, e)) goto out;
    if (get_number(root, "max_completion_tokens", 1, 1 << 30, &x, e)) goto out;
    p->max_tokens = (int)x;
    if (x != floor(x)) { req_error(e, 400, "max_tokens", "max_tokens: expected an integer"); goto out; }
    x = p->temperature;
    if (get_number(root, "temperature", 0, 2, &x, e)) goto out;
    p->temperature = (float)x;
    x = p->top_p;
    if (get_number(root, "top_p", 0, 1, &x, e)) goto out;
    if (x <= 0) { req_error(e, 400, "top_p", "top_p: must be above 0"); goto out; }
    p->top_p = (float)x;
    if ((v = json_get(root, "seed")) && v->type != JSON_NULL) {
        if (v->type != JSON_NUMBER || v->num != floor(v->num) || fabs(v->num) > 9007199254740992.0) { req_error(e, 400, "seed", "seed: expected an integer"); goto out; }
        p->seed = (uint64_t)(int64_t)v->num;
        p->has_seed = 1;
    }
    if (get_bool(root, "stream", &p->stream, e) || get_bool(root, "ignore_eos", &p->ignore_eos, e)) goto out;
    if ((v = json_get(root, "stream_options")) && v->type == JSON_OBJECT && get_bool(v, "include_usage", &p->include_usage, e)) goto out;
    if (get_stop(root, p, e)) goto out;
    if ((v = json_get(root, "logprobs")) && v->type != JSON_NULL) { /* chat: true/false; completions: a count (the chosen token only) */
        if (v->type != JSON_BOOL && !(v->type == JSON_NUMBER && v->num >= 0 && v->num <= 20)) { req_error(e, 400, "logprobs", "logprobs: expected %s", chat ? "true or false" : "an integer 0..20"); goto out; }
        p->logprobs = v->type == JSON_NUMBER || v->num != 0;
    }
    rc = chat ? chat_prompt(body, len, root, p, e) : completion_prompt(root, p, e);
out:
    json_free(&j);
    return rc;
}

/* ======================================================================== */
/* responses: text, stop strings, reasoning, tool calls                     */

/* The text of a job as it is sent: decoded incrementally, cut at a stop string, and
 * (chat with thinking) split at </think> into reasoning and answer. */
typedef struct {
    TokenizerStream ts;
    char *piece;              /* [tokenizer_stream_out_max] */
    Buf text;                 /* everything decoded so far (cut at a stop string) */
    size_t sent;              /* bytes of text already sent */
    int stopped;              /* a stop string matched */
    int thinking;             /* the output starts as reasoning (chat, thinking on) */
    long think_end;           /* thinking: offset of "</think>" in text, -1 not yet */
    size_t hold;              /* bytes kept back while they may start a stop string or a marker */
} Output;

static const char THINK_END[] = "</think>", TOOL_CALL[] = "<tool_call>";

static void output_init(Output *o, const Params *p) {
    memset(o, 0, sizeof *o);
    tokenizer_stream_init(&o->ts);
    o->piece = xmalloc(tokenizer_stream_out_max(g.tok));
    o->thinking = p->chat && p->thinking;
    o->think_end = -1;
    size_t h = 0;
    for (int i = 0; i < p->n_stop; i++) if (strlen(p->stop[i]) - 1 > h) h = strlen(p->stop[i]) - 1;
    if (p->chat && p->thinking && h < sizeof THINK_END - 2) h = sizeof THINK_END - 2;
    if (p->tools && h < sizeof TOOL_CALL - 2) h = sizeof TOOL_CALL - 2;
    o->hold = h;
}

static void output_free(Output *o) { free(o->piece); buf_free(&o->text); }

/* Appends the text of ids (flushing the decoder when final) and applies the stop strings. */
static void output_add(Output *o, const Params *p, const int *ids, int n, int final) {
    size_t from = o->text.len;
    for (int i = 0; i < n && !o->stopped; i++) {
        size_t k = tokenizer_stream_push(&o->ts, g.tok, ids[i], o->piece, tokenizer_stream_out_max(g.tok));
        buf_put(&o->text, o->piece, k);
    }
    if (final && !o->stopped) buf_put(&o->text, o->piece, tokenizer_stream_flush(&o->ts, o->piece, tokenizer_stream_out_max(g.tok)));
    if (!o->text.len) return;
    for (int s = 0; s < p->n_stop && !o->stopped; s++) {
        size_t L = strlen(p->stop[s]), start = from > L ? from - L : 0;
        char *hit = memmem(o->text.p + start, o->text.len - start, p->stop[s], L);
        if (hit) { o->text.len = (size_t)(hit - o->text.p); o->text.p[o->text.len] = 0; o->stopped = 1; }
    }
    if (o->thinking && o->think_end < 0 && o->text.len) {
        char *m = memmem(o->text.p, o->text.len, THINK_END, sizeof THINK_END - 1);
        if (m) o->think_end = m - o->text.p;
    }
}

/* How far text may be sent now: all of it at the end, else all but the bytes that may
 * still become a stop string or a marker, backed off to a character boundary; in the
 * answer of a request with tools, nothing from "<tool_call>" on (parsed at the end). */
static size_t output_ready(const Output *o, const Params *p, int final) {
    size_t end = o->text.len;
    if (!final) end = end > o->hold ? end - o->hold : 0;
    if (p->tools && (!o->thinking || o->think_end >= 0)) {
        size_t a0 = o->thinking ? (size_t)o->think_end + sizeof THINK_END - 1 : 0;
        if (o->text.len > a0) {
            char *m = memmem(o->text.p + a0, o->text.len - a0, TOOL_CALL, sizeof TOOL_CALL - 1);
            if (m && (size_t)(m - o->text.p) < end) end = (size_t)(m - o->text.p);
        }
    }
    while (end > o->sent && end < o->text.len && (o->text.p[end] & 0xC0) == 0x80) end--;
    return end < o->sent ? o->sent : end;
}

/* The text between a and b split into its reasoning part and its answer part (the
 * "</think>" marker itself is in neither). */
static void split_reasoning(const Output *o, size_t a, size_t b, size_t *r0, size_t *r1, size_t *c0, size_t *c1) {
    size_t te = o->think_end < 0 ? (size_t)-1 : (size_t)o->think_end, ae = te == (size_t)-1 ? te : te + sizeof THINK_END - 1;
    if (!o->thinking) te = ae = 0; /* not thinking: all answer */
    *r0 = a; *r1 = b < te ? b : te;
    if (*r1 < *r0) *r1 = *r0;
    *c0 = a > ae ? a : ae; *c1 = b;
    if (*c0 > *c1) *c0 = *c1;
}

/* ---- JSON bodies ---- */

static void usage_json(Buf *b, const Job *j) {
    buf_printf(b, "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d,"
                  "\"prompt_tokens_details\":{\"cached_tokens\":%d}}",
               j->n_prompt, j->n_gen, j->n_prompt + j->n_gen, j->n_cached);
}

static void tool_calls_json(Buf *b, const ChatToolCalls *tc, long id, int stream) {
    buf_puts(b, "\"tool_calls\":[");
    for (int i = 0; i < tc->n_calls; i++) {
        buf_puts(b, i ? ",{" : "{");
        if (stream) buf_printf(b, "\"index\":%d,", i); /* a streamed call says which entry it fills */
        buf_printf(b, "\"id\":\"call_%ld_%d\",\"type\":\"function\",\"function\":{\"name\":", id, i);
        buf_json_str(b, tc->calls[i].name, strlen(tc->calls[i].name));
        buf_puts(b, ",\"arguments\":");
        buf_json_str(b, tc->calls[i].arguments, strlen(tc->calls[i].arguments));
        buf_puts(b, "}}");
    }
    buf_puts(b, "]");
}

/* The head of every JSON object sent for the job: id, object, created, model. */
static void head_json(Buf *b, const Params *p, const Job *j, int chunk) {
    buf_printf(b, "{\"id\":\"%s-%ld\",\"object\":\"%s\",\"created\":%ld,\"model\":", p->chat ? "chatcmpl" : "cmpl", j->id,
               p->chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion", (long)time(NULL));
    buf_json_str(b, g.model_id, strlen(g.model_id));
}

/* The answer of a finished chat (text after </think>), with tools parsed into calls. */
static int final_answer(const Output *o, const Params *p, ChatToolCalls *tc) {
    size_t r0, r1, c0, c1;
    split_reasoning(o, 0, o->text.len, &r0, &r1, &c0, &c1);
    memset(tc, 0, sizeof *tc);
    if (!p->tools) return 0;
    char err[128];
    const char *text = o->text.p ? o->text.p : ""; /* nothing was generated: no buffer yet */
    if (tokenizer_parse_tool_calls(text + c0, c1 - c0, p->tools, tc, err, sizeof err)) { memset(tc, 0, sizeof *tc); return 0; }
    return tc->n_calls > 0;
}

/* "cancel" is the engine's word for a job its connection stopped (a stop string, or a
 * client that left and never reads it): "stop" to the client. "abort": the server is
 * shutting down (documented; OpenAI has no word for it). */
static const char *finish_reason(const Output *o, const Job *j, int calls) {
    if (calls) return "tool_calls";
    if (o->stopped || !j->finish || !strcmp(j->finish, "cancel")) return "stop";
    return j->finish;
}

/* The generated tokens' log-probabilities: chat's {"content": [...]} or the completions'
 * {"tokens", "token_logprobs", "top_logprobs", "text_offset"} (the alternatives are not kept). */
static void logprobs_json(Buf *b, const Params *p, const Job *j) {
    if (!p->logprobs) { buf_puts(b, "null"); return; }
    const char *bytes;
    if (p->chat) {
        buf_puts(b, "{\"content\":[");
        for (int i = 0; i < j->n_out; i++) {
            int n = tokenizer_token_bytes(g.tok, j->out[i], &bytes);
            buf_puts(b, i ? ",{\"token\":" : "{\"token\":");
            buf_json_str(b, bytes, (size_t)n);
            buf_printf(b, ",\"logprob\":%.9g,\"bytes\":[", j->logprob[i]);
            for (int k = 0; k < n; k++) buf_printf(b, k ? ",%u" : "%u", (unsigned char)bytes[k]);
            buf_puts(b, "],\"top_logprobs\":[]}");
        }
        buf_puts(b, "]}");
        return;
    }
    buf_puts(b, "{\"tokens\":[");
    for (int i = 0; i < j->n_out; i++) {
        int n = tokenizer_token_bytes(g.tok, j->out[i], &bytes);
        if (i) buf_puts(b, ",");
        buf_json_str(b, bytes, (size_t)n);
    }
    buf_puts(b, "],\"token_logprobs\":[");
    for (int i = 0; i < j->n_out; i++) buf_printf(b, i ? ",%.9g" : "%.9g", j->logprob[i]);
    buf_puts(b, "],\"top_logprobs\":null,\"text_offset\":[");
    for (int i = 0, off = 0; i < j->n_out; i++) {
        buf_printf(b, i ? ",%d" : "%d", off);
        off += tokenizer_token_bytes(g.tok, j->out[i], &bytes);
    }
    buf_puts(b, "]}");
}

/* A whole (non-streamed) response. */
static void full_body(Buf *b, const Output *o, const Params *p, const Job *j) {
    head_json(b, p, j, 0);
    size_t r0, r1, c0, c1;
    split_reasoning(o, 0, o->text.len, &r0, &r1, &c0, &c1);
    if (!p->chat) {
        buf_puts(b, ",\"choices\":[{\"index\":0,\"text\":");
        buf_json_str(b, o->text.p ? o->text.p : "", o->text.len);
        buf_puts(b, ",\"logprobs\":");
        logprobs_json(b, p, j);
        buf_printf(b, ",\"finish_reason\":\"%s\"}],", finish_reason(o, j, 0));
    } else {
        ChatToolCalls tc;
        int calls = final_answer(o, p, &tc);
        buf_puts(b, ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
        if (calls && !tc.content_len) buf_puts(b, "null");
        else if (calls) buf_json_str(b, tc.content, tc.content_len);
        else buf_json_str(b, o->text.p ? o->text.p + c0 : "", c1 - c0);
        if (p->thinking) { buf_puts(b, ",\"reasoning_content\":"); buf_json_str(b, o->text.p ? o->text.p + r0 : "", r1 - r0); }
        if (calls) { buf_puts(b, ","); tool_calls_json(b, &tc, j->id, 0); }
        buf_puts(b, "},\"logprobs\":");
        logprobs_json(b, p, j);
        buf_printf(b, ",\"finish_reason\":\"%s\"}],", finish_reason(o, j, calls));
        tokenizer_tool_calls_free(&tc);
    }
    usage_json(b, j);
    buf_puts(b, "}");
}

/* One streamed chunk with text[a..b) (chat: as reasoning_content and/or content). */
static void delta_chunk(Buf *b, const Output *o, const Params *p, const Job *j, size_t a, size_t bb, int first) {
    head_json(b, p, j, 1);
    if (!p->chat) {
        buf_puts(b, ",\"choices\":[{\"index\":0,\"text\":");
        buf_json_str(b, o->text.p + a, bb - a);
        buf_puts(b, ",\"logprobs\":null,\"finish_reason\":null}]}");
        return;
    }
    size_t r0, r1, c0, c1;
    split_reasoning(o, a, bb, &r0, &r1, &c0, &c1);
    buf_puts(b, ",\"choices\":[{\"index\":0,\"delta\":{");
    const char *sep = "";
    if (first) { buf_puts(b, "\"role\":\"assistant\""); sep = ","; }
    if (r1 > r0) { buf_printf(b, "%s\"reasoning_content\":", sep); buf_json_str(b, o->text.p + r0, r1 - r0); sep = ","; }
    if (c1 > c0 || first) { buf_printf(b, "%s\"content\":", sep); buf_json_str(b, o->text.p ? o->text.p + c0 : "", c1 - c0); }
    buf_puts(b, "},\"logprobs\":null,\"finish_reason\":null}]}");
}

/* ======================================================================== */
/* one completion request, start to end                                     */

static Job *job_new(Params *p, int ctx) {
    Job *j = xcalloc(1, sizeof *j);
    j->prompt = p->prompt;
    j->n_prompt = p->n_prompt;
    p->prompt = NULL;
    int room = ctx - j->n_prompt;
    j->max_tokens = p->max_tokens < 0 || p->max_tokens > room ? room : p->max_tokens;
    j->temperature = p->temperature;
    j->top_p = p->top_p;
    j->ignore_eos = p->ignore_eos;
    j->logprobs = p->logprobs;
    j->t_arrive = now_s();
    pthread_cond_init(&j->cond, NULL);
    return j;
}

/* Under g.mu: into the queue, or 0 when it is full. */
static int job_queue(Job *j) {
    if (g.queued >= g.args.queue || g_stop) return 0;
    j->id = ++g.next_id;
    if (g.queue_tail) g.queue_tail->next = j; else g.queue_head = j;
    g.queue_tail = j;
    g.queued++;
    j->in_queue = 1;
    pthread_cond_signal(&g.wake);
    return 1;
}

/* Under g.mu: the job is not wanted any more. Still queued, it leaves the queue at once
 * (its place is free for the next request); running, its slot frees at the next step. */
static void job_cancel(Job *j) {
    if (j->done) return;
    if (j->in_queue) {
        Job **p = &g.queue_head, *prev = NULL;
        while (*p != j) { prev = *p; p = &(*p)->next; }
        *p = j->next;
        if (g.queue_tail == j) g.queue_tail = prev;
        g.queued--;
        j->in_queue = 0;
        job_finish(NULL, j, "cancel");
        return;
    }
    j->cancel = 1;
    pthread_cond_signal(&g.wake);
}

/* Asks the engine to stop the job (if it is not done) and waits until it has let go. */
static void job_stop(Job *j) {
    pthread_mutex_lock(&g.mu);
    job_cancel(j);
    while (!j->done) timed_wait(&j->cond, &g.mu, 100);
    pthread_mutex_unlock(&g.mu);
}

static void job_release(Job *j) {
    job_stop(j);
    pthread_cond_destroy(&j->cond);
    free(j->prompt);
    free(j->out);
    free(j->logprob);
    free(j);
}

static void log_request(const Params *p, const Job *j, int status, const Output *o) {
    const double end = now_s(), ttft = j->t_first ? j->t_first - j->t_arrive : 0;
    const double gen = j->t_first && j->n_gen > 1 ? (j->n_gen - 1) / (end - j->t_first) : 0;
    char drafts[64] = "";
    if (j->drafted) snprintf(drafts, sizeof drafts, " drafts %ld/%ld accepted", j->accepted, j->drafted);
    fprintf(stderr, "serve: %s-%ld %d in %d cached %d out %d ttft %.3f s %.1f tok/s %.3f s %s%s%s\n", p->chat ? "chatcmpl" : "cmpl", j->id,
            status, j->n_prompt, j->n_cached, j->n_gen, ttft, gen, end - j->t_arrive, o ? finish_reason(o, j, 0) : "-",
            p->stream ? " stream" : "", drafts);
}

/* Waits for the job's next tokens (copied into *ids), or its end. Returns how many; sets
 * *done. A client that closes its connection meanwhile cancels the job (watch_peer). */
static int job_wait(Job *j, int fd, int watch_peer, int **ids, int *cap, int *have, int *done) {
    pthread_mutex_lock(&g.mu);
    while (!j->done && j->n_out == *have) {
        timed_wait(&j->cond, &g.mu, 100);
        if (watch_peer && !j->done && http_peer_closed(fd)) job_cancel(j);
    }
    int n = j->n_out - *have;
    if (n > *cap) {
        int want = n > 2 * *cap ? n : 2 * *cap, *grown = realloc(*ids, (size_t)want * sizeof(int));
        if (!grown) { job_cancel(j); n = 0; } /* out of memory: the job ends with what was sent */
        else { *ids = grown; *cap = want; }
    }
    if (n) memcpy(*ids, j->out + *have, (size_t)n * sizeof(int));
    *have += n;
    *done = j->done;
    pthread_mutex_unlock(&g.mu);
    return n;
}

static void send_event(int fd, Buf *b, int *ok) {
    if (*ok && (b->oom || http_sse_event(fd, b->p, b->len))) *ok = 0;
    b->len = 0;
}

/* Streams the job as Server-Sent Events. Returns 0, or -1 when the client went away. */
static int stream_job(int fd, Job *j, const Params *p, Output *o) {
    if (http_sse_start(fd)) { job_stop(j); return -1; }
    int *ids = NULL, cap = 0, have = 0, done = 0, ok = 1, first = 1;
    Buf b = {0};
    while (ok && !done) {
        int n = job_wait(j, fd, 1, &ids, &cap, &have, &done);
        output_add(o, p, ids, n, done);
        if (o->stopped && !done) { job_stop(j); done = 1; }
        size_t end = output_ready(o, p, done);
        if (end > o->sent || (first && p->chat)) { delta_chunk(&b, o, p, j, o->sent, end, first); send_event(fd, &b, &ok); o->sent = end; first = 0; }
        if (!ok) job_stop(j); /* the client left: its slot frees at the next step */
    }
    free(ids);
    if (!ok) { buf_free(&b); return -1; }
    /* the end: tool calls (held back), the finish reason, usage */
    ChatToolCalls tc = {0};
    int calls = p->chat && final_answer(o, p, &tc);
    if (!calls && o->sent < o->text.len) { /* text held back for a tool call that did not parse: it is content */
        delta_chunk(&b, o, p, j, o->sent, o->text.len, 0);
        send_event(fd, &b, &ok);
        o->sent = o->text.len;
    }
    if (p->chat) {
        size_t r0, r1, c0, c1;
        split_reasoning(o, 0, o->text.len, &r0, &r1, &c0, &c1);
        size_t sent_answer = o->sent > c0 ? o->sent - c0 : 0;
        head_json(&b, p, j, 1);
        buf_puts(&b, ",\"choices\":[{\"index\":0,\"delta\":{");
        if (calls) {
            size_t rest = tc.content_len > sent_answer ? tc.content_len - sent_answer : 0;
            if (rest) { buf_puts(&b, "\"content\":"); buf_json_str(&b, tc.content + sent_answer, rest); buf_puts(&b, ","); }
            tool_calls_json(&b, &tc, j->id, 1);
        }
        buf_printf(&b, "},\"logprobs\":null,\"finish_reason\":\"%s\"}]", finish_reason(o, j, calls));
    } else {
        head_json(&b, p, j, 1);
        buf_printf(&b, ",\"choices\":[{\"index\":0,\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"%s\"}]", finish_reason(o, j, 0));
    }
    if (!p->include_usage) { buf_puts(&b, ","); usage_json(&b, j); }
    buf_puts(&b, "}");
    send_event(fd, &b, &ok);
    tokenizer_tool_calls_free(&tc);
    if (p->include_usage) {
        head_json(&b, p, j, 1);
        buf_puts(&b, ",\"choices\":[],");
        usage_json(&b, j);
        buf_puts(&b, "}");
        send_event(fd, &b, &ok);
    }
    if (ok && http_sse_event(fd, "[DONE]", 6)) ok = 0;
    buf_free(&b);
    return ok ? 0 : -1;
}

/* POST /v1/completions and /v1/chat/completions. Returns whether the connection may
 * carry another request. */
static int handle_completion(int fd, const HttpRequest *rq, int chat) {
    Params p;
    ReqError e = {0};
    if (parse_params(rq->body, rq->body_len, chat, &p, &e)) {
        params_free(&p);
        http_respond_error(fd, e.status, e.status == 500 ? "server_error" : "invalid_request_error", e.param, e.msg, rq->keep_alive);
        fprintf(stderr, "serve: %s %d %s\n", rq->path, e.status, e.msg);
        return rq->keep_alive;
    }
    const int ctx = g.args.ctx;
    if (p.n_prompt >= ctx) {
        snprintf(e.msg, sizeof e.msg, "the prompt is %d tokens; the context is %d (one token must be left to generate)", p.n_prompt, ctx);
        params_free(&p);
        http_respond_error(fd, 400, "invalid_request_error", chat ? "messages" : "prompt", e.msg, rq->keep_alive);
        fprintf(stderr, "serve: %s 400 %s\n", rq->path, e.msg);
        return rq->keep_alive;
    }
    Job *j = job_new(&p, ctx);
    j->seed = p.has_seed ? p.seed : (uint64_t)(now_s() * 1e6) ^ (uint64_t)(uintptr_t)j;
    pthread_mutex_lock(&g.mu);
    int queued = job_queue(j);
    pthread_mutex_unlock(&g.mu);
    if (!queued) {
        j->done = 1;
        job_release(j);
        params_free(&p);
        http_respond_error(fd, 503, "server_error", NULL, g_stop ? "the server is shutting down" : "the queue is full; try again later", 0);
        fprintf(stderr, "serve: %s 503 queue full\n", rq->path);
        return 0;
    }
    Output o;
    output_init(&o, &p);
    int keep = 0, status = 200;
    if (p.stream) {
        stream_job(fd, j, &p, &o);
    } else {
        int *ids = NULL, cap = 0, have = 0, done = 0;
        while (!done) {
            int n = job_wait(j, fd, 1, &ids, &cap, &have, &done);
            output_add(&o, &p, ids, n, done);
            if (o.stopped && !done) { job_stop(j); done = 1; }
        }
        free(ids);
        Buf b = {0};
        full_body(&b, &o, &p, j);
        if (!strcmp(j->finish, "abort") && !j->n_gen) http_respond_error(fd, status = 503, "server_error", NULL, "the server is shutting down", 0);
        else if (b.oom) http_respond_error(fd, status = 500, "server_error", NULL, "out of memory", 0);
        else if (!http_respond(fd, 200, "application/json", b.p, b.len, rq->keep_alive && !g_stop, NULL)) keep = rq->keep_alive;
        buf_free(&b);
    }
    log_request(&p, j, status, &o);
    output_free(&o);
    job_release(j);
    params_free(&p);
    return keep;
}

/* ======================================================================== */
/* connections                                                              */

static int handle(int fd, const HttpRequest *rq) {
    const int post = !strcmp(rq->method, "POST"), get = !strcmp(rq->method, "GET");
    const char *path = rq->path;
    if (g.args.api_key && strcmp(path, "/health") && !http_bearer_ok(rq->authorization, g.args.api_key)) {
        http_respond_error(fd, 401, "invalid_request_error", NULL, "invalid or missing API key (Authorization: Bearer KEY)", rq->keep_alive);
        fprintf(stderr, "serve: %s 401\n", path);
        return rq->keep_alive;
    }
    if (!strcmp(path, "/health") && get) {
        static const char ok[] = "{\"status\":\"ok\"}";
        return !http_respond(fd, 200, "application/json", ok, sizeof ok - 1, rq->keep_alive, NULL) && rq->keep_alive;
    }
    if (!strcmp(path, "/v1/models") && get) {
        Buf b = {0};
        buf_puts(&b, "{\"object\":\"list\",\"data\":[{\"id\":");
        buf_json_str(&b, g.model_id, strlen(g.model_id));
        buf_printf(&b, ",\"object\":\"model\",\"created\":%ld,\"owned_by\":\"glm.c\",\"max_model_len\":%d}]}", (long)time(NULL), g.args.ctx);
        int ok = !http_respond(fd, 200, "application/json", b.p, b.len, rq->keep_alive, NULL);
        buf_free(&b);
        return ok && rq->keep_alive;
    }
    if (!strcmp(path, "/v1/completions") && post) return handle_completion(fd, rq, 0);
    if (!strcmp(path, "/v1/chat/completions") && post) return handle_completion(fd, rq, 1);
    int known = !strcmp(path, "/health") || !strcmp(path, "/v1/models") || !strcmp(path, "/v1/completions") ||
                !strcmp(path, "/v1/chat/completions");
    char msg[600];
    snprintf(msg, sizeof msg, known ? "%s %s: method not allowed" : "%s %s: no such endpoint", rq->method, path);
    http_respond_error(fd, known ? 405 : 404, "invalid_request_error", NULL, msg, rq->keep_alive);
    fprintf(stderr, "serve: %s %s %d\n", rq->method, path, known ? 405 : 404);
    return rq->keep_alive;
}

/* After an error answered before its request was read whole (413, 431, ...): closing with
 * unread bytes makes the kernel reset the connection, and a client still sending its body
 * would see the reset instead of the answer. So: stop writing, read and drop what comes
 * for up to 2 s (64 MB at most), then close (RFC 9112 §9.6). */
static void drain(int fd) {
    shutdown(fd, SHUT_WR);
    char buf[16384];
    size_t got = 0;
    const double end = now_s() + 2.0;
    while (got < (64u << 20) && now_s() < end && !g_stop) {
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, 100) <= 0) continue;
        ssize_t k = recv(fd, buf, sizeof buf, 0);
        if (k <= 0) break;
        got += (size_t)k;
    }
}

static void *conn_main(void *arg) {
    const int fd = (int)(intptr_t)arg;
    /* a client that stops reading must not hold its thread (and its job) forever */
    const struct timeval send_limit = {60, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_limit, sizeof send_limit);
    HttpConn c;
    http_conn_init(&c, fd);
    for (;;) {
        HttpRequest rq;
        char err[200];
        int r = http_read(&c, g.args.max_body, 30000, &g_stop_int, &rq, err, sizeof err);
        if (r == 0) break;
        if (r < 0) {
            http_respond_error(fd, -r, -r >= 500 ? "server_error" : "invalid_request_error", NULL, err, 0);
            fprintf(stderr, "serve: %d %s\n", -r, err);
            drain(fd);
            break;
        }
        if (!handle(fd, &rq) || g_stop) break;
    }
    http_conn_free(&c);
    close(fd);
    pthread_mutex_lock(&g.mu);
    if (--g.n_conns == 0) pthread_cond_broadcast(&g.conns_done);
    pthread_mutex_unlock(&g.mu);
    return NULL;
}

/* ======================================================================== */
/* start and stop                                                           */

/* Bytes of memory available now (MemAvailable), or 0 when unknown. */
static double mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    double kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

static void serve_start(ServeArgs *a) {
    const double t0 = now_s();
    fast_init(getenv("GLM_KERNELS"), a->bf16);
#ifdef _OPENMP
    if (a->threads) omp_set_num_threads(a->threads);
#endif
    model_load(&g.S.model, a->model_dir);
    const Config *c = &g.S.model.cfg;
    if (!a->ctx) a->ctx = c->max_pos < 4096 ? c->max_pos : 4096;
    char *tp = a->tokenizer ? xstrdup(a->tokenizer) : path_join(a->model_dir, "tokenizer.json"), err[512];
    if (!a->tokenizer && access(tp, R_OK) != 0)
        glm_fatal("%s: no tokenizer.json in the checkpoint folder: pass --tokenizer FILE (the model's tokenizer.json)", tp);
    g.tok = tokenizer_load(tp, err, sizeof err);
    if (!g.tok) glm_fatal("%s", err);
    free(tp);
    if (tokenizer_vocab_size(g.tok) > c->vocab_size)
        glm_fatal("--tokenizer: %d ids but the model's vocab_size is %d", tokenizer_vocab_size(g.tok), c->vocab_size);
    if (a->n_gpus) {
#ifdef GLM_GPU
        /* every slot's cache rows on the devices (one by default: --parallel sets more);
         * with drafts one sequence at a time, as the MTP layer's cache has one slot */
        if (a->draft > 0 && a->parallel > 1) fprintf(stderr, "serve: --parallel %d: --draft on the GPU path runs one sequence at a time; using 1\n", a->parallel);
        if (!a->parallel || a->draft > 0) a->parallel = 1;
        a->cache_mb = 0;
        g.S.gpu = gpu_load_slots(&g.S.model, a->n_gpus, a->ctx, a->parallel);
#else
        glm_fatal("--gpu: this glm was built without GPU support (build it with make hip, make cuda or make emu)");
#endif
    }
    const char *script = getenv("GLM_SERVE_SCRIPT"); /* a test hook, as spec.c's GLM_DRAFT_ORACLE: output the model cannot be made to write */
    if (script && *script) {
        g.script = xmalloc((strlen(script) / 2 + 1) * sizeof(int));
        for (const char *q = script; *q;) {
            char *end;
            long id = strtol(q, &end, 10);
            if (end == q || id < 0 || id >= c->vocab_size || (*end && *end != ',')) glm_fatal("GLM_SERVE_SCRIPT: expected token ids 1,2,3");
            g.script[g.n_script++] = (int)id;
            q = *end ? end + 1 : end;
        }
        if (!c->n_eos) glm_fatal("GLM_SERVE_SCRIPT: the model has no end-of-sequence id");
    }
    const double slot_bytes = g.S.gpu ? 0 : (double)kvcache_bytes(&g.S.model, a->ctx), avail = mem_available();
    if (!a->parallel) { /* as many as 40% of the free memory holds, 1..8 */
        double n = avail > 0 ? 0.4 * avail / slot_bytes : 1;
        a->parallel = n < 1 ? 1 : n > 8 ? 8 : (int)n;
    }
    if (a->cache_mb < 0) { /* 20% of the free memory, at most twice the slots' caches */
        double b = avail > 0 ? 0.2 * avail : 0;
        if (b > 2 * a->parallel * slot_bytes) b = 2 * a->parallel * slot_bytes;
        a->cache_mb = b / 1048576.0;
    }
    g.args = *a;
    const char *slash = strrchr(a->model_dir, '/');
    g.model_id = a->alias ? a->alias : slash && slash[1] ? slash + 1 : a->model_dir;
    /* a prompt chunk, or a group of decodes (run_decodes) */
    runstate_init(&g.S.state, c, a->chunk > MATVEC_MAX_TOKENS ? a->chunk : MATVEC_MAX_TOKENS, a->ctx);
    g.slot = xcalloc((size_t)a->parallel, sizeof(Slot));
    for (int i = 0; i < a->parallel; i++) {
        Slot *sl = &g.slot[i];
        if (g.S.gpu) sl->kv.ctx = a->ctx; /* positions only: the cache is on the devices */
        else kvcache_init(&sl->kv, &g.S.model, a->ctx);
        sampler_init(&sl->sp, 0, 1, 0, c->vocab_size);
        /* the first slot says why drafts cannot run, if asked for; GLM_SERVE_SCRIPT's tokens are not the model's */
        spec_open(&sl->spec, &g.S, &sl->kv, g.script ? 0 : i ? g.drafts : a->draft);
        if (!i) g.drafts = sl->spec.n_draft;
        if (g.drafts) sl->ends_h = xmalloc(((size_t)a->chunk / CACHE_BLOCK + 2) * c->hidden * sizeof(float));
    }
    g.logits = xmalloc(((size_t)a->parallel * (g.drafts + 1) + 1) * c->vocab_size * sizeof(float));
    for (int i = 0; g.S.gpu && i < a->parallel; i++) {
        g.slot[i].gpu_tokens = xmalloc((size_t)a->ctx * sizeof(int));
        if (g.drafts) g.slot[i].gpu_ends_h = xmalloc(((size_t)a->ctx / a->chunk + 1) * c->hidden * sizeof(float));
    }
    g.scratch = xmalloc(((size_t)a->parallel + 1) * c->vocab_size * sizeof(float));
    cache_init(&g.cache, &g.S.model, (size_t)(a->cache_mb * 1048576.0), g.drafts > 0);
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.wake, NULL);
    pthread_cond_init(&g.conns_done, NULL);
    fprintf(stderr, "glm: %s: %d layers, %.2f GB of weights, loaded in %.2f s; %s kernels, %s products\n", a->model_dir, c->n_layers,
            g.S.model.weight_bytes / 1e9, now_s() - t0, ops.name, ops.precision);
    if (g.S.gpu)
        fprintf(stderr, "serve: %d sequence(s) x %d tokens of context on the GPU path (KV cache on the devices; their decodes as one step, "
                        "their prompts one at a time); a prompt reuses the whole %d-token chunks it shares with its slot's last one\n",
                a->parallel, a->ctx, a->chunk);
    else
        fprintf(stderr, "serve: %d sequences x %d tokens of context = %.1f MiB of KV cache; prefix cache %.1f MiB (%d blocks of %d tokens); "
                        "prompt chunks of %d tokens\n",
                a->parallel, a->ctx, a->parallel * slot_bytes / 1048576.0, g.cache.cap * (double)g.cache.block_bytes / 1048576.0, g.cache.cap,
                CACHE_BLOCK, a->chunk);
    if (g.drafts) fprintf(stderr, "serve: --draft %d: the MTP layer drafts %d tokens per step for each sequence\n", g.drafts, g.drafts);
}

static void serve_stop(void) {
#ifdef GLM_GPU
    if (g.S.gpu) gpu_free(g.S.gpu);
#endif
    for (int i = 0; i < g.args.parallel; i++) {
        kvcache_free(&g.slot[i].kv);
        sampler_free(&g.slot[i].sp);
        spec_close(&g.slot[i].spec);
        free(g.slot[i].ends_h);
        free(g.slot[i].gpu_tokens);
        free(g.slot[i].gpu_ends_h);
    }
    free(g.slot);
    free(g.logits);
    free(g.scratch);
    free(g.script);
    cache_free(&g.cache);
    runstate_free(&g.S.state);
    tokenizer_free(g.tok);
    model_free(&g.S.model);
}

int serve_main(int argc, char **argv) {
    ServeArgs a;
    serve_args(&a, argc, argv);
    char err[256];
    int lfd = http_listen(a.host, a.port, err, sizeof err); /* before loading: a busy port fails at once */
    if (lfd < 0) glm_fatal("--port: %s", err);
    serve_start(&a);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: poll returns EINTR and the loops look at g_stop */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    pthread_t engine;
    if (pthread_create(&engine, NULL, engine_main, NULL)) glm_fatal("serve: cannot start the engine thread");
    fprintf(stderr, "serve: listening on http://%s:%d (model \"%s\")\n", a.host, a.port, g.model_id);
    pthread_attr_t detached;
    pthread_attr_init(&detached);
    pthread_attr_setdetachstate(&detached, PTHREAD_CREATE_DETACHED);
    while (!g_stop) {
        struct pollfd pf = {lfd, POLLIN, 0};
        if (poll(&pf, 1, 100) <= 0) continue;
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) continue;
        pthread_mutex_lock(&g.mu);
        int n = ++g.n_conns;
        pthread_mutex_unlock(&g.mu);
        pthread_t t;
        if (n > 1024 || pthread_create(&t, &detached, conn_main, (void *)(intptr_t)fd)) {
            http_respond_error(fd, 503, "server_error", NULL, "too many connections", 0);
            close(fd);
            pthread_mutex_lock(&g.mu);
            g.n_conns--;
            pthread_mutex_unlock(&g.mu);
        }
    }
    fprintf(stderr, "serve: shutting down\n");
    close(lfd);
    pthread_join(engine, NULL); /* every job is done now; connections finish their responses */
    pthread_mutex_lock(&g.mu);
    for (int waited = 0; g.n_conns > 0 && waited < 100; waited++) timed_wait(&g.conns_done, &g.mu, 100);
    const int left = g.n_conns;
    pthread_mutex_unlock(&g.mu);
    if (left) { fprintf(stderr, "serve: %d connections still open after 10 s; exiting\n", left); return 0; }
    serve_stop();
    if (g.decode_steps) fprintf(stderr, "serve: %ld decode steps, %.2f sequences per step\n", g.decode_steps, (double)g.decode_seqs / g.decode_steps);
    fprintf(stderr, "serve: stopped\n");
    return 0;
}
