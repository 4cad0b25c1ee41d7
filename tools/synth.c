/* synth.c - `glm synth OUT_DIR`: a random checkpoint with GLM-5.2's real widths.
 *
 * This is the benchmark model, not a test fixture: hidden 6144, 64 heads, q/kv ranks
 * 2048/512, 256 experts of width 2048, the real vocabulary, but only a few layers, so
 * that bytes read per decoded token and FLOPs per prefilled token have the real
 * proportions at a size this machine holds. Values are random with the right
 * magnitudes (weights ~ 1/sqrt(fan_in), norms 1) so activations stay finite.
 *
 * Formats (--format):
 *   mxfp4  AMD's layout: routed + shared experts MXFP4; attention, dense MLP and
 *          router BF16; embedding and lm_head 8-bit (FP8 E4M3, 128x128 block scales)
 *   bf16   everything BF16
 *
 * OUT_DIR must be new or empty. Every file is written as NAME.partial and renamed when
 * complete, config.json last; on failure (glm_fatal) or SIGINT/SIGTERM/SIGHUP every file
 * this run created is removed again, and OUT_DIR too if this run created it.
 */
#define _GNU_SOURCE
#include "../glm.h"
#include "../tokenizer.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    char name[240];
    const char *dtype;       /* BF16, F32, F8_E4M3, U8 */
    int ndim;
    int64_t shape[2];
    size_t nbytes;
    int kind;                /* how to fill it, see fill() */
    int fan_in;              /* for the magnitude of random weights */
} SynthTensor;

enum { FILL_RANDOM, FILL_ONES, FILL_ZEROS, FILL_SCALE };

typedef struct {
    SynthTensor *t;
    int n, cap;
} TensorList;

static void add(TensorList *l, const char *name, const char *dtype, int64_t rows, int64_t cols, int kind, int fan_in) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->t = realloc(l->t, (size_t)l->cap * sizeof *l->t);
        if (!l->t) glm_fatal("out of memory");
    }
    SynthTensor *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->ndim = cols ? 2 : 1;
    t->shape[0] = rows; t->shape[1] = cols;
    size_t esz = !strcmp(dtype, "BF16") ? 2 : !strcmp(dtype, "F32") ? 4 : 1;
    t->nbytes = (size_t)rows * (size_t)(cols ? cols : 1) * esz;
    t->kind = kind;
    t->fan_in = fan_in;
}

/* A Linear [rows, cols] in the chosen format, with its scale tensor if it has one. */
static void add_linear(TensorList *l, const char *prefix, int rows, int cols, WeightFormat fmt) {
    char n[240];
    if (fmt == WF_MXFP4) {
        snprintf(n, sizeof n, "%s.weight", prefix); add(l, n, "U8", rows, cols / 2, FILL_RANDOM, cols);
        snprintf(n, sizeof n, "%s.weight_scale", prefix); add(l, n, "U8", rows, cols / 32, FILL_SCALE, cols);
    } else if (fmt == WF_FP8) {
        snprintf(n, sizeof n, "%s.weight", prefix); add(l, n, "F8_E4M3", rows, cols, FILL_RANDOM, cols);
        snprintf(n, sizeof n, "%s.weight_scale_inv", prefix); add(l, n, "F32", (rows + 127) / 128, (cols + 127) / 128, FILL_SCALE, cols);
    } else {
        snprintf(n, sizeof n, "%s.weight", prefix); add(l, n, "BF16", rows, cols, FILL_RANDOM, cols);
    }
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Fills buf with `n` bytes of tensor t starting at byte offset `off` (deterministic
 * in (seed, tensor, offset), so chunks can be made in parallel). */
static void fill(const SynthTensor *t, uint8_t *buf, size_t off, size_t n, uint64_t seed) {
    /* target magnitude of a weight: 1/sqrt(fan_in) = 2^e */
    int e = -(int)ceil(0.5 * log2((double)(t->fan_in > 0 ? t->fan_in : 1)));
    int is_bf16 = !strcmp(t->dtype, "BF16"), is_f32 = !strcmp(t->dtype, "F32"), is_fp8 = !strcmp(t->dtype, "F8_E4M3");
    for (size_t i = 0; i < n; i += 8) {
        uint64_t s = seed ^ ((off + i) * 0x9E3779B97F4A7C15ull);
        uint64_t r = splitmix(&s);
        uint8_t word[8];
        for (int k = 0; k < 8; k++) word[k] = (uint8_t)(r >> (8 * k));
        if (t->kind == FILL_ONES || t->kind == FILL_ZEROS) {
            uint16_t one = t->kind == FILL_ONES ? 0x3f80 : 0; /* bf16 1.0 */
            uint32_t onef = t->kind == FILL_ONES ? 0x3f800000u : 0;
            if (is_bf16) for (int k = 0; k < 4; k++) memcpy(word + 2 * k, &one, 2);
            else for (int k = 0; k < 2; k++) memcpy(word + 4 * k, &onef, 4);
        } else if (t->kind == FILL_SCALE) {
            if (is_f32) { /* FP8 block multiplier: E4M3 codes average ~2^3 here, so 2^(e-3) */
                float v = ldexpf(1.0f, e - 3);
                for (int k = 0; k < 2; k++) memcpy(word + 4 * k, &v, 4);
            } else { /* E8M0: E2M1 codes average ~2, so 2^(e-1) */
                for (int k = 0; k < 8; k++) word[k] = (uint8_t)(127 + e - 1);
            }
        } else if (is_bf16) { /* random sign and mantissa, exponent e or e-1 */
            for (int k = 0; k < 4; k++) {
                uint16_t b = (uint16_t)((word[2 * k] & 0x80) << 8 | (uint16_t)(127 + e - (word[2 * k] & 1)) << 7 | (word[2 * k + 1] & 0x7f));
                memcpy(word + 2 * k, &b, 2);
            }
        } else if (is_fp8) { /* any code except NaN, exponents 1..14 */
            for (int k = 0; k < 8; k++) word[k] = (uint8_t)((word[k] & 0x87) | (uint8_t)((1 + (word[k] >> 3) % 14) << 3));
        } /* U8 MXFP4 codes: every byte is valid */
        size_t m = n - i < 8 ? n - i : 8;
        memcpy(buf + i, word, m);
    }
}

/* The files of OUT_DIR, all registered before the first one is created, so that the signal
 * handler walks a table that no longer changes. `made` is set before a file is opened; the
 * cleanup then removes both names (the rename may or may not have happened). */
typedef struct {
    char tmp[4200], final[4096];
    volatile sig_atomic_t made;
} OutFile;

static struct {
    const char *dir;
    int created_dir;
    OutFile *f;
    int n;
    char msg[4400];          /* "removed ...\n", formatted before any file exists */
    size_t msg_len;
    int tty;                 /* stderr is a terminal: a progress bar may be on the line */
} g_synth;

static OutFile *out_file(const char *name) {
    OutFile *f = &g_synth.f[g_synth.n++];
    snprintf(f->final, sizeof f->final, "%s/%s", g_synth.dir, name);
    snprintf(f->tmp, sizeof f->tmp, "%s.partial", f->final);
    f->made = 0;
    return f;
}

static FILE *out_open(OutFile *f) {
    f->made = 1;
    FILE *fp = fopen(f->tmp, "wb");
    if (!fp) glm_fatal("%s: cannot create: %s", f->tmp, strerror(errno));
    return fp;
}

static void out_close(OutFile *f, FILE *fp) {
    if (fclose(fp) != 0) glm_fatal("%s: write failed: %s", f->tmp, strerror(errno));
    if (rename(f->tmp, f->final) != 0) glm_fatal("%s: rename failed: %s", f->final, strerror(errno));
}

/* unlink, rmdir and write are async-signal-safe */
static void remove_output(void) {
    for (int i = 0; i < g_synth.n; i++)
        if (g_synth.f[i].made) { unlink(g_synth.f[i].tmp); unlink(g_synth.f[i].final); }
    if (g_synth.created_dir) rmdir(g_synth.dir);
}

static void on_fatal(void) { /* glm_fatal has printed the error */
    remove_output();
    fprintf(stderr, "glm: synth: failed; %s", g_synth.msg);
}

static void on_signal(int sig) {
    static const char head[] = "\nglm: synth: interrupted; ";
    remove_output();
    if (write(2, head + !g_synth.tty, sizeof head - 1 - (size_t)!g_synth.tty) < 0 || write(2, g_synth.msg, g_synth.msg_len) < 0) {
        /* stderr is gone: nothing more to do */
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

/* OUT_DIR must not exist yet or be an empty folder (as for glm convert): synth never
 * overwrites or mixes with files it did not make. */
static void check_out_dir(const char *out) {
    struct stat st;
    if (stat(out, &st) != 0) {
        if (errno != ENOENT) glm_fatal("synth: output folder %s: %s", out, strerror(errno));
        return;
    }
    if (!S_ISDIR(st.st_mode)) glm_fatal("synth: output %s exists and is not a folder", out);
    DIR *d = opendir(out);
    if (!d) glm_fatal("synth: output folder %s: %s", out, strerror(errno));
    struct dirent *e;
    int empty = 1;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = 0;
    closedir(d);
    if (!empty) glm_fatal("synth: output folder %s is not empty (choose a new folder)", out);
}

/* The default --tokenizer: build/tokenizer.json beside the running glm binary (the build
 * unpacks it from data/glm-5.2-tokenizer/tokenizer.json.gz). */
static void default_tokenizer(char *path, size_t cap) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) glm_fatal("synth: no tokenizer: cannot find the glm binary's folder (/proc/self/exe: %s); pass --tokenizer FILE",
                          n < 0 ? strerror(errno) : "empty");
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    if ((size_t)snprintf(path, cap, "%s/build/tokenizer.json", slash ? exe : ".") >= cap) glm_fatal("synth: %s: path too long", exe);
    if (access(path, R_OK) != 0)
        glm_fatal("synth: no tokenizer: %s not found (run `make build/tokenizer.json` in %s, or pass --tokenizer FILE)", path,
                  slash ? exe : ".");
}

static void write_shard(OutFile *of, SynthTensor *t, int n, uint64_t seed, size_t *done, size_t total, double t0) {
    /* header: {"name": {"dtype":..,"shape":[..],"data_offsets":[b,e]}, ...} padded with spaces
     * so the data section starts 64-byte aligned in the file (and so in the mmap) */
    size_t cap = 1 << 16, len = 0, off = 0;
    char *h = malloc(cap);
    if (!h) glm_fatal("out of memory");
    len += (size_t)snprintf(h, cap, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        if (cap - len < 512) { cap *= 2; h = realloc(h, cap); if (!h) glm_fatal("out of memory"); }
        char shape[64];
        if (t[i].ndim == 2) snprintf(shape, sizeof shape, "%lld,%lld", (long long)t[i].shape[0], (long long)t[i].shape[1]);
        else snprintf(shape, sizeof shape, "%lld", (long long)t[i].shape[0]);
        len += (size_t)snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%zu,%zu]}",
                                t[i].name, t[i].dtype, shape, off, off + t[i].nbytes);
        off += t[i].nbytes;
    }
    h[len++] = '}';
    while ((8 + len) % 64) h[len++] = ' ';

    const char *tmp = of->tmp;
    FILE *f = out_open(of);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)len >> (8 * i));
    if (fwrite(len8, 1, 8, f) != 8 || fwrite(h, 1, len, f) != len) glm_fatal("%s: write failed", tmp);
    free(h);

    const size_t CHUNK = 64u << 20;
    uint8_t *buf = malloc(CHUNK);
    if (!buf) glm_fatal("out of memory");
    for (int i = 0; i < n; i++) {
        uint64_t ts = seed ^ (uint64_t)(i + 1) * 0xD1B54A32D192ED03ull; /* a different stream per tensor */
        for (size_t o = 0; o < t[i].nbytes; o += CHUNK) {
            size_t m = t[i].nbytes - o < CHUNK ? t[i].nbytes - o : CHUNK;
            size_t step = 1 << 20;
#pragma omp parallel for schedule(static)
            for (size_t p = 0; p < m; p += step) fill(&t[i], buf + p, o + p, m - p < step ? m - p : step, ts);
            if (fwrite(buf, 1, m, f) != m) glm_fatal("%s: write failed (disk full?)", tmp);
            *done += m;
            progress("synth", *done, total, t0);
        }
    }
    free(buf);
    out_close(of, f);
}

int synth_main(int argc, char **argv) {
    const char *out = NULL, *format = "mxfp4", *tokenizer = NULL;
    int layers = 2, experts = 256, dense_layers = 1, ctx = 1048576, tiny = 0, mtp = 0;
    uint64_t seed = 1;
    static const char usage[] =
        "usage: glm synth OUT_DIR [--layers N] [--experts E] [--dense K] [--format mxfp4|bf16] [--seed S] [--tiny] [--mtp]\n"
        "                 [--tokenizer FILE]\n"
        "  Writes a random checkpoint with GLM-5.2's widths and real vocabulary (its text is noise): the benchmark\n"
        "  model, or with --tiny a few-MB demo model. OUT_DIR must not exist yet, or be an empty folder.\n"
        "  --layers N        layers, 1..78 (default 2)\n"
        "  --experts E       routed experts per MoE layer, 8..256 (default 256; 16 with --tiny)\n"
        "  --dense K         the first K layers have a dense MLP instead of experts (default 1)\n"
        "  --format F        mxfp4: experts MXFP4, embedding and lm_head FP8, the rest BF16; bf16: all BF16\n"
        "                    (default mxfp4)\n"
        "  --seed S          random seed (default 1)\n"
        "  --tiny            hidden 256, 4 heads, narrow MLPs; the real vocabulary (default off)\n"
        "  --mtp             also the MTP layer, model.layers.N for N = --layers (default off): a MoE layer with\n"
        "                    its own indexer, enorm, hnorm, eh_proj, shared_head.norm, as GLM-5.2 ships it\n"
        "                    (for --draft, and glm bench's draft cost)\n"
        "  --tokenizer FILE  tokenizer.json to copy into OUT_DIR (default build/tokenizer.json beside the glm\n"
        "                    binary, which make unpacks from data/glm-5.2-tokenizer/)\n"
        "  -h, --help        this text";
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (f[0] != '-') { if (out) glm_fatal("synth: unexpected argument '%s'", f); out = f; continue; }
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { puts(usage); return 0; }
        if (!strcmp(f, "--tiny")) { tiny = 1; continue; }
        if (!strcmp(f, "--mtp")) { mtp = 1; continue; }
        if (strcmp(f, "--layers") && strcmp(f, "--experts") && strcmp(f, "--dense") && strcmp(f, "--seed") && strcmp(f, "--tokenizer") && strcmp(f, "--format"))
            glm_fatal("synth: unknown flag %s", f);
        if (i + 1 >= argc) glm_fatal("%s: missing value", f);
        const char *v = argv[++i];
        char *end;
        long x = strtol(v, &end, 10);
        int bad = !*v || *end;
        if (!strcmp(f, "--layers")) { if (bad || x < 1 || x > 78) glm_fatal("--layers %s: expected 1..78", v); layers = (int)x; }
        else if (!strcmp(f, "--experts")) { if (bad || x < 8 || x > 256) glm_fatal("--experts %s: expected 8..256", v); experts = (int)x; }
        else if (!strcmp(f, "--dense")) { if (bad || x < 0) glm_fatal("--dense %s: expected a count of dense layers", v); dense_layers = (int)x; }
        else if (!strcmp(f, "--seed")) { if (bad) glm_fatal("--seed %s: expected an integer", v); seed = (uint64_t)x; }
        else if (!strcmp(f, "--tokenizer")) tokenizer = v;
        else { /* --format, the last flag the check above lets through (as in glm.c's parse_args) */
            if (strcmp(v, "mxfp4") && strcmp(v, "bf16")) glm_fatal("--format %s: expected mxfp4 or bf16", v);
            format = v;
        }
    }
    if (!out) glm_fatal("synth: OUT_DIR is required (see glm synth --help)");
    if (dense_layers > layers) dense_layers = layers;

    /* GLM-5.2 widths (docs/MODEL.md §1.1); --tiny keeps only the real vocabulary
     * (for `make demo`: the whole pipeline, tokenizer included, in a few MB) */
    int H = 6144, NH = 64, QR = 2048, KR = 512, DN = 192, DR = 64, DV = 256, IH = 32, ID = 128;
    int FI = 2048, FD = 12288, V = 154880, TOPK = 2048;
    if (tiny) {
        H = 256; NH = 4; QR = 128; KR = 64; DN = 32; DR = 16; DV = 32; IH = 4; ID = 32;
        FI = 128; FD = 512; TOPK = 64;
        if (experts == 256) experts = 16;
    }
    int mx = !strcmp(format, "mxfp4");
    WeightFormat expert_fmt = mx ? WF_MXFP4 : WF_BF16, io_fmt = mx ? WF_FP8 : WF_BF16;

    const int n_lay = layers + mtp; /* the MTP layer, if any, is layer `layers` (docs/MODEL.md §2.3) */
    TensorList global = {0}, *lay = calloc((size_t)n_lay, sizeof(TensorList));
    if (!lay) glm_fatal("out of memory");
    add_linear(&global, "model.embed_tokens", V, H, io_fmt);
    add(&global, "model.norm.weight", "BF16", H, 0, FILL_ONES, 0);
    add_linear(&global, "lm_head", V, H, io_fmt);
    char p[128], n[200];
    for (int l = 0; l < n_lay; l++) {
        TensorList *L = &lay[l];
        snprintf(p, sizeof p, "model.layers.%d", l);
#define N(fmt_) (snprintf(n, sizeof n, "%s." fmt_, p), n)
        add(L, N("input_layernorm.weight"), "BF16", H, 0, FILL_ONES, 0);
        add(L, N("post_attention_layernorm.weight"), "BF16", H, 0, FILL_ONES, 0);
        add_linear(L, N("self_attn.q_a_proj"), QR, H, WF_BF16);
        add(L, N("self_attn.q_a_layernorm.weight"), "BF16", QR, 0, FILL_ONES, 0);
        add_linear(L, N("self_attn.q_b_proj"), NH * (DN + DR), QR, WF_BF16);
        add_linear(L, N("self_attn.kv_a_proj_with_mqa"), KR + DR, H, WF_BF16);
        add(L, N("self_attn.kv_a_layernorm.weight"), "BF16", KR, 0, FILL_ONES, 0);
        add_linear(L, N("self_attn.kv_b_proj"), NH * (DN + DV), KR, WF_BF16);
        add_linear(L, N("self_attn.o_proj"), H, NH * DV, WF_BF16);
        /* every layer of a short model runs its own indexer (GLM-5.2's layers 0-2 do too) */
        add_linear(L, N("self_attn.indexer.wq_b"), IH * ID, QR, WF_BF16);
        add_linear(L, N("self_attn.indexer.wk"), ID, H, WF_BF16);
        add(L, N("self_attn.indexer.k_norm.weight"), "BF16", ID, 0, FILL_ONES, 0);
        add(L, N("self_attn.indexer.k_norm.bias"), "BF16", ID, 0, FILL_ZEROS, 0);
        add_linear(L, N("self_attn.indexer.weights_proj"), IH, H, WF_BF16);
        if (l == layers) { /* the MTP layer's own tensors; its MLP is always MoE */
            add(L, N("enorm.weight"), "BF16", H, 0, FILL_ONES, 0);
            add(L, N("hnorm.weight"), "BF16", H, 0, FILL_ONES, 0);
            add_linear(L, N("eh_proj"), H, 2 * H, WF_BF16);
            add(L, N("shared_head.norm.weight"), "BF16", H, 0, FILL_ONES, 0);
        }
        if (l < dense_layers && l < layers) {
            add_linear(L, N("mlp.gate_proj"), FD, H, WF_BF16);
            add_linear(L, N("mlp.up_proj"), FD, H, WF_BF16);
            add_linear(L, N("mlp.down_proj"), H, FD, WF_BF16);
        } else {
            add_linear(L, N("mlp.gate"), experts, H, WF_BF16);
            add(L, N("mlp.gate.e_score_correction_bias"), "F32", experts, 0, FILL_ZEROS, 0);
            add_linear(L, N("mlp.shared_experts.gate_proj"), FI, H, expert_fmt);
            add_linear(L, N("mlp.shared_experts.up_proj"), FI, H, expert_fmt);
            add_linear(L, N("mlp.shared_experts.down_proj"), H, FI, expert_fmt);
            for (int e = 0; e < experts; e++) {
                char q[200];
                snprintf(q, sizeof q, "%s.mlp.experts.%d.gate_proj", p, e); add_linear(L, q, FI, H, expert_fmt);
                snprintf(q, sizeof q, "%s.mlp.experts.%d.up_proj", p, e); add_linear(L, q, FI, H, expert_fmt);
                snprintf(q, sizeof q, "%s.mlp.experts.%d.down_proj", p, e); add_linear(L, q, H, FI, expert_fmt);
            }
        }
#undef N
    }

    /* everything that can be checked is checked before OUT_DIR is touched. The tokenizer:
     * every mode, --tiny included, keeps GLM-5.2's vocabulary (V = 154880 rows of embed and
     * lm_head, as the real checkpoint: 24 more than the tokenizer's 154856 ids), so the
     * default tokenizer always fits. A --tokenizer FILE with more ids than V is refused here
     * instead of being written: its ids >= vocab_size would index past the embedding. */
    char tok_default[4096];
    if (!tokenizer) { default_tokenizer(tok_default, sizeof tok_default); tokenizer = tok_default; }
    {
        char err[512];
        Tokenizer *tk = tokenizer_load(tokenizer, err, sizeof err);
        if (!tk) glm_fatal("synth: cannot use the tokenizer: %s", err);
        int nv = tokenizer_vocab_size(tk);
        tokenizer_free(tk);
        if (nv > V) glm_fatal("synth: tokenizer %s has %d ids, more than the model's vocab_size %d", tokenizer, nv, V);
    }
    check_out_dir(out);

    /* OUT_DIR and its files: config.json, the shards, the index, tokenizer.json. Cleanup on
     * failure or signal is in place before the first file exists. */
    int n_shards = n_lay + 1; /* one shard for embed/norm/head, one per layer (the MTP layer's last) */
    g_synth.dir = out;
    g_synth.n = 0;
    g_synth.f = calloc((size_t)n_shards + 3, sizeof(OutFile));
    if (!g_synth.f) glm_fatal("out of memory");
    if (mkdir(out, 0755) == 0) g_synth.created_dir = 1;
    else if (errno != EEXIST) glm_fatal("synth: cannot create output folder %s: %s", out, strerror(errno));
    {
        g_synth.tty = isatty(2);
        int n = snprintf(g_synth.msg, sizeof g_synth.msg, "removed %s%s\n",
                         g_synth.created_dir ? "the output folder " : "the files it wrote to ", out);
        g_synth.msg_len = n < 0 ? 0 : (size_t)n < sizeof g_synth.msg ? (size_t)n : sizeof g_synth.msg - 1;
    }
    OutFile *of_config = out_file("config.json"), *of_shard[80], *of_index, *of_tok;
    for (int s = 0; s < n_shards; s++) {
        char file[96];
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        of_shard[s] = out_file(file);
    }
    of_index = out_file("model.safetensors.index.json");
    of_tok = out_file("tokenizer.json");
    glm_fatal_cleanup = on_fatal;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);

    /* the shards, then the index */
    size_t total = 0, done = 0;
    for (int i = 0; i < global.n; i++) total += global.t[i].nbytes;
    for (int l = 0; l < n_lay; l++) for (int i = 0; i < lay[l].n; i++) total += lay[l].t[i].nbytes;
    double t0 = now_s();
    FILE *ix = out_open(of_index);
    fprintf(ix, "{\n  \"metadata\": {\"total_size\": %zu},\n  \"weight_map\": {", total);
    int first = 1;
    for (int s = 0; s < n_shards; s++) {
        TensorList *T = s == 0 ? &global : &lay[s - 1];
        const char *file = strrchr(of_shard[s]->final, '/') + 1;
        write_shard(of_shard[s], T->t, T->n, seed * 1000003u + (uint64_t)s, &done, total, t0);
        for (int i = 0; i < T->n; i++) { fprintf(ix, "%s\n    \"%s\": \"%s\"", first ? "" : ",", T->t[i].name, file); first = 0; }
        free(T->t);
    }
    fprintf(ix, "\n  }\n}\n");
    out_close(of_index, ix);
    free(lay);

    /* the tokenizer, so that the folder is a complete model (glm run -m OUT_DIR -p TEXT) */
    {
        FILE *in = fopen(tokenizer, "rb");
        if (!in) glm_fatal("--tokenizer %s: cannot open: %s", tokenizer, strerror(errno));
        FILE *o = out_open(of_tok);
        char buf[1 << 16];
        size_t r;
        while ((r = fread(buf, 1, sizeof buf, in)) > 0)
            if (fwrite(buf, 1, r, o) != r) glm_fatal("%s: write failed", of_tok->tmp);
        if (ferror(in)) glm_fatal("--tokenizer %s: read failed", tokenizer);
        fclose(in);
        out_close(of_tok, o);
    }

    /* config.json last (a folder with config.json is a finished one): the real field names
     * and values, with this model's layer and expert counts */
    FILE *f = out_open(of_config);
    fprintf(f, "{\n  \"architectures\": [\"GlmMoeDsaForCausalLM\"],\n  \"model_type\": \"glm_moe_dsa\",\n  \"dtype\": \"bfloat16\",\n"
               "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"num_hidden_layers\": %d,\n  \"num_nextn_predict_layers\": %d,\n"
               "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"q_lora_rank\": %d,\n  \"kv_lora_rank\": %d,\n"
               "  \"qk_nope_head_dim\": %d,\n  \"qk_rope_head_dim\": %d,\n  \"qk_head_dim\": %d,\n  \"v_head_dim\": %d,\n  \"head_dim\": 192,\n"
               "  \"rope_parameters\": {\"rope_theta\": 8000000, \"rope_type\": \"default\"},\n  \"rope_interleave\": true,\n"
               "  \"indexer_rope_interleave\": true,\n  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": 1e-05,\n  \"hidden_act\": \"silu\",\n"
               "  \"intermediate_size\": %d,\n  \"first_k_dense_replace\": %d,\n  \"n_routed_experts\": %d,\n  \"num_experts_per_tok\": 8,\n"
               "  \"n_shared_experts\": 1,\n  \"moe_intermediate_size\": %d,\n  \"scoring_func\": \"sigmoid\",\n  \"topk_method\": \"noaux_tc\",\n"
               "  \"n_group\": 1,\n  \"topk_group\": 1,\n  \"norm_topk_prob\": true,\n  \"routed_scaling_factor\": 2.5,\n"
               "  \"index_topk\": %d,\n  \"index_n_heads\": %d,\n  \"index_head_dim\": %d,\n  \"index_topk_freq\": 1,\n%s"
               "  \"tie_word_embeddings\": false,\n  \"attention_bias\": false,\n  \"eos_token_id\": [154820, 154827, 154829],\n"
               "  \"pad_token_id\": 154820\n}\n",
            V, H, layers, mtp, NH, NH, QR, KR, DN, DR, DN + DR, DV, ctx, FD, dense_layers, experts, FI, TOPK, IH, ID,
            mtp ? "  \"index_share_for_mtp_iteration\": true,\n" : "");
    out_close(of_config, f);
    glm_fatal_cleanup = NULL;
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    free(g_synth.f);
    g_synth.f = NULL;
    g_synth.n = 0;

    double dt = now_s() - t0;
    fprintf(stderr, "synth: wrote %s: %d layers%s, %d experts, %s, %.2f GB in %.1f s (%.2f GB/s)\n", out, layers, mtp ? " + the MTP layer" : "",
            experts, format, total / 1e9, dt, total / 1e9 / dt);
    return 0;
}
