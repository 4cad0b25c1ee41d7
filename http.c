/* http.c - see http.h. The request parser is a pure function of the bytes received so far:
 * http_read calls it again after every recv until it answers "whole" (1) or "wrong" (<0),
 * so the whole protocol sits in one function that the fuzzer drives without sockets
 * (fuzz/fuzz_http.c) and that gives the same answer however the bytes were split.
 * Everything here runs in server threads: failures are return values, never glm_fatal or
 * exit, and nothing is allocated except the growable buffers.
 *
 * Choices where HTTP allows several (strict unless leniency is what common clients need):
 *   - lines end in CRLF or a bare LF (curl, nc, hand-written tests); a CR not followed by
 *     LF is 400 as soon as the byte after it is there;
 *   - empty lines before the request line are skipped (RFC 9112 §2.2: some clients send a
 *     CRLF after a body) and count in total_len;
 *   - the request line is exactly METHOD SP TARGET SP HTTP/1.x with single spaces, no
 *     control characters, a method of 1-15 token characters and a target starting with
 *     '/' (no absolute or '*' form); the path is the target up to '?'; over 511 bytes: 414;
 *   - header names are tokens (so "Name : v" is 400), values have no control characters
 *     but TAB, a line starting with a space (obsolete folding) is 400;
 *   - Content-Length is 1+ ASCII digits (no sign, no list), the same value twice is fine,
 *     two different ones 400; a value too big for size_t is 400, one over max_body 413;
 *   - Transfer-Encoding of any value is 411, checked before 413; a second Authorization
 *     header is 400 (which one would count?); Host is not required;
 *   - "Expect: 100-continue" is honoured by http_read (the parser stays pure); other
 *     Expect values are ignored rather than answered with 417. */
#define _GNU_SOURCE /* POLLRDHUP and SOCK_CLOEXEC (Linux); POSIX sockets under -std=c11 */
#include "http.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Buf */

/* Room for n more bytes plus the NUL. On failure sets oom and keeps what is there, so a
 * truncated buffer is still a valid C string. */
static int buf_reserve(Buf *b, size_t n) {
    if (b->oom) return 0;
    if (b->cap > b->len && b->cap - b->len > n) return 1;
    if (n >= SIZE_MAX / 4 - b->len) { b->oom = 1; return 0; } /* doubling below cannot overflow */
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len <= n) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) { b->oom = 1; return 0; }
    b->p = p;
    b->cap = cap;
    return 1;
}

void buf_put(Buf *b, const void *data, size_t n) {
    if (!n || !buf_reserve(b, n)) return;
    memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = 0;
}

void buf_puts(Buf *b, const char *s) { buf_put(b, s, strlen(s)); }

void buf_printf(Buf *b, const char *fmt, ...) {
    if (b->oom) return;
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap); /* measure first: one pass into exactly enough room */
    va_end(ap);
    if (n > 0 && buf_reserve(b, (size_t)n)) {
        vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap2);
        b->len += (size_t)n;
    }
    va_end(ap2);
}

void buf_free(Buf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->oom = 0;
}

/* The length of the well-formed UTF-8 sequence at s[0..n) (Unicode Table 3-7: no overlongs,
 * no surrogates, nothing over U+10FFFF), or 0 with *bad = the length of its maximal
 * subpart: the lead byte and the continuation bytes that could still have completed it
 * (at least 1). One U+FFFD per maximal subpart is Unicode's recommended practice (§3.9)
 * and what browsers and Python's errors="replace" do, so clients see the same text. */
static size_t utf8_seq(const unsigned char *s, size_t n, size_t *bad) {
    unsigned c = s[0], lo = 0x80, hi = 0xBF;
    size_t need;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0; /* overlong below U+0800 */
        if (c == 0xED) hi = 0x9F; /* surrogates U+D800..DFFF */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90; /* overlong below U+10000 */
        if (c == 0xF4) hi = 0x8F; /* over U+10FFFF */
    } else {
        *bad = 1; /* a continuation byte, C0/C1 (always overlong) or F5..FF */
        return 0;
    }
    for (size_t k = 1; k <= need; k++) {
        if (k >= n || s[k] < lo || s[k] > hi) { *bad = k; return 0; }
        lo = 0x80; /* only the second byte has a narrower range */
        hi = 0xBF;
    }
    return need + 1;
}

void buf_json_str(Buf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t run = 0; /* start of the bytes that are copied as they are */
    buf_put(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t skip = 1, bad = 1;
        char esc[8];
        if (c >= 0x20 && c != '"' && c != '\\') {
            if (c < 0x80) { i++; continue; }
            size_t k = utf8_seq(u + i, n - i, &bad);
            if (k) { i += k; continue; }
            memcpy(esc, "\\ufffd", 7); /* ASCII, so the replacement is visible in any log */
            skip = bad;
        } else if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            esc[2] = 0;
        } else {
            const char *short_esc = c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : c == '\b' ? "\\b"
                                  : c == '\f' ? "\\f" : NULL;
            if (short_esc) memcpy(esc, short_esc, 3);
            else snprintf(esc, sizeof esc, "\\u%04x", c);
        }
        if (i > run) buf_put(b, s + run, i - run);
        buf_puts(b, esc);
        i += skip;
        run = i;
    }
    if (n > run) buf_put(b, s + run, n - run);
    buf_put(b, "\"", 1);
}

/* ------------------------------------------------------------------------ */
/* The request parser */

static int fail(char *err, size_t errlen, int status, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, int status, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -status;
}

static int lower(int c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* s[0..n) equals the lowercase word w, ignoring case */
static int word_is(const char *s, size_t n, const char *w) {
    size_t i = 0;
    for (; i < n && w[i]; i++)
        if (lower((unsigned char)s[i]) != w[i]) return 0;
    return i == n && !w[i];
}

/* RFC 9110 tchar: what method and header names are made of */
static int is_tchar(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

static int is_ctl(int c) { return c < 0x20 || c == 0x7F; }

/* The next line at buf[at..lim): 1 with its end (*eol, before the CR or LF) and the start of
 * the one after (*next); 0 when lim comes first; -1 for a CR followed by anything but LF.
 * Scanning byte by byte from the line's start makes every answer depend only on bytes
 * already seen, which is what keeps the parser's answers the same however input is split. */
static int next_line(const char *buf, size_t lim, size_t at, size_t *eol, size_t *next) {
    for (size_t i = at; i < lim; i++) {
        if (buf[i] == '\n') {
            *eol = i;
            *next = i + 1;
            return 1;
        }
        if (buf[i] == '\r') {
            if (i + 1 >= lim) return 0;
            if (buf[i + 1] != '\n') return -1;
            *eol = i;
            *next = i + 2;
            return 1;
        }
    }
    return 0;
}

/* What the header lines say, gathered until the blank line. */
typedef struct {
    int minor;                   /* HTTP/1.minor */
    int conn_close, conn_keep;   /* Connection tokens seen */
    int has_length, has_te, has_auth;
    int expect_continue;         /* "Expect: 100-continue": the client waits before sending the body */
    size_t length;
    size_t head_len;             /* bytes up to the body once the blank line is in, else 0 */
} Headers;

static int request_line(const char *s, size_t n, HttpRequest *req, Headers *h, char *err, size_t errlen) {
    for (size_t i = 0; i < n; i++)
        if (is_ctl((unsigned char)s[i])) return fail(err, errlen, 400, "control character in the request line");
    const char *sp1 = memchr(s, ' ', n);
    const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(s + n - sp1 - 1)) : NULL;
    if (!sp2) return fail(err, errlen, 400, "malformed request line (want METHOD TARGET HTTP/1.1)");
    size_t mlen = (size_t)(sp1 - s), tlen = (size_t)(sp2 - sp1 - 1), vlen = (size_t)(s + n - sp2 - 1);
    const char *target = sp1 + 1, *v = sp2 + 1;
    if (mlen == 0 || mlen >= sizeof req->method) return fail(err, errlen, 400, "bad method (1 to 15 characters)");
    for (size_t i = 0; i < mlen; i++)
        if (!is_tchar((unsigned char)s[i])) return fail(err, errlen, 400, "bad character in the method");
    int digits = vlen == 8 && v[6] == '.' && v[5] >= '0' && v[5] <= '9' && v[7] >= '0' && v[7] <= '9';
    if (!digits || memcmp(v, "HTTP/", 5)) return fail(err, errlen, 400, "malformed HTTP version");
    if (v[5] != '1' || (v[7] != '0' && v[7] != '1'))
        return fail(err, errlen, 505, "HTTP version %.8s is not supported (HTTP/1.0 and HTTP/1.1 are)", v);
    if (tlen == 0 || target[0] != '/') return fail(err, errlen, 400, "the request target must be a path starting with '/'");
    const char *q = memchr(target, '?', tlen);
    size_t plen = q ? (size_t)(q - target) : tlen;
    if (plen >= sizeof req->path) return fail(err, errlen, 414, "path longer than %zu bytes", sizeof req->path - 1);
    memcpy(req->method, s, mlen);
    memcpy(req->path, target, plen);
    h->minor = v[7] - '0';
    return 0;
}

static int content_length(const char *v, size_t n, Headers *h, char *err, size_t errlen) {
    size_t x = 0;
    if (n == 0) return fail(err, errlen, 400, "empty Content-Length");
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9') return fail(err, errlen, 400, "Content-Length is not a number");
        unsigned d = (unsigned)(v[i] - '0');
        if (x > (SIZE_MAX - d) / 10) return fail(err, errlen, 400, "Content-Length overflows");
        x = x * 10 + d;
    }
    if (h->has_length && h->length != x) return fail(err, errlen, 400, "two different Content-Length values");
    h->has_length = 1;
    h->length = x;
    return 0;
}

/* Connection: a comma-separated list of tokens; "close" and "keep-alive" are the ones that
 * matter here, in any case. */
static void connection(const char *v, size_t n, Headers *h) {
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && v[j] != ',') j++;
        size_t a = i, e = j;
        while (a < e && (v[a] == ' ' || v[a] == '\t')) a++;
        while (e > a && (v[e - 1] == ' ' || v[e - 1] == '\t')) e--;
        if (word_is(v + a, e - a, "close")) h->conn_close = 1;
        if (word_is(v + a, e - a, "keep-alive")) h->conn_keep = 1;
        i = j + 1;
    }
}

static int header_line(const char *s, size_t n, HttpRequest *req, Headers *h, char *err, size_t errlen) {
    if (s[0] == ' ' || s[0] == '\t') return fail(err, errlen, 400, "folded header line (obsolete, not supported)");
    const char *colon = memchr(s, ':', n);
    if (!colon) return fail(err, errlen, 400, "header line without ':'");
    size_t nlen = (size_t)(colon - s);
    if (nlen == 0) return fail(err, errlen, 400, "empty header name");
    for (size_t i = 0; i < nlen; i++)
        if (!is_tchar((unsigned char)s[i])) return fail(err, errlen, 400, "bad character in a header name");
    const char *v = colon + 1, *end = s + n;
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t')) end--;
    size_t vlen = (size_t)(end - v);
    for (size_t i = 0; i < vlen; i++)
        if (is_ctl((unsigned char)v[i]) && v[i] != '\t') return fail(err, errlen, 400, "control character in a header value");
    if (word_is(s, nlen, "content-length")) return content_length(v, vlen, h, err, errlen);
    if (word_is(s, nlen, "transfer-encoding")) h->has_te = 1;
    else if (word_is(s, nlen, "connection")) connection(v, vlen, h);
    else if (word_is(s, nlen, "expect")) h->expect_continue = word_is(v, vlen, "100-continue");
    else if (word_is(s, nlen, "authorization")) {
        if (h->has_auth) return fail(err, errlen, 400, "two Authorization headers");
        /* a longer value keeps its first 511 bytes; http_bearer_ok refuses any value that
         * long, so a truncated key can never match */
        size_t k = vlen < sizeof req->authorization - 1 ? vlen : sizeof req->authorization - 1;
        memcpy(req->authorization, v, k);
        h->has_auth = 1;
    }
    return 0;
}

/* No line end within lim: more bytes may complete it, unless the header limit is reached. */
static int incomplete(int r, size_t len, char *err, size_t errlen) {
    if (r < 0) return fail(err, errlen, 400, "CR not followed by LF");
    if (len >= HTTP_MAX_HEADER)
        return fail(err, errlen, 431, "request headers longer than %d bytes", HTTP_MAX_HEADER);
    return 0;
}

/* http_parse_request, also telling http_read what the headers said (h) */
static int parse(const char *buf, size_t len, size_t max_body, HttpRequest *req, Headers *hp, char *err, size_t errlen) {
    Headers h = {0};
    size_t lim = len < HTTP_MAX_HEADER ? len : HTTP_MAX_HEADER, at = 0, eol = 0, next = 0;
    int r;
    memset(req, 0, sizeof *req);
    if (err && errlen) err[0] = 0;
    while ((r = next_line(buf, lim, at, &eol, &next)) == 1 && eol == at) at = next; /* blank lines first */
    if (r != 1) return incomplete(r, len, err, errlen);
    if ((r = request_line(buf + at, eol - at, req, &h, err, errlen)) < 0) return r;
    for (at = next; (r = next_line(buf, lim, at, &eol, &next)) == 1 && eol > at; at = next)
        if ((r = header_line(buf + at, eol - at, req, &h, err, errlen)) < 0) return r;
    if (r != 1) return incomplete(r, len, err, errlen);
    at = next; /* after the blank line: the body */
    h.head_len = at;
    *hp = h;
    if (h.has_te) return fail(err, errlen, 411, "Transfer-Encoding is not supported: send the body with a Content-Length");
    if (h.length > max_body || h.length > SIZE_MAX - at)
        return fail(err, errlen, 413, "body of %zu bytes is over the limit of %zu", h.length, max_body);
    req->keep_alive = h.minor == 1 ? !h.conn_close : h.conn_keep && !h.conn_close;
    if (len - at < h.length) return 0;
    req->body = h.length ? buf + at : NULL;
    req->body_len = h.length;
    req->total_len = at + h.length;
    return 1;
}

int http_parse_request(const char *buf, size_t len, size_t max_body, HttpRequest *req, char *err, size_t errlen) {
    Headers h;
    return parse(buf, len, max_body, req, &h, err, errlen);
}

/* ------------------------------------------------------------------------ */

int http_bearer_ok(const char *authorization, const char *key) {
    if (!authorization || !key || !key[0]) return 0; /* an empty key would let "Bearer " in */
    size_t alen = strlen(authorization);
    if (alen >= sizeof ((HttpRequest *)0)->authorization - 1) return 0; /* possibly truncated by the parser */
    if (alen < 7 || !word_is(authorization, 6, "bearer") || authorization[6] != ' ') return 0;
    const char *a = authorization + 7;
    while (*a == ' ') a++;
    alen = strlen(a);
    /* Over the longer of the two, whatever the contents: the time depends on the lengths
     * only, never on where the first differing byte is. */
    size_t klen = strlen(key), n = alen > klen ? alen : klen;
    volatile unsigned diff = alen != klen;
    for (size_t i = 0; i < n; i++) {
        unsigned x = i < alen ? (unsigned char)a[i] : 0, y = i < klen ? (unsigned char)key[i] : 0;
        diff |= x ^ y;
    }
    return diff == 0;
}

const char *http_reason(int status) {
    switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

/* ------------------------------------------------------------------------ */
/* Sockets */

int http_listen(const char *host, int port, char *err, size_t errlen) {
    char where[300], service[16];
    const char *h = host && host[0] ? host : NULL;
    snprintf(where, sizeof where, h && strchr(h, ':') ? "[%s]:%d" : "%s:%d", h ? h : "*", port);
    if (port < 0 || port > 65535) {
        fail(err, errlen, 0, "cannot listen on %s: port out of range", where);
        return -1;
    }
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints, *list;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV; /* NULL host: every interface */
    int rc = getaddrinfo(h, service, &hints, &list);
    if (rc) {
        fail(err, errlen, 0, "cannot listen on %s: %s", where, rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
        return -1;
    }
    int fd = -1, e = EADDRNOTAVAIL;
    for (struct addrinfo *a = list; a && fd < 0; a = a->ai_next) {
        int type = a->ai_socktype;
#ifdef SOCK_CLOEXEC
        type |= SOCK_CLOEXEC; /* a child the server might start must not inherit it */
#endif
        if ((fd = socket(a->ai_family, type, a->ai_protocol)) < 0) { e = errno; continue; }
        int one = 1; /* restart at once, while old connections sit in TIME_WAIT */
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0) break;
        e = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(list);
    if (fd < 0) fail(err, errlen, 0, "cannot listen on %s: %s", where, strerror(e));
    return fd;
}

void http_conn_init(HttpConn *c, int fd) {
    memset(c, 0, sizeof *c);
    c->fd = fd;
}

void http_conn_free(HttpConn *c) {
    free(c->buf);
    c->buf = NULL;
    c->len = c->cap = c->consumed = 0;
}

/* how many of s[0..n) from the start are in set */
static size_t strspn_n(const char *s, size_t n, const char *set) {
    size_t i = 0;
    while (i < n && s[i] && strchr(set, s[i])) i++;
    return i;
}

static long long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Room to receive into; the buffer doubles up to what one request may need (the parser
 * answers before a request outgrows it), plus a little for the next pipelined one. */
static int conn_room(HttpConn *c, size_t max_body, char *err, size_t errlen) {
    size_t limit = max_body > SIZE_MAX / 2 ? SIZE_MAX / 2 : HTTP_MAX_HEADER + max_body + 4096;
    if (c->len < c->cap) return 0;
    if (c->cap >= limit) return fail(err, errlen, 413, "request larger than %zu bytes", limit); /* not reached */
    size_t cap = c->cap ? c->cap * 2 : 4096;
    if (cap > limit) cap = limit;
    char *p = realloc(c->buf, cap);
    if (!p) return fail(err, errlen, 500, "out of memory for a request of %zu bytes", cap);
    c->buf = p;
    c->cap = cap;
    return 0;
}

int http_read(HttpConn *c, size_t max_body, int idle_ms, const volatile int *stop, HttpRequest *req, char *err,
              size_t errlen) {
    if (err && errlen) err[0] = 0;
    if (c->consumed) { /* drop the request answered last; keep what was pipelined after it */
        memmove(c->buf, c->buf + c->consumed, c->len - c->consumed);
        c->len -= c->consumed;
        c->consumed = 0;
    }
    long long last = now_ms(); /* the last time a byte came */
    int continued = 0;
    for (;;) {
        if (c->len) {
            Headers h = {0};
            int r = parse(c->buf, c->len, max_body, req, &h, err, errlen);
            if (r == 1) c->consumed = req->total_len;
            if (r) return r;
            /* curl sends "Expect: 100-continue" with bodies over 1 KB and waits a second
             * for this before sending the body anyway (RFC 9110 §10.1.1) */
            if (h.expect_continue && h.minor == 1 && h.head_len == c->len && !continued) {
                continued = 1;
                if (http_write_all(c->fd, "HTTP/1.1 100 Continue\r\n\r\n", 25)) return 0;
            }
        }
        if (stop && *stop) return 0;
        int r = conn_room(c, max_body, err, errlen);
        if (r) return r;
        int wait = 100; /* slices, so that *stop is seen within 100 ms */
        if (idle_ms > 0) {
            long long left = last + idle_ms - now_ms();
            if (left <= 0) { /* blank lines alone (the parser skips them) do not start a request */
                if (c->len == strspn_n(c->buf, c->len, "\r\n")) return 0;
                return fail(err, errlen, 408, "the request stalled: no byte for %d ms", idle_ms);
            }
            if (left < wait) wait = (int)left;
        }
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        int n = poll(&p, 1, wait);
        if (n < 0 && errno != EINTR) return 0;
        if (n <= 0) continue;
        ssize_t got = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
        if (got > 0) {
            c->len += (size_t)got;
            last = now_ms();
        } else if (got == 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
            return 0; /* closed or reset: nobody to answer */
        }
    }
}

int http_write_all(int fd, const void *data, size_t n) {
    const char *p = data;
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1; /* EPIPE, ECONNRESET, or a send timeout (EAGAIN) */
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int http_respond(int fd, int status, const char *content_type, const char *body, size_t len, int keep_alive,
                 const char *extra_headers) {
    Buf b = {0};
    buf_printf(&b, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: %s\r\n%s\r\n", status,
               http_reason(status), content_type ? content_type : "application/json", len,
               keep_alive ? "keep-alive" : "close", extra_headers ? extra_headers : "");
    /* one send for headers and a small body: two small writes would meet Nagle's algorithm
     * and the client's delayed ACK, 40 ms per response on a keep-alive connection */
    int together = len <= 65536;
    if (together && len) buf_put(&b, body, len);
    int r = b.oom ? -1 : http_write_all(fd, b.p, b.len);
    if (r == 0 && !together) r = http_write_all(fd, body, len);
    buf_free(&b);
    return r;
}

int http_respond_error(int fd, int status, const char *type, const char *param, const char *message, int keep_alive) {
    Buf b = {0};
    if (!message) message = http_reason(status);
    if (!type) type = status >= 500 ? "server_error" : "invalid_request_error";
    buf_puts(&b, "{\"error\":{\"message\":");
    buf_json_str(&b, message, strlen(message));
    buf_puts(&b, ",\"type\":");
    buf_json_str(&b, type, strlen(type));
    buf_puts(&b, ",\"param\":");
    if (param) buf_json_str(&b, param, strlen(param));
    else buf_puts(&b, "null");
    buf_puts(&b, ",\"code\":null}}");
    /* RFC 9110 §15.5.2: a 401 says which scheme it wants */
    int r = b.oom ? -1
                  : http_respond(fd, status, "application/json", b.p, b.len, keep_alive,
                                 status == 401 ? "WWW-Authenticate: Bearer\r\n" : NULL);
    buf_free(&b);
    return r;
}

int http_sse_start(int fd) {
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                               "Connection: close\r\n\r\n";
    /* events are small writes that must leave at once, not wait for the previous one's ACK
     * (Nagle); fails harmlessly on a socket that is not TCP */
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return http_write_all(fd, head, sizeof head - 1);
}

int http_sse_event(int fd, const char *data, size_t n) {
    Buf b = {0};
    buf_put(&b, "data: ", 6);
    /* a line break inside data would end the field: each line becomes its own "data:" line,
     * which the client joins back with '\n' (the SSE spec) */
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        if (data[i] != '\n' && data[i] != '\r') continue;
        if (i > run) buf_put(&b, data + run, i - run);
        buf_put(&b, "\ndata: ", 7);
        if (data[i] == '\r' && i + 1 < n && data[i + 1] == '\n') i++;
        run = i + 1;
    }
    if (n > run) buf_put(&b, data + run, n - run);
    buf_put(&b, "\n\n", 2);
    int r = b.oom ? -1 : http_write_all(fd, b.p, b.len);
    buf_free(&b);
    return r;
}

int http_peer_closed(int fd) {
    short ev = POLLIN;
#ifdef POLLRDHUP
    ev |= POLLRDHUP;
#endif
    struct pollfd p = {.fd = fd, .events = ev};
    int n;
    while ((n = poll(&p, 1, 0)) < 0 && errno == EINTR) {}
    if (n <= 0) return 0; /* nothing happened on it */
    if (p.revents & POLLNVAL) return 1;
    char c;
    ssize_t k;
    while ((k = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT)) < 0 && errno == EINTR) {}
    if (k > 0) return 0;  /* bytes wait (a pipelined request): still there */
    if (k == 0) return 1; /* end of stream */
    if (errno == EAGAIN || errno == EWOULDBLOCK) return (p.revents & (POLLHUP | POLLERR)) != 0;
    return 1; /* ECONNRESET and the like */
}
