/* chat_test.c - C-side checks of the chat template code in tokenizer.c, driven by
 * tests/test_chat_template.sh (which compares the rendering itself with jinja2):
 *   - the GLM-5 / 5.1 options, which have no template in the repository to compare with;
 *   - the C API: tool_calls structs, OpenAI's string arguments, what is refused and how;
 *   - tokenizer_chat_read_json's errors (one line naming the field);
 *   - tokenizer_parse_tool_calls: well-formed calls, JSON values, the tools' "string" types,
 *     malformed or unfinished calls left as text, and rendering the parsed calls back;
 *   - random bytes and random mutations of tool-call text into the parser (run it under
 *     ASan + UBSan): it never fails, and what it returns renders.
 *   chat_test [SECONDS SEED]     the checks, then SECONDS (default 0) of random inputs
 * Every check prints one line "PASS ..." or "FAIL ..."; the exit code is 1 if any failed. */
#define _POSIX_C_SOURCE 200809L
#include "../../json.h"
#include "../../tokenizer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* Renders msgs with o (no generation prompt unless gen) and compares with want (NULL: must fail,
 * and the error must contain err_has). */
static void render_case(const char *name, const ChatMessage *m, int n, const ChatOptions *o, int gen,
                        const char *want, const char *err_has) {
    char err[300] = "";
    char *got = tokenizer_render_chat_text(m, n, o, gen, err, sizeof err);
    int ok = want ? got && strcmp(got, want) == 0 : !got && strstr(err, err_has) != NULL;
    result(ok, "render %s", name);
    if (!ok) printf("    got  %s\n    want %s\n", got ? got : err, want ? want : err_has);
    free(got);
}

/* ---------------------------------------------------------------- GLM-5 / 5.1 options */

static void variants(void) {
    ChatOptions o;
    ChatMessage after_user[] = {{"user", "q", NULL}, {"assistant", "a", NULL}};
    ChatMessage before_user[] = {{"assistant", "a", NULL}, {"user", "q", NULL}};
    tokenizer_chat_defaults(&o);
    o.effort = NULL;
    render_case("5.2: no reasoning after the last user message", after_user, 2, &o, 0, "[gMASK]<sop><|user|>q<|assistant|><think></think>a", NULL);
    o.glm51_empty = 1;
    render_case("5.1: no reasoning after the last user message still gets <think></think>", after_user, 2, &o, 0,
                "[gMASK]<sop><|user|>q<|assistant|><think></think>a", NULL);
    render_case("5.1: before the last user message </think>", before_user, 2, &o, 0, "[gMASK]<sop><|assistant|></think>a<|user|>q", NULL);
    o.thinking = 0;
    render_case("5.1: thinking-off prompt </think>", before_user, 2, &o, 1, "[gMASK]<sop><|assistant|></think>a<|user|>q<|assistant|></think>", NULL);

    ChatMessage ws[] = {{"user", "q", NULL}, {"assistant", " a ", "\n  R \n"}};
    tokenizer_chat_defaults(&o);
    render_case("5.2 keeps the white space of reasoning", ws, 2, &o, 0,
                "[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>q<|assistant|><think>\n  R \n</think>a", NULL);
    o.strip_reasoning = 1;
    o.effort = NULL;
    render_case("GLM-5 (strip_reasoning) strips it", ws, 2, &o, 0, "[gMASK]<sop><|user|>q<|assistant|><think>R</think>a", NULL);

    ChatMessage cleared[] = {{"user", "q", NULL}, {"assistant", "a", "R"}, {"user", "q2", NULL}};
    tokenizer_chat_defaults(&o);
    o.effort = "High";
    render_case("clear_thinking (default) drops earlier reasoning; effort High", cleared, 3, &o, 1,
                "[gMASK]<sop><|system|>Reasoning Effort: High<|user|>q<|assistant|><think></think>a<|user|>q2<|assistant|><think>", NULL);
    o.clear_thinking = 0;
    render_case("clear_thinking 0 keeps it", cleared, 3, &o, 1,
                "[gMASK]<sop><|system|>Reasoning Effort: High<|user|>q<|assistant|><think>R</think>a<|user|>q2<|assistant|><think>", NULL);
    ChatMessage inside[] = {{"user", "q", NULL}, {"assistant", "x<think>R1<think>R2</think>mid</think> A ", NULL}};
    render_case("reasoning inside the content is split out", inside, 2, &o, 0,
                "[gMASK]<sop><|system|>Reasoning Effort: High<|user|>q<|assistant|><think>R2</think>A", NULL);
}

/* ---------------------------------------------------------------- C API: tools and calls */

static void api(void) {
    ChatOptions o;
    tokenizer_chat_defaults(&o);
    o.effort = NULL;
    ChatToolCall obj[] = {{"f", "{\"s\": \"a b\", \"n\": [1,2.50,-0], \"o\": {\"k\":true}}"}};
    ChatToolCall str[] = {{"f", "\"{\\\"s\\\": \\\"a b\\\", \\\"n\\\": [1,2.50,-0], \\\"o\\\": {\\\"k\\\":true}}\""}};
    ChatMessage m1[] = {{"assistant", "", NULL, obj, 1}}, m2[] = {{"assistant", "", NULL, str, 1}};
    const char *want = "[gMASK]<sop><|assistant|><think></think><tool_call>f<arg_key>s</arg_key><arg_value>a b</arg_value>"
                       "<arg_key>n</arg_key><arg_value>[1, 2.5, 0]</arg_value><arg_key>o</arg_key><arg_value>{\"k\": true}</arg_value></tool_call>";
    render_case("tool call arguments as an object", m1, 1, &o, 0, want, NULL);
    render_case("tool call arguments as a string holding the object (OpenAI)", m2, 1, &o, 0, want, NULL);

    o.tools = "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"strict\": true, \"parameters\": {\"type\": \"object\"}}},"
              " {\"name\": \"g\", \"defer_loading\": true}, {\"name\": \"h\\u00e9\", \"defer_loading\": 0}]";
    ChatMessage none[1];
    render_case("tools block", none, 0, &o, 0,
                "[gMASK]<sop><|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
                "{\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}\n{\"name\": \"h\xc3\xa9\"}\n</tools>\n\n"
                "For each function call, output the function name and arguments within the following XML format:\n"
                "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>"
                "<arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>", NULL);
    o.tools = "[]";
    render_case("an empty tools list: no block", none, 0, &o, 0, "[gMASK]<sop>", NULL);

    o.tools = "[{\"name\": ";
    render_case("tools that are not JSON are refused", none, 0, &o, 0, NULL, "tools: invalid JSON");
    o.tools = "{\"name\": \"f\"}";
    render_case("tools that are not a list are refused", none, 0, &o, 0, NULL, "tools: expected an array");
    o.tools = "[{\"function\": null}]";
    render_case("a tool whose function is not an object is refused", none, 0, &o, 0, NULL, "tools[0].function");
    o.tools = NULL;
    ChatToolCall badargs[] = {{"f", "[1]"}}, noname[] = {{NULL, "{}"}}, nul[] = {{"f", "{\"k\\u0000\": 1}"}};
    ChatMessage b1[] = {{"assistant", "", NULL, badargs, 1}}, b2[] = {{"assistant", "", NULL, noname, 1}},
                b3[] = {{"assistant", "", NULL, nul, 1}};
    render_case("arguments that are not an object are refused", b1, 1, &o, 0, NULL, "tool call 0: arguments: expected a JSON object");
    render_case("a tool call without a name is refused", b2, 1, &o, 0, NULL, "no name");
    render_case("U+0000 in the output is refused", b3, 1, &o, 0, NULL, "U+0000");
}

/* ---------------------------------------------------------------- tokenizer_chat_read_json */

static void read_error(const char *name, const char *json, const char *err_has) {
    ChatRequest req;
    char err[300] = "";
    int rc = tokenizer_chat_read_json(&req, json, strlen(json), 1, err, sizeof err);
    int ok = rc == -1 && strstr(err, err_has) != NULL && !strchr(err, '\n');
    result(ok, "read_json refuses %s (%s)", name, err);
    if (rc == 0) tokenizer_chat_request_free(&req);
}

static void read_json(void) {
    const char *j = "{\"messages\": [{\"role\": \"user\", \"content\": [\"a\", {\"type\": \"text\", \"text\": \"b\"}, {\"type\": \"image\"}]},"
                    " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}}]}],"
                    " \"add_generation_prompt\": 1, \"enable_thinking\": \"\", \"reasoning_effort\": \"high\", \"clear_thinking\": null}";
    ChatRequest req;
    char err[300] = "";
    int rc = tokenizer_chat_read_json(&req, j, strlen(j), 1, err, sizeof err);
    char *text = rc == 0 ? tokenizer_render_chat_text(req.msgs, req.n, &req.opt, req.add_generation_prompt, err, sizeof err) : NULL;
    const char *want = "[gMASK]<sop><|user|>ab<|begin_of_image|><|image|><|end_of_image|><|assistant|><think>"
                       "</think>None<tool_call>f<arg_key>x</arg_key><arg_value>1</arg_value></tool_call><|assistant|><think></think>";
    result(text && strcmp(text, want) == 0 && !req.opt.thinking && req.opt.clear_thinking == 0 && req.add_generation_prompt,
           "read_json: content lists, null content, string arguments, truthiness of options");
    if (!text || strcmp(text, want)) printf("    got  %s\n    want %s\n", text ? text : err, want);
    free(text);
    if (rc == 0) tokenizer_chat_request_free(&req);

    const char *openai = "{\"model\": \"glm\", \"messages\": [], \"temperature\": 0}";
    rc = tokenizer_chat_read_json(&req, openai, strlen(openai), 0, err, sizeof err);
    result(rc == 0 && req.n == 0, "read_json with strict 0 ignores the other members of an OpenAI request");
    if (rc == 0) tokenizer_chat_request_free(&req);
    read_error("invalid JSON", "{\"messages\": [}", "invalid JSON");
    read_error("a line that is not an object", "[1]", "expected a JSON object");
    read_error("missing messages", "{\"tools\": []}", "messages: expected a list");
    read_error("an unknown field", "{\"messages\": [], \"enable_thinkng\": false}", "unknown field \"enable_thinkng\"");
    read_error("content that is a number", "{\"messages\": [{\"role\": \"user\"}, {\"role\": \"user\", \"content\": 5}]}", "messages[1].content");
    read_error("U+0000 in content", "{\"messages\": [{\"role\": \"user\", \"content\": \"a\\u0000b\"}]}", "messages[0].content: U+0000");
    read_error("a text item that is not a string", "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": 1}]}]}",
               "messages[0].content[0].text");
    read_error("tool results as output items", "{\"messages\": [{\"role\": \"tool\", \"content\": [{\"output\": \"x\"}]}]}", "messages[0].content");
    read_error("a string argument that is not an object", "{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"name\": \"f\", \"arguments\": \"[1]\"}]}]}",
               "messages[0].tool_calls[0].arguments: expected an object");
    read_error("tool_calls that is not a list", "{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": {\"a\": 1}}]}", "messages[0].tool_calls: expected a list");
    read_error("tools that is not a list", "{\"messages\": [], \"tools\": {\"a\": 1}}", "tools: expected a list");
}

/* ---------------------------------------------------------------- tokenizer_parse_tool_calls */

/* Parses text and checks the content and the calls ("name ARGS" each, NULL-terminated). */
static void parse_case(const char *name, const char *text, const char *tools, const char *content, const char *const *calls) {
    ChatToolCalls tc;
    char err[200] = "";
    int rc = tokenizer_parse_tool_calls(text, strlen(text), tools, &tc, err, sizeof err), n = 0, ok = rc == 0;
    while (calls[n]) n++;
    ok = ok && tc.n_calls == n && strcmp(tc.content, content) == 0 && tc.content_len == strlen(content);
    for (int i = 0; ok && i < n; i++) {
        char got[600];
        snprintf(got, sizeof got, "%s %s", tc.calls[i].name, tc.calls[i].arguments);
        ok = strcmp(got, calls[i]) == 0;
    }
    result(ok, "parse %s", name);
    if (!ok) {
        printf("    rc %d %s content [%s] (want [%s]), %d calls (want %d)\n", rc, err, rc ? "" : tc.content, content, rc ? 0 : tc.n_calls, n);
        for (int i = 0; rc == 0 && i < tc.n_calls; i++) printf("    got  %s %s\n", tc.calls[i].name, tc.calls[i].arguments);
        for (int i = 0; i < n; i++) printf("    want %s\n", calls[i]);
    }
    if (rc == 0) tokenizer_tool_calls_free(&tc);
}

#define CALLS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define NO_CALLS ((const char *const[]){NULL})

static void parse(void) {
    parse_case("plain text", "Just an answer.", NULL, "Just an answer.", NO_CALLS);
    parse_case("one call after text",
               "Let me check.<tool_call>get_weather<arg_key>city</arg_key><arg_value>SF</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>",
               NULL, "Let me check.", CALLS("get_weather {\"city\": \"SF\", \"days\": 3}"));
    parse_case("white space between the parts (GLM-4.5 style)",
               "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>[1, 2]</arg_value>\n</tool_call>\n<tool_call> g </tool_call>", NULL, "\n",
               CALLS("f {\"a\": [1, 2]}", "g {}"));
    parse_case("JSON values keep their text, others become strings",
               "<tool_call>f<arg_key>t</arg_key><arg_value>true</arg_value><arg_key>z</arg_key><arg_value> null </arg_value>"
               "<arg_key>o</arg_key><arg_value>{\"x\":1}</arg_value><arg_key>q</arg_key><arg_value>\"quoted\"</arg_value>"
               "<arg_key>big</arg_key><arg_value>1e400</arg_value><arg_key>s</arg_key><arg_value>a \"b\"\n\\c</arg_value>"
               "<arg_key>e</arg_key><arg_value></arg_value><arg_key>u</arg_key><arg_value>h\xc3\xa9\xf0\x9f\x98\x80</arg_value></tool_call>",
               NULL, "", CALLS("f {\"t\": true, \"z\": null, \"o\": {\"x\":1}, \"q\": \"quoted\", \"big\": 1e400, \"s\": \"a \\\"b\\\"\\n\\\\c\", \"e\": \"\", \"u\": \"h\xc3\xa9\xf0\x9f\x98\x80\"}"));
    const char *tools = "[{\"type\": \"function\", \"function\": {\"name\": \"zip\", \"parameters\": {\"type\": \"object\", \"properties\": "
                        "{\"code\": {\"type\": \"string\"}, \"n\": {\"type\": \"integer\"}, \"m\": {\"type\": [\"null\", \"string\"]}}}}}]";
    const char *zip = "<tool_call>zip<arg_key>code</arg_key><arg_value>12345</arg_value><arg_key>n</arg_key><arg_value>7</arg_value>"
                      "<arg_key>m</arg_key><arg_value>true</arg_value></tool_call>";
    parse_case("without tools a number-like string becomes a number", zip, NULL, "", CALLS("zip {\"code\": 12345, \"n\": 7, \"m\": true}"));
    parse_case("with tools a parameter of type string stays a string", zip, tools, "", CALLS("zip {\"code\": \"12345\", \"n\": 7, \"m\": \"true\"}"));
    parse_case("</tool_call> inside a value", "<tool_call>w<arg_key>c</arg_key><arg_value>a</tool_call>b</arg_value></tool_call>tail", NULL, "tail",
               CALLS("w {\"c\": \"a</tool_call>b\"}"));
    parse_case("two calls, text between and after", "A<tool_call>f</tool_call>B<tool_call>g<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>C",
               NULL, "ABC", CALLS("f {}", "g {\"k\": \"v\"}"));
    parse_case("an unfinished call is text", "x<tool_call>f<arg_key>a</arg_key><arg_value>1", NULL, "x<tool_call>f<arg_key>a</arg_key><arg_value>1", NO_CALLS);
    parse_case("a key without a value is text", "<tool_call>f<arg_key>a</arg_key></tool_call>", NULL, "<tool_call>f<arg_key>a</arg_key></tool_call>", NO_CALLS);
    parse_case("junk between the parts is text", "<tool_call>f<arg_key>a</arg_key>junk<arg_value>1</arg_value></tool_call>", NULL,
               "<tool_call>f<arg_key>a</arg_key>junk<arg_value>1</arg_value></tool_call>", NO_CALLS);
    parse_case("an empty name is text", "<tool_call> <arg_key>a</arg_key><arg_value>1</arg_value></tool_call>", NULL,
               "<tool_call> <arg_key>a</arg_key><arg_value>1</arg_value></tool_call>", NO_CALLS);
    parse_case("a malformed call, then a good one", "<tool_call><tool_call>f</tool_call>", NULL, "<tool_call>", CALLS("f {}"));
    parse_case("a <tool_call> inside a value is text", "<tool_call>f<arg_key>a</arg_key><arg_value>x<tool_call>y</arg_value></tool_call>", NULL,
               "<tool_call>f<arg_key>a</arg_key><arg_value>x<tool_call>y</arg_value></tool_call>", NO_CALLS);
    parse_case("invalid UTF-8 in a value is text", "<tool_call>f<arg_key>a</arg_key><arg_value>\xff</arg_value></tool_call>", NULL,
               "<tool_call>f<arg_key>a</arg_key><arg_value>\xff</arg_value></tool_call>", NO_CALLS);

    ChatToolCalls tc;
    char err[200] = "";
    result(tokenizer_parse_tool_calls("x", 1, "[{", &tc, err, sizeof err) == -1 && strstr(err, "tools: invalid JSON"), "parse refuses tools that are not JSON");
    const char nul[] = "a\0b<tool_call>f</tool_call>\0";
    int rc = tokenizer_parse_tool_calls(nul, sizeof nul - 1, NULL, &tc, err, sizeof err);
    result(rc == 0 && tc.content_len == 4 && memcmp(tc.content, "a\0b\0", 4) == 0 && tc.n_calls == 1, "parse keeps NUL bytes of the content (content_len)");
    if (rc == 0) tokenizer_tool_calls_free(&tc);

    /* hostile text (every call unfinished, or nested in the one before) takes linear time */
    static const char *const hostile[] = {"<tool_call>f<arg_key>k</arg_key><arg_value>", "<tool_call>f", "<tool_call>f<arg_key>",
                                          "<tool_call>f<arg_key>k</arg_key><arg_value>v</arg_value>"};
    for (int h = 0; h < 4; h++) {
        size_t n = 0, l = strlen(hostile[h]), cap = 1 << 20;
        char *big = malloc(cap);
        for (; n + l + 40 < cap; n += l) memcpy(big + n, hostile[h], l);
        memcpy(big + n, "</arg_value>junk</tool_call>", 28);
        clock_t t0 = clock();
        rc = tokenizer_parse_tool_calls(big, n + 28, NULL, &tc, err, sizeof err);
        double s = (double)(clock() - t0) / CLOCKS_PER_SEC;
        result(rc == 0 && tc.n_calls == 0 && tc.content_len == n + 28 && s < 2, "parse 1 MB of \"%s\"... in %.3f s CPU (linear: well under 2 s)", hostile[h], s);
        if (rc == 0) tokenizer_tool_calls_free(&tc);
        free(big);
    }

    /* what the model wrote, parsed and rendered back as history: the same text */
    const char *said = "<tool_call>search<arg_key>q</arg_key><arg_value>caf\xc3\xa9 \"x\"</arg_value><arg_key>n</arg_key><arg_value>[1, 2.5]</arg_value>"
                       "<arg_key>o</arg_key><arg_value>{\"a\": null}</arg_value></tool_call><tool_call>now</tool_call>";
    rc = tokenizer_parse_tool_calls(said, strlen(said), NULL, &tc, err, sizeof err);
    ChatMessage m = {"assistant", tc.content, NULL, tc.calls, tc.n_calls};
    ChatOptions o;
    tokenizer_chat_defaults(&o);
    o.effort = NULL;
    char *text = rc == 0 ? tokenizer_render_chat_text(&m, 1, &o, 0, err, sizeof err) : NULL;
    const char *prefix = "[gMASK]<sop><|assistant|><think></think>";
    result(text && strncmp(text, prefix, strlen(prefix)) == 0 && strcmp(text + strlen(prefix), said) == 0, "parsed calls render back to the same text");
    if (text && strcmp(text + strlen(prefix), said)) printf("    got  %s\n    want %s\n", text + strlen(prefix), said);
    free(text);
    if (rc == 0) tokenizer_tool_calls_free(&tc);
}

/* ---------------------------------------------------------------- random inputs */

/* Random text made of the parser's own tags, JSON bits and bytes: every call returned must have
 * a name and arguments that are a JSON object, render as history, and the content plus the
 * calls never exceed the input. */
static void fuzz(double seconds, unsigned seed) {
    static const char *const parts[] = {"<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
                                        "f", "key", " ", "\n", "1", "[1,", "]", "{\"a\":", "}", "\"s\"", "true", "<", "\xff", "\xc3\xa9", "\0", "e400"};
    srand(seed);
    time_t end = time(NULL) + (time_t)seconds;
    long runs = 0, calls = 0, bad = 0;
    char buf[512];
    while (time(NULL) < end || runs == 0) {
        size_t n = 0;
        for (int k = rand() % 40; k > 0; k--) {
            const char *p = parts[rand() % (int)(sizeof parts / sizeof *parts)];
            size_t l = *p ? strlen(p) : 1;
            if (rand() % 8 == 0) buf[n++] = (char)(rand() % 256), l = 0;
            if (n + l >= sizeof buf) break;
            memcpy(buf + n, p, l);
            n += l;
        }
        char *text = malloc(n ? n : 1);   /* exact size: ASan sees overreads */
        memcpy(text, buf, n);
        ChatToolCalls tc;
        char err[200];
        if (tokenizer_parse_tool_calls(text, n, rand() % 2 ? "[{\"name\": \"f\", \"parameters\": {\"properties\": {\"key\": {\"type\": \"string\"}}}}]" : NULL,
                                       &tc, err, sizeof err)) {
            bad++;
        } else {
            calls += tc.n_calls;
            bad += tc.content_len > n;
            ChatMessage m = {"assistant", tc.content, NULL, tc.calls, tc.n_calls};
            for (int i = 0; i < tc.n_calls; i++) {
                Json j;
                bad += !tc.calls[i].name[0] || json_parse(&j, tc.calls[i].arguments, strlen(tc.calls[i].arguments), NULL, 0) != 0;
                if (!bad) bad += j.root->type != JSON_OBJECT, json_free(&j);
            }
            char *r = tokenizer_render_chat_text(&m, 1, NULL, 1, err, sizeof err);
            bad += r == NULL && !strstr(err, "U+0000");   /* content may hold NUL bytes */
            free(r);
            tokenizer_tool_calls_free(&tc);
        }
        free(text);
        runs++;
    }
    result(bad == 0, "parse %ld random texts (%ld calls found): never fails, calls are named with object arguments and render", runs, calls);
}

int main(int argc, char **argv) {
    variants();
    api();
    read_json();
    parse();
    if (argc > 2) fuzz(atof(argv[1]), (unsigned)strtoul(argv[2], NULL, 10));
    return failures ? 1 : 0;
}
