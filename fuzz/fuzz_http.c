/* fuzz_http.c - libFuzzer target for http.c's pure parts: http_parse_request, buf_json_str
 * and http_bearer_ok on arbitrary bytes.
 *
 * Besides "no crash, no leak, no sanitizer report" (every parse gets an exact-size copy, so
 * ASan sees a read past len):
 *   - each answer is one http.h lists; a whole request (1) lies inside the buffer, its body
 *     ends at total_len, body is NULL exactly when body_len is 0, method/path/authorization
 *     are NUL-terminated and well-formed; an error has a one-line reason;
 *   - max_body only decides 413: with several limits the answers differ only by -413, and a
 *     413 under a limit is a 413 under every smaller one;
 *   - split consistency, as http_read relies on: a prefix that gets 1 or an error gets the
 *     same from the whole input, and a whole input whose first request fits in the prefix
 *     got 1 from the prefix already (every prefix for inputs up to 256 bytes, else a few);
 *   - the input repeated past HTTP_MAX_HEADER is a stream of pipelined requests: parsed one
 *     after another as http_read does, until an error, a 0 or 64 requests (this is how
 *     431 is reached without 16 KB inputs);
 *   - buf_json_str's output parses with json_parse as one string equal to the input with
 *     each maximal invalid UTF-8 subpart replaced by U+FFFD, computed here by a decoder
 *     written differently (code point ranges instead of byte tables);
 *   - http_bearer_ok(a, k) for the input cut at its first NUL agrees with the rule in http.h. */
#include "../http.h"
#include "../json.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const size_t MAX_BODIES[] = {0, 16, 4096, SIZE_MAX};
#define N_MAX (sizeof MAX_BODIES / sizeof *MAX_BODIES)

static int is_tchar(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* http_parse_request on an exact-size copy of buf[0..len); body pointers are moved back into
 * buf so results from different copies compare. */
static int parse(const uint8_t *buf, size_t len, size_t max_body, HttpRequest *req) {
    char *copy = malloc(len ? len : 1), err[128];
    if (!copy) abort();
    memcpy(copy, buf, len);
    memset(err, 'x', sizeof err);
    int r = http_parse_request(copy, len, max_body, req, err, sizeof err);
    if (r == 1) {
        if (req->total_len > len || req->body_len > max_body || (req->body == NULL) != (req->body_len == 0)) abort();
        if (req->body) {
            if (req->body != copy + req->total_len - req->body_len) abort();
            req->body = (const char *)buf + (req->body - copy);
        }
        /* the headers end with an empty line just before the body */
        size_t h = req->total_len - req->body_len;
        if (h < 2 || copy[h - 1] != '\n' || !(copy[h - 2] == '\n' || (h >= 3 && copy[h - 2] == '\r' && copy[h - 3] == '\n')))
            abort();
        if (!req->method[0] || !memchr(req->method, 0, sizeof req->method)) abort();
        for (const char *m = req->method; *m; m++)
            if (!is_tchar((unsigned char)*m)) abort();
        if (req->path[0] != '/' || !memchr(req->path, 0, sizeof req->path) || strchr(req->path, '?')) abort();
        if (!memchr(req->authorization, 0, sizeof req->authorization)) abort();
        if (req->keep_alive != 0 && req->keep_alive != 1) abort();
    } else if (r < 0) {
        if (r != -400 && r != -411 && r != -413 && r != -414 && r != -431 && r != -505) abort();
        if (!memchr(err, 0, sizeof err) || !err[0] || strchr(err, '\n')) abort();
        if (r == -431 && len < HTTP_MAX_HEADER) abort();
    } else if (r != 0) abort();
    free(copy);
    return r;
}

static void same_request(const HttpRequest *a, const HttpRequest *b) {
    if (strcmp(a->method, b->method) || strcmp(a->path, b->path) || strcmp(a->authorization, b->authorization) ||
        a->body != b->body || a->body_len != b->body_len || a->total_len != b->total_len || a->keep_alive != b->keep_alive)
        abort();
}

/* The prefix data[0..k) against the whole input's answer rf / qf. */
static void check_prefix(const uint8_t *data, size_t k, size_t max_body, int rf, const HttpRequest *qf) {
    HttpRequest q;
    int rp = parse(data, k, max_body, &q);
    if (rp == 1) {
        if (rf != 1) abort();
        same_request(&q, qf);
    } else if (rp < 0 && rf != rp) abort();
    if (rf == 1 && qf->total_len <= k && rp != 1) abort(); /* all its bytes were there */
}

static void check_parser(const uint8_t *data, size_t size) {
    HttpRequest q[N_MAX];
    int r[N_MAX];
    for (size_t i = 0; i < N_MAX; i++) r[i] = parse(data, size, MAX_BODIES[i], &q[i]);
    for (size_t i = 0; i < N_MAX; i++)
        for (size_t j = i + 1; j < N_MAX; j++) { /* MAX_BODIES[i] < MAX_BODIES[j] */
            if (r[i] == 1) { if (r[j] != 1) abort(); same_request(&q[i], &q[j]); }
            if (r[j] == -413 && r[i] != -413) abort();
            if (r[i] != r[j] && r[i] != -413) abort();
        }
    /* prefixes, with the limit that lets bodies through */
    const size_t mb = 4096, im = 2;
    if (size <= 256) {
        for (size_t k = 0; k < size; k++) check_prefix(data, k, mb, r[im], &q[im]);
    } else {
        uint64_t h = 1469598103934665603ull; /* FNV-1a of the input picks the split points */
        for (size_t i = 0; i < size; i++) h = (h ^ data[i]) * 1099511628211ull;
        for (int t = 0; t < 4; t++, h = h * 6364136223846793005ull + 1442695040888963407ull)
            check_prefix(data, (size_t)(h >> 33) % size, mb, r[im], &q[im]);
        check_prefix(data, size - 1, mb, r[im], &q[im]);
    }
}

/* The input over and over, past HTTP_MAX_HEADER: read as pipelined requests. */
static void check_stream(const uint8_t *data, size_t size) {
    if (!size || size > HTTP_MAX_HEADER) return;
    size_t n = HTTP_MAX_HEADER + 64 + size;
    n -= n % size;
    uint8_t *s = malloc(n);
    if (!s) abort();
    for (size_t i = 0; i < n; i += size) memcpy(s + i, data, size);
    size_t at = 0;
    for (int i = 0; i < 64 && at < n; i++) {
        HttpRequest q;
        int r = parse(s + at, n - at, 4096, &q);
        if (r != 1) {
            /* headers that never end within HTTP_MAX_HEADER bytes cannot be "not yet" */
            if (r == 0 && n - at >= HTTP_MAX_HEADER) {
                /* 0 is still right when the headers ended and a body is missing: look */
                int ended = 0;
                for (size_t k = 1; k < HTTP_MAX_HEADER && !ended; k++)
                    ended = s[at + k] == '\n' && (s[at + k - 1] == '\n' || (k >= 2 && s[at + k - 1] == '\r' && s[at + k - 2] == '\n'));
                if (!ended) abort();
            }
            break;
        }
        if (q.total_len == 0) abort();
        at += q.total_len;
    }
    free(s);
}

/* ------------------------------------------------------------------------------------ */

/* Is a sequence that starts with these k bytes (lead bits `cp` after k-1 continuation
 * bytes, len bytes in all) still able to become a valid scalar value? */
static int viable(uint32_t cp, int k, int len) {
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    int rest = 6 * (len - k);
    uint32_t lo = cp << rest, hi = lo | ((1u << rest) - 1);
    if (hi < min[len] || lo > 0x10FFFF) return 0;
    if (lo >= 0xD800 && hi <= 0xDFFF) return 0; /* only surrogates left */
    return 1;
}

/* Input with maximal invalid subparts replaced by U+FFFD (EF BF BD), into out (4x room). */
static size_t ref_decode(const uint8_t *s, size_t n, uint8_t *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        int len = c < 0x80 ? 1 : c < 0xC0 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF8 ? 4 : 0;
        if (len == 1) { out[o++] = c; i++; continue; }
        uint32_t cp = len ? c & (0xFFu >> (len + 1)) : 0;
        int k = 1;
        if (len && viable(cp, 1, len)) {
            while (k < len && i + (size_t)k < n && (s[i + k] & 0xC0) == 0x80 && viable((cp << 6) | (s[i + k] & 0x3F), k + 1, len)) {
                cp = (cp << 6) | (s[i + k] & 0x3F);
                k++;
            }
            if (k == len) { memcpy(out + o, s + i, (size_t)len); o += (size_t)len; i += (size_t)len; continue; }
        }
        memcpy(out + o, "\xEF\xBF\xBD", 3);
        o += 3;
        i += (size_t)k;
    }
    return o;
}

static void check_json_str(const uint8_t *data, size_t size) {
    Buf b = {0};
    buf_json_str(&b, (const char *)data, size);
    if (b.oom || b.len < 2 || b.p[b.len] != 0) abort();
    Json j;
    char err[200];
    if (json_parse(&j, b.p, b.len, err, sizeof err)) {
        fprintf(stderr, "buf_json_str output does not parse: %s\n", err);
        abort();
    }
    uint8_t *want = malloc(size * 3 + 1);
    if (!want) abort();
    size_t wn = ref_decode(data, size, want);
    if (j.root->type != JSON_STRING || j.root->str_len != wn || memcmp(j.root->str, want, wn)) {
        fprintf(stderr, "buf_json_str decodes to something else than the U+FFFD reference\n");
        abort();
    }
    free(want);
    json_free(&j);
    buf_free(&b);
}

static void check_bearer(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    if (!nul) return;
    size_t alen = (size_t)(nul - data);
    char *a = malloc(alen + 1), *k = malloc(size - alen);
    if (!a || !k) abort();
    memcpy(a, data, alen + 1);
    memcpy(k, nul + 1, size - alen - 1);
    k[size - alen - 1] = 0;
    int want = 0;
    if (k[0] && strlen(a) < sizeof ((HttpRequest *)0)->authorization - 1 && strlen(a) >= 7 &&
        (a[0] | 32) == 'b' && (a[1] | 32) == 'e' && (a[2] | 32) == 'a' && (a[3] | 32) == 'r' && (a[4] | 32) == 'e' &&
        (a[5] | 32) == 'r' && a[6] == ' ') {
        const char *t = a + 7;
        while (*t == ' ') t++;
        want = !strcmp(t, k);
    }
    if (http_bearer_ok(a, k) != want) abort();
    free(a);
    free(k);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check_parser(data, size);
    check_stream(data, size);
    check_json_str(data, size);
    check_bearer(data, size);
    return 0;
}
