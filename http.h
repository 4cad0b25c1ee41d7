/* http.h - the little HTTP/1.1 that glm serve speaks (http.c): a request parser that is a
 * pure function of its bytes (fuzzed: fuzz/fuzz_http.c), a growable text buffer with a
 * JSON string writer, and the socket calls of a server (listen, read one request, write
 * a response or an event stream). Plain POSIX sockets, no other dependency.
 *
 * What is supported, and why no more: requests with a Content-Length body (or none);
 * keep-alive and pipelined requests on one connection; responses with a Content-Length,
 * or a Server-Sent-Events stream that ends by closing the connection (so no chunked
 * encoding either way). Chunked request bodies get 411 (OpenAI clients always send a
 * length). */
#ifndef GLM_HTTP_H
#define GLM_HTTP_H

#include <stddef.h>
#include <sys/types.h>

/* ------------------------------------------------------------------------ */
/* A growable byte buffer (responses, JSON bodies). On out-of-memory an append sets
 * oom = 1 and stops appending, so a server thread can answer 500 instead of exiting. */
typedef struct {
    char *p;          /* NUL-terminated when len > 0 */
    size_t len, cap;
    int oom;          /* an append failed: the content is truncated */
} Buf;
void buf_put(Buf *b, const void *data, size_t n);
void buf_puts(Buf *b, const char *s);
void buf_printf(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s[0..n) as a JSON string literal with its quotes. Control characters are escaped
 * (\n, \t, \u00XX...), '"' and '\\' too; bytes that are not valid UTF-8 become \ufffd,
 * so the output is always valid JSON whatever the bytes. Invalid means what Unicode's
 * Table 3-7 excludes (overlongs, surrogates, over U+10FFFF, truncated sequences, stray
 * continuation bytes); each maximal invalid subpart becomes one six-character escape
 * \ufffd (Unicode §3.9's recommended practice, as browsers and Python's "replace" do).
 * Valid multibyte characters, DEL and U+2028/9 are copied as they are. */
void buf_json_str(Buf *b, const char *s, size_t n);
void buf_free(Buf *b);

/* ------------------------------------------------------------------------ */
/* One parsed request. Pointers point into the caller's buffer. */
typedef struct {
    char method[16];          /* "GET", "POST", ... (as sent, at most 15 bytes) */
    char path[512];           /* the target's path, query string cut off ("/v1/models") */
    const char *body;         /* [body_len] bytes after the headers (NULL when 0) */
    size_t body_len;          /* = Content-Length */
    size_t total_len;         /* bytes of this request in the buffer: headers + body */
    int keep_alive;           /* HTTP/1.1 unless "Connection: close"; HTTP/1.0 only with "Connection: keep-alive" */
    char authorization[512];  /* the Authorization header's value, "" without one (longer: truncated, so it never matches:
                                 a value of 511+ bytes keeps its first 511, and http_bearer_ok refuses any that long) */
} HttpRequest;

/* Parses the request at the start of buf[0..len). Returns:
 *    1  a whole request (headers and its body) is there: req is filled
 *    0  not yet: more bytes are needed (nothing is wrong so far)
 *   <0  minus the HTTP status to answer, with a one-line reason in err:
 *       -400 malformed request line, header or Content-Length (not digits, twice with
 *            different values, overflow), header line without ':', bare LF/CR rules
 *            as described in http.c; -405 never (routing is the caller's);
 *       -411 Transfer-Encoding (chunked bodies are not supported);
 *       -413 Content-Length over max_body (known from the headers, before the body arrives);
 *       -414 a path (the target before '?') longer than 511 bytes (req->path's room);
 *       -431 headers longer than HTTP_MAX_HEADER bytes without their end;
 *       -505 a version other than HTTP/1.0 or HTTP/1.1.
 * Lines may end in CRLF or a bare LF; a CR followed by anything but LF is 400 at once.
 * The answer depends only on the bytes up to where it was decided: once a prefix of the
 * input gets 1 or an error, every longer input gets the same (fuzz/fuzz_http.c checks).
 * req is cleared first; its fields are meaningful only on 1.
 * Never reads outside buf[0..len); never allocates. */
#define HTTP_MAX_HEADER 16384
int http_parse_request(const char *buf, size_t len, size_t max_body, HttpRequest *req, char *err, size_t errlen);

/* 1 if the Authorization value is exactly "Bearer KEY", else 0; the comparison takes the
 * same time wherever the first difference is (no early exit: the key is a secret). The
 * scheme may be in any case and followed by several spaces (RFC 9110 §11.4); an empty
 * key and a value of 511 bytes or more (maybe truncated by the parser) never match. */
int http_bearer_ok(const char *authorization, const char *key);

/* The status line's words: 200 "OK", 400 "Bad Request", ... ("Error" for unknown codes). */
const char *http_reason(int status);

/* ------------------------------------------------------------------------ */
/* Sockets. */

/* A listening TCP socket on host:port (IPv4 dotted quad or a name getaddrinfo resolves,
 * SO_REUSEADDR), or -1 with a one-line reason in err.
 * host NULL or "": every interface; port 0: one the kernel picks, see getsockname; the
 * reason reads "cannot listen on 127.0.0.1:8080: Address already in use". */
int http_listen(const char *host, int port, char *err, size_t errlen);

/* One connection's read state: the bytes received and not yet consumed (pipelining). */
typedef struct {
    int fd;
    char *buf;                /* [cap] */
    size_t len, cap;
    size_t consumed;          /* bytes of the previous request, dropped at the next http_read */
} HttpConn;
void http_conn_init(HttpConn *c, int fd);
void http_conn_free(HttpConn *c);   /* frees the buffer; does not close fd */

/* Reads until one whole request is in c (http_parse_request's rules) and fills req.
 * Returns 1 (a request), 0 (the peer closed, or went idle for idle_ms before its first
 * byte, or *stop became non-zero while waiting: nothing to answer), or a negative
 * status as http_parse_request (the caller answers it and closes), -408 when a request
 * started but did not complete within idle_ms. Polls in slices of at most 100 ms so a
 * set *stop (may be NULL) is seen promptly.
 * idle_ms counts from the last byte received, so -408 means the request stalled for
 * idle_ms; idle_ms <= 0 waits without limit. -500 when the buffer cannot grow. req->body
 * points into c->buf and stays valid until the next http_read. An HTTP/1.1 request with
 * "Expect: 100-continue" gets "HTTP/1.1 100 Continue" once its headers are accepted (curl
 * sends it with large bodies and would otherwise wait a second). */
int http_read(HttpConn *c, size_t max_body, int idle_ms, const volatile int *stop, HttpRequest *req, char *err,
              size_t errlen);

/* Writes all of data[0..n) (MSG_NOSIGNAL: a closed peer is an error, never SIGPIPE).
 * Returns 0, or -1 when the peer is gone (or a send timeout set with SO_SNDTIMEO ran out). */
int http_write_all(int fd, const void *data, size_t n);

/* A whole response: status line, Content-Type, Content-Length, Connection (keep-alive or
 * close), extra_headers (each line ending in \r\n; may be NULL), then the body. 0 or -1.
 * content_type NULL: application/json. */
int http_respond(int fd, int status, const char *content_type, const char *body, size_t len, int keep_alive,
                 const char *extra_headers);
/* An OpenAI-style error: {"error": {"message": MESSAGE, "type": TYPE, "param": PARAM or
 * null, "code": null}} with that status. TYPE e.g. "invalid_request_error". 0 or -1.
 * Written without spaces; message NULL: http_reason(status); type NULL:
 * "invalid_request_error" below 500, "server_error" from 500; a 401 adds
 * "WWW-Authenticate: Bearer". */
int http_respond_error(int fd, int status, const char *type, const char *param, const char *message, int keep_alive);

/* Server-Sent Events: the headers (200, text/event-stream, no-cache, Connection: close),
 * then one event per call: "data: " + data + "\n\n". 0 or -1 (peer gone).
 * http_sse_start also sets TCP_NODELAY so that each event leaves at once. A line break
 * in data (CR, LF or CRLF) starts another "data: " line, which clients join back with LF. */
int http_sse_start(int fd);
int http_sse_event(int fd, const char *data, size_t n);

/* 1 if the peer has closed its side (or reset) the connection, without consuming any
 * bytes it may have sent (poll + MSG_PEEK); 0 otherwise. For noticing a client that went
 * away while its non-streaming request is still being generated.
 * A client that only shut down its sending side counts as gone; one with unread bytes
 * waiting (a pipelined request) does not, until they are read. */
int http_peer_closed(int fd);

#endif
