/* fuzz_tokenizer_load.c - libFuzzer target for tokenizer_load() on an arbitrary
 * tokenizer.json (seeds: the real GLM-5.2 file trimmed, fuzz/make_corpus.py).
 *
 * tokenizer_load reads a path, so the input goes to a memfd opened by path through
 * /proc/self/fd. A file that loads is then exercised: encode of fixed strings and of
 * the input itself, decode, the id <-> bytes lookups, and the streaming decoder,
 * whose output must equal tokenizer_decode's. */
#define _GNU_SOURCE
#include "../tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int fd = -1;
static char path[64];

static void exercise(const Tokenizer *t, const char *text, size_t len) {
    int *ids = NULL;
    char err[256];
    int n = tokenizer_encode(t, text, len, &ids, err, sizeof err);
    if (n < 0) { if (!memchr(err, 0, sizeof err)) abort(); return; }
    int V = tokenizer_vocab_size(t);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= V) abort();
        const char *b;
        int k = tokenizer_token_bytes(t, ids[i], &b);
        if (k < 0 || k > tokenizer_max_token_bytes(t)) abort();
        total += (size_t)k;
    }
    size_t dlen = 0;
    char *d = tokenizer_decode(t, ids, n, 0, &dlen);
    if (d) {
        if (d[dlen] != 0) abort();
        /* streaming decode == decode */
        size_t cap = tokenizer_stream_out_max(t);
        char *buf = malloc(cap), *acc = malloc(dlen + 1);
        size_t an = 0;
        TokenizerStream s;
        tokenizer_stream_init(&s);
        for (int i = 0; i < n; i++) {
            size_t w = tokenizer_stream_push(&s, t, ids[i], buf, cap);
            if (w > cap || an + w > dlen) abort();
            memcpy(acc + an, buf, w); an += w;
        }
        size_t w = tokenizer_stream_flush(&s, buf, cap);
        if (an + w != dlen) abort();
        memcpy(acc + an, buf, w); an += w;
        if (memcmp(acc, d, dlen)) abort();
        free(buf); free(acc);
    }
    free(d);
    d = tokenizer_decode(t, ids, n, 1, NULL);
    free(d);
    (void)total;
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (fd < 0) {
        fd = memfd_create("tokenizer.json", 0);
        if (fd < 0) abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) || (size && pwrite(fd, data, size, 0) != (ssize_t)size)) abort();
    char err[512];
    memset(err, 'x', sizeof err);
    Tokenizer *t = tokenizer_load(path, err, sizeof err);
    if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "%s\n", t ? "ok" : err);
    if (!t) {
        if (!memchr(err, 0, sizeof err) || !err[0]) abort();
        return 0;
    }
    static const char *texts[] = {"Hello world", "[gMASK]<sop><|user|>\nhi 123 4567<|assistant|>", "  \n\t ünï 中文 🙂 it's",
                                  "\xff\xc0\x80 \xed\xa0\x80"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) exercise(t, texts[i], strlen(texts[i]));
    exercise(t, (const char *)data, size < 512 ? size : 512);
    int V = tokenizer_vocab_size(t);
    for (int id = -1; id <= V && id < 300; id++) {
        const char *b;
        int k = tokenizer_token_bytes(t, id, &b);
        if (k < 0 || !b) abort();
        char tmp[1024];
        if (k > 0 && k < (int)sizeof tmp) {
            memcpy(tmp, b, (size_t)k); tmp[k] = 0;
            (void)tokenizer_token_id(t, tmp);
        }
        (void)tokenizer_is_special(t, id);
    }
    (void)tokenizer_token_id(t, "<|user|>");
    tokenizer_free(t);
    return 0;
}
