/* cli.c - the glm command line: flags, and the commands people run.
 *
 *   glm run      -m DIR (-p TEXT | --ids 1,2,3)   a prompt, then generated text
 *   glm chat     -m DIR                           a multi-turn chat on stdin
 *   glm logits   -m DIR --ids 1,2,3 -o FILE       float32 logits for scripts and tests
 *   glm compare  -m A -m B (-p TEXT | --ids ...)  two checkpoints on the same tokens
 *   glm bench    -m DIR                           speed against this machine (tools/bench.c)
 *   glm serve    -m DIR                           an OpenAI-compatible server (serve.c)
 *   glm loadgen  URL                              load on any OpenAI-compatible server (tools/loadgen.c)
 *   glm plan     -m DIR | --glm52                 a GPU decode projection (tools/plan.c)
 *   glm tokenize, glm synth, glm convert          tokenizer.c, tools/synth.c, tools/convert.c
 *
 * This file knows flags, text and files; the model is glm.c's (Session, forward,
 * sample), the fast CPU path is chosen here once (fast_init) before anything runs.
 */
#define _GNU_SOURCE
#include "glm.h"
#include "tokenizer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define GLM_VERSION "0.3.0"

/* ======================================================================== */
/* flags                                                                    */

enum { RUN = 1, CHAT = 2, LOGITS = 4, COMPARE = 8, BENCH = 16, ALL = 31 };

typedef struct {
    const char *cmd;
    const char *model_dirs[2]; int n_models; /* -m; compare takes two */
    const char *ids;         /* --ids 1,2,3 */
    const char *prompt;      /* -p TEXT */
    const char *out;         /* -o FILE */
    const char *tokenizer;   /* --tokenizer FILE, default DIR/tokenizer.json */
    const char *system;      /* chat: --system TEXT */
    const char *effort;      /* chat: --effort max|high|none */
    int no_think;            /* chat: --no-think */
    int n_gen;               /* -n: tokens to generate (bench: tokens timed per decode) */
    int ctx;                 /* --ctx, 0 = default */
    int decode;              /* logits --decode: one token at a time */
    int chunk;               /* logits --chunk N: a prompt's rows as glm serve runs them, N at a time; 0 = one prefill */
    int mtp;                 /* logits --mtp: the MTP layer's logits */
    int draft;               /* run, chat --draft N: MTP drafts per step; -1 = the backend's default */
    int threads;             /* -t, 0 = one per core */
    float temperature, top_p;
    uint64_t seed;
    int n_gpus;              /* --gpu = 1, --gpus N; 0 = the CPU */
    int bf16;                /* --bf16 / --fp32 (GLM_PRECISION sets the default) */
    int no_mmap;
    BenchArgs bench;         /* -P, --long, --json */
} Args;

/* Every flag once, with the commands that take it: parse_args accepts only these, and
 * each command's --help is printed from this table. */
typedef struct {
    const char *name, *value; /* value NULL: a switch */
    int cmds;
    const char *help;
} Flag;

static const Flag FLAGS[] = {
    {"-m", "DIR", ALL, "the checkpoint folder (a Hugging Face folder: config.json + safetensors)"},
    {"-p", "TEXT", RUN | COMPARE, "the prompt as raw text; write the chat markup yourself, e.g.\n"
                                  "\"[gMASK]<sop><|user|>Hi<|assistant|><think>\" (glm chat adds it)"},
    {"--ids", "1,2,3", RUN | LOGITS | COMPARE, "the prompt as token ids"},
    {"-o", "FILE", LOGITS, "write float32 logits [n][vocab] here (required)"},
    {"--decode", NULL, LOGITS, "one token at a time through the KV cache (default: one prefill)"},
    {"--chunk", "N", LOGITS, "the prompt's rows as glm serve computes them, in chunks of N: each row\n"
                             "the same whatever chunk it is in (default: one prefill)"},
    {"--mtp", NULL, LOGITS, "the MTP layer's logits instead, [n-1][vocab]: row i predicts id i+2\n"
                            "from the main model's hidden state at i and id i+1"},
    {"-n", "N", RUN | CHAT, "tokens to generate (default 32; chat: per reply)"},
    {"--draft", "N", RUN | CHAT, "speculative decoding: N tokens (0-16) drafted per step by the MTP layer and\n"
                                 "checked in one pass of the main model, same output distribution (default on\n"
                                 "the CPU: 1 with 16 or more layers, where glm bench measures it paying, else 0;\n"
                                 "with --gpu 0; needs the MTP layer)"},
    {"-n", "N", BENCH, "decoded tokens timed at each context (default 32)"},
    {"-P", "N", BENCH, "tokens of the timed prefill (default 512)"},
    {"--long", "N", BENCH, "the context of the second decode (default 4096)"},
    {"--json", NULL, BENCH, "one JSON object instead of the table"},
    {"--system", "TEXT", CHAT, "a system message before the first turn"},
    {"--no-think", NULL, CHAT, "thinking off (the template's empty <think></think>)"},
    {"--effort", "max|high|none", CHAT, "the reasoning-effort line (default: max, the template's default)"},
    {"--temp", "T", RUN | CHAT, "temperature; 0 is greedy (default 1.0, GLM-5.2's generation_config)"},
    {"--top-p", "P", RUN | CHAT, "nucleus sampling (default 0.95)"},
    {"--seed", "S", RUN | CHAT, "random seed (default: the time)"},
    {"--tokenizer", "FILE", RUN | CHAT | COMPARE, "tokenizer.json (default DIR/tokenizer.json)"},
    {"--ctx", "N", ALL, "context length in tokens (default min(4096, max_position_embeddings);\n"
                        "bench: what its runs need)"},
    {"-t", "N", ALL, "threads (default: one per core)"},
    {"--fp32", NULL, ALL, "weight products in fp32 (the default unless the CPU's AVX512-BF16 dot\n"
                          "products outpace its fp32 FMA, as on AMD Zen 4/5; GLM_PRECISION=fp32|bf16\n"
                          "sets the default)"},
    {"--bf16", NULL, ALL, "weight products with activations rounded to bf16 (~1e-3 relative error;\n"
                          "the default where the CPU's vdpbf16ps outpaces its fp32 FMA)"},
    {"--no-mmap", NULL, ALL, "read the weights into memory on 2 MB pages instead of mapping the files\n"
                             "(RAM for a copy; the pages stay 2 MB whatever the page cache holds)"},
#ifdef GLM_GPU
    {"--gpu", NULL, RUN | CHAT | LOGITS | COMPARE | BENCH, "the forward pass on the GPU (glm_hip.hip)"},
    {"--gpus", "N", RUN | CHAT | LOGITS | COMPARE | BENCH, "layers split across N GPUs (implies --gpu)"},
#endif
    {"-h", NULL, ALL, "this text (also --help)"},
};
#define N_FLAGS (int)(sizeof FLAGS / sizeof FLAGS[0])

static const struct { const char *name; int bit; const char *synopsis, *what; } COMMANDS[] = {
    {"run", RUN, "-m DIR (-p TEXT | --ids 1,2,3) [options]", "Reads the prompt, then samples -n tokens one at a time through the KV cache."},
    {"chat", CHAT, "-m DIR [options]", "A multi-turn chat: one user message per line on stdin, in GLM-5.2's chat format."},
    {"logits", LOGITS, "-m DIR --ids 1,2,3 -o FILE [options]", "Writes the logits of every position as float32 [n][vocab]."},
    {"compare", COMPARE, "-m A -m B (-p TEXT | --ids 1,2,3) [options]",
     "Runs two checkpoints (e.g. BF16 and its MXFP4 conversion) on the same tokens: mean KL(A||B),\n"
     "top-1 agreement, and the perplexity of each."},
    {"bench", BENCH, "-m DIR [options]",
     "Prefill FLOP/s against this machine's fp32 FMA peak, decode GB/s against its read bandwidth\n"
     "(measured in the same run), at context 0 and after a long context; what --draft's verify\n"
     "passes and glm serve's 8-sequence decode step cost in decode steps, and where a decode step\n"
     "and that batch step spend their time (lm_head, other products, experts, attention)."},
};

static void usage(FILE *f) {
    fprintf(f, "usage: glm COMMAND [options]   (glm COMMAND --help lists a command's options)\n"
               "commands:\n"
               "  run       a prompt, then generated text\n"
               "  chat      a multi-turn chat on stdin\n"
               "  logits    float32 logits of every position\n"
               "  tokenize  text to token ids and back\n"
               "  compare   two checkpoints on the same tokens (KL, top-1, perplexity)\n"
               "  bench     speed against this machine's bandwidth and FMA peak\n"
               "  serve     an OpenAI-compatible HTTP server (continuous batching, prefix cache)\n"
               "  loadgen   load on an OpenAI-compatible server; throughput and latency percentiles\n"
               "  plan      a GPU decode projection: bytes and launches per token, tok/s on a named GPU\n"
               "  synth     write a random checkpoint (the demo and benchmark models)\n"
               "  convert   a BF16 or FP8 checkpoint to Quark MXFP4\n"
               "  --version\n");
}

static void command_usage(int c) {
    printf("usage: glm %s %s\n%s\noptions:\n", COMMANDS[c].name, COMMANDS[c].synopsis, COMMANDS[c].what);
    for (int i = 0; i < N_FLAGS; i++) {
        if (!(FLAGS[i].cmds & COMMANDS[c].bit)) continue;
        char head[48];
        snprintf(head, sizeof head, "%s%s%s", FLAGS[i].name, FLAGS[i].value ? " " : "", FLAGS[i].value ? FLAGS[i].value : "");
        printf("  %-20s ", head);
        for (const char *p = FLAGS[i].help; *p; p++) { /* continuation lines under the text */
            putchar(*p);
            if (*p == '\n') printf("  %-20s ", "");
        }
        putchar('\n');
    }
}

static long parse_long(const char *flag, const char *s, long min, long max) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < min || v > max) glm_fatal("%s %s: expected an integer in [%ld, %ld]", flag, s, min, max);
    return v;
}

static float parse_float(const char *flag, const char *s, float min, float max) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (!*s || *end || errno || !(v >= min && v <= max)) glm_fatal("%s %s: expected a number in [%g, %g]", flag, s, min, max);
    return v;
}

/* Sets the field of flag f (FLAGS) from its value v (NULL for a switch). */
static void set_flag(Args *a, const char *f, const char *v) {
    if (!strcmp(f, "-m")) {
        if (a->n_models == ((!strcmp(a->cmd, "compare")) ? 2 : 1)) glm_fatal("%s: -m given too many times", a->cmd);
        a->model_dirs[a->n_models++] = v;
    }
    else if (!strcmp(f, "-p")) a->prompt = v;
    else if (!strcmp(f, "--ids")) a->ids = v;
    else if (!strcmp(f, "-o")) a->out = v;
    else if (!strcmp(f, "--decode")) a->decode = 1;
    else if (!strcmp(f, "--chunk")) a->chunk = (int)parse_long(f, v, 1, 1 << 16);
    else if (!strcmp(f, "--mtp")) a->mtp = 1;
    else if (!strcmp(f, "--draft")) a->draft = (int)parse_long(f, v, 0, GLM_MAX_DRAFT);
    else if (!strcmp(f, "-n") && !strcmp(a->cmd, "bench")) a->bench.n_decode = (int)parse_long(f, v, 1, 4096);
    else if (!strcmp(f, "-n")) a->n_gen = (int)parse_long(f, v, 0, 1 << 24);
    else if (!strcmp(f, "-P")) a->bench.prompt = (int)parse_long(f, v, 1, 1 << 20);
    else if (!strcmp(f, "--long")) a->bench.long_ctx = (int)parse_long(f, v, 64, 1 << 20);
    else if (!strcmp(f, "--json")) a->bench.json = 1;
    else if (!strcmp(f, "--system")) a->system = v;
    else if (!strcmp(f, "--no-think")) a->no_think = 1;
    else if (!strcmp(f, "--effort")) {
        if (strcmp(v, "max") && strcmp(v, "high") && strcmp(v, "none")) glm_fatal("--effort %s: expected max, high or none", v);
        a->effort = v;
    }
    else if (!strcmp(f, "--temp")) a->temperature = parse_float(f, v, 0.0f, 100.0f);
    else if (!strcmp(f, "--top-p")) a->top_p = parse_float(f, v, 0.0f, 1.0f);
    else if (!strcmp(f, "--seed")) a->seed = (uint64_t)parse_long(f, v, 0, 0x7fffffffffffffffL);
    else if (!strcmp(f, "--tokenizer")) a->tokenizer = v;
    else if (!strcmp(f, "--ctx")) a->ctx = (int)parse_long(f, v, 1, 1 << 24);
    else if (!strcmp(f, "-t")) a->threads = (int)parse_long(f, v, 1, 1024);
    else if (!strcmp(f, "--fp32")) a->bf16 = 0;
    else if (!strcmp(f, "--bf16")) a->bf16 = 1;
    else if (!strcmp(f, "--no-mmap")) a->no_mmap = 1;
    else if (!strcmp(f, "--gpu")) { if (!a->n_gpus) a->n_gpus = 1; }
    else if (!strcmp(f, "--gpus")) a->n_gpus = (int)parse_long(f, v, 1, 64);
}

static void parse_args(Args *a, int c, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->cmd = COMMANDS[c].name;
    a->n_gen = 32;
    a->draft = -1;
    a->temperature = 1.0f;
    a->top_p = 0.95f; /* generation_config.json of GLM-5.2 */
    a->seed = (uint64_t)time(NULL);
    a->bench = (BenchArgs){.prompt = 512, .long_ctx = 4096, .n_decode = 32};
    const char *pp = getenv("GLM_PRECISION");
    if (pp && *pp && strcmp(pp, "fp32") && strcmp(pp, "bf16")) glm_fatal("GLM_PRECISION=%s: expected fp32 or bf16", pp);
    a->bf16 = pp && *pp ? !strcmp(pp, "bf16") : -1; /* -1: whichever is faster here (fast_init) */
    for (int i = 2; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { command_usage(c); exit(0); }
        if (f[0] != '-') glm_fatal("%s: unexpected argument '%s' (see glm %s --help)", a->cmd, f, a->cmd);
        const Flag *flag = NULL;
        for (int k = 0; k < N_FLAGS && !flag; k++)
            if (!strcmp(FLAGS[k].name, f) && (FLAGS[k].cmds & COMMANDS[c].bit)) flag = &FLAGS[k];
#ifndef GLM_GPU
        if (!flag && (!strcmp(f, "--gpu") || !strcmp(f, "--gpus")))
            glm_fatal("%s: this glm was built without GPU support (build it with make hip, make cuda or make emu)", f);
#endif
        if (!flag) glm_fatal("%s: unknown flag %s (see glm %s --help)", a->cmd, f, a->cmd);
        if (flag->value && i + 1 >= argc) glm_fatal("%s: missing value (%s)", f, flag->value);
        set_flag(a, f, flag->value ? argv[++i] : NULL);
    }
    if (!a->n_models) glm_fatal("%s: -m DIR is required (see glm %s --help)", a->cmd, a->cmd);
    if (c == 3 && a->n_models != 2) glm_fatal("compare: give exactly two -m DIR");
    g_no_mmap = a->no_mmap;
#ifdef _OPENMP
    if (a->threads) omp_set_num_threads(a->threads);
#endif
}

/* "1,2,3" -> ids, each checked against the vocabulary. */
static int *parse_ids(const char *s, int vocab, int *n) {
    int cap = 16, *ids = xmalloc((size_t)cap * sizeof(int));
    *n = 0;
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0) glm_fatal("--ids: '%s' is not a comma-separated list of token ids", s);
        if (v >= vocab) glm_fatal("--ids: token id %ld is out of range (vocab_size %d)", v, vocab);
        if (*n == cap) { cap *= 2; ids = realloc(ids, (size_t)cap * sizeof(int)); if (!ids) glm_fatal("out of memory"); }
        ids[(*n)++] = (int)v;
        if (!*end) break;
        if (*end != ',') glm_fatal("--ids: '%s' is not a comma-separated list of token ids", s);
        p = end + 1;
    }
    return ids;
}

/* ======================================================================== */
/* prompts and text                                                         */

/* Text prompts must be valid UTF-8: the tokenizer would accept any bytes, but a
 * user who passed a Latin-1 file wants to be told. Returns the offset of the first
 * bad byte, or -1. */
static long utf8_invalid_at(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = p[i], len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!len || i + len > n) return (long)i;
        unsigned cp = len == 1 ? c : c & (0x7F >> len);
        for (unsigned k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return (long)i;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        static const unsigned min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return (long)i;
        i += len;
    }
    return -1;
}

static Tokenizer *load_tokenizer(const Args *a) {
    char *path = a->tokenizer ? xstrdup(a->tokenizer) : path_join(a->model_dirs[0], "tokenizer.json");
    struct stat st;
    if (!a->tokenizer && stat(path, &st) != 0)
        glm_fatal("%s: no tokenizer.json in the checkpoint folder: pass --tokenizer FILE (the model's tokenizer.json)%s", path,
                  strcmp(a->cmd, "chat") ? ", or give the prompt as token ids with --ids 1,2,3" : "");
    char err[512];
    Tokenizer *t = tokenizer_load(path, err, sizeof err);
    if (!t) glm_fatal("%s", err);
    free(path);
    return t;
}

/* -p TEXT or --ids: the prompt's ids, checked against the vocabulary; *tok is the
 * tokenizer when the prompt was text (the output is then text too), else NULL. */
static int *prompt_ids(const Args *a, int vocab, int *n, Tokenizer **tok) {
    *tok = NULL;
    if (!a->prompt) return parse_ids(a->ids, vocab, n);
    long bad = utf8_invalid_at(a->prompt, strlen(a->prompt));
    if (bad >= 0) glm_fatal("-p: the prompt is not valid UTF-8 (byte %ld)", bad);
    *tok = load_tokenizer(a);
    char err[256];
    int *ids;
    *n = tokenizer_encode(*tok, a->prompt, strlen(a->prompt), &ids, err, sizeof err);
    if (*n < 0) glm_fatal("-p: %s", err);
    if (*n == 0) glm_fatal("-p: the prompt is empty");
    for (int i = 0; i < *n; i++)
        if (ids[i] >= vocab) glm_fatal("--tokenizer: token id %d is outside the model's vocab_size %d", ids[i], vocab);
    return ids;
}

/* The context a session gets: --ctx, else min(4096, max_position_embeddings). */
static int session_ctx(const Args *a, const Config *c, int n_prompt) {
    int ctx = a->ctx ? a->ctx : (c->max_pos < 4096 ? c->max_pos : 4096);
    if (n_prompt > ctx) glm_fatal("--ctx %d: the %d prompt tokens do not fit the context", ctx, n_prompt);
    return ctx;
}

/* ======================================================================== */
/* generation                                                               */

typedef struct {
    double t_decode; int n_forward; double bytes;
    int n_draft; long steps, drafted, accepted; /* --draft: verify steps, drafts proposed and accepted in this reply */
} DecodeStats;

/* Samples and prints up to n_gen tokens after the prefill that produced `logits`; each
 * one goes through the cache (spec_step: one decode step, or with --draft a verify step
 * that yields several, printed one by one). Returns the count; the ids land in out[]. */
static int generate(Session *S, Speculator *spec, Sampler *sp, float *logits, int n_gen, const Tokenizer *tok, int *out, DecodeStats *st) {
    const Config *c = &S->model.cfg;
    TokenizerStream ts;
    size_t cap = tok ? tokenizer_stream_out_max(tok) : 0;
    char *buf = tok ? xmalloc(cap) : NULL;
    if (tok) tokenizer_stream_init(&ts);
    double t1 = now_s();
    const int pos0 = S->kv.pos; /* the first generated token's position */
    const long steps0 = spec->steps, drafted0 = spec->drafted, accepted0 = spec->accepted;
    int n = 0, next = session_sample(S, sp, logits), ahead[GLM_MAX_DRAFT + 1], n_ahead = 0, i_ahead = 0;
    *st = (DecodeStats){0};
    while (n < n_gen) {
        out[n++] = next;
        if (tok) { /* printed as soon as it completes a UTF-8 character */
            if (!is_eos(c, next)) { size_t m = tokenizer_stream_push(&ts, tok, next, buf, cap); fwrite(buf, 1, m, stdout); }
        } else printf("%s%d", n > 1 ? " " : "", next);
        fflush(stdout);
        if (is_eos(c, next) || n == n_gen) break;
        st->n_forward++;
        if (i_ahead < n_ahead) { next = ahead[i_ahead++]; continue; } /* verified and cached already */
        if (S->kv.pos >= S->kv.ctx) { st->n_forward--; fprintf(stderr, "\nglm: context full (%d tokens)\n", S->kv.ctx); break; }
        if (!spec->n_draft) st->bytes += decode_bytes(&S->model, S->kv.pos);
        n_ahead = spec_step(spec, S, sp, next, n_gen - n, logits, ahead);
        next = ahead[0];
        i_ahead = 1;
    }
    if (n) spec_truncate(spec, &S->kv, pos0 + n - 1); /* as one token a step leaves it: all but the last token cached */
    if (tok) { size_t m = tokenizer_stream_flush(&ts, buf, cap); fwrite(buf, 1, m, stdout); free(buf); }
    st->t_decode = now_s() - t1;
    st->n_draft = spec->n_draft;
    st->steps = spec->steps - steps0, st->drafted = spec->drafted - drafted0, st->accepted = spec->accepted - accepted0;
    return n;
}

static void print_speed(int n_prompt, double t_prefill, const DecodeStats *st) {
    fprintf(stderr, "prefill: %d tokens in %.3f s (%.2f tok/s)\n", n_prompt, t_prefill, n_prompt / t_prefill);
    if (st->n_forward && !st->n_draft)
        fprintf(stderr, "decode: %d tokens in %.3f s (%.2f tok/s), %.3f GB read per token, %.2f GB/s\n", st->n_forward, st->t_decode,
                st->n_forward / st->t_decode, st->bytes / st->n_forward / 1e9, st->bytes / st->t_decode / 1e9);
    else if (st->n_forward) /* a verify step reads more than a decode step: no GB/s */
        fprintf(stderr, "decode: %d tokens in %.3f s (%.2f tok/s); --draft %d: %ld of %ld drafts accepted (%.1f%%), %.2f tokens per step\n",
                st->n_forward, st->t_decode, st->n_forward / st->t_decode, st->n_draft, st->accepted, st->drafted,
                st->drafted ? 100.0 * st->accepted / st->drafted : 0.0, st->steps ? (double)(st->accepted + st->steps) / st->steps : 0.0);
}

/* glm run: prefill the prompt, then sample one token at a time through the cache. */
static int cmd_run(const Args *a) {
    if (!a->ids == !a->prompt) glm_fatal("run: give the prompt as --ids 1,2,3 or as -p TEXT");
    Config probe;
    config_load(&probe, a->model_dirs[0]); /* cheap checks before mapping gigabytes */
    Tokenizer *tok;
    int n, *ids = prompt_ids(a, probe.vocab_size, &n, &tok);
    Session S;
    session_open(&S, a->model_dirs[0], session_ctx(a, &probe, n), a->n_gpus);
    const Config *c = &S.model.cfg;
    Speculator spec;
    spec_open(&spec, &S, &S.kv, a->draft);
    Sampler sp;
    sampler_init(&sp, a->temperature, a->top_p, a->seed, c->vocab_size);
    float *logits = xmalloc((size_t)c->vocab_size * sizeof(float));
    int *out = xmalloc((size_t)(a->n_gen + 1) * sizeof(int));
    double t0 = now_s();
    spec_prefill(&spec, &S, ids, n, logits);
    double t_prefill = now_s() - t0;
    DecodeStats st;
    generate(&S, &spec, &sp, logits, a->n_gen, tok, out, &st);
    printf("\n");
    print_speed(n, t_prefill, &st);
    sampler_free(&sp); free(logits); free(ids); free(out);
    spec_close(&spec);
    if (tok) tokenizer_free(tok);
    session_close(&S);
    return 0;
}

/* ======================================================================== */
/* glm chat                                                                 */

typedef struct {
    ChatMessage *msg;
    int n, cap;
} Conversation;

static void conversation_add(Conversation *cv, const char *role, const char *content, char *reasoning) {
    if (cv->n == cv->cap) {
        cv->cap = cv->cap ? 2 * cv->cap : 16;
        cv->msg = realloc(cv->msg, (size_t)cv->cap * sizeof *cv->msg);
        if (!cv->msg) glm_fatal("out of memory");
    }
    cv->msg[cv->n++] = (ChatMessage){.role = role, .content = xstrdup(content), .reasoning = reasoning};
}

/* Drops message i (freeing its text). */
static void conversation_drop(Conversation *cv, int i) {
    free((void *)cv->msg[i].content);
    free((void *)cv->msg[i].reasoning);
    memmove(cv->msg + i, cv->msg + i + 1, (size_t)(cv->n - i - 1) * sizeof *cv->msg);
    cv->n--;
}

/* The conversation as prompt ids with the assistant's turn opened, leaving `room` tokens
 * of the context for the reply. A newest message that does not fit even alone (after the
 * system message) is refused: returns -1 and the history is untouched. Otherwise, while
 * the whole does not fit, the oldest exchange (a user message and the reply to it; the
 * system message stays) is dropped, and the user is told. */
static int render_fitting(const Tokenizer *tok, Conversation *cv, const ChatOptions *opt, int ctx, int room, int **ids) {
    char err[256];
    const int first = cv->n > 0 && !strcmp(cv->msg[0].role, "system");
    ChatMessage alone[2] = {cv->msg[0], cv->msg[cv->n - 1]};
    int n = tokenizer_render_chat(tok, first ? alone : alone + 1, first ? 2 : 1, opt, 1, ids, err, sizeof err);
    if (n < 0) glm_fatal("chat: %s", err);
    free(*ids);
    if (n + room > ctx) return -1;
    for (;;) {
        n = tokenizer_render_chat(tok, cv->msg, cv->n, opt, 1, ids, err, sizeof err);
        if (n < 0) glm_fatal("chat: %s", err);
        if (n + room <= ctx) return n;
        free(*ids);
        conversation_drop(cv, first);
        if (!strcmp(cv->msg[first].role, "assistant")) conversation_drop(cv, first);
        fprintf(stderr, "glm: the conversation no longer fits --ctx %d: dropped the oldest turn\n", ctx);
    }
}

/* The reply as history, as the template expects it: with thinking on, the text before </think>
 * is its reasoning_content (all of it when </think> never came: the answer was not reached) and
 * the rest its content. Once the next user message follows, the template drops that reasoning
 * (clear_thinking), so the next prompt differs from the cache from there on. */
static void add_reply(Conversation *cv, const Tokenizer *tok, const Config *c, const int *out, int m, int thinking) {
    int n_reply = m > 0 && is_eos(c, out[m - 1]) ? m - 1 : m;
    char *text = tokenizer_decode(tok, out, n_reply, 0, NULL);
    if (!text) glm_fatal("out of memory");
    char *end_think = strstr(text, "</think>"), *reasoning = NULL, *content = text;
    if (thinking) {
        content = end_think ? end_think + strlen("</think>") : text + strlen(text);
        if (end_think) *end_think = 0;
        reasoning = xstrdup(text);
    }
    conversation_add(cv, "assistant", content, reasoning);
    free(text);
}

/* A multi-turn loop on stdin. The whole conversation is rendered again each turn, but
 * only the tokens after the longest prefix already in the KV cache are run: earlier
 * turns are not re-read. A message that does not fit the context is refused and the
 * chat goes on; when the conversation outgrows it, the oldest turns go. */
static int cmd_chat(const Args *a) {
    Tokenizer *tok = load_tokenizer(a);
    Config probe;
    config_load(&probe, a->model_dirs[0]);
    Session S;
    session_open(&S, a->model_dirs[0], session_ctx(a, &probe, 0), a->n_gpus);
    const Config *c = &S.model.cfg;
    Speculator spec;
    spec_open(&spec, &S, &S.kv, a->draft);
    const int ctx = S.kv.ctx, room = a->n_gen < ctx / 2 ? a->n_gen : ctx / 2; /* tokens kept free for a reply */
    Sampler sp;
    sampler_init(&sp, a->temperature, a->top_p, a->seed, c->vocab_size);
    float *logits = xmalloc((size_t)c->vocab_size * sizeof(float));
    ChatOptions opt;
    tokenizer_chat_defaults(&opt);
    opt.thinking = !a->no_think;
    if (a->effort) opt.effort = !strcmp(a->effort, "none") ? NULL : !strcmp(a->effort, "high") ? "High" : "Max";
    Conversation cv = {0};
    if (a->system) conversation_add(&cv, "system", a->system, NULL);
    int *cached = xmalloc((size_t)ctx * sizeof(int)), n_cached = 0; /* the ids in the KV cache */
    int *out = xmalloc((size_t)(ctx + 1) * sizeof(int));
    char *line = NULL;
    size_t line_cap = 0;
    const int tty = isatty(0);
    const char *nr = getenv("GLM_CHAT_NO_REUSE"); /* tests: re-read every turn from scratch */
    const int no_reuse = nr && *nr == '1';
    for (;;) {
        if (tty) { fprintf(stderr, "\n> "); fflush(stderr); }
        ssize_t len = getline(&line, &line_cap, stdin);
        if (len < 0) break;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (!len) continue;
        long bad = utf8_invalid_at(line, (size_t)len);
        if (bad >= 0) glm_fatal("chat: input line is not valid UTF-8 (byte %ld)", bad);
        if (!tty) printf("> %s\n", line); /* piped turns are shown, so the output reads as a chat */
        conversation_add(&cv, "user", line, NULL);
        int *ids, n = render_fitting(tok, &cv, &opt, ctx, room, &ids);
        if (n < 0) {
            fprintf(stderr, "glm: this message does not fit --ctx %d with room for a reply; it was not sent\n", ctx);
            conversation_drop(&cv, cv.n - 1);
            continue;
        }
        int keep = 0; /* reuse the cached prefix; the cache is rewound to it */
        /* S.kv.pos, not n_cached: a reply's last token was printed but never run, so its row is not in the cache */
        while (!no_reuse && keep < S.kv.pos && keep < n - 1 && cached[keep] == ids[keep]) keep++;
        S.kv.pos = keep;
        double t0 = now_s();
        spec_prefill(&spec, &S, ids, n, logits); /* ids[keep..n), and the MTP layer's rows with --draft */
        double t_prefill = now_s() - t0;
        memcpy(cached, ids, (size_t)n * sizeof(int));
        n_cached = n;
        DecodeStats st;
        const int left = ctx - n, m = generate(&S, &spec, &sp, logits, a->n_gen < left ? a->n_gen : left, tok, out, &st);
        printf("\n");
        fflush(stdout);
        memcpy(cached + n_cached, out, (size_t)(m < left ? m : left) * sizeof(int));
        n_cached += m < left ? m : left;
        print_speed(n - keep, t_prefill, &st);
        add_reply(&cv, tok, c, out, m, opt.thinking);
        free(ids);
    }
    while (cv.n) conversation_drop(&cv, cv.n - 1);
    free(cv.msg); free(cached); free(out); free(line); sampler_free(&sp); free(logits);
    spec_close(&spec);
    tokenizer_free(tok);
    session_close(&S);
    return 0;
}

/* ======================================================================== */
/* glm logits and glm compare                                               */

/* The logits of every position of ids, from one checkpoint (a session of its own):
 * one prefill, one token at a time, or (chunk > 0) as glm serve runs a prompt. */
static float *all_logits(const Args *a, const char *dir, const int *ids, int n, int one_at_a_time, int chunk) {
    Config probe;
    config_load(&probe, dir);
    Session S;
    session_open(&S, dir, session_ctx(a, &probe, n), a->n_gpus);
    const int V = S.model.cfg.vocab_size;
    float *logits = xmalloc((size_t)n * V * sizeof(float));
    if (one_at_a_time)
        for (int t = 0; t < n; t++) session_forward(&S, &S.kv, ids + t, 1, logits + (size_t)t * V, 0);
    else if (chunk) {
        ops.prompt_rows = 1;
        for (int t = 0; t < n; t += chunk) session_forward(&S, &S.kv, ids + t, n - t < chunk ? n - t : chunk, logits + (size_t)t * V, 1);
        ops.prompt_rows = 0;
    } else
        session_forward(&S, &S.kv, ids, n, logits, 1);
    session_close(&S);
    return logits;
}

/* glm logits --mtp: the MTP layer's logits [n-1][V] (glm.c's session_mtp_logits). */
static float *mtp_logits(const Args *a, const char *dir, const int *ids, int n, int one_at_a_time) {
    if (n < 2) glm_fatal("logits --mtp: needs at least 2 ids (row i pairs the hidden state at i with id i+1)");
    Config probe;
    config_load(&probe, dir);
    Session S;
    session_open_mtp(&S, dir, session_ctx(a, &probe, n), a->n_gpus);
    float *logits = xmalloc((size_t)(n - 1) * S.model.cfg.vocab_size * sizeof(float));
    session_mtp_logits(&S, ids, n, logits, one_at_a_time);
    session_close(&S);
    return logits;
}

/* glm logits: float32 [n][V] ([n-1][V] with --mtp), written under a temporary name and
 * renamed at the end, so a failure leaves no half-written file. */
static int cmd_logits(const Args *a) {
    if (!a->ids) glm_fatal("logits: --ids is required");
    if (!a->out) glm_fatal("logits: -o FILE is required");
    if (a->chunk && (a->decode || a->mtp)) glm_fatal("logits: --chunk cannot go with %s", a->decode ? "--decode" : "--mtp");
    Config probe;
    config_load(&probe, a->model_dirs[0]);
    int n, *ids = parse_ids(a->ids, probe.vocab_size, &n);
    float *logits = a->mtp ? mtp_logits(a, a->model_dirs[0], ids, n, a->decode) : all_logits(a, a->model_dirs[0], ids, n, a->decode, a->chunk);
    const size_t count = (size_t)(a->mtp ? n - 1 : n) * probe.vocab_size;
    size_t len = strlen(a->out);
    char *tmp = xmalloc(len + 16);
    snprintf(tmp, len + 16, "%s.partial", a->out);
    glm_fatal_unlink(tmp);
    FILE *f = fopen(tmp, "wb");
    if (!f) glm_fatal("-o %s: cannot create: %s", a->out, strerror(errno));
    size_t wrote = fwrite(logits, sizeof(float), count, f);
    if (fclose(f) != 0 || wrote != count) glm_fatal("-o %s: write failed: %s", a->out, strerror(errno));
    if (rename(tmp, a->out) != 0) glm_fatal("-o %s: rename failed: %s", a->out, strerror(errno));
    glm_fatal_unlink(NULL);
    free(tmp); free(logits); free(ids);
    return 0;
}

static void log_softmax(double *out, const float *x, int n) {
    double mx = x[0], sum = 0;
    for (int i = 1; i < n; i++) if (x[i] > mx) mx = x[i];
    for (int i = 0; i < n; i++) sum += exp(x[i] - mx);
    double lse = mx + log(sum);
    for (int i = 0; i < n; i++) out[i] = x[i] - lse;
}

/* glm compare: two checkpoints (e.g. BF16 and its MXFP4 conversion) on the same
 * tokens: mean KL(A||B) of the next-token distributions, how often their top-1 agree,
 * and the perplexity of each on the sequence itself. */
static int cmd_compare(const Args *a) {
    if (!a->ids == !a->prompt) glm_fatal("compare: give the tokens as --ids 1,2,3 or as -p TEXT");
    const char *A = a->model_dirs[0], *B = a->model_dirs[1];
    Config ca, cb;
    config_load(&ca, A);
    config_load(&cb, B);
    if (ca.vocab_size != cb.vocab_size) glm_fatal("compare: %s has vocab_size %d but %s has %d", A, ca.vocab_size, B, cb.vocab_size);
    Tokenizer *tok;
    int n, *ids = prompt_ids(a, ca.vocab_size, &n, &tok);
    if (tok) tokenizer_free(tok);
    if (n < 2) glm_fatal("compare: need at least 2 tokens");
    const int V = ca.vocab_size;
    float *la = all_logits(a, A, ids, n, 0, 0), *lb = all_logits(a, B, ids, n, 0, 0);
    double *pa = xmalloc((size_t)V * sizeof(double)), *pb = xmalloc((size_t)V * sizeof(double));
    double kl = 0, kl_max = 0, nll_a = 0, nll_b = 0;
    int agree = 0;
    for (int t = 0; t < n; t++) {
        log_softmax(pa, la + (size_t)t * V, V);
        log_softmax(pb, lb + (size_t)t * V, V);
        double k = 0;
        for (int i = 0; i < V; i++) k += exp(pa[i]) * (pa[i] - pb[i]);
        kl += k;
        if (k > kl_max) kl_max = k;
        agree += argmax(la + (size_t)t * V, V) == argmax(lb + (size_t)t * V, V);
        if (t + 1 < n) { nll_a -= pa[ids[t + 1]]; nll_b -= pb[ids[t + 1]]; }
    }
    printf("compare: %d tokens\n", n);
    printf("  KL(A||B)        mean %.6f nats, max %.6f\n", kl / n, kl_max);
    printf("  top-1 agreement %d / %d = %.1f%%\n", agree, n, 100.0 * agree / n);
    printf("  perplexity      A %s: %.4f\n", A, exp(nll_a / (n - 1)));
    printf("                  B %s: %.4f\n", B, exp(nll_b / (n - 1)));
    free(pa); free(pb); free(la); free(lb); free(ids);
    return 0;
}

/* ======================================================================== */

static int cmd_bench(const Args *a) {
    BenchArgs b = a->bench;
    b.model_dir = a->model_dirs[0];
    b.ctx = a->ctx;
    b.n_gpus = a->n_gpus;
    return bench_run(&b);
}

/* OpenMP threads spin at every barrier before they sleep (libgomp: ~300k rounds). When
 * another process keeps a core busy, the thread a step waits for queues for a core while
 * its partner spins: decode of the demo model fell from ~470 to 10-40 tok/s. Waiting
 * passively cost nothing measurable here (bench-model decode and prefill, alternating
 * runs), so it is the default. libgomp reads OMP_WAIT_POLICY in its constructor, before
 * main(), hence the re-exec; an OMP_WAIT_POLICY or GOMP_SPINCOUNT of the user's is kept. */
static void wait_passively(char **argv) {
#ifdef _OPENMP
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv); /* returns only if it failed: then the threads spin as before */
#else
    (void)argv;
#endif
}

int main(int argc, char **argv) {
    wait_passively(argv);
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) { usage(argc < 2 ? stderr : stdout); return argc < 2; }
    if (!strcmp(argv[1], "--version")) {
        printf("glm %s (%s kernels chosen at start; GPU path: %s)\n", GLM_VERSION,
#if defined(__x86_64__)
               "x86-64 SIMD",
#else
               "plain C",
#endif
#ifdef GLM_GPU
               "built in"
#else
               "not built (make hip | cuda | emu)"
#endif
        );
        return 0;
    }
    const char *cmd = argv[1];
    number_tables_init();
    if (!strcmp(cmd, "tokenize")) return tokenize_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "synth")) return synth_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "convert")) return convert_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return serve_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "loadgen")) return loadgen_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan")) return plan_main(argc - 1, argv + 1);
    static int (*const run[])(const Args *) = {cmd_run, cmd_chat, cmd_logits, cmd_compare, cmd_bench};
    for (int c = 0; c < (int)(sizeof COMMANDS / sizeof COMMANDS[0]); c++) {
        if (strcmp(cmd, COMMANDS[c].name)) continue;
        Args a;
        parse_args(&a, c, argc, argv);
        fast_init(getenv("GLM_KERNELS"), a.bf16); /* GLM_KERNELS=c: glm.c's plain ops end to end */
        return run[c](&a);
    }
    glm_fatal("unknown command '%s' (see glm --help)", cmd);
}
