/* convert.c - glm convert: a BF16 or FP8 checkpoint folder to AMD Quark's MXFP4 layout.
 *
 *   glm convert IN_DIR OUT_DIR [--attn] [--all-linear] [-t N] [--no-sync]
 *
 * Read top to bottom:
 *   1. MXFP4 quantization of one row, exactly as Quark does it (docs/FORMATS.md §1.4)
 *   2. the plan: what becomes MXFP4, what is converted (FP8 -> BF16), what is copied;
 *      every output header is computed from the input headers before any data is written
 *   3. output files: temporary names, removed on failure or signal, renamed at the end
 *   4. streaming: each tensor in blocks of rows, read with pread, converted, written with
 *      pwrite, spread over the OpenMP threads; memory stays a few MiB per thread
 *   5. config.json (Quark quantization_config), the shard index, tokenizer and other files
 *   6. the command
 *
 * Decisions (see also the README):
 *   - Default: routed and shared experts of decoder layers 0..num_hidden_layers-1 become
 *     MXFP4, like amd/GLM-5.2-MXFP4. --attn adds the attention Linears (q_a, q_b, kv_a, kv_b,
 *     o_proj, indexer wq_b and wk; never indexer weights_proj); --all-linear adds attention
 *     and the dense MLP. The router, embeddings, lm_head and the MTP layer stay as they are.
 *   - A Linear is quantized only if its input width is a multiple of 32; else it is kept.
 *   - FP8 weights are dequantized with their 128x128 block scales (weight_scale_inv, partial
 *     edge blocks clamped) in fp32. Those not quantized are written as BF16 (rounded to
 *     nearest even; exact when the scales are powers of two), so the output has one
 *     quantization method (quark) and no F8 tensors; weight_scale_inv is dropped.
 *   - NaN or infinity in a tensor that is converted (quantized, or FP8 -> BF16) is an error
 *     naming the tensor; tensors copied unchanged are not inspected.
 *   - Output shards mirror the input shards (same file names, one output file per input
 *     file); a weight's MXFP4 weight_scale goes into the same shard as its weight.
 */
#define _GNU_SOURCE
#include "../glm.h"
#include "../json.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* ======================================================================== */
/* small helpers                                                            */

static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) glm_fatal("out of memory allocating %zu bytes", n);
    return p;
}

static char *xprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xprintf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* A growable string, for JSON headers, the index and config.json. */
typedef struct { char *s; size_t n, cap; } Buf;

static void buf_put(Buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->s = xrealloc(b->s, b->cap);
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void buf_printf(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_printf(Buf *b, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if ((size_t)n < sizeof small) { buf_put(b, small, (size_t)n); return; }
    char *big = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    buf_put(b, big, (size_t)n);
    free(big);
}

/* A JSON string literal: tensor names come from input headers and may hold any character. */
static void buf_json_string(Buf *b, const char *s) {
    buf_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { buf_put(b, "\\", 1); buf_put(b, s, 1); }
        else if (c < 0x20) buf_printf(b, "\\u%04x", c);
        else buf_put(b, s, 1);
    }
    buf_put(b, "\"", 1);
}

/* ======================================================================== */
/* 1. MXFP4 quantization (docs/FORMATS.md §1.4, Quark "even" scale, RNE)   */

#define MX_BLOCK 32

/* The two hot loops (BF16/FP8 -> fp32, and the quantizer) are compiled three times, for
 * AVX-512, AVX2 and plain x86-64, and the loader picks the best the CPU has (GCC/Clang
 * function multiversioning). The C is the same; only the vector width differs. */
#if defined(__x86_64__) && defined(__linux__) && (defined(__clang__) ? __clang_major__ >= 14 : defined(__GNUC__))
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define VECTOR_CLONES
#endif

/* The shared exponent e of one 32-element block (its scale is 2^e, stored as e + 127).
 * Quark's "even" rule: round amax to two significant bits first (adding 2^21 to the fp32
 * bit pattern carries into the exponent exactly when the mantissa is >= 1.75), keep only
 * the power of two, then e = floor(log2) - 2, because the largest E2M1 power of two is 4.
 * The scaled amax then lands in [4, 7), so at most [6, 7) is clipped, which RNE rounds
 * to 6 anyway. amax = 0 (or a subnormal that rounds to 0) is log2 = -inf: clamped to -127. */
static int mx_shared_exponent(float amax) {
    uint32_t u;
    memcpy(&u, &amax, 4);
    u = (u + 0x00200000u) & 0xFF800000u;
    int biased = (int)(u >> 23);
    if (biased == 0) return -127;
    if (biased == 255) return 127; /* amax >= 1.75 * 2^127 rounds up to infinity */
    int e = biased - 127 - 2;
    return e < -127 ? -127 : e;
}

/* The E2M1 code of a scaled element: nearest of 0 0.5 1 1.5 2 3 4 6, ties to the even code
 * (mantissa bit 0), saturated at 6. Each comparison is one midpoint; at a midpoint, > or >=
 * picks the even neighbour: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
 * The sign bit is the input's sign bit, as Quark's packer takes bit 31 of the float: a
 * negative value that rounds to zero (and -0.0) becomes code 8, "-0". */
static inline uint32_t e2m1_code(float q) {
    float a = fabsf(q);
    uint32_t c = (uint32_t)(a > 0.25f) + (uint32_t)(a >= 0.75f) + (uint32_t)(a > 1.25f) + (uint32_t)(a >= 1.75f) +
                 (uint32_t)(a > 2.5f) + (uint32_t)(a >= 3.5f) + (uint32_t)(a > 5.0f);
    uint32_t u;
    memcpy(&u, &q, 4);
    return c | (u >> 31) << 3;
}

/* 2^-e as an fp32 number, for e in [-127, 127] (2^-127 is the fp32 subnormal 0x00400000).
 * Multiplying by it is exact, like dividing by the scale. */
static float pow2_neg(int e) {
    uint32_t u = e == 127 ? 0x00400000u : (uint32_t)(127 - e) << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* One row of n fp32 values (n a multiple of 32) -> n/2 packed bytes (element 2i in the low
 * nibble of byte i) and n/32 E8M0 scale bytes. Returns the column of the first NaN or
 * infinity (nothing sensible can be stored for it), or -1.
 * The loops have a fixed trip count of 32 and no branches, so the compiler vectorizes them;
 * amax is taken on the bit patterns with the sign cleared, which order like the magnitudes
 * and put NaN and infinity (>= 0x7f800000) on top, so one comparison finds both. */
VECTOR_CLONES static int64_t mxfp4_quantize_row(const float *restrict x, int64_t n, uint8_t *restrict packed,
                                              uint8_t *restrict scales) {
    for (int64_t b = 0; b < n / MX_BLOCK; b++) {
        const float *v = x + b * MX_BLOCK;
        uint32_t top = 0;
        for (int i = 0; i < MX_BLOCK; i++) {
            uint32_t u;
            memcpy(&u, &v[i], 4);
            u &= 0x7fffffffu;
            top = u > top ? u : top;
        }
        if (top >= 0x7f800000u)
            for (int i = 0; i < MX_BLOCK; i++)
                if (!isfinite(v[i])) return b * MX_BLOCK + i;
        float amax;
        memcpy(&amax, &top, 4);
        int e = mx_shared_exponent(amax);
        scales[b] = (uint8_t)(e + 127);
        float inv = pow2_neg(e);
        uint32_t code[MX_BLOCK]; /* 32-bit lanes like the floats: narrowed once, when packing */
        for (int i = 0; i < MX_BLOCK; i++) code[i] = e2m1_code(v[i] * inv);
        uint8_t *p = packed + b * (MX_BLOCK / 2);
        for (int i = 0; i < MX_BLOCK / 2; i++) p[i] = (uint8_t)(code[2 * i] | (code[2 * i + 1] << 4));
    }
    return -1;
}

/* ======================================================================== */
/* 2. the plan                                                              */

typedef struct {
    int attn;        /* --attn: attention Linears too */
    int dense;       /* --all-linear: attention and the dense MLP too */
    int threads;     /* -t N, 0 = OpenMP default */
    int no_sync;     /* --no-sync: skip the flush to disk before the renames */
} Options;

typedef enum {
    OUT_COPY,        /* bytes copied unchanged */
    OUT_MX_WEIGHT,   /* BF16/F32/FP8 weight -> packed E2M1 U8 [out, in/2] (writes its scale too) */
    OUT_MX_SCALE,    /* its E8M0 U8 [out, in/32], written together with the weight */
    OUT_FP8_BF16,    /* FP8 weight kept unquantized -> BF16 [out, in] */
} OutKind;

typedef struct {
    char *name;
    const char *dtype;
    int ndim;
    int64_t shape[8];
    size_t nbytes;
    size_t offset;                 /* in the data section of its shard */
    OutKind kind;
    const TensorInfo *src;         /* the input tensor */
    const TensorInfo *src_scale;   /* FP8 input: its weight_scale_inv */
    int pair;                      /* MX_WEIGHT / MX_SCALE: which quantized weight */
} OutTensor;

typedef struct {
    const char *file;              /* base name, same as the input shard */
    OutTensor *t;
    int n, cap;
    Buf header;                    /* 8-byte length + JSON, padded to a multiple of 8 */
    size_t data_size;
} OutShard;

typedef struct {
    OutShard *shards;
    int n_shards;                  /* = input shards; an empty one is not written */
    int n_pairs;                   /* quantized weights */
    size_t *pair_scale_offset;     /* [n_pairs] where each weight's scale lands */
    char **exclude;                /* modules left unquantized, for quantization_config */
    int n_exclude, cap_exclude;
    int n_mx, n_fp8_bf16, n_copy, n_narrow;
    size_t in_bytes, out_bytes;    /* data bytes read / written */
} Plan;

/* Splits "model.layers.<L>.<rest>" into L and rest; -1 for any other name. */
static int layer_of(const char *name, const char **rest) {
    const char *p = "model.layers.";
    if (strncmp(name, p, strlen(p))) return -1;
    char *end;
    long l = strtol(name + strlen(p), &end, 10);
    if (end == name + strlen(p) || *end != '.' || l < 0 || l > GLM_MAX_LAYERS) return -1;
    *rest = end + 1;
    return (int)l;
}

static int is_one_of(const char *s, const char *const *list) {
    for (; *list; list++)
        if (!strcmp(s, *list)) return 1;
    return 0;
}

/* Does the user want this weight in MXFP4? By name, in decoder layers 0..n_layers-1 only:
 * the MTP layer (index n_layers) stays as it is, like AMD's release (docs/FORMATS.md §2.3). */
static int wants_mxfp4(const char *name, const Config *c, const Options *o) {
    const char *rest;
    int l = layer_of(name, &rest);
    if (l < 0 || l >= c->n_layers) return 0;
    static const char *const shared[] = {"mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight",
                                         "mlp.shared_experts.down_proj.weight", NULL};
    static const char *const attn[] = {"self_attn.q_a_proj.weight", "self_attn.q_b_proj.weight",
                                       "self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_b_proj.weight",
                                       "self_attn.o_proj.weight", "self_attn.indexer.wq_b.weight",
                                       "self_attn.indexer.wk.weight", NULL};
    static const char *const dense[] = {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", NULL};
    if (is_one_of(rest, shared)) return 1;
    if (!strncmp(rest, "mlp.experts.", 12)) { /* mlp.experts.<e>.{gate,up,down}_proj.weight */
        char *end;
        strtol(rest + 12, &end, 10);
        return end != rest + 12 && (!strcmp(end, ".gate_proj.weight") || !strcmp(end, ".up_proj.weight") ||
                                    !strcmp(end, ".down_proj.weight"));
    }
    if ((o->attn || o->dense) && is_one_of(rest, attn)) return 1;
    if (o->dense && is_one_of(rest, dense)) return 1;
    return 0;
}

static const TensorInfo *fp8_scale_of(const Checkpoint *ck, const TensorInfo *t) {
    if (!ends_with(t->name, ".weight")) return NULL;
    char *s = xprintf("%s_scale_inv", t->name);
    const TensorInfo *r = checkpoint_find(ck, s);
    free(s);
    return r;
}

static const char *shard_path(const Checkpoint *ck, const TensorInfo *t) { return ck->shards[t->shard].path; }

/* An FP8 weight needs its block scales: F32 (or BF16) [ceil(out/128), ceil(in/128)]. */
static const TensorInfo *check_fp8(const Checkpoint *ck, const TensorInfo *t) {
    const TensorInfo *s = fp8_scale_of(ck, t);
    if (t->ndim != 2) glm_fatal("%s: tensor %s: F8_E4M3 with %d dimensions (expected a 2-D Linear weight)", shard_path(ck, t), t->name, t->ndim);
    if (!s) glm_fatal("%s: tensor %s is F8_E4M3 but %s_scale_inv is missing", shard_path(ck, t), t->name, t->name);
    int64_t br = (t->shape[0] + 127) / 128, bc = (t->shape[1] + 127) / 128;
    if (s->ndim != 2 || s->shape[0] != br || s->shape[1] != bc)
        glm_fatal("%s: tensor %s: expected shape [%lld, %lld] for the 128x128 block scales of %s", shard_path(ck, s), s->name,
                  (long long)br, (long long)bc, t->name);
    if (strcmp(s->dtype, "F32") && strcmp(s->dtype, "BF16"))
        glm_fatal("%s: tensor %s has dtype %s, expected F32", shard_path(ck, s), s->name, s->dtype);
    return s;
}

static OutTensor *plan_add(OutShard *sh, const char *name, const char *dtype, OutKind kind, const TensorInfo *src) {
    if (sh->n == sh->cap) {
        sh->cap = sh->cap ? 2 * sh->cap : 64;
        sh->t = xrealloc(sh->t, (size_t)sh->cap * sizeof(OutTensor));
    }
    OutTensor *o = &sh->t[sh->n++];
    memset(o, 0, sizeof *o);
    o->name = xstrdup(name);
    o->dtype = dtype;
    o->kind = kind;
    o->src = src;
    o->ndim = src->ndim;
    memcpy(o->shape, src->shape, sizeof o->shape);
    o->nbytes = src->nbytes;
    return o;
}

static void plan_exclude(Plan *p, const char *weight_name) {
    if (p->n_exclude == p->cap_exclude) {
        p->cap_exclude = p->cap_exclude ? 2 * p->cap_exclude : 256;
        p->exclude = xrealloc(p->exclude, (size_t)p->cap_exclude * sizeof(char *));
    }
    p->exclude[p->n_exclude++] = xprintf("%.*s", (int)(strlen(weight_name) - strlen(".weight")), weight_name);
}

/* Decides every output tensor. All input problems (unsupported dtypes, missing FP8 scales)
 * are found here, before anything is written. */
static void plan_tensors(Plan *p, const Checkpoint *ck, const Config *c, const Options *o) {
    memset(p, 0, sizeof *p);
    p->n_shards = ck->n_shards;
    p->shards = calloc((size_t)ck->n_shards, sizeof(OutShard));
    if (!p->shards) glm_fatal("out of memory");
    for (int s = 0; s < ck->n_shards; s++) p->shards[s].file = strrchr(ck->shards[s].path, '/') + 1;

    for (int i = 0; i < ck->n_tensors; i++) {
        const TensorInfo *t = &ck->tensors[i];
        OutShard *sh = &p->shards[t->shard];
        const char *file = shard_path(ck, t);
        int is_fp8 = !strcmp(t->dtype, "F8_E4M3");
        const TensorInfo *fp8s = is_fp8 ? check_fp8(ck, t) : NULL;
        /* an FP8 weight's block scales are used up by the weight itself */
        if (ends_with(t->name, ".weight_scale_inv")) {
            char *w = xprintf("%.*s", (int)(strlen(t->name) - strlen("_scale_inv")), t->name);
            const TensorInfo *wt = checkpoint_find(ck, w);
            free(w);
            if (wt && !strcmp(wt->dtype, "F8_E4M3")) continue;
        }
        if (!strncmp(t->dtype, "F8_", 3) && !is_fp8)
            glm_fatal("%s: tensor %s has dtype %s, which convert does not support (BF16, F32, F16 and F8_E4M3 "
                      "with 128x128 weight_scale_inv are)", file, t->name, t->dtype);
        p->in_bytes += t->nbytes + (fp8s ? fp8s->nbytes : 0);

        int linear = t->ndim == 2 && ends_with(t->name, ".weight");
        if (linear && wants_mxfp4(t->name, c, o)) {
            if (strcmp(t->dtype, "BF16") && strcmp(t->dtype, "F32") && !is_fp8)
                glm_fatal("%s: tensor %s has dtype %s; convert quantizes BF16, F32 or F8_E4M3 weights", file, t->name, t->dtype);
            if (t->shape[1] % MX_BLOCK == 0 && t->shape[1] > 0) {
                char *sname = xprintf("%s_scale", t->name);
                if (checkpoint_find(ck, sname)) glm_fatal("%s: tensor %s already exists; is the input quantized already?", file, sname);
                OutTensor *w = plan_add(sh, t->name, "U8", OUT_MX_WEIGHT, t);
                w->shape[1] = t->shape[1] / 2;
                w->nbytes = (size_t)(t->shape[0] * w->shape[1]);
                w->src_scale = fp8s;
                w->pair = p->n_pairs;
                OutTensor *s = plan_add(sh, sname, "U8", OUT_MX_SCALE, t);
                free(sname);
                s->shape[1] = t->shape[1] / MX_BLOCK;
                s->nbytes = (size_t)(t->shape[0] * s->shape[1]);
                s->pair = p->n_pairs++;
                p->n_mx++;
                continue;
            }
            p->n_narrow++; /* input width not a multiple of 32: kept */
        }
        if (linear) plan_exclude(p, t->name);
        if (is_fp8) {
            OutTensor *w = plan_add(sh, t->name, "BF16", OUT_FP8_BF16, t);
            w->nbytes = t->nbytes * 2;
            w->src_scale = fp8s;
            p->n_fp8_bf16++;
        } else {
            plan_add(sh, t->name, t->dtype, OUT_COPY, t);
            p->n_copy++;
        }
    }
    p->pair_scale_offset = xmalloc((size_t)(p->n_pairs ? p->n_pairs : 1) * sizeof(size_t));
}

static size_t dtype_bytes(const char *dt) {
    if (!strcmp(dt, "F64") || !strcmp(dt, "I64") || !strcmp(dt, "U64")) return 8;
    if (!strcmp(dt, "F32") || !strcmp(dt, "I32") || !strcmp(dt, "U32")) return 4;
    if (!strcmp(dt, "BF16") || !strcmp(dt, "F16") || !strcmp(dt, "I16") || !strcmp(dt, "U16")) return 2;
    return 1;
}

/* Like the reference safetensors writer: wider dtypes first, then by name. The header is
 * padded with spaces so the data section starts 64-byte aligned (the reference pads to 8;
 * 64 makes vector loads from the mmap'd file whole cache lines), so every tensor starts
 * naturally aligned without holes. */
static int cmp_out_tensor(const void *a, const void *b) {
    const OutTensor *x = a, *y = b;
    size_t ax = dtype_bytes(x->dtype), ay = dtype_bytes(y->dtype);
    if (ax != ay) return ax > ay ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Lays out one output shard: tensor offsets, then the complete header. */
static void plan_layout(Plan *p, OutShard *sh) {
    qsort(sh->t, (size_t)sh->n, sizeof(OutTensor), cmp_out_tensor);
    Buf *h = &sh->header;
    buf_put(h, "01234567", 8); /* the length, filled in below */
    buf_put(h, "{\"__metadata__\":{\"format\":\"pt\"}", 31);
    size_t off = 0;
    for (int i = 0; i < sh->n; i++) {
        OutTensor *t = &sh->t[i];
        t->offset = off;
        off += t->nbytes;
        if (t->kind == OUT_MX_SCALE) p->pair_scale_offset[t->pair] = t->offset;
        buf_put(h, ",", 1);
        buf_json_string(h, t->name);
        buf_printf(h, ":{\"dtype\":\"%s\",\"shape\":[", t->dtype);
        for (int d = 0; d < t->ndim; d++) buf_printf(h, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        buf_printf(h, "],\"data_offsets\":[%zu,%zu]}", t->offset, t->offset + t->nbytes);
    }
    buf_put(h, "}", 1);
    while (h->n % 64) buf_put(h, " ", 1);
    uint64_t len = h->n - 8;
    for (int i = 0; i < 8; i++) h->s[i] = (char)(len >> (8 * i));
    sh->data_size = off;
    p->out_bytes += off;
}

/* ======================================================================== */
/* 3. output files                                                          */

/* Every file this run creates is written as OUT_DIR/.NAME.partial and renamed when all of
 * them are complete, config.json last, so an interrupted run never leaves a file that looks
 * finished. On failure (glm_fatal) or SIGINT/SIGTERM/SIGHUP everything is removed again,
 * including OUT_DIR if this run created it. The table is allocated once, before any file
 * exists, so the signal handler can walk it. */
typedef struct {
    char *tmp, *final;
    volatile sig_atomic_t state;   /* 0 not created yet, 1 tmp may exist, 2 renamed to final */
} OutFile;

static struct {
    const char *dir;
    int created_dir;
    OutFile *f;
    int n, cap;
} g_out;

static void remove_partial_output(void) {
    for (int i = 0; i < g_out.n; i++) {
        if (g_out.f[i].state == 1) unlink(g_out.f[i].tmp);
        if (g_out.f[i].state == 2) unlink(g_out.f[i].final);
    }
    if (g_out.created_dir) rmdir(g_out.dir);
}

static void on_signal(int sig) {
    remove_partial_output(); /* unlink and rmdir are async-signal-safe */
    signal(sig, SIG_DFL);
    raise(sig);
}

static OutFile *out_file_add(const char *name) {
    if (g_out.n == g_out.cap) glm_fatal("internal error: output file table is full");
    OutFile *f = &g_out.f[g_out.n];
    f->tmp = xprintf("%s/.%s.partial", g_out.dir, name);
    f->final = xprintf("%s/%s", g_out.dir, name);
    f->state = 0;
    g_out.n++;
    return f;
}

static int out_file_create(OutFile *f) {
    f->state = 1;
    int fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) glm_fatal("%s: cannot create: %s", f->tmp, strerror(errno));
    return fd;
}

static void write_all(int fd, const OutFile *f, const void *data, size_t n, size_t off) {
    const char *p = data;
    while (n) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) glm_fatal("%s: write failed: %s", f->tmp, w < 0 ? strerror(errno) : "no progress");
        p += w; n -= (size_t)w; off += (size_t)w;
    }
}

static void out_file_close(int fd, const OutFile *f) {
    if (close(fd) != 0) glm_fatal("%s: close failed: %s", f->tmp, strerror(errno));
}

/* Flushes everything to disk once, before the renames, so that a power failure cannot leave
 * a renamed file whose data never reached the disk (one syncfs, not one fsync per file). */
static void out_sync(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0 || syncfs(fd) != 0) glm_fatal("%s: flushing to disk failed: %s", dir, strerror(errno));
    close(fd);
}

static void out_file_write(OutFile *f, const char *data, size_t n) {
    int fd = out_file_create(f);
    write_all(fd, f, data, n, 0);
    out_file_close(fd, f);
}

/* ======================================================================== */
/* 4. streaming a shard                                                     */

#define BLOCK_BYTES ((size_t)4 << 20) /* input bytes one thread handles at a time */

typedef struct {                 /* per-thread buffers, reused for every block */
    uint8_t *in;                 /* raw input rows */
    uint8_t *out;                /* converted rows */
    float *row;                  /* one row as fp32 */
    size_t in_cap, out_cap, row_cap;
} Scratch;

static void *grow(void *p, size_t *cap, size_t need) {
    if (need <= *cap) return p;
    *cap = need;
    return xrealloc(p, need);
}

typedef struct {                 /* the first failure inside the parallel loop */
    int what;                    /* 0 none, 1 read, 2 write, 3 not finite */
    int err;
    int tensor;                  /* index in the shard */
    int64_t row, col;
} Failure;

/* fp8_e4m3_to_f32 without a table lookup or a branch, so that the loop vectorizes, and
 * without fp32 subnormals (arithmetic on them is slow on x86):
 *   E > 0  value 2^(E-7) * (1 + M/8): the 7 magnitude bits at bits 26..20 plus 120 in the
 *          exponent field are that fp32 number exactly;
 *   E = 0  value M/8 * 2^-6 = M * 2^-9, an exact product;
 * then the sign bit, and S.1111.111 (NaN): only there does magnitude + 1 carry into bit 7. */
static inline float fp8_value(uint8_t b) {
    uint32_t mag = b & 0x7fu, sign = (uint32_t)(b & 0x80u) << 24;
    float sub = (float)(int)mag * 0x1p-9f;
    uint32_t s;
    memcpy(&s, &sub, 4);
    uint32_t normal = 0u - (uint32_t)(mag >= 8); /* all ones when E > 0: a mask, not a branch */
    uint32_t u = (((mag << 20) + (120u << 23)) & normal) | (s & ~normal);
    u |= sign | ((mag + 1) >> 7) * 0x7fc00000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int read_ok(int fd, void *buf, size_t n, size_t off, Failure *fail) {
    char *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int err = r < 0 ? errno : EIO;
            #pragma omp critical(convert_fail)
            if (!fail->what) { fail->what = 1; fail->err = err; }
            return 0;
        }
        p += r; n -= (size_t)r; off += (size_t)r;
    }
    return 1;
}

static int write_ok(int fd, const void *buf, size_t n, size_t off, Failure *fail) {
    const char *p = buf;
    while (n) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int err = w < 0 ? errno : ENOSPC;
            #pragma omp critical(convert_fail)
            if (!fail->what) { fail->what = 2; fail->err = err; }
            return 0;
        }
        p += w; n -= (size_t)w; off += (size_t)w;
    }
    return 1;
}

/* Row r of the input (raw bytes) as fp32: BF16 and F32 exactly, FP8 times its block scale
 * (fp32 multiply, i.e. the exact product rounded once). */
VECTOR_CLONES static void row_to_f32(const OutTensor *t, const uint8_t *restrict raw, int64_t r, const float *fp8_scale,
                                     float *restrict x) {
    int64_t n = t->src->shape[1];
    if (!strcmp(t->src->dtype, "BF16")) {
        /* bf16_to_f32 inline: a BF16 is the top half of an fp32 (an out-of-line call per
         * element would cost more than the quantization itself) */
        for (int64_t j0 = 0; j0 < n; j0 += MX_BLOCK) /* n % 32 == 0: quantized weights only */
            for (int j = 0; j < MX_BLOCK; j++) {
                uint16_t b;
                memcpy(&b, raw + 2 * (j0 + j), 2);
                uint32_t u = (uint32_t)b << 16;
                memcpy(&x[j0 + j], &u, 4);
            }
    } else if (!strcmp(t->src->dtype, "F32")) {
        memcpy(x, raw, (size_t)n * 4);
    } else { /* F8_E4M3 times the scale of its 128x128 block; the last block may be partial */
        const float *s = fp8_scale + (r / 128) * ((n + 127) / 128);
        int64_t full = n / 128 * 128;
        for (int64_t c0 = 0; c0 < full; c0 += 128) {
            float sc = s[c0 / 128];
            for (int j = 0; j < 128; j++) x[c0 + j] = fp8_value(raw[c0 + j]) * sc;
        }
        for (int64_t j = full; j < n; j++) x[j] = fp8_value(raw[j]) * s[full / 128];
    }
}

static int64_t first_nonfinite(const float *x, int64_t n) {
    for (int64_t j = 0; j < n; j++)
        if (!isfinite(x[j])) return j;
    return -1;
}

static void note_nonfinite(Failure *fail, int tensor, int64_t r, int64_t c) {
    #pragma omp critical(convert_fail)
    if (!fail->what) { fail->what = 3; fail->tensor = tensor; fail->row = r; fail->col = c; }
}

/* Converts rows [r0, r1) of t from raw input to the output bytes for those rows. */
static void convert_rows(const OutTensor *t, int ti, const float *fp8_scale, Scratch *s, int64_t r0, int64_t r1,
                         size_t in_row, Failure *fail, size_t *out_w, size_t *out_s) {
    int64_t n = t->src->shape[1];
    s->row = grow(s->row, &s->row_cap, (size_t)n * sizeof(float));
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *raw = s->in + (size_t)(r - r0) * in_row;
        row_to_f32(t, raw, r, fp8_scale, s->row);
        if (t->kind == OUT_MX_WEIGHT) {
            uint8_t *packed = s->out + (size_t)(r - r0) * (size_t)(n / 2);
            uint8_t *scales = s->out + (size_t)(r1 - r0) * (size_t)(n / 2) + (size_t)(r - r0) * (size_t)(n / MX_BLOCK);
            int64_t c = mxfp4_quantize_row(s->row, n, packed, scales);
            if (c >= 0) { note_nonfinite(fail, ti, r, c); return; }
        } else { /* OUT_FP8_BF16 */
            int64_t c = first_nonfinite(s->row, n);
            if (c >= 0) { note_nonfinite(fail, ti, r, c); return; }
            uint8_t *o = s->out + (size_t)(r - r0) * (size_t)n * 2;
            for (int64_t j = 0; j < n; j++) {
                uint16_t b = f32_to_bf16(s->row[j]);
                memcpy(o + 2 * j, &b, 2);
            }
        }
    }
    *out_w = (size_t)(r1 - r0) * (t->kind == OUT_MX_WEIGHT ? (size_t)(n / 2) : (size_t)n * 2);
    *out_s = t->kind == OUT_MX_WEIGHT ? (size_t)(r1 - r0) * (size_t)(n / MX_BLOCK) : 0;
}

/* One unit of work: rows [r0, r1) of output tensor t of a shard (bytes, for a copy), about
 * BLOCK_BYTES of input. All units of a shard go through one parallel loop, so the threads
 * never wait for each other between tensors. */
typedef struct {
    int t;
    int64_t r0, r1;
} Unit;

typedef struct {                 /* what the streaming loop needs besides the shard */
    const Checkpoint *ck;
    const int *in_fd;            /* per input shard */
    Scratch *scratch;            /* [threads] */
    size_t done, total;          /* input bytes, for the progress bar */
    int tensors_done, tensors_total;
    double t0, last_print;
} Stream;

/* Called by the main thread only (OpenMP thread 0), at most five times a second. */
static void show_progress(Stream *st, int final) {
    double t = now_s();
    if (!final && t - st->last_print < 0.2) return;
    st->last_print = t;
    size_t done;
    int tensors;
    #pragma omp atomic read
    done = st->done;
    #pragma omp atomic read
    tensors = st->tensors_done;
    char what[64];
    snprintf(what, sizeof what, "convert %d/%d tensors", tensors, st->tensors_total);
    progress(what, final ? st->total : done, st->total, st->t0);
}

/* Bytes of input per unit of the tensor's rows (one byte per unit for a copy). */
static size_t in_row_bytes(const OutTensor *t) {
    if (t->kind == OUT_COPY) return 1;
    return t->src->nbytes / (size_t)(t->src->shape[0] ? t->src->shape[0] : 1);
}

/* FP8 block scales as fp32: tiny (one number per 128x128 block), read once per tensor. */
static float *load_fp8_scales(const TensorInfo *s) {
    size_t n = (size_t)(s->shape[0] * s->shape[1]);
    float *v = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(s->dtype, "F32")) memcpy(&v[i], s->data + 4 * i, 4);
        else { uint16_t b; memcpy(&b, s->data + 2 * i, 2); v[i] = bf16_to_f32(b); }
    }
    return v;
}

/* Reads, converts and writes one unit. Returns the input bytes it covered. */
static size_t run_unit(const Stream *st, const OutShard *sh, const Plan *plan, const Unit *un, float *const *fp8_scales,
                       int out_fd, size_t data_start, Scratch *s, Failure *fail) {
    const OutTensor *t = &sh->t[un->t];
    const TensorInfo *src = t->src;
    size_t in_row = in_row_bytes(t);
    size_t in_n = (size_t)(un->r1 - un->r0) * in_row;
    size_t in_off = (size_t)(src->data - st->ck->shards[src->shard].map) + (size_t)un->r0 * in_row;
    size_t out_off = data_start + t->offset;
    s->in = grow(s->in, &s->in_cap, in_n);
    if (!read_ok(st->in_fd[src->shard], s->in, in_n, in_off, fail)) return in_n;
    if (t->kind == OUT_COPY) {
        write_ok(out_fd, s->in, in_n, out_off + (size_t)un->r0, fail);
        return in_n;
    }
    int64_t cols = src->shape[1];
    size_t out_row = t->kind == OUT_MX_WEIGHT ? (size_t)(cols / 2) : (size_t)cols * 2;
    size_t scale_row = t->kind == OUT_MX_WEIGHT ? (size_t)(cols / MX_BLOCK) : 0;
    size_t nw = 0, ns = 0;
    s->out = grow(s->out, &s->out_cap, (size_t)(un->r1 - un->r0) * (out_row + scale_row));
    convert_rows(t, un->t, fp8_scales[un->t], s, un->r0, un->r1, in_row, fail, &nw, &ns);
    if (nw && write_ok(out_fd, s->out, nw, out_off + (size_t)un->r0 * out_row, fail) && ns)
        write_ok(out_fd, s->out + nw, ns, data_start + plan->pair_scale_offset[t->pair] + (size_t)un->r0 * scale_row, fail);
    return in_n;
}

static void write_shard(Stream *st, const Plan *plan, OutShard *sh, OutFile *f) {
    int fd = out_file_create(f);
    size_t size = sh->header.n + sh->data_size;
    /* reserve the space now: a full disk fails here, not after an hour */
    if (size && fallocate(fd, 0, 0, (off_t)size) != 0 && errno != EOPNOTSUPP && errno != ENOSYS)
        glm_fatal("%s: cannot reserve %zu bytes: %s", f->tmp, size, strerror(errno));
    write_all(fd, f, sh->header.s, sh->header.n, 0);

    /* cut every tensor into units (a scale comes with its weight and has none of its own) */
    Unit *units = NULL;
    int n_units = 0, cap = 0;
    int *left = xmalloc((size_t)sh->n * sizeof(int));         /* units not done yet, per tensor */
    float **fp8_scales = xmalloc((size_t)sh->n * sizeof(float *));
    for (int i = 0; i < sh->n; i++) {
        const OutTensor *t = &sh->t[i];
        fp8_scales[i] = t->src_scale ? load_fp8_scales(t->src_scale) : NULL;
        left[i] = 0;
        if (t->kind == OUT_MX_SCALE) continue;
        int64_t rows = t->kind == OUT_COPY ? (int64_t)t->src->nbytes : t->src->shape[0];
        int64_t per = (int64_t)(BLOCK_BYTES / in_row_bytes(t));
        if (per < 1) per = 1;
        for (int64_t r0 = 0; r0 < rows; r0 += per) {
            if (n_units == cap) {
                cap = cap ? 2 * cap : 256;
                units = xrealloc(units, (size_t)cap * sizeof(Unit));
            }
            units[n_units++] = (Unit){i, r0, r0 + per < rows ? r0 + per : rows};
            left[i]++;
        }
        if (!left[i]) st->tensors_done++; /* empty tensor: nothing to write */
    }

    Failure fail = {0};
    #pragma omp parallel for schedule(dynamic, 1)
    for (int u = 0; u < n_units; u++) {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        int failed;
        #pragma omp atomic read
        failed = fail.what;
        if (failed) continue;
        size_t n = run_unit(st, sh, plan, &units[u], fp8_scales, fd, sh->header.n, &st->scratch[tid], &fail);
        #pragma omp atomic
        st->done += n;
        int now_left;
        #pragma omp atomic capture
        now_left = --left[units[u].t];
        if (now_left == 0) {
            const OutTensor *t = &sh->t[units[u].t];
            int k = t->kind == OUT_MX_WEIGHT ? 2 : 1;
            #pragma omp atomic
            st->tensors_done += k;
            if (t->src_scale) {
                #pragma omp atomic
                st->done += t->src_scale->nbytes;
            }
        }
        if (tid == 0) show_progress(st, 0);
    }
    if (fail.what == 1) glm_fatal("%s: read failed: %s", f->tmp, strerror(fail.err));
    if (fail.what == 2) glm_fatal("%s: write failed: %s", f->tmp, strerror(fail.err));
    if (fail.what == 3) {
        const TensorInfo *src = sh->t[fail.tensor].src;
        glm_fatal("%s: tensor %s holds a NaN or infinity at [%lld, %lld]; it cannot be quantized",
                  st->ck->shards[src->shard].path, src->name, (long long)fail.row, (long long)fail.col);
    }
    for (int i = 0; i < sh->n; i++) free(fp8_scales[i]);
    free(fp8_scales);
    free(left);
    free(units);
    out_file_close(fd, f);
}

/* ======================================================================== */
/* 5. config.json, the index, other files                                   */

/* Skips one JSON value in already-validated text; returns the index just past it. */
static size_t json_skip_value(const char *s, size_t i) {
    int depth = 0;
    do {
        if (s[i] == '"') {
            for (i++; s[i] != '"'; i++)
                if (s[i] == '\\') i++;
            i++;
        } else if (s[i] == '{' || s[i] == '[') { depth++; i++; }
        else if (s[i] == '}' || s[i] == ']') { depth--; i++; }
        else if (depth == 0) { /* number, true, false, null */
            while (s[i] && !strchr(",}] \t\r\n", s[i])) i++;
        } else i++;
    } while (depth > 0);
    return i;
}

static size_t json_skip_ws(const char *s, size_t i) {
    while (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n') i++;
    return i;
}

/* Removes the top-level member `key` from a JSON object text (validated), in place,
 * leaving every other byte as it was. */
static void json_remove_member(char *s, const char *key) {
    size_t i = json_skip_ws(s, 0) + 1, prev_end = 0;
    int first = 1;
    for (;;) {
        i = json_skip_ws(s, i);
        if (s[i] == '}') return;
        size_t start = i, kend = json_skip_value(s, i);
        size_t v = json_skip_ws(s, kend) + 1; /* past ':' */
        size_t end = json_skip_value(s, json_skip_ws(s, v));
        size_t next = json_skip_ws(s, end);
        int match = kend - start - 2 == strlen(key) && !strncmp(s + start + 1, key, strlen(key));
        if (match) {
            size_t cut_from, cut_to;
            if (!first) { cut_from = prev_end; cut_to = end; }                          /* ,"key": v */
            else if (s[next] == ',') { cut_from = start; cut_to = json_skip_ws(s, next + 1); } /* "key": v, */
            else { cut_from = start; cut_to = end; }                                    /* the only member */
            memmove(s + cut_from, s + cut_to, strlen(s + cut_to) + 1);
            return;
        }
        first = 0;
        prev_end = end;
        i = s[next] == ',' ? next + 1 : next;
    }
}

/* Quark's quantization_config for weight-only MXFP4 (docs/FORMATS.md §2.2). input_tensors is
 * null: nothing about activations is stored, and the reference semantics are W4A16. */
static void quark_config(Buf *b, const Plan *p) {
    buf_printf(b,
               "  \"quantization_config\": {\n"
               "    \"quant_method\": \"quark\",\n"
               "    \"global_quant_config\": {\n"
               "      \"weight\": {\n"
               "        \"dtype\": \"fp4\", \"qscheme\": \"per_group\", \"group_size\": 32, \"ch_axis\": -1,\n"
               "        \"scale_format\": \"e8m0\", \"scale_type\": \"float\", \"scale_calculation_mode\": \"even\",\n"
               "        \"round_method\": \"half_even\", \"is_dynamic\": false, \"symmetric\": null,\n"
               "        \"mx_element_dtype\": null, \"observer_cls\": \"PerBlockMXObserver\", \"block_size\": null,\n"
               "        \"is_scale_quant\": false\n"
               "      },\n"
               "      \"input_tensors\": null,\n"
               "      \"output_tensors\": null,\n"
               "      \"bias\": null,\n"
               "      \"target_device\": null\n"
               "    },\n"
               "    \"exclude\": [");
    for (int i = 0; i < p->n_exclude; i++) {
        buf_put(b, i ? ",\n      " : "\n      ", i ? 8 : 7);
        buf_json_string(b, p->exclude[i]);
    }
    buf_printf(b, "%s],\n", p->n_exclude ? "\n    " : "");
    buf_printf(b,
               "    \"layer_quant_config\": {},\n"
               "    \"layer_type_quant_config\": {},\n"
               "    \"kv_cache_quant_config\": {},\n"
               "    \"kv_cache_post_rope\": false,\n"
               "    \"algo_config\": null,\n"
               "    \"quant_mode\": \"eager_mode\",\n"
               "    \"export\": {\n"
               "      \"weight_format\": \"real_quantized\", \"pack_method\": \"reorder\", \"kv_cache_group\": [],\n"
               "      \"min_kv_scale\": 0.0, \"weight_merge_groups\": null\n"
               "    },\n"
               "    \"version\": \"0.11\"\n"
               "  }");
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static char *read_text(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) glm_fatal("%s: cannot read: %s", path, strerror(errno));
    Buf b = {0};
    char tmp[65536];
    size_t r;
    while ((r = fread(tmp, 1, sizeof tmp, f)) > 0) buf_put(&b, tmp, r);
    int bad = ferror(f);
    fclose(f);
    if (bad) glm_fatal("%s: read error", path);
    if (!b.s) buf_put(&b, "", 0);
    *len = b.n;
    return b.s;
}

/* config.json: the input's text with its quantization_config (FP8's, if any) replaced by
 * Quark's; everything else is kept byte for byte. Checked to parse before it is written. */
static char *make_config(const char *text, const Plan *p) {
    char *s = xstrdup(text);
    json_remove_member(s, "quantization_config");
    size_t close = strlen(s);
    while (close && s[close - 1] != '}') close--;
    close--; /* the object's closing brace */
    size_t last = close;
    while (last && strchr(" \t\r\n", s[last - 1])) last--;
    Buf b = {0};
    buf_put(&b, s, last);
    buf_put(&b, s[last - 1] == '{' ? "\n" : ",\n", s[last - 1] == '{' ? 1 : 2);
    quark_config(&b, p);
    buf_put(&b, "\n", 1);
    buf_put(&b, s + close, strlen(s + close));
    free(s);
    Json j;
    char err[256];
    if (json_parse(&j, b.s, b.n, err, sizeof err)) glm_fatal("internal error: rewritten config.json does not parse: %s", err);
    json_free(&j);
    return b.s;
}

static char *make_index(const Plan *p) {
    int n = 0;
    for (int s = 0; s < p->n_shards; s++) n += p->shards[s].n;
    char **lines = xmalloc((size_t)(n ? n : 1) * sizeof(char *));
    n = 0;
    for (int s = 0; s < p->n_shards; s++)
        for (int i = 0; i < p->shards[s].n; i++) {
            Buf b = {0};
            buf_put(&b, "    ", 4);
            buf_json_string(&b, p->shards[s].t[i].name);
            buf_put(&b, ": ", 2);
            buf_json_string(&b, p->shards[s].file);
            lines[n++] = b.s;
        }
    qsort(lines, (size_t)n, sizeof(char *), cmp_str);
    Buf b = {0};
    buf_printf(&b, "{\n  \"metadata\": {\n    \"total_size\": %zu\n  },\n  \"weight_map\": {\n", p->out_bytes);
    for (int i = 0; i < n; i++) {
        buf_printf(&b, "%s%s\n", lines[i], i + 1 < n ? "," : "");
        free(lines[i]);
    }
    buf_put(&b, "  }\n}\n", 6);
    free(lines);
    return b.s;
}

/* The checkpoint's own files are written by the converter; everything else at the top of
 * IN_DIR (tokenizer, generation config, chat template, README, ...) is copied as is. */
static int is_checkpoint_file(const char *name) {
    return ends_with(name, ".safetensors") || ends_with(name, ".safetensors.index.json") || !strcmp(name, "config.json");
}

static void copy_file(const char *src, OutFile *f) {
    int in = open(src, O_RDONLY);
    if (in < 0) glm_fatal("%s: cannot open: %s", src, strerror(errno));
    int out = out_file_create(f);
    static char buf[1 << 16];
    size_t off = 0;
    for (;;) {
        ssize_t r = read(in, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) glm_fatal("%s: read failed: %s", src, strerror(errno));
        if (r == 0) break;
        write_all(out, f, buf, (size_t)r, off);
        off += (size_t)r;
    }
    close(in);
    out_file_close(out, f);
}

/* Names of the regular files to copy from IN_DIR, sorted. */
static char **list_other_files(const char *dir, int *n) {
    DIR *d = opendir(dir);
    if (!d) glm_fatal("%s: cannot list: %s", dir, strerror(errno));
    char **names = NULL;
    *n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || is_checkpoint_file(e->d_name)) continue;
        char *path = xprintf("%s/%s", dir, e->d_name);
        struct stat st;
        int regular = stat(path, &st) == 0 && S_ISREG(st.st_mode);
        free(path);
        if (!regular) {
            fprintf(stderr, "glm: convert: not copying %s/%s (not a regular file)\n", dir, e->d_name);
            continue;
        }
        names = xrealloc(names, (size_t)(*n + 1) * sizeof(char *));
        names[(*n)++] = xstrdup(e->d_name);
    }
    closedir(d);
    if (*n) qsort(names, (size_t)*n, sizeof(char *), cmp_str);
    return names;
}

/* ======================================================================== */
/* 6. the command                                                           */

static void convert_usage(void) {
    fprintf(stderr,
            "usage: glm convert IN_DIR OUT_DIR [--attn] [--all-linear] [-t N] [--no-sync]\n"
            "  Writes OUT_DIR in AMD Quark's MXFP4 layout from a BF16 or FP8 checkpoint folder.\n"
            "  default       routed + shared experts become MXFP4 (as amd/GLM-5.2-MXFP4)\n"
            "  --attn        also the attention Linears (q_a, q_b, kv_a, kv_b, o_proj, indexer wq_b, wk)\n"
            "  --all-linear  also attention and the dense MLP\n"
            "  -t N          threads (default: all cores)\n"
            "  --no-sync     do not flush to disk before the final renames (faster; after a power\n"
            "                failure renamed files might be empty)\n"
            "  OUT_DIR must not exist yet, or be an empty folder.\n");
}

/* OUT_DIR must be new or empty, and not IN_DIR: a converter must never write into its input. */
static void check_out_dir(const char *in, const char *out) {
    struct stat si, so;
    if (stat(in, &si) != 0) glm_fatal("convert: input folder %s: %s", in, strerror(errno));
    if (!S_ISDIR(si.st_mode)) glm_fatal("convert: input %s is not a folder", in);
    if (stat(out, &so) != 0) {
        if (errno != ENOENT) glm_fatal("convert: output folder %s: %s", out, strerror(errno));
        return;
    }
    if (!S_ISDIR(so.st_mode)) glm_fatal("convert: output %s exists and is not a folder", out);
    if (so.st_dev == si.st_dev && so.st_ino == si.st_ino) glm_fatal("convert: output folder %s is the input folder", out);
    DIR *d = opendir(out);
    if (!d) glm_fatal("convert: output folder %s: %s", out, strerror(errno));
    struct dirent *e;
    int empty = 1;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = 0;
    closedir(d);
    if (!empty) glm_fatal("convert: output folder %s is not empty (choose a new folder)", out);
}

/* A conversion that cannot fit fails now, not hours later (fallocate still guards each file). */
static void check_free_space(const char *dir, size_t need) {
    struct statvfs v;
    if (statvfs(dir, &v) != 0) return; /* unknown: let the writes find out */
    double avail = (double)v.f_bavail * (double)v.f_frsize;
    if (avail < (double)need)
        glm_fatal("convert: %s: not enough free space: the output needs %.3f GB, %.3f GB are free", dir, need / 1e9, avail / 1e9);
}

/* Refuses inputs that are already quantized in another scheme than FP8. */
static void check_input_config(const char *path, const char *text, size_t len) {
    Json j;
    char err[256];
    if (json_parse(&j, text, len, err, sizeof err)) glm_fatal("%s: bad JSON: %s", path, err);
    const JsonValue *q = j.root->type == JSON_OBJECT ? json_get(j.root, "quantization_config") : NULL;
    if (q && q->type == JSON_OBJECT) {
        const JsonValue *m = json_get(q, "quant_method");
        if (!m || m->type != JSON_STRING || strcmp(m->str, "fp8"))
            glm_fatal("%s: quantization_config.quant_method is %s; convert reads BF16 or FP8 checkpoints", path,
                      m && m->type == JSON_STRING ? m->str : "missing");
    }
    json_free(&j);
}

int convert_main(int argc, char **argv) {
    Options o = {0};
    const char *in = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { convert_usage(); return 0; }
        else if (!strcmp(a, "--attn")) o.attn = 1;
        else if (!strcmp(a, "--all-linear")) o.dense = 1;
        else if (!strcmp(a, "--no-sync")) o.no_sync = 1;
        else if (!strcmp(a, "-t")) {
            char *end;
            long t = i + 1 < argc ? strtol(argv[++i], &end, 10) : 0;
            if (t < 1 || t > 1024 || *end) glm_fatal("convert: -t needs a thread count in [1, 1024]");
            o.threads = (int)t;
        } else if (a[0] == '-') glm_fatal("convert: unknown flag %s (see glm convert --help)", a);
        else if (!in) in = a;
        else if (!out) out = a;
        else glm_fatal("convert: unexpected argument '%s' (see glm convert --help)", a);
    }
    if (!in || !out) glm_fatal("convert: IN_DIR and OUT_DIR are required (see glm convert --help)");
    double t0 = now_s();
#ifdef _OPENMP
    if (o.threads) omp_set_num_threads(o.threads);
    int n_threads = omp_get_max_threads();
#else
    int n_threads = 1;
#endif
    for (int i = 0; i < 256; i++) /* the vectorizable decoder agrees with glm.c's definition */
        if (memcmp(&(float){fp8_value((uint8_t)i)}, &(float){fp8_e4m3_to_f32((uint8_t)i)}, 4) && !isnan(fp8_value((uint8_t)i)))
            glm_fatal("internal error: FP8 decoder disagrees with fp8_e4m3_to_f32 at %#x", i);

    /* everything that can be checked is checked before OUT_DIR is touched */
    check_out_dir(in, out);
    char *cfg_path = xprintf("%s/config.json", in);
    size_t cfg_len;
    char *cfg_text = read_text(cfg_path, &cfg_len);
    check_input_config(cfg_path, cfg_text, cfg_len);
    Config cfg;
    config_load(&cfg, in);
    Checkpoint ck;
    checkpoint_open(&ck, in);
    Plan plan;
    plan_tensors(&plan, &ck, &cfg, &o);
    for (int s = 0; s < plan.n_shards; s++)
        if (plan.shards[s].n) plan_layout(&plan, &plan.shards[s]);
    char *config = make_config(cfg_text, &plan);
    char *index_path = xprintf("%s/model.safetensors.index.json", in);
    int has_index = access(index_path, F_OK) == 0;
    int n_other;
    char **other = list_other_files(in, &n_other);

    /* OUT_DIR: create it, register every output file, clean up on failure or signal */
    g_out.dir = out;
    g_out.cap = plan.n_shards + n_other + 2;
    g_out.f = xmalloc((size_t)g_out.cap * sizeof(OutFile));
    if (mkdir(out, 0755) == 0) g_out.created_dir = 1;
    else if (errno != EEXIST) glm_fatal("convert: cannot create output folder %s: %s", out, strerror(errno));
    glm_fatal_cleanup = remove_partial_output;
    size_t need = strlen(config);
    for (int s = 0; s < plan.n_shards; s++) need += plan.shards[s].header.n + plan.shards[s].data_size;
    for (int i = 0; i < n_other; i++) {
        struct stat st;
        char *src = xprintf("%s/%s", in, other[i]);
        if (stat(src, &st) == 0) need += (size_t)st.st_size;
        free(src);
    }
    check_free_space(out, need);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);
    OutFile *f_config = out_file_add("config.json");
    out_file_write(f_config, config, strlen(config));
    for (int i = 0; i < n_other; i++) {
        char *src = xprintf("%s/%s", in, other[i]);
        copy_file(src, out_file_add(other[i]));
        free(src);
    }

    /* the shards, streamed */
    int *in_fd = xmalloc((size_t)ck.n_shards * sizeof(int));
    for (int s = 0; s < ck.n_shards; s++) {
        in_fd[s] = open(ck.shards[s].path, O_RDONLY);
        if (in_fd[s] < 0) glm_fatal("%s: cannot open: %s", ck.shards[s].path, strerror(errno));
    }
    Stream st = {0};
    st.ck = &ck;
    st.in_fd = in_fd;
    st.scratch = calloc((size_t)n_threads, sizeof(Scratch));
    if (!st.scratch) glm_fatal("out of memory");
    st.total = plan.in_bytes;
    st.t0 = now_s();
    for (int s = 0; s < plan.n_shards; s++) st.tensors_total += plan.shards[s].n;
    for (int s = 0; s < plan.n_shards; s++)
        if (plan.shards[s].n) write_shard(&st, &plan, &plan.shards[s], out_file_add(plan.shards[s].file));
    show_progress(&st, 1);
    double t_stream = now_s() - st.t0;
    if (has_index) {
        char *index = make_index(&plan);
        out_file_write(out_file_add("model.safetensors.index.json"), index, strlen(index));
        free(index);
    }

    /* all complete: flush, rename, config.json last (a folder with config.json is a finished one) */
    if (!o.no_sync) out_sync(out);
    for (int i = 0; i < g_out.n; i++) {
        OutFile *f = &g_out.f[(i + 1) % g_out.n]; /* entry 0 is config.json */
        if (rename(f->tmp, f->final) != 0) glm_fatal("%s: rename to %s failed: %s", f->tmp, f->final, strerror(errno));
        f->state = 2;
    }
    glm_fatal_cleanup = NULL;
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    fprintf(stderr,
            "glm: convert: %s -> %s: %d weights to MXFP4, %d FP8 weights to BF16, %d tensors copied, "
            "%d Linears kept (input width not a multiple of 32); %.2f GB -> %.2f GB; %.2f s (%.2f GB/s of input), %d threads\n",
            in, out, plan.n_mx, plan.n_fp8_bf16, plan.n_copy, plan.n_narrow, plan.in_bytes / 1e9, plan.out_bytes / 1e9,
            now_s() - t0, t_stream > 0 ? plan.in_bytes / 1e9 / t_stream : 0.0, n_threads);

    /* release everything (keeps the sanitizer runs clean) */
    for (int s = 0; s < ck.n_shards; s++) close(in_fd[s]);
    free(in_fd);
    for (int t = 0; t < n_threads; t++) { free(st.scratch[t].in); free(st.scratch[t].out); free(st.scratch[t].row); }
    free(st.scratch);
    for (int s = 0; s < plan.n_shards; s++) {
        for (int i = 0; i < plan.shards[s].n; i++) free(plan.shards[s].t[i].name);
        free(plan.shards[s].t);
        free(plan.shards[s].header.s);
    }
    free(plan.shards);
    free(plan.pair_scale_offset);
    for (int i = 0; i < plan.n_exclude; i++) free(plan.exclude[i]);
    free(plan.exclude);
    for (int i = 0; i < n_other; i++) free(other[i]);
    free(other);
    for (int i = 0; i < g_out.n; i++) { free(g_out.f[i].tmp); free(g_out.f[i].final); }
    free(g_out.f);
    memset(&g_out, 0, sizeof g_out);
    free(index_path); free(config); free(cfg_text); free(cfg_path);
    checkpoint_close(&ck);
    return 0;
}
