/* tok_test.c - C-side checks of tokenizer.c, driven by tests/test_tokenizer.sh.
 * Every check prints one line "PASS ..." or "FAIL ..."; the exit code is 1 if any failed.
 * One load of TOKENIZER.json, then any of these steps in order:
 *
 *   tok_test TOKENIZER.json [parity CORPUS.jsonl IDS.jsonl]    ids == golden ids (HF Rust engine),
 *                                                             decode(encode(s)) == s, stream == decode
 *                           [split CORPUS.jsonl ENDS.jsonl]    pre-tokens == HF's pre-tokenizer (regex split)
 *                           [decode IDLISTS.jsonl TEXTS.jsonl] lossy decode == HF decode, stream == decode
 *                           [glm KNOWN-ANSWERS.json]           known answers, chat prompts, invalid UTF-8,
 *                                                             API, 100,000-character runs (GLM-5.2 only)
 *                           [fuzz SECONDS SEED]                random bytes into the encoder (run it
 *                                                             under ASan+UBSan), checks invariants */
#define _POSIX_C_SOURCE 200809L
#include "../../json.h"
#include "../../tokenizer.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

static int failures;

static void result(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void result(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    if (!ok) failures++;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_now(void) {   /* CPU time: robust on a busy machine */
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static Tokenizer *load(const char *path) {
    char err[512];
    Tokenizer *t = tokenizer_load(path, err, sizeof err);
    if (!t) {
        result(0, "load %s: %s", path, err);
        exit(1);
    }
    return t;
}

/* reads a whole line-oriented file into JSON values, one per line */
typedef struct { Json *v; size_t n; } Lines;

static Lines read_jsonl(const char *path) {
    Lines L = {0};
    FILE *f = fopen(path, "rb");
    if (!f) { result(0, "open %s", path); exit(1); }
    char *line = NULL, err[200];
    size_t cap = 0, vcap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) >= 0) {
        if (len && line[len - 1] == '\n') len--;
        if (L.n == vcap) L.v = realloc(L.v, (vcap = vcap ? 2 * vcap : 1024) * sizeof *L.v);
        if (json_parse(&L.v[L.n], line, (size_t)len, err, sizeof err)) {
            result(0, "%s line %zu: %s", path, L.n + 1, err);
            exit(1);
        }
        L.n++;
    }
    free(line);
    fclose(f);
    return L;
}

static void free_lines(Lines *L) {
    for (size_t i = 0; i < L->n; i++) json_free(&L->v[i]);
    free(L->v);
}

static int ids_equal(const int *ids, int n, const JsonValue *arr) {
    if (arr->type != JSON_ARRAY || (size_t)n != arr->n) return 0;
    const JsonValue *v = arr->child;
    for (int i = 0; i < n; i++, v = v->next)
        if (!v->is_uint || v->u64 != (uint64_t)ids[i]) return 0;
    return 1;
}

static int utf8_valid(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t l = c < 0x80 ? 1 : c >= 0xC2 && c < 0xE0 ? 2 : c >= 0xE0 && c < 0xF0 ? 3 : c >= 0xF0 && c < 0xF5 ? 4 : 0;
        if (!l || i + l > n) return 0;
        for (size_t k = 1; k < l; k++)
            if ((s[i + k] & 0xC0) != 0x80) return 0;
        if ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] > 0x9F) || (c == 0xF0 && s[i + 1] < 0x90) ||
            (c == 0xF4 && s[i + 1] > 0x8F))
            return 0;
        i += l;
    }
    return 1;
}

/* streams ids through the streaming decoder; returns malloc'd output; *chunks_ok = every
 * push returned whole UTF-8 characters */
static char *stream_all(const Tokenizer *t, const int *ids, int n, size_t *len, int *chunks_ok) {
    size_t cap = tokenizer_stream_out_max(t), total = 0, room = cap * ((size_t)n + 1);
    char *out = malloc(room + 1);
    TokenizerStream s;
    tokenizer_stream_init(&s);
    *chunks_ok = 1;
    for (int i = 0; i < n; i++) {
        size_t k = tokenizer_stream_push(&s, t, ids[i], out + total, cap);
        if (!utf8_valid((unsigned char *)out + total, k)) *chunks_ok = 0;
        total += k;
    }
    total += tokenizer_stream_flush(&s, out + total, cap);
    out[total] = 0;
    *len = total;
    return out;
}

static void print_ids(const char *label, const int *ids, int n) {
    printf("    %s:", label);
    for (int i = 0; i < n && i < 40; i++) printf(" %d", ids[i]);
    printf(n > 40 ? " ...\n" : "\n");
}

static void print_json_ids(const char *label, const JsonValue *arr) {
    printf("    %s:", label);
    int i = 0;
    for (const JsonValue *v = arr->child; v && i < 40; v = v->next, i++) printf(" %llu", (unsigned long long)v->u64);
    printf(arr->n > 40 ? " ...\n" : "\n");
}

/* ---------------------------------------------------------------- parity */

static int cmd_parity(const Tokenizer *t, const char *tok, const char *corpus, const char *golden) {
    Lines C = read_jsonl(corpus), G = read_jsonl(golden);
    if (C.n != G.n) { result(0, "parity %s: %zu strings but %zu golden lines", tok, C.n, G.n); return 1; }
    size_t ok = 0, rt_ok = 0, st_ok = 0, shown = 0, ntok = 0;
    for (size_t i = 0; i < C.n; i++) {
        const JsonValue *s = C.v[i].root;
        int *ids;
        char err[200];
        int n = tokenizer_encode(t, s->str, s->str_len, &ids, err, sizeof err);
        ntok += n > 0 ? (size_t)n : 0;
        if (n >= 0 && ids_equal(ids, n, G.v[i].root)) ok++;
        else if (shown++ < 5) {
            printf("    mismatch on line %zu (%zu bytes)\n", i + 1, s->str_len);
            print_ids("C   ", ids, n);
            print_json_ids("gold", G.v[i].root);
        }
        size_t dlen, slen;
        char *d = tokenizer_decode(t, ids, n, 0, &dlen);
        if (d && dlen == s->str_len && memcmp(d, s->str, dlen) == 0) rt_ok++;
        else if (shown++ < 5) printf("    round trip differs on line %zu\n", i + 1);
        int chunks_ok;
        char *st = stream_all(t, ids, n, &slen, &chunks_ok);
        if (d && chunks_ok && slen == dlen && memcmp(st, d, dlen) == 0) st_ok++;
        else if (shown++ < 5) printf("    stream differs on line %zu\n", i + 1);
        free(st);
        free(d);
        free(ids);
    }
    result(ok == C.n, "parity %s: %zu/%zu strings give the golden ids (%zu tokens)", tok, ok, C.n, ntok);
    result(rt_ok == C.n, "round trip %s: decode(encode(s)) == s for %zu/%zu strings", tok, rt_ok, C.n);
    result(st_ok == C.n, "stream %s: streamed chunks are whole characters and equal decode for %zu/%zu", tok, st_ok, C.n);
    free_lines(&C);
    free_lines(&G);
    return failures != 0;
}

/* ---------------------------------------------------------------- split */

static int cmd_split(const Tokenizer *t, const char *tok, const char *corpus, const char *golden) {
    Lines C = read_jsonl(corpus), G = read_jsonl(golden);
    size_t ok = 0, n = 0, shown = 0;
    for (size_t i = 0; i < C.n && i < G.n; i++) {
        const JsonValue *s = C.v[i].root, *want = G.v[i].root;
        if (want->type != JSON_ARRAY) continue;   /* null: the string contains an added token */
        n++;
        size_t *ends;
        int k = tokenizer_split(t, s->str, s->str_len, &ends), same = k >= 0 && (size_t)k == want->n;
        const JsonValue *v = want->child;
        for (int j = 0; same && j < k; j++, v = v->next) same = v->u64 == ends[j];
        if (same) ok++;
        else if (shown++ < 5) printf("    pre-tokens differ on line %zu\n", i + 1);
        free(ends);
    }
    result(C.n == G.n && ok == n && n > 0, "split %s: pre-tokens equal HF's on %zu/%zu strings without added tokens", tok, ok, n);
    free_lines(&C);
    free_lines(&G);
    return failures != 0;
}

/* ---------------------------------------------------------------- decode */

static int cmd_decode(const Tokenizer *t, const char *tok, const char *idlists, const char *texts) {
    Lines I = read_jsonl(idlists), T = read_jsonl(texts);
    size_t ok = 0, st_ok = 0;
    for (size_t i = 0; i < I.n && i < T.n; i++) {
        const JsonValue *arr = I.v[i].root, *want = T.v[i].root;
        int n = (int)arr->n, *ids = malloc((arr->n + 1) * sizeof *ids), k = 0;
        for (const JsonValue *v = arr->child; v; v = v->next) ids[k++] = (int)v->num;
        size_t dlen, slen;
        int chunks_ok;
        char *d = tokenizer_decode(t, ids, n, 0, &dlen);
        char *st = stream_all(t, ids, n, &slen, &chunks_ok);
        if (dlen == want->str_len && memcmp(d, want->str, dlen) == 0) ok++;
        else if (ok + 3 > i) printf("    decode differs on line %zu\n", i + 1);
        if (chunks_ok && slen == dlen && memcmp(st, d, dlen) == 0) st_ok++;
        free(d);
        free(st);
        free(ids);
    }
    result(I.n == T.n && ok == I.n, "decode %s: lossy decode equals HF on %zu/%zu id lists", tok, ok, I.n);
    result(I.n == T.n && st_ok == I.n, "stream decode %s: equals decode on %zu/%zu id lists", tok, st_ok, I.n);
    free_lines(&I);
    free_lines(&T);
    return failures != 0;
}

/* ---------------------------------------------------------------- GLM-specific checks */

static int parse_id_list(const char *s, int *ids) {
    int n = 0;
    char *end;
    for (long v; (v = strtol(s, &end, 10)), end != s; s = end) ids[n++] = (int)v;
    return n;
}

static int check_ids(const char *name, const int *got, int n, const char *want_list) {
    int want[256], m = parse_id_list(want_list, want);
    int ok = n == m && memcmp(got, want, (size_t)n * sizeof *got) == 0;
    result(ok, "%s", name);
    if (!ok) {
        print_ids("got ", got, n);
        print_ids("want", want, m);
    }
    return ok;
}

static void chat_case(const Tokenizer *t, const char *name, const ChatMessage *m, int n, const ChatOptions *o,
                      const char *want_text, const char *want_ids) {
    char err[200], *text = tokenizer_render_chat_text(m, n, o, 1, err, sizeof err);
    int ok = text && strcmp(text, want_text) == 0;
    result(ok, "chat text %s", name);
    if (!ok) printf("    got  %s\n    want %s\n", text ? text : err, want_text);
    free(text);
    int *ids, k = tokenizer_render_chat(t, m, n, o, 1, &ids, err, sizeof err);
    char label[200];
    snprintf(label, sizeof label, "chat ids %s", name);
    check_ids(label, ids, k, want_ids);
    free(ids);
}

static void split_case(const Tokenizer *t, const char *name, const char *s, size_t len, const char *want_ends) {
    size_t *ends;
    int n = tokenizer_split(t, s, len, &ends), want[64], m = parse_id_list(want_ends, want), ok = n == m;
    for (int i = 0; ok && i < n; i++) ok = ends[i] == (size_t)want[i];
    result(ok, "split %s", name);
    if (!ok) {
        printf("    got ends:");
        for (int i = 0; i < n; i++) printf(" %zu", ends[i]);
        printf("\n    want: %s\n", want_ends);
    }
    free(ends);
}

/* encode == concatenation of the given single-piece byte strings' tokens; and bytes round trip */
static void invalid_case(const Tokenizer *t, const char *name, const char *s, size_t len, const char *want_ends) {
    split_case(t, name, s, len, want_ends);
    int *ids, n = tokenizer_encode(t, s, len, &ids, NULL, 0);
    char *buf = malloc(len + 1);
    size_t k = 0;
    int ok = n >= 0;
    for (int i = 0; ok && i < n; i++) {
        const char *b;
        int l = tokenizer_token_bytes(t, ids[i], &b);
        ok = k + (size_t)l <= len;
        if (ok) memcpy(buf + k, b, (size_t)l), k += (size_t)l;
    }
    result(ok && k == len && memcmp(buf, s, len) == 0, "invalid UTF-8 %s: token bytes concatenate to the input", name);
    free(buf);
    free(ids);
}

static void time_case(const Tokenizer *t, const char *name, const char *unit, size_t n) {
    size_t ul = strlen(unit), len = ul * n;
    char *s = malloc(len + 1);
    for (size_t i = 0; i < n; i++) memcpy(s + i * ul, unit, ul);
    s[len] = 0;
    double t0 = cpu_now();
    int *ids, k = tokenizer_encode(t, s, len, &ids, NULL, 0);
    double dt = cpu_now() - t0;
    size_t dlen;
    char *d = tokenizer_decode(t, ids, k, 0, &dlen);
    /* generous bound: the reference needs 55-156 ms; a quadratic merge would need minutes */
    result(k > 0 && dt < 2.0 && dlen == len && memcmp(d, s, len) == 0, "long run %s: %zu x \"%s\" -> %d ids in %.1f ms CPU",
           name, n, unit[0] == 0x0a ? "\\n" : unit, k, dt * 1e3);
    free(d);
    free(ids);
    free(s);
}

static int cmd_glm(const Tokenizer *t, const char *known) {
    char err[200];
    int *ids, n;

    /* API */
    result(tokenizer_vocab_size(t) == 154856, "vocab size 154856 (got %d)", tokenizer_vocab_size(t));
    result(tokenizer_max_token_bytes(t) == 512, "longest token 512 bytes (got %d)", tokenizer_max_token_bytes(t));
    result(tokenizer_token_id(t, "<|user|>") == 154827 && tokenizer_token_id(t, "[gMASK]") == 154822 &&
               tokenizer_token_id(t, "</think>") == 154842 && tokenizer_token_id(t, "Hello") == 9703 &&
               tokenizer_token_id(t, " ") == 220 && tokenizer_token_id(t, "\n") == 198 &&
               tokenizer_token_id(t, "<|nonexistent|>") == -1 && tokenizer_token_id(t, "") == -1,
           "token ids by text");
    result(tokenizer_is_special(t, 154820) && tokenizer_is_special(t, 154837) && !tokenizer_is_special(t, 154841) &&
               !tokenizer_is_special(t, 9703) && !tokenizer_is_special(t, -1) && !tokenizer_is_special(t, 1 << 30),
           "special flags (154820..154837)");
    const char *b;
    result(tokenizer_token_bytes(t, 154860, &b) == 0 && tokenizer_token_bytes(t, -5, &b) == 0 &&
               tokenizer_token_bytes(t, 188, &b) == 1 && b[0] == 0 && tokenizer_token_bytes(t, 220, &b) == 1 && b[0] == ' ',
           "token bytes (unknown ids empty, 188 = NUL, 220 = space)");

    /* the 21 known answers */
    FILE *f = fopen(known, "rb");
    static char kbuf[1 << 16];
    size_t klen = f ? fread(kbuf, 1, sizeof kbuf, f) : 0;
    if (f) fclose(f);
    Json K;
    if (json_parse(&K, kbuf, klen, err, sizeof err)) { result(0, "read %s: %s", known, err); return 1; }
    int kn = 0, kok = 0;
    for (const JsonValue *p = K.root->child; p; p = p->next, kn++) {
        const JsonValue *s = p->child;
        n = tokenizer_encode(t, s->str, s->str_len, &ids, err, sizeof err);
        if (ids_equal(ids, n, s->next)) kok++;
        else printf("    known answer differs: %s\n", s->str);
        free(ids);
    }
    result(kn == 21 && kok == kn, "known answers: %d/%d", kok, kn);
    json_free(&K);

    /* docs/TOKENIZER.md §4.6 and §3.5 vectors */
    struct { const char *s; const char *ids; } v[] = {
        {"Hello   world  ", "9703 256 1879 256"},
        {"a\r\nb", "64 319 65"},
        {"a \r\n\t b", "64 2529 197 293"},
        {"  x", "220 856"},
        {"don't I'M 'super", "14995 944 358 27511 364 9518"},
        {"x'\xc5\xbfx", "87 6 153000 87"},
        {"1234567", "108714 100461 21 22"},
        {"\xd9\xa3\xd9\xa4\xd9\xa5\xd9\xa6", "152466 152467 152468 152469"},
        {"caf\xc3\xa9 cafe\xcc\x81", "924 58451 40702 53481"},
        {"\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5\x8d\xe0\xa4\xa4\xe0\xa5\x87", "59678 86522 77740 30366 97 34200"},
        {"\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c", "109377 3837 99011"},
        {"\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7", "151928 124564 151929 124564 151927"},
        {"$x _y @@z", "62538 716 88 22250 89"},
        {"\xc2\xa0x \xe3\x80\x80y", "4102 87 220 22382 88"},
        {"a.\n\nb", "64 382 65"},
        {"\xf0\x9f\x87\xba\xf0\x9f\x87\xb8", "9281 229 118 9281 229 116"},
        {"x<|user|>y", "87 154827 88"},
        {"Hello world", "9703 1879"},
        {" Hello world", "21873 1879"},
        {"12", "98886"},
        {"1234", "108714 19"},
        {"3.14159", "18 13 122804 102573"},
        {"\xf0\x9f\x98\x80", "152336"},
        {"I'm", "40 2776"},
        {"\n\n\n", "1406"},
    };
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        char name[80], shown[40];
        size_t k = 0;
        for (const char *c = v[i].s; *c && k + 3 < sizeof shown; c++) {   /* one line per result */
            if (*c == '\n' || *c == '\r' || *c == '\t') shown[k++] = '\\', shown[k++] = *c == '\n' ? 'n' : *c == '\r' ? 'r' : 't';
            else shown[k++] = *c;
        }
        shown[k] = 0;
        snprintf(name, sizeof name, "doc vector %zu (%s)", i + 1, shown);
        n = tokenizer_encode(t, v[i].s, strlen(v[i].s), &ids, err, sizeof err);
        check_ids(name, ids, n, v[i].ids);
        free(ids);
    }
    n = tokenizer_encode(t, "", 0, &ids, err, sizeof err);
    result(n == 0, "empty text gives no ids");
    free(ids);
    n = tokenizer_encode(t, "a\0b", 3, &ids, err, sizeof err);   /* NUL is an ordinary character */
    check_ids("NUL byte inside text", ids, n, "64 188 65");
    free(ids);
    int skip[] = {87, 154820, 88, 154841};
    char *d = tokenizer_decode(t, skip, 4, 1, NULL);
    result(d && strcmp(d, "xy<think>") == 0, "decode with skip_special drops only special tokens");
    free(d);

    /* chat prompts: docs/TOKENIZER.md §1.6 and §3.5; GLM-5.2's template (its own bytes, checked
     * against jinja2 in tests/test_chat_template.sh) */
    ChatOptions o;
    ChatMessage sys_hello[] = {{"system", "You are a helpful assistant.", NULL}, {"user", "Hello", NULL}};
    tokenizer_chat_defaults(&o);
    chat_case(t, "5.2 effort Max, thinking", sys_hello, 2, &o,
              "[gMASK]<sop><|system|>Reasoning Effort: Max<|system|>You are a helpful assistant.<|user|>Hello<|assistant|><think>",
              "154822 154824 154826 25062 287 29905 371 25 7487 154826 2610 525 264 10945 17821 13 154827 9703 154828 154841");
    chat_case(t, "defaults (opt NULL)", sys_hello, 2, NULL,
              "[gMASK]<sop><|system|>Reasoning Effort: Max<|system|>You are a helpful assistant.<|user|>Hello<|assistant|><think>",
              "154822 154824 154826 25062 287 29905 371 25 7487 154826 2610 525 264 10945 17821 13 154827 9703 154828 154841");
    o.thinking = 0;
    chat_case(t, "5.2 thinking off", sys_hello, 2, &o,
              "[gMASK]<sop><|system|>You are a helpful assistant.<|user|>Hello<|assistant|><think></think>",
              "154822 154824 154826 2610 525 264 10945 17821 13 154827 9703 154828 154841 154842");
    o.thinking = 1;
    o.effort = NULL;
    chat_case(t, "5/5.1 thinking", sys_hello, 2, &o,
              "[gMASK]<sop><|system|>You are a helpful assistant.<|user|>Hello<|assistant|><think>",
              "154822 154824 154826 2610 525 264 10945 17821 13 154827 9703 154828 154841");
    o.thinking = 0;
    o.glm51_empty = 1;
    chat_case(t, "5/5.1 thinking off", sys_hello, 2, &o,
              "[gMASK]<sop><|system|>You are a helpful assistant.<|user|>Hello<|assistant|></think>",
              "154822 154824 154826 2610 525 264 10945 17821 13 154827 9703 154828 154842");
    ChatMessage two[] = {{"user", "Answer with one word: What is two plus two?", NULL}};
    tokenizer_chat_defaults(&o);
    chat_case(t, "known prompt 1 (effort Max)", two, 1, &o,
              "[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>Answer with one word: What is two plus two?<|assistant|><think>",
              "154822 154824 154826 25062 287 29905 371 25 7487 154827 16127 448 825 3409 25 3555 374 1378 5519 1378 30 154828 154841");
    ChatMessage sky[] = {{"user", "The sky is blue", NULL}};
    o.thinking = 0;
    chat_case(t, "known prompt 2 (thinking off)", sky, 1, &o, "[gMASK]<sop><|user|>The sky is blue<|assistant|><think></think>",
              "154822 154824 154827 785 12877 374 6303 154828 154841 154842");
    ChatMessage hist[] = {{"user", "What is 2+2?", NULL}, {"assistant", " 4\n", "HIST_THINK_A"}, {"user", "Now what is 3+3?", NULL}};
    tokenizer_chat_defaults(&o);
    o.effort = NULL;
    chat_case(t, "history by default: earlier reasoning dropped (the template's clear_thinking)", hist, 3, &o,
              "[gMASK]<sop><|user|>What is 2+2?<|assistant|><think></think>4<|user|>Now what is 3+3?<|assistant|><think>",
              "154822 154824 154827 3838 374 220 17 10 17 30 154828 154841 154842 19 154827 7039 1128 374 220 18 10 18 30 154828 154841");
    o.clear_thinking = 0;   /* the published prompt was rendered with clear_thinking false */
    chat_case(t, "known prompt 3 (history keeps reasoning, clear_thinking 0)", hist, 3, &o,
              "[gMASK]<sop><|user|>What is 2+2?<|assistant|><think>HIST_THINK_A</think>4<|user|>Now what is 3+3?<|assistant|><think>",
              "154822 154824 154827 3838 374 220 17 10 17 30 154828 154841 39 3846 10620 11631 1566 154842 19 154827 7039 1128 374 220 18 10 18 30 154828 154841");
    o.clear_thinking = 1;
    chat_case(t, "history with clear_thinking", hist, 3, &o,
              "[gMASK]<sop><|user|>What is 2+2?<|assistant|><think></think>4<|user|>Now what is 3+3?<|assistant|><think>",
              "154822 154824 154827 3838 374 220 17 10 17 30 154828 154841 154842 19 154827 7039 1128 374 220 18 10 18 30 154828 154841");
    ChatMessage tool[] = {{"user", "weather?", NULL},
                          {"assistant", "<tool_call>get_weather<arg_key>city</arg_key><arg_value>SF</arg_value></tool_call>", "need weather"},
                          {"tool", "sunny", NULL}};
    o.clear_thinking = 1;   /* the reasoning is after the last user message: kept either way */
    chat_case(t, "known prompt 4 (tool call)", tool, 3, &o,
              "[gMASK]<sop><|user|>weather?<|assistant|><think>need weather</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>SF</arg_value></tool_call><|observation|><tool_response>sunny</tool_response><|assistant|><think>",
              "154822 154824 154827 15194 30 154828 154841 17027 9101 154842 154843 455 68852 154847 8923 154848 154849 28565 154850 154844 154829 154845 82 27208 154846 154828 154841");
    /* the same call as tool_calls (what the template builds from an OpenAI message) */
    ChatToolCall sf[] = {{"get_weather", "{\"city\": \"SF\"}"}};
    ChatMessage tool2[] = {{"user", "weather?", NULL}, {"assistant", NULL, "need weather", sf, 1}, {"tool", "sunny", NULL}};
    chat_case(t, "known prompt 4 from tool_calls", tool2, 3, &o,
              "[gMASK]<sop><|user|>weather?<|assistant|><think>need weather</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>SF</arg_value></tool_call><|observation|><tool_response>sunny</tool_response><|assistant|><think>",
              "154822 154824 154827 15194 30 154828 154841 17027 9101 154842 154843 455 68852 154847 8923 154848 154849 28565 154850 154844 154829 154845 82 27208 154846 154828 154841");
    ChatMessage brief[] = {{"system", "Be brief.", NULL}, {"user", "One?", NULL}, {"assistant", "First.", NULL}, {"user", "Two?", NULL}};
    o.thinking = 0;
    o.glm51_empty = 1;
    chat_case(t, "known prompt 5 (GLM-5.1 thinking off)", brief, 4, &o,
              "[gMASK]<sop><|system|>Be brief.<|user|>One?<|assistant|></think>First.<|user|>Two?<|assistant|></think>",
              "154822 154824 154826 3430 9809 13 154827 3966 30 154828 154842 5338 13 154827 11608 30 154828 154842");
    ChatMessage wizard[] = {{"wizard", "x", NULL}, {"tool", "r", NULL}};
    chat_case(t, "an unknown role is skipped (a tool result after it opens <|observation|>)", wizard, 2, NULL,
              "[gMASK]<sop><|system|>Reasoning Effort: Max<|observation|><tool_response>r</tool_response><|assistant|><think>",
              "154822 154824 154826 25062 287 29905 371 25 7487 154829 154845 81 154846 154828 154841");

    /* pre-tokenization of regex branches and invalid UTF-8 (see tokenizer.h) */
    split_case(t, "added token ends a gap", "x  <|user|>y", 12, "1 3 11 12");
    split_case(t, "white space before digit", " 2", 2, "1 2");
    split_case(t, "contraction after space", " 'super", 7, "2 7");
    split_case(t, "long s folds to s in contractions", "x'\xc5\xbfx", 5, "1 4 5");
    invalid_case(t, "lone 0xFF", "\xff", 1, "1");
    invalid_case(t, "bytes between letters", "x\xff\xfey", 4, "1 3 4");
    invalid_case(t, "invalid byte prefixes letters", "\xff" "abc", 4, "4");
    invalid_case(t, "truncated character after space", " \xe4\xbd", 3, "3");
    invalid_case(t, "surrogate encoding", "a\xed\xa0\x80" "b", 5, "1 4 5");
    invalid_case(t, "overlong encoding", "\xc0\xaf\xc1\xbf", 4, "4");
    invalid_case(t, "above U+10FFFF", "1\xf4\x90\x80\x80" "2", 6, "1 5 6");
    invalid_case(t, "stray continuation in digits", "12\x80" "34", 5, "2 3 5");
    invalid_case(t, "truncated emoji then space run", "\xf0\x9f\x98   x", 7, "3 5 7");
    invalid_case(t, "invalid byte after CR LF", "\r\n\xff", 3, "2 3");
    n = tokenizer_encode(t, "\xff", 1, &ids, err, sizeof err);
    result(n == 1 && tokenizer_token_bytes(t, ids[0], &b) == 1 && (unsigned char)b[0] == 0xFF, "0xFF encodes to its byte token");
    d = tokenizer_decode(t, ids, n, 0, NULL);
    result(d && strcmp(d, "\xef\xbf\xbd") == 0, "decoding an invalid byte gives U+FFFD");
    free(d);
    free(ids);

    /* streaming: an emoji split over byte tokens comes out whole, after its last byte */
    int emoji[] = {9281, 229, 118};   /* U+1F1FA as F0 9F | 87 | BA */
    TokenizerStream st;
    tokenizer_stream_init(&st);
    char out[4096];
    size_t l1 = tokenizer_stream_push(&st, t, emoji[0], out, sizeof out);
    size_t l2 = tokenizer_stream_push(&st, t, emoji[1], out, sizeof out);
    size_t l3 = tokenizer_stream_push(&st, t, emoji[2], out, sizeof out);
    result(l1 == 0 && l2 == 0 && l3 == 4 && memcmp(out, "\xf0\x9f\x87\xba", 4) == 0, "stream holds back a split character (%zu %zu %zu)", l1, l2, l3);
    l1 = tokenizer_stream_push(&st, t, 9281, out, sizeof out);
    l2 = tokenizer_stream_flush(&st, out, sizeof out);
    result(l1 == 0 && l2 == 3 && memcmp(out, "\xef\xbf\xbd", 3) == 0, "stream flush emits an unfinished character as U+FFFD");

    /* 100,000-character runs of one class must be fast (no quadratic merging) */
    time_case(t, "spaces", " ", 100000);
    time_case(t, "letters", "a", 100000);
    time_case(t, "digits", "7", 100000);
    time_case(t, "CJK", "\xe4\xbd\xa0", 100000);
    time_case(t, "punctuation", "!", 100000);
    time_case(t, "newlines", "\n", 100000);
    time_case(t, "letter pairs", "ab", 50000);
    time_case(t, "rare bytes", "\xc3\x97", 100000);
    return failures != 0;
}

/* ---------------------------------------------------------------- fuzz */

static uint64_t rng;
static uint32_t rnd(void) {   /* splitmix64 */
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}

static size_t put_cp(unsigned char *o, unsigned cp) {
    if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { o[0] = (unsigned char)(0xC0 | cp >> 6); o[1] = (unsigned char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12); o[1] = (unsigned char)(0x80 | ((cp >> 6) & 63));
        o[2] = (unsigned char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18); o[1] = (unsigned char)(0x80 | ((cp >> 12) & 63));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 63)); o[3] = (unsigned char)(0x80 | (cp & 63));
    return 4;
}

static int cmd_fuzz(const Tokenizer *t, double seconds, uint64_t seed) {
    static const char *frag[] = {"<|user|>", "<|user", "[gMASK]", "<think>", "</think>", "'s", "'LL", "'\xc5\xbf", "\r\n",
                                 "\n", " ", "\t", "\xc2\xa0", "\xe3\x80\x80", "\xcc\x81", "\xe2\x80\x8d", "'", "1", "a"};
    enum { CAP = 1 << 16 };
    unsigned char *buf = malloc(CAP + 64), *cat = malloc(CAP + 64);
    size_t cap = tokenizer_stream_out_max(t);
    char *sout = malloc(cap);
    rng = seed;
    double t0 = now();
    long iters = 0, bad = 0;
    size_t bytes = 0;
    while (now() - t0 < seconds) {
        size_t len = 0, target = rnd() % 9 == 0 ? rnd() % CAP : rnd() % 300;
        int mode = (int)(rnd() % 4);
        while (len < target) {
            uint32_t r = rnd() % 100;
            if (mode == 0 || r < 30) buf[len++] = (unsigned char)rnd();              /* raw bytes */
            else if (r < 60) len += put_cp(buf + len, rnd() % 0x80);
            else if (r < 80) len += put_cp(buf + len, rnd() % 0x110000);          /* incl. surrogates */
            else if (r < 95) {
                const char *f = frag[rnd() % (sizeof frag / sizeof *frag)];
                size_t fl = strlen(f), cut = rnd() % 4 == 0 ? rnd() % (fl + 1) : fl;   /* sometimes truncated */
                memcpy(buf + len, f, cut);
                len += cut;
            } else {
                size_t k = rnd() % 2000;
                unsigned char c = (unsigned char)rnd();
                for (size_t i = 0; i < k && len < CAP; i++) buf[len++] = c;
            }
        }
        if (len > CAP) len = CAP;
        int *ids;
        char err[100];
        int n = tokenizer_encode(t, (char *)buf, len, &ids, err, sizeof err);
        size_t k = 0;
        int ok = n >= 0;
        for (int i = 0; ok && i < n; i++) {
            const char *b;
            int l = tokenizer_token_bytes(t, ids[i], &b);
            ok = l > 0 && k + (size_t)l <= len;
            if (ok) memcpy(cat + k, b, (size_t)l), k += (size_t)l;
        }
        ok = ok && k == len && memcmp(cat, buf, len) == 0;
        /* streaming == decode, also with random (partly unknown) ids mixed in */
        if (ok && n > 0) ids[rnd() % (unsigned)n] = (int)(rnd() % 200000) - 1000;
        size_t dlen, slen = 0;
        char *d = n >= 0 ? tokenizer_decode(t, ids, n, 0, &dlen) : NULL;
        TokenizerStream st;
        tokenizer_stream_init(&st);
        for (int i = 0; ok && i < n; i++) {
            size_t l = tokenizer_stream_push(&st, t, ids[i], sout, cap);
            ok = slen + l <= dlen && memcmp(d + slen, sout, l) == 0;
            slen += l;
        }
        if (ok) {
            size_t l = tokenizer_stream_flush(&st, sout, cap);
            ok = slen + l == dlen && memcmp(d + slen, sout, l) == 0;
        }
        size_t *ends;
        int np = tokenizer_split(t, (char *)buf, len, &ends);
        ok = ok && np >= 0 && (np == 0 ? len == 0 : ends[np - 1] == len);
        for (int i = 1; ok && i < np; i++) ok = ends[i] > ends[i - 1];
        free(ends);
        if (!ok && bad++ < 3) printf("    invariant broken at iteration %ld (len %zu)\n", iters, len);
        free(d);
        free(ids);
        iters++;
        bytes += len;
    }
    result(bad == 0, "fuzz: %ld random inputs (%.1f MB) in %.0f s, seed %llu, %ld broken invariants", iters,
           (double)bytes / 1e6, seconds, (unsigned long long)seed, bad);
    free(buf);
    free(cat);
    free(sout);
    return failures != 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: see the comment at the top of tok_test.c\n");
        return 2;
    }
    double t0 = now();
    Tokenizer *t = load(argv[1]);
    printf("    loaded %s in %.3f s\n", argv[1], now() - t0);
    for (int i = 2; i < argc;) {
        const char *step = argv[i];
        if (strcmp(step, "parity") == 0 && i + 2 < argc) cmd_parity(t, argv[1], argv[i + 1], argv[i + 2]), i += 3;
        else if (strcmp(step, "split") == 0 && i + 2 < argc) cmd_split(t, argv[1], argv[i + 1], argv[i + 2]), i += 3;
        else if (strcmp(step, "decode") == 0 && i + 2 < argc) cmd_decode(t, argv[1], argv[i + 1], argv[i + 2]), i += 3;
        else if (strcmp(step, "glm") == 0 && i + 1 < argc) cmd_glm(t, argv[i + 1]), i += 2;
        else if (strcmp(step, "fuzz") == 0 && i + 2 < argc) cmd_fuzz(t, atof(argv[i + 1]), strtoull(argv[i + 2], NULL, 10)), i += 3;
        else {
            fprintf(stderr, "tok_test: bad step '%s'\n", step);
            return 2;
        }
    }
    tokenizer_free(t);
    return failures != 0;
}
