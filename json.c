/* json.c - see json.h. A recursive-descent parser with a depth limit. */
#include "json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

#define JSON_MAX_DEPTH 256
#ifndef JSON_FIRST_BLOCK   /* the fuzz build uses a small one: 30x faster, and it exercises block growth */
#define JSON_FIRST_BLOCK (1u << 20)
#endif

/* Arena: a list of malloc'd blocks; nodes and decoded strings are carved from them. */
typedef struct Block { struct Block *prev; size_t used, cap; } Block;

typedef struct {
    const char *p, *end, *start;
    Block *arena;
    char *err; size_t errlen;
    int failed;
} Parser;

static void fail(Parser *ps, const char *fmt, ...) {
    if (ps->failed) return;
    ps->failed = 1;
    char msg[160];
    va_list ap; va_start(ap, fmt); vsnprintf(msg, sizeof msg, fmt, ap); va_end(ap);
    if (ps->err && ps->errlen)
        snprintf(ps->err, ps->errlen, "%s at byte %zu", msg, (size_t)(ps->p - ps->start));
}

static void *arena_alloc(Parser *ps, size_t n) {
    n = (n + 15) & ~(size_t)15;
    Block *b = ps->arena;
    if (!b || b->cap - b->used < n) {
        /* blocks grow geometrically so a 20 MB document needs few of them; huge
         * pages (where the kernel offers them) cut the page-fault cost in half */
        size_t cap = ps->arena ? ps->arena->cap * 2 : JSON_FIRST_BLOCK;
        if (cap > (64u << 20)) cap = 64u << 20;
        if (cap < n) cap = n;
        b = malloc(sizeof(Block) + 16 + cap);
        if (!b) { fail(ps, "out of memory"); return NULL; }
#ifdef MADV_HUGEPAGE
        if (cap >= (8u << 20)) madvise((void *)(((uintptr_t)b + 4095) & ~(uintptr_t)4095), cap - 4096, MADV_HUGEPAGE);
#endif
        b->prev = ps->arena; b->used = 0; b->cap = cap;
        ps->arena = b;
    }
    char *base = (char *)(b + 1);
    base += (16 - ((uintptr_t)base & 15)) & 15;
    void *r = base + b->used;
    b->used += n;
    return r;
}

static void skip_ws(Parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_hex4(Parser *ps, unsigned *out) {
    if (ps->end - ps->p < 4) { fail(ps, "truncated \\u escape"); return -1; }
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval((unsigned char)ps->p[i]);
        if (h < 0) { fail(ps, "bad \\u escape"); return -1; }
        v = v * 16 + (unsigned)h;
    }
    ps->p += 4; *out = v;
    return 0;
}

static char *put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) *o++ = (char)cp;
    else if (cp < 0x800) { *o++ = (char)(0xC0 | (cp >> 6)); *o++ = (char)(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) { *o++ = (char)(0xE0 | (cp >> 12)); *o++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *o++ = (char)(0x80 | (cp & 0x3F)); }
    else { *o++ = (char)(0xF0 | (cp >> 18)); *o++ = (char)(0x80 | ((cp >> 12) & 0x3F)); *o++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *o++ = (char)(0x80 | (cp & 0x3F)); }
    return o;
}

/* Length of the valid UTF-8 sequence at s (max n bytes), or 0 if invalid. */
static size_t utf8_valid_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len; unsigned cp, min;
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; min = 0x10000; }
    else return 0;
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

/* Parses a string starting at the opening quote; returns decoded copy. */
static char *parse_string(Parser *ps, size_t *out_len) {
    ps->p++; /* opening quote */
    /* First pass: find the end to size the buffer (decoded length <= raw length). */
    const char *q = ps->p;
    while (q < ps->end && *q != '"') { if (*q == '\\') q++; q++; }
    if (q >= ps->end) { fail(ps, "unterminated string"); return NULL; }
    char *buf = arena_alloc(ps, (size_t)(q - ps->p) + 1);
    if (!buf) return NULL;
    char *o = buf;
    while (ps->p < ps->end) {
        unsigned char c = (unsigned char)*ps->p;
        if (c == '"') { ps->p++; *o = 0; *out_len = (size_t)(o - buf); return buf; }
        if (c < 0x20) { fail(ps, "control character in string"); return NULL; }
        if (c == '\\') {
            ps->p++;
            if (ps->p >= ps->end) break;
            char e = *ps->p++;
            switch (e) {
            case '"': *o++ = '"'; break;
            case '\\': *o++ = '\\'; break;
            case '/': *o++ = '/'; break;
            case 'b': *o++ = '\b'; break;
            case 'f': *o++ = '\f'; break;
            case 'n': *o++ = '\n'; break;
            case 'r': *o++ = '\r'; break;
            case 't': *o++ = '\t'; break;
            case 'u': {
                unsigned cp;
                if (read_hex4(ps, &cp)) return NULL;
                if (cp >= 0xDC00 && cp <= 0xDFFF) { fail(ps, "unpaired low surrogate"); return NULL; }
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    unsigned lo;
                    if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u') { fail(ps, "unpaired high surrogate"); return NULL; }
                    ps->p += 2;
                    if (read_hex4(ps, &lo)) return NULL;
                    if (lo < 0xDC00 || lo > 0xDFFF) { fail(ps, "bad surrogate pair"); return NULL; }
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                /* a \u escape decodes to at most 4 bytes from at least 6 raw bytes */
                o = put_utf8(o, cp);
                break;
            }
            default: ps->p--; fail(ps, "bad escape"); return NULL;
            }
            continue;
        }
        size_t n = utf8_valid_len((const unsigned char *)ps->p, (size_t)(ps->end - ps->p));
        if (!n) { fail(ps, "invalid UTF-8 in string"); return NULL; }
        memcpy(o, ps->p, n); o += n; ps->p += n;
    }
    fail(ps, "unterminated string");
    return NULL;
}

static int parse_number(Parser *ps, JsonValue *v) {
    const char *s = ps->p;
    int neg = 0, frac = 0;
    uint64_t u = 0; int overflow = 0;
    if (ps->p < ps->end && *ps->p == '-') { neg = 1; ps->p++; }
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') { fail(ps, "bad number"); return -1; }
    if (*ps->p == '0') ps->p++;
    else while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        unsigned d = (unsigned)(*ps->p - '0');
        if (u > (UINT64_MAX - d) / 10) overflow = 1; else u = u * 10 + d;
        ps->p++;
    }
    if (ps->p < ps->end && *ps->p == '.') {
        frac = 1; ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') { fail(ps, "bad number"); return -1; }
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
    }
    if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
        frac = 1; ps->p++;
        if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-')) ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') { fail(ps, "bad number"); return -1; }
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
    }
    double num;
    char tmp[64];
    size_t n = (size_t)(ps->p - s);
    if (n >= sizeof tmp) { /* very long literal: only its magnitude matters to us */
        num = neg ? -1e308 : 1e308;
    } else {
        memcpy(tmp, s, n); tmp[n] = 0;
        num = strtod(tmp, NULL);
    }
    v->type = JSON_NUMBER;
    v->num = num;
    v->is_uint = !neg && !frac && !overflow;
    v->u64 = v->is_uint ? u : 0;
    return 0;
}

static JsonValue *parse_value(Parser *ps, int depth);

static int parse_children(Parser *ps, JsonValue *v, int depth, int is_object) {
    char close = is_object ? '}' : ']';
    ps->p++; /* [ or { */
    JsonValue **tail = &v->child;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) { ps->p++; return 0; }
    for (;;) {
        const char *key = NULL; size_t key_len = 0;
        if (is_object) {
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != '"') { fail(ps, "expected object key"); return -1; }
            key = parse_string(ps, &key_len);
            if (!key) return -1;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') { fail(ps, "expected ':'"); return -1; }
            ps->p++;
        }
        JsonValue *c = parse_value(ps, depth + 1);
        if (!c) return -1;
        c->key = key; c->key_len = (uint32_t)key_len;
        *tail = c; tail = &c->next; v->n++;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
        if (ps->p < ps->end && *ps->p == close) { ps->p++; return 0; }
        fail(ps, is_object ? "expected ',' or '}'" : "expected ',' or ']'");
        return -1;
    }
}

static JsonValue *parse_value(Parser *ps, int depth) {
    if (depth > JSON_MAX_DEPTH) { fail(ps, "nesting deeper than %d", JSON_MAX_DEPTH); return NULL; }
    skip_ws(ps);
    if (ps->p >= ps->end) { fail(ps, "unexpected end of input"); return NULL; }
    JsonValue *v = arena_alloc(ps, sizeof *v);
    if (!v) return NULL;
    memset(v, 0, sizeof *v);
    char c = *ps->p;
    if (c == '{' || c == '[') {
        v->type = c == '{' ? JSON_OBJECT : JSON_ARRAY;
        if (parse_children(ps, v, depth, c == '{')) return NULL;
    } else if (c == '"') {
        v->type = JSON_STRING;
        v->str = parse_string(ps, &v->str_len);
        if (!v->str) return NULL;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        if (parse_number(ps, v)) return NULL;
    } else if (ps->end - ps->p >= 4 && !memcmp(ps->p, "true", 4)) {
        v->type = JSON_BOOL; v->num = 1; ps->p += 4;
    } else if (ps->end - ps->p >= 5 && !memcmp(ps->p, "false", 5)) {
        v->type = JSON_BOOL; v->num = 0; ps->p += 5;
    } else if (ps->end - ps->p >= 4 && !memcmp(ps->p, "null", 4)) {
        v->type = JSON_NULL; ps->p += 4;
    } else {
        fail(ps, "unexpected character");
        return NULL;
    }
    return v;
}

static void arena_free(Block *b) {
    while (b) { Block *p = b->prev; free(b); b = p; }
}

int json_parse(Json *j, const char *text, size_t len, char *err, size_t errlen) {
    Parser ps = { text, text + len, text, NULL, err, errlen, 0 };
    j->root = NULL; j->arena = NULL;
    JsonValue *root = parse_value(&ps, 0);
    if (root) {
        skip_ws(&ps);
        if (ps.p != ps.end) { fail(&ps, "trailing characters after JSON value"); root = NULL; }
    }
    if (!root) { arena_free(ps.arena); return -1; }
    j->root = root; j->arena = ps.arena;
    return 0;
}

void json_free(Json *j) {
    arena_free(j->arena);
    j->arena = NULL; j->root = NULL;
}

const JsonValue *json_get(const JsonValue *obj, const char *key) {
    if (!obj || obj->type != JSON_OBJECT) return NULL;
    size_t n = strlen(key);
    for (const JsonValue *c = obj->child; c; c = c->next)
        if (c->key_len == n && !memcmp(c->key, key, n)) return c;
    return NULL;
}

const JsonValue *json_at(const JsonValue *arr, size_t i) {
    if (!arr || arr->type != JSON_ARRAY) return NULL;
    const JsonValue *c = arr->child;
    while (c && i--) c = c->next;
    return c;
}
