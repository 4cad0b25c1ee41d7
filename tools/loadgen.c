/* loadgen.c - `glm loadgen URL`: a load generator for any OpenAI-compatible server (glm
 * serve, llama.cpp's llama-server, sglang, vLLM), with the report of sglang's bench_serving.
 *
 * Every request is POST /v1/completions with a prompt of token ids, so its length is exact
 * whatever the server's tokenizer: one common prefix (--shared of --input, drawn once from
 * the seed, the same for every request: what a prefix cache can reuse) and a suffix of
 * random ids unique to the request. It asks for exactly --output tokens (ignore_eos,
 * temperature 0) and, when streaming, for the usage in the last chunk.
 *
 * --concurrency threads each take the next request index from a shared counter, wait for
 * its arrival time (--rate: a Poisson process; inf: all at once) and run it on a fresh
 * connection (Connection: close). Per request: TTFT (send to the first event with
 * non-empty choices[0].text), the gaps between such events (ITL), end to end latency,
 * output tokens (usage.completion_tokens, else one per text event), prompt and cached
 * tokens (usage.prompt_tokens_details.cached_tokens, or llama-server's timings.cache_n).
 *
 * The HTTP/1.1 client is the few functions below: getaddrinfo + non-blocking sockets with
 * poll() against the request's deadline, a status line and headers, then the body by
 * Content-Length, Transfer-Encoding: chunked (llama-server, uvicorn) or until close (an
 * SSE stream). Anything malformed fails that request with a one-line reason; nothing a
 * server sends can crash the client.
 */
#define _GNU_SOURCE
#include "../glm.h"
#include "../json.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

enum { STREAM_OFF = 0, STREAM_ON = 1, STREAM_MIXED = 2 };
#define MAX_ERRORS 5                 /* failures whose message the report keeps */
#define MAX_BODY ((size_t)256 << 20) /* a non-streamed response larger than this fails */
#define MAX_ERROR_BODY 65536         /* bytes of an error response read for its message */
#define MAX_LINE ((size_t)16 << 20)  /* one SSE line */

typedef struct {
    const char *url, *model, *api_key;
    char host[256], port[8], hosthdr[300], base[512]; /* base: the URL's path, no trailing / or /v1 */
    int input, output, concurrency, requests, stream, json;
    double shared, rate, timeout;    /* rate: requests/s, INFINITY = all at once */
    uint64_t seed;
    int vocab_lo, vocab_hi;          /* ids drawn from [vocab_lo, vocab_hi) */
    struct addrinfo *addr;
} Opts;

typedef struct {
    int ok, streamed;
    double ttft, e2e, t_end;          /* seconds; t_end from the start of the run */
    int out_tokens, text_events, sent_tokens;
    int usage_out, usage_prompt, cached; /* -1: the server did not say */
    int done, finished;               /* [DONE] seen; a finish_reason seen */
    double *itl; int n_itl, cap_itl;
    double t_last;
    char err[256];
} Result;

/* ======================================================================== */
/* small helpers                                                            */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double uniform01(uint64_t *s) { return (double)(splitmix(s) >> 11) * (1.0 / 9007199254740992.0); }

/* the first failure's reason wins */
static void fail(Result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(Result *r, const char *fmt, ...) {
    if (!r->ok) return;
    r->ok = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof r->err, fmt, ap);
    va_end(ap);
    for (char *p = r->err; *p; p++)
        if ((unsigned char)*p < 32) *p = ' ';
}

typedef struct { char *p; size_t len, cap; } Str; /* a growable byte string, NUL-terminated */
static int str_put(Str *s, const void *d, size_t n) {
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->len + n + 1) cap *= 2;
        char *p = realloc(s->p, cap);
        if (!p) return -1;
        s->p = p; s->cap = cap;
    }
    memcpy(s->p + s->len, d, n);
    s->len += n;
    s->p[s->len] = 0;
    return 0;
}
static int str_puts(Str *s, const char *t) { return str_put(s, t, strlen(t)); }
static int str_printf(Str *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int str_printf(Str *s, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    return n < 0 || (size_t)n >= sizeof tmp ? -1 : str_put(s, tmp, (size_t)n);
}
/* The length of the valid UTF-8 sequence at p (NUL-terminated), or 0. */
static int utf8_len(const unsigned char *p) {
    unsigned char b = p[0];
    if (b < 0x80) return 1;
    int n = b >= 0xc2 && b <= 0xdf ? 2 : b >= 0xe0 && b <= 0xef ? 3 : b >= 0xf0 && b <= 0xf4 ? 4 : 0;
    unsigned char lo = b == 0xe0 ? 0xa0 : b == 0xf0 ? 0x90 : 0x80, hi = b == 0xed ? 0x9f : b == 0xf4 ? 0x8f : 0xbf;
    if (n && (p[1] < lo || p[1] > hi)) return 0; /* overlong, surrogate or past U+10FFFF */
    for (int k = 2; k < n; k++)
        if ((p[k] & 0xc0) != 0x80) return 0;
    return n;
}

/* t as a JSON string literal: control characters escaped, bytes that are not UTF-8 (a
 * server's garbage echoed in an error message) as \ufffd, so the output is valid JSON */
static int str_json(Str *s, const char *t) {
    int rc = str_put(s, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)t; *p && !rc;) {
        int n = utf8_len(p);
        if (*p == '"' || *p == '\\') { char e[2] = {'\\', (char)*p}; rc = str_put(s, e, 2); }
        else if (*p < 32) rc = str_printf(s, "\\u%04x", *p);
        else if (n == 0) { rc = str_puts(s, "\\ufffd"); n = 1; }
        else rc = str_put(s, p, (size_t)n);
        p += n ? n : 1;
    }
    return rc ? rc : str_put(s, "\"", 1);
}

/* ======================================================================== */
/* the HTTP/1.1 client                                                      */

enum { BODY_LENGTH, BODY_CLOSE, BODY_CHUNKED };
typedef struct {
    int fd;
    double deadline;                  /* now_s() time after which every wait fails */
    char *buf; size_t len, pos, cap;  /* bytes received; buf[pos..len) not consumed yet */
    int status;
    int mode;                         /* BODY_* */
    uint64_t left;                    /* BODY_LENGTH: body bytes left; chunked: bytes left in this chunk */
    int chunk_state;                  /* 0 size line, 1 data, 2 CRLF after data, 3 done */
    char err[200];
} Conn;

static int conn_err(Conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int conn_err(Conn *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return -1;
}

/* Waits until fd is ready for events, or the deadline: 0, or -1 with c->err. */
static int conn_wait(Conn *c, short events, const char *what, double timeout) {
    for (;;) {
        double left = c->deadline - now_s();
        if (left <= 0) return conn_err(c, "timed out after %g s (%s)", timeout, what);
        struct pollfd p = {c->fd, events, 0};
        int ms = left > 3600 ? 3600000 : (int)(left * 1000) + 1;
        int n = poll(&p, 1, ms);
        if (n > 0) return 0;
        if (n < 0 && errno != EINTR) return conn_err(c, "poll: %s", strerror(errno));
    }
}

static int conn_open(Conn *c, const Opts *o) {
    int last = 0;
    for (struct addrinfo *a = o->addr; a; a = a->ai_next) {
        c->fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (c->fd < 0) { last = errno; continue; }
        int one = 1;
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(c->fd, a->ai_addr, a->ai_addrlen) == 0) return 0;
        if (errno == EINPROGRESS) {
            if (conn_wait(c, POLLOUT, "connect", o->timeout)) { close(c->fd); c->fd = -1; return -1; }
            int e = 0;
            socklen_t n = sizeof e;
            if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &n) == 0 && e == 0) return 0;
            last = e ? e : errno;
        } else last = errno;
        close(c->fd);
        c->fd = -1;
    }
    return conn_err(c, "connect to %s:%s: %s", o->host, o->port, strerror(last ? last : ECONNREFUSED));
}

static int conn_send(Conn *c, const char *p, size_t n, double timeout) {
    while (n) {
        ssize_t k = send(c->fd, p, n, MSG_NOSIGNAL);
        if (k > 0) { p += k; n -= (size_t)k; continue; }
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) { if (conn_wait(c, POLLOUT, "send", timeout)) return -1; continue; }
        if (k < 0 && errno == EINTR) continue;
        return conn_err(c, "send: %s", k < 0 ? strerror(errno) : "nothing written");
    }
    return 0;
}

/* Reads more bytes into buf: 1, 0 at end of stream, -1 with c->err. */
static int conn_fill(Conn *c, double timeout) {
    if (c->pos == c->len) c->pos = c->len = 0;
    else if (c->pos > 0 && c->pos >= c->cap / 2) {
        memmove(c->buf, c->buf + c->pos, c->len - c->pos);
        c->len -= c->pos; c->pos = 0;
    }
    if (c->cap - c->len < 16384) {
        size_t cap = c->cap ? c->cap * 2 : 65536;
        char *b = realloc(c->buf, cap);
        if (!b) return conn_err(c, "out of memory");
        c->buf = b; c->cap = cap;
    }
    for (;;) {
        ssize_t k = recv(c->fd, c->buf + c->len, c->cap - c->len - 1, 0);
        if (k > 0) { c->len += (size_t)k; c->buf[c->len] = 0; return 1; }
        if (k == 0) return 0;
        if (errno == EAGAIN || errno == EWOULDBLOCK) { if (conn_wait(c, POLLIN, "waiting for the response", timeout)) return -1; continue; }
        if (errno == EINTR) continue;
        return conn_err(c, "recv: %s", strerror(errno));
    }
}

/* Reads the status line and headers: 0 with c->status and the body's framing, or -1. */
static int conn_headers(Conn *c, double timeout) {
    for (;;) {
        char *end = NULL;
        size_t hlen = 0;
        for (size_t i = c->pos; i < c->len; i++) /* the end of the headers: \n\n or \n\r\n */
            if (c->buf[i] == '\n' && i + 1 < c->len) {
                if (c->buf[i + 1] == '\n') { end = c->buf + i + 1; hlen = 2; break; }
                if (c->buf[i + 1] == '\r' && i + 2 < c->len && c->buf[i + 2] == '\n') { end = c->buf + i + 1; hlen = 3; break; }
            }
        if (!end) {
            if (c->len - c->pos > 65536) return conn_err(c, "response headers longer than 64 KB");
            int k = conn_fill(c, timeout);
            if (k < 0) return -1;
            if (k == 0) return conn_err(c, c->len == c->pos ? "the server closed the connection without a response" : "the connection closed inside the response headers");
            continue;
        }
        char *h = c->buf + c->pos;
        size_t n = (size_t)(end - h);
        c->pos += n + hlen - 1;
        /* status line: HTTP/1.x NNN ... */
        if (n < 12 || strncmp(h, "HTTP/1.", 7) || h[8] != ' ' || h[9] < '1' || h[9] > '5' || h[10] < '0' || h[10] > '9' || h[11] < '0' || h[11] > '9')
            return conn_err(c, "not an HTTP/1.x response: '%.40s'", h);
        c->status = (h[9] - '0') * 100 + (h[10] - '0') * 10 + (h[11] - '0');
        c->mode = BODY_CLOSE;
        int chunked = 0, have_len = 0;
        uint64_t len = 0;
        for (char *line = memchr(h, '\n', n); line && line < end; line = memchr(line, '\n', (size_t)(end - line))) {
            line++;
            char *eol = memchr(line, '\n', (size_t)(end - line));
            if (!eol) break;
            char *colon = memchr(line, ':', (size_t)(eol - line));
            if (!colon) continue;
            size_t name_len = (size_t)(colon - line);
            char *v = colon + 1, *ve = eol;
            while (v < ve && (*v == ' ' || *v == '\t')) v++;
            while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t')) ve--;
            if (name_len == 14 && !strncasecmp(line, "Content-Length", 14)) {
                uint64_t x = 0;
                if (v == ve) return conn_err(c, "bad Content-Length header");
                for (char *q = v; q < ve; q++) {
                    if (*q < '0' || *q > '9' || x > (UINT64_MAX - 9) / 10) return conn_err(c, "bad Content-Length header");
                    x = x * 10 + (uint64_t)(*q - '0');
                }
                if (have_len && x != len) return conn_err(c, "two different Content-Length headers");
                len = x; have_len = 1;
            } else if (name_len == 17 && !strncasecmp(line, "Transfer-Encoding", 17)) {
                for (char *q = v; q + 7 <= ve; q++)
                    if (!strncasecmp(q, "chunked", 7)) chunked = 1;
            }
            line = eol;
        }
        if (c->status < 200) continue; /* 1xx (100 Continue): another header block follows */
        if (chunked) { c->mode = BODY_CHUNKED; c->chunk_state = 0; c->left = 0; }
        else if (have_len) { c->mode = BODY_LENGTH; c->left = len; }
        if (c->status == 204 || c->status == 304) { c->mode = BODY_LENGTH; c->left = 0; }
        return 0;
    }
}

/* Up to cap bytes of the decoded body: n > 0, 0 at its end, -1 with c->err. */
static long conn_body(Conn *c, char *dst, size_t cap, double timeout) {
    for (;;) {
        size_t avail = c->len - c->pos;
        if (c->mode == BODY_LENGTH || c->mode == BODY_CLOSE || c->chunk_state == 1) {
            if (c->mode == BODY_LENGTH && c->left == 0) return 0;
            if (!avail) {
                int k = conn_fill(c, timeout);
                if (k < 0) return -1;
                if (k == 0) {
                    if (c->mode == BODY_CLOSE) return 0;
                    return conn_err(c, c->mode == BODY_LENGTH ? "the connection closed %llu bytes before the end of the body"
                                                              : "the connection closed inside a chunk (%llu bytes short)",
                                    (unsigned long long)c->left);
                }
                continue;
            }
            size_t n = avail < cap ? avail : cap;
            if (c->mode != BODY_CLOSE && n > c->left) n = (size_t)c->left;
            memcpy(dst, c->buf + c->pos, n);
            c->pos += n;
            if (c->mode != BODY_CLOSE) c->left -= n;
            if (c->mode == BODY_CHUNKED && c->left == 0) c->chunk_state = 2;
            return (long)n;
        }
        /* chunked framing: a hex size line (extensions after ';'), the data, CRLF; size 0
         * then trailer lines up to an empty one */
        if (c->chunk_state == 3) return 0;
        char *nl = avail ? memchr(c->buf + c->pos, '\n', avail) : NULL;
        if (!nl) {
            if (avail > 4096) return conn_err(c, "chunked encoding: a line longer than 4 KB");
            int k = conn_fill(c, timeout);
            if (k < 0) return -1;
            if (k == 0) return conn_err(c, "the connection closed inside the chunked framing");
            continue;
        }
        char *line = c->buf + c->pos, *eol = nl;
        if (eol > line && eol[-1] == '\r') eol--;
        c->pos = (size_t)(nl - c->buf) + 1;
        if (c->chunk_state == 2) {
            if (eol != line) return conn_err(c, "chunked encoding: no CRLF after a chunk's data");
            c->chunk_state = 0;
        } else if (c->chunk_state == 4) { /* trailers */
            if (eol == line) c->chunk_state = 3;
        } else {
            uint64_t x = 0;
            char *q = line;
            for (; q < eol && isxdigit((unsigned char)*q); q++) {
                if (x >> 40) return conn_err(c, "chunked encoding: chunk size too large");
                x = x * 16 + (uint64_t)(*q <= '9' ? *q - '0' : (*q | 32) - 'a' + 10);
            }
            if (q == line) return conn_err(c, "chunked encoding: bad chunk size line '%.*s'", (int)(eol - line < 20 ? eol - line : 20), line);
            while (q < eol && (*q == ' ' || *q == '\t')) q++;
            if (q < eol && *q != ';') return conn_err(c, "chunked encoding: bad chunk size line '%.*s'", (int)(eol - line < 20 ? eol - line : 20), line);
            if (x == 0) c->chunk_state = 4;
            else { c->left = x; c->chunk_state = 1; }
        }
    }
}

/* The whole body (at most max bytes) into s: 0, or -1 with c->err. */
static int conn_read_all(Conn *c, Str *s, size_t max, double timeout) {
    char tmp[16384];
    for (;;) {
        long n = conn_body(c, tmp, sizeof tmp, timeout);
        if (n < 0) return -1;
        if (n == 0) return 0;
        if (s->len + (size_t)n > max) return conn_err(c, "response body larger than %zu bytes", max);
        if (str_put(s, tmp, (size_t)n)) return conn_err(c, "out of memory");
    }
}

static void conn_close(Conn *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    free(c->buf);
    c->buf = NULL;
}

/* Connects, sends METHOD base+path with the body (if any), reads the headers: 0 or -1. */
static int http_begin(const Opts *o, Conn *c, const char *method, const char *path, const char *body, size_t body_len, int sse) {
    memset(c, 0, sizeof *c);
    c->fd = -1;
    c->deadline = now_s() + o->timeout;
    if (conn_open(c, o)) return -1;
    Str req = {0};
    int rc = str_printf(&req, "%s %s%s HTTP/1.1\r\nHost: %s\r\nUser-Agent: glm-loadgen\r\nAccept: %s\r\n",
                        method, o->base, path, o->hosthdr, sse ? "text/event-stream" : "application/json");
    if (body) rc |= str_printf(&req, "Content-Type: application/json\r\nContent-Length: %zu\r\n", body_len);
    if (o->api_key) rc |= str_puts(&req, "Authorization: Bearer ") | str_puts(&req, o->api_key) | str_puts(&req, "\r\n");
    rc |= str_puts(&req, "Connection: close\r\n\r\n");
    if (body) rc |= str_put(&req, body, body_len);
    if (rc) { free(req.p); return conn_err(c, "out of memory"); }
    rc = conn_send(c, req.p, req.len, o->timeout);
    free(req.p);
    if (rc) return -1;
    return conn_headers(c, o->timeout);
}

/* A one-line reason from an error response's body: error.message, error (a string),
 * message or detail (FastAPI), else the text itself. */
static void error_message(const char *body, size_t n, char *out, size_t cap) {
    Json j;
    char jerr[128];
    out[0] = 0;
    if (n && json_parse(&j, body, n, jerr, sizeof jerr) == 0) {
        const JsonValue *r = j.root, *e = json_get(r, "error"), *m = NULL;
        if (e && e->type == JSON_STRING) m = e;
        else if (e && e->type == JSON_OBJECT) m = json_get(e, "message");
        if (!m || m->type != JSON_STRING) m = json_get(r, "message");
        if (!m || m->type != JSON_STRING) m = json_get(r, "detail");
        if (m && m->type == JSON_STRING) snprintf(out, cap, "%s", m->str);
        json_free(&j);
    }
    if (!out[0]) snprintf(out, cap, "%.*s", (int)(n < 200 ? n : 200), body ? body : "");
    for (char *p = out; *p; p++)
        if ((unsigned char)*p < 32) *p = ' ';
}

/* ======================================================================== */
/* one request                                                              */

static int json_count(const JsonValue *v) { /* a token count, or -1 */
    return v && v->type == JSON_NUMBER && v->num >= 0 && v->num < 2e9 ? (int)v->num : -1;
}

/* usage (OpenAI: completion_tokens, prompt_tokens, prompt_tokens_details.cached_tokens) and
 * llama-server's timings.cache_n */
static void read_usage(const JsonValue *root, Result *r) {
    const JsonValue *u = json_get(root, "usage");
    if (u && u->type == JSON_OBJECT) {
        int x;
        if ((x = json_count(json_get(u, "completion_tokens"))) >= 0) r->usage_out = x;
        if ((x = json_count(json_get(u, "prompt_tokens"))) >= 0) r->usage_prompt = x;
        const JsonValue *d = json_get(u, "prompt_tokens_details");
        if (d && d->type == JSON_OBJECT && (x = json_count(json_get(d, "cached_tokens"))) >= 0) r->cached = x;
    }
    const JsonValue *t = json_get(root, "timings");
    if (t && t->type == JSON_OBJECT && r->cached < 0) {
        int x = json_count(json_get(t, "cache_n"));
        if (x >= 0) r->cached = x;
    }
}

/* a parsed response object (a stream's event or the whole non-streamed body): its text,
 * finish_reason and usage; an "error" member fails the request */
static void read_choice(const JsonValue *root, Result *r, double t) {
    if (!root || root->type != JSON_OBJECT) { fail(r, "a response event is not a JSON object"); return; }
    const JsonValue *e = json_get(root, "error");
    if (e && e->type != JSON_NULL) {
        const JsonValue *m = e->type == JSON_OBJECT ? json_get(e, "message") : e;
        fail(r, "error in the response: %.200s", m && m->type == JSON_STRING ? m->str : "(no message)");
        return;
    }
    read_usage(root, r);
    const JsonValue *c0 = json_at(json_get(root, "choices"), 0);
    if (!c0) return; /* the usage chunk has "choices": [] */
    const JsonValue *text = json_get(c0, "text"), *fr = json_get(c0, "finish_reason");
    if (fr && fr->type == JSON_STRING) r->finished = 1;
    if (text && text->type == JSON_STRING && text->str_len > 0) {
        if (r->text_events == 0) r->ttft = t;
        else {
            if (r->n_itl == r->cap_itl) {
                int cap = r->cap_itl ? r->cap_itl * 2 : 128;
                double *p = realloc(r->itl, (size_t)cap * sizeof *p);
                if (!p) { fail(r, "out of memory"); return; }
                r->itl = p; r->cap_itl = cap;
            }
            r->itl[r->n_itl++] = t - r->t_last;
        }
        r->t_last = t;
        r->text_events++;
    }
}

static void sse_event(Result *r, const char *data, size_t n, double t) {
    if (r->done) return; /* nothing counts after [DONE] */
    if (n == 6 && !memcmp(data, "[DONE]", 6)) { r->done = 1; return; }
    Json j;
    char jerr[160];
    if (json_parse(&j, data, n, jerr, sizeof jerr)) { fail(r, "malformed SSE event (%s): '%.60s'", jerr, data); return; }
    read_choice(j.root, r, t);
    json_free(&j);
}

/* Reads an SSE stream: lines, "data:" fields joined until an empty line dispatches the
 * event; comments (":") and event/id/retry fields are skipped, any other line fails. */
static void read_stream(const Opts *o, Conn *c, Result *r, double t0) {
    Str line = {0}, data = {0};
    int have_data = 0;
    char tmp[16384];
    for (;;) {
        long n = conn_body(c, tmp, sizeof tmp, o->timeout);
        if (n < 0) { fail(r, "%s", c->err); break; }
        double t = now_s() - t0;
        if (n == 0) { /* the stream ended: a last event without its empty line still counts */
            size_t L = line.len;
            if (L && line.p[L - 1] == '\r') L--;
            if (L >= 5 && !memcmp(line.p, "data:", 5)) {
                size_t k = L > 5 && line.p[5] == ' ' ? 6 : 5;
                if ((have_data && str_put(&data, "\n", 1)) || str_put(&data, line.p + k, L - k)) { fail(r, "out of memory"); break; }
                have_data = 1;
            }
            if (have_data && r->ok) sse_event(r, data.p ? data.p : "", data.len, t);
            break;
        }
        for (const char *p = tmp, *end = tmp + n; p < end && r->ok;) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t span = (size_t)((nl ? nl : end) - p);
            if (line.len + span > MAX_LINE) { fail(r, "an SSE line longer than %zu bytes", MAX_LINE); break; }
            if (str_put(&line, p, span)) { fail(r, "out of memory"); break; }
            p += span;
            if (!nl) break;
            p++; /* a whole line: the field, or the empty line that dispatches the event */
            size_t L = line.len;
            if (L && line.p[L - 1] == '\r') L--;
            if (L == 0) {
                if (have_data) sse_event(r, data.p ? data.p : "", data.len, t);
                data.len = 0; have_data = 0;
            } else if (L >= 5 && !memcmp(line.p, "data:", 5)) {
                size_t k = L > 5 && line.p[5] == ' ' ? 6 : 5;
                if ((have_data && str_put(&data, "\n", 1)) || str_put(&data, line.p + k, L - k)) { fail(r, "out of memory"); break; }
                have_data = 1;
            } else if (line.p[0] != ':' && !(L >= 6 && (!memcmp(line.p, "event:", 6) || !memcmp(line.p, "retry:", 6))) &&
                       !(L >= 3 && !memcmp(line.p, "id:", 3))) {
                fail(r, "malformed SSE line: '%.60s'", line.p);
                break;
            }
            line.len = 0;
        }
        if (!r->ok || r->done) break; /* after [DONE] the stream is over: do not wait for the close */
    }
    if (r->ok && !r->done && !r->finished) fail(r, "the stream ended without [DONE] or a finish_reason");
    free(line.p);
    free(data.p);
}

static void run_request(const Opts *o, const uint32_t *prefix, int n_prefix, int i, double run_t0, Result *r) {
    memset(r, 0, sizeof *r);
    r->ok = 1;
    r->usage_out = r->usage_prompt = r->cached = -1;
    r->streamed = o->stream == STREAM_MIXED ? !(i & 1) : o->stream;
    r->sent_tokens = o->input;

    Str body = {0};
    int rc = str_puts(&body, "{\"model\":") | str_json(&body, o->model) | str_puts(&body, ",\"prompt\":[");
    uint64_t s = o->seed ^ (0xd1b54a32d192ed03ull * (uint64_t)(i + 1));
    splitmix(&s);
    uint32_t span = (uint32_t)(o->vocab_hi - o->vocab_lo);
    for (int k = 0; k < o->input && !rc; k++) {
        uint32_t id = k < n_prefix ? prefix[k] : (uint32_t)o->vocab_lo + (uint32_t)(splitmix(&s) % span);
        rc = str_printf(&body, k ? ",%u" : "%u", id);
    }
    rc |= str_printf(&body, "],\"max_tokens\":%d,\"temperature\":0,\"stream\":%s%s,\"ignore_eos\":true}", o->output,
                     r->streamed ? "true" : "false", r->streamed ? ",\"stream_options\":{\"include_usage\":true}" : "");
    if (rc) { free(body.p); fail(r, "out of memory"); r->t_end = now_s() - run_t0; return; }

    Conn c;
    double t0 = now_s();
    if (http_begin(o, &c, "POST", "/v1/completions", body.p, body.len, r->streamed)) fail(r, "%s", c.err);
    else if (c.status != 200) {
        Str eb = {0};
        char msg[200];
        conn_read_all(&c, &eb, MAX_ERROR_BODY, o->timeout); /* what arrived is enough for a message */
        error_message(eb.p, eb.len, msg, sizeof msg);
        fail(r, "HTTP %d: %s", c.status, msg);
        free(eb.p);
    } else if (r->streamed) read_stream(o, &c, r, t0);
    else {
        Str rb = {0};
        if (conn_read_all(&c, &rb, MAX_BODY, o->timeout)) fail(r, "%s", c.err);
        else {
            Json j;
            char jerr[160];
            if (json_parse(&j, rb.p ? rb.p : "", rb.len, jerr, sizeof jerr)) fail(r, "malformed JSON response (%s): '%.60s'", jerr, rb.p ? rb.p : "");
            else {
                const JsonValue *text = json_get(json_at(json_get(j.root, "choices"), 0), "text");
                if (!text || text->type != JSON_STRING) fail(r, "the response has no choices[0].text");
                else read_choice(j.root, r, 0);
                json_free(&j);
            }
        }
        free(rb.p);
    }
    double t1 = now_s();
    conn_close(&c);
    free(body.p);
    r->e2e = t1 - t0;
    r->t_end = t1 - run_t0;
    if (!r->ok) return;
    if (!r->streamed || r->text_events == 0) r->ttft = r->e2e; /* no text event: the first token is the response */
    r->out_tokens = r->usage_out >= 0 ? r->usage_out : r->streamed ? r->text_events : o->output;
    if (r->out_tokens == 0) fail(r, "the response carries no generated tokens (max_tokens was %d)", o->output);
}

/* ======================================================================== */
/* the run: threads, the arrival schedule, progress                         */

typedef struct {
    const Opts *o;
    const uint32_t *prefix;
    int n_prefix;
    double t0;             /* start of the run */
    const double *arrival; /* [requests] seconds after t0 */
    Result *res;
    pthread_mutex_t mu;
    int next, done, failed;
    int show_progress;
} Run;

static void show_progress(Run *run) {
    int width = 30, n = run->o->requests, fill = (int)((double)run->done / n * width);
    fprintf(stderr, "\rloadgen [");
    for (int i = 0; i < width; i++) fputc(i < fill ? '#' : '.', stderr);
    fprintf(stderr, "] %d/%d requests, %d failed, %.1f s", run->done, n, run->failed, now_s() - run->t0);
    if (run->done >= n) fputc('\n', stderr);
    fflush(stderr);
}

static void *worker(void *arg) {
    Run *run = arg;
    for (;;) {
        pthread_mutex_lock(&run->mu);
        int i = run->next < run->o->requests ? run->next++ : -1;
        pthread_mutex_unlock(&run->mu);
        if (i < 0) return NULL;
        for (;;) { /* wait for the request's arrival */
            double d = run->t0 + run->arrival[i] - now_s();
            if (d <= 0) break;
            struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
            nanosleep(&ts, NULL);
        }
        run_request(run->o, run->prefix, run->n_prefix, i, run->t0, &run->res[i]);
        pthread_mutex_lock(&run->mu);
        run->done++;
        run->failed += !run->res[i].ok;
        if (run->show_progress) show_progress(run);
        pthread_mutex_unlock(&run->mu);
    }
}

/* GET /v1/models: the first model's id (malloc'd), or glm_fatal */
static char *first_model(const Opts *o) {
    Conn c;
    Str b = {0};
    char why[256] = "";
    if (http_begin(o, &c, "GET", "/v1/models", NULL, 0, 0) || conn_read_all(&c, &b, MAX_BODY, o->timeout))
        snprintf(why, sizeof why, "%s", c.err);
    else if (c.status != 200) {
        char msg[200];
        error_message(b.p, b.len, msg, sizeof msg);
        snprintf(why, sizeof why, "HTTP %d: %s", c.status, msg);
    }
    conn_close(&c);
    char *id = NULL;
    if (!why[0]) {
        Json j;
        char jerr[160];
        if (json_parse(&j, b.p ? b.p : "", b.len, jerr, sizeof jerr)) snprintf(why, sizeof why, "malformed JSON (%s)", jerr);
        else {
            const JsonValue *v = json_get(json_at(json_get(j.root, "data"), 0), "id");
            if (v && v->type == JSON_STRING && v->str_len > 0) id = xstrdup(v->str);
            else snprintf(why, sizeof why, "no data[0].id in the answer");
            json_free(&j);
        }
    }
    free(b.p);
    if (!id) glm_fatal("loadgen: GET %s/v1/models: %s (is the server up? --model NAME skips this)", o->url, why);
    return id;
}

/* ======================================================================== */
/* statistics and the report                                                */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct { double mean, median, p90, p99; int n; } Dist;

/* mean and percentiles (linear between the closest ranks, as numpy.percentile) of v[n], in ms */
static Dist dist(double *v, int n) {
    Dist d = {NAN, NAN, NAN, NAN, n};
    if (n <= 0) return d;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    d.mean = sum / n * 1e3;
    double *q[3] = {&d.median, &d.p90, &d.p99}, p[3] = {0.5, 0.9, 0.99};
    for (int k = 0; k < 3; k++) {
        double x = p[k] * (n - 1);
        int lo = (int)x;
        int hi = lo + 1 < n ? lo + 1 : lo;
        *q[k] = (v[lo] + (v[hi] - v[lo]) * (x - lo)) * 1e3;
    }
    return d;
}

static void print_num(double v, const char *fmt) { /* JSON: null for what was not measured */
    if (isfinite(v)) printf(fmt, v);
    else printf("null");
}

int loadgen_main(int argc, char **argv) {
    Opts o = {.input = 2000, .output = 100, .concurrency = 8, .requests = 32, .stream = STREAM_ON,
              .shared = 0.6, .rate = INFINITY, .timeout = 600, .seed = 1, .vocab_lo = 100, .vocab_hi = 10000};
    const char *stream_arg = "1";
    static const char usage[] =
        "usage: glm loadgen URL [--input N] [--output N] [--shared F] [--concurrency C] [--requests N] [--rate R]\n"
        "                       [--model NAME] [--seed S] [--vocab [V0..]V] [--stream 0|1|mixed] [--api-key KEY]\n"
        "                       [--timeout SECONDS] [--json]\n"
        "  Load on an OpenAI-compatible server (glm serve, llama.cpp's llama-server, sglang, vLLM), reported as\n"
        "  sglang's bench_serving does: throughput, TTFT, TPOT, ITL and end-to-end latency (mean, median, p90, p99)\n"
        "  and the share of prompt tokens the server reports as cached. URL is http://HOST[:PORT][/PATH], plain\n"
        "  HTTP only (no TLS: https:// is refused). Each request is POST PATH/v1/completions with a prompt of\n"
        "  token ids (exact lengths on any tokenizer): a prefix common to all requests, then a random suffix of\n"
        "  its own; it asks for exactly --output tokens (\"ignore_eos\": true, temperature 0) and, streaming, for\n"
        "  the usage in the last chunk (\"stream_options\": {\"include_usage\": true}). Cached tokens come from\n"
        "  usage.prompt_tokens_details.cached_tokens (vLLM: --enable-prompt-tokens-details; sglang:\n"
        "  --enable-cache-report) or llama-server's timings.cache_n.\n"
        "  A request fails on a connection error, an HTTP status other than 200, a malformed response or stream,\n"
        "  or its timeout. Exit status 0 if every request succeeded, 1 if any failed (after the report).\n"
        "  --input N          prompt tokens per request, 1..1000000 (default 2000)\n"
        "  --output N         tokens generated per request, 1..1000000 (default 100)\n"
        "  --shared F         the share of each prompt that is one prefix common to all requests, 0..1\n"
        "                     (default 0.6)\n"
        "  --concurrency C    requests in flight at most: one client thread each, 1..4096 (default 8)\n"
        "  --requests N       requests in all, 1..1000000 (default 32)\n"
        "  --rate R           requests per second, Poisson arrivals, or inf: all at once up to --concurrency\n"
        "                     (default inf)\n"
        "  --model NAME       the request's \"model\" (default: the first id from GET /v1/models)\n"
        "  --seed S           random seed of the prompts and arrivals: the same seed sends the same prompts,\n"
        "                     which a server that saw them before finds in its prefix cache (default 1)\n"
        "  --vocab [V0..]V    token ids drawn from [V0, V); V alone means 100..V (default 100..10000, safe for any\n"
        "                     tokenizer)\n"
        "  --stream M         1: streamed responses (SSE), 0: whole responses (TTFT = end to end), mixed:\n"
        "                     alternating, for load tests (default 1)\n"
        "  --api-key KEY      sent as Authorization: Bearer KEY (default none)\n"
        "  --timeout SECONDS  per request, from connect to the last byte (default 600)\n"
        "  --json             one JSON object on stdout instead of the table (default off)\n"
        "  -h, --help         this text";
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (f[0] != '-') { if (o.url) glm_fatal("loadgen: unexpected argument '%s'", f); o.url = f; continue; }
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { puts(usage); return 0; }
        if (!strcmp(f, "--json")) { o.json = 1; continue; }
        static const char *const valued[] = {"--input", "--output", "--shared", "--concurrency", "--requests", "--rate", "--model",
                                             "--seed", "--vocab", "--stream", "--api-key", "--timeout"};
        int known = 0;
        for (size_t k = 0; k < sizeof valued / sizeof *valued; k++) known |= !strcmp(f, valued[k]);
        if (!known) glm_fatal("loadgen: unknown flag %s (see glm loadgen --help)", f);
        if (i + 1 >= argc) glm_fatal("%s: missing value", f);
        const char *v = argv[++i];
        char *end;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        int bad_int = !*v || *end || errno || *v == ' ';
        errno = 0;
        double d = strtod(v, &end);
        int bad_num = !*v || *end || errno || *v == ' ' || isnan(d);
        if (!strcmp(f, "--input")) { if (bad_int || x < 1 || x > 1000000) glm_fatal("--input %s: expected a token count 1..1000000", v); o.input = (int)x; }
        else if (!strcmp(f, "--output")) { if (bad_int || x < 1 || x > 1000000) glm_fatal("--output %s: expected a token count 1..1000000", v); o.output = (int)x; }
        else if (!strcmp(f, "--shared")) { if (bad_num || !(d >= 0 && d <= 1)) glm_fatal("--shared %s: expected a share 0..1", v); o.shared = d; }
        else if (!strcmp(f, "--concurrency")) { if (bad_int || x < 1 || x > 4096) glm_fatal("--concurrency %s: expected 1..4096", v); o.concurrency = (int)x; }
        else if (!strcmp(f, "--requests")) { if (bad_int || x < 1 || x > 1000000) glm_fatal("--requests %s: expected 1..1000000", v); o.requests = (int)x; }
        else if (!strcmp(f, "--rate")) {
            if (!strcmp(v, "inf")) o.rate = INFINITY;
            else if (bad_num || !(d > 0) || !isfinite(d)) glm_fatal("--rate %s: expected requests per second > 0, or inf", v);
            else o.rate = d;
        } else if (!strcmp(f, "--model")) { if (!*v) glm_fatal("--model '': expected a model name"); o.model = v; }
        else if (!strcmp(f, "--seed")) {
            errno = 0;
            unsigned long long u = strtoull(v, &end, 10);
            if (!*v || *end || errno || *v == '-' || *v == ' ') glm_fatal("--seed %s: expected a non-negative integer", v);
            o.seed = u;
        } else if (!strcmp(f, "--vocab")) {
            const char *dots = strstr(v, "..");
            long long lo = 100, hi;
            int ok = 1;
            if (dots) {
                char *e1;
                errno = 0;
                lo = strtoll(v, &e1, 10);
                ok = e1 == dots && e1 != v && !errno && *v != ' ';
                v = dots + 2;
            }
            errno = 0;
            hi = strtoll(v, &end, 10);
            ok = ok && *v && !*end && !errno && *v != ' ' && *v != '-' && lo >= 0 && hi > lo && hi <= INT32_MAX;
            if (!ok) glm_fatal("--vocab %s: expected V0..V with 0 <= V0 < V (or V > 100 alone: 100..V)", argv[i]);
            o.vocab_lo = (int)lo; o.vocab_hi = (int)hi;
        } else if (!strcmp(f, "--stream")) {
            if (!strcmp(v, "0")) o.stream = STREAM_OFF;
            else if (!strcmp(v, "1")) o.stream = STREAM_ON;
            else if (!strcmp(v, "mixed")) o.stream = STREAM_MIXED;
            else glm_fatal("--stream %s: expected 0, 1 or mixed", v);
            stream_arg = v;
        } else if (!strcmp(f, "--api-key")) { if (!*v) glm_fatal("--api-key '': expected a key"); o.api_key = v; }
        else { /* --timeout, the last flag the check above lets through */
            if (bad_num || !(d > 0) || d > 1e6) glm_fatal("--timeout %s: expected seconds > 0", v);
            o.timeout = d;
        }
    }
    if (!o.url) glm_fatal("loadgen: URL is required, e.g. http://127.0.0.1:8080 (see glm loadgen --help)");

    /* URL: http://HOST[:PORT][/PATH]; HOST may be [IPv6]; a trailing / or /v1 is dropped */
    {
        const char *u = o.url;
        if (!strncasecmp(u, "https://", 8)) glm_fatal("URL %s: https is not supported: plain http only, no TLS", u);
        if (strncasecmp(u, "http://", 7)) glm_fatal("URL %s: expected http://HOST[:PORT][/PATH]", u);
        const char *h = u + 7, *he, *p;
        if (*h == '[') {
            he = strchr(h, ']');
            if (!he) glm_fatal("URL %s: expected http://HOST[:PORT][/PATH]", u);
            p = he + 1;
            h++;
        } else {
            he = h + strcspn(h, ":/?#");
            p = he;
        }
        if (he == h || (size_t)(he - h) >= sizeof o.host) glm_fatal("URL %s: expected http://HOST[:PORT][/PATH]", u);
        memcpy(o.host, h, (size_t)(he - h));
        o.host[he - h] = 0;
        snprintf(o.port, sizeof o.port, "80");
        if (*p == ':') {
            p++;
            long port = 0;
            const char *q = p;
            while (*q >= '0' && *q <= '9' && port <= 65535) port = port * 10 + (*q++ - '0');
            if (q == p || port < 1 || port > 65535 || (*q && *q != '/')) glm_fatal("URL %s: expected a port 1..65535 after the host", u);
            snprintf(o.port, sizeof o.port, "%ld", port);
            p = q;
        } else if (*p && *p != '/') glm_fatal("URL %s: expected http://HOST[:PORT][/PATH]", u);
        size_t n = strlen(p);
        if (strpbrk(p, "?# \t\r\n") || n >= sizeof o.base) glm_fatal("URL %s: expected http://HOST[:PORT][/PATH] (no query, no spaces)", u);
        memcpy(o.base, p, n + 1);
        while (n && o.base[n - 1] == '/') o.base[--n] = 0;
        if (n >= 3 && !strcmp(o.base + n - 3, "/v1")) o.base[n -= 3] = 0;
        int v6 = strchr(o.host, ':') != NULL;
        snprintf(o.hosthdr, sizeof o.hosthdr, "%s%s%s%s%s", v6 ? "[" : "", o.host, v6 ? "]" : "", strcmp(o.port, "80") ? ":" : "",
                 strcmp(o.port, "80") ? o.port : "");
        struct addrinfo hints = {0};
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        int e = getaddrinfo(o.host, o.port, &hints, &o.addr);
        if (e) glm_fatal("URL %s: cannot resolve %s: %s", u, o.host, gai_strerror(e));
    }
    char *model_owned = NULL;
    if (!o.model) o.model = model_owned = first_model(&o);

    /* the common prefix, drawn once; the arrival times */
    int n_prefix = (int)floor(o.shared * o.input + 0.5);
    if (n_prefix > o.input) n_prefix = o.input;
    uint32_t *prefix = xmalloc((size_t)(n_prefix ? n_prefix : 1) * sizeof *prefix);
    uint64_t s = o.seed;
    for (int k = 0; k < n_prefix; k++) prefix[k] = (uint32_t)o.vocab_lo + (uint32_t)(splitmix(&s) % (uint32_t)(o.vocab_hi - o.vocab_lo));
    double *arrival = xmalloc((size_t)o.requests * sizeof *arrival);
    s = o.seed ^ 0x5851f42d4c957f2dull;
    double t = 0;
    for (int i = 0; i < o.requests; i++) {
        arrival[i] = t;
        if (isfinite(o.rate)) t += -log(1.0 - uniform01(&s)) / o.rate;
    }

    Run run = {.o = &o, .prefix = prefix, .n_prefix = n_prefix, .arrival = arrival,
               .res = xcalloc((size_t)o.requests, sizeof(Result)), .show_progress = !o.json && isatty(2)};
    pthread_mutex_init(&run.mu, NULL);
    int n_threads = o.concurrency < o.requests ? o.concurrency : o.requests;
    pthread_t *th = xmalloc((size_t)n_threads * sizeof *th);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, (size_t)512 << 10);
    run.t0 = now_s();
    for (int i = 0; i < n_threads; i++) {
        int e = pthread_create(&th[i], &attr, worker, &run);
        if (e) glm_fatal("loadgen: cannot start client thread %d of %d: %s", i + 1, n_threads, strerror(e));
    }
    for (int i = 0; i < n_threads; i++) pthread_join(th[i], NULL);
    pthread_attr_destroy(&attr);
    pthread_mutex_destroy(&run.mu);

    /* totals over the successful requests */
    int ok = 0, failed = 0, n_stream = 0, cache_reported = 0, short_out = 0, no_usage = 0, prompt_mismatch = 0;
    long long in_tok = 0, out_tok = 0, prompt_tok = 0, cached_tok = 0, n_itl = 0;
    double t_last = 0, sum_e2e = 0;
    for (int i = 0; i < o.requests; i++) {
        const Result *r = &run.res[i];
        if (r->t_end > t_last) t_last = r->t_end;
        if (!r->ok) { failed++; continue; }
        ok++;
        in_tok += r->sent_tokens;
        out_tok += r->out_tokens;
        prompt_tok += r->usage_prompt >= 0 ? r->usage_prompt : r->sent_tokens;
        if (r->cached >= 0) { cache_reported++; cached_tok += r->cached; }
        sum_e2e += r->e2e;
        n_itl += r->n_itl;
        n_stream += r->streamed;
        short_out += r->out_tokens != o.output;
        no_usage += r->usage_out < 0;
        prompt_mismatch += r->usage_prompt >= 0 && r->usage_prompt != r->sent_tokens;
    }
    double *ttft = xmalloc(sizeof(double) * (size_t)(ok + 1)), *tpot = xmalloc(sizeof(double) * (size_t)(ok + 1));
    double *e2e = xmalloc(sizeof(double) * (size_t)(ok + 1)), *itl = xmalloc(sizeof(double) * (size_t)(n_itl + 1));
    int n_ttft = 0, n_tpot = 0, n_e2e = 0, k_itl = 0;
    for (int i = 0; i < o.requests; i++) {
        const Result *r = &run.res[i];
        if (!r->ok) continue;
        ttft[n_ttft++] = r->ttft;
        e2e[n_e2e++] = r->e2e;
        if (r->streamed && r->out_tokens > 1) tpot[n_tpot++] = (r->e2e - r->ttft) / (r->out_tokens - 1);
        for (int k = 0; k < r->n_itl; k++) itl[k_itl++] = r->itl[k];
    }
    Dist d_ttft = dist(ttft, n_ttft), d_tpot = dist(tpot, n_tpot), d_itl = dist(itl, k_itl), d_e2e = dist(e2e, n_e2e);
    double dur = t_last;
    double req_tp = dur > 0 ? ok / dur : NAN, in_tp = dur > 0 ? in_tok / dur : NAN, out_tp = dur > 0 ? out_tok / dur : NAN;
    double cache_rate = cache_reported && prompt_tok > 0 ? (double)cached_tok / (double)prompt_tok : NAN;
    double conc = dur > 0 ? sum_e2e / dur : NAN;
    const char *errs[MAX_ERRORS];
    int errs_i[MAX_ERRORS], n_errs = 0;
    for (int i = 0; i < o.requests && n_errs < MAX_ERRORS; i++)
        if (!run.res[i].ok) { errs_i[n_errs] = i; errs[n_errs++] = run.res[i].err; }

    if (o.json) {
        Str js = {0};
        str_puts(&js, "{\"url\": ");
        str_json(&js, o.url);
        str_puts(&js, ", \"model\": ");
        str_json(&js, o.model);
        printf("%s, \"stream\": \"%s\", \"input_len\": %d, \"output_len\": %d, \"shared\": %g, \"shared_prefix_len\": %d, "
               "\"request_rate\": ", js.p, stream_arg, o.input, o.output, o.shared, n_prefix);
        print_num(o.rate, "%g");
        printf(", \"max_concurrency\": %d, \"requests\": %d, \"successful_requests\": %d, \"failed_requests\": %d, \"duration_s\": %.3f, "
               "\"total_input_tokens\": %lld, \"total_output_tokens\": %lld, \"request_throughput\": ",
               o.concurrency, o.requests, ok, failed, dur, in_tok, out_tok);
        print_num(req_tp, "%.3f");
        printf(", \"input_throughput\": "); print_num(in_tp, "%.2f");
        printf(", \"output_throughput\": "); print_num(out_tp, "%.2f");
        printf(", \"total_throughput\": "); print_num(in_tp + out_tp, "%.2f");
        printf(", \"prompt_tokens\": %lld, \"cached_tokens\": ", prompt_tok);
        if (cache_reported) printf("%lld", cached_tok); else printf("null");
        printf(", \"cache_hit_rate\": "); print_num(cache_rate, "%.4f");
        printf(", \"concurrency\": "); print_num(conc, "%.2f");
        const char *names[4] = {"ttft", "tpot", "itl", "e2e_latency"};
        const Dist *ds[4] = {&d_ttft, &d_tpot, &d_itl, &d_e2e};
        for (int k = 0; k < 4; k++) {
            printf(", \"mean_%s_ms\": ", names[k]); print_num(ds[k]->mean, "%.3f");
            printf(", \"median_%s_ms\": ", names[k]); print_num(ds[k]->median, "%.3f");
            printf(", \"p90_%s_ms\": ", names[k]); print_num(ds[k]->p90, "%.3f");
            printf(", \"p99_%s_ms\": ", names[k]); print_num(ds[k]->p99, "%.3f");
        }
        js.len = 0;
        str_puts(&js, ", \"errors\": [");
        for (int k = 0; k < n_errs; k++) {
            char line[320];
            snprintf(line, sizeof line, "request %d: %s", errs_i[k], errs[k]);
            if (k) str_puts(&js, ", ");
            str_json(&js, line);
        }
        printf("%s]}\n", js.p ? js.p : ", \"errors\": [");
        free(js.p);
    } else {
        char rate[32];
        if (isfinite(o.rate)) snprintf(rate, sizeof rate, "%g", o.rate); else snprintf(rate, sizeof rate, "inf");
#define ROW(label, fmt, ...) printf("%-40s " fmt "\n", label, __VA_ARGS__)
        printf("============ glm loadgen: serving benchmark =============\n");
        ROW("URL:", "%s", o.url);
        ROW("Model:", "%s", o.model);
        ROW("Streaming:", "%s", o.stream == STREAM_MIXED ? "mixed (every other request)" : o.stream ? "yes" : "no");
        ROW("Prompt / output tokens per request:", "%d / %d (%d shared prefix)", o.input, o.output, n_prefix);
        ROW("Request rate (req/s):", "%s", rate);
        ROW("Max concurrency:", "%d", o.concurrency);
        ROW("Successful requests:", "%d", ok);
        ROW("Failed requests:", "%d", failed);
        ROW("Benchmark duration (s):", "%.2f", dur);
        ROW("Total input tokens:", "%lld", in_tok);
        ROW("Total generated tokens:", "%lld", out_tok);
        ROW("Request throughput (req/s):", "%.2f", isfinite(req_tp) ? req_tp : 0.0);
        ROW("Input token throughput (tok/s):", "%.2f", isfinite(in_tp) ? in_tp : 0.0);
        ROW("Output token throughput (tok/s):", "%.2f", isfinite(out_tp) ? out_tp : 0.0);
        ROW("Total token throughput (tok/s):", "%.2f", isfinite(in_tp) ? in_tp + out_tp : 0.0);
        if (cache_reported) ROW("Cache hit share:", "%.1f%% (%lld of %lld prompt tokens cached)", 100 * cache_rate, cached_tok, prompt_tok);
        else ROW("Cache hit share:", "%s", "n/a (the server reported no cached tokens)");
        ROW("Concurrency:", "%.2f", isfinite(conc) ? conc : 0.0);
        const char *titles[4] = {"Time to First Token", "Time per Output Token (excl. 1st token)", "Inter-token Latency", "End-to-End Latency"};
        const char *abbr[4] = {"TTFT", "TPOT", "ITL", "E2E"};
        const Dist *ds[4] = {&d_ttft, &d_tpot, &d_itl, &d_e2e};
        for (int k = 0; k < 4; k++) {
            int w = (int)strlen(titles[k]), left = (57 - w) / 2;
            printf("%.*s%s%.*s\n", left, "-----------------------------", titles[k], 57 - w - left, "-----------------------------");
            if (ds[k]->n == 0) { printf("%-40s n/a\n", abbr[k]); continue; }
            char label[64];
            const char *stat[4] = {"Mean", "Median", "P90", "P99"};
            double val[4] = {ds[k]->mean, ds[k]->median, ds[k]->p90, ds[k]->p99};
            for (int q = 0; q < 4; q++) {
                snprintf(label, sizeof label, "%s %s (ms):", stat[q], abbr[k]);
                ROW(label, "%.2f", val[q]);
            }
        }
        printf("=========================================================\n");
        if (failed) {
            printf("Errors (the first %d of %d):\n", n_errs, failed);
            for (int k = 0; k < n_errs; k++) printf("  request %d: %s\n", errs_i[k], errs[k]);
        }
#undef ROW
    }
    fflush(stdout);
    /* what makes the numbers mean less, on stderr (stdout stays one JSON object) */
    if (ok && no_usage) fprintf(stderr, "loadgen: note: %d of %d successful responses had no usage.completion_tokens; their output tokens were counted %s\n",
                                no_usage, ok, n_stream ? "as text events (streamed) or --output (not streamed)" : "as --output");
    if (ok && short_out) fprintf(stderr, "loadgen: note: %d of %d successful requests generated other than --output %d tokens (does the server honor \"ignore_eos\"?)\n",
                                 short_out, ok, o.output);
    if (prompt_mismatch) fprintf(stderr, "loadgen: note: %d responses counted other than the %d prompt tokens sent (usage.prompt_tokens)\n", prompt_mismatch, o.input);

    for (int i = 0; i < o.requests; i++) free(run.res[i].itl);
    free(run.res); free(th); free(prefix); free(arrival);
    free(ttft); free(tpot); free(e2e); free(itl);
    free(model_owned);
    freeaddrinfo(o.addr);
    return failed ? 1 : 0;
}
