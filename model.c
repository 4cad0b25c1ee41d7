/* model.c - a GLM-5.2 checkpoint folder as the Model of glm.h: used by the program
 * (glm.c, cli.c) and the tools (tools/convert.c, tools/synth.c) alike.
 *
 * Read top to bottom:
 *   0. errors, memory and small utilities
 *   1. numbers: bf16, FP8 E4M3, MXFP4 (E2M1 + E8M0) decoding
 *   2. safetensors shards and the checkpoint index (mmap, every header checked)
 *   3. config.json
 *   4. the model: every tensor found, its format, dtype and shape checked
 *
 * Section numbers (§) refer to docs/MODEL.md; formats to docs/FORMATS.md.
 */
#define _GNU_SOURCE
#include "glm.h"
#include "json.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ======================================================================== */
/* 0. errors and small utilities                                            */

/* Every user-facing failure ends here: one line on stderr, exit code 1. The
 * command that writes an output file registers it (glm_fatal_unlink) so a failure
 * never leaves a half-written file behind. */
static const char *g_partial_output;
void (*glm_fatal_cleanup)(void);

void glm_fatal_unlink(const char *path) { g_partial_output = path; }

void glm_fatal(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *p = msg; *p; p++)
        if (*p == '\n') *p = ' ';
    fflush(stdout);
    fprintf(stderr, "glm: error: %s\n", msg);
    if (g_partial_output) unlink(g_partial_output);
    if (glm_fatal_cleanup) glm_fatal_cleanup();
    exit(1);
}

/* Big buffers (activations of a prompt chunk, the KV cache, panels) are asked onto 2 MB
 * pages where the kernel has transparent huge pages in "madvise" mode (Debian's default):
 * a prompt chunk walks tens of MB of them, and on 4 KB pages the TLB misses (two-level
 * walks in a VM) cost ~7% of a 512-token prefill here (THP "always" vs "madvise", same
 * binary, alternating). Only whole 2 MB ranges inside the buffer become huge pages. */
static void *hint_huge_pages(void *p, size_t n) {
    if (p && n >= ((size_t)4 << 20)) {
        uintptr_t lo = ((uintptr_t)p + 4095) & ~(uintptr_t)4095, hi = ((uintptr_t)p + n) & ~(uintptr_t)4095;
        madvise((void *)lo, hi - lo, MADV_HUGEPAGE); /* a hint: failure leaves 4 KB pages */
    }
    return p;
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) glm_fatal("out of memory allocating %zu bytes", n);
    return hint_huge_pages(p, n);
}

void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) glm_fatal("out of memory allocating %zu x %zu bytes", n, size);
    return hint_huge_pages(p, n * size);
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = xmalloc(a + b + 2);
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A progress bar on stderr, only when stderr is a terminal (logs stay clean). */
void progress(const char *what, size_t done, size_t total, double t0) {
    static int tty = -1;
    if (tty < 0) tty = isatty(2);
    if (!tty || total == 0) return;
    int width = 30, fill = (int)((double)done / (double)total * width);
    double dt = now_s() - t0;
    fprintf(stderr, "\r%s [", what);
    for (int i = 0; i < width; i++) fputc(i < fill ? '#' : '.', stderr);
    fprintf(stderr, "] %5.1f%% %.2f GB %.2f GB/s", 100.0 * (double)done / (double)total, done / 1e9,
            dt > 0 ? done / 1e9 / dt : 0.0);
    if (done >= total) fputc('\n', stderr);
    fflush(stderr);
}

/* ======================================================================== */
/* 1. numbers                                                               */

float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_bf16(float f) { /* round to nearest even; NaN stays NaN */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* E2M1: sign bit 3, two exponent bits, one mantissa bit (docs/FORMATS.md §1.1). */
const float e2m1_value[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                              -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* E8M0: 2^(s-127); 255 is NaN. s = 0 is an fp32 subnormal, so use ldexpf. */
float e8m0_to_f32(uint8_t s) { return s == 255 ? NAN : ldexpf(1.0f, (int)s - 127); }

/* OCP E4M3FN: bias 7, no infinities, S.1111.111 is NaN, max 448. */
float fp8_e4m3_to_f32(uint8_t b) {
    int sign = b >> 7, exp = (b >> 3) & 15, man = b & 7;
    float v;
    if (exp == 15 && man == 7) v = NAN;
    else if (exp == 0) v = ldexpf((float)man / 8.0f, -6);
    else v = ldexpf(1.0f + (float)man / 8.0f, exp - 7);
    return sign ? -v : v;
}

float fp8_table[256], e8m0_table[256];

void number_tables_init(void) {
    for (int i = 0; i < 256; i++) {
        fp8_table[i] = fp8_e4m3_to_f32((uint8_t)i);
        e8m0_table[i] = e8m0_to_f32((uint8_t)i);
    }
}

/* Row r of W as fp32: the plain decoding of each format, the definition the fast
 * kernels are tested against. */
void mat_dequant_row(const Mat *W, int r, float *out) {
    const int n = W->cols;
    switch (W->fmt) {
    case WF_F32: memcpy(out, (const float *)W->w + (size_t)r * n, (size_t)n * sizeof(float)); break;
    case WF_BF16: {
        const uint16_t *w = (const uint16_t *)W->w + (size_t)r * n;
        for (int i = 0; i < n; i++) out[i] = bf16_to_f32(w[i]);
        break;
    }
    case WF_FP8: { /* one fp32 multiplier per 128x128 block */
        const uint8_t *w = W->w + (size_t)r * n;
        const float *scale = W->fp8_scale + (size_t)(r / 128) * ((n + 127) / 128);
        for (int i = 0; i < n; i++) out[i] = fp8_table[w[i]] * scale[i / 128];
        break;
    }
    case WF_MXFP4: { /* 32 E2M1 nibbles (16 bytes, element 2i in the low nibble) share one E8M0 exponent */
        const uint8_t *w = W->w + (size_t)r * (n / 2);
        const uint8_t *scale = W->mx_scale + (size_t)r * (n / 32);
        for (int i = 0; i < n / 2; i++) {
            float s = e8m0_table[scale[i / 16]];
            out[2 * i] = e2m1_value[w[i] & 15] * s;
            out[2 * i + 1] = e2m1_value[w[i] >> 4] * s;
        }
        break;
    }
    }
}

/* ======================================================================== */
/* 2. safetensors shards and the checkpoint                                 */
/*
 * Every check on the checkpoint's files is a pure function over bytes already in
 * memory: it returns 0, or -1 with a one-line message in the caller's err buffer
 * (the text the CLI prints after "glm: error: ") after freeing whatever it
 * allocated. The fuzz targets (fuzz/) call them in-process; the CLI wrappers below
 * (shard_open, checkpoint_open, config_load) do the file I/O and glm_fatal. */

/* Formats into err[errlen]; always returns -1, so a check can `return errf(...)`. */
static int errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int errf(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static size_t dtype_size(const char *dt) {
    static const struct { const char *name; size_t size; } t[] = {
        {"F64", 8}, {"I64", 8}, {"U64", 8}, {"F32", 4}, {"I32", 4}, {"U32", 4},
        {"BF16", 2}, {"F16", 2}, {"I16", 2}, {"U16", 2}, {"U8", 1}, {"I8", 1},
        {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
        {"F8_E4M3FNUZ", 1}, {"F8_E5M2FNUZ", 1}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(dt, t[i].name)) return t[i].size;
    return 0;
}

static uint64_t name_hash(const char *s) { /* FNV-1a */
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

const TensorInfo *checkpoint_find(const Checkpoint *ck, const char *name) {
    if (!ck->table_size) return NULL;
    for (uint64_t i = name_hash(name) & (uint64_t)(ck->table_size - 1);; i = (i + 1) & (uint64_t)(ck->table_size - 1)) {
        int t = ck->table[i];
        if (t < 0) return NULL;
        if (!strcmp(ck->tensors[t].name, name)) return &ck->tensors[t];
    }
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static uint64_t read_u64le(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* By start offset, then size, then header order: deterministic messages. */
static int cmp_tensor_offset(const void *a, const void *b) {
    const TensorInfo *x = *(const TensorInfo *const *)a, *y = *(const TensorInfo *const *)b;
    if (x->data != y->data) return x->data < y->data ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return x < y ? -1 : x > y;
}

static void tensors_free(TensorInfo *t, int n) {
    for (int i = 0; i < n; i++) free(t[i].name);
    free(t);
}

/* Checks one safetensors file file[0..size) (named path in messages) and returns its
 * tensors (malloc'd array, malloc'd names, data pointing into file, shard 0). Every
 * number in the header is checked before it is used: the header length against the
 * file, each tensor's byte range against the data section, its size against dtype x
 * shape (in overflow-safe arithmetic), and ranges against each other (no overlaps;
 * zero-byte tensors occupy nothing). */
int safetensors_parse_header(const uint8_t *file, size_t size, const char *path,
                             TensorInfo **tensors, int *n_tensors, char *err, size_t errlen) {
    *tensors = NULL;
    *n_tensors = 0;
    if (size < 8) return errf(err, errlen, "%s: truncated: %zu bytes, shorter than the 8-byte header length", path, size);
    uint64_t hlen = read_u64le(file);
    if (hlen > size - 8)
        return errf(err, errlen, "%s: header length %llu runs past the end of the file (%zu bytes)", path, (unsigned long long)hlen, size);
    if (hlen > 100000000)
        return errf(err, errlen, "%s: header length %llu is larger than the 100 MB safetensors limit", path, (unsigned long long)hlen);
    const uint8_t *data = file + 8 + hlen;
    size_t data_size = size - 8 - (size_t)hlen;

    Json j;
    char jerr[256];
    if (json_parse(&j, (const char *)file + 8, (size_t)hlen, jerr, sizeof jerr))
        return errf(err, errlen, "%s: bad JSON in the safetensors header: %s", path, jerr);
    TensorInfo *ts = NULL;
    const TensorInfo **order = NULL;
    int n = 0;
#define FAIL(...) do { errf(err, errlen, __VA_ARGS__); goto fail; } while (0)
    if (j.root->type != JSON_OBJECT) FAIL("%s: safetensors header is not a JSON object", path);
    ts = calloc(j.root->n + 1, sizeof *ts);
    if (!ts) FAIL("out of memory");
    for (const JsonValue *t = j.root->child; t; t = t->next) {
        if (strlen(t->key) != t->key_len) FAIL("%s: tensor name with a NUL byte", path);
        if (!strcmp(t->key, "__metadata__")) continue;
        const JsonValue *dt = json_get(t, "dtype"), *shape = json_get(t, "shape"), *off = json_get(t, "data_offsets");
        if (t->type != JSON_OBJECT || !dt || dt->type != JSON_STRING || !shape || shape->type != JSON_ARRAY ||
            !off || off->type != JSON_ARRAY || off->n != 2)
            FAIL("%s: tensor %s: header entry needs dtype, shape and two data_offsets", path, t->key);
        TensorInfo *ti = &ts[n];
        size_t esize = dtype_size(dt->str);
        if (!esize || dt->str_len >= sizeof ti->dtype) FAIL("%s: tensor %s: unknown dtype %s", path, t->key, dt->str);
        strcpy(ti->dtype, dt->str);
        if (shape->n > 8) FAIL("%s: tensor %s: %zu dimensions (at most 8 supported)", path, t->key, shape->n);
        uint64_t numel = 1;
        for (const JsonValue *d = shape->child; d; d = d->next) {
            if (d->type != JSON_NUMBER || !d->is_uint || d->u64 > INT64_MAX)
                FAIL("%s: tensor %s: shape entries must be non-negative integers", path, t->key);
            if (d->u64 && numel > UINT64_MAX / d->u64) FAIL("%s: tensor %s: shape overflows 64-bit arithmetic", path, t->key);
            numel *= d->u64;
            ti->shape[ti->ndim++] = (int64_t)d->u64;
        }
        if (numel > UINT64_MAX / esize) FAIL("%s: tensor %s: size overflows 64-bit arithmetic", path, t->key);
        const JsonValue *b = off->child, *e = b->next;
        if (b->type != JSON_NUMBER || !b->is_uint || e->type != JSON_NUMBER || !e->is_uint)
            FAIL("%s: tensor %s: data_offsets must be non-negative integers that fit 64 bits", path, t->key);
        if (b->u64 > e->u64)
            FAIL("%s: tensor %s: data_offsets [%llu, %llu] end before they begin", path, t->key,
                 (unsigned long long)b->u64, (unsigned long long)e->u64);
        if (e->u64 > data_size)
            FAIL("%s: tensor %s: data_offsets end %llu past the end of the file (data section is %zu bytes; truncated?)",
                 path, t->key, (unsigned long long)e->u64, data_size);
        if (e->u64 - b->u64 != numel * esize)
            FAIL("%s: tensor %s: %llu bytes of data but dtype %s x shape needs %llu", path, t->key,
                 (unsigned long long)(e->u64 - b->u64), ti->dtype, (unsigned long long)(numel * esize));
        ti->name = strdup(t->key);
        if (!ti->name) FAIL("out of memory");
        ti->data = data + b->u64;
        ti->nbytes = (size_t)(e->u64 - b->u64);
        n++;
    }

    /* Overlap check: the non-empty tensors sorted by start offset. */
    order = malloc((size_t)(n + 1) * sizeof *order);
    if (!order) FAIL("out of memory");
    int m = 0;
    for (int i = 0; i < n; i++)
        if (ts[i].nbytes) order[m++] = &ts[i];
    qsort(order, (size_t)m, sizeof *order, cmp_tensor_offset);
    for (int i = 1; i < m; i++)
        if (order[i]->data < order[i - 1]->data + order[i - 1]->nbytes)
            FAIL("%s: tensors %s and %s have overlapping data_offsets", path, order[i - 1]->name, order[i]->name);
    free(order);
    json_free(&j);
    *tensors = ts;
    *n_tensors = n;
    return 0;
fail:
    free(order);
    if (ts) tensors_free(ts, n + 1); /* ts[n] may hold a name being filled in: calloc'd, so NULL or set */
    json_free(&j);
    return -1;
#undef FAIL
}

/* Checks the shard map[0..size) and appends it and its tensors to ck, which then owns
 * map (checkpoint_close munmaps it). On failure ck is unchanged and map still the caller's. */
int checkpoint_add_shard(Checkpoint *ck, const char *path, const uint8_t *map, size_t size, char *err, size_t errlen) {
    TensorInfo *ts;
    int n;
    if (safetensors_parse_header(map, size, path, &ts, &n, err, errlen)) return -1;
    Shard *shards = realloc(ck->shards, (size_t)(ck->n_shards + 1) * sizeof *shards);
    if (shards) ck->shards = shards;
    TensorInfo *all = shards ? realloc(ck->tensors, (size_t)(ck->n_tensors + n + 1) * sizeof *all) : NULL;
    if (all) ck->tensors = all;
    char *p = all ? strdup(path) : NULL;
    if (!p) {
        tensors_free(ts, n);
        return errf(err, errlen, "out of memory");
    }
    uint64_t hlen = read_u64le(map);
    Shard *sh = &ck->shards[ck->n_shards];
    sh->path = p;
    sh->map = map;
    sh->size = size;
    sh->map_base = (void *)map; /* shard_open changes these for --no-mmap */
    sh->map_len = size;
    sh->data = map + 8 + hlen;
    sh->data_size = size - 8 - (size_t)hlen;
    for (int i = 0; i < n; i++) {
        ts[i].shard = ck->n_shards;
        ck->tensors[ck->n_tensors + i] = ts[i];
    }
    free(ts); /* the names moved to ck */
    ck->n_tensors += n;
    ck->n_shards++;
    return 0;
}

/* The name -> tensor hash table; a name twice (in one shard or two) is an error. */
int checkpoint_build_table(Checkpoint *ck, char *err, size_t errlen) {
    int size = 16;
    while (size < ck->n_tensors * 2) size *= 2;
    free(ck->table);
    ck->table_size = 0;
    ck->table = malloc((size_t)size * sizeof(int));
    if (!ck->table) return errf(err, errlen, "out of memory");
    for (int i = 0; i < size; i++) ck->table[i] = -1;
    ck->table_size = size;
    for (int t = 0; t < ck->n_tensors; t++) {
        uint64_t i = name_hash(ck->tensors[t].name) & (uint64_t)(size - 1);
        while (ck->table[i] >= 0) {
            const TensorInfo *o = &ck->tensors[ck->table[i]];
            if (!strcmp(o->name, ck->tensors[t].name))
                return errf(err, errlen, "%s: tensor %s appears twice (also in %s)", ck->shards[ck->tensors[t].shard].path,
                            o->name, ck->shards[o->shard].path);
            i = (i + 1) & (uint64_t)(size - 1);
        }
        ck->table[i] = t;
    }
    return 0;
}

void shard_index_free(ShardIndex *ix) {
    for (int i = 0; i < ix->n_files; i++) free(ix->files[i]);
    for (int i = 0; i < ix->n_names; i++) free(ix->names[i]);
    free(ix->files); free(ix->names); free(ix->file_of);
    memset(ix, 0, sizeof *ix);
}

/* model.safetensors.index.json: its weight_map must be an object of file names inside
 * the folder; collects the distinct files (in order of first mention) and the entries. */
int shard_index_parse(ShardIndex *ix, const char *text, size_t len, const char *path, char *err, size_t errlen) {
    memset(ix, 0, sizeof *ix);
    Json j;
    char jerr[256];
    if (json_parse(&j, text, len, jerr, sizeof jerr)) return errf(err, errlen, "%s: bad JSON: %s", path, jerr);
#define FAIL(...) do { errf(err, errlen, __VA_ARGS__); goto fail; } while (0)
    const JsonValue *wm = json_get(j.root, "weight_map");
    if (!wm || wm->type != JSON_OBJECT) FAIL("%s: no weight_map object", path);
    ix->files = malloc((wm->n + 1) * sizeof *ix->files);
    ix->names = malloc((wm->n + 1) * sizeof *ix->names);
    ix->file_of = malloc((wm->n + 1) * sizeof *ix->file_of);
    if (!ix->files || !ix->names || !ix->file_of) FAIL("out of memory");
    for (const JsonValue *e = wm->child; e; e = e->next) {
        if (e->type != JSON_STRING) FAIL("%s: weight_map[%s] is not a file name", path, e->key);
        if (strchr(e->str, '/') || !strcmp(e->str, "..")) FAIL("%s: weight_map[%s] names %s outside the folder", path, e->key, e->str);
        int f = 0;
        while (f < ix->n_files && strcmp(ix->files[f], e->str)) f++;
        if (f == ix->n_files) {
            if (!(ix->files[f] = strdup(e->str))) FAIL("out of memory");
            ix->n_files++;
        }
        if (!(ix->names[ix->n_names] = strdup(e->key))) FAIL("out of memory");
        ix->file_of[ix->n_names++] = f;
    }
#undef FAIL
    json_free(&j);
    return 0;
fail:
    json_free(&j);
    shard_index_free(ix);
    return -1;
}

/* Every name in the index must be in the shard it names (ck's table built). */
int shard_index_check(const Checkpoint *ck, const ShardIndex *ix, const char *path, char *err, size_t errlen) {
    for (int i = 0; i < ix->n_names; i++) {
        const TensorInfo *t = checkpoint_find(ck, ix->names[i]);
        const char *file = ix->files[ix->file_of[i]];
        if (!t || strcmp(base_name(ck->shards[t->shard].path), file))
            return errf(err, errlen, "%s: tensor %s is listed in %s but not found in that shard", file, ix->names[i], path);
    }
    return 0;
}

/* --no-mmap: read each shard into anonymous memory on 2 MB pages instead of mapping the
 * file. It costs a copy of the checkpoint in RAM and the load time, and buys decode
 * speed: a token reads every weight once, and over GBs of 4 KB pages the TLB misses
 * (two-level page walks in a VM) cost a good part of the bandwidth (llama.cpp has the
 * same switch). The page cache may keep its own copy; the kernel drops it under pressure. */
int g_no_mmap;
#define HUGE_PAGE ((size_t)2 << 20)

static const uint8_t *read_into_huge_pages(int fd, const char *path, size_t size, void **base, size_t *len) {
    /* the file starts a few bytes in so that its data section (after the 8-byte length and
     * the JSON header) is 64-byte aligned: HF writers align it to 8 only, and a vector
     * load that straddles two cache lines costs two */
    uint8_t head[8];
    size_t pad = 0;
    if (pread(fd, head, 8, 0) == 8) {
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; i--) hlen = hlen << 8 | head[i];
        pad = (64 - (size_t)((8 + hlen) % 64)) % 64;
    }
    *len = (size + pad + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    uint8_t *raw = mmap(NULL, *len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) glm_fatal("%s: --no-mmap: cannot allocate %.2f GB: %s", path, size / 1e9, strerror(errno));
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (p > raw) munmap(raw, (size_t)(p - raw)); /* keep exactly [p, p + len): 2 MB aligned */
    munmap(p + *len, HUGE_PAGE - (size_t)(p - raw));
    madvise(p, *len, MADV_HUGEPAGE); /* a hint: without THP this is plain memory */
    double t0 = now_s();
    for (size_t got = 0; got < size;) {
        size_t want = size - got < ((size_t)64 << 20) ? size - got : ((size_t)64 << 20);
        ssize_t r = pread(fd, p + pad + got, want, (off_t)got);
        if (r <= 0) glm_fatal("%s: read failed at byte %zu: %s", path, got, r < 0 ? strerror(errno) : "unexpected end of file");
        got += (size_t)r;
        if (size > ((size_t)256 << 20)) progress("loading", got, size, t0);
    }
    mprotect(p, *len, PROT_READ);
    *base = p;
    return p + pad;
}

/* Maps one shard file of the checkpoint folder and appends it (CLI: errors are fatal). */
static void shard_open(Checkpoint *ck, const char *file) {
    char *path = path_join(ck->dir, file);
    int fd = open(path, O_RDONLY);
    if (fd < 0) glm_fatal("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) glm_fatal("%s: not a regular file", path);
    size_t size = (size_t)st.st_size, map_len = size;
    const uint8_t *map = NULL;
    void *map_base = NULL;
    if (size >= 8 && g_no_mmap) map = read_into_huge_pages(fd, path, size, &map_base, &map_len);
    else if (size >= 8) { /* shorter: checkpoint_add_shard says "truncated" */
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) glm_fatal("%s: mmap failed: %s", path, strerror(errno));
        map_base = (void *)map;
        /* a hint: pages this mapping faults in from disk are read as 2 MB folios and
         * mapped by one TLB entry each (filesystems with large folios, Linux >= 6.x);
         * pages already cached stay as they were cached (see README, Performance) */
        madvise(map_base, size, MADV_HUGEPAGE);
    }
    close(fd);
    char err[1024];
    if (checkpoint_add_shard(ck, path, map, size, err, sizeof err)) glm_fatal("%s", err);
    ck->shards[ck->n_shards - 1].map_base = map_base;
    ck->shards[ck->n_shards - 1].map_len = map_len;
    free(path);
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0, r;
    do {
        if (cap - n < 65536) {
            cap = cap ? cap * 2 : 65536;
            buf = realloc(buf, cap);
            if (!buf) glm_fatal("out of memory reading %s", path);
        }
        r = fread(buf + n, 1, cap - n, f);
        n += r;
    } while (r > 0);
    int bad = ferror(f);
    fclose(f);
    if (bad) glm_fatal("%s: read error", path);
    *len = n;
    return buf;
}

/* Opens a checkpoint folder: either one model.safetensors, or the shards listed by
 * model.safetensors.index.json. Every name in the index must be in the shard it names. */
void checkpoint_open(Checkpoint *ck, const char *dir) {
    memset(ck, 0, sizeof *ck);
    ck->dir = xstrdup(dir);
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) glm_fatal("-m %s: no such model folder", dir);
    char *index_path = path_join(dir, "model.safetensors.index.json");
    char err[1024];
    size_t len;
    char *text = read_file(index_path, &len);
    if (!text) {
        char *single = path_join(dir, "model.safetensors");
        if (access(single, R_OK) != 0)
            glm_fatal("%s: no model.safetensors.index.json and no model.safetensors in this folder", dir);
        free(single);
        shard_open(ck, "model.safetensors");
        if (checkpoint_build_table(ck, err, sizeof err)) glm_fatal("%s", err);
        free(index_path);
        return;
    }
    ShardIndex ix;
    if (shard_index_parse(&ix, text, len, index_path, err, sizeof err)) glm_fatal("%s", err);
    for (int f = 0; f < ix.n_files; f++) { /* each distinct shard once, in order of first mention */
        char *sp = path_join(dir, ix.files[f]);
        if (access(sp, F_OK) != 0) glm_fatal("%s: names shard %s, which is missing", index_path, ix.files[f]);
        free(sp);
        shard_open(ck, ix.files[f]);
    }
    if (checkpoint_build_table(ck, err, sizeof err) || shard_index_check(ck, &ix, index_path, err, sizeof err))
        glm_fatal("%s", err);
    shard_index_free(&ix);
    free(text);
    free(index_path);
}

void checkpoint_close(Checkpoint *ck) {
    for (int s = 0; s < ck->n_shards; s++) {
        if (ck->shards[s].map_base) munmap(ck->shards[s].map_base, ck->shards[s].map_len);
        free(ck->shards[s].path);
    }
    for (int t = 0; t < ck->n_tensors; t++) free(ck->tensors[t].name);
    free(ck->shards); free(ck->tensors); free(ck->table); free(ck->dir);
    memset(ck, 0, sizeof *ck);
}

/* ======================================================================== */
/* 3. config.json                                                           */

/* The first error wins (sticky); after it, the helpers return in-range defaults so
 * the rest of config_parse runs on safe values and its own errors are dropped. */
typedef struct {
    const char *path;
    const JsonValue *root;
    char *err; size_t errlen;
    int failed;
} ConfigFile;

static void cfg_fail(ConfigFile *cf, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void cfg_fail(ConfigFile *cf, const char *fmt, ...) {
    if (cf->failed) return;
    cf->failed = 1;
    if (cf->err && cf->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(cf->err, cf->errlen, fmt, ap);
        va_end(ap);
    }
}

static const JsonValue *cfg_field(ConfigFile *cf, const char *key, int required) {
    const JsonValue *v = json_get(cf->root, key);
    if (v && v->type == JSON_NULL) v = NULL;
    if (!v && required) cfg_fail(cf, "%s: missing field %s", cf->path, key);
    return v;
}

static double cfg_number(ConfigFile *cf, const char *key, int required, double dflt) {
    const JsonValue *v = cfg_field(cf, key, required);
    if (!v) return dflt;
    if (v->type != JSON_NUMBER && v->type != JSON_BOOL) {
        cfg_fail(cf, "%s: field %s must be a number", cf->path, key);
        return dflt;
    }
    return v->num;
}

/* An integer in [min, max] (min <= max), or min after an error. */
static int cfg_int(ConfigFile *cf, const char *key, int required, double dflt, int min, int max) {
    double d = cfg_number(cf, key, required, dflt);
    if (d != floor(d) || d < min || d > max) {
        cfg_fail(cf, "%s: field %s = %g is out of range [%d, %d]", cf->path, key, d, min, max);
        return min;
    }
    return (int)d;
}

/* The ceiling of a width or count that config.json bounds only by sanity. */
enum { CFG_BIG = 1 << 30 };

/* The widths of attention and of the indexer. qk_head_dim is redundant: if present it
 * must agree (head_dim is a wrong legacy field, §7.5). */
static void config_widths(ConfigFile *cf, Config *c) {
    c->vocab_size = cfg_int(cf, "vocab_size", 1, 0, 1, CFG_BIG);
    c->hidden = cfg_int(cf, "hidden_size", 1, 0, 1, CFG_BIG);
    c->n_layers = cfg_int(cf, "num_hidden_layers", 1, 0, 1, GLM_MAX_LAYERS - 1);
    c->n_mtp = cfg_int(cf, "num_nextn_predict_layers", 0, 0, 0, 1);
    c->n_heads = cfg_int(cf, "num_attention_heads", 1, 0, 1, 4096);
    c->q_lora_rank = cfg_int(cf, "q_lora_rank", 1, 0, 1, CFG_BIG);
    c->kv_lora_rank = cfg_int(cf, "kv_lora_rank", 1, 0, 1, CFG_BIG);
    c->qk_nope = cfg_int(cf, "qk_nope_head_dim", 1, 0, 0, CFG_BIG);
    c->qk_rope = cfg_int(cf, "qk_rope_head_dim", 1, 0, 2, CFG_BIG);
    c->v_head = cfg_int(cf, "v_head_dim", 1, 0, 1, CFG_BIG);
    long long qk_sum = (long long)c->qk_nope + c->qk_rope;
    int qk_head = cfg_int(cf, "qk_head_dim", 0, (double)qk_sum, 1, CFG_BIG);
    if (qk_head != qk_sum)
        cfg_fail(cf, "%s: inconsistent config: qk_head_dim %d != qk_nope_head_dim %d + qk_rope_head_dim %d", cf->path, qk_head, c->qk_nope, c->qk_rope);
    if (c->qk_rope % 2) cfg_fail(cf, "%s: qk_rope_head_dim must be even", cf->path);
    c->index_n_heads = cfg_int(cf, "index_n_heads", 1, 0, 1, 4096);
    c->index_head_dim = cfg_int(cf, "index_head_dim", 1, 0, 1, CFG_BIG);
    c->index_topk = cfg_int(cf, "index_topk", 1, 0, 1, CFG_BIG);
    if (c->index_head_dim < c->qk_rope)
        cfg_fail(cf, "%s: inconsistent config: index_head_dim %d < qk_rope_head_dim %d", cf->path, c->index_head_dim, c->qk_rope);
}

/* The experts and their router: how many, how wide, and the group-limited top-k, whose
 * groups must divide the experts and hold enough of them for num_experts_per_tok. */
static void config_experts(ConfigFile *cf, Config *c) {
    c->n_experts = cfg_int(cf, "n_routed_experts", 1, 0, 1, 1 << 16);
    c->n_active = cfg_int(cf, "num_experts_per_tok", 1, 0, 1, c->n_experts);
    c->n_shared = cfg_int(cf, "n_shared_experts", 0, 0, 0, 64);
    c->moe_inter = cfg_int(cf, "moe_intermediate_size", 1, 0, 1, CFG_BIG);
    c->dense_inter = cfg_int(cf, "intermediate_size", 1, 0, 1, CFG_BIG);
    c->n_group = cfg_int(cf, "n_group", 0, 1, 1, c->n_experts);
    c->topk_group = cfg_int(cf, "topk_group", 0, c->n_group, 1, c->n_group);
    if (c->n_experts % c->n_group)
        cfg_fail(cf, "%s: inconsistent config: n_routed_experts %d not divisible by n_group %d", cf->path, c->n_experts, c->n_group);
    if (c->n_group > 1 && c->n_experts / c->n_group < 2)
        cfg_fail(cf, "%s: inconsistent config: group-limited routing needs >= 2 experts per group", cf->path);
    if (c->n_active > c->topk_group * (c->n_experts / c->n_group))
        cfg_fail(cf, "%s: inconsistent config: num_experts_per_tok %d exceeds the experts in topk_group groups", cf->path, c->n_active);
    c->norm_topk_prob = cfg_number(cf, "norm_topk_prob", 0, 1) != 0;
    c->routed_scale = (float)cfg_number(cf, "routed_scaling_factor", 0, 1.0);
}

/* The remaining scalars, and two fields GLM-5 fixes: a config that says otherwise
 * describes a model this code would run wrongly, so it is refused. */
static void config_scalars(ConfigFile *cf, Config *c) {
    c->rms_eps = (float)cfg_number(cf, "rms_norm_eps", 0, 1e-5);
    c->max_pos = cfg_int(cf, "max_position_embeddings", 0, CFG_BIG, 1, CFG_BIG);
    c->index_share_mtp = cfg_number(cf, "index_share_for_mtp_iteration", 0, 0) != 0; /* absent: false (§1.1, GLM-5/5.1) */
    const JsonValue *sf = cfg_field(cf, "scoring_func", 0);
    if (sf && (sf->type != JSON_STRING || strcmp(sf->str, "sigmoid"))) cfg_fail(cf, "%s: scoring_func must be \"sigmoid\"", cf->path);
    const JsonValue *tie = cfg_field(cf, "tie_word_embeddings", 0);
    if (tie && tie->type == JSON_BOOL && tie->num)
        cfg_fail(cf, "%s: tie_word_embeddings true is not supported (GLM-5 has a separate lm_head)", cf->path);
}

/* RoPE theta: rope_parameters.rope_theta (transformers v5), else flat rope_theta. No YaRN (§7.6). */
static void config_rope(ConfigFile *cf, Config *c) {
    const JsonValue *rp = cfg_field(cf, "rope_parameters", 0);
    const JsonValue *theta = rp ? json_get(rp, "rope_theta") : NULL;
    if (!theta) theta = cfg_field(cf, "rope_theta", 0);
    if (!theta || theta->type != JSON_NUMBER || theta->num <= 0) cfg_fail(cf, "%s: missing or bad rope_parameters.rope_theta", cf->path);
    else c->rope_theta = theta->num;
    if (rp) {
        const JsonValue *rt = json_get(rp, "rope_type");
        if (rt && rt->type == JSON_STRING && strcmp(rt->str, "default"))
            cfg_fail(cf, "%s: rope_type \"%s\" is not supported (GLM-5 uses plain RoPE)", cf->path, rt->str);
    }
}

/* eos: a token id or a list of them (at most GLM_MAX_EOS kept; entries of other types ignored) */
static void config_eos(ConfigFile *cf, Config *c) {
    const JsonValue *eos = cfg_field(cf, "eos_token_id", 0);
    const JsonValue *ids = eos && eos->type == JSON_ARRAY ? eos->child : eos;
    for (const JsonValue *e = ids; e && c->n_eos < GLM_MAX_EOS; e = eos->type == JSON_ARRAY ? e->next : NULL) {
        if (e->type != JSON_NUMBER) continue;
        if (e->num != floor(e->num) || e->num < INT32_MIN || e->num > INT32_MAX) {
            cfg_fail(cf, "%s: eos_token_id must be a token id or a list of token ids", cf->path);
            break;
        }
        c->eos[c->n_eos++] = (int)e->num;
    }
}

/* A per-layer list of two words, `list` (the field named key): layer l's flag is 1 where
 * its entry is `one`, 0 where it is `zero`. Entries past the layers are ignored. */
static void cfg_layer_words(ConfigFile *cf, const JsonValue *list, const char *key, const char *one, const char *zero,
                            uint8_t *flag, int n_layers) {
    if (list->type != JSON_ARRAY || (int)list->n < n_layers) {
        cfg_fail(cf, "%s: %s must list %d layers", cf->path, key, n_layers);
        return;
    }
    int l = 0;
    for (const JsonValue *e = list->child; e && l < n_layers; e = e->next, l++) {
        if (e->type != JSON_STRING || (strcmp(e->str, one) && strcmp(e->str, zero))) {
            cfg_fail(cf, "%s: %s[%d] must be \"%s\" or \"%s\"", cf->path, key, l, one, zero);
            break;
        }
        flag[l] = !strcmp(e->str, one);
    }
}

/* dense vs MoE: mlp_layer_types if given, else the first first_k_dense_replace layers */
static void config_mlp_schedule(ConfigFile *cf, Config *c) {
    const JsonValue *mlt = cfg_field(cf, "mlp_layer_types", 0);
    if (mlt) {
        cfg_layer_words(cf, mlt, "mlp_layer_types", "dense", "sparse", c->dense, c->n_layers);
    } else {
        int k = cfg_int(cf, "first_k_dense_replace", 0, 0, 0, c->n_layers);
        for (int l = 0; l < c->n_layers; l++) c->dense[l] = l < k;
    }
}

/* IndexShare schedule (§1.3): indexer_types is authoritative, then index_topk_pattern, then
 * the formula. A "shared" layer reuses the selection of the last "full" one before it, so
 * layer 0 must be full. */
static void config_index_schedule(ConfigFile *cf, Config *c) {
    const JsonValue *it = cfg_field(cf, "indexer_types", 0), *pat = cfg_field(cf, "index_topk_pattern", 0);
    if (it) {
        cfg_layer_words(cf, it, "indexer_types", "full", "shared", c->full_index, c->n_layers);
    } else if (pat) {
        if (pat->type != JSON_STRING || pat->str_len < (size_t)c->n_layers)
            cfg_fail(cf, "%s: index_topk_pattern must have %d letters", cf->path, c->n_layers);
        else
            for (int l = 0; l < c->n_layers; l++) {
                if (pat->str[l] != 'F' && pat->str[l] != 'S') {
                    cfg_fail(cf, "%s: index_topk_pattern letters must be F or S", cf->path);
                    break;
                }
                c->full_index[l] = pat->str[l] == 'F';
            }
    } else {
        int freq = cfg_int(cf, "index_topk_freq", 0, 1, 1, CFG_BIG);
        int off = cfg_int(cf, "index_skip_topk_offset", 0, 2, 0, CFG_BIG);
        for (int l = 0; l < c->n_layers; l++) {
            int k = l - off + 1;
            c->full_index[l] = (k > 0 ? k : 0) % freq == 0;
        }
    }
    if (!c->full_index[0])
        cfg_fail(cf, "%s: inconsistent config: layer 0 is \"shared\" but no earlier layer computes a selection", cf->path);
}

/* Reads and checks config.json text[0..len) (named path in messages) into c. Each part
 * reads one concern in turn; later parts use the fields earlier ones set (n_layers, the
 * experts), which after an error are in-range defaults. */
int config_parse(Config *c, const char *text, size_t len, const char *path, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    Json j;
    char jerr[256];
    if (json_parse(&j, text, len, jerr, sizeof jerr)) return errf(err, errlen, "%s: bad JSON: %s", path, jerr);
    if (j.root->type != JSON_OBJECT) {
        json_free(&j);
        return errf(err, errlen, "%s: not a JSON object", path);
    }
    ConfigFile cf = {path, j.root, err, errlen, 0};
    config_widths(&cf, c);
    config_experts(&cf, c);
    config_scalars(&cf, c);
    config_rope(&cf, c);
    config_eos(&cf, c);
    config_mlp_schedule(&cf, c);
    config_index_schedule(&cf, c);
    json_free(&j);
    return cf.failed ? -1 : 0;
}

/* The CLI: reads DIR/config.json; errors are fatal. */
int is_eos(const Config *c, int id) {
    for (int i = 0; i < c->n_eos; i++) if (c->eos[i] == id) return 1;
    return 0;
}

void config_load(Config *c, const char *dir) {
    char *path = path_join(dir, "config.json");
    size_t len;
    char *text = read_file(path, &len);
    if (!text) glm_fatal("%s: cannot read: %s", path, strerror(errno));
    char err[1024];
    if (config_parse(c, text, len, path, err, sizeof err)) glm_fatal("%s", err);
    free(text);
    free(path);
}

/* ======================================================================== */
/* 4. the model                                                             */

static void tensor_name(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void tensor_name(char *buf, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
}

static const TensorInfo *need_tensor(const Model *m, const char *name) {
    const TensorInfo *t = checkpoint_find(&m->ck, name);
    if (!t) glm_fatal("%s: missing tensor %s", m->ck.dir, name);
    return t;
}

static const char *tensor_file(const Model *m, const TensorInfo *t) { return m->ck.shards[t->shard].path; }

static void expect_shape(const Model *m, const TensorInfo *t, int ndim, int64_t d0, int64_t d1) {
    int ok = t->ndim == ndim && t->shape[0] == d0 && (ndim < 2 || t->shape[1] == d1);
    if (!ok) {
        char got[128] = "[", *p = got + 1;
        for (int i = 0; i < t->ndim && p < got + sizeof got - 24; i++) p += sprintf(p, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        strcpy(p, "]");
        if (ndim == 1) glm_fatal("%s: tensor %s has shape %s, expected [%lld]", tensor_file(m, t), t->name, got, (long long)d0);
        glm_fatal("%s: tensor %s has shape %s, expected [%lld, %lld]", tensor_file(m, t), t->name, got, (long long)d0, (long long)d1);
    }
}

/* A 1-D parameter (norm weight, bias), BF16 or F32, converted to fp32 once. */
static float *load_vector(Model *m, const char *name, int n) {
    const TensorInfo *t = need_tensor(m, name);
    expect_shape(m, t, 1, n, 0);
    float *v = xmalloc((size_t)n * sizeof(float));
    if (!strcmp(t->dtype, "F32")) memcpy(v, t->data, (size_t)n * 4);
    else if (!strcmp(t->dtype, "BF16"))
        for (int i = 0; i < n; i++) { uint16_t b; memcpy(&b, t->data + 2 * i, 2); v[i] = bf16_to_f32(b); }
    else glm_fatal("%s: tensor %s has dtype %s, expected BF16 or F32", tensor_file(m, t), name, t->dtype);
    m->weight_bytes += t->nbytes;
    return v;
}

/* A Linear weight [rows, cols]. Its format comes from the file, never from its name
 * (docs/FORMATS.md §0.7): U8 + weight_scale = Quark MXFP4; F8_E4M3 + weight_scale_inv
 * = block FP8; BF16 / F32 as is. */
static Mat load_matrix(Model *m, const char *prefix, int rows, int cols) {
    char name[256], sname[256];
    tensor_name(name, sizeof name, "%s.weight", prefix);
    const TensorInfo *t = need_tensor(m, name);
    Mat W = {0};
    W.rows = rows; W.cols = cols; W.w = t->data;
    const char *file = tensor_file(m, t);
    if (!strcmp(t->dtype, "U8")) {
        tensor_name(sname, sizeof sname, "%s.weight_scale", prefix);
        const TensorInfo *s = checkpoint_find(&m->ck, sname);
        if (!s) glm_fatal("%s: tensor %s is U8 (MXFP4) but %s is missing", file, name, sname);
        if (cols % 32) glm_fatal("%s: tensor %s: MXFP4 needs the input width %d to be a multiple of 32", file, name, cols);
        expect_shape(m, t, 2, rows, cols / 2);
        expect_shape(m, s, 2, rows, cols / 32);
        if (strcmp(s->dtype, "U8") && strcmp(s->dtype, "F8_E8M0"))
            glm_fatal("%s: tensor %s has dtype %s, expected U8 or F8_E8M0", tensor_file(m, s), sname, s->dtype);
        W.fmt = WF_MXFP4; W.mx_scale = s->data;
        W.bytes = t->nbytes + s->nbytes;
    } else if (!strcmp(t->dtype, "F8_E4M3")) {
        tensor_name(sname, sizeof sname, "%s.weight_scale_inv", prefix);
        const TensorInfo *s = checkpoint_find(&m->ck, sname);
        if (!s) glm_fatal("%s: tensor %s is F8_E4M3 but %s is missing", file, name, sname);
        expect_shape(m, t, 2, rows, cols);
        int br = (rows + 127) / 128, bc = (cols + 127) / 128;
        expect_shape(m, s, 2, br, bc);
        float *sc = xmalloc((size_t)br * bc * sizeof(float)); /* tiny: one float per 128x128 block */
        if (!strcmp(s->dtype, "F32")) memcpy(sc, s->data, (size_t)br * bc * 4);
        else if (!strcmp(s->dtype, "BF16"))
            for (int i = 0; i < br * bc; i++) { uint16_t b; memcpy(&b, s->data + 2 * i, 2); sc[i] = bf16_to_f32(b); }
        else glm_fatal("%s: tensor %s has dtype %s, expected F32", tensor_file(m, s), sname, s->dtype);
        W.fmt = WF_FP8; W.fp8_scale = sc;
        W.bytes = t->nbytes + s->nbytes;
    } else if (!strcmp(t->dtype, "BF16") || !strcmp(t->dtype, "F32")) {
        expect_shape(m, t, 2, rows, cols);
        W.fmt = !strcmp(t->dtype, "BF16") ? WF_BF16 : WF_F32;
        W.bytes = t->nbytes;
        /* fp32 rows are read with plain float loads: they must be aligned */
        if (W.fmt == WF_F32 && ((uintptr_t)t->data & 3)) glm_fatal("%s: tensor %s: F32 data is not 4-byte aligned", file, name);
    } else {
        glm_fatal("%s: tensor %s has dtype %s, expected BF16, F32, F8_E4M3 or U8 (MXFP4)", file, name, t->dtype);
    }
    if ((W.fmt == WF_BF16) && ((uintptr_t)t->data & 1)) glm_fatal("%s: tensor %s: BF16 data is not 2-byte aligned", file, name);
    m->weight_bytes += W.bytes;
    return W;
}

/* Loads one decoder layer: a main one, or the MTP layer's (l = n_layers). */
static void load_layer(Model *m, Layer *L, int l, int dense, int full) {
    const Config *c = &m->cfg;
    char p[160], n[200];
    tensor_name(p, sizeof p, "model.layers.%d", l);
#define NAME(...) (tensor_name(n, sizeof n, __VA_ARGS__), n)
    L->dense = dense;
    L->input_norm = load_vector(m, NAME("%s.input_layernorm.weight", p), c->hidden);
    L->post_norm = load_vector(m, NAME("%s.post_attention_layernorm.weight", p), c->hidden);
    L->q_a = load_matrix(m, NAME("%s.self_attn.q_a_proj", p), c->q_lora_rank, c->hidden);
    L->q_a_norm = load_vector(m, NAME("%s.self_attn.q_a_layernorm.weight", p), c->q_lora_rank);
    L->q_b = load_matrix(m, NAME("%s.self_attn.q_b_proj", p), c->n_heads * (c->qk_nope + c->qk_rope), c->q_lora_rank);
    L->kv_a = load_matrix(m, NAME("%s.self_attn.kv_a_proj_with_mqa", p), c->kv_lora_rank + c->qk_rope, c->hidden);
    L->kv_a_norm = load_vector(m, NAME("%s.self_attn.kv_a_layernorm.weight", p), c->kv_lora_rank);
    L->kv_b = load_matrix(m, NAME("%s.self_attn.kv_b_proj", p), c->n_heads * (c->qk_nope + c->v_head), c->kv_lora_rank);
    L->o = load_matrix(m, NAME("%s.self_attn.o_proj", p), c->hidden, c->n_heads * c->v_head);
    L->has_indexer = full;
    L->index_slot = -1;
    if (full) {
        L->ix_wq_b = load_matrix(m, NAME("%s.self_attn.indexer.wq_b", p), c->index_n_heads * c->index_head_dim, c->q_lora_rank);
        L->ix_wk = load_matrix(m, NAME("%s.self_attn.indexer.wk", p), c->index_head_dim, c->hidden);
        L->ix_knorm_w = load_vector(m, NAME("%s.self_attn.indexer.k_norm.weight", p), c->index_head_dim);
        L->ix_knorm_b = load_vector(m, NAME("%s.self_attn.indexer.k_norm.bias", p), c->index_head_dim);
        L->ix_weights = load_matrix(m, NAME("%s.self_attn.indexer.weights_proj", p), c->index_n_heads, c->hidden);
    } else if (checkpoint_find(&m->ck, NAME("%s.self_attn.indexer.wk.weight", p))) {
        glm_fatal("%s: inconsistent config: layer %d is \"shared\" in the IndexShare schedule but has indexer weights", m->ck.dir, l);
    }
    if (dense) {
        L->gate = load_matrix(m, NAME("%s.mlp.gate_proj", p), c->dense_inter, c->hidden);
        L->up = load_matrix(m, NAME("%s.mlp.up_proj", p), c->dense_inter, c->hidden);
        L->down = load_matrix(m, NAME("%s.mlp.down_proj", p), c->hidden, c->dense_inter);
    } else {
        L->router = load_matrix(m, NAME("%s.mlp.gate", p), c->n_experts, c->hidden);
        L->router_bias = load_vector(m, NAME("%s.mlp.gate.e_score_correction_bias", p), c->n_experts);
        if (c->n_shared) {
            int w = c->n_shared * c->moe_inter;
            L->sh_gate = load_matrix(m, NAME("%s.mlp.shared_experts.gate_proj", p), w, c->hidden);
            L->sh_up = load_matrix(m, NAME("%s.mlp.shared_experts.up_proj", p), w, c->hidden);
            L->sh_down = load_matrix(m, NAME("%s.mlp.shared_experts.down_proj", p), c->hidden, w);
        }
        L->ex_gate = xcalloc((size_t)c->n_experts, sizeof(Mat));
        L->ex_up = xcalloc((size_t)c->n_experts, sizeof(Mat));
        L->ex_down = xcalloc((size_t)c->n_experts, sizeof(Mat));
        for (int e = 0; e < c->n_experts; e++) {
            L->ex_gate[e] = load_matrix(m, NAME("%s.mlp.experts.%d.gate_proj", p, e), c->moe_inter, c->hidden);
            L->ex_up[e] = load_matrix(m, NAME("%s.mlp.experts.%d.up_proj", p, e), c->moe_inter, c->hidden);
            L->ex_down[e] = load_matrix(m, NAME("%s.mlp.experts.%d.down_proj", p, e), c->hidden, c->moe_inter);
        }
    }
#undef NAME
}

static void layer_free(Layer *L, int n_experts) {
    free(L->input_norm); free(L->post_norm); free(L->q_a_norm); free(L->kv_a_norm);
    free(L->ix_knorm_w); free(L->ix_knorm_b); free(L->router_bias);
    Mat *all[] = {&L->q_a, &L->q_b, &L->kv_a, &L->kv_b, &L->o, &L->ix_wq_b, &L->ix_wk, &L->ix_weights,
                  &L->gate, &L->up, &L->down, &L->router, &L->sh_gate, &L->sh_up, &L->sh_down};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free((void *)all[i]->fp8_scale);
    for (int e = 0; L->ex_gate && e < n_experts; e++) {
        free((void *)L->ex_gate[e].fp8_scale); free((void *)L->ex_up[e].fp8_scale); free((void *)L->ex_down[e].fp8_scale);
    }
    free(L->ex_gate); free(L->ex_up); free(L->ex_down);
}

/* The MTP layer (§2.3, §5) when config.json announces one (num_nextn_predict_layers 1):
 * a MoE decoder layer with its own indexer (cache slot after the main layers'), plus
 * enorm, hnorm, eh_proj and shared_head.norm. Some releases drop it (docs/FORMATS.md
 * §2.3): absent is fine (m->mtp stays NULL), broken is not. Its bytes are counted in
 * Mtp.bytes, not in weight_bytes: the main forward never reads them. */
static void load_mtp(Model *m) {
    const Config *c = &m->cfg;
    const int l = c->n_layers, H = c->hidden;
    char n[128];
    snprintf(n, sizeof n, "model.layers.%d.input_layernorm.weight", l);
    if (!c->n_mtp || !checkpoint_find(&m->ck, n)) return;
    const size_t main_bytes = m->weight_bytes;
    Mtp *P = xcalloc(1, sizeof *P);
    load_layer(m, &P->layer, l, 0, 1);
    P->layer.index_slot = m->n_index_layers;
    snprintf(n, sizeof n, "model.layers.%d.enorm.weight", l); P->enorm = load_vector(m, n, H);
    snprintf(n, sizeof n, "model.layers.%d.hnorm.weight", l); P->hnorm = load_vector(m, n, H);
    snprintf(n, sizeof n, "model.layers.%d.shared_head.norm.weight", l); P->head_norm = load_vector(m, n, H);
    snprintf(n, sizeof n, "model.layers.%d.eh_proj", l); P->eh_proj = load_matrix(m, n, H, 2 * H);
    P->bytes = m->weight_bytes - main_bytes;
    m->weight_bytes = main_bytes;
    m->mtp = P;
}

void model_load(Model *m, const char *dir) {
    memset(m, 0, sizeof *m);
    number_tables_init();
    config_load(&m->cfg, dir);
    checkpoint_open(&m->ck, dir);
    const Config *c = &m->cfg;
    m->embed = load_matrix(m, "model.embed_tokens", c->vocab_size, c->hidden);
    m->final_norm = load_vector(m, "model.norm.weight", c->hidden);
    m->lm_head = load_matrix(m, "lm_head", c->vocab_size, c->hidden);
    m->layers = xcalloc((size_t)c->n_layers, sizeof(Layer));
    for (int l = 0; l < c->n_layers; l++) {
        load_layer(m, &m->layers[l], l, c->dense[l], c->full_index[l]);
        if (c->full_index[l]) m->layers[l].index_slot = m->n_index_layers++;
    }
    load_mtp(m);
}

void model_free(Model *m) {
    for (int l = 0; l < m->cfg.n_layers; l++) layer_free(&m->layers[l], m->cfg.n_experts);
    if (m->mtp) {
        layer_free(&m->mtp->layer, m->cfg.n_experts);
        free(m->mtp->enorm); free(m->mtp->hnorm); free(m->mtp->head_norm); free((void *)m->mtp->eh_proj.fp8_scale);
        free(m->mtp);
    }
    free(m->layers); free(m->final_norm);
    free((void *)m->embed.fp8_scale); free((void *)m->lm_head.fp8_scale);
    checkpoint_close(&m->ck);
}

