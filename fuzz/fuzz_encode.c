/* fuzz_encode.c - libFuzzer target for tokenizer_encode() on arbitrary bytes with the
 * real GLM-5.2 tokenizer.json ($GLM_TOKENIZER_JSON, else build/tokenizer.json, which
 * `make build/tokenizer.json` unpacks from data/glm-5.2-tokenizer/, else the trimmed copy
 * in the seed corpus, relative to the repository root).
 *
 * Checks what tokenizer.h promises: encoding never fails, every id is in range, the
 * tokens' bytes concatenate back to the input exactly (for any bytes), decode of valid
 * UTF-8 gives the input back, streaming decode equals decode, and the result does not
 * depend on what the input is embedded in (encode of a copy in a fresh buffer). */
#include "../tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static Tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    const char *cands[] = {getenv("GLM_TOKENIZER_JSON"), "build/tokenizer.json",
                           "fuzz/corpus/tokenizer_load/tokenizer-2000.json"};
    char err[512] = "";
    for (size_t i = 0; i < sizeof cands / sizeof cands[0] && !tok; i++)
        if (cands[i]) tok = tokenizer_load(cands[i], err, sizeof err);
    if (!tok) { fprintf(stderr, "fuzz_encode: no tokenizer.json (set GLM_TOKENIZER_JSON): %s\n", err); exit(1); }
    return 0;
}

static int utf8_valid(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i], len, cp, min;
        if (c < 0x80) { i++; continue; }
        if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; min = 0x80; }
        else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; min = 0x800; }
        else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; min = 0x10000; }
        else return 0;
        if (i + len > n) return 0;
        for (unsigned k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += len;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size ? size : 1); /* exact size: ASan sees overreads */
    memcpy(text, data, size);
    int *ids = NULL;
    char err[256];
    int n = tokenizer_encode(tok, text, size, &ids, err, sizeof err);
    if (n < 0) abort();              /* only out of memory may fail */
    if ((n == 0) != (ids == NULL) || (size == 0) != (n == 0)) abort();
    int V = tokenizer_vocab_size(tok);
    char *cat = malloc(size + 1);
    size_t cn = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= V) abort();
        const char *b;
        int k = tokenizer_token_bytes(tok, ids[i], &b);
        if (k <= 0 || cn + (size_t)k > size) abort();
        memcpy(cat + cn, b, (size_t)k);
        cn += (size_t)k;
    }
    if (cn != size || memcmp(cat, text, size)) abort();   /* the tokens spell the input */

    size_t dlen = 0;
    char *d = tokenizer_decode(tok, ids, n, 0, &dlen);
    if (!d || d[dlen] != 0) abort();
    if (utf8_valid((const unsigned char *)text, size) && (dlen != size || memcmp(d, text, size))) abort();
    size_t cap = tokenizer_stream_out_max(tok);
    char *buf = malloc(cap);
    TokenizerStream s;
    tokenizer_stream_init(&s);
    size_t an = 0;
    for (int i = 0; i < n; i++) {
        size_t w = tokenizer_stream_push(&s, tok, ids[i], buf, cap);
        if (w > cap || an + w > dlen || memcmp(d + an, buf, w)) abort();
        an += w;
    }
    size_t w = tokenizer_stream_flush(&s, buf, cap);
    if (an + w != dlen || memcmp(d + an, buf, w)) abort();

    /* same ids from a copy with different bytes around it (no reads outside [0, len)) */
    char *big = malloc(size + 2);
    big[0] = 'a';
    memcpy(big + 1, text, size);
    big[size + 1] = 'b';
    int *ids2 = NULL;
    int n2 = tokenizer_encode(tok, big + 1, size, &ids2, err, sizeof err);
    if (n2 != n || (n && memcmp(ids, ids2, (size_t)n * sizeof *ids))) abort();
    free(ids2); free(big);
    free(buf); free(d); free(cat); free(ids); free(text);
    return 0;
}
