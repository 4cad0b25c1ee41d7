/* fuzz_json.c - libFuzzer target for json.c (json_parse on arbitrary bytes).
 *
 * Besides "no crash, no leak, no sanitizer report", every accepted document is
 * checked for the invariants json.h promises (decoded strings NUL-terminated at
 * str_len, child counts, key lengths, strict UTF-8) and round-tripped: the tree is
 * written back as JSON, parsed again, and must compare equal to the first tree. */
#include "../json.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char *p; size_t n, cap; } Buf;

static void put(Buf *b, const void *s, size_t n) {
    if (b->cap - b->n < n) {
        while (b->cap - b->n < n) b->cap = b->cap ? b->cap * 2 : 256;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void put_str(Buf *b, const char *s, size_t n) {
    put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { put(b, "\\", 1); put(b, &s[i], 1); }
        else if (c < 0x20) { char e[8]; snprintf(e, sizeof e, "\\u%04x", c); put(b, e, 6); }
        else put(b, &s[i], 1);
    }
    put(b, "\"", 1);
}

static int utf8_ok(const unsigned char *s, size_t n) {
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

static void check_and_write(const JsonValue *v, Buf *b, int depth) {
    if (depth > 300) abort();
    switch (v->type) {
    case JSON_NULL: put(b, "null", 4); break;
    case JSON_BOOL:
        if (v->num != 0 && v->num != 1) abort();
        put(b, v->num ? "true" : "false", v->num ? 4 : 5);
        break;
    case JSON_NUMBER: {
        char t[64];
        if (v->is_uint) snprintf(t, sizeof t, "%llu", (unsigned long long)v->u64);
        else if (v->num == 1.0 / 0.0) strcpy(t, "1e999");
        else if (v->num == -1.0 / 0.0) strcpy(t, "-1e999");
        else if (v->num != v->num) abort(); /* JSON has no NaN */
        else {
            snprintf(t, sizeof t, "%.17g", v->num);
            if (!strpbrk(t, ".en-")) strcat(t, ".0"); /* keep it a non-integer literal */
        }
        if (!v->is_uint && v->u64) abort();
        put(b, t, strlen(t));
        break;
    }
    case JSON_STRING:
        if (!v->str || v->str[v->str_len] != 0 || !utf8_ok((const unsigned char *)v->str, v->str_len)) abort();
        put_str(b, v->str, v->str_len);
        break;
    case JSON_ARRAY:
    case JSON_OBJECT: {
        int obj = v->type == JSON_OBJECT;
        put(b, obj ? "{" : "[", 1);
        size_t n = 0;
        for (const JsonValue *c = v->child; c; c = c->next, n++) {
            if (n) put(b, ",", 1);
            if (obj) {
                if (!c->key || c->key[c->key_len] != 0 || !utf8_ok((const unsigned char *)c->key, c->key_len)) abort();
                put_str(b, c->key, c->key_len);
                put(b, ":", 1);
                /* json_get finds the first member with this key (when the key has no NUL) */
                if (strlen(c->key) == c->key_len) {
                    const JsonValue *g = json_get(v, c->key);
                    if (!g || g->key_len != c->key_len || memcmp(g->key, c->key, c->key_len)) abort();
                }
            } else if (c->key) abort();
            check_and_write(c, b, depth + 1);
        }
        if (n != v->n) abort();
        if (!obj && n && json_at(v, n - 1) == NULL) abort();
        if (json_at(v, n) != NULL) abort();
        put(b, obj ? "}" : "]", 1);
        break;
    }
    default: abort();
    }
}

static int same(const JsonValue *a, const JsonValue *b) {
    if (a->type != b->type) return 0;
    if ((a->key == NULL) != (b->key == NULL)) return 0;
    if (a->key && (a->key_len != b->key_len || memcmp(a->key, b->key, a->key_len))) return 0;
    switch (a->type) {
    case JSON_NULL: return 1;
    case JSON_BOOL: return a->num == b->num;
    case JSON_NUMBER:
        if (a->is_uint != b->is_uint) return 0;
        if (a->is_uint) return a->u64 == b->u64;
        return a->num == b->num || (a->num != a->num && b->num != b->num);
    case JSON_STRING: return a->str_len == b->str_len && !memcmp(a->str, b->str, a->str_len);
    default: {
        if (a->n != b->n) return 0;
        const JsonValue *x = a->child, *y = b->child;
        for (; x && y; x = x->next, y = y->next)
            if (!same(x, y)) return 0;
        return !x && !y;
    }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Json j;
    char err[256];
    /* the parser must not read past len: give it an exact-size copy (ASan catches overreads) */
    char *text = malloc(size ? size : 1);
    if (!text) return 0;
    memcpy(text, data, size);
    memset(err, 'x', sizeof err);
    if (json_parse(&j, text, size, err, sizeof err)) {
        if (!memchr(err, 0, sizeof err) || strchr(err, '\n') || j.root || j.arena) abort();
        free(text);
        return 0;
    }
    Buf b = {0};
    check_and_write(j.root, &b, 0);
    Json k;
    if (json_parse(&k, b.p, b.n, err, sizeof err)) {
        fprintf(stderr, "round trip failed to parse: %s\n%.*s\n", err, (int)(b.n < 2000 ? b.n : 2000), b.p);
        abort();
    }
    if (!same(j.root, k.root)) { fprintf(stderr, "round trip differs\n"); abort(); }
    json_free(&k);
    json_free(&j);
    free(b.p);
    free(text);
    return 0;
}
