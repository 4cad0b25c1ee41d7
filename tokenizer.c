/* tokenizer.c - see tokenizer.h. The GLM-5.2 tokenizer, byte for byte like Hugging Face's
 * Rust engine: added tokens, the split regex by hand, byte-level BPE with merge ranks,
 * (streaming) decode, the chat format and the `glm tokenize` subcommand.
 * The step numbers in comments refer to docs/TOKENIZER.md. */
#define _POSIX_C_SOURCE 200809L
#include "tokenizer.h"

#include "json.h"
#include "tokenizer_unicode.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The one split pattern we implement (GLM-4.7 / GLM-5.x, Llama-3, cl100k). */
static const char GLM_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

enum { C_OTHER = 0, C_LETTER = 1, C_NUMBER = 2, C_SPACE = 3 };
#define MAX_ID (1 << 24)   /* refuse absurd ids in hostile files */
#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void)(p))
#endif

typedef struct { int id; uint32_t off, len; unsigned char first; } Added;
typedef struct { uint64_t key; uint32_t rank; int32_t merged; } MergeSlot;
typedef struct { uint32_t off, len; } TokRef;

struct Tokenizer {
    int n_ids;                 /* 1 + largest id */
    TokRef *tok;               /* per id: its bytes in pool; len 0 = no such id */
    unsigned char *pool;
    unsigned char *flags;      /* per id: 1 = added token, 2 = special */
    int max_token_bytes;
    int ignore_merges;
    int byte_id[256];          /* id of each single byte (-1 if missing) */
    uint64_t *vmap;            /* regular vocab: raw bytes -> id; (hash tag << 32) | (id + 1), 0 = empty */
    uint64_t vmask;
    MergeSlot *merges;         /* merges: (left << 32 | right) -> rank, merged id; key ~0 = empty */
    uint64_t mmask;
    Added *added;              /* added tokens sorted by (first byte, length descending) */
    int n_added;
    int added_first[257];      /* added[added_first[b] .. added_first[b+1]) start with byte b */
    unsigned char *cls;        /* class of every code point, 0x110000 entries */
};

static void seterr(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ---------------------------------------------------------------- hashing */

static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = (h ^ v) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    h = (h ^ v) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    h *= 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 32);
}

static uint64_t hash_pair(uint64_t key) {
    key *= 0x9E3779B97F4A7C15ull;
    return key ^ (key >> 29);
}

static uint64_t table_size(size_t n) {   /* power of two, load factor <= 0.5 */
    uint64_t c = 16;
    while (c < 2 * (uint64_t)n) c <<= 1;
    return c;
}

/* id of raw bytes in the regular vocabulary, or -1 (h = hash_bytes(p, n)) */
static int vocab_find_h(const Tokenizer *t, const unsigned char *p, size_t n, uint64_t h) {
    uint64_t tag = h >> 32;
    for (uint64_t i = h & t->vmask;; i = (i + 1) & t->vmask) {
        uint64_t e = t->vmap[i];
        if (!e) return -1;
        if ((e >> 32) == tag) {
            int id = (int)(uint32_t)e - 1;
            if (t->tok[id].len == n && memcmp(t->pool + t->tok[id].off, p, n) == 0) return id;
        }
    }
}

static int vocab_find(const Tokenizer *t, const unsigned char *p, size_t n) {
    return vocab_find_h(t, p, n, hash_bytes(p, n));
}

/* inserts id (its bytes already in the pool); returns the id already there, or -1 */
static int vocab_insert(Tokenizer *t, int id) {
    const unsigned char *p = t->pool + t->tok[id].off;
    size_t n = t->tok[id].len;
    uint64_t h = hash_bytes(p, n), tag = h >> 32;
    for (uint64_t i = h & t->vmask;; i = (i + 1) & t->vmask) {
        uint64_t e = t->vmap[i];
        if (!e) {
            t->vmap[i] = (tag << 32) | (uint64_t)(id + 1);
            return -1;
        }
        if ((e >> 32) == tag) {
            int old = (int)(uint32_t)e - 1;
            if (t->tok[old].len == n && memcmp(t->pool + t->tok[old].off, p, n) == 0) return old;
        }
    }
}

/* merge of (a, b): returns rank and sets *merged, or returns UINT32_MAX */
static inline uint32_t merge_find(const Tokenizer *t, int a, int b, int *merged) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint64_t i = hash_pair(key) & t->mmask;; i = (i + 1) & t->mmask) {
        const MergeSlot *m = &t->merges[i];
        if (m->key == key) {
            *merged = m->merged;
            return m->rank;
        }
        if (m->key == UINT64_MAX) return UINT32_MAX;
    }
}

static void merge_insert(Tokenizer *t, int a, int b, uint32_t rank, int merged) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint64_t i = hash_pair(key) & t->mmask;; i = (i + 1) & t->mmask) {
        MergeSlot *m = &t->merges[i];
        if (m->key == key || m->key == UINT64_MAX) {   /* a later duplicate wins, as in HF */
            *m = (MergeSlot){key, rank, merged};
            return;
        }
    }
}

/* ---------------------------------------------------------------- UTF-8 */

/* Length of the valid UTF-8 sequence at s[0..n) and its code point, or 0 if the bytes there
 * do not form one (the rules of Rust's str / the Unicode standard). */
static inline size_t utf8_decode(const unsigned char *s, size_t n, unsigned *cp) {
    unsigned c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    if (c < 0xC2 || c > 0xF4) return 0;
    size_t len = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (n < len) return 0;
    unsigned lo = 0x80, hi = 0xBF;
    if (c == 0xE0) lo = 0xA0;
    else if (c == 0xED) hi = 0x9F;
    else if (c == 0xF0) lo = 0x90;
    else if (c == 0xF4) hi = 0x8F;
    if (s[1] < lo || s[1] > hi) return 0;
    unsigned v = c & (0xFF >> (len + 1));
    for (size_t i = 1; i < len; i++) {
        if (i > 1 && (s[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    *cp = v;
    return len;
}

static const unsigned char ASCII_CLASS[128] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 3, 3, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0,
    0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0,
    0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0,
};

/* The character at s[i] (i < n): returns its length in bytes and sets *cls. An invalid byte
 * is one character of class "other" (see tokenizer.h). */
static inline size_t char_at(const Tokenizer *t, const unsigned char *s, size_t i, size_t n, int *cls) {
    if (s[i] < 0x80) { *cls = ASCII_CLASS[s[i]]; return 1; }
    unsigned cp;
    size_t len = utf8_decode(s + i, n - i, &cp);
    if (!len) { *cls = C_OTHER; return 1; }
    *cls = t->cls[cp];
    return len;
}

/* Case fold for the contraction alternative: ASCII letters lower-cased, U+017F (long s)
 * folds to 's' as in Oniguruma; anything else 0. */
static inline int fold_at(const unsigned char *s, size_t i, size_t n, size_t *len) {
    unsigned c = s[i];
    *len = 1;
    if (c >= 'A' && c <= 'Z') return (int)(c + 32);
    if (c >= 'a' && c <= 'z') return (int)c;
    if (c == 0xC5 && i + 1 < n && s[i + 1] == 0xBF) { *len = 2; return 's'; }
    return 0;
}

/* ---------------------------------------------------------------- the split regex (§4.2) */

static size_t run_end(const Tokenizer *t, const unsigned char *s, size_t j, size_t n, int want) {
    while (j < n) {
        int c;
        size_t l = char_at(t, s, j, n, &c);
        if (c != want) break;
        j += l;
    }
    return j;
}

/* End of the piece that starts at s[i] (i < n); s[0..n) is one gap between added tokens. */
static size_t split_next(const Tokenizer *t, const unsigned char *s, size_t i, size_t n) {
    int c0, c1;
    size_t i1 = i + char_at(t, s, i, n, &c0);
    unsigned b0 = s[i];

    /* 1. (?i:'s|'t|'re|'ve|'m|'ll|'d) */
    if (b0 == '\'' && i1 < n) {
        size_t l1, l2;
        int f1 = fold_at(s, i1, n, &l1);
        if (f1 == 's' || f1 == 't' || f1 == 'm' || f1 == 'd') return i1 + l1;
        if ((f1 == 'r' || f1 == 'v' || f1 == 'l') && i1 + l1 < n) {
            int f2 = fold_at(s, i1 + l1, n, &l2);
            if (f2 == (f1 == 'l' ? 'l' : 'e')) return i1 + l1 + l2;
        }
    }
    /* 2. [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (c0 == C_LETTER) return run_end(t, s, i1, n, C_LETTER);
    if (c0 != C_NUMBER && b0 != '\r' && b0 != '\n' && i1 < n) {
        size_t l1 = char_at(t, s, i1, n, &c1);
        if (c1 == C_LETTER) return run_end(t, s, i1 + l1, n, C_LETTER);
    }
    /* 3. \p{N}{1,3} */
    if (c0 == C_NUMBER) {
        size_t j = i1;
        for (int k = 0; k < 2 && j < n; k++) {
            size_t l = char_at(t, s, j, n, &c1);
            if (c1 != C_NUMBER) break;
            j += l;
        }
        return j;
    }
    /* 4. ` ?[^\s\p{L}\p{N}]+[\r\n]*` */
    size_t j = b0 == ' ' ? i1 : i;
    if (j < n) {
        size_t l = char_at(t, s, j, n, &c1);
        if (c1 == C_OTHER) {
            j = run_end(t, s, j + l, n, C_OTHER);
            while (j < n && (s[j] == '\r' || s[j] == '\n')) j++;
            return j;
        }
    }
    /* c0 is white space from here on. 5. \s*[\r\n]+ ends after the last CR/LF of the run */
    size_t last_nl = SIZE_MAX, last = i;
    for (j = i; j < n;) {
        size_t l = char_at(t, s, j, n, &c1);
        if (c1 != C_SPACE) break;
        if (s[j] == '\r' || s[j] == '\n') last_nl = j;
        last = j;
        j += l;
    }
    if (last_nl != SIZE_MAX) return last_nl + 1;
    /* 6. \s+(?!\S): the whole run at the end, else all but its last character */
    if (j == n) return n;
    if (last > i) return last;
    /* 7. \s+ (one character before a non-space that 2 and 4 did not take) */
    return i1;
}

/* ---------------------------------------------------------------- BPE (§4.4) */

typedef struct {
    int *v;
    size_t n, cap;
} IdVec;

static int idvec_push(IdVec *o, int id) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 256;
        int *v = realloc(o->v, cap * sizeof *v);
        if (!v) return -1;
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = id;
    return 0;
}

typedef struct {          /* per-call scratch for merging one piece */
    int *id, *prev, *next;
    uint64_t *heap;       /* (rank << 32) | left position */
    size_t cap;
} Scratch;

static int scratch_reserve(Scratch *s, size_t k) {
    if (k <= s->cap) return 0;
    size_t cap = k < 256 ? 256 : k;
    free(s->id); free(s->prev); free(s->next); free(s->heap);
    s->id = malloc(cap * sizeof(int));
    s->prev = malloc(cap * sizeof(int));
    s->next = malloc(cap * sizeof(int));
    s->heap = malloc(3 * cap * sizeof(uint64_t));   /* k initial pairs + 2 per merge */
    s->cap = (s->id && s->prev && s->next && s->heap) ? cap : 0;
    return s->cap ? 0 : -1;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && h[c + 1] < h[c]) c++;
        if (v <= h[c]) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
    return top;
}

/* Appends the ids of one piece (raw bytes p[0..k), k >= 1). Equal ranks (the same pair at
 * several places) merge leftmost first; a heap entry is stale when its left symbol was merged
 * away or its right neighbour changed, which shows as a different rank for the pair now. */
static int encode_piece(const Tokenizer *t, const unsigned char *p, size_t k, IdVec *out, Scratch *sc) {
    if (k == 1 && t->byte_id[p[0]] >= 0) return idvec_push(out, t->byte_id[p[0]]);
    if (t->ignore_merges) {
        int id = vocab_find(t, p, k);
        if (id >= 0) return idvec_push(out, id);
    }
    if (scratch_reserve(sc, k)) return -1;
    int *id = sc->id, *prev = sc->prev, *next = sc->next, m = 0, merged;
    for (size_t i = 0; i < k; i++)   /* bytes without a token are dropped (HF: no unk token) */
        if (t->byte_id[p[i]] >= 0) id[m++] = t->byte_id[p[i]];
    size_t nh = 0;
    for (int i = 0; i < m; i++) {
        prev[i] = i - 1;
        next[i] = i + 1 < m ? i + 1 : -1;
        uint32_t r = i + 1 < m ? merge_find(t, id[i], id[i + 1], &merged) : UINT32_MAX;
        if (r != UINT32_MAX) heap_push(sc->heap, &nh, (uint64_t)r << 32 | (uint32_t)i);
    }
    while (nh) {
        uint64_t top = heap_pop(sc->heap, &nh);
        int pos = (int)(uint32_t)top, nx = next[pos];
        if (id[pos] < 0 || nx < 0) continue;
        if (merge_find(t, id[pos], id[nx], &merged) != (uint32_t)(top >> 32)) continue;
        id[pos] = merged;
        id[nx] = -1;
        next[pos] = next[nx];
        if (next[pos] >= 0) prev[next[pos]] = pos;
        uint32_t r;
        if (prev[pos] >= 0 && (r = merge_find(t, id[prev[pos]], id[pos], &merged)) != UINT32_MAX)
            heap_push(sc->heap, &nh, (uint64_t)r << 32 | (uint32_t)prev[pos]);
        if (next[pos] >= 0 && (r = merge_find(t, id[pos], id[next[pos]], &merged)) != UINT32_MAX)
            heap_push(sc->heap, &nh, (uint64_t)r << 32 | (uint32_t)pos);
    }
    for (int i = m ? 0 : -1; i >= 0; i = next[i])
        if (idvec_push(out, id[i])) return -1;
    return 0;
}

/* ---------------------------------------------------------------- encode (§4.1) */

static int encode_gap(const Tokenizer *t, const unsigned char *s, size_t n, IdVec *out, Scratch *sc) {
    for (size_t i = 0; i < n;) {
        size_t j = split_next(t, s, i, n);
        if (encode_piece(t, s + i, j - i, out, sc)) return -1;
        i = j;
    }
    return 0;
}

/* Longest added token at s[0..n) (none of GLM's is a prefix of another, but Llama's may be). */
static const Added *added_at(const Tokenizer *t, const unsigned char *s, size_t n) {
    for (int k = t->added_first[s[0]]; k < t->added_first[s[0] + 1]; k++) {
        const Added *a = &t->added[k];
        if (a->len <= n && memcmp(t->pool + a->off, s, a->len) == 0) return a;   /* longest first */
    }
    return NULL;
}

int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int **ids, char *err, size_t errlen) {
    const unsigned char *s = (const unsigned char *)text;
    IdVec out = {0};
    Scratch sc = {0};
    size_t gap = 0;
    int rc = 0;
    *ids = NULL;
    for (size_t i = 0; i < len && rc == 0;) {
        const Added *a = t->added_first[s[i]] < t->added_first[s[i] + 1] ? added_at(t, s + i, len - i) : NULL;
        if (!a) { i++; continue; }
        rc = encode_gap(t, s + gap, i - gap, &out, &sc);
        if (rc == 0) rc = idvec_push(&out, a->id);
        i += a->len;
        gap = i;
    }
    if (rc == 0) rc = encode_gap(t, s + gap, len - gap, &out, &sc);
    free(sc.id); free(sc.prev); free(sc.next); free(sc.heap);
    if (rc || out.n > INT32_MAX) {
        free(out.v);
        seterr(err, errlen, "out of memory while encoding %zu bytes", len);
        return -1;
    }
    *ids = out.v;
    return (int)out.n;
}

static int push_end(size_t **e, size_t *n, size_t *cap, size_t v) {
    if (*n == *cap) {
        size_t *ne = realloc(*e, (*cap = *cap ? 2 * *cap : 64) * sizeof *ne);
        if (!ne) return -1;
        *e = ne;
    }
    (*e)[(*n)++] = v;
    return 0;
}

int tokenizer_split(const Tokenizer *t, const char *text, size_t len, size_t **ends) {
    const unsigned char *s = (const unsigned char *)text;
    size_t n = 0, cap = 0, gap = 0, *e = NULL;
    for (size_t i = 0;;) {
        const Added *a = NULL;
        if (i < len) {
            a = t->added_first[s[i]] < t->added_first[s[i] + 1] ? added_at(t, s + i, len - i) : NULL;
            if (!a) { i++; continue; }
        }
        for (size_t j = gap; j < i; j = e[n - 1])   /* the pieces of the gap before i */
            if (push_end(&e, &n, &cap, gap + split_next(t, s + gap, j - gap, i - gap))) goto oom;
        if (!a) break;
        i += a->len;
        if (push_end(&e, &n, &cap, i)) goto oom;
        gap = i;
    }
    *ends = e;
    return (int)n;
oom:
    free(e);
    *ends = NULL;
    return -1;
}

/* ---------------------------------------------------------------- lookups */

int tokenizer_token_bytes(const Tokenizer *t, int id, const char **bytes) {
    if (id < 0 || id >= t->n_ids || !t->tok[id].len) { *bytes = ""; return 0; }
    *bytes = (const char *)t->pool + t->tok[id].off;
    return (int)t->tok[id].len;
}

int tokenizer_vocab_size(const Tokenizer *t) { return t->n_ids; }
int tokenizer_max_token_bytes(const Tokenizer *t) { return t->max_token_bytes; }
int tokenizer_is_special(const Tokenizer *t, int id) { return id >= 0 && id < t->n_ids && (t->flags[id] & 2); }

int tokenizer_token_id(const Tokenizer *t, const char *token_text) {
    size_t n = strlen(token_text);
    for (int k = 0; k < t->n_added; k++)
        if (t->added[k].len == n && memcmp(t->pool + t->added[k].off, token_text, n) == 0) return t->added[k].id;
    return n ? vocab_find(t, (const unsigned char *)token_text, n) : -1;
}

/* ---------------------------------------------------------------- decode (§4.5) */

/* Lossy UTF-8 as a byte-at-a-time state machine over TokenizerStream.pending: complete
 * characters go out, a maximal invalid subpart becomes one U+FFFD. */
typedef struct { char *out; size_t n, cap; } Sink;

static void sink_put(Sink *k, const void *p, size_t n) {
    if (k->cap - k->n < n) { k->cap = k->n; return; }   /* cut at a character boundary */
    memcpy(k->out + k->n, p, n);
    k->n += n;
}

static const char FFFD[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

static void stream_byte(TokenizerStream *s, Sink *k, unsigned char b) {
    for (;;) {
        if (s->npending == 0) {
            if (b < 0x80) sink_put(k, &b, 1);
            else if (b >= 0xC2 && b <= 0xF4) { s->pending[0] = b; s->npending = 1; }
            else sink_put(k, FFFD, 3);
            return;
        }
        unsigned c = s->pending[0], lo = 0x80, hi = 0xBF;
        int need = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        if (s->npending == 1) {
            if (c == 0xE0) lo = 0xA0;
            else if (c == 0xED) hi = 0x9F;
            else if (c == 0xF0) lo = 0x90;
            else if (c == 0xF4) hi = 0x8F;
        }
        if (b >= lo && b <= hi) {
            s->pending[s->npending++] = b;
            if (s->npending == need) { sink_put(k, s->pending, (size_t)need); s->npending = 0; }
            return;
        }
        sink_put(k, FFFD, 3);   /* the pending prefix is a maximal invalid subpart; b starts afresh */
        s->npending = 0;
    }
}

void tokenizer_stream_init(TokenizerStream *s) { memset(s, 0, sizeof *s); }

size_t tokenizer_stream_out_max(const Tokenizer *t) { return 3 * ((size_t)t->max_token_bytes + 3); }

size_t tokenizer_stream_push(TokenizerStream *s, const Tokenizer *t, int id, char *out, size_t cap) {
    const char *b;
    int n = tokenizer_token_bytes(t, id, &b);
    Sink k = {out, 0, cap};
    for (int i = 0; i < n; i++) stream_byte(s, &k, (unsigned char)b[i]);
    return k.n;
}

size_t tokenizer_stream_flush(TokenizerStream *s, char *out, size_t cap) {
    Sink k = {out, 0, cap};
    if (s->npending) sink_put(&k, FFFD, 3);
    s->npending = 0;
    return k.n;
}

char *tokenizer_decode(const Tokenizer *t, const int *ids, int n, int skip_special, size_t *len) {
    size_t total = 3;
    for (int i = 0; i < n; i++) {
        const char *b;
        total += (size_t)tokenizer_token_bytes(t, ids[i], &b);
    }
    Sink k = {malloc(3 * total + 1), 0, 3 * total};
    if (!k.out) return NULL;
    TokenizerStream s;
    tokenizer_stream_init(&s);
    for (int i = 0; i < n; i++) {
        if (skip_special && tokenizer_is_special(t, ids[i])) continue;
        const char *b;
        int m = tokenizer_token_bytes(t, ids[i], &b);
        for (int j = 0; j < m; j++) stream_byte(&s, &k, (unsigned char)b[j]);
    }
    if (s.npending) sink_put(&k, FFFD, 3);
    k.out[k.n] = 0;
    if (len) *len = k.n;
    return k.out;
}

/* ---------------------------------------------------------------- loading (§4.7) */

/* byte-level alphabet (§4.3): code point -> byte, -1 outside the alphabet */
static void byte_level_inverse(int inv[0x144]) {
    int n = 0;
    for (int c = 0; c < 0x144; c++) inv[c] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        inv[printable ? b : 256 + n++] = b;
    }
}

/* byte-level string -> raw bytes in out (room for n bytes); returns length or -1 */
static long unbyte(const int inv[0x144], const char *s, size_t n, unsigned char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned cp;
        size_t l = utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (!l || cp >= 0x144 || inv[cp] < 0) return -1;
        out[o++] = (unsigned char)inv[cp];
        i += l;
    }
    return (long)o;
}

static int is_str(const JsonValue *v, const char *s) { return v && v->type == JSON_STRING && strcmp(v->str, s) == 0; }
static int is_null(const JsonValue *v) { return !v || v->type == JSON_NULL; }
static int is_false(const JsonValue *v) { return !v || v->type == JSON_NULL || (v->type == JSON_BOOL && v->num == 0); }
static int is_empty_str(const JsonValue *v) { return is_null(v) || (v->type == JSON_STRING && v->str_len == 0); }

/* Checks that the file describes the pipeline we implement; returns a reason or NULL. */
static const char *check_pipeline(const JsonValue *root) {
    const JsonValue *norm = json_get(root, "normalizer"), *pre = json_get(root, "pre_tokenizer");
    const JsonValue *model = json_get(root, "model"), *dec = json_get(root, "decoder");
    if (!is_null(norm)) return "unsupported normalizer (only null)";
    const JsonValue *seq = json_get(pre, "pretokenizers");
    const JsonValue *split = json_at(seq, 0), *bl = json_at(seq, 1);
    if (!is_str(json_get(pre, "type"), "Sequence") || !seq || seq->type != JSON_ARRAY || seq->n != 2 ||
        !is_str(json_get(split, "type"), "Split") || !is_str(json_get(json_get(split, "pattern"), "Regex"), GLM_REGEX) ||
        !is_str(json_get(split, "behavior"), "Isolated") || !is_false(json_get(split, "invert")) ||
        !is_str(json_get(bl, "type"), "ByteLevel") || !is_false(json_get(bl, "add_prefix_space")) ||
        !is_false(json_get(bl, "use_regex")))
        return "unsupported pre_tokenizer (only Split with the GLM/cl100k regex + ByteLevel without regex or prefix space)";
    if (!model || !is_str(json_get(model, "type"), "BPE")) return "unsupported model (only BPE)";
    if (!is_null(json_get(model, "dropout")) || !is_null(json_get(model, "unk_token")) ||
        !is_empty_str(json_get(model, "continuing_subword_prefix")) ||
        !is_empty_str(json_get(model, "end_of_word_suffix")) || !is_false(json_get(model, "byte_fallback")))
        return "unsupported BPE options (dropout, unk_token, subword prefix/suffix or byte_fallback)";
    if (!is_str(json_get(dec, "type"), "ByteLevel")) return "unsupported decoder (only ByteLevel)";
    return NULL;
}

/* Merges: either "a b" or ["a", "b"]; rank = position in the list. Both sides and the merged
 * token must be in the vocabulary (as in HF). The 4 MB vocab table, the token table, the pool
 * and the 16 MB merge table are read at random places, so merges go in batches whose memory
 * is prefetched stage by stage: waiting for each access in turn would double the load time. */
typedef struct { long len; uint64_t h; int id; } Side;

static int load_merges(Tokenizer *t, const JsonValue *merges, const int inv[0x144], char *msg, size_t msglen) {
    enum { BATCH = 32 };
    size_t bufsz = 4 * (size_t)t->max_token_bytes + 8;   /* a byte-level side is <= 2x its raw bytes */
    unsigned char *bufs = malloc(BATCH * bufsz);
    t->mmask = table_size(merges->n) - 1;
    t->merges = malloc((t->mmask + 1) * sizeof *t->merges);
    if (!t->merges || !bufs) { free(bufs); seterr(msg, msglen, "out of memory"); return -1; }
    for (uint64_t i = 0; i <= t->mmask; i++) t->merges[i].key = UINT64_MAX;
    uint32_t rank = 0;
    int guess = 0;
    for (const JsonValue *m = merges->child; m;) {
        Side side[2 * BATCH];
        int n = 0;
        for (; m && n < BATCH; m = m->next, n++) {   /* 1: raw bytes, hashes, prefetch the hash slots */
            const char *a = NULL, *b = NULL;
            size_t na = 0, nb = 0;
            if (m->type == JSON_STRING) {
                const char *sp = memchr(m->str, ' ', m->str_len);
                if (sp) { a = m->str; na = (size_t)(sp - m->str); b = sp + 1; nb = m->str_len - na - 1; }
            } else if (m->type == JSON_ARRAY && m->n == 2 && m->child->type == JSON_STRING && m->child->next->type == JSON_STRING) {
                a = m->child->str; na = m->child->str_len;
                b = m->child->next->str; nb = m->child->next->str_len;
            }
            unsigned char *buf = bufs + (size_t)n * bufsz;
            Side *sa = &side[2 * n], *sb = sa + 1;
            sa->len = sb->len = -1;
            if (a && na <= (size_t)t->max_token_bytes * 2 && nb <= (size_t)t->max_token_bytes * 2) {
                sa->len = unbyte(inv, a, na, buf);
                if (sa->len > 0 && sa->len <= t->max_token_bytes) {
                    sb->len = unbyte(inv, b, nb, buf + sa->len);
                    if (sb->len > t->max_token_bytes) sb->len = -1;
                }
            }
            for (int k = 0; k < 2; k++) {
                Side *x = &sa[k];
                if (x->len <= 0) continue;
                x->h = hash_bytes(buf + (k ? sa->len : 0), (size_t)x->len);
                PREFETCH(&t->vmap[x->h & t->vmask]);
            }
        }
        for (int k = 0; k < 2 * n; k++) {   /* 2: the likely token's entry */
            if (side[k].len <= 0) continue;
            uint64_t e = t->vmap[side[k].h & t->vmask];
            side[k].id = e ? (int)(uint32_t)e - 1 : -1;
            if (e) PREFETCH(&t->tok[side[k].id]);
        }
        for (int k = 0; k < 2 * n; k++)   /* 3: its bytes */
            if (side[k].len > 0 && side[k].id >= 0) PREFETCH(t->pool + t->tok[side[k].id].off);
        MergeSlot q[BATCH];
        for (int k = 0; k < n; k++, rank++) {   /* 4: the lookups proper */
            const unsigned char *buf = bufs + (size_t)k * bufsz;
            long la = side[2 * k].len, lb = side[2 * k + 1].len;
            int ia = la > 0 ? vocab_find_h(t, buf, (size_t)la, side[2 * k].h) : -1;
            int ib = lb > 0 ? vocab_find_h(t, buf + la, (size_t)lb, side[2 * k + 1].h) : -1;
            int im = -1;
            /* files made by the tiktoken converter (GLM, Llama-3) list merges in the order of
             * the merged token's id: try the last one and its successor before hashing */
            for (int g = guess; ia >= 0 && ib >= 0 && im < 0 && g <= guess + 1 && g < t->n_ids; g++)
                if (t->tok[g].len == (uint32_t)(la + lb) && memcmp(t->pool + t->tok[g].off, buf, (size_t)(la + lb)) == 0) im = g;
            if (im < 0 && ia >= 0 && ib >= 0) im = vocab_find(t, buf, (size_t)(la + lb));
            if (im < 0) {
                free(bufs);
                seterr(msg, msglen, "merge %u is malformed or not in the vocabulary", rank);
                return -1;
            }
            guess = im;
            q[k] = (MergeSlot){(uint64_t)(uint32_t)ia << 32 | (uint32_t)ib, rank, im};
            PREFETCH(&t->merges[hash_pair(q[k].key) & t->mmask]);
        }
        for (int k = 0; k < n; k++)   /* 5: inserts, in order (a later duplicate wins) */
            merge_insert(t, (int)(q[k].key >> 32), (int)(uint32_t)q[k].key, q[k].rank, q[k].merged);
    }
    free(bufs);
    return 0;
}

static int cmp_added(const void *pa, const void *pb) {
    const Added *a = pa, *b = pb;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;   /* longest first */
    return a->id < b->id ? -1 : a->id > b->id;
}

static int build(Tokenizer *t, const JsonValue *root, char *msg, size_t msglen) {
    const char *why = check_pipeline(root);
    if (why) { seterr(msg, msglen, "%s", why); return -1; }
    const JsonValue *model = json_get(root, "model");
    const JsonValue *vocab = json_get(model, "vocab"), *merges = json_get(model, "merges");
    const JsonValue *added = json_get(root, "added_tokens");
    if (!vocab || vocab->type != JSON_OBJECT || !vocab->n) { seterr(msg, msglen, "model.vocab missing or empty"); return -1; }
    if (!merges || merges->type != JSON_ARRAY) { seterr(msg, msglen, "model.merges missing"); return -1; }
    if (added && added->type != JSON_ARRAY) { seterr(msg, msglen, "added_tokens is not an array"); return -1; }
    const JsonValue *ig = json_get(model, "ignore_merges");
    t->ignore_merges = ig && ig->type == JSON_BOOL && ig->num != 0;

    /* ids and pool size */
    int max_id = -1;
    size_t pool = 0;
    for (const JsonValue *v = vocab->child; v; v = v->next) {
        if (v->type != JSON_NUMBER || !v->is_uint || v->u64 >= MAX_ID) { seterr(msg, msglen, "vocab entry with a bad id"); return -1; }
        if ((int)v->u64 > max_id) max_id = (int)v->u64;
        pool += v->key_len;
    }
    int n_added = 0;
    for (const JsonValue *a = added ? added->child : NULL; a; a = a->next, n_added++) {
        const JsonValue *id = json_get(a, "id"), *c = json_get(a, "content");
        if (!id || id->type != JSON_NUMBER || !id->is_uint || id->u64 >= MAX_ID || !c || c->type != JSON_STRING || !c->str_len) {
            seterr(msg, msglen, "added token %d: bad id or content", n_added);
            return -1;
        }
        if (!is_false(json_get(a, "lstrip")) || !is_false(json_get(a, "rstrip")) || !is_false(json_get(a, "single_word"))) {
            seterr(msg, msglen, "added token %d: lstrip/rstrip/single_word are not supported", n_added);
            return -1;
        }
        if ((int)id->u64 > max_id) max_id = (int)id->u64;
        pool += c->str_len;
    }
    if (pool >= UINT32_MAX) { seterr(msg, msglen, "vocabulary too large"); return -1; }
    t->n_ids = max_id + 1;
    t->tok = calloc((size_t)t->n_ids, sizeof *t->tok);
    t->flags = calloc((size_t)t->n_ids, 1);
    t->pool = malloc(pool + 1);
    t->vmask = table_size(vocab->n) - 1;
    t->vmap = calloc(t->vmask + 1, sizeof *t->vmap);
    t->added = calloc((size_t)n_added + 1, sizeof *t->added);
    t->cls = calloc(0x110000, 1);
    if (!t->tok || !t->flags || !t->pool || !t->vmap || !t->added || !t->cls) {
        seterr(msg, msglen, "out of memory");
        return -1;
    }
    for (size_t r = 0; r < sizeof tok_unicode_ranges / sizeof *tok_unicode_ranges; r++)
        memset(t->cls + tok_unicode_ranges[r].lo, tok_unicode_ranges[r].cls, tok_unicode_ranges[r].hi - tok_unicode_ranges[r].lo + 1);

    /* vocabulary: byte-level keys -> raw bytes in the pool */
    int inv[0x144];
    byte_level_inverse(inv);
    uint32_t used = 0;
    for (const JsonValue *v = vocab->child; v; v = v->next) {
        int id = (int)v->u64;
        long n = unbyte(inv, v->key, v->key_len, t->pool + used);
        if (n <= 0) { seterr(msg, msglen, "vocab entry %d is empty or not in the byte-level alphabet", id); return -1; }
        if (t->tok[id].len) { seterr(msg, msglen, "vocab id %d used twice", id); return -1; }
        t->tok[id] = (TokRef){used, (uint32_t)n};
        used += (uint32_t)n;
        if (n > t->max_token_bytes) t->max_token_bytes = (int)n;
        if (vocab_insert(t, id) >= 0) { seterr(msg, msglen, "vocab entry %d is a duplicate", id); return -1; }
    }
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        t->byte_id[b] = vocab_find(t, &c, 1);
    }

    if (load_merges(t, merges, inv, msg, msglen)) return -1;

    /* added tokens (content verbatim, not byte-level) */
    int k = 0;
    for (const JsonValue *a = added ? added->child : NULL; a; a = a->next, k++) {
        const JsonValue *c = json_get(a, "content");
        int id = (int)json_get(a, "id")->u64;
        memcpy(t->pool + used, c->str, c->str_len);
        t->added[k] = (Added){id, used, (uint32_t)c->str_len, (unsigned char)c->str[0]};
        t->tok[id] = (TokRef){used, (uint32_t)c->str_len};
        t->flags[id] = 1 | (is_false(json_get(a, "special")) ? 0 : 2);
        used += (uint32_t)c->str_len;
        if ((int)c->str_len > t->max_token_bytes) t->max_token_bytes = (int)c->str_len;
    }
    t->n_added = n_added;
    qsort(t->added, (size_t)n_added, sizeof *t->added, cmp_added);
    for (int b = 0, j = 0; b <= 256; b++) {
        while (j < n_added && t->added[j].first < b) j++;
        t->added_first[b] = j;
    }
    return 0;
}

Tokenizer *tokenizer_load(const char *path, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) { seterr(err, errlen, "%s: %s", path, strerror(errno)); return NULL; }
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        seterr(err, errlen, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    size_t len = (size_t)st.st_size;
    char *text = len ? mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (len && text == MAP_FAILED) { seterr(err, errlen, "%s: mmap: %s", path, strerror(errno)); return NULL; }
    Json j;
    char msg[200];
    int rc = json_parse(&j, text ? text : "", len, msg, sizeof msg);
    if (text) munmap(text, len);
    if (rc) { seterr(err, errlen, "%s: invalid JSON: %s", path, msg); return NULL; }
    Tokenizer *t = calloc(1, sizeof *t);
    if (t) rc = build(t, j.root, msg, sizeof msg);
    else rc = -1, snprintf(msg, sizeof msg, "out of memory");
    json_free(&j);
    if (rc) {
        seterr(err, errlen, "%s: %s", path, msg);
        tokenizer_free(t);
        return NULL;
    }
    return t;
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    free(t->tok); free(t->pool); free(t->flags); free(t->vmap);
    free(t->merges); free(t->added); free(t->cls);
    free(t);
}

/* ---------------------------------------------------------------- chat format (§1.6) */
/* GLM-5.2's chat template (data/glm-5.2-tokenizer/chat_template.jinja) written out in C, byte
 * for byte as Hugging Face renders it: jinja2 with trim_blocks and lstrip_blocks, and a tojson
 * filter that is Python's json.dumps (ensure_ascii=False, separators ", " and ": ", keys in the
 * order given). tests/test_chat_template.sh renders the template itself and compares. */

typedef struct { char *s; size_t n, cap; int oom; } Str;

static void str_add(Str *b, const char *p, size_t n) {
    if (b->oom) return;
    if (b->cap - b->n <= n) {
        size_t cap = (b->cap + n) * 2 + 64;
        char *s = realloc(b->s, cap);
        if (!s) { b->oom = 1; return; }
        b->s = s;
        b->cap = cap;
    }
    memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = 0;
}
static void str_cat(Str *b, const char *p) { str_add(b, p, strlen(p)); }
static void str_addc(Str *b, char c) { str_add(b, &c, 1); }

/* The first needle in s[0..n), or NULL (memmem is not in C11). */
static const char *find(const char *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    if (k > n) return NULL;
    const char *last = s + n - k;
    for (const char *p = s; p <= last; p++) {
        p = memchr(p, needle[0], (size_t)(last - p) + 1);
        if (!p) return NULL;
        if (memcmp(p, needle, k) == 0) return p;
    }
    return NULL;
}

/* The last needle in s[0..n), or NULL: Python's s.split(needle)[-1] starts after it. */
static const char *find_last(const char *s, size_t n, const char *needle) {
    const char *r = NULL;
    for (const char *p; (p = find(s, n, needle)); n -= (size_t)(p + 1 - s), s = p + 1) r = p;
    return r;
}

static int starts(const char *p, const char *e, const char *word) {
    size_t k = strlen(word);
    return (size_t)(e - p) >= k && memcmp(p, word, k) == 0;
}

/* Python's str.strip() white space (what the template's .strip() removes) */
static size_t py_space_at(const unsigned char *s, size_t n) {
    unsigned cp;
    size_t l = utf8_decode(s, n, &cp);
    if (!l) return 0;
    int sp = (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
             cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
             cp == 0x202F || cp == 0x205F || cp == 0x3000;
    return sp ? l : 0;
}

/* Narrows s[0..*n) to what Python's str.strip() leaves. */
static const char *py_strip(const char *text, size_t *n) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0, end = 0;
    for (size_t l; i < *n && (l = py_space_at(s + i, *n - i)); i += l) {}
    for (size_t j = i; j < *n;) {   /* end = just after the last non-space character */
        size_t l = py_space_at(s + j, *n - j);
        if (!l) {
            unsigned cp;
            l = utf8_decode(s + j, *n - j, &cp);
            if (!l) l = 1;
            end = j + l;
        }
        j += l;
    }
    *n = end > i ? end - i : 0;
    return text + i;
}

static int utf8_valid(const char *s, size_t n) {
    unsigned cp;
    for (size_t i = 0, l; i < n; i += l)
        if (!(l = utf8_decode((const unsigned char *)s + i, n - i, &cp))) return 0;
    return 1;
}

/* ---- JSON as Python sees it
 * The chat's JSON inputs (tools, tool call arguments, `glm tokenize --chat` lines) are walked in
 * their text, not in json.c's tree: the template's tojson is Python's json.dumps, which writes an
 * integer of any size digit for digit, tells 1 from 1.0, and keeps a repeated key at its first
 * place with its last value, and the tree keeps none of that. json_parse checks each text first
 * (grammar, UTF-8, surrogates, depth), so these helpers only find where things end. */

static const char *js_ws(const char *p, const char *e) {
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

/* Past the string whose opening quote is at p. */
static const char *js_str_end(const char *p, const char *e) {
    for (p++; p < e && *p != '"'; p++)
        if (*p == '\\') p++;
    return p < e ? p + 1 : e;
}

/* Past the value at p (a loop, not recursion: depth costs no stack). */
static const char *js_end(const char *p, const char *e) {
    if (p >= e) return e;
    if (*p == '"') return js_str_end(p, e);
    if (*p != '[' && *p != '{') {   /* number, true, false, null */
        while (p < e && *p != ',' && *p != ']' && *p != '}' && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') p++;
        return p;
    }
    int depth = 0;
    do {
        if (*p == '"') { p = js_str_end(p, e); continue; }
        if (*p == '[' || *p == '{') depth++;
        else if (*p == ']' || *p == '}') depth--;
        p++;
    } while (p < e && depth > 0);
    return p;
}

static void put_utf8(Str *b, unsigned cp) {
    char u[4];
    int n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (n == 1) u[0] = (char)cp;
    else {
        for (int i = n - 1; i > 0; i--, cp >>= 6) u[i] = (char)(0x80 | (cp & 0x3F));
        u[0] = (char)((0xF00 >> n) | cp);
    }
    str_add(b, u, (size_t)n);
}

static unsigned hex4(const char *p) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) v = v * 16 + (unsigned)(p[i] <= '9' ? p[i] - '0' : (p[i] | 32) - 'a' + 10);
    return v;
}

/* Appends the decoded text of the JSON string at p. */
static void js_str(Str *b, const char *p, const char *e) {
    const char *end = js_str_end(p, e) - 1;   /* the closing quote */
    for (p++; p < end;) {
        const char *q = p;
        while (q < end && *q != '\\') q++;
        str_add(b, p, (size_t)(q - p));
        if (q >= end) break;
        char c = q[1];
        p = q + 2;
        if (c == 'u') {
            unsigned cp = hex4(p);
            p += 4;
            if (cp >= 0xD800 && cp < 0xDC00) {   /* json_parse let only whole pairs through */
                cp = 0x10000 + ((cp - 0xD800) << 10) + (hex4(p + 2) - 0xDC00);
                p += 6;
            }
            put_utf8(b, cp);
        } else {
            str_addc(b, c == 'b' ? '\b' : c == 'f' ? '\f' : c == 'n' ? '\n' : c == 'r' ? '\r' : c == 't' ? '\t' : c);
        }
    }
}

/* Whether the key at k (its opening quote) is name[0..n). */
static int js_key_is(const char *k, const char *e, const char *name, size_t n) {
    const char *end = js_str_end(k, e) - 1;
    if (!memchr(k + 1, '\\', (size_t)(end - k - 1))) return (size_t)(end - k - 1) == n && memcmp(k + 1, name, n) == 0;
    Str s = {0};
    js_str(&s, k, e);
    int r = !s.oom && s.n == n && memcmp(s.s, name, n) == 0;
    free(s.s);
    return r;
}

/* Walks an array's elements or an object's members: start with *it at the '[' or '{'; each call
 * returns the next value (and for an object sets *key to its key's quote), NULL at the end. */
static const char *js_next(const char **it, const char *e, const char **key) {
    const char *q = *it;
    if (q >= e || *q == ']' || *q == '}') return NULL;
    q = js_ws(q + 1, e);   /* past '[', '{' or ',' */
    if (q >= e || *q == ']' || *q == '}') { *it = q; return NULL; }
    if (key) {
        *key = q;
        q = js_ws(js_ws(js_str_end(q, e), e) + 1, e);   /* past the key and ':' */
    }
    *it = js_ws(js_end(q, e), e);
    return q;
}

/* A member of the object at obj as a Python dict has it (a repeated key: its last value), or NULL. */
static const char *js_get_n(const char *obj, const char *e, const char *name, size_t n) {
    if (*obj != '{') return NULL;
    const char *it = obj, *k, *v, *r = NULL;
    while ((v = js_next(&it, e, &k)))
        if (js_key_is(k, e, name, n)) r = v;
    return r;
}
static const char *js_get(const char *obj, const char *e, const char *name) { return js_get_n(obj, e, name, strlen(name)); }

/* The number at p as a double (strtod wants a NUL-terminated copy). */
static double js_num(const char *p, const char *e) {
    size_t n = (size_t)(js_end(p, e) - p);
    char buf[64], *s = n < sizeof buf ? buf : malloc(n + 1);
    if (!s) return 1;   /* out of memory: a nonzero guess, only truthiness and repr read it */
    memcpy(s, p, n);
    s[n] = 0;
    double v = strtod(s, NULL);
    if (s != buf) free(s);
    return v;
}

/* Python's truth of a JSON value: null, false, 0, "", [] and {} are false. */
static int js_truthy(const char *p, const char *e) {
    if (p >= e) return 0;
    switch (*p) {
    case 'n': case 'f': return 0;
    case 't': return 1;
    case '"': return p + 1 < e && p[1] != '"';
    case '[': case '{': { const char *q = js_ws(p + 1, e); return q < e && *q != ']' && *q != '}'; }
    default: return js_num(p, e) != 0;
    }
}

/* s as a JSON string the way json.dumps(ensure_ascii=False) writes it: only '"', '\' and the
 * control characters are escaped (\n, \t, ... or \u00XX), everything else stays as is. */
static void py_str(Str *b, const char *s, size_t n) {
    str_addc(b, '"');
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        str_add(b, s + run, i - run);
        run = i + 1;
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r" :
                          c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        char u[8];
        if (!esc) snprintf(u, sizeof u, "\\u%04x", c), esc = u;
        str_cat(b, esc);
    }
    str_add(b, s + run, n - run);
    str_addc(b, '"');
}

/* m * 10^k in digits, if it reads back as v (strtod rounds correctly, like Python's float()). */
static int reads_back(unsigned long long m, int k, double v) {
    char buf[48];
    snprintf(buf, sizeof buf, "%llue%d", m, k);
    return m && strtod(buf, NULL) == v;
}

/* v as Python's repr() writes a float (json.dumps does): the fewest digits that read back as v
 * (of two such, the nearer), fixed point from 1e-4 up to 1e16, else d.ddde+XX. */
static void py_float(Str *b, double v) {
    if (v != v) { str_cat(b, "NaN"); return; }
    if (v < 0 || (v == 0 && 1 / v < 0)) { str_addc(b, '-'); v = -v; }
    if (v > 1.7976931348623157e308) { str_cat(b, "Infinity"); return; }
    if (v == 0) { str_cat(b, "0.0"); return; }
    unsigned long long m = 0;
    int k = 0;
    for (int p = 1; p <= 17; p++) {
        char buf[48], *ex;
        snprintf(buf, sizeof buf, "%.*e", p - 1, v);   /* the nearest p digits: d.ddd e X */
        ex = strchr(buf, 'e');
        m = 0;
        for (char *c = buf; c < ex; c++)
            if (*c != '.') m = m * 10 + (unsigned long long)(*c - '0');
        k = atoi(ex + 1) - (p - 1);
        if (reads_back(m, k, v)) break;
        unsigned long long other = strtod(buf, NULL) < v ? m + 1 : m - 1;   /* the nearest on v's other side */
        if (reads_back(other, k, v)) { m = other; break; }
    }
    char d[24];
    int nd = snprintf(d, sizeof d, "%llu", m);
    while (nd > 1 && d[nd - 1] == '0') d[--nd] = 0, k++;
    int decpt = nd + k;   /* v = 0.DIGITS * 10^decpt */
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            str_cat(b, "0.");
            for (int i = decpt; i < 0; i++) str_addc(b, '0');
            str_add(b, d, (size_t)nd);
        } else if (decpt >= nd) {
            str_add(b, d, (size_t)nd);
            for (int i = nd; i < decpt; i++) str_addc(b, '0');
            str_cat(b, ".0");
        } else {
            str_add(b, d, (size_t)decpt);
            str_addc(b, '.');
            str_add(b, d + decpt, (size_t)(nd - decpt));
        }
    } else {
        char x[16];
        str_addc(b, d[0]);
        if (nd > 1) str_addc(b, '.'), str_add(b, d + 1, (size_t)nd - 1);
        snprintf(x, sizeof x, "e%c%02d", decpt - 1 < 0 ? '-' : '+', abs(decpt - 1));
        str_cat(b, x);
    }
}

typedef struct { const char *key, *val; } JsMember;   /* key: its opening quote */
typedef struct { JsMember m; Str k; int i; } JsSort;

static int cmp_key(const Str *a, const Str *b) {
    size_t n = a->n < b->n ? a->n : b->n;
    int c = n ? memcmp(a->s, b->s, n) : 0;
    return c ? c : a->n < b->n ? -1 : a->n > b->n;
}
static int cmp_member(const void *pa, const void *pb) {   /* by key, then by place */
    const JsSort *a = pa, *b = pb;
    int c = cmp_key(&a->k, &b->k);
    return c ? c : a->i - b->i;
}
static int cmp_index(const void *pa, const void *pb) { return ((const JsSort *)pa)->i - ((const JsSort *)pb)->i; }

/* The members of the object at obj as Python's dict holds them (json.loads: a repeated key
 * stays at its first place and takes its last value). Returns the count and a malloc'd *out,
 * or -1 when out of memory. */
static int js_members(const char *obj, const char *e, JsMember **out) {
    int n = 0, dup = 0;
    const char *it = obj, *k, *v;
    while (js_next(&it, e, &k)) n++;
    *out = malloc((size_t)(n ? n : 1) * sizeof **out);
    JsSort *s = calloc((size_t)(n ? n : 1), sizeof *s);
    if (!*out || !s) { free(*out); free(s); *out = NULL; return -1; }
    it = obj;
    for (int i = 0; (v = js_next(&it, e, &k)); i++) {
        s[i].m = (JsMember){k, v};
        s[i].i = i;
        js_str(&s[i].k, k, e);
        dup |= s[i].k.oom;
    }
    int r = dup ? -1 : 0;
    if (r == 0) {
        qsort(s, (size_t)n, sizeof *s, cmp_member);   /* equal keys side by side, in order */
        for (int i = 0, j; i < n; i = j) {
            for (j = i + 1; j < n && cmp_key(&s[i].k, &s[j].k) == 0; j++) s[j].i += n;   /* a repeat: dropped below */
            s[i].m.val = s[j - 1].m.val;   /* first place, last value */
        }
        qsort(s, (size_t)n, sizeof *s, cmp_index);   /* back in order; repeats (index >= n) last */
        for (r = 0; r < n && s[r].i < n; r++) (*out)[r] = s[r].m;
    }
    for (int i = 0; i < n; i++) free(s[i].k.s);
    free(s);
    if (r < 0) { free(*out); *out = NULL; }
    return r;
}

/* Appends the JSON value at p as Python's json.dumps(json.loads(text), ensure_ascii=False)
 * writes it (the template's tojson). Returns 0, or -1 when out of memory. */
static int py_dumps(Str *b, const char *p, const char *e) {
    if (*p == '"') {
        Str s = {0};
        js_str(&s, p, e);
        py_str(b, s.s ? s.s : "", s.n);
        b->oom |= s.oom;
        free(s.s);
    } else if (*p == '[') {
        const char *it = p, *v;
        str_addc(b, '[');
        for (int i = 0; (v = js_next(&it, e, NULL)); i++) {
            if (i) str_cat(b, ", ");
            if (py_dumps(b, v, e)) return -1;
        }
        str_addc(b, ']');
    } else if (*p == '{') {
        JsMember *m;
        int n = js_members(p, e, &m);
        if (n < 0) return -1;
        str_addc(b, '{');
        for (int i = 0; i < n; i++) {
            if (i) str_cat(b, ", ");
            if (py_dumps(b, m[i].key, e)) { free(m); return -1; }
            str_cat(b, ": ");
            if (py_dumps(b, m[i].val, e)) { free(m); return -1; }
        }
        free(m);
        str_addc(b, '}');
    } else if (*p == 't' || *p == 'f' || *p == 'n') {
        str_cat(b, *p == 't' ? "true" : *p == 'f' ? "false" : "null");
    } else {
        const char *end = js_end(p, e);
        int is_int = 1;
        for (const char *c = p; c < end; c++) is_int &= *c != '.' && *c != 'e' && *c != 'E';
        if (!is_int) py_float(b, js_num(p, e));
        else if (end - p == 2 && p[0] == '-' && p[1] == '0') str_addc(b, '0');   /* int("-0") */
        else str_add(b, p, (size_t)(end - p));   /* Python ints have no size limit */
    }
    return b->oom ? -1 : 0;
}

/* Checks text[0..len) with json_parse; err names what (where) on failure. */
static int js_check(const char *text, size_t len, const char *where, char *err, size_t errlen) {
    Json j;
    char msg[160];
    if (json_parse(&j, text, len, msg, sizeof msg)) { seterr(err, errlen, "%s: invalid JSON: %s", where, msg); return -1; }
    json_free(&j);
    return 0;
}

/* ---- rendering */

void tokenizer_chat_defaults(ChatOptions *opt) {
    memset(opt, 0, sizeof *opt);
    opt->thinking = 1;
    opt->effort = "Max";
    opt->clear_thinking = 1;
}

/* The template's tool_to_json: {"KEY": json.dumps(VALUE), ...} without the defer_loading and
 * strict members. The keys are written as they are (the template does not escape them). */
static int tool_to_json(Str *b, const char *tool, const char *e) {
    JsMember *m;
    int n = js_members(tool, e, &m), first = 1;
    if (n < 0) return -1;
    str_addc(b, '{');
    for (int i = 0; i < n; i++) {
        if (js_key_is(m[i].key, e, "defer_loading", 13) || js_key_is(m[i].key, e, "strict", 6)) continue;
        if (!first) str_cat(b, ", ");
        first = 0;
        str_addc(b, '"');
        js_str(b, m[i].key, e);
        str_cat(b, "\": ");
        if (py_dumps(b, m[i].val, e)) { free(m); return -1; }
    }
    free(m);
    str_addc(b, '}');
    return b->oom ? -1 : 0;
}

static const char TOOLS_HEAD[] =
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n";
static const char TOOLS_TAIL[] =
    "</tools>\n\nFor each function call, output the function name and arguments within the following XML format:\n"
    "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value><arg_key>{arg-key-2}"
    "</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>";

/* The <|system|> tools block: one line per tool (its "function" object when it has one) that is
 * not marked defer_loading. Nothing for an empty list. */
static int render_tools(Str *b, const char *tools, char *err, size_t errlen) {
    size_t len = strlen(tools);
    if (js_check(tools, len, "tools", err, errlen)) return -1;
    const char *e = tools + len, *p = js_ws(tools, e), *it = p, *tool;
    if (!js_truthy(p, e)) return 0;
    if (*p != '[') { seterr(err, errlen, "tools: expected an array"); return -1; }
    str_cat(b, TOOLS_HEAD);
    for (int i = 0; (tool = js_next(&it, e, NULL)); i++) {
        if (*tool != '{') { seterr(err, errlen, "tools[%d]: expected an object", i); return -1; }
        const char *fn = js_get(tool, e, "function");
        if (fn && *fn != '{') { seterr(err, errlen, "tools[%d].function: expected an object", i); return -1; }
        if (fn) tool = fn;
        const char *defer = js_get(tool, e, "defer_loading");
        if (defer && js_truthy(defer, e)) continue;
        if (tool_to_json(b, tool, e)) return -1;
        str_addc(b, '\n');
    }
    str_cat(b, TOOLS_TAIL);
    return 0;
}

/* A past tool call: <tool_call>NAME, then <arg_key>K</arg_key><arg_value>V</arg_value> per
 * argument (a string V as is, any other value as json.dumps writes it), then </tool_call>. */
static int render_tool_call(Str *b, const ChatToolCall *tc, int msg, int call, char *err, size_t errlen) {
    char where[64];
    snprintf(where, sizeof where, "chat message %d: tool call %d", msg, call);
    if (!tc->name || !tc->arguments) { seterr(err, errlen, "%s: no %s", where, tc->name ? "arguments" : "name"); return -1; }
    const char *args = tc->arguments;
    size_t len = strlen(args);
    Str inner = {0};
    if (js_check(args, len, where, err, errlen)) return -1;
    const char *e = args + len, *p = js_ws(args, e);
    if (*p == '"') {   /* OpenAI sends the arguments as a string holding the JSON object */
        js_str(&inner, p, e);
        if (inner.oom) { free(inner.s); seterr(err, errlen, "out of memory"); return -1; }
        args = inner.s ? inner.s : "";
        e = args + inner.n;
        if (js_check(args, inner.n, where, err, errlen)) { free(inner.s); return -1; }
        p = js_ws(args, e);
    }
    if (*p != '{') { free(inner.s); seterr(err, errlen, "%s: arguments: expected a JSON object", where); return -1; }
    JsMember *m;
    int n = js_members(p, e, &m);
    if (n < 0) { free(inner.s); seterr(err, errlen, "out of memory"); return -1; }
    str_cat(b, "<tool_call>");
    str_cat(b, tc->name);
    for (int i = 0; i < n; i++) {
        str_cat(b, "<arg_key>");
        js_str(b, m[i].key, e);
        str_cat(b, "</arg_key><arg_value>");
        if (*m[i].val == '"') js_str(b, m[i].val, e);
        else py_dumps(b, m[i].val, e);
        str_cat(b, "</arg_value>");
    }
    str_cat(b, "</tool_call>");
    free(m);
    free(inner.s);
    return 0;
}

/* An assistant turn: <|assistant|>, its reasoning or an empty marker, the stripped content, its
 * tool calls. Without a reasoning field, "R</think>A" in the content is reasoning R and answer A
 * (R after the last <think> before the first </think>, A after the last </think>). The reasoning
 * is kept for turns after the last user message, or for all with clear_thinking 0. */
static int render_assistant(Str *b, const ChatMessage *m, int i, int last_user, const ChatOptions *opt, char *err, size_t errlen) {
    const char *content = m->content ? m->content : "", *r = m->reasoning;
    size_t n = strlen(content), rn = r ? strlen(r) : 0;
    const char *close = r ? NULL : find(content, n, "</think>");
    if (close) {
        const char *open = find_last(content, (size_t)(close - content), "<think>");
        r = open ? open + 7 : content;
        rn = (size_t)(close - r);
        const char *last = find_last(content, n, "</think>") + 8;
        n -= (size_t)(last - content);
        content = last;
    }
    str_cat(b, "<|assistant|>");
    if (r && (!opt->clear_thinking || i > last_user)) {
        if (opt->strip_reasoning) r = py_strip(r, &rn);
        str_cat(b, "<think>");
        str_add(b, r, rn);
        str_cat(b, "</think>");
    } else {
        str_cat(b, opt->glm51_empty && i <= last_user ? "</think>" : "<think></think>");
    }
    content = py_strip(content, &n);
    str_add(b, content, n);
    for (int c = 0; c < m->n_tool_calls; c++)
        if (render_tool_call(b, &m->tool_calls[c], i, c, err, errlen)) return -1;
    return 0;
}

static int is_role(const ChatMessage *m, const char *role) { return m->role && strcmp(m->role, role) == 0; }

char *tokenizer_render_chat_text(const ChatMessage *msgs, int n, const ChatOptions *opt,
                                 int add_generation_prompt, char *err, size_t errlen) {
    ChatOptions def;
    if (!opt) { tokenizer_chat_defaults(&def); opt = &def; }
    int last_user = -1;
    for (int i = 0; i < n; i++)
        if (is_role(&msgs[i], "user")) last_user = i;
    Str b = {0};
    str_cat(&b, "[gMASK]<sop>");
    if (opt->thinking && opt->effort) {
        str_cat(&b, "<|system|>Reasoning Effort: ");
        str_cat(&b, opt->effort);
    }
    int rc = opt->tools ? render_tools(&b, opt->tools, err, errlen) : 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const ChatMessage *m = &msgs[i];
        const char *content = m->content ? m->content : "";
        if (is_role(m, "system") || is_role(m, "user")) {
            str_cat(&b, m->role[0] == 's' ? "<|system|>" : "<|user|>");
            str_cat(&b, content);
        } else if (is_role(m, "assistant")) {
            rc = render_assistant(&b, m, i, last_user, opt, err, errlen);
        } else if (is_role(m, "tool")) {
            if (i == 0 || !is_role(&msgs[i - 1], "tool")) str_cat(&b, "<|observation|>");
            str_cat(&b, "<tool_response>");
            str_cat(&b, content);
            str_cat(&b, "</tool_response>");
        }   /* any other role: skipped, as the template does */
    }
    if (add_generation_prompt) {
        str_cat(&b, "<|assistant|>");
        str_cat(&b, opt->thinking ? "<think>" : opt->glm51_empty ? "</think>" : "<think></think>");
    }
    if (rc == 0 && b.oom) rc = -1, seterr(err, errlen, "out of memory");
    if (rc == 0 && strlen(b.s) != b.n) rc = -1, seterr(err, errlen, "the prompt would contain U+0000 (from a \\u0000 escape), which a C string cannot hold");
    if (rc) { free(b.s); return NULL; }
    return b.s;
}

int tokenizer_render_chat(const Tokenizer *t, const ChatMessage *msgs, int n, const ChatOptions *opt,
                          int add_generation_prompt, int **ids, char *err, size_t errlen) {
    *ids = NULL;
    char *text = tokenizer_render_chat_text(msgs, n, opt, add_generation_prompt, err, errlen);
    if (!text) return -1;
    int r = tokenizer_encode(t, text, strlen(text), ids, err, errlen);
    free(text);
    return r;
}

/* ---- a conversation as JSON (the template's variables) */

typedef struct { void **p; int n, cap; } Owned;   /* what a ChatRequest's pointers point into */

static void *own(Owned *o, void *p) {
    if (!p) return NULL;
    if (o->n == o->cap) {
        int cap = o->cap ? 2 * o->cap : 16;
        void **q = realloc(o->p, (size_t)cap * sizeof *q);
        if (!q) { free(p); return NULL; }
        o->p = q;
        o->cap = cap;
    }
    return o->p[o->n++] = p;
}

/* Hands the decoded text s over to the request as *out. Refuses U+0000 (from a \u0000 escape):
 * the C strings of ChatMessage would end there. */
static int keep_str(Owned *o, Str *s, const char **out, const char *path, char *err, size_t errlen) {
    if (!s->oom && s->s && strlen(s->s) != s->n) {
        free(s->s);
        seterr(err, errlen, "%s: U+0000 is not supported", path);
        return -1;
    }
    if (s->oom || !(*out = own(o, s->s ? s->s : calloc(1, 1)))) {
        if (s->oom) free(s->s);
        seterr(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

static const char REMINDER[] = "<reminder>You are unable to process this %s because you don't have multi-modal input ability. Try different methods.</reminder>";

/* One item of a content list, as the template's visible_text() writes it. */
static int visible_item(Str *b, const char *it, const char *e, const char *path, int k, char *err, size_t errlen) {
    if (*it == '"') { js_str(b, it, e); return 0; }
    if (*it != '{') return 0;   /* numbers, lists, null: nothing */
    const char *type = js_get(it, e, "type");
    Str t = {0};
    if (type && *type == '"') js_str(&t, type, e);
    const char *ty = t.s && strlen(t.s) == t.n ? t.s : "";   /* a type with U+0000 in it matches nothing */
    int rc = 0;
    if (!strcmp(ty, "text")) {
        const char *text = js_get(it, e, "text");
        if (text && *text == '"') js_str(b, text, e);
        else if (text && *text == 'n') str_cat(b, "None");   /* jinja2 prints Python's None */
        else if (text) rc = -1, seterr(err, errlen, "%s[%d].text: expected a string", path, k);
    } else if (!strcmp(ty, "image") || !strcmp(ty, "image_url")) {
        str_cat(b, "<|begin_of_image|><|image|><|end_of_image|>");
    } else if (!strcmp(ty, "video") || !strcmp(ty, "video_url") || !strcmp(ty, "audio") || !strcmp(ty, "audio_url") || !strcmp(ty, "input_audio")) {
        char r[200];
        snprintf(r, sizeof r, REMINDER, ty[0] == 'v' ? "video" : "audio");
        str_cat(b, r);
    }
    free(t.s);
    return rc;
}

/* A message's content as visible_text() writes it: a string as is, null as "None" (jinja2 prints
 * Python's None so), a list as its strings and text items in order (images and other media as
 * the template's markers). Numbers, booleans and objects, which the template would print as
 * Python writes them, are refused. *out is NULL when the content is missing (""). */
static int read_content(Owned *o, const char *msg, const char *e, int is_tool, const char *path,
                        const char **out, char *err, size_t errlen) {
    const char *c = js_get(msg, e, "content");
    Str b = {0};
    *out = NULL;
    if (!c) return 0;
    if (*c == '"') {
        js_str(&b, c, e);
    } else if (*c == 'n') {
        str_cat(&b, "None");
    } else if (*c == '[') {
        const char *it = c, *item, *first = js_next(&it, e, NULL);
        if (is_tool && first && *first == '{') {
            const char *ty = js_get(first, e, "type");
            if ((ty && *ty == '"' && js_key_is(ty, e, "tool_reference", 14)) || js_get(first, e, "output")) {
                seterr(err, errlen, "%s: tool results as tool_reference or output items are not supported", path);
                return -1;
            }
        }
        it = c;
        for (int k = 0; (item = js_next(&it, e, NULL)); k++)
            if (visible_item(&b, item, e, path, k, err, errlen)) { free(b.s); return -1; }
    } else {
        seterr(err, errlen, "%s: expected a string, a list or null", path);
        return -1;
    }
    return keep_str(o, &b, out, path, err, errlen);
}

/* A message's tool_calls: each {"function": {"name": ..., "arguments": {...}}} or
 * {"name": ..., "arguments": {...}}; arguments may also be a string holding the object. */
static int read_tool_calls(Owned *o, ChatMessage *m, const char *tcs, const char *e, const char *path, char *err, size_t errlen) {
    if (!tcs || !js_truthy(tcs, e)) return 0;
    if (*tcs != '[') { seterr(err, errlen, "%s: expected a list", path); return -1; }
    const char *it = tcs, *tc;
    int n = 0;
    while (js_next(&it, e, NULL)) n++;
    ChatToolCall *calls = own(o, calloc((size_t)n, sizeof *calls));
    if (!calls) { seterr(err, errlen, "out of memory"); return -1; }
    it = tcs;
    for (int k = 0; (tc = js_next(&it, e, NULL)); k++) {
        if (*tc != '{') { seterr(err, errlen, "%s[%d]: expected an object", path, k); return -1; }
        const char *fn = js_get(tc, e, "function");
        if (fn && js_truthy(fn, e)) {
            if (*fn != '{') { seterr(err, errlen, "%s[%d].function: expected an object", path, k); return -1; }
            tc = fn;
        }
        const char *name = js_get(tc, e, "name"), *args = js_get(tc, e, "arguments");
        const char *sub = fn && tc == fn ? ".function" : "";
        if (!name || *name != '"') { seterr(err, errlen, "%s[%d]%s.name: expected a string", path, k, sub); return -1; }
        if (!args || (*args != '{' && *args != '"')) {
            seterr(err, errlen, "%s[%d]%s.arguments: expected an object", path, k, sub);
            return -1;
        }
        char where[96];
        snprintf(where, sizeof where, "%s[%d]%s.name", path, k, sub);
        Str s = {0};
        js_str(&s, name, e);
        if (keep_str(o, &s, &calls[k].name, where, err, errlen)) return -1;
        snprintf(where, sizeof where, "%s[%d]%s.arguments", path, k, sub);
        if (*args == '"') {   /* OpenAI's form: a string holding the object (the template itself fails) */
            Str a = {0};
            js_str(&a, args, e);
            int ok = !a.oom && js_check(a.s ? a.s : "", a.n, where, err, errlen) == 0;
            if (ok && *js_ws(a.s, a.s + a.n) != '{') ok = 0, seterr(err, errlen, "%s: expected an object", where);
            free(a.s);
            if (!ok) { if (a.oom) seterr(err, errlen, "out of memory"); return -1; }
        }
        size_t an = (size_t)(js_end(args, e) - args);
        char *a = own(o, malloc(an + 1));
        if (!a) { seterr(err, errlen, "out of memory"); return -1; }
        memcpy(a, args, an);
        a[an] = 0;
        calls[k].arguments = a;
    }
    m->tool_calls = calls;
    m->n_tool_calls = n;
    return 0;
}

/* One message. Anything that is not an object, or has no string role, is kept with role NULL
 * (the template skips it, but it still counts where the template looks at neighbours). */
static int read_message(Owned *o, ChatMessage *m, const char *msg, const char *e, int i, char *err, size_t errlen) {
    char path[64];
    memset(m, 0, sizeof *m);
    if (*msg != '{') return 0;
    const char *role = js_get(msg, e, "role"), *rc = js_get(msg, e, "reasoning_content");
    snprintf(path, sizeof path, "messages[%d].role", i);
    if (role && *role == '"') {
        Str s = {0};
        js_str(&s, role, e);
        if (keep_str(o, &s, &m->role, path, err, errlen)) return -1;
    }
    int is_tool = m->role && strcmp(m->role, "tool") == 0;
    snprintf(path, sizeof path, "messages[%d].content", i);
    if (read_content(o, msg, e, is_tool, path, &m->content, err, errlen)) return -1;
    snprintf(path, sizeof path, "messages[%d].reasoning_content", i);
    if (rc && *rc == '"') {
        Str s = {0};
        js_str(&s, rc, e);
        if (keep_str(o, &s, &m->reasoning, path, err, errlen)) return -1;
    }
    if (!m->role || strcmp(m->role, "assistant")) return 0;   /* the template reads tool_calls of assistants only */
    snprintf(path, sizeof path, "messages[%d].tool_calls", i);
    return read_tool_calls(o, m, js_get(msg, e, "tool_calls"), e, path, err, errlen);
}

static const char *const REQUEST_FIELDS[] = {"messages", "tools", "add_generation_prompt", "enable_thinking",
                                             "reasoning_effort", "clear_thinking"};

/* Refuses a member the template does not read (a typo would otherwise change nothing, silently). */
static int check_fields(const char *p, const char *e, char *err, size_t errlen) {
    const char *it = p, *k;
    while (js_next(&it, e, &k)) {
        int known = 0;
        for (size_t f = 0; f < sizeof REQUEST_FIELDS / sizeof *REQUEST_FIELDS; f++)
            known |= js_key_is(k, e, REQUEST_FIELDS[f], strlen(REQUEST_FIELDS[f]));
        if (!known) {
            int n = (int)(js_str_end(k, e) - k);
            seterr(err, errlen, "unknown field %.*s (the template reads messages, tools, add_generation_prompt, "
                   "enable_thinking, reasoning_effort, clear_thinking)", n > 60 ? 60 : n, k);
            return -1;
        }
    }
    return 0;
}

static int read_request(ChatRequest *req, Owned *o, const char *json, size_t len, int strict, char *err, size_t errlen) {
    const char *e = json + len, *p = js_ws(json, e);
    if (*p != '{') { seterr(err, errlen, "expected a JSON object"); return -1; }
    if (strict && check_fields(p, e, err, errlen)) return -1;
    const char *msgs = js_get(p, e, "messages"), *tools = js_get(p, e, "tools"), *v;
    if (!msgs || *msgs != '[') { seterr(err, errlen, "messages: expected a list"); return -1; }
    int n = 0;
    const char *it = msgs, *m;
    while (js_next(&it, e, NULL)) n++;
    req->msgs = own(o, calloc((size_t)(n ? n : 1), sizeof *req->msgs));
    if (!req->msgs) { seterr(err, errlen, "out of memory"); return -1; }
    it = msgs;
    for (int i = 0; (m = js_next(&it, e, NULL)); i++, req->n++)
        if (read_message(o, &req->msgs[i], m, e, i, err, errlen)) return -1;
    if (tools && js_truthy(tools, e)) {
        if (*tools != '[') { seterr(err, errlen, "tools: expected a list"); return -1; }
        size_t tn = (size_t)(js_end(tools, e) - tools);
        char *t = own(o, malloc(tn + 1));
        if (!t) { seterr(err, errlen, "out of memory"); return -1; }
        memcpy(t, tools, tn);
        t[tn] = 0;
        req->opt.tools = t;
    }
    req->add_generation_prompt = (v = js_get(p, e, "add_generation_prompt")) && js_truthy(v, e);
    req->opt.thinking = !(v = js_get(p, e, "enable_thinking")) || js_truthy(v, e);
    req->opt.clear_thinking = !(v = js_get(p, e, "clear_thinking")) || js_truthy(v, e);
    v = js_get(p, e, "reasoning_effort");
    req->opt.effort = v && *v == '"' && js_key_is(v, e, "high", 4) ? "High" : "Max";
    return 0;
}

int tokenizer_chat_read_json(ChatRequest *req, const char *json, size_t len, int strict, char *err, size_t errlen) {
    memset(req, 0, sizeof *req);
    tokenizer_chat_defaults(&req->opt);
    if (js_check(json, len, "request", err, errlen)) return -1;
    Owned *o = calloc(1, sizeof *o);
    req->own = o;
    if (!o) { seterr(err, errlen, "out of memory"); return -1; }
    int rc = read_request(req, o, json, len, strict, err, errlen);
    if (rc) tokenizer_chat_request_free(req);
    return rc;
}

void tokenizer_chat_request_free(ChatRequest *req) {
    Owned *o = req->own;
    if (o) {
        for (int i = 0; i < o->n; i++) free(o->p[i]);
        free(o->p);
        free(o);
    }
    memset(req, 0, sizeof *req);
}

/* ---- tool calls in the model's output */

/* Whether tools (checked JSON) declares argument key of function name as a string ("type":
 * "string", or a list of types holding "string"): its value then stays text, even "42". */
static int arg_is_string(const char *tools, const char *name, size_t name_len, const char *key, size_t key_len) {
    const char *e = tools + strlen(tools), *p = js_ws(tools, e), *it = p, *tool;
    if (*p != '[') return 0;
    while ((tool = js_next(&it, e, NULL))) {
        const char *fn = js_get(tool, e, "function");
        if (fn && *fn == '{') tool = fn;
        const char *nm = js_get(tool, e, "name");
        if (!nm || *nm != '"' || !js_key_is(nm, e, name, name_len)) continue;
        const char *props = js_get(tool, e, "parameters");
        props = props ? js_get(props, e, "properties") : NULL;
        const char *prop = props ? js_get_n(props, e, key, key_len) : NULL;
        const char *type = prop ? js_get(prop, e, "type") : NULL, *t;
        if (!type) return 0;
        if (*type == '"') return js_key_is(type, e, "string", 6);
        for (it = type; *type == '[' && (t = js_next(&it, e, NULL));)
            if (*t == '"' && js_key_is(t, e, "string", 6)) return 1;
        return 0;
    }
    return 0;
}

static const char *skip_ascii_ws(const char *p, const char *e) {
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

/* The next needle at or after `from`, remembered ([lo, pos) holds none; pos NULL: none from lo
 * on). The parse moves forward, but a malformed call restarts the search just after its tag;
 * with the memory no byte is searched twice for the same tag, so text with many unfinished
 * calls still costs time linear in its length. */
typedef struct { const char *needle, *lo, *pos; } Finder;

static const char *find_next(Finder *f, const char *from, const char *e) {
    if (f->lo && from >= f->lo && (!f->pos || from <= f->pos)) return f->pos;
    if (f->lo && from < f->lo) {   /* only [from, lo) is new (a tag may straddle lo) */
        const char *end = f->lo + strlen(f->needle) - 1;
        const char *r = find(from, (size_t)((end < e ? end : e) - from), f->needle);
        f->lo = from;
        if (r) f->pos = r;
        return f->pos;
    }
    f->lo = from;
    return f->pos = find(from, (size_t)(e - from), f->needle);
}

typedef struct { Finder open, close, key, key_end, value_end; } Tags;

/* One <tool_call> whose text starts at p (just after the tag): NAME, then <arg_key>K</arg_key>
 * <arg_value>V</arg_value> pairs, then </tool_call>, white space allowed between the parts.
 * Sets the call and *after; returns 1 if the text is not such a call, -1 when out of memory. */
static int parse_call(const char *p, const char *e, Tags *t, const char *tools, ChatToolCall *tc, const char **after) {
    const char *k = find_next(&t->key, p, e), *c = find_next(&t->close, p, e);
    const char *name_end = k && (!c || k < c) ? k : c;
    if (!name_end || memchr(p, '<', (size_t)(name_end - p))) return 1;
    size_t nn = (size_t)(name_end - p);
    const char *name = py_strip(p, &nn);
    if (!nn || memchr(name, 0, nn) || !utf8_valid(name, nn)) return 1;
    Str args = {0};
    str_addc(&args, '{');
    int n = 0, bad = 0;
    for (p = name_end;; n++) {
        p = skip_ascii_ws(p, e);
        if (starts(p, e, "</tool_call>")) { *after = p + 12; break; }
        const char *kend = starts(p, e, "<arg_key>") ? find_next(&t->key_end, p + 9, e) : NULL;
        const char *key = p + 9, *v = kend ? skip_ascii_ws(kend + 10, e) : NULL;
        const char *vend = v && starts(v, e, "<arg_value>") ? find_next(&t->value_end, v + 11, e) : NULL;
        size_t kn = kend ? (size_t)(kend - key) : 0, vn = vend ? (size_t)(vend - v - 11) : 0;
        const char *nested = vend ? find_next(&t->open, v + 11, e) : NULL;
        /* refused: a <tool_call> inside a value (so no two tries read the same bytes: linear time),
         * U+0000 (it could not be rendered back), invalid UTF-8 (arguments must be JSON) */
        if (!vend || (nested && nested < vend) || !kn || memchr(key, '<', kn) || memchr(key, 0, kn) || !utf8_valid(key, kn) ||
            memchr(v + 11, 0, vn) || !utf8_valid(v + 11, vn)) { bad = 1; break; }
        if (n) str_cat(&args, ", ");
        py_str(&args, key, kn);
        str_cat(&args, ": ");
        const char *val = v + 11;
        Json j;
        const char *jv = js_ws(val, vend);   /* a JSON value: its own text, without the white space around */
        if (jv < vend && strchr("{[\"-0123456789tfn", *jv) && !(tools && arg_is_string(tools, name, nn, key, kn)) &&
            !find(val, vn, "\\u0000") && json_parse(&j, val, vn, NULL, 0) == 0) {
            json_free(&j);
            str_add(&args, jv, (size_t)(js_end(jv, vend) - jv));
        } else {
            py_str(&args, val, vn);
        }
        p = vend + 12;
    }
    str_addc(&args, '}');
    char *nm = malloc(nn + 1);
    if (bad || args.oom || !nm) { free(args.s); free(nm); return bad ? 1 : -1; }
    memcpy(nm, name, nn);
    nm[nn] = 0;
    tc->name = nm;
    tc->arguments = args.s;
    return 0;
}

int tokenizer_parse_tool_calls(const char *text, size_t len, const char *tools, ChatToolCalls *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (tools && js_check(tools, strlen(tools), "tools", err, errlen)) return -1;
    Tags t = {{"<tool_call>", NULL, NULL}, {"</tool_call>", NULL, NULL}, {"<arg_key>", NULL, NULL},
              {"</arg_key>", NULL, NULL}, {"</arg_value>", NULL, NULL}};
    Str content = {0};
    int cap = 0, rc = 0;
    const char *p = text, *e = text + len;
    str_add(&content, "", 0);
    while (p < e && rc == 0) {
        const char *open = find_next(&t.open, p, e), *after = NULL;
        if (!open) { str_add(&content, p, (size_t)(e - p)); break; }
        str_add(&content, p, (size_t)(open - p));
        ChatToolCall tc;
        int r = parse_call(open + 11, e, &t, tools, &tc, &after);
        if (r > 0) {   /* malformed: its text stays in the content */
            str_add(&content, open, 11);
            p = open + 11;
            continue;
        }
        if (r == 0 && out->n_calls == cap) {
            ChatToolCall *c = realloc(out->calls, (size_t)(cap = cap ? 2 * cap : 4) * sizeof *c);
            if (!c) r = -1, free((void *)tc.name), free((void *)tc.arguments);
            else out->calls = c;
        }
        if (r < 0) rc = -1;
        else out->calls[out->n_calls++] = tc, p = after;
    }
    out->content = content.s;
    out->content_len = content.n;
    if (rc || content.oom) {
        tokenizer_tool_calls_free(out);
        seterr(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

void tokenizer_tool_calls_free(ChatToolCalls *tc) {
    for (int i = 0; i < tc->n_calls; i++) {
        free((void *)tc->calls[i].name);
        free((void *)tc->calls[i].arguments);
    }
    free(tc->calls);
    free(tc->content);
    memset(tc, 0, sizeof *tc);
}

/* ---------------------------------------------------------------- `glm tokenize` */

static int cli_error(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "glm: error: %s\n", msg);
    return 1;
}

static void print_ids(FILE *f, const int *ids, int n, int json) {
    char buf[16];
    if (json) fputc('[', f);
    for (int i = 0; i < n; i++) {
        int l = snprintf(buf, sizeof buf, "%s%d", i ? (json ? "," : " ") : "", ids[i]);
        fwrite(buf, 1, (size_t)l, f);
    }
    fputs(json ? "]\n" : "\n", f);
}

static int cli_decode(const Tokenizer *t, const char *list) {
    size_t cap = strlen(list) / 2 + 1;
    int *ids = malloc(cap * sizeof *ids), n = 0;
    if (!ids) return cli_error("out of memory");
    for (const char *p = list; *p;) {
        if (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n') { p++; continue; }
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= tokenizer_vocab_size(t) || (*end && !strchr(", \t\n", *end))) {
            int l = (int)strcspn(p, ", \t\n");
            free(ids);
            return cli_error("--decode: invalid token id '%.*s' (ids are 0..%d)", l > 40 ? 40 : l, p, tokenizer_vocab_size(t) - 1);
        }
        ids[n++] = (int)v;
        p = end;
    }
    size_t len;
    char *text = tokenizer_decode(t, ids, n, 0, &len);
    free(ids);
    if (!text) return cli_error("out of memory");
    fwrite(text, 1, len, stdout);
    fputc('\n', stdout);
    free(text);
    return 0;
}

static int cli_jsonl(const Tokenizer *t) {
    char *line = NULL, err[200];
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    int rc = 0;
    while (rc == 0 && (len = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        if (len && line[len - 1] == '\n') len--;
        if (len && line[len - 1] == '\r') len--;
        Json j;
        if (json_parse(&j, line, (size_t)len, err, sizeof err)) {
            rc = cli_error("stdin line %ld: invalid JSON: %s", lineno, err);
            break;
        }
        if (j.root->type != JSON_STRING) {
            rc = cli_error("stdin line %ld: expected a JSON string", lineno);
        } else {
            int *ids, n = tokenizer_encode(t, j.root->str, j.root->str_len, &ids, err, sizeof err);
            if (n < 0) rc = cli_error("stdin line %ld: %s", lineno, err);
            else print_ids(stdout, ids, n, 1), fflush(stdout);   /* answers a co-process line by line */
            free(ids);
        }
        json_free(&j);
    }
    free(line);
    if (rc == 0 && ferror(stdin)) rc = cli_error("stdin: read error");
    return rc;
}

/* `--chat --jsonl`: one conversation (the template's variables, tokenizer_chat_read_json) per
 * stdin line; writes its prompt as a JSON string, or with t its ids, one line each. A bad line
 * gets null there and one error line naming the line and field; the others still run, so the
 * output lines up with the input, and the exit code is 1 at the end. */
static int cli_chat_jsonl(const Tokenizer *t) {
    char *line = NULL, err[300];
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    int rc = 0;
    while ((len = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        if (len && line[len - 1] == '\n') len--;
        if (len && line[len - 1] == '\r') len--;
        ChatRequest req;
        char *text = NULL;
        int *ids = NULL, n = -1;
        if (tokenizer_chat_read_json(&req, line, (size_t)len, 1, err, sizeof err) == 0) {
            if (t) n = tokenizer_render_chat(t, req.msgs, req.n, &req.opt, req.add_generation_prompt, &ids, err, sizeof err);
            else text = tokenizer_render_chat_text(req.msgs, req.n, &req.opt, req.add_generation_prompt, err, sizeof err);
            tokenizer_chat_request_free(&req);
        }
        if (t ? n < 0 : !text) {
            fprintf(stderr, "glm: error: stdin line %ld: %s\n", lineno, err);
            fputs("null\n", stdout);
            rc = 1;
        } else if (t) {
            print_ids(stdout, ids, n, 1);
        } else {
            Str o = {0};
            py_str(&o, text, strlen(text));
            str_addc(&o, '\n');
            if (o.oom) rc = cli_error("out of memory");
            else fwrite(o.s, 1, o.n, stdout);
            free(o.s);
        }
        fflush(stdout);   /* answers a co-process line by line */
        free(ids);
        free(text);
    }
    free(line);
    if (ferror(stdin)) rc = cli_error("stdin: read error");
    return rc;
}

int tokenize_main(int argc, char **argv) {
    const char *dir = NULL, *file = NULL, *arg = NULL;
    int decode = 0, jsonl = 0, chat = 0, want_ids = 0, positional = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!positional && strcmp(a, "--") == 0) {   /* the rest is text, even if it starts with '-' */
            positional = 1;
        } else if (positional) {
            if (arg) return cli_error("tokenize: unexpected extra argument '%s'", a);
            arg = a;
        } else if ((strcmp(a, "-m") == 0 || strcmp(a, "--model") == 0 || strcmp(a, "--tokenizer") == 0)) {
            if (i + 1 >= argc) return cli_error("tokenize: %s needs an argument", a);
            if (a[1] == '-' && a[2] == 't') file = argv[++i];
            else dir = argv[++i];
        } else if (strcmp(a, "--decode") == 0) {
            decode = 1;
        } else if (strcmp(a, "--jsonl") == 0) {
            jsonl = 1;
        } else if (strcmp(a, "--chat") == 0) {
            chat = 1;
        } else if (strcmp(a, "--ids") == 0) {
            want_ids = 1;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            printf("usage: glm tokenize (-m DIR | --tokenizer FILE) [--] \"text\"\n"
                   "       glm tokenize (-m DIR | --tokenizer FILE) --decode 1,2,3\n"
                   "       glm tokenize (-m DIR | --tokenizer FILE) --jsonl < strings.jsonl > ids.jsonl\n"
                   "       glm tokenize --chat --jsonl [--ids (-m DIR | --tokenizer FILE)] < chats.jsonl > prompts.jsonl\n"
                   "  --chat: each line is a JSON object with the chat template's variables: messages, tools,\n"
                   "  add_generation_prompt, enable_thinking, reasoning_effort, clear_thinking; each output\n"
                   "  line is the rendered prompt as a JSON string (--ids: its token ids).\n");
            return 0;
        } else if (a[0] == '-' && a[1] && !(decode && a[1] >= '0' && a[1] <= '9')) {
            return cli_error("tokenize: unknown flag '%s'", a);
        } else if (arg) {
            return cli_error("tokenize: unexpected extra argument '%s'", a);
        } else {
            arg = a;
        }
    }
    if (chat && !jsonl) return cli_error("tokenize: --chat reads JSON lines from stdin: add --jsonl");
    if (want_ids && !chat) return cli_error("tokenize: --ids goes with --chat (plain tokenize prints ids anyway)");
    if (chat && (decode || arg)) return cli_error(decode ? "tokenize: --chat and --decode cannot be combined" : "tokenize: --chat reads stdin, unexpected argument '%s'", arg);
    if (chat && !want_ids) {   /* the prompt text needs no tokenizer */
        int rc = cli_chat_jsonl(NULL);
        if (fflush(stdout) && rc == 0) rc = cli_error("stdout: write error");
        return rc;
    }
    if (!dir && !file) return cli_error("tokenize: need -m DIR or --tokenizer FILE");
    if (decode && jsonl) return cli_error("tokenize: --decode and --jsonl cannot be combined");
    if (jsonl && arg) return cli_error("tokenize: --jsonl reads stdin, unexpected argument '%s'", arg);
    if (!jsonl && !arg) return cli_error(decode ? "tokenize: --decode needs a list of ids" : "tokenize: need the text to encode");
    char path[4096], err[512];
    if (file) snprintf(path, sizeof path, "%s", file);
    else snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    Tokenizer *t = tokenizer_load(path, err, sizeof err);
    if (!t) return cli_error("%s", err);
    int rc;
    if (decode) {
        rc = cli_decode(t, arg);
    } else if (chat) {
        rc = cli_chat_jsonl(t);
    } else if (jsonl) {
        rc = cli_jsonl(t);
    } else {
        int *ids, n = tokenizer_encode(t, arg, strlen(arg), &ids, err, sizeof err);
        rc = n < 0 ? cli_error("%s", err) : (print_ids(stdout, ids, n, 0), 0);
        free(ids);
    }
    tokenizer_free(t);
    if (fflush(stdout) && rc == 0) rc = cli_error("stdout: write error");
    return rc;
}
