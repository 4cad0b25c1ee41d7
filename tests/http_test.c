/* http_test.c - known answers for http.c: every return code of http_parse_request, a body
 * split at every byte, pipelining, keep-alive rules, buf_json_str's escapes and U+FFFD
 * replacement, http_bearer_ok; then the socket calls over loopback (http_listen on a port
 * the kernel picks, http_read with pipelining, idle, stop and peer close, the responses
 * byte for byte, http_peer_closed). Built and run by tests/test_http.sh.
 * Prints PASS/FAIL per test and ends with "N passed, M failed". */
#define _GNU_SOURCE
#include "../http.h"
#include "../json.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int passed, failed;

static void check(const char *name, int ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void check(const char *name, int ok, const char *fmt, ...) {
    if (ok) {
        printf("PASS %s\n", name);
        passed++;
        return;
    }
    printf("FAIL %s: ", name);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    failed++;
}

/* Parses s (an exact-size heap copy, so ASan sees any read past the end). */
static int parse(const char *s, size_t n, size_t max_body, HttpRequest *req, char *err) {
    char *copy = malloc(n ? n : 1);
    memcpy(copy, s, n);
    int r = http_parse_request(copy, n, max_body, req, err, 256);
    if (r == 1 && req->body) req->body = s + (req->body - copy); /* point into s, which outlives copy */
    free(copy);
    return r;
}

static int parse_s(const char *s, size_t max_body, HttpRequest *req, char *err) {
    return parse(s, strlen(s), max_body, req, err);
}

/* One request that must give want. */
static void expect(const char *name, const char *s, size_t max_body, int want) {
    HttpRequest req;
    char err[256];
    int r = parse_s(s, max_body, &req, err);
    check(name, r == want && (r >= 0 || (err[0] && !strchr(err, '\n'))), "got %d (%s), want %d", r, err, want);
}

/* ---------------------------------------------------------------------------------- */

static void test_parse_basic(void) {
    HttpRequest req;
    char err[256];
    const char *get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    int r = parse_s(get, 1000, &req, err);
    check("parse_get", r == 1 && !strcmp(req.method, "GET") && !strcmp(req.path, "/health") && req.body == NULL &&
                           req.body_len == 0 && req.total_len == strlen(get) && req.keep_alive == 1 &&
                           req.authorization[0] == 0,
          "r=%d method=%s path=%s total=%zu ka=%d", r, req.method, req.path, req.total_len, req.keep_alive);

    const char *post = "POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\n"
                       "Authorization: Bearer sk-123\r\nContent-Length: 13\r\n\r\n{\"a\": \"b\"}\r\n!";
    size_t n = strlen(post), head = strstr(post, "\r\n\r\n") + 4 - post;
    int ok = 1;
    for (size_t k = 0; k <= n && ok; k++) { /* every prefix: 0 until the last byte, then the request */
        r = parse(post, k, 1 << 20, &req, err);
        if (k < n) ok = r == 0;
        else ok = r == 1 && req.body == post + head && req.body_len == 13 && req.total_len == n &&
                  !memcmp(req.body, "{\"a\": \"b\"}\r\n!", 13) && !strcmp(req.authorization, "Bearer sk-123") &&
                  !strcmp(req.path, "/v1/chat/completions") && !strcmp(req.method, "POST");
        if (!ok) printf("# prefix %zu: r=%d %s\n", k, r, err);
    }
    check("parse_post_split_at_every_byte", ok, "see above");

    /* pipelined: the first request's total_len is where the second begins */
    const char *two = "POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET /b?x=1 HTTP/1.1\r\n\r\n";
    r = parse_s(two, 100, &req, err);
    size_t t1 = req.total_len;
    ok = r == 1 && req.body_len == 3 && !memcmp(req.body, "abc", 3) && !strcmp(req.path, "/a");
    r = parse_s(two + t1, 100, &req, err);
    check("parse_pipelined", ok && r == 1 && !strcmp(req.path, "/b") && !strcmp(req.method, "GET") &&
                                 t1 + req.total_len == strlen(two),
          "r=%d path=%s", r, req.path);

    r = parse_s("POST /x HTTP/1.1\nContent-Length: 2\n\nhi", 10, &req, err);
    check("parse_lf_only", r == 1 && req.body_len == 2 && !memcmp(req.body, "hi", 2) && req.total_len == 38,
          "r=%d total=%zu", r, req.total_len);
    r = parse_s("GET / HTTP/1.1\r\nA: b\n\r\n", 10, &req, err);
    check("parse_mixed_line_ends", r == 1 && req.total_len == 23, "r=%d", r);
    r = parse_s("\r\n\nGET / HTTP/1.1\r\n\r\n", 10, &req, err);
    check("parse_leading_blank_lines", r == 1 && req.total_len == 21 && !strcmp(req.path, "/"), "r=%d", r);

    r = parse_s("GET /v1/models?limit=2&x=/y HTTP/1.1\r\n\r\n", 0, &req, err);
    check("parse_query_cut", r == 1 && !strcmp(req.path, "/v1/models"), "r=%d path=%s", r, req.path);
    r = parse_s("GET /?q HTTP/1.1\r\n\r\n", 0, &req, err);
    check("parse_query_root", r == 1 && !strcmp(req.path, "/"), "r=%d path=%s", r, req.path);

    r = parse_s("GET / HTTP/1.1\r\ncOnTeNt-LeNgTh:   0 \t\r\nx-y:\r\n\r\n", 0, &req, err);
    check("parse_header_case_and_ows", r == 1 && req.body_len == 0 && req.body == NULL, "r=%d %s", r, err);
    r = parse_s("POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nab", 10, &req, err);
    check("parse_duplicate_length_same", r == 1 && req.body_len == 2, "r=%d %s", r, err);
    r = parse_s("POST / HTTP/1.1\r\nContent-Length: 0005\r\n\r\nabcde", 10, &req, err);
    check("parse_length_leading_zeros", r == 1 && req.body_len == 5, "r=%d %s", r, err);
    r = parse_s("POST / HTTP/1.1\r\n\r\nabc", 10, &req, err);
    check("parse_no_length_no_body", r == 1 && req.body_len == 0 && req.total_len == 19, "r=%d", r);
    r = parse_s("PATCH-X_1 / HTTP/1.1\r\n\r\n", 0, &req, err);
    check("parse_method_token", r == 1 && !strcmp(req.method, "PATCH-X_1"), "r=%d", r);
    r = parse_s("ABCDEFGHIJKLMNO / HTTP/1.1\r\n\r\n", 0, &req, err);
    check("parse_method_15", r == 1 && !strcmp(req.method, "ABCDEFGHIJKLMNO"), "r=%d", r);
    r = parse_s("GET /caf\xc3\xa9 HTTP/1.1\r\nX: \xff\tv\r\n\r\n", 0, &req, err);
    check("parse_high_bytes_allowed", r == 1 && !strcmp(req.path, "/caf\xc3\xa9"), "r=%d %s", r, err);

    /* the 511-byte path fits, 512 is 414 */
    char line[2048];
    memset(line, 0, sizeof line);
    strcpy(line, "GET /");
    memset(line + 5, 'p', 510);
    strcat(line, "?q HTTP/1.1\r\n\r\n");
    r = parse_s(line, 0, &req, err);
    check("parse_path_511", r == 1 && strlen(req.path) == 511, "r=%d %s", r, err);
    memset(line, 0, sizeof line);
    strcpy(line, "GET /");
    memset(line + 5, 'p', 511);
    strcat(line, " HTTP/1.1\r\n\r\n");
    expect("parse_path_512_414", line, 0, -414);
}

static void test_keep_alive(void) {
    static const struct { const char *name, *req; int ka; } cases[] = {
        {"ka_11_default", "GET / HTTP/1.1\r\n\r\n", 1},
        {"ka_11_close", "GET / HTTP/1.1\r\nConnection: close\r\n\r\n", 0},
        {"ka_11_close_in_list", "GET / HTTP/1.1\r\nConnection: Upgrade , CLOSE\r\n\r\n", 0},
        {"ka_11_keep_alive", "GET / HTTP/1.1\r\nConnection: keep-alive\r\n\r\n", 1},
        {"ka_10_default", "GET / HTTP/1.0\r\n\r\n", 0},
        {"ka_10_keep_alive", "GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", 1},
        {"ka_10_keep_alive_close", "GET / HTTP/1.0\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n", 0},
        {"ka_10_not_a_token", "GET / HTTP/1.0\r\nConnection: keep-alive-ish\r\n\r\n", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        HttpRequest req;
        char err[256];
        int r = parse_s(cases[i].req, 0, &req, err);
        check(cases[i].name, r == 1 && req.keep_alive == cases[i].ka, "r=%d keep_alive=%d", r, req.keep_alive);
    }
}

static void test_parse_errors(void) {
    expect("incomplete_empty", "", 10, 0);
    expect("incomplete_line", "GET / HTTP/1.1", 10, 0);
    expect("incomplete_headers", "GET / HTTP/1.1\r\nHost: x\r\n", 10, 0);
    expect("incomplete_cr_at_end", "GET / HTTP/1.1\r", 10, 0);
    expect("incomplete_body", "POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nabcd", 10, 0);
    expect("bare_cr_request_line", "GET / HTTP/1.1\rX", 10, -400);
    expect("bare_cr_before_line_end", "GET /\rx", 10, -400); /* at once, without waiting for the LF */
    expect("bare_cr_header", "GET / HTTP/1.1\r\nA: b\rc\r\n\r\n", 10, -400);
    expect("cr_cr_lf", "GET / HTTP/1.1\r\r\n\r\n", 10, -400);
    expect("no_spaces", "GET\r\n\r\n", 10, -400);
    expect("http09", "GET /\r\n\r\n", 10, -400);
    expect("double_space", "GET  / HTTP/1.1\r\n\r\n", 10, -400);
    expect("trailing_space", "GET / HTTP/1.1 \r\n\r\n", 10, -400);
    expect("leading_space", " GET / HTTP/1.1\r\n\r\n", 10, -400);
    expect("tab_separator", "GET\t/ HTTP/1.1\r\n\r\n", 10, -400);
    expect("control_in_target", "GET /a\x01 HTTP/1.1\r\n\r\n", 10, -400);
    expect("del_in_target", "GET /a\x7f HTTP/1.1\r\n\r\n", 10, -400);
    expect("method_16", "ABCDEFGHIJKLMNOP / HTTP/1.1\r\n\r\n", 10, -400);
    expect("method_bad_char", "GE(T / HTTP/1.1\r\n\r\n", 10, -400);
    expect("target_star", "OPTIONS * HTTP/1.1\r\n\r\n", 10, -400);
    expect("target_absolute", "GET http://x/ HTTP/1.1\r\n\r\n", 10, -400);
    expect("version_lowercase", "GET / http/1.1\r\n\r\n", 10, -400);
    expect("version_garbage", "GET / HTTP/1.1x\r\n\r\n", 10, -400);
    expect("version_short", "GET / HTTP/1\r\n\r\n", 10, -400);
    expect("version_2_505", "GET / HTTP/2.0\r\n\r\n", 10, -505);
    expect("version_12_505", "GET / HTTP/1.2\r\n\r\n", 10, -505);
    expect("version_09_505", "GET / HTTP/0.9\r\n\r\n", 10, -505);
    expect("header_no_colon", "GET / HTTP/1.1\r\nHost x\r\n\r\n", 10, -400);
    expect("header_space_before_colon", "GET / HTTP/1.1\r\nHost : x\r\n\r\n", 10, -400);
    expect("header_empty_name", "GET / HTTP/1.1\r\n: x\r\n\r\n", 10, -400);
    expect("header_folded", "GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n", 10, -400);
    expect("header_control_in_value", "GET / HTTP/1.1\r\nA: b\x01\r\n\r\n", 10, -400);
    expect("header_nul_in_value", "GET / HTTP/1.1\r\nA: b\0c\r\n\r\n", 10, 0); /* strlen stops at the NUL */
    HttpRequest req;
    char err[256];
    int r = parse("GET / HTTP/1.1\r\nA: b\0c\r\n\r\n", 26, 10, &req, err);
    check("header_nul_in_value_400", r == -400, "got %d", r);
    expect("length_not_digits", "POST / HTTP/1.1\r\nContent-Length: 1a\r\n\r\n", 10, -400);
    expect("length_plus", "POST / HTTP/1.1\r\nContent-Length: +1\r\n\r\n", 10, -400);
    expect("length_negative", "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 10, -400);
    expect("length_hex", "POST / HTTP/1.1\r\nContent-Length: 0x1\r\n\r\n", 10, -400);
    expect("length_list", "POST / HTTP/1.1\r\nContent-Length: 1, 1\r\n\r\n", 10, -400);
    expect("length_inner_space", "POST / HTTP/1.1\r\nContent-Length: 1 1\r\n\r\n", 10, -400);
    expect("length_empty", "POST / HTTP/1.1\r\nContent-Length:\r\n\r\n", 10, -400);
    expect("length_overflow", "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", SIZE_MAX, -400);
    expect("length_size_max_413", "POST / HTTP/1.1\r\nContent-Length: 18446744073709551615\r\n\r\n", SIZE_MAX, -413);
    expect("length_twice_different", "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 10, -400);
    expect("413_before_body", "POST / HTTP/1.1\r\nContent-Length: 11\r\n\r\n", 10, -413);
    expect("413_huge", "POST / HTTP/1.1\r\nContent-Length: 1000000000000\r\n\r\n", 1 << 20, -413);
    expect("413_not_before_headers_end", "POST / HTTP/1.1\r\nContent-Length: 11\r\n", 10, 0);
    expect("length_equal_max", "POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789", 10, 1);
    expect("411_chunked", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 10, -411);
    expect("411_before_413", "POST / HTTP/1.1\r\nContent-Length: 99\r\nTransfer-Encoding: gzip\r\n\r\n", 10, -411);
    expect("auth_twice", "GET / HTTP/1.1\r\nAuthorization: Bearer a\r\nauthorization: Bearer b\r\n\r\n", 10, -400);

    /* 431: no end of the headers within HTTP_MAX_HEADER bytes */
    size_t n = HTTP_MAX_HEADER + 100;
    char *big = malloc(n + 1);
    memset(big, 'a', n);
    memcpy(big, "GET / HTTP/1.1\r\nX-Big: ", 23);
    big[n] = 0;
    r = parse(big, HTTP_MAX_HEADER - 1, 10, &req, err);
    check("431_not_yet", r == 0, "got %d", r);
    r = parse(big, HTTP_MAX_HEADER, 10, &req, err);
    check("431_at_limit", r == -431, "got %d", r);
    r = parse(big, n, 10, &req, err);
    check("431_past_limit", r == -431, "got %d", r);
    /* headers of exactly HTTP_MAX_HEADER bytes, blank line included, are fine */
    memcpy(big + HTTP_MAX_HEADER - 4, "\r\n\r\n", 4);
    r = parse(big, HTTP_MAX_HEADER, 10, &req, err);
    check("header_exactly_max", r == 1 && req.total_len == HTTP_MAX_HEADER, "got %d %s", r, err);
    memcpy(big + HTTP_MAX_HEADER - 4, "aa\r\n\r\n", 6);
    r = parse(big, n, 10, &req, err);
    check("header_max_plus_2_431", r == -431, "got %d", r);
    free(big);

    /* Authorization longer than the field: truncated, never accepted */
    char *h = malloc(2000);
    strcpy(h, "GET / HTTP/1.1\r\nAuthorization: Bearer ");
    size_t at = strlen(h);
    memset(h + at, 'k', 600);
    strcpy(h + at + 600, "\r\n\r\n");
    r = parse_s(h, 0, &req, err);
    char key[700];
    memset(key, 'k', 600);
    key[600] = 0;
    check("auth_truncated", r == 1 && strlen(req.authorization) == 511 && !http_bearer_ok(req.authorization, key) &&
                                !http_bearer_ok(req.authorization, key + 600 - 504),
          "r=%d len=%zu", r, strlen(req.authorization));
    free(h);
}

/* ---------------------------------------------------------------------------------- */

static void json_case(const char *name, const char *in, size_t n, const char *want) {
    Buf b = {0};
    buf_json_str(&b, in, n);
    int ok = b.len == strlen(want) && !memcmp(b.p, want, b.len) && !b.oom;
    Json j; /* and it is JSON */
    char err[200];
    int parsed = b.len && json_parse(&j, b.p, b.len, err, sizeof err) == 0;
    if (parsed) {
        ok = ok && j.root->type == JSON_STRING;
        json_free(&j);
    }
    check(name, ok && parsed, "got %s, want %s", b.p ? b.p : "(null)", want);
    buf_free(&b);
}
#define JCASE(name, lit, want) json_case(name, lit, sizeof lit - 1, want)

static void test_json_str(void) {
    JCASE("json_plain", "hello", "\"hello\"");
    json_case("json_empty", NULL, 0, "\"\"");
    JCASE("json_quote_backslash", "a\"b\\c/", "\"a\\\"b\\\\c/\"");
    JCASE("json_short_escapes", "\n\r\t\b\f", "\"\\n\\r\\t\\b\\f\"");
    JCASE("json_controls", "\x01\x1f\0\x7f", "\"\\u0001\\u001f\\u0000\x7f\"");
    JCASE("json_valid_multibyte", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf \xee\x80\x80",
          "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf \xee\x80\x80\"");
    /* the expected strings are Python's bytes.decode("utf-8", "replace") (maximal subparts) */
    JCASE("json_lone_continuation", "a\x80z", "\"a\\ufffdz\"");
    JCASE("json_two_continuations", "\x80\xbf", "\"\\ufffd\\ufffd\"");
    JCASE("json_overlong_c0", "\xc0\xaf", "\"\\ufffd\\ufffd\"");
    JCASE("json_overlong_e0", "\xe0\x80\xaf", "\"\\ufffd\\ufffd\\ufffd\"");
    JCASE("json_overlong_f0", "\xf0\x80\x80\xaf", "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");
    JCASE("json_surrogate", "\xed\xa0\x80", "\"\\ufffd\\ufffd\\ufffd\"");
    JCASE("json_over_10ffff", "\xf4\x90\x80\x80", "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");
    JCASE("json_f5", "\xf5\x80", "\"\\ufffd\\ufffd\"");
    JCASE("json_ff", "\xff", "\"\\ufffd\"");
    JCASE("json_truncated_3", "\xe2\x82", "\"\\ufffd\"");
    JCASE("json_truncated_4", "\xf0\x9f\x98", "\"\\ufffd\"");
    JCASE("json_truncated_then_ascii", "\xf0\x9f\x98x", "\"\\ufffdx\"");
    JCASE("json_truncated_then_valid", "\xe2\x82\xc3\xa9", "\"\\ufffd\xc3\xa9\"");
    JCASE("json_lead_lead", "\xc3\xc3\xa9", "\"\\ufffd\xc3\xa9\"");
    JCASE("json_e0_bad_second", "\xe0\x9f\x80", "\"\\ufffd\\ufffd\\ufffd\"");
    JCASE("json_quote_after_bad", "\xe2\"", "\"\\ufffd\\\"\"");
}

static void test_buf(void) {
    Buf b = {0};
    buf_puts(&b, "x=");
    buf_printf(&b, "%d,%s", 42, "y");
    int ok = b.len == 6 && !strcmp(b.p, "x=42,y");
    char big[5000];
    memset(big, 'z', sizeof big - 1);
    big[sizeof big - 1] = 0;
    buf_printf(&b, "[%s]", big);
    ok = ok && b.len == 6 + 5001 && b.p[b.len] == 0 && b.p[b.len - 1] == ']' && b.cap > b.len;
    buf_put(&b, "", 0);
    ok = ok && b.len == 6 + 5001 && !b.oom;
    check("buf_append", ok, "len=%zu", b.len);
    /* a request for more than memory can hold: oom, the content kept, later appends ignored */
    size_t len = b.len;
    buf_put(&b, big, SIZE_MAX / 2);
    buf_puts(&b, "more");
    buf_printf(&b, "%s", "more");
    check("buf_oom", b.oom == 1 && b.len == len && b.p[len] == 0 && !memcmp(b.p, "x=42,y[", 7), "oom=%d len=%zu", b.oom,
          b.len);
    buf_free(&b);
    check("buf_free", b.p == NULL && b.len == 0 && b.cap == 0 && b.oom == 0, "not reset");
}

static void test_bearer(void) {
    check("bearer_ok", http_bearer_ok("Bearer sk-abc", "sk-abc") == 1, "wrong answer");
    check("bearer_case_scheme", http_bearer_ok("bearer sk-abc", "sk-abc") == 1, "wrong answer");
    check("bearer_spaces", http_bearer_ok("Bearer   sk-abc", "sk-abc") == 1, "wrong answer");
    check("bearer_wrong_key", http_bearer_ok("Bearer sk-abd", "sk-abc") == 0, "wrong answer");
    check("bearer_key_case", http_bearer_ok("Bearer SK-ABC", "sk-abc") == 0, "wrong answer");
    check("bearer_prefix", http_bearer_ok("Bearer sk-ab", "sk-abc") == 0, "wrong answer");
    check("bearer_longer", http_bearer_ok("Bearer sk-abcd", "sk-abc") == 0, "wrong answer");
    check("bearer_empty_value", http_bearer_ok("", "sk-abc") == 0, "wrong answer");
    check("bearer_only_scheme", http_bearer_ok("Bearer ", "sk-abc") == 0, "wrong answer");
    check("bearer_empty_key", http_bearer_ok("Bearer ", "") == 0, "wrong answer");
    check("bearer_no_space", http_bearer_ok("Bearersk-abc", "sk-abc") == 0, "wrong answer");
    check("bearer_basic", http_bearer_ok("Basic sk-abc", "sk-abc") == 0, "wrong answer");
    check("bearer_null", http_bearer_ok(NULL, "k") == 0 && http_bearer_ok("Bearer k", NULL) == 0, "wrong answer");
    check("bearer_raw_key", http_bearer_ok("sk-abc", "sk-abc") == 0, "wrong answer");
    char v[700], k[600];
    memset(k, 'q', 503);
    k[503] = 0;
    snprintf(v, sizeof v, "Bearer %s", k);
    check("bearer_longest_key", strlen(v) == 510 && http_bearer_ok(v, k) == 1, "wrong answer");
    check("reasons", !strcmp(http_reason(200), "OK") && !strcmp(http_reason(404), "Not Found") &&
                         !strcmp(http_reason(413), "Content Too Large") && !strcmp(http_reason(431), "Request Header Fields Too Large") &&
                         !strcmp(http_reason(505), "HTTP Version Not Supported") && !strcmp(http_reason(299), "Error"),
          "wrong answer");
    static const int codes[] = {200, 400, 401, 404, 405, 408, 411, 413, 414, 429, 431, 500, 501, 503, 505};
    int all = 1;
    for (size_t i = 0; i < sizeof codes / sizeof *codes; i++) all = all && strcmp(http_reason(codes[i]), "Error");
    check("reasons_all_listed", all, "wrong answer");
}

/* ---------------------------------------------------------------------------------- */
/* Sockets over loopback */

static int listen_port(int *port) {
    char err[256];
    int fd = http_listen("127.0.0.1", 0, err, sizeof err);
    if (fd < 0) { printf("# %s\n", err); return -1; }
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &al);
    *port = ntohs(a.sin_port);
    return fd;
}

static int dial(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) { close(fd); return -1; }
    return fd;
}

/* a connected pair through the listener: *client and the accepted server side */
static int pair(int lfd, int port, int *client) {
    *client = dial(port);
    return accept(lfd, NULL, NULL);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* reads from fd until the peer closes or want bytes came (with a 2 s limit) */
static size_t read_some(int fd, char *out, size_t cap, size_t want) {
    size_t n = 0;
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    while (n < want && n < cap) {
        ssize_t k = recv(fd, out + n, cap - n, 0);
        if (k <= 0) break;
        n += (size_t)k;
    }
    return n;
}

typedef struct { int fd; const char *data; size_t n; } Writer;
static void *writer(void *arg) {
    Writer *w = arg;
    for (size_t i = 0; i < w->n; i += 7000) { /* in pieces, so http_read sees it arrive bit by bit */
        size_t k = w->n - i < 7000 ? w->n - i : 7000;
        if (http_write_all(w->fd, w->data + i, k)) break;
    }
    return NULL;
}

/* the client side of Expect: 100-continue: headers, wait for the 100, then the body */
typedef struct { int fd, got_continue; } Expecter;
static void *expecter(void *arg) {
    Expecter *e = arg;
    const char *head = "POST /e HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 4\r\n\r\n";
    char got[64] = {0};
    http_write_all(e->fd, head, strlen(head));
    struct timeval tv = {2, 0};
    setsockopt(e->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    size_t n = 0;
    while (n < 25) {
        ssize_t k = recv(e->fd, got + n, 25 - n, 0);
        if (k <= 0) break;
        n += (size_t)k;
    }
    e->got_continue = n == 25 && !strcmp(got, "HTTP/1.1 100 Continue\r\n\r\n");
    http_write_all(e->fd, "body", 4);
    return NULL;
}

static volatile int stop_flag;
static void *set_stop(void *arg) {
    (void)arg;
    usleep(150 * 1000);
    stop_flag = 1;
    return NULL;
}

static void test_sockets(void) {
    int port, lfd = listen_port(&port);
    check("listen_port_0", lfd >= 0 && port > 0, "fd=%d", lfd);
    if (lfd < 0) return;
    char err[256];
    int lfd2 = http_listen("127.0.0.1", port, err, sizeof err);
    char want[128];
    snprintf(want, sizeof want, "cannot listen on 127.0.0.1:%d: Address already in use", port);
    check("listen_in_use", lfd2 < 0 && !strcmp(err, want), "fd=%d err=%s", lfd2, err);
    if (lfd2 >= 0) close(lfd2);
    lfd2 = http_listen("127.0.0.1", 70000, err, sizeof err);
    check("listen_bad_port", lfd2 < 0 && strstr(err, "cannot listen on 127.0.0.1:70000: "), "err=%s", err);

    /* a pipelined pair in one write, then the client closes */
    int cfd, sfd = pair(lfd, port, &cfd);
    HttpConn c;
    HttpRequest req;
    http_conn_init(&c, sfd);
    const char *two = "POST /a HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloGET /b HTTP/1.1\r\nConnection: close\r\n\r\n";
    http_write_all(cfd, two, strlen(two));
    int r1 = http_read(&c, 100, 2000, NULL, &req, err, sizeof err);
    int ok1 = r1 == 1 && !strcmp(req.path, "/a") && req.body_len == 5 && !memcmp(req.body, "hello", 5);
    check("peer_open", http_peer_closed(sfd) == 0, "wrong answer");
    int r2 = http_read(&c, 100, 2000, NULL, &req, err, sizeof err);
    check("read_pipelined", ok1 && r2 == 1 && !strcmp(req.path, "/b") && req.keep_alive == 0, "r1=%d r2=%d", r1, r2);
    /* pending bytes (a request not read yet) are not a close */
    http_write_all(cfd, "GET", 3);
    usleep(20000);
    check("peer_data_pending_not_closed", http_peer_closed(sfd) == 0, "wrong answer");
    close(cfd);
    usleep(20000);
    check("peer_data_then_close_not_closed", http_peer_closed(sfd) == 0, "unread bytes come first");
    int r3 = http_read(&c, 100, 2000, NULL, &req, err, sizeof err);
    check("read_peer_closed_midway", r3 == 0, "r=%d", r3);
    check("peer_closed", http_peer_closed(sfd) == 1, "wrong answer");
    http_conn_free(&c);
    close(sfd);

    /* close before any byte: 0 */
    sfd = pair(lfd, port, &cfd);
    http_conn_init(&c, sfd);
    shutdown(cfd, SHUT_WR);
    usleep(20000);
    check("peer_half_closed", http_peer_closed(sfd) == 1, "wrong answer");
    r1 = http_read(&c, 100, 2000, NULL, &req, err, sizeof err);
    check("read_peer_closed", r1 == 0, "r=%d", r1);
    http_conn_free(&c);
    close(sfd);
    close(cfd);

    /* idle before the first byte: 0; a request that stalls: -408 */
    sfd = pair(lfd, port, &cfd);
    http_conn_init(&c, sfd);
    double t0 = now();
    r1 = http_read(&c, 100, 200, NULL, &req, err, sizeof err);
    double dt = now() - t0;
    check("read_idle", r1 == 0 && dt > 0.15 && dt < 1.0, "r=%d after %.3f s", r1, dt);
    http_write_all(cfd, "\r\n\n", 3); /* blank lines are not a request yet */
    r1 = http_read(&c, 100, 200, NULL, &req, err, sizeof err);
    check("read_idle_after_blank_lines", r1 == 0, "r=%d", r1);
    http_write_all(cfd, "GET / HT", 8);
    t0 = now();
    r1 = http_read(&c, 100, 200, NULL, &req, err, sizeof err);
    dt = now() - t0;
    check("read_408", r1 == -408 && dt > 0.15 && dt < 1.0 && err[0], "r=%d after %.3f s (%s)", r1, dt, err);
    http_conn_free(&c);
    close(sfd);
    close(cfd);

    /* *stop ends the wait within a slice, partial request or not */
    sfd = pair(lfd, port, &cfd);
    http_conn_init(&c, sfd);
    http_write_all(cfd, "GET", 3);
    pthread_t th;
    stop_flag = 0;
    pthread_create(&th, NULL, set_stop, NULL);
    t0 = now();
    r1 = http_read(&c, 100, 0, &stop_flag, &req, err, sizeof err);
    dt = now() - t0;
    pthread_join(th, NULL);
    check("read_stop", r1 == 0 && dt > 0.1 && dt < 0.5, "r=%d after %.3f s", r1, dt);
    http_conn_free(&c);
    close(sfd);
    close(cfd);

    /* 413 as soon as the headers are in, without waiting for the body */
    sfd = pair(lfd, port, &cfd);
    http_conn_init(&c, sfd);
    http_write_all(cfd, "POST / HTTP/1.1\r\nContent-Length: 1000\r\n\r\nab", 43);
    t0 = now();
    r1 = http_read(&c, 100, 5000, NULL, &req, err, sizeof err);
    dt = now() - t0;
    check("read_413_early", r1 == -413 && dt < 1.0, "r=%d after %.3f s", r1, dt);
    http_conn_free(&c);
    close(sfd);
    close(cfd);

    /* a 1 MB body arriving in pieces, then a pipelined request after it */
    sfd = pair(lfd, port, &cfd);
    http_conn_init(&c, sfd);
    size_t blen = 1 << 20;
    char *msg = malloc(blen + 200);
    int h = sprintf(msg, "POST /big HTTP/1.1\r\nContent-Length: %zu\r\n\r\n", blen);
    for (size_t i = 0; i < blen; i++) msg[h + i] = (char)('a' + i % 26);
    strcpy(msg + h + blen, "GET /next HTTP/1.1\r\n\r\n");
    Writer w = {cfd, msg, h + blen + 22};
    pthread_create(&th, NULL, writer, &w);
    r1 = http_read(&c, blen, 5000, NULL, &req, err, sizeof err);
    ok1 = r1 == 1 && req.body_len == blen && !memcmp(req.body, msg + h, blen);
    r2 = http_read(&c, blen, 5000, NULL, &req, err, sizeof err);
    pthread_join(th, NULL);
    check("read_big_body_then_pipelined", ok1 && r2 == 1 && !strcmp(req.path, "/next") && c.cap <= HTTP_MAX_HEADER + blen + 4096,
          "r1=%d r2=%d cap=%zu", r1, r2, c.cap);
    free(msg);
    http_conn_free(&c);
    close(sfd);
    close(cfd);

    /* Expect: 100-continue gets its interim answer once the headers are in */
    sfd = pair(lfd, port, &cfd);
    http_conn_init(&c, sfd);
    Expecter ex = {cfd, 0};
    pthread_create(&th, NULL, expecter, &ex);
    r1 = http_read(&c, 100, 3000, NULL, &req, err, sizeof err);
    pthread_join(th, NULL);
    check("read_expect_100_continue", r1 == 1 && ex.got_continue && req.body_len == 4 && !memcmp(req.body, "body", 4),
          "r=%d continue=%d", r1, ex.got_continue);
    http_conn_free(&c);
    close(sfd);
    close(cfd);

    /* responses, byte for byte */
    char got[4096];
    size_t n;
    sfd = pair(lfd, port, &cfd);
    const char *e1 = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nConnection: keep-alive\r\nX-A: 1\r\n\r\nok";
    int rr = http_respond(sfd, 200, "text/plain", "ok", 2, 1, "X-A: 1\r\n");
    n = read_some(cfd, got, sizeof got, strlen(e1));
    check("respond", rr == 0 && n == strlen(e1) && !memcmp(got, e1, n), "got %.*s", (int)n, got);
    const char *e2body = "{\"error\":{\"message\":\"bad \\\"x\\\"\",\"type\":\"invalid_request_error\",\"param\":\"messages\",\"code\":null}}";
    char e2[512];
    snprintf(e2, sizeof e2, "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
             strlen(e2body), e2body);
    rr = http_respond_error(sfd, 400, "invalid_request_error", "messages", "bad \"x\"", 0);
    n = read_some(cfd, got, sizeof got, strlen(e2));
    check("respond_error", rr == 0 && n == strlen(e2) && !memcmp(got, e2, n), "got %.*s", (int)n, got);
    const char *e3body = "{\"error\":{\"message\":\"Invalid API key\",\"type\":\"authentication_error\",\"param\":null,\"code\":null}}";
    char e3[512];
    snprintf(e3, sizeof e3, "HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: keep-alive\r\n"
             "WWW-Authenticate: Bearer\r\n\r\n%s", strlen(e3body), e3body);
    rr = http_respond_error(sfd, 401, "authentication_error", NULL, "Invalid API key", 1);
    n = read_some(cfd, got, sizeof got, strlen(e3));
    check("respond_error_401_null_param", rr == 0 && n == strlen(e3) && !memcmp(got, e3, n), "got %.*s", (int)n, got);
    const char *e4 = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n"
                     "data: {\"a\":1}\n\ndata: x\ndata: y\ndata: z\n\ndata: [DONE]\n\n";
    rr = http_sse_start(sfd) | http_sse_event(sfd, "{\"a\":1}", 7) | http_sse_event(sfd, "x\ny\r\nz", 6) |
         http_sse_event(sfd, "[DONE]", 6);
    n = read_some(cfd, got, sizeof got, strlen(e4));
    check("sse", rr == 0 && n == strlen(e4) && !memcmp(got, e4, n), "got %.*s", (int)n, got);
    /* a write to a closed peer fails, no SIGPIPE */
    close(cfd);
    usleep(20000);
    check("peer_closed_after_close", http_peer_closed(sfd) == 1, "wrong answer");
    int wr = 0;
    for (int i = 0; i < 50 && wr == 0; i++) {
        wr = http_sse_event(sfd, "more", 4);
        usleep(2000);
    }
    check("write_closed_peer", wr == -1, "wrong answer");
    close(sfd);
    close(lfd);
}

int main(void) {
    test_parse_basic();
    test_keep_alive();
    test_parse_errors();
    test_json_str();
    test_buf();
    test_bearer();
    test_sockets();
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
