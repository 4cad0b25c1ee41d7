/* fuzz_checkpoint.c - libFuzzer target for the loader's checks (glm.c sections 2-3):
 * config.json, the shard index and the safetensors headers and tensor tables, run in
 * the order checkpoint_open and config_load run them, on files held in memory.
 *
 * Input: parts separated by SEP (see below; fuzz/make_corpus.py writes seeds):
 *   part 0   config.json
 *   part 1   model.safetensors.index.json; empty = a single-file checkpoint
 *   part 2.. the shard files, in the index's order of first mention (or the one
 *            model.safetensors): 8 bytes little-endian D, then the file's first bytes;
 *            the file is those bytes followed by D % 2^27 zero bytes (data sections
 *            are big and their contents never matter to the checks).
 * Besides the sanitizers, an accepted checkpoint must satisfy what the rest of the
 * program relies on: every tensor inside its shard's data section, sized exactly
 * dtype x shape, findable by name; an accepted config in its documented ranges. */
#define _GNU_SOURCE
#include "../glm.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static const char SEP[] = "\n\0GLMFUZZ\0\n";
#define SEPLEN (sizeof SEP - 1)
#define MAXPARTS 16

static int verbose = -1; /* FUZZ_VERBOSE=1: print each verdict (to look at seeds) */

static void check_err(int rc, const char *err) {
    if (verbose < 0) verbose = getenv("FUZZ_VERBOSE") != NULL;
    if (verbose) fprintf(stderr, "%s\n", rc ? err : "ok");
    if (rc == 0) return;
    if (rc != -1 || !memchr(err, 0, 1024) || !err[0]) abort();
}

/* The virtual file of shard part p: mmap'd so checkpoint_close can munmap it. */
static uint8_t *shard_file(const uint8_t *p, size_t n, size_t *size) {
    uint64_t d = 0;
    for (int i = 7; i >= 0 && n >= 8; i--) d = (d << 8) | p[i];
    if (n >= 8) { p += 8; n -= 8; } else n = 0;
    *size = n + (size_t)(d % (1u << 27)); /* up to 128 MB: past the 100 MB header limit */
    if (*size == 0) return NULL;
    uint8_t *m = mmap(NULL, *size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) abort();
    memcpy(m, p, n);
    return m;
}

static size_t esize(const char *dt) {
    if (!strcmp(dt, "F64") || !strcmp(dt, "I64") || !strcmp(dt, "U64")) return 8;
    if (!strcmp(dt, "F32") || !strcmp(dt, "I32") || !strcmp(dt, "U32")) return 4;
    if (!strcmp(dt, "BF16") || !strcmp(dt, "F16") || !strcmp(dt, "I16") || !strcmp(dt, "U16")) return 2;
    return 1;
}

static void check_checkpoint(const Checkpoint *ck) {
    for (int t = 0; t < ck->n_tensors; t++) {
        const TensorInfo *ti = &ck->tensors[t];
        if (ti->shard < 0 || ti->shard >= ck->n_shards || ti->ndim < 0 || ti->ndim > 8) abort();
        const Shard *sh = &ck->shards[ti->shard];
        if (ti->data < sh->data || ti->nbytes > sh->data_size || (size_t)(ti->data - sh->data) > sh->data_size - ti->nbytes) abort();
        if (sh->data < sh->map + 8 || sh->data + sh->data_size != sh->map + sh->size) abort();
        unsigned __int128 n = esize(ti->dtype);
        for (int i = 0; i < ti->ndim; i++) {
            if (ti->shape[i] < 0) abort();
            n *= (uint64_t)ti->shape[i];
        }
        if (n != ti->nbytes) abort();
        if (checkpoint_find(ck, ti->name) != ti) abort();
    }
}

static void check_config(const Config *c) {
    if (c->vocab_size < 1 || c->hidden < 1 || c->n_layers < 1 || c->n_layers >= GLM_MAX_LAYERS || c->n_heads < 1 ||
        c->qk_rope < 2 || c->qk_rope % 2 || c->index_head_dim < c->qk_rope || c->n_experts < 1 || c->n_active < 1 ||
        c->n_active > c->n_experts || c->n_group < 1 || c->n_experts % c->n_group || c->topk_group < 1 ||
        c->topk_group > c->n_group || !(c->rope_theta > 0) || !c->full_index[0] || c->n_eos < 0 || c->n_eos > GLM_MAX_EOS ||
        c->max_pos < 1 || c->n_shared < 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *part[MAXPARTS];
    size_t len[MAXPARTS];
    int np = 0;
    const uint8_t *p = data, *end = data + size;
    while (np < MAXPARTS) {
        const uint8_t *s = memmem(p, (size_t)(end - p), SEP, SEPLEN);
        part[np] = p;
        len[np++] = (size_t)((s ? s : end) - p);
        if (!s) break;
        p = s + SEPLEN;
    }
    char err[1024];

    /* config.json (config_load) */
    Config c;
    char *text = malloc(len[0] + 1); /* exact-size copies: ASan sees any overread */
    memcpy(text, part[0], len[0]);
    int rc = config_parse(&c, text, len[0], "fuzz/config.json", err, sizeof err);
    check_err(rc, err);
    if (rc == 0) check_config(&c);
    free(text);
    if (np < 3) return 0;

    /* the checkpoint (checkpoint_open) */
    Checkpoint ck;
    memset(&ck, 0, sizeof ck);
    size_t fsize;
    uint8_t *map;
    char path[600];
    if (len[1] == 0) {
        map = shard_file(part[2], len[2], &fsize);
        rc = checkpoint_add_shard(&ck, "fuzz/model.safetensors", map, fsize, err, sizeof err);
        if (rc && map) munmap(map, fsize);
        if (rc == 0) rc = checkpoint_build_table(&ck, err, sizeof err);
    } else {
        ShardIndex ix;
        text = malloc(len[1]);
        memcpy(text, part[1], len[1]);
        rc = shard_index_parse(&ix, text, len[1], "fuzz/model.safetensors.index.json", err, sizeof err);
        free(text);
        if (rc == 0) {
            for (int f = 0; f < ix.n_files && rc == 0; f++) {
                if (2 + f >= np) { rc = -1; snprintf(err, sizeof err, "missing shard"); break; }
                snprintf(path, sizeof path, "fuzz/%.500s", ix.files[f]);
                map = shard_file(part[2 + f], len[2 + f], &fsize);
                rc = checkpoint_add_shard(&ck, path, map, fsize, err, sizeof err);
                if (rc && map) munmap(map, fsize);
            }
            if (rc == 0) rc = checkpoint_build_table(&ck, err, sizeof err);
            if (rc == 0) rc = shard_index_check(&ck, &ix, "fuzz/model.safetensors.index.json", err, sizeof err);
            shard_index_free(&ix);
        }
    }
    check_err(rc, err);
    if (rc == 0) check_checkpoint(&ck);
    checkpoint_close(&ck);
    return 0;
}
