/* glm.c - GLM-5.2 inference in plain C.
 *
 * Read top to bottom:
 *   1. numbers: bf16, FP8 E4M3, MXFP4 (E2M1 + E8M0) decoding
 *   2. safetensors shards and the checkpoint index (mmap, every header checked)
 *   3. config.json
 *   4. the model: every tensor found, its format, dtype and shape checked
 *   5. matrix products for every weight format (fp32 accumulation, OpenMP)
 *   6. the forward pass: RMSNorm, RoPE, MLA, the DSA indexer, MoE
 *   7. sampling
 *   8. the command line
 *
 * The maths follows ../shared/docs/GLM5-ARCHITECTURE.md; section numbers (§) refer to it.
 * Activations, norms, softmax, router and indexer scores are fp32; weights are used
 * in place in their file format (BF16, FP8 block-scaled, MXFP4) and dequantized on
 * the fly, i.e. weight-only quantization semantics (W4A16 / W8A16).
 */
#define _GNU_SOURCE
#include "glm.h"
#include "json.h"
#include "tokenizer.h"

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
#ifdef _OPENMP
#include <omp.h>
#endif

/* ======================================================================== */
/* 0. errors and small utilities                                            */

/* Every user-facing failure ends here: one line on stderr, exit code 1. The
 * command that writes an output file registers it so a failure never leaves a
 * half-written file behind. */
static const char *g_partial_output;
void (*glm_fatal_cleanup)(void);

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

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) glm_fatal("out of memory allocating %zu bytes", n);
    return hint_huge_pages(p, n);
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) glm_fatal("out of memory allocating %zu x %zu bytes", n, size);
    return hint_huge_pages(p, n * size);
}

static char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

static char *path_join(const char *dir, const char *name) {
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

/* E2M1: sign bit 3, two exponent bits, one mantissa bit (MXFP4-AND-HIP.md §1.1). */
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
         * pages already cached stay as they were cached (see README, Speed) */
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

/* Reads and checks config.json text[0..len) (named path in messages) into c. */
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
    const int BIG = 1 << 30;

    c->vocab_size = cfg_int(&cf, "vocab_size", 1, 0, 1, BIG);
    c->hidden = cfg_int(&cf, "hidden_size", 1, 0, 1, BIG);
    c->n_layers = cfg_int(&cf, "num_hidden_layers", 1, 0, 1, GLM_MAX_LAYERS - 1);
    c->n_mtp = cfg_int(&cf, "num_nextn_predict_layers", 0, 0, 0, 1);
    c->n_heads = cfg_int(&cf, "num_attention_heads", 1, 0, 1, 4096);
    c->q_lora_rank = cfg_int(&cf, "q_lora_rank", 1, 0, 1, BIG);
    c->kv_lora_rank = cfg_int(&cf, "kv_lora_rank", 1, 0, 1, BIG);
    c->qk_nope = cfg_int(&cf, "qk_nope_head_dim", 1, 0, 0, BIG);
    c->qk_rope = cfg_int(&cf, "qk_rope_head_dim", 1, 0, 2, BIG);
    c->v_head = cfg_int(&cf, "v_head_dim", 1, 0, 1, BIG);
    /* qk_head_dim is redundant; if present it must agree (head_dim is a wrong legacy field, §7.5) */
    long long qk_sum = (long long)c->qk_nope + c->qk_rope;
    int qk_head = cfg_int(&cf, "qk_head_dim", 0, (double)qk_sum, 1, BIG);
    if (qk_head != qk_sum)
        cfg_fail(&cf, "%s: inconsistent config: qk_head_dim %d != qk_nope_head_dim %d + qk_rope_head_dim %d", path, qk_head, c->qk_nope, c->qk_rope);
    if (c->qk_rope % 2) cfg_fail(&cf, "%s: qk_rope_head_dim must be even", path);
    c->index_n_heads = cfg_int(&cf, "index_n_heads", 1, 0, 1, 4096);
    c->index_head_dim = cfg_int(&cf, "index_head_dim", 1, 0, 1, BIG);
    c->index_topk = cfg_int(&cf, "index_topk", 1, 0, 1, BIG);
    if (c->index_head_dim < c->qk_rope) cfg_fail(&cf, "%s: inconsistent config: index_head_dim %d < qk_rope_head_dim %d", path, c->index_head_dim, c->qk_rope);
    c->n_experts = cfg_int(&cf, "n_routed_experts", 1, 0, 1, 1 << 16);
    c->n_active = cfg_int(&cf, "num_experts_per_tok", 1, 0, 1, c->n_experts);
    c->n_shared = cfg_int(&cf, "n_shared_experts", 0, 0, 0, 64);
    c->moe_inter = cfg_int(&cf, "moe_intermediate_size", 1, 0, 1, BIG);
    c->dense_inter = cfg_int(&cf, "intermediate_size", 1, 0, 1, BIG);
    c->n_group = cfg_int(&cf, "n_group", 0, 1, 1, c->n_experts);
    c->topk_group = cfg_int(&cf, "topk_group", 0, c->n_group, 1, c->n_group);
    if (c->n_experts % c->n_group) cfg_fail(&cf, "%s: inconsistent config: n_routed_experts %d not divisible by n_group %d", path, c->n_experts, c->n_group);
    if (c->n_group > 1 && c->n_experts / c->n_group < 2) cfg_fail(&cf, "%s: inconsistent config: group-limited routing needs >= 2 experts per group", path);
    if (c->n_active > c->topk_group * (c->n_experts / c->n_group))
        cfg_fail(&cf, "%s: inconsistent config: num_experts_per_tok %d exceeds the experts in topk_group groups", path, c->n_active);
    c->norm_topk_prob = cfg_number(&cf, "norm_topk_prob", 0, 1) != 0;
    c->routed_scale = (float)cfg_number(&cf, "routed_scaling_factor", 0, 1.0);
    c->rms_eps = (float)cfg_number(&cf, "rms_norm_eps", 0, 1e-5);
    c->max_pos = cfg_int(&cf, "max_position_embeddings", 0, BIG, 1, BIG);

    const JsonValue *sf = cfg_field(&cf, "scoring_func", 0);
    if (sf && (sf->type != JSON_STRING || strcmp(sf->str, "sigmoid"))) cfg_fail(&cf, "%s: scoring_func must be \"sigmoid\"", path);
    const JsonValue *tie = cfg_field(&cf, "tie_word_embeddings", 0);
    if (tie && tie->type == JSON_BOOL && tie->num) cfg_fail(&cf, "%s: tie_word_embeddings true is not supported (GLM-5 has a separate lm_head)", path);

    /* RoPE theta: rope_parameters.rope_theta (transformers v5), else flat rope_theta. No YaRN (§7.6). */
    const JsonValue *rp = cfg_field(&cf, "rope_parameters", 0);
    const JsonValue *theta = rp ? json_get(rp, "rope_theta") : NULL;
    if (!theta) theta = cfg_field(&cf, "rope_theta", 0);
    if (!theta || theta->type != JSON_NUMBER || theta->num <= 0) cfg_fail(&cf, "%s: missing or bad rope_parameters.rope_theta", path);
    else c->rope_theta = theta->num;
    if (rp) {
        const JsonValue *rt = json_get(rp, "rope_type");
        if (rt && rt->type == JSON_STRING && strcmp(rt->str, "default"))
            cfg_fail(&cf, "%s: rope_type \"%s\" is not supported (GLM-5 uses plain RoPE)", path, rt->str);
    }

    /* eos: a token id or a list of them (at most GLM_MAX_EOS kept; entries of other types ignored) */
    const JsonValue *eos = cfg_field(&cf, "eos_token_id", 0);
    const JsonValue *ids = eos && eos->type == JSON_ARRAY ? eos->child : eos;
    for (const JsonValue *e = ids; e && c->n_eos < GLM_MAX_EOS; e = eos->type == JSON_ARRAY ? e->next : NULL) {
        if (e->type != JSON_NUMBER) continue;
        if (e->num != floor(e->num) || e->num < INT32_MIN || e->num > INT32_MAX) {
            cfg_fail(&cf, "%s: eos_token_id must be a token id or a list of token ids", path);
            break;
        }
        c->eos[c->n_eos++] = (int)e->num;
    }

    /* dense vs MoE: mlp_layer_types if given, else the first first_k_dense_replace layers */
    const JsonValue *mlt = cfg_field(&cf, "mlp_layer_types", 0);
    if (mlt) {
        if (mlt->type != JSON_ARRAY || (int)mlt->n < c->n_layers) cfg_fail(&cf, "%s: mlp_layer_types must list %d layers", path, c->n_layers);
        else {
            int l = 0;
            for (const JsonValue *e = mlt->child; e && l < c->n_layers; e = e->next, l++) {
                if (e->type != JSON_STRING || (strcmp(e->str, "dense") && strcmp(e->str, "sparse"))) {
                    cfg_fail(&cf, "%s: mlp_layer_types[%d] must be \"dense\" or \"sparse\"", path, l);
                    break;
                }
                c->dense[l] = !strcmp(e->str, "dense");
            }
        }
    } else {
        int k = cfg_int(&cf, "first_k_dense_replace", 0, 0, 0, c->n_layers);
        for (int l = 0; l < c->n_layers; l++) c->dense[l] = l < k;
    }

    /* IndexShare schedule (§1.3): indexer_types is authoritative, then index_topk_pattern, then the formula. */
    const JsonValue *it = cfg_field(&cf, "indexer_types", 0), *pat = cfg_field(&cf, "index_topk_pattern", 0);
    if (it) {
        if (it->type != JSON_ARRAY || (int)it->n < c->n_layers) cfg_fail(&cf, "%s: indexer_types must list %d layers", path, c->n_layers);
        else {
            int l = 0;
            for (const JsonValue *e = it->child; e && l < c->n_layers; e = e->next, l++) {
                if (e->type != JSON_STRING || (strcmp(e->str, "full") && strcmp(e->str, "shared"))) {
                    cfg_fail(&cf, "%s: indexer_types[%d] must be \"full\" or \"shared\"", path, l);
                    break;
                }
                c->full_index[l] = !strcmp(e->str, "full");
            }
        }
    } else if (pat) {
        if (pat->type != JSON_STRING || pat->str_len < (size_t)c->n_layers) cfg_fail(&cf, "%s: index_topk_pattern must have %d letters", path, c->n_layers);
        else
            for (int l = 0; l < c->n_layers; l++) {
                if (pat->str[l] != 'F' && pat->str[l] != 'S') {
                    cfg_fail(&cf, "%s: index_topk_pattern letters must be F or S", path);
                    break;
                }
                c->full_index[l] = pat->str[l] == 'F';
            }
    } else {
        int freq = cfg_int(&cf, "index_topk_freq", 0, 1, 1, BIG);
        int off = cfg_int(&cf, "index_skip_topk_offset", 0, 2, 0, BIG);
        for (int l = 0; l < c->n_layers; l++) {
            int k = l - off + 1;
            c->full_index[l] = (k > 0 ? k : 0) % freq == 0;
        }
    }
    if (!c->full_index[0]) cfg_fail(&cf, "%s: inconsistent config: layer 0 is \"shared\" but no earlier layer computes a selection", path);

    json_free(&j);
    return cf.failed ? -1 : 0;
}

/* The CLI: reads DIR/config.json; errors are fatal. */
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
 * (MXFP4-AND-HIP.md §0.7): U8 + weight_scale = Quark MXFP4; F8_E4M3 + weight_scale_inv
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

/* Loads one decoder layer (also used to check the MTP layer, whose weights are not kept). */
static void load_layer(Model *m, Layer *L, int l, int dense, int full) {
    const Config *c = &m->cfg;
    char p[160], n[200];
    tensor_name(p, sizeof p, "model.layers.%d", l);
#define NAME(...) (tensor_name(n, sizeof n, __VA_ARGS__), n)
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
    /* The MTP layer (§5) is checked so a broken file is caught now, then dropped:
     * it does not influence the main model's logits. */
    size_t main_bytes = m->weight_bytes;
    char mtp_probe[96];
    snprintf(mtp_probe, sizeof mtp_probe, "model.layers.%d.input_layernorm.weight", c->n_layers);
    /* Some releases drop the MTP layer (MXFP4-AND-HIP.md §2.3): absent is fine, broken is not. */
    if (c->n_mtp && checkpoint_find(&m->ck, mtp_probe)) {
        int l = c->n_layers;
        Layer mtp = {0};
        char n[128];
        load_layer(m, &mtp, l, 0, 1);
        snprintf(n, sizeof n, "model.layers.%d.enorm.weight", l); free(load_vector(m, n, c->hidden));
        snprintf(n, sizeof n, "model.layers.%d.hnorm.weight", l); free(load_vector(m, n, c->hidden));
        snprintf(n, sizeof n, "model.layers.%d.shared_head.norm.weight", l); free(load_vector(m, n, c->hidden));
        snprintf(n, sizeof n, "model.layers.%d.eh_proj", l);
        Mat eh = load_matrix(m, n, c->hidden, 2 * c->hidden);
        free((void *)eh.fp8_scale);
        layer_free(&mtp, c->n_experts);
    }
    m->weight_bytes = main_bytes;
}

void model_free(Model *m) {
    for (int l = 0; l < m->cfg.n_layers; l++) layer_free(&m->layers[l], m->cfg.n_experts);
    free(m->layers); free(m->final_norm);
    free((void *)m->embed.fp8_scale); free((void *)m->lm_head.fp8_scale);
    checkpoint_close(&m->ck);
}

/* ======================================================================== */
/* 5. matrix products                                                       */
/*
 * Every Linear goes through matmul(): y[n][rows] = x[n][cols] · Wᵀ, fp32
 * accumulation, rows split across threads. For one token (decode) each row is
 * dotted straight from its packed form (row_dot here, SIMD in simd.c, with x rounded
 * to bf16 where the CPU has AVX512-BF16, see g_act_bf16). For several
 * tokens (prefill) each weight is dequantized once per chunk of tokens and reused
 * for all of them: here a row at a time into a buffer; with SIMD, 32 rows at a time
 * into a k-major panel that a register tile of tokens streams through, in bf16 where
 * the CPU has it (g_act_bf16; few tokens skip the panel, see matmul_rows).
 */

/* Prompts run in chunks of this many tokens: each weight panel is dequantized once
 * per chunk, so larger chunks amortize it better, and each expert sees more of the
 * chunk's tokens. GLM-5.2 routes a token to 8 of 256 experts, so a chunk of 2048 gives
 * an expert 64 tokens on average, 512 only 16 (the few-token path, ~0.8x the FMA peak).
 * Measured on 2048-token prompts (notes/speed.md, sixteenth session): 1.08-1.28x faster
 * than 512-token chunks with 256 experts, 1.06-1.10x with 64; 4096 no faster than 2048.
 * The cost is memory: activations take ~0.65 MB per token of chunk at GLM-5.2's widths
 * (~1.3 GB; a context shorter than the chunk sizes them to the context instead). */
#define PREFILL_CHUNK 2048
#define PANEL_KC 512 /* columns of a panel chunk: 32 rows x 512 stay in L1/L2 with the tokens' slice */
#define ROWS_MAX_TOKENS 64 /* up to this many tokens a bf16 product skips the panel (gemm_rows_bf16) */

static int g_threads = 1;
/* Below this much work (multiply-adds, counting at most 8 tokens) a product runs on
 * one thread: waking the others costs more. GLM_PARALLEL_MIN=0 makes every product
 * parallel, which the tests use to catch races on tiny models. */
static double g_parallel_min = 65536;

static float *g_row_scratch;      /* [g_threads][g_scratch_cols] */
static int g_scratch_cols;
static double g_bytes_read;       /* weight + cache bytes touched, for GB/s reports */
static double g_flops;            /* floating-point operations (2 per multiply-add), for FLOP/s reports */
/* x as a SIMD matvec reads it (matvec_split_x / matvec_order_bf16): up to the widest
 * matrix rounded up to 128 columns */
#define XS_FOR(cols) ((size_t)(cols) + 128) /* floats of x's layout for a matrix of cols columns */
#define XS_COLS XS_FOR(g_scratch_cols)
static float *g_x_split;          /* [g_threads][XS_COLS] */
static float *g_panel;            /* [g_threads][g_panel_stride] prefill: a 32-row k-major panel, its 32 rows, a spare row */
static size_t g_panel_stride;     /* max(65 * g_scratch_cols, PANEL_KC * 32 + PREFILL_CHUNK * 32) floats */
/* Weight products with activations rounded to bf16 (vdpbf16ps; ~1e-3 relative error per
 * product, as llama.cpp's bf16 path) where the CPU has AVX512-BF16: the default. Prompts:
 * twice the fp32 FMA rate. Decode: the weights go into the instruction as they are stored
 * (after a shift or a table lookup), a few instructions per 64 bytes fewer than widening
 * them to fp32, which keeps a core that is slow or shared up with memory. --fp32 (or
 * GLM_PRECISION=fp32, which the test suites use) keeps fp32 products. */
static int g_act_bf16 = 1;
static uint16_t *g_x_bf16;        /* [cap][g_scratch_cols + 64] activations rounded to bf16 for that mode */

static void scratch_init(int max_cols) {
#ifdef _OPENMP
    g_threads = omp_get_max_threads();
    omp_set_max_active_levels(1); /* thread_id() relies on a single active level */
#endif
    const char *pm = getenv("GLM_PARALLEL_MIN");
    if (pm && *pm) g_parallel_min = atof(pm);
    g_scratch_cols = max_cols;
    g_row_scratch = xmalloc((size_t)g_threads * (size_t)max_cols * sizeof(float));
    g_x_split = xmalloc((size_t)g_threads * XS_COLS * sizeof(float));
    const size_t bf16_gemm = (size_t)PANEL_KC * 32 + (size_t)PREFILL_CHUNK * 32; /* panel, stage, y tile */
    g_panel_stride = (size_t)65 * max_cols > bf16_gemm ? (size_t)65 * max_cols : bf16_gemm;
    g_panel = xcalloc((size_t)g_threads * g_panel_stride, sizeof(float));
    g_x_bf16 = xcalloc((size_t)PREFILL_CHUNK * (max_cols + 64), sizeof(uint16_t));
}

/* Which thread we are in the one active parallel region (nesting is limited to one
 * active level): products called from inside a parallel loop run serially, products
 * called from a loop that did not go parallel run in parallel, and either way each
 * thread must find its own scratch. */
static int thread_id(void) {
#ifdef _OPENMP
    for (int level = omp_get_level(); level >= 1; level--)
        if (omp_get_team_size(level) > 1) return omp_get_ancestor_thread_num(level);
#endif
    return 0;
}

/* Dot of row r of W with x[cols]: the plain C reference for each format. */
static float row_dot(const Mat *W, int r, const float *x) {
    const int n = W->cols;
    float sum = 0.0f;
    switch (W->fmt) {
    case WF_F32: {
        const float *w = (const float *)W->w + (size_t)r * n;
        for (int i = 0; i < n; i++) sum += w[i] * x[i];
        break;
    }
    case WF_BF16: {
        const uint16_t *w = (const uint16_t *)W->w + (size_t)r * n;
        for (int i = 0; i < n; i++) sum += bf16_to_f32(w[i]) * x[i];
        break;
    }
    case WF_FP8: { /* one fp32 multiplier per 128x128 block */
        const uint8_t *w = W->w + (size_t)r * n;
        const float *scale = W->fp8_scale + (size_t)(r / 128) * ((n + 127) / 128);
        for (int b = 0; b * 128 < n; b++) {
            float part = 0.0f;
            int end = b * 128 + 128 < n ? b * 128 + 128 : n;
            for (int i = b * 128; i < end; i++) part += fp8_table[w[i]] * x[i];
            sum += part * scale[b];
        }
        break;
    }
    case WF_MXFP4: { /* 32 E2M1 nibbles (16 bytes) share one E8M0 exponent */
        const uint8_t *w = W->w + (size_t)r * (n / 2);
        const uint8_t *scale = W->mx_scale + (size_t)r * (n / 32);
        for (int b = 0; b < n / 32; b++) {
            float part = 0.0f;
            for (int i = 0; i < 16; i++) {
                uint8_t byte = w[b * 16 + i];
                part += e2m1_value[byte & 15] * x[b * 32 + 2 * i] + e2m1_value[byte >> 4] * x[b * 32 + 2 * i + 1];
            }
            sum += part * e8m0_table[scale[b]];
        }
        break;
    }
    }
    return sum;
}

void mat_dequant_row(const Mat *W, int r, float *out) {
    const int n = W->cols;
    if (kernels.dequant_row) { kernels.dequant_row(W, r, out); return; }
    switch (W->fmt) {
    case WF_F32: memcpy(out, (const float *)W->w + (size_t)r * n, (size_t)n * sizeof(float)); break;
    case WF_BF16: {
        const uint16_t *w = (const uint16_t *)W->w + (size_t)r * n;
        for (int i = 0; i < n; i++) out[i] = bf16_to_f32(w[i]);
        break;
    }
    case WF_FP8: {
        const uint8_t *w = W->w + (size_t)r * n;
        const float *scale = W->fp8_scale + (size_t)(r / 128) * ((n + 127) / 128);
        for (int i = 0; i < n; i++) out[i] = fp8_table[w[i]] * scale[i / 128];
        break;
    }
    case WF_MXFP4: {
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

static float dot(const float *a, const float *b, int n) {
    if (kernels.dot) return kernels.dot(a, b, n);
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpy(float *y, float a, const float *x, int n) {
    if (kernels.axpy) { kernels.axpy(y, a, x, n); return; }
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* x = softmax(x) in place; the max is subtracted first, so no e^x overflows */
static void softmax(float *x, int n) {
    if (kernels.softmax) { kernels.softmax(x, n); return; }
    float mx = -INFINITY, sum = 0.0f;
    for (int j = 0; j < n; j++) if (x[j] > mx) mx = x[j];
    for (int j = 0; j < n; j++) { x[j] = expf(x[j] - mx); sum += x[j]; }
    for (int j = 0; j < n; j++) x[j] /= sum;
}

/* Rows r..r+nj-1 of W (nj <= 32) dequantized into rows[32][cols], then transposed into
 * the k-major panel[k*32 + j] the prefill micro-kernels stream through; lanes past nj
 * hold zeros. */
static void build_panel(const Mat *W, int r, int nj, float *rows, float *panel) {
    const int K = W->cols;
    int k0 = 0;
    for (int j = 0; j < 32; j++) {
        if (j < nj) mat_dequant_row(W, r + j, rows + (size_t)j * K);
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
/* Runs one-token products (decode) together: the rows of all of them in runs of up to
 * RUN_MAX bytes of weights, shorter toward the end, handed out as threads free up (with
 * runs of one size the threads spent 2.6-3.1% of a decode's products waiting for the last
 * one, now 1.1-1.6%: a profiling build's busy time). Each run is one sequential
 * stream, a thread the machine slows down does not keep the other waiting at the end
 * (measured 1.10x over one fixed half per thread), and several small products (the chosen
 * experts) keep every thread busy however many there are. xs: scratch [njobs][xs_cols]
 * for x in each kernel's layout, xs_cols >= XS_FOR(the widest job's columns) (jobs with
 * the same x and format share one). */
static void matvec_jobs(const Matvec *job, int njobs, float *xs, size_t xs_cols, int parallel) {
    const float *xl[njobs]; /* x of job j in its kernel's layout */
    const int threads = parallel ? g_threads : 1;
    double total = 0;
    for (int j = 0; j < njobs; j++) {
        const Mat *W = job[j].W;
        total += (double)W->bytes * job[j].nr / W->rows;
#pragma omp atomic
        g_bytes_read += (double)W->bytes * job[j].nr / W->rows;
#pragma omp atomic
        g_flops += 2.0 * job[j].nr * W->cols;
        xl[j] = NULL;
        for (int i = 0; i < j && !xl[j]; i++)
            if (job[i].x == job[j].x && job[i].W->fmt == W->fmt && job[i].W->cols == W->cols) xl[j] = xl[i];
        if (!xl[j] && kernels.matvec) {
            float *buf = xs + (size_t)j * xs_cols;
            if (matvec_in_bf16(W)) matvec_order_bf16(W, job[j].x, buf);
            else matvec_split_x(W, job[j].x, buf);
            xl[j] = buf;
        }
    }
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
        if (!kernels.matvec) /* the plain C reference */
            for (int i = lo; i < hi; i++) jb->y[i] = row_dot(jb->W, jb->r0 + i, jb->x);
        else if (matvec_in_bf16(jb->W))
            kernels.matvec_bf16(jb->W, jb->r0 + lo, hi - lo, xl[j], jb->y + lo);
        else
            kernels.matvec(jb->W, jb->r0 + lo, hi - lo, jb->x, xl[j], jb->y + lo);
    }
}

/* y[t*ldy + i] = Σ_k x[t*ldx + k] · W[r0+i][k] for rows i in [0, nr), tokens t in [0, n). */
static void matmul_rows(float *y, int ldy, const float *x, int ldx, const Mat *W, int r0, int nr, int n) {
    /* threads only pay off when there is real work: a tiny product runs on one */
    const int parallel = (double)nr * W->cols * (n < 8 ? n : 8) > g_parallel_min;
    if (n == 1) {
        Matvec job = {W, r0, nr, x, y};
        matvec_jobs(&job, 1, g_x_split + (size_t)thread_id() * XS_COLS, XS_COLS, parallel);
        return;
    }
#pragma omp atomic
    g_bytes_read += (double)W->bytes * nr / W->rows;
#pragma omp atomic
    g_flops += 2.0 * nr * W->cols * n;
    if (g_act_bf16 && kernels.gemm_panel_bf16) {
        /* the same blocking with bf16 inputs (2x the FMA rate): 32 rows by one k-chunk
         * at a time, the chunk's panel (32 KB) built straight from the file format and
         * streamed through by every token while it sits in L1/L2 */
        /* token rows of X are KP + 32 apart: at a multiple of 4 KB (GLM widths) the rows
         * a tile reads would share L1 sets and evict each other (measured 20% slower) */
        const int K = W->cols, KP = (K + 31) & ~31, KC = PANEL_KC, LDX = KP + 32;
#pragma omp parallel for schedule(static) if (parallel) /* one thread alone: ~1% of a prefill */
        for (int t = 0; t < n; t++) kernels.round_bf16(x + (size_t)t * ldx, K, g_x_bf16 + (size_t)t * LDX, KP);
        if (n <= ROWS_MAX_TOKENS && kernels.gemm_rows_bf16) { /* few tokens: 4 rows at a time, no panel */
#pragma omp parallel if (parallel)
            {
                uint16_t *wbuf = (uint16_t *)(g_panel + (size_t)thread_id() * g_panel_stride);
#pragma omp for schedule(dynamic, 4)
                for (int i = 0; i < nr; i += 4)
                    kernels.gemm_rows_bf16(W, r0 + i, nr - i < 4 ? nr - i : 4, g_x_bf16, LDX, n, y + i, ldy, wbuf);
            }
            return;
        }
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
        return;
    }
    if (kernels.gemm_panel && n >= 8) {
        /* 32 rows at a time are dequantized once into a k-major panel; then every
         * token streams through it in k-chunks small enough to stay in L2 */
        const int K = W->cols, KC = 512;
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
        return;
    }
    /* few tokens (an expert's share of a chunk) or no SIMD: dequantize a row, dot it with each token */
#pragma omp parallel if (parallel)
    {
        float *row = g_row_scratch + (size_t)thread_id() * g_scratch_cols;
#pragma omp for schedule(static)
        for (int i = 0; i < nr; i++) {
            mat_dequant_row(W, r0 + i, row);
            for (int t = 0; t < n; t++) y[(size_t)t * ldy + i] = dot(row, x + (size_t)t * ldx, W->cols);
        }
    }
}

static const char *product_precision(void) { return g_act_bf16 && kernels.gemm_panel_bf16 ? "bf16" : "fp32"; }

static void matmul(float *y, const float *x, const Mat *W, int n) {
    matmul_rows(y, W->rows, x, W->cols, W, 0, W->rows, n);
}

/* Several products of one chunk, y_i = W_i · x_i (a layer's projections of one input).
 * For one token they are one pool of runs in matvec_jobs: one parallel region and one
 * tail where each alone had its own, and the small ones (the indexer's key and gate
 * rows, 0.4-1.6 MB) stream beside the big ones instead of each paying a call's start
 * and end. xs: scratch [np][XS_COLS]. */
typedef struct { float *y; const float *x; const Mat *W; } Product;

static void matmul_pool(const Product *p, int np, int n, float *xs) {
    if (n > 1) {
        for (int i = 0; i < np; i++) matmul(p[i].y, p[i].x, p[i].W, n);
        return;
    }
    Matvec job[np];
    double work = 0; /* threads only pay off when there is real work, as in matmul_rows */
    for (int i = 0; i < np; i++) {
        job[i] = (Matvec){p[i].W, 0, p[i].W->rows, p[i].x, p[i].y};
        work += (double)p[i].W->rows * p[i].W->cols;
    }
    matvec_jobs(job, np, xs, XS_COLS, work > g_parallel_min);
}

/* ======================================================================== */
/* 6. the forward pass                                                      */

#define ATTN_HEAD_BLOCK 32       /* heads that share one pass over the selected cache rows */
#define KEY_BLOCK 128            /* cached rows per attention GEMM call: a block of keys */

/* Scratch for one chunk of up to `cap` tokens; allocated once, reused for every step. */
typedef struct {
    int cap;                 /* tokens per chunk */
    float *x;                /* [cap][H] residual stream */
    float *a;                /* [cap][H] normalised input of attention / MLP */
    float *cq;               /* [cap][QR] normalised q latent (also the indexer's query input) */
    float *q;                /* [cap][NH*(DN+DR)] */
    float *ckv;              /* [cap][KR+DR] */
    float *q_abs;            /* [cap][NH][KR+DR] absorbed query: W_UKᵀ·q_nope, then roped q_pe */
    float *o_lat;            /* [cap][NH][KR] attention output in latent space */
    float *o_heads;          /* [cap][NH*DV] */
    float *out;              /* [cap][H] output of attention / MLP before the residual add */
    float *scores;           /* [threads][ATTN_HEAD_BLOCK][PROBS_STRIDE(T)] attention and indexer scores */
    float *ix_q;             /* [cap][IH*ID] */
    float *ix_k;             /* [cap][ID] */
    float *ix_w;             /* [cap][IH] */
    int *heap;               /* [threads][topk] top-k selection */
    int *sel;                /* [cap][topk] key positions each token may attend to */
    int *n_sel;              /* [cap] */
    float *router;           /* [cap][E] */
    int *ex_idx;             /* [cap][n_active] chosen experts */
    float *ex_w;             /* [cap][n_active] their mixing weights */
    int *ex_tokens;          /* [cap] tokens routed to the expert being run */
    float *ex_x;             /* [cap][H] gathered inputs of one expert */
    float *ex_y;             /* [cap][H] its outputs */
    float *h1, *h2;          /* [cap][max(FD, n_shared*FI)] SwiGLU hidden */
    float *pool_xs;          /* [max(2(n_active+1), 4)][XS_COLS] decode: the x of each product of a pool
                              * (the chosen experts, a layer's projections) as its kernel reads it */
    float *uv_xs;            /* [NH][XS_FOR(KR)] decode: each head's o_lat as W_UV's kernel reads it */
    float *logits;           /* [V] the last token's logits (bench, compare scratch) */
    /* bf16 attention products of a prompt chunk (default precision, AVX512-BF16 only) */
    uint16_t *lat_bf16;      /* [T][KR+DR] the layer's cached latents rounded to bf16, or NULL */
    uint16_t *attn_bf16;     /* [threads][attn_bf16_stride] scratch: see attn_bf16_scratch */
    size_t attn_bf16_stride;
} RunState;

/* One thread's scratch for the bf16 attention products, in bf16 words; each part starts
 * on a 64-byte boundary. Returns the words needed; with base set, points the parts into it.
 *   absorb (per head):  w_uk [DN][KR] its W_UK rows, xq [cap][DN even] the q_nope of the
 *                       chunk's tokens, pairs [DN/2][32] words of one 32-column panel
 *   attend (per token and head block): qa [32][AD] the heads' q_abs, panel [ADP/2][32]
 *                       words of it (ADP = AD rounded up to 32) with stage [32][ADP/2] words
 *                       to build it, keys [KEY_BLOCK][AD] gathered rows, pairs
 *                       [KEY_BLOCK/2][32] words of value panel, probs [32][topk even] */
typedef struct { uint16_t *w_uk, *xq, *qa, *keys, *probs; uint32_t *absorb_pairs, *panel, *stage, *value_pairs; } AttnBf16;

/* Row stride (in elements) of the heads' scores and probabilities over ns keys: past ns,
 * and never a multiple of 4 KB. The value sums broadcast 12 heads' probabilities at once;
 * rows 2048 keys apart (8 KB in fp32, 4 KB in bf16) all fell in one L1 set, and the
 * decode attention of 2048 keys ran at a tenth of the FMA peak. */
#define PROBS_STRIDE(ns) ((((size_t)(ns) + 31) & ~(size_t)31) + 16)

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

static void runstate_init(RunState *s, const Config *c, int cap, int ctx) {
    memset(s, 0, sizeof *s);
    s->cap = cap;
    int ffn = c->dense_inter > c->n_shared * c->moe_inter ? c->dense_inter : c->n_shared * c->moe_inter;
    if (ffn < c->moe_inter) ffn = c->moe_inter;
    size_t B = (size_t)cap;
    s->x = xmalloc(B * c->hidden * sizeof(float));
    s->a = xmalloc(B * c->hidden * sizeof(float));
    s->cq = xmalloc(B * c->q_lora_rank * sizeof(float));
    s->q = xmalloc(B * c->n_heads * (c->qk_nope + c->qk_rope) * sizeof(float));
    s->ckv = xmalloc(B * (c->kv_lora_rank + c->qk_rope) * sizeof(float));
    s->q_abs = xmalloc(B * c->n_heads * (c->kv_lora_rank + c->qk_rope) * sizeof(float));
    s->o_lat = xmalloc(B * c->n_heads * c->kv_lora_rank * sizeof(float));
    s->o_heads = xmalloc(B * c->n_heads * c->v_head * sizeof(float));
    s->out = xmalloc(B * c->hidden * sizeof(float));
    s->scores = xmalloc((size_t)g_threads * ATTN_HEAD_BLOCK * PROBS_STRIDE(ctx) * sizeof(float));
    s->ix_q = xmalloc(B * c->index_n_heads * c->index_head_dim * sizeof(float));
    s->ix_k = xmalloc(B * c->index_head_dim * sizeof(float));
    s->ix_w = xmalloc(B * c->index_n_heads * sizeof(float));
    s->heap = xmalloc((size_t)g_threads * c->index_topk * sizeof(int));
    s->sel = xmalloc(B * c->index_topk * sizeof(int));
    s->n_sel = xmalloc(B * sizeof(int));
    s->router = xmalloc(B * c->n_experts * sizeof(float));
    s->ex_idx = xmalloc(B * c->n_active * sizeof(int));
    s->ex_w = xmalloc(B * c->n_active * sizeof(float));
    s->ex_tokens = xmalloc(B * sizeof(int));
    size_t rows = B > (size_t)c->n_active + 1 ? B : (size_t)c->n_active + 1; /* decode runs n_active+1 experts at once */
    s->ex_x = xmalloc(B * c->hidden * sizeof(float));
    s->ex_y = xmalloc(rows * c->hidden * sizeof(float));
    s->h1 = xmalloc(rows * ffn * sizeof(float));
    s->h2 = xmalloc(rows * ffn * sizeof(float));
    s->pool_xs = xmalloc((size_t)(c->n_active + 1 > 2 ? 2 * (c->n_active + 1) : 4) * XS_COLS * sizeof(float));
    s->uv_xs = xmalloc((size_t)c->n_heads * XS_FOR(c->kv_lora_rank) * sizeof(float));
    s->logits = xmalloc((size_t)c->vocab_size * sizeof(float));
    if (g_act_bf16 && kernels.gemm_panel_bf16 && kernels.pack_pairs_bf16 && kernels.build_panel_bf16 && kernels.round_bf16) {
        const int AD = c->kv_lora_rank + c->qk_rope;
        const size_t topk = (size_t)(c->index_topk < ctx ? c->index_topk : ctx);
        s->lat_bf16 = xmalloc((size_t)ctx * AD * sizeof(uint16_t));
        s->attn_bf16_stride = attn_bf16_scratch(c, cap, topk, NULL, NULL);
        s->attn_bf16 = xmalloc((size_t)g_threads * s->attn_bf16_stride * sizeof(uint16_t));
    }
}

/* This thread's part of s->scores: [ATTN_HEAD_BLOCK][PROBS_STRIDE(ctx)] floats. */
static float *thread_scores(const RunState *s, int ctx) {
    return s->scores + (size_t)thread_id() * ATTN_HEAD_BLOCK * PROBS_STRIDE(ctx);
}

static void runstate_free(RunState *s) {
    void *all[] = {s->x, s->a, s->cq, s->q, s->ckv, s->q_abs, s->o_lat, s->o_heads, s->out, s->scores,
                   s->ix_q, s->ix_k, s->ix_w, s->heap, s->sel, s->n_sel, s->router, s->ex_idx, s->ex_w,
                   s->ex_tokens, s->ex_x, s->ex_y, s->h1, s->h2, s->pool_xs, s->uv_xs, s->logits, s->lat_bf16, s->attn_bf16};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

static void kvcache_init(KVCache *kv, const Model *m, int ctx) {
    const Config *c = &m->cfg;
    kv->ctx = ctx;
    kv->pos = 0;
    kv->latent = xcalloc((size_t)c->n_layers * ctx * (c->kv_lora_rank + c->qk_rope), sizeof(float));
    kv->index_k = xcalloc((size_t)(m->n_index_layers ? m->n_index_layers : 1) * ctx * c->index_head_dim, sizeof(float));
}

static size_t kvcache_bytes(const Model *m, int ctx) {
    const Config *c = &m->cfg;
    return (size_t)ctx * ((size_t)c->n_layers * (c->kv_lora_rank + c->qk_rope) + (size_t)m->n_index_layers * c->index_head_dim) * sizeof(float);
}

static void kvcache_free(KVCache *kv) { free(kv->latent); free(kv->index_k); }

/* --- small ops ---------------------------------------------------------- */

/* RMSNorm (§3.1): y = w · x / sqrt(mean(x²) + eps), all fp32. */
static void rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) y[i] = w[i] * (x[i] * r);
}

/* LayerNorm with bias (indexer k_norm, §3.1, pitfall 9): biased variance, eps 1e-6. */
static void layernorm(float *y, const float *x, const float *w, const float *b, int n, float eps) {
    float mean = 0.0f, var = 0.0f;
    for (int i = 0; i < n; i++) mean += x[i];
    mean /= (float)n;
    for (int i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= (float)n;
    float r = 1.0f / sqrtf(var + eps);
    for (int i = 0; i < n; i++) y[i] = (x[i] - mean) * r * w[i] + b[i];
}

/* Interleaved (GPT-J) RoPE (§3.2): at position pos the pairs (2i, 2i+1) of a
 * `dims`-long vector rotate by pos·theta^(-2i/dims). rope_angles computes each pair's
 * cos and sin once per position, rope applies them to one vector: every head of a
 * token shares them (one pow and sincos per pair and head, on one thread, cost a 512-token
 * prefill 3.5%). Angles in double: at long context the fp32 product loses ~0.03 rad on
 * the fastest frequency. */
void rope_angles(float *cs, int dims, int pos, double theta) { /* cs: [dims/2][cos, sin] */
    for (int i = 0; i < dims / 2; i++) {
        double ang = (double)pos * pow(theta, -2.0 * i / dims);
        cs[2 * i] = (float)cos(ang);
        cs[2 * i + 1] = (float)sin(ang);
    }
}

static void rope(float *u, int dims, const float *cs) {
    for (int i = 0; i < dims / 2; i++) {
        float c = cs[2 * i], s = cs[2 * i + 1], a = u[2 * i], b = u[2 * i + 1];
        u[2 * i] = a * c - b * s;
        u[2 * i + 1] = a * s + b * c;
    }
}

static float silu(float x) { return x / (1.0f + expf(-x)); }
static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* The k best of score[0..n) in the strict order (higher score first, then lower
 * index first) into out[0..k). Ties are common (ReLU zeros in the indexer), so
 * the tie rule is part of the definition; the NumPy reference uses the same. */
static int better(const float *score, int a, int b) {
    return score[a] > score[b] || (score[a] == score[b] && a < b);
}

static void topk_select(const float *score, int n, int k, int *heap) {
    /* min-heap of the k best so far: heap[0] is the worst of them */
    for (int i = 0; i < n; i++) {
        int pos;
        if (i < k) { /* sift up */
            pos = i;
            while (pos > 0 && better(score, heap[(pos - 1) / 2], i)) { heap[pos] = heap[(pos - 1) / 2]; pos = (pos - 1) / 2; }
            heap[pos] = i;
        } else if (better(score, i, heap[0])) { /* replace the worst, sift down */
            pos = 0;
            for (;;) {
                int l = 2 * pos + 1, r = l + 1, w = pos;
                int wv = i; /* value being placed */
                if (l < k && better(score, wv, heap[l])) { w = l; wv = heap[l]; }
                if (r < k && better(score, wv, heap[r])) w = r;
                if (w == pos) break;
                heap[pos] = heap[w];
                pos = w;
            }
            heap[pos] = i;
        }
    }
}

/* --- the DSA lightning indexer (§3.4) ----------------------------------- */

/* I[t,s] = Σ_h w_h·ReLU(q_h·k_s / sqrt(ID)) / sqrt(IH): ReLU per head, then the
 * signed weighted sum (pitfall 10). */
static float index_score(const float *q, const float *w, const float *k, int IH, int ID) {
    const float q_scale = 1.0f / sqrtf((float)ID), w_scale = 1.0f / sqrtf((float)IH);
    float sum = 0.0f;
    for (int h = 0; h < IH; h++) {
        float d = dot(q + (size_t)h * ID, k, ID) * q_scale;
        sum += (w[h] * w_scale) * (d > 0.0f ? d : 0.0f);
    }
    return sum;
}

/* The same score from the heads' dot products of n keys, d[j*32 + h] = q_h·k_j (32 floats
 * a key, heads past nh zero: the GEMM's output): out[j] = Σ_h wh[h]·ReLU(d[j*32+h]·q_scale),
 * wh[h] = w_h / sqrt(IH), zero past nh. */
static void index_relu_sums(const float *d, int n, const float *wh, int nh, float q_scale, float *out) {
    if (kernels.index_relu_sums) { kernels.index_relu_sums(d, n, wh, q_scale, out); return; }
    for (int j = 0; j < n; j++) {
        float sum = 0.0f;
        for (int h = 0; h < nh; h++) {
            float x = d[(size_t)j * 32 + h] * q_scale;
            sum += wh[h] * (x > 0.0f ? x : 0.0f);
        }
        out[j] = sum;
    }
}

/* Token t of the chunk (visible keys 0..visible-1 of the layer's indexer-key cache):
 * index scores of every visible key, the top index_topk into s->sel. by_key: the keys
 * split across threads. */
static void index_token(const Config *c, const float *cache, int ctx, RunState *s, int t, int visible, int by_key) {
    const int IH = c->index_n_heads, ID = c->index_head_dim, K = c->index_topk;
    const int ix_gemm = kernels.gemm_panel && kernels.pack_panel && IH <= 32 && ID % 16 == 0 && (size_t)ID * 64 + 256 * 32 <= g_panel_stride;
    int *sel = s->sel + (size_t)t * K;
    if (visible <= K) { /* every visible key is kept: attention is dense causal */
        for (int j = 0; j < visible; j++) sel[j] = j;
        s->n_sel[t] = visible;
        return;
    }
    float *score = thread_scores(s, ctx);
    const float *q = s->ix_q + (size_t)t * IH * ID, *w = s->ix_w + (size_t)t * IH;
    if (ix_gemm) { /* keys x heads dot products as a GEMM: the keys are the "tokens", the
                    * heads the rows of a panel of q transposed; 256 keys at a time */
        float *qt = g_panel + (size_t)thread_id() * g_panel_stride, *qh = qt + (size_t)ID * 32; /* [ID][32], then [256][32] per thread */
        for (int h = 0; h < 32; h++) /* pack_panel wants 32 rows; heads past IH are zero */
            if (h >= IH) memset(qh + (size_t)h * ID, 0, (size_t)ID * sizeof(float));
            else memcpy(qh + (size_t)h * ID, q + (size_t)h * ID, (size_t)ID * sizeof(float));
        kernels.pack_panel(qh, ID, ID, qt);
        const float q_scale = 1.0f / sqrtf((float)ID), w_scale = 1.0f / sqrtf((float)IH);
        float wh[32] = {0}; /* the heads' weights as index_score scales them; zero past IH */
        for (int h = 0; h < IH; h++) wh[h] = w[h] * w_scale;
#pragma omp parallel for schedule(dynamic, 1) if (by_key && visible > 512)
        for (int j0 = 0; j0 < visible; j0 += 256) {
            int nk = visible - j0 < 256 ? visible - j0 : 256;
            float *kh = g_panel + (size_t)thread_id() * g_panel_stride + (size_t)ID * 32; /* after qt */
            memset(kh, 0, (size_t)nk * 32 * sizeof(float));
            kernels.gemm_panel(qt, 32, ID, cache + (size_t)j0 * ID, ID, nk, kh, 32, IH);
            index_relu_sums(kh, nk, wh, IH, q_scale, score + j0);
        }
    } else {
#pragma omp parallel for schedule(static) if (by_key && visible > 256)
        for (int j = 0; j < visible; j++) score[j] = index_score(q, w, cache + (size_t)j * ID, IH, ID);
    }
    topk_select(score, visible, K, sel);
    s->n_sel[t] = K;
}

/* For each token of the chunk: score every visible cached key, keep the top
 * index_topk positions in s->sel. Writes this chunk's indexer keys into the cache. */
static void indexer_select(const Model *m, const Layer *L, KVCache *kv, RunState *s, int n, int pos0) {
    const Config *c = &m->cfg;
    const int IH = c->index_n_heads, ID = c->index_head_dim;
    float *cache = kv->index_k + (size_t)L->index_slot * kv->ctx * ID;

    /* its projections came with attention's (attention()): s->ix_q = W_q_b · cq, the
     * queries from the normalised q latent; s->ix_k = W_k · a, one key per token from the
     * normalised hidden state; s->ix_w = W_weights · a, per-head gates, may be negative */
    float cs[c->qk_rope];
    for (int t = 0; t < n; t++) {
        rope_angles(cs, c->qk_rope, pos0 + t, c->rope_theta);
        for (int h = 0; h < IH; h++) rope(s->ix_q + ((size_t)t * IH + h) * ID, c->qk_rope, cs);
        float *k = cache + (size_t)(pos0 + t) * ID;
        layernorm(k, s->ix_k + (size_t)t * ID, L->ix_knorm_w, L->ix_knorm_b, ID, 1e-6f);
        rope(k, c->qk_rope, cs);
    }
    /* several tokens: split across threads; one token (decode): its keys are, in a
     * parallel region of its own (not nested in an idle one: a nested team on this
     * 2-core VM waited for the outer team's spinning threads, and two threads scanned
     * 4096 keys slower than one, 2.5 vs 1.6 ms) */
    if (n == 1) index_token(c, cache, kv->ctx, s, 0, pos0 + 1, 1);
    else {
#pragma omp parallel for schedule(dynamic, 1)
        for (int t = 0; t < n; t++) index_token(c, cache, kv->ctx, s, t, pos0 + t + 1, 0);
    }
    g_bytes_read += (double)n * (pos0 + n) * ID * sizeof(float);
    g_flops += 2.0 * n * (pos0 + n) * IH * ID;
}

/* --- MLA attention, absorbed form (§4.2) -------------------------------- */

/* Attention of each chunk token over the cached latents it may see (s->sel).
 * Keys are never expanded per head: the query is pulled into latent space
 * (q_abs = W_UKᵀ·q_nope), scores are q_abs·c + q_pe·k_pe, the value sum stays a
 * latent (o_lat = Σ p·c), and W_UV lifts it to the head output at the end. */
/* The cached latent rows of keys sel[0..nk) as nk rows of AD floats: in place when they
 * are consecutive positions (a prompt attending to its own prefix), else copied into buf. */
static const float *key_rows(const float *latent, int AD, const int *sel, int nk, float *buf) {
    int consecutive = sel[nk - 1] - sel[0] == nk - 1;
    for (int j = 1; j < nk && consecutive; j++) consecutive = sel[j] == sel[j - 1] + 1;
    if (consecutive) return latent + (size_t)sel[0] * AD;
    for (int j = 0; j < nk; j++) memcpy(buf + (size_t)j * AD, latent + (size_t)sel[j] * AD, (size_t)AD * sizeof(float));
    return buf;
}

/* The same for the bf16 copy of the rows (lat_bf16). */
static const uint16_t *key_rows_bf16(const uint16_t *lat, int AD, const int *sel, int nk, uint16_t *buf) {
    int consecutive = sel[nk - 1] - sel[0] == nk - 1;
    for (int j = 1; j < nk && consecutive; j++) consecutive = sel[j] == sel[j - 1] + 1;
    if (consecutive) return lat + (size_t)sel[0] * AD;
    for (int j = 0; j < nk; j++) memcpy(buf + (size_t)j * AD, lat + (size_t)sel[j] * AD, (size_t)AD * sizeof(uint16_t));
    return buf;
}

static void mla_attend_absorbed(const Model *m, const Layer *L, const KVCache *kv, RunState *s, int layer, int n, int pos0) {
    const Config *c = &m->cfg;
    const int NH = c->n_heads, DN = c->qk_nope, DR = c->qk_rope, DV = c->v_head, KR = c->kv_lora_rank;
    const int QD = DN + DR, AD = KR + DR, K = c->index_topk;
    const float *latent = kv->latent + (size_t)layer * kv->ctx * AD;
    const float scale = 1.0f / sqrtf((float)(DN + DR)); /* 1/sqrt(qk_head_dim), not of the latent width (pitfall 7) */

    /* absorb: q_abs[t][h][0:KR] = Σ_i q_nope[t][h][i] · W_UK[h][i][:]. W_UK[h] is
     * already k-major (row i, latent column j), so for a prompt the GEMM micro-kernel
     * reads 32 of its columns at a time in place (ldp = KR). */
    /* a prompt chunk in the default precision: every product below in bf16 (vdpbf16ps),
     * its panels built from W_UK's rows and the cached latents rounded to bf16 */
    const int bf16 = n >= 8 && s->lat_bf16 && AD % 2 == 0;
    const int absorb_gemm = n >= 8 && kernels.gemm_panel && (size_t)DN * KR <= g_panel_stride;
#pragma omp parallel
    {
        float *row = g_row_scratch + (size_t)thread_id() * g_scratch_cols;
        float *w_uk = g_panel + (size_t)thread_id() * g_panel_stride; /* [DN][KR] */
        AttnBf16 b;
        if (bf16) attn_bf16_scratch(c, s->cap, (size_t)(K < kv->ctx ? K : kv->ctx), s->attn_bf16 + (size_t)thread_id() * s->attn_bf16_stride, &b);
#pragma omp for schedule(static)
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < n; t++) {
                memset(s->q_abs + ((size_t)t * NH + h) * AD, 0, (size_t)KR * sizeof(float));
                memcpy(s->q_abs + ((size_t)t * NH + h) * AD + KR, s->q + ((size_t)t * NH + h) * QD + DN, (size_t)DR * sizeof(float));
            }
            if (bf16) { /* the k of this product runs down W_UK's rows: 32 columns at a time are
                         * interleaved into row pairs, the tokens' q_nope streams through them */
                const int DNE = (DN + 1) & ~1;
                for (int i = 0; i < DN; i++) {
                    mat_dequant_row(&L->kv_b, h * (DN + DV) + i, row);
                    kernels.round_bf16(row, KR, b.w_uk + (size_t)i * KR, KR);
                }
                for (int t = 0; t < n; t++) kernels.round_bf16(s->q + ((size_t)t * NH + h) * QD, DN, b.xq + (size_t)t * DNE, DNE);
                for (int j0 = 0; j0 < KR; j0 += 32) {
                    int nj = KR - j0 < 32 ? KR - j0 : 32;
                    kernels.pack_pairs_bf16(b.w_uk + j0, KR, NULL, DN, nj, b.absorb_pairs);
                    kernels.gemm_panel_bf16((const uint16_t *)b.absorb_pairs, DNE, b.xq, DNE, n, s->q_abs + (size_t)h * AD + j0, NH * AD, nj);
                }
                continue;
            }
            if (absorb_gemm) {
                for (int i = 0; i < DN; i++) mat_dequant_row(&L->kv_b, h * (DN + DV) + i, w_uk + (size_t)i * KR);
                for (int j0 = 0; j0 < KR; j0 += 32)
                    kernels.gemm_panel(w_uk + j0, KR, DN, s->q + (size_t)h * QD, NH * QD, n, s->q_abs + (size_t)h * AD + j0, NH * AD,
                                       KR - j0 < 32 ? KR - j0 : 32);
                continue;
            }
            if (n == 1 && L->kv_b.fmt == WF_BF16 && kernels.matvec_transposed_bf16) {
                kernels.matvec_transposed_bf16(&L->kv_b, h * (DN + DV), DN, s->q + (size_t)h * QD, s->q_abs + (size_t)h * AD);
                continue;
            }
            for (int i = 0; i < DN; i++) {
                mat_dequant_row(&L->kv_b, h * (DN + DV) + i, row);
                for (int t = 0; t < n; t++) axpy(s->q_abs + ((size_t)t * NH + h) * AD, s->q[((size_t)t * NH + h) * QD + i], row, KR);
            }
        }
    }
    g_bytes_read += (double)L->kv_b.bytes * DN / (DN + DV);
    g_flops += 2.0 * n * NH * DN * KR;

    /* scores, softmax and the latent value sum, per (token, block of heads): the
     * heads of a block share each cached row while it is in L1, so a long context
     * is read once per block rather than once per head */
    const int HB = ATTN_HEAD_BLOCK, n_blocks = (NH + HB - 1) / HB;
    /* with SIMD both products are GEMMs over blocks of KEY_BLOCK keys (in place when
     * consecutive): scores with the block's heads as the panel (their q_abs packed k-major
     * once, the cached rows streaming through it as "tokens"), value sums with the rows
     * as the panel (k-major already, ldp = AD) and the heads' probabilities as tokens */
    const int attn_gemm = kernels.gemm_panel && kernels.pack_panel && AD % 16 == 0 &&
                          (size_t)AD * (64 + KEY_BLOCK) + (size_t)K * 32 <= g_panel_stride;
    if (bf16 && attn_gemm) { /* the rows this chunk may read, once per layer and chunk */
#pragma omp parallel for schedule(static)
        for (int r = 0; r < pos0 + n; r++) kernels.round_bf16(latent + (size_t)r * AD, AD, s->lat_bf16 + (size_t)r * AD, AD);
    }
#pragma omp parallel for schedule(dynamic, 1) collapse(2)
    for (int t = 0; t < n; t++) {
        for (int hb = 0; hb < n_blocks; hb++) {
            const int h0 = hb * HB, nh = NH - h0 < HB ? NH - h0 : HB;
            const int *sel = s->sel + (size_t)t * K, ns = s->n_sel[t];
            const size_t lds = PROBS_STRIDE(ns);
            float *score = thread_scores(s, kv->ctx); /* [nh][lds] */
            const float *qa = s->q_abs + ((size_t)t * NH + h0) * AD;
            float *o = s->o_lat + ((size_t)t * NH + h0) * KR;
            memset(o, 0, (size_t)nh * KR * sizeof(float));
            float *qp = g_panel + (size_t)thread_id() * g_panel_stride; /* [AD][32] the heads, k-major */
            float *keys = qp + (size_t)AD * 32;                          /* [32][AD] staging, then [KEY_BLOCK][AD] rows */
            float *st = keys + (size_t)AD * (32 + KEY_BLOCK);            /* [ns][32] scores, key-major */
            AttnBf16 b;
            if (bf16 && attn_gemm) {
                attn_bf16_scratch(c, s->cap, (size_t)(K < kv->ctx ? K : kv->ctx), s->attn_bf16 + (size_t)thread_id() * s->attn_bf16_stride, &b);
                /* the heads' q_abs in bf16 are a small BF16 matrix [nh][AD]: its panel is built
                 * like a weight's, and the keys' bf16 rows stream through it */
                for (int h = 0; h < nh; h++) kernels.round_bf16(qa + (size_t)h * AD, AD, b.qa + (size_t)h * AD, AD);
                const Mat heads = {.fmt = WF_BF16, .rows = nh, .cols = AD, .w = (const uint8_t *)b.qa};
                kernels.build_panel_bf16(&heads, 0, nh, 0, (AD + 31) & ~31, b.stage, b.panel);
                memset(st, 0, (size_t)ns * 32 * sizeof(float));
                for (int j0 = 0; j0 < ns; j0 += KEY_BLOCK) {
                    int nk = ns - j0 < KEY_BLOCK ? ns - j0 : KEY_BLOCK;
                    kernels.gemm_panel_bf16((const uint16_t *)b.panel, AD, key_rows_bf16(s->lat_bf16, AD, sel + j0, nk, b.keys), AD, nk,
                                            st + (size_t)j0 * 32, 32, nh);
                }
                for (int h = 0; h < nh; h++)
                    for (int j = 0; j < ns; j++) score[(size_t)h * lds + j] = st[(size_t)j * 32 + h] * scale;
            } else if (attn_gemm) {
                const float *heads = qa;
                if (nh < 32) { /* pack_panel reads 32 rows */
                    memcpy(keys, qa, (size_t)nh * AD * sizeof(float));
                    memset(keys + (size_t)nh * AD, 0, (size_t)(32 - nh) * AD * sizeof(float));
                    heads = keys;
                }
                kernels.pack_panel(heads, AD, AD, qp);
                memset(st, 0, (size_t)ns * 32 * sizeof(float));
                for (int j0 = 0; j0 < ns; j0 += KEY_BLOCK) {
                    int nk = ns - j0 < KEY_BLOCK ? ns - j0 : KEY_BLOCK;
                    kernels.gemm_panel(qp, 32, AD, key_rows(latent, AD, sel + j0, nk, keys + (size_t)AD * 32), AD, nk, st + (size_t)j0 * 32, 32, nh);
                }
                for (int h = 0; h < nh; h++)
                    for (int j = 0; j < ns; j++) score[(size_t)h * lds + j] = st[(size_t)j * 32 + h] * scale;
            } else {
                for (int j = 0; j < ns; j++) {
                    const float *row = latent + (size_t)sel[j] * AD;
                    for (int h = 0; h < nh; h++) score[(size_t)h * lds + j] = dot(qa + (size_t)h * AD, row, AD) * scale;
                }
            }
            for (int h = 0; h < nh; h++) softmax(score + (size_t)h * lds, ns); /* over the selected keys */
            if (bf16 && attn_gemm) { /* o[h] = Σ_j p[h][j] · row j[0:KR]: the k of this product
                                      * runs down the key rows, interleaved in pairs 32 columns
                                      * at a time; the probabilities stream through */
                const int nsp = (int)lds; /* even */
                for (int h = 0; h < nh; h++) kernels.round_bf16(score + (size_t)h * lds, ns, b.probs + (size_t)h * nsp, nsp);
                for (int j0 = 0; j0 < ns; j0 += KEY_BLOCK) {
                    int nk = ns - j0 < KEY_BLOCK ? ns - j0 : KEY_BLOCK;
                    for (int d0 = 0; d0 < KR; d0 += 32) {
                        int nj = KR - d0 < 32 ? KR - d0 : 32;
                        kernels.pack_pairs_bf16(s->lat_bf16 + d0, AD, sel + j0, nk, nj, b.value_pairs);
                        kernels.gemm_panel_bf16((const uint16_t *)b.value_pairs, (nk + 1) & ~1, b.probs + j0, nsp, nh, o + d0, KR, nj);
                    }
                }
            } else if (attn_gemm) { /* o[h] = Σ_j p[h][j] · row j[0:KR] */
                for (int j0 = 0; j0 < ns; j0 += KEY_BLOCK) {
                    int nk = ns - j0 < KEY_BLOCK ? ns - j0 : KEY_BLOCK;
                    const float *rows = key_rows(latent, AD, sel + j0, nk, keys + (size_t)AD * 32);
                    for (int d0 = 0; d0 < KR; d0 += 32)
                        kernels.gemm_panel(rows + d0, AD, nk, score + j0, (int)lds, nh, o + d0, KR, KR - d0 < 32 ? KR - d0 : 32);
                }
            } else {
                for (int j = 0; j < ns; j++) {
                    const float *row = latent + (size_t)sel[j] * AD;
                    for (int h = 0; h < nh; h++) axpy(o + (size_t)h * KR, score[(size_t)h * lds + j], row, KR);
                }
            }
        }
    }
    for (int t = 0; t < n; t++) {
        g_bytes_read += (double)s->n_sel[t] * AD * sizeof(float);
        g_flops += 2.0 * NH * s->n_sel[t] * (AD + KR);
    }

    /* un-absorb: o_heads[t][h] = W_UV[h] · o_lat[t][h]. For one token the NH small
     * products (DV rows each, a different x each) go to matvec_jobs as one pool: 1.8x
     * the GB/s of a parallel loop over heads of one product each, whose per-call costs
     * (x's layout, a nested parallel region) weigh on 256 KB of weights. */
    if (n == 1) {
        Matvec job[NH];
        for (int h = 0; h < NH; h++)
            job[h] = (Matvec){&L->kv_b, h * (DN + DV) + DN, DV, s->o_lat + (size_t)h * KR, s->o_heads + (size_t)h * DV};
        matvec_jobs(job, NH, s->uv_xs, XS_FOR(KR), 1);
    } else
        for (int h = 0; h < NH; h++)
            matmul_rows(s->o_heads + (size_t)h * DV, NH * DV, s->o_lat + (size_t)h * KR, NH * KR, &L->kv_b, h * (DN + DV) + DN, DV, n);
}

/* One attention block for the chunk: projections, cache append, the indexer
 * (full layers) or the previous selection (shared layers), attention, o_proj. */
static void attention(const Model *m, const Layer *L, KVCache *kv, RunState *s, int layer, int n, int pos0) {
    const Config *c = &m->cfg;
    const int NH = c->n_heads, DN = c->qk_nope, DR = c->qk_rope, KR = c->kv_lora_rank, AD = KR + DR;

    /* the products of the input a, then those of the q latent cq, each set as one pool
     * (matmul_pool); a full layer's indexer takes its projections from the same inputs */
    const int ix = L->has_indexer;
    const Product from_a[4] = {{s->cq, s->a, &L->q_a}, {s->ckv, s->a, &L->kv_a}, {s->ix_k, s->a, &L->ix_wk}, {s->ix_w, s->a, &L->ix_weights}};
    matmul_pool(from_a, ix ? 4 : 2, n, s->pool_xs);
    for (int t = 0; t < n; t++) /* eps 1e-6 for the q/kv latent norms (pitfall 4) */
        rmsnorm(s->cq + (size_t)t * c->q_lora_rank, s->cq + (size_t)t * c->q_lora_rank, L->q_a_norm, c->q_lora_rank, 1e-6f);
    const Product from_cq[2] = {{s->q, s->cq, &L->q_b}, {s->ix_q, s->cq, &L->ix_wq_b}};
    matmul_pool(from_cq, ix ? 2 : 1, n, s->pool_xs);
    float cs[DR];
    for (int t = 0; t < n; t++) {
        rope_angles(cs, DR, pos0 + t, c->rope_theta);
        for (int h = 0; h < NH; h++) rope(s->q + ((size_t)t * NH + h) * (DN + DR) + DN, DR, cs);
        float *row = kv->latent + ((size_t)layer * kv->ctx + pos0 + t) * AD;
        rmsnorm(row, s->ckv + (size_t)t * AD, L->kv_a_norm, KR, 1e-6f);
        memcpy(row + KR, s->ckv + (size_t)t * AD + KR, (size_t)DR * sizeof(float));
        rope(row + KR, DR, cs);
    }
    if (L->has_indexer) indexer_select(m, L, kv, s, n, pos0);
    /* a shared layer keeps s->sel from the last full layer (IndexShare, §3.6) */
    mla_attend_absorbed(m, L, kv, s, layer, n, pos0);
    matmul(s->out, s->o_heads, &L->o, n);
}

/* --- feed-forward ------------------------------------------------------- */

/* SwiGLU MLP on n rows of x: y = W_down · (SiLU(W_gate·x) ⊙ (W_up·x)). */
/* h[i] = silu(gate[i]) · up[i], in place in the gate's buffer */
static void swiglu_act(float *h_gate, const float *h_up, size_t m) {
#pragma omp parallel for if (m > 65536)
    for (size_t i = 0; i < m; i++) h_gate[i] = silu(h_gate[i]) * h_up[i];
}

static void swiglu(float *y, const float *x, const Mat *gate, const Mat *up, const Mat *down, float *h1, float *h2, int n, float *pool_xs) {
    const Product gate_up[2] = {{h1, x, gate}, {h2, x, up}};
    matmul_pool(gate_up, 2, n, pool_xs);
    swiglu_act(h1, h2, (size_t)n * gate->rows);
    matmul(y, h1, down, n);
}

/* Router (§3.7): fp32 sigmoid scores; the correction bias and group limit decide
 * only WHICH experts run; the weights are the plain scores, renormalised, × scale. */
static void moe_route(const Config *c, const float *logits, const float *bias, int *idx, float *weight) {
    const int E = c->n_experts, G = c->n_group, per = E / G;
    float score[E], sel[E];
    for (int e = 0; e < E; e++) { score[e] = sigmoidf(logits[e]); sel[e] = score[e] + bias[e]; }
    if (G > 1) { /* keep the topk_group groups with the largest sum of their two best experts */
        float gscore[G];
        int gbest[G];
        for (int g = 0; g < G; g++) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int e = g * per; e < (g + 1) * per; e++) {
                if (sel[e] > b1) { b2 = b1; b1 = sel[e]; }
                else if (sel[e] > b2) b2 = sel[e];
            }
            gscore[g] = b1 + b2;
        }
        topk_select(gscore, G, c->topk_group, gbest);
        for (int g = 0; g < G; g++) {
            int kept = 0;
            for (int i = 0; i < c->topk_group; i++) kept |= gbest[i] == g;
            if (!kept) for (int e = g * per; e < (g + 1) * per; e++) sel[e] = -INFINITY;
        }
    }
    topk_select(sel, E, c->n_active, idx);
    float sum = 0.0f;
    for (int k = 0; k < c->n_active; k++) { weight[k] = score[idx[k]]; sum += weight[k]; }
    for (int k = 0; k < c->n_active; k++)
        weight[k] = (c->norm_topk_prob ? weight[k] / (sum + 1e-20f) : weight[k]) * c->routed_scale;
}

/* MoE block for n tokens: route, then run each chosen expert once on all the
 * tokens that chose it (its weights are read once per chunk), plus the shared expert. */
static void moe(const Model *m, const Layer *L, RunState *s, const float *x, float *y, int n) {
    const Config *c = &m->cfg;
    const int H = c->hidden, A = c->n_active, F = c->moe_inter;
    matmul(s->router, x, &L->router, n);
    for (int t = 0; t < n; t++) moe_route(c, s->router + (size_t)t * c->n_experts, L->router_bias, s->ex_idx + (size_t)t * A, s->ex_w + (size_t)t * A);

    if (n == 1) { /* decode: the chosen experts and the shared one as one pool of rows (matvec_jobs) */
        const size_t slot = (size_t)F * (c->n_shared > 1 ? c->n_shared : 1); /* hidden width of one expert */
        const int J = A + (c->n_shared ? 1 : 0);
        Matvec job[2 * J];
        for (int k = 0; k < J; k++) { /* k == A: the shared expert, whose output is y itself, unscaled (pitfall 8) */
            const Mat *gate = k < A ? &L->ex_gate[s->ex_idx[k]] : &L->sh_gate, *up = k < A ? &L->ex_up[s->ex_idx[k]] : &L->sh_up;
            job[2 * k] = (Matvec){gate, 0, gate->rows, x, s->h1 + k * slot};
            job[2 * k + 1] = (Matvec){up, 0, up->rows, x, s->h2 + k * slot};
        }
        matvec_jobs(job, 2 * J, s->pool_xs, XS_COLS, 1);
        for (int k = 0; k < J; k++) {
            float *h1 = s->h1 + k * slot, *h2 = s->h2 + k * slot;
            swiglu_act(h1, h2, (size_t)job[2 * k].nr);
            const Mat *down = k < A ? &L->ex_down[s->ex_idx[k]] : &L->sh_down;
            job[k] = (Matvec){down, 0, down->rows, h1, k < A ? s->ex_y + (size_t)k * H : y};
        }
        matvec_jobs(job, J, s->pool_xs, XS_COLS, 1);
        if (!c->n_shared) memset(y, 0, (size_t)H * sizeof(float));
        for (int k = 0; k < A; k++)
            for (int j = 0; j < H; j++) y[j] += s->ex_w[k] * s->ex_y[(size_t)k * H + j];
        return;
    }
    if (c->n_shared) swiglu(y, x, &L->sh_gate, &L->sh_up, &L->sh_down, s->h1, s->h2, n, s->pool_xs); /* unscaled (pitfall 8) */
    else memset(y, 0, (size_t)n * H * sizeof(float));
    for (int e = 0; e < c->n_experts; e++) {
        int cnt = 0;
        for (int t = 0; t < n; t++)
            for (int k = 0; k < A; k++)
                if (s->ex_idx[t * A + k] == e) s->ex_tokens[cnt++] = t * A + k; /* remembers token and slot */
        if (!cnt) continue;
        /* gather its tokens' inputs, run it, add its weighted outputs back; a token picks an
         * expert once, so the rows of one expert's scatter are distinct (no race) */
#pragma omp parallel for if (cnt > 1)
        for (int i = 0; i < cnt; i++) memcpy(s->ex_x + (size_t)i * H, x + (size_t)(s->ex_tokens[i] / A) * H, (size_t)H * sizeof(float));
        swiglu(s->ex_y, s->ex_x, &L->ex_gate[e], &L->ex_up[e], &L->ex_down[e], s->h1, s->h2, cnt, s->pool_xs);
#pragma omp parallel for if (cnt > 1)
        for (int i = 0; i < cnt; i++) {
            int t = s->ex_tokens[i] / A;
            float w = s->ex_w[s->ex_tokens[i]];
            for (int j = 0; j < H; j++) y[(size_t)t * H + j] += w * s->ex_y[(size_t)i * H + j];
        }
    }
}

/* --- the whole model (§3.9) --------------------------------------------- */

#ifdef GLM_GPU
/* --gpu: every forward() runs glm_hip.hip's copy of it instead, at the same cache
 * position; sample() then draws on the device from the logits it left there. */
static GpuModel *g_gpu;
static const float *g_gpu_logits;    /* host copy of the device's last-token logits */
#endif

/* Runs tokens[0..n) at positions kv->pos.. and appends them to the cache. Writes
 * logits [n][V] if all_logits, else only the last token's [V] (may be NULL). */
static void forward(const Model *m, KVCache *kv, RunState *s, const int *tokens, int n, float *logits, int all_logits) {
#ifdef GLM_GPU
    if (g_gpu) {
        gpu_forward(g_gpu, kv->pos, tokens, n, logits, all_logits);
        kv->pos += n;
        g_gpu_logits = all_logits ? NULL : logits;
        return;
    }
#endif
    const Config *c = &m->cfg;
    const int H = c->hidden;
    for (int start = 0; start < n; start += s->cap) {
        int B = n - start < s->cap ? n - start : s->cap, pos0 = kv->pos;
        for (int t = 0; t < B; t++) mat_dequant_row(&m->embed, tokens[start + t], s->x + (size_t)t * H);
        g_bytes_read += (double)B * m->embed.bytes / m->embed.rows;
        for (int l = 0; l < c->n_layers; l++) {
            const Layer *L = &m->layers[l];
            /* the per-token steps of a prompt run on all threads too (if B > 1: for one token,
             * waking them costs more than the step) */
#pragma omp parallel for if (B > 1)
            for (int t = 0; t < B; t++) rmsnorm(s->a + (size_t)t * H, s->x + (size_t)t * H, L->input_norm, H, c->rms_eps);
            attention(m, L, kv, s, l, B, pos0);
#pragma omp parallel for if (B > 1)
            for (int t = 0; t < B; t++) axpy(s->x + (size_t)t * H, 1.0f, s->out + (size_t)t * H, H); /* x += out */
#pragma omp parallel for if (B > 1)
            for (int t = 0; t < B; t++) rmsnorm(s->a + (size_t)t * H, s->x + (size_t)t * H, L->post_norm, H, c->rms_eps);
            if (c->dense[l]) swiglu(s->out, s->a, &L->gate, &L->up, &L->down, s->h1, s->h2, B, s->pool_xs);
            else moe(m, L, s, s->a, s->out, B);
#pragma omp parallel for if (B > 1)
            for (int t = 0; t < B; t++) axpy(s->x + (size_t)t * H, 1.0f, s->out + (size_t)t * H, H); /* x += out */
        }
        kv->pos += B;
        if (all_logits) {
            for (int t = 0; t < B; t++) rmsnorm(s->a + (size_t)t * H, s->x + (size_t)t * H, m->final_norm, H, c->rms_eps);
            matmul(logits + (size_t)start * c->vocab_size, s->a, &m->lm_head, B);
        } else if (logits && start + B == n) {
            rmsnorm(s->a, s->x + (size_t)(B - 1) * H, m->final_norm, H, c->rms_eps);
            matmul(logits, s->a, &m->lm_head, 1);
        }
    }
}

/* ======================================================================== */
/* 7. sampling                                                              */

typedef struct {
    float temperature;       /* 0 = greedy */
    float top_p;             /* nucleus size, 1 = off */
    uint64_t rng;            /* xorshift64* state */
    int *order;              /* [V] scratch for top-p */
} Sampler;

static float random_f32(Sampler *sp) { /* uniform in [0, 1) */
    sp->rng ^= sp->rng >> 12; sp->rng ^= sp->rng << 25; sp->rng ^= sp->rng >> 27;
    return (float)((sp->rng * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

/* The first index of the largest x. The running maximum sits in a register: comparing
 * with x[best] instead made every step wait for a load of the last winner (0.65 ms a
 * token over the 154880 logits, 2% of a decode; now 0.11 ms). */
static int argmax(const float *x, int n) {
    int best = 0;
    float top = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > top) { top = x[i]; best = i; }
    return best;
}

static const float *g_sort_probs;
static int cmp_prob_desc(const void *a, const void *b) {
    float x = g_sort_probs[*(const int *)a], y = g_sort_probs[*(const int *)b];
    return x < y ? 1 : x > y ? -1 : (*(const int *)a - *(const int *)b);
}

/* Picks the next token from logits[V] (overwritten with probabilities). */
static int sample(Sampler *sp, float *logits, int V) {
#ifdef GLM_GPU
    if (g_gpu && logits && logits == g_gpu_logits) { /* same draws from the same generator */
        g_gpu_logits = NULL;
        return gpu_sample(g_gpu, sp->temperature, sp->top_p, sp->temperature > 0.0f ? random_f32(sp) : 0.0f);
    }
#endif
    if (sp->temperature <= 0.0f) return argmax(logits, V);
    float mx = logits[argmax(logits, V)], sum = 0.0f;
    for (int i = 0; i < V; i++) { logits[i] = expf((logits[i] - mx) / sp->temperature); sum += logits[i]; }
    for (int i = 0; i < V; i++) logits[i] /= sum;
    int n = 0;
    if (sp->top_p < 1.0f) { /* sort only tokens that could be in the nucleus */
        float cutoff = (1.0f - sp->top_p) / (float)(V - 1);
        for (int i = 0; i < V; i++) if (logits[i] >= cutoff) sp->order[n++] = i;
        g_sort_probs = logits;
        qsort(sp->order, (size_t)n, sizeof(int), cmp_prob_desc);
        float cum = 0.0f;
        int last = n - 1;
        for (int i = 0; i < n; i++) { cum += logits[sp->order[i]]; if (cum > sp->top_p) { last = i; break; } }
        n = last + 1;
        sum = cum < sp->top_p ? cum : 0.0f;
        if (sum == 0.0f) for (int i = 0; i < n; i++) sum += logits[sp->order[i]];
    } else {
        for (int i = 0; i < V; i++) sp->order[i] = i;
        n = V;
        sum = 1.0f;
    }
    float r = random_f32(sp) * sum, cdf = 0.0f;
    for (int i = 0; i < n; i++) { cdf += logits[sp->order[i]]; if (r < cdf) return sp->order[i]; }
    return sp->order[n - 1];
}

/* ======================================================================== */
/* 8. the command line                                                      */

typedef struct {
    const char *cmd;
    const char *model_dir;
    const char *ids;         /* --ids 1,2,3 */
    const char *prompt;      /* -p TEXT */
    const char *out;         /* -o FILE */
    const char *tokenizer;   /* --tokenizer FILE, default DIR/tokenizer.json */
    const char *system;      /* chat: --system TEXT */
    const char *effort;      /* chat: --effort max|high|none */
    int no_think;            /* chat: --no-think */
    int n_gen;               /* -n */
    int ctx;                 /* --ctx, 0 = default */
    int decode;              /* --decode: logits one token at a time */
    int threads;             /* -t, 0 = OpenMP default */
    float temperature, top_p;
    uint64_t seed;
#ifdef GLM_GPU
    int gpu;                 /* --gpu: the forward pass runs on the GPU (glm_hip.hip) */
    int n_gpus;              /* --gpus N: layers split across N GPUs (implies --gpu) */
#endif
} Args;

static void usage(void) {
    fprintf(stderr,
            "usage: glm COMMAND [options]\n"
            "commands:\n"
            "  run      -m DIR (--ids 1,2,3 | -p TEXT) [-n N] [--temp T] [--top-p P] [--seed S]\n"
            "           -p is raw text: write the chat markup yourself, e.g. \"[gMASK]<sop><|user|>Hi<|assistant|><think>\"\n"
            "  chat     -m DIR [--system TEXT] [--no-think] [--effort max|high|none]   multi-turn chat on stdin\n"
            "  logits   -m DIR --ids 1,2,3 -o FILE [--decode]   write float32 logits [n][vocab]\n"
            "  tokenize -m DIR \"text\" | --decode -m DIR 1,2,3 | -m DIR --jsonl   (see glm tokenize --help)\n"
            "  compare  -m A -m B (--ids 1,2,3 | -p TEXT)   KL divergence, top-1 agreement, perplexity of two checkpoints\n"
            "  bench    -m DIR [-P 512] [--long 4096] [-n 32] [--json]   speed vs this machine's bandwidth and FMA peak\n"
            "  synth    OUT_DIR [--layers N] [--experts E] [--format mxfp4|bf16]   random real-width checkpoint\n"
            "  convert  IN_DIR OUT_DIR [--attn] [--all-linear]  BF16/FP8 checkpoint -> Quark MXFP4\n"
            "options: --ctx N (context length, default 4096), -t N (threads), --tokenizer FILE (default DIR/tokenizer.json)\n"
            "         --no-mmap: read the weights into 2 MB-page memory instead of mapping the files (2 MB pages whatever the cache holds; RAM for a copy)\n"
            "         --fp32: weight products in fp32 (default where the CPU has AVX512-BF16: activations rounded to\n"
            "           bf16, ~2x faster prefill and faster decode, ~1e-3 relative error; --bf16 asks for it,\n"
            "           GLM_PRECISION=fp32|bf16 sets the default)\n"
            "sampling: --temp 0 is greedy; defaults --temp 1 --top-p 0.95 (GLM-5.2 generation_config)\n");
#ifdef GLM_GPU
    fprintf(stderr, "         --gpu (forward pass on the GPU), --gpus N (layers split across N GPUs)\n");
#endif
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

static void parse_args(Args *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->cmd = argv[1];
    a->n_gen = 32;
    a->temperature = 1.0f;
    a->top_p = 0.95f; /* generation_config.json of GLM-5.2 */
    a->seed = (uint64_t)time(NULL);
    for (int i = 2; i < argc; i++) {
        const char *f = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(f, "--decode")) { a->decode = 1; continue; }
        if (!strcmp(f, "--no-think")) { a->no_think = 1; continue; }
        if (!strcmp(f, "--bf16")) { g_act_bf16 = 1; continue; }
        if (!strcmp(f, "--fp32")) { g_act_bf16 = 0; continue; }
        if (!strcmp(f, "--no-mmap")) { g_no_mmap = 1; continue; }
#ifdef GLM_GPU
        if (!strcmp(f, "--gpu")) { a->gpu = 1; if (!a->n_gpus) a->n_gpus = 1; continue; }
        if (!strcmp(f, "--gpus")) {
            if (!has) glm_fatal("%s: missing value", f);
            a->gpu = 1;
            a->n_gpus = (int)parse_long(f, argv[++i], 1, 64);
            continue;
        }
#else
        if (!strcmp(f, "--gpu") || !strcmp(f, "--gpus"))
            glm_fatal("%s: this glm was built without GPU support (build it with make hip, make cuda or make emu)", f);
#endif
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { usage(); exit(0); }
        if (f[0] != '-') glm_fatal("unexpected argument '%s'", f);
        if (!strcmp(f, "-m") || !strcmp(f, "--ids") || !strcmp(f, "-p") || !strcmp(f, "-o") || !strcmp(f, "-n") ||
            !strcmp(f, "--ctx") || !strcmp(f, "-t") || !strcmp(f, "--temp") || !strcmp(f, "--top-p") || !strcmp(f, "--seed") ||
            !strcmp(f, "--tokenizer") || !strcmp(f, "--system") || !strcmp(f, "--effort")) {
            if (!has) glm_fatal("%s: missing value", f);
            const char *v = argv[++i];
            if (!strcmp(f, "-m")) a->model_dir = v;
            else if (!strcmp(f, "--ids")) a->ids = v;
            else if (!strcmp(f, "-p")) a->prompt = v;
            else if (!strcmp(f, "-o")) a->out = v;
            else if (!strcmp(f, "--tokenizer")) a->tokenizer = v;
            else if (!strcmp(f, "--system")) a->system = v;
            else if (!strcmp(f, "--effort")) {
                if (strcmp(v, "max") && strcmp(v, "high") && strcmp(v, "none")) glm_fatal("--effort %s: expected max, high or none", v);
                a->effort = v;
            }
            else if (!strcmp(f, "-n")) a->n_gen = (int)parse_long(f, v, 0, 1 << 24);
            else if (!strcmp(f, "--ctx")) a->ctx = (int)parse_long(f, v, 1, 1 << 24);
            else if (!strcmp(f, "-t")) a->threads = (int)parse_long(f, v, 1, 1024);
            else if (!strcmp(f, "--temp")) a->temperature = parse_float(f, v, 0.0f, 100.0f);
            else if (!strcmp(f, "--top-p")) a->top_p = parse_float(f, v, 0.0f, 1.0f);
            else a->seed = (uint64_t)parse_long(f, v, 0, 0x7fffffffffffffffL);
            continue;
        }
        glm_fatal("unknown flag %s (see glm --help)", f);
    }
    if (!a->model_dir) glm_fatal("%s: -m DIR is required", a->cmd);
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

static int max_cols(const Config *c) {
    int v[] = {c->hidden, c->q_lora_rank, c->kv_lora_rank, c->n_heads * c->v_head, c->dense_inter,
               c->n_shared * c->moe_inter, c->moe_inter, 2 * c->hidden};
    int mx = 0;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) if (v[i] > mx) mx = v[i];
    return mx;
}

/* Everything a generation session holds: model, cache, scratch. */
typedef struct {
    Model model;
    KVCache kv;
    RunState state;
} Session;

static void session_open(Session *S, const Args *a, int n_prompt) {
    Config probe;
    config_load(&probe, a->model_dir); /* cheap checks before mapping gigabytes */
    int ctx = a->ctx ? a->ctx : (probe.max_pos < 4096 ? probe.max_pos : 4096);
    if (n_prompt > ctx) glm_fatal("--ctx %d: the %d prompt tokens do not fit the context", ctx, n_prompt);
#ifdef _OPENMP
    if (a->threads) omp_set_num_threads(a->threads);
#endif
    double t0 = now_s();
    model_load(&S->model, a->model_dir);
    scratch_init(max_cols(&S->model.cfg));
    kvcache_init(&S->kv, &S->model, ctx);
    runstate_init(&S->state, &S->model.cfg, ctx < PREFILL_CHUNK ? ctx : PREFILL_CHUNK, ctx);
    fprintf(stderr, "glm: %s: %d layers, %.2f GB of weights in %d shard(s), loaded in %.2f s; KV cache %d tokens x %zu bytes = %.1f MiB; %d threads, %s kernels\n",
            a->model_dir, S->model.cfg.n_layers, S->model.weight_bytes / 1e9, S->model.ck.n_shards, now_s() - t0, ctx,
            kvcache_bytes(&S->model, 1), kvcache_bytes(&S->model, ctx) / 1048576.0, g_threads, kernels.name);
#ifdef GLM_GPU
    g_gpu = a->gpu ? gpu_load(&S->model, a->n_gpus, ctx) : NULL;
#endif
}

static void session_close(Session *S) {
#ifdef GLM_GPU
    gpu_free(g_gpu);
    g_gpu = NULL;
#endif
    runstate_free(&S->state);
    kvcache_free(&S->kv);
    model_free(&S->model);
    free(g_row_scratch);
    free(g_x_split);
    free(g_panel);
    free(g_x_bf16);
    g_row_scratch = g_x_split = g_panel = NULL;
    g_x_bf16 = NULL;
}

/* glm logits: float32 [n][V] for the whole sequence, by prefill or one token at a time. */
static int cmd_logits(const Args *a) {
    if (!a->ids) glm_fatal("logits: --ids is required");
    if (!a->out) glm_fatal("logits: -o FILE is required");
    Config probe;
    config_load(&probe, a->model_dir);
    int n;
    int *ids = parse_ids(a->ids, probe.vocab_size, &n);
    Session S;
    session_open(&S, a, n);
    const int V = S.model.cfg.vocab_size;
    float *logits = xmalloc((size_t)n * V * sizeof(float));
    if (a->decode)
        for (int t = 0; t < n; t++) forward(&S.model, &S.kv, &S.state, ids + t, 1, logits + (size_t)t * V, 0);
    else
        forward(&S.model, &S.kv, &S.state, ids, n, logits, 1);

    /* write under a temporary name, rename at the end: no half-written file */
    size_t len = strlen(a->out);
    char *tmp = xmalloc(len + 16);
    snprintf(tmp, len + 16, "%s.partial", a->out);
    g_partial_output = tmp;
    FILE *f = fopen(tmp, "wb");
    if (!f) glm_fatal("-o %s: cannot create: %s", a->out, strerror(errno));
    size_t wrote = fwrite(logits, sizeof(float), (size_t)n * V, f);
    if (fclose(f) != 0 || wrote != (size_t)n * V) glm_fatal("-o %s: write failed: %s", a->out, strerror(errno));
    if (rename(tmp, a->out) != 0) glm_fatal("-o %s: rename failed: %s", a->out, strerror(errno));
    g_partial_output = NULL;
    free(tmp); free(logits); free(ids);
    session_close(&S);
    return 0;
}

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
    char *path = a->tokenizer ? xstrdup(a->tokenizer) : path_join(a->model_dir, "tokenizer.json");
    char err[512];
    Tokenizer *t = tokenizer_load(path, err, sizeof err);
    if (!t) glm_fatal("%s", err);
    free(path);
    return t;
}

/* Prints a token as text as soon as it completes a UTF-8 character. */
static void print_token(const Tokenizer *tok, TokenizerStream *ts, char *buf, size_t cap, int id) {
    size_t n = tokenizer_stream_push(ts, tok, id, buf, cap);
    fwrite(buf, 1, n, stdout);
    fflush(stdout);
}

static int is_eos(const Config *c, int id) {
    for (int i = 0; i < c->n_eos; i++) if (c->eos[i] == id) return 1;
    return 0;
}

/* Samples and prints up to n_gen tokens after the prefill that produced `logits`;
 * each one goes through the cache. Returns the count; the ids land in out[]. */
typedef struct { double t_decode; int n_forward; double bytes; } DecodeStats;

static int generate(Session *S, Sampler *sp, float *logits, int n_gen, const Tokenizer *tok, int *out, DecodeStats *st) {
    const Config *c = &S->model.cfg;
    TokenizerStream ts;
    size_t cap = tok ? tokenizer_stream_out_max(tok) : 0;
    char *buf = tok ? xmalloc(cap) : NULL;
    if (tok) tokenizer_stream_init(&ts);
    double t1 = now_s();
    g_bytes_read = 0;
    int n = 0, next = sample(sp, logits, c->vocab_size);
    st->n_forward = 0;
    while (n < n_gen) {
        out[n++] = next;
        if (tok) { if (!is_eos(c, next)) print_token(tok, &ts, buf, cap, next); }
        else { printf("%s%d", n > 1 ? " " : "", next); fflush(stdout); }
        if (is_eos(c, next) || n == n_gen) break;
        if (S->kv.pos >= S->kv.ctx) { fprintf(stderr, "\nglm: context full (%d tokens)\n", S->kv.ctx); break; }
        forward(&S->model, &S->kv, &S->state, &next, 1, logits, 0);
        st->n_forward++;
        next = sample(sp, logits, c->vocab_size);
    }
    if (tok) { size_t m = tokenizer_stream_flush(&ts, buf, cap); fwrite(buf, 1, m, stdout); free(buf); }
    st->t_decode = now_s() - t1;
    st->bytes = g_bytes_read;
    return n;
}

static void print_speed(int n_prompt, double t_prefill, const DecodeStats *st) {
    fprintf(stderr, "prefill: %d tokens in %.3f s (%.2f tok/s)\n", n_prompt, t_prefill, n_prompt / t_prefill);
    if (st->n_forward)
        fprintf(stderr, "decode: %d tokens in %.3f s (%.2f tok/s), %.3f GB read per token, %.2f GB/s\n", st->n_forward, st->t_decode,
                st->n_forward / st->t_decode, st->bytes / st->n_forward / 1e9, st->bytes / st->t_decode / 1e9);
}

/* glm run: prefill the prompt, then sample one token at a time through the cache. */
static int cmd_run(const Args *a) {
    if (!a->ids == !a->prompt) glm_fatal("run: give the prompt as --ids 1,2,3 or as -p TEXT");
    Config probe;
    config_load(&probe, a->model_dir);
    Tokenizer *tok = NULL;
    int n, *ids;
    if (a->prompt) {
        long bad = utf8_invalid_at(a->prompt, strlen(a->prompt));
        if (bad >= 0) glm_fatal("-p: the prompt is not valid UTF-8 (byte %ld)", bad);
        tok = load_tokenizer(a);
        char err[256];
        n = tokenizer_encode(tok, a->prompt, strlen(a->prompt), &ids, err, sizeof err);
        if (n < 0) glm_fatal("-p: %s", err);
        if (n == 0) glm_fatal("-p: the prompt is empty");
        for (int i = 0; i < n; i++)
            if (ids[i] >= probe.vocab_size) glm_fatal("--tokenizer: token id %d is outside the model's vocab_size %d", ids[i], probe.vocab_size);
    } else {
        ids = parse_ids(a->ids, probe.vocab_size, &n);
    }
    Session S;
    session_open(&S, a, n);
    const Config *c = &S.model.cfg;
    Sampler sp = {a->temperature, a->top_p, a->seed * 2654435761u + 88172645463325252ull, xmalloc((size_t)c->vocab_size * sizeof(int))};
    float *logits = xmalloc((size_t)c->vocab_size * sizeof(float));
    int *out = xmalloc((size_t)(a->n_gen + 1) * sizeof(int));

    double t0 = now_s();
    forward(&S.model, &S.kv, &S.state, ids, n, logits, 0);
    double t_prefill = now_s() - t0;
    DecodeStats st;
    generate(&S, &sp, logits, a->n_gen, tok, out, &st);
    printf("\n");
    print_speed(n, t_prefill, &st);
    free(sp.order); free(logits); free(ids); free(out);
    if (tok) tokenizer_free(tok);
    session_close(&S);
    return 0;
}

/* glm chat: a multi-turn loop on stdin. The whole conversation is rendered again
 * each turn, but only the tokens after the longest prefix already in the KV cache
 * are run: earlier turns are never re-read. */
static int cmd_chat(const Args *a) {
    Tokenizer *tok = load_tokenizer(a);
    Session S;
    session_open(&S, a, 0);
    const Config *c = &S.model.cfg;
    Sampler sp = {a->temperature, a->top_p, a->seed * 2654435761u + 88172645463325252ull, xmalloc((size_t)c->vocab_size * sizeof(int))};
    float *logits = xmalloc((size_t)c->vocab_size * sizeof(float));
    ChatOptions opt;
    tokenizer_chat_defaults(&opt);
    opt.thinking = !a->no_think;
    if (a->effort) opt.effort = !strcmp(a->effort, "none") ? NULL : !strcmp(a->effort, "high") ? "High" : "Max";

    int cap_msgs = 16, n_msgs = 0;
    ChatMessage *msgs = xmalloc((size_t)cap_msgs * sizeof *msgs);
    if (a->system) msgs[n_msgs++] = (ChatMessage){"system", xstrdup(a->system), NULL};
    int *cached = xmalloc((size_t)S.kv.ctx * sizeof(int)), n_cached = 0; /* the ids in the KV cache */
    int *out = xmalloc((size_t)(S.kv.ctx + 1) * sizeof(int));
    char *line = NULL;
    size_t line_cap = 0;
    int tty = isatty(0);
    const char *nr = getenv("GLM_CHAT_NO_REUSE"); /* tests: re-read every turn from scratch */
    int no_reuse = nr && *nr == '1';
    for (;;) {
        if (tty) { fprintf(stderr, "\n> "); fflush(stderr); }
        ssize_t len = getline(&line, &line_cap, stdin);
        if (len < 0) break;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (!len) continue;
        long bad = utf8_invalid_at(line, (size_t)len);
        if (bad >= 0) glm_fatal("chat: input line is not valid UTF-8 (byte %ld)", bad);
        if (n_msgs + 2 > cap_msgs) { cap_msgs *= 2; msgs = realloc(msgs, (size_t)cap_msgs * sizeof *msgs); if (!msgs) glm_fatal("out of memory"); }
        msgs[n_msgs++] = (ChatMessage){"user", xstrdup(line), NULL};

        int *ids, n;
        char err[256];
        n = tokenizer_render_chat(tok, msgs, n_msgs, &opt, 1, &ids, err, sizeof err);
        if (n < 0) glm_fatal("chat: %s", err);
        if (n >= S.kv.ctx) glm_fatal("--ctx %d: the conversation (%d tokens) no longer fits the context", S.kv.ctx, n);
        int keep = 0; /* reuse the cached prefix; the cache is rewound to it */
        while (!no_reuse && keep < n_cached && keep < n - 1 && cached[keep] == ids[keep]) keep++;
        S.kv.pos = keep;
        double t0 = now_s();
        forward(&S.model, &S.kv, &S.state, ids + keep, n - keep, logits, 0);
        double t_prefill = now_s() - t0;
        memcpy(cached, ids, (size_t)n * sizeof(int));
        n_cached = n;

        DecodeStats st;
        int room = S.kv.ctx - n, m = generate(&S, &sp, logits, a->n_gen < room ? a->n_gen : room, tok, out, &st);
        printf("\n");
        fflush(stdout);
        memcpy(cached + n_cached, out, (size_t)m * sizeof(int));
        n_cached += m < room ? m : room;
        print_speed(n - keep, t_prefill, &st);

        /* the reply as history: reasoning before </think>, the answer after it */
        int n_reply = m > 0 && is_eos(c, out[m - 1]) ? m - 1 : m;
        char *text = tokenizer_decode(tok, out, n_reply, 0, NULL);
        if (!text) glm_fatal("out of memory");
        char *end_think = strstr(text, "</think>"), *reasoning = NULL, *content = text;
        if (end_think && opt.thinking) {
            *end_think = 0;
            reasoning = xstrdup(text);
            content = end_think + strlen("</think>");
        }
        msgs[n_msgs++] = (ChatMessage){"assistant", xstrdup(content), reasoning};
        free(text);
        free(ids);
    }
    for (int i = 0; i < n_msgs; i++) { free((void *)msgs[i].content); free((void *)msgs[i].reasoning); }
    free(msgs); free(cached); free(out); free(line); free(sp.order); free(logits);
    tokenizer_free(tok);
    session_close(&S);
    return 0;
}

/* glm compare: two checkpoints (e.g. BF16 and its MXFP4 conversion) on the same
 * tokens: mean KL(A||B) of the next-token distributions, how often their top-1 agree,
 * and the perplexity of each on the sequence itself. */
static float *all_logits(const Args *a, const int *ids, int n) {
    Session S;
    session_open(&S, a, n);
    float *l = xmalloc((size_t)n * S.model.cfg.vocab_size * sizeof(float));
    forward(&S.model, &S.kv, &S.state, ids, n, l, 1);
    session_close(&S);
    return l;
}

static void log_softmax(double *out, const float *x, int n) {
    double mx = x[0], sum = 0;
    for (int i = 1; i < n; i++) if (x[i] > mx) mx = x[i];
    for (int i = 0; i < n; i++) sum += exp(x[i] - mx);
    double lse = mx + log(sum);
    for (int i = 0; i < n; i++) out[i] = x[i] - lse;
}

static int cmd_compare(int argc, char **argv) {
    const char *dirs[2] = {NULL, NULL};
    char **rest = xmalloc((size_t)(argc + 1) * sizeof(char *));
    int nrest = 0, nd = 0;
    rest[nrest++] = argv[0];
    rest[nrest++] = argv[1];
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { usage(); exit(0); } /* before the -m count */
        if (!strcmp(argv[i], "-m") && i + 1 < argc) {
            if (nd == 2) glm_fatal("compare: give exactly two -m DIR");
            dirs[nd++] = argv[++i];
        } else rest[nrest++] = argv[i];
    }
    if (nd != 2) glm_fatal("compare: give exactly two -m DIR");
    rest[nrest++] = "-m";
    rest[nrest++] = (char *)dirs[0];
    Args a;
    parse_args(&a, nrest, rest);
    free(rest);
    if (!a.ids == !a.prompt) glm_fatal("compare: give the tokens as --ids 1,2,3 or as -p TEXT");
    Config ca, cb;
    config_load(&ca, dirs[0]);
    config_load(&cb, dirs[1]);
    if (ca.vocab_size != cb.vocab_size) glm_fatal("compare: %s has vocab_size %d but %s has %d", dirs[0], ca.vocab_size, dirs[1], cb.vocab_size);
    int n, *ids;
    if (a.prompt) {
        long bad = utf8_invalid_at(a.prompt, strlen(a.prompt));
        if (bad >= 0) glm_fatal("-p: the prompt is not valid UTF-8 (byte %ld)", bad);
        Tokenizer *tok = load_tokenizer(&a);
        char err[256];
        n = tokenizer_encode(tok, a.prompt, strlen(a.prompt), &ids, err, sizeof err);
        tokenizer_free(tok);
        if (n <= 0) glm_fatal("-p: the prompt is empty");
        for (int i = 0; i < n; i++) if (ids[i] >= ca.vocab_size) glm_fatal("--tokenizer: token id %d is outside vocab_size %d", ids[i], ca.vocab_size);
    } else {
        ids = parse_ids(a.ids, ca.vocab_size, &n);
    }
    if (n < 2) glm_fatal("compare: need at least 2 tokens");
    const int V = ca.vocab_size;
    float *la = all_logits(&a, ids, n);
    a.model_dir = dirs[1];
    float *lb = all_logits(&a, ids, n);
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
    printf("  perplexity      A %s: %.4f\n", dirs[0], exp(nll_a / (n - 1)));
    printf("                  B %s: %.4f\n", dirs[1], exp(nll_b / (n - 1)));
    free(pa); free(pb); free(la); free(lb); free(ids);
    return 0;
}

/* ======================================================================== */
/* 9. glm bench: speed against what this machine can do, measured in the same run */

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
 * here (notes/speed.md, eleventh session), 1 GB in one place read 1.22x faster than the
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
 * of one core (notes/speed.md, tenth session) the best pass read 75 GB/s, the mean 64,
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

/* The two reads a decoded token is measured against, taken just before it. */
typedef struct {
    ReadSet buffer;  /* a fresh 1 GB buffer: the machine's read bandwidth (issue 6's yardstick) */
    ReadSet weights; /* the checkpoint's own pages, sampled */
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
    g_bytes_read = 0;
    double t0 = now_s();
    forward(&S->model, d->kv, &S->state, &d->tok, 1, S->state.logits, 0);
    d->tok = argmax(S->state.logits, S->model.cfg.vocab_size);
    d->secs += now_s() - t0;
    d->bytes += g_bytes_read;
    d->n++;
}

static int cmd_bench(int argc, char **argv) {
    int P = 512, L = 4096, N = 32, json = 0;
    /* bench's own flags first; the rest are the common ones */
    char **rest = xmalloc((size_t)(argc + 1) * sizeof(char *));
    int nrest = 0;
    rest[nrest++] = argv[0];
    rest[nrest++] = argv[1];
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "-P") && i + 1 < argc) P = (int)parse_long("-P", argv[++i], 1, 1 << 20);
        else if (!strcmp(argv[i], "--long") && i + 1 < argc) L = (int)parse_long("--long", argv[++i], 64, 1 << 20);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) N = (int)parse_long("-n", argv[++i], 1, 4096);
        else rest[nrest++] = argv[i];
    }
    Args a;
    parse_args(&a, nrest, rest);
    free(rest);
    if (!a.ctx) a.ctx = (P > L ? P : L) + N + 1;
    Session S;
    session_open(&S, &a, 0);
    if (P > S.kv.ctx || L + N > S.kv.ctx) glm_fatal("--ctx %d: too small for -P %d and --long %d + %d tokens", S.kv.ctx, P, L, N);
    const int V = S.model.cfg.vocab_size;

    double t0 = now_s();
    prefault_weights(&S.model);
    const size_t buf_n = (size_t)1 << 30; /* larger than any cache */
    /* on 2 MB pages where the kernel offers them, like the weights: the bandwidth the
     * decode is compared with is the best a streaming read gets on this machine */
    uint8_t *buf = mmap(NULL, buf_n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) glm_fatal("out of memory allocating the bandwidth buffer");
    madvise(buf, buf_n, MADV_HUGEPAGE);
    memset(buf, 1, buf_n);
    const Yardsticks yard = {buffer_runs(buf, buf_n), weights_runs(&S.model.ck)};
    fprintf(stderr, "bench: weights paged in, %.1f s\n", now_s() - t0);
    const double huge = huge_page_fraction(&S.model.ck);

    /* prefill P random tokens */
    int *ids = xmalloc((size_t)(P > L ? P : L) * sizeof(int));
    uint64_t rng = 12345;
    for (int i = 0; i < (P > L ? P : L); i++) { rng = rng * 6364136223846793005ull + 1442695040888963407ull; ids[i] = (int)((rng >> 33) % (uint64_t)V); }
    /* warm-up: the same prefill once untimed, so its scratch buffers are paged in (calloc'd
     * memory is mapped on first write: a cold first prompt spent ~20% of its time in page
     * faults, which is start-up cost, not prefill speed) */
    forward(&S.model, &S.kv, &S.state, ids, P, NULL, 0);
    /* PREFILL_RUNS timed runs, each against the FMA peak measured just before and after
     * it (like the bandwidth around each decoded token); the run with the median ratio is
     * reported. With one run, 1 in 8 glm bench runs of the same build once read 0.98x
     * where the 7 others read 1.32-1.40x: the host took the cores away during it, and its
     * prefill ran 36% slower than theirs while the short peak loops around it lost only
     * 10% (notes/2026-12-06-prefill-ab-2.txt). */
    enum { PREFILL_RUNS = 3 };
    _Static_assert(PREFILL_RUNS == 3, "the table and --json below print three runs' ratios");
    double t_run[PREFILL_RUNS], flops_run[PREFILL_RUNS], peak_run[PREFILL_RUNS], ratio_run[PREFILL_RUNS];
    double peak_before = kernels.fma_peak();
    for (int r = 0; r < PREFILL_RUNS; r++) {
        S.kv.pos = 0;
        g_flops = 0;
        t0 = now_s();
        forward(&S.model, &S.kv, &S.state, ids, P, S.state.logits, 0);
        t_run[r] = now_s() - t0;
        flops_run[r] = g_flops / t_run[r];
        double peak_after = kernels.fma_peak();
        peak_run[r] = 0.5 * (peak_before + peak_after);
        ratio_run[r] = flops_run[r] / peak_run[r];
        peak_before = peak_after;
    }
    int med = 0; /* the run whose ratio has as many runs above it as below */
    for (int r = 0; r < PREFILL_RUNS; r++) {
        int below = 0, above = 0;
        for (int q = 0; q < PREFILL_RUNS; q++) below += ratio_run[q] < ratio_run[r], above += ratio_run[q] > ratio_run[r];
        if (below <= PREFILL_RUNS / 2 && above <= PREFILL_RUNS / 2) med = r;
    }
    const double t_prefill = t_run[med], prefill_flops = flops_run[med], peak = peak_run[med];

    /* decode at context 0 and after a long context (a cache filled by a prefill), a token
     * of each in turn: both see the same moments of the host, so the slowdown between
     * them is the code's. Run one after the other, a fall of the host's read between
     * them (62.8 to 28.2 GB/s seen here) showed as a 2x slowdown. The GPU keeps one cache
     * on the device, so there they still run one after the other. */
    int interleave = 1;
#ifdef GLM_GPU
    interleave = !g_gpu;
#endif
    KVCache near; /* context 0 when interleaved: a cache of its own, N + 1 tokens */
    kvcache_init(&near, &S.model, N + 1);
    TimedDecode d0 = {.kv = interleave ? &near : &S.kv, .tok = 1}, dL = {.kv = &S.kv, .tok = 1};
    S.kv.pos = 0;
    if (interleave) forward(&S.model, &S.kv, &S.state, ids, L, NULL, 0); /* dL's long context */
    for (int i = 0; i < N; i++) {
        timed_decode_token(&S, &d0, &yard);
        if (interleave) timed_decode_token(&S, &dL, &yard);
    }
    const double end_weights = read_rate(&yard.weights).mean; /* after the last token */
    ReadRate end0 = read_rate(&yard.buffer), endL = end0;
    if (!interleave) {
        S.kv.pos = 0;
        forward(&S.model, &S.kv, &S.state, ids, L, NULL, 0);
        for (int i = 0; i < N; i++) timed_decode_token(&S, &dL, &yard);
        endL = read_rate(&yard.buffer);
    }
    /* each decode's read bandwidth: the reads before its tokens and one after the last */
    const double bw0 = (d0.read.mean + end0.mean) / (N + 1), bwL = (dL.read.mean + endL.mean) / (N + 1);
    const double wbw = (d0.weights + end_weights) / (N + 1);
    const double best0 = (d0.read.best + end0.best) / (N + 1); /* the fastest passes: a stricter yardstick */
    const double tps0 = N / d0.secs, tpsL = N / dL.secs, bytes0 = d0.bytes / N, bytesL = dL.bytes / N;
    const double decode_bw_ratio = bytes0 * tps0 / bw0, long_bw_ratio = bytesL * tpsL / bwL;
    kvcache_free(&near);

    if (json) { /* ratios to 4 significant digits: a tiny test model's are ~1e-4, not 0.000 */
        printf("{\"model\": \"%s\", \"threads\": %d, \"kernels\": \"%s\", \"read_bw_gbs\": %.2f, \"read_bw_best_gbs\": %.2f, \"fma_peak_gflops\": %.1f, "
               "\"prefill_tokens\": %d, \"precision\": \"%s\", \"prefill_tps\": %.2f, \"prefill_gflops\": %.1f, \"prefill_peak_ratio\": %.4g, "
               "\"prefill_peak_ratio_runs\": [%.4g, %.4g, %.4g], "
               "\"decode_tps_ctx0\": %.3f, \"decode_bytes_per_token\": %.0f, \"decode_gbs\": %.2f, \"decode_bw_ratio\": %.4g, \"decode_best_bw_ratio\": %.4g, "
               "\"weights_read_gbs\": %.2f, \"decode_weights_bw_ratio\": %.4g, "
               "\"long_ctx\": %d, \"decode_tps_long\": %.3f, \"decode_long_bw_ratio\": %.4g, \"read_bw_long_gbs\": %.2f, \"huge_page_fraction\": %.3f}\n",
               a.model_dir, g_threads, kernels.name, bw0 / 1e9, best0 / 1e9, peak / 1e9, P, product_precision(), P / t_prefill, prefill_flops / 1e9, prefill_flops / peak,
               ratio_run[0], ratio_run[1], ratio_run[2], tps0, bytes0, bytes0 * tps0 / 1e9, decode_bw_ratio, bytes0 * tps0 / best0, wbw / 1e9, bytes0 * tps0 / wbw, L, tpsL, long_bw_ratio, bwL / 1e9, huge);
    } else {
        printf("glm bench: %s (%d threads, %s kernels)\n", a.model_dir, g_threads, kernels.name);
        printf("  machine   read bandwidth %.1f GB/s (around the decode; its fastest passes %.1f), fp32 FMA peak %.1f GFLOP/s (around the prefill)\n",
               bw0 / 1e9, best0 / 1e9, peak / 1e9);
        if (huge >= 0) printf("  weights   %.0f%% on 2 MB pages%s\n", 100 * huge, huge < 0.9 ? " (4 KB pages slow decode: see README, Speed)" : "");
        printf("  prefill   %d tokens (%s products): %.2f tok/s, %.1f GFLOP/s = %.2f x FMA peak (the median of %d runs: %.2f, %.2f, %.2f)\n", P,
               product_precision(), P / t_prefill, prefill_flops / 1e9, prefill_flops / peak, PREFILL_RUNS, ratio_run[0], ratio_run[1], ratio_run[2]);
        printf("  decode    context 0: %.2f tok/s, %.3f GB/token, %.1f GB/s = %.2f x read bandwidth (%.2f x its fastest passes)\n", tps0,
               bytes0 / 1e9, bytes0 * tps0 / 1e9, decode_bw_ratio, bytes0 * tps0 / best0);
        printf("            (a streaming read of the weights' own pages, before each token too: %.1f GB/s; decode = %.2f x that)\n", wbw / 1e9, bytes0 * tps0 / wbw);
        printf("  decode    context %d: %.2f tok/s, %.3f GB/token, %.1f GB/s = %.2f x read bandwidth (%.1f GB/s around it)\n", L, tpsL,
               bytesL / 1e9, bytesL * tpsL / 1e9, long_bw_ratio, bwL / 1e9);
        printf("  slowdown  context 0 -> %d: %.2fx\n", L, tps0 / tpsL);
    }
    free(yard.buffer.run);
    free(yard.weights.run);
    munmap(buf, buf_n);
    free(ids);
    session_close(&S);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) { usage(); return argc < 2; }
    Args a;
    const char *cmd = argv[1];
    number_tables_init();
    kernels_init(getenv("GLM_KERNELS")); /* GLM_KERNELS=c forces the plain C loops */
    const char *pp = getenv("GLM_PRECISION");
    if (pp && !strcmp(pp, "fp32")) g_act_bf16 = 0;
    else if (pp && *pp && strcmp(pp, "bf16")) glm_fatal("GLM_PRECISION=%s: expected fp32 or bf16", pp);
    if (!strcmp(cmd, "run")) { parse_args(&a, argc, argv); return cmd_run(&a); }
    if (!strcmp(cmd, "logits")) { parse_args(&a, argc, argv); return cmd_logits(&a); }
    if (!strcmp(cmd, "chat")) { parse_args(&a, argc, argv); return cmd_chat(&a); }
    if (!strcmp(cmd, "bench")) return cmd_bench(argc, argv);
    if (!strcmp(cmd, "compare")) return cmd_compare(argc, argv);
    if (!strcmp(cmd, "tokenize")) return tokenize_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "synth")) return synth_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "convert")) return convert_main(argc - 1, argv + 1);
    glm_fatal("unknown command '%s' (see glm --help)", cmd);
}
