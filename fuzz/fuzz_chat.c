/* fuzz_chat.c - libFuzzer target for the chat template code in tokenizer.c: the first byte
 * picks what the rest is,
 *   even: model output for tokenizer_parse_tool_calls (odd second bit: with a tools list that
 *         declares string parameters);
 *   odd:  a `glm tokenize --chat` line for tokenizer_chat_read_json (strict unless it starts with
 *         a space), rendered when it is read.
 * Besides "no crash, no leak, no sanitizer report": parsing never fails on the text, content
 * plus calls are never longer than the input, each call has a name and arguments that json_parse
 * reads as an object, and the calls render as history; a request that reads renders or fails
 * with an error message (never out of memory at these sizes). */
#include "../json.h"
#include "../tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char TOOLS[] = "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"properties\": "
                            "{\"k\": {\"type\": \"string\"}, \"n\": {\"type\": [\"string\", \"null\"]}}}}}, {\"name\": \"g\"}]";

static void parse(const char *text, size_t n, int with_tools) {
    ChatToolCalls tc;
    char err[256];
    if (tokenizer_parse_tool_calls(text, n, with_tools ? TOOLS : NULL, &tc, err, sizeof err)) abort();
    size_t used = tc.content_len;
    for (int i = 0; i < tc.n_calls; i++) {
        Json j;
        const char *a = tc.calls[i].arguments;
        if (!tc.calls[i].name[0] || json_parse(&j, a, strlen(a), NULL, 0)) abort();
        if (j.root->type != JSON_OBJECT) abort();
        json_free(&j);
        used += strlen(tc.calls[i].name);
    }
    if (used > n || tc.content[tc.content_len] != 0) abort();
    ChatMessage m = {.role = "assistant", .content = tc.content, .tool_calls = tc.calls, .n_tool_calls = tc.n_calls};
    char *r = tokenizer_render_chat_text(&m, 1, NULL, 1, err, sizeof err);
    if (!r && !memchr(tc.content, 0, tc.content_len)) abort();   /* only a NUL in the content may stop it */
    free(r);
    tokenizer_tool_calls_free(&tc);
}

static void request(const char *json, size_t n) {
    ChatRequest req;
    char err[256] = "";
    if (tokenizer_chat_read_json(&req, json, n, !n || json[0] != ' ', err, sizeof err)) {
        if (!err[0] || !strcmp(err, "out of memory")) abort();   /* (a field name may say anything) */
        return;
    }
    err[0] = 0;
    char *r = tokenizer_render_chat_text(req.msgs, req.n, &req.opt, req.add_generation_prompt, err, sizeof err);
    if ((!r && (!err[0] || !strcmp(err, "out of memory"))) || (r && strncmp(r, "[gMASK]<sop>", 12))) abort();
    free(r);
    tokenizer_chat_request_free(&req);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    char *text = malloc(size - 1 ? size - 1 : 1);   /* exact size: ASan sees overreads */
    memcpy(text, data + 1, size - 1);
    if (data[0] & 1) request(text, size - 1);
    else parse(text, size - 1, data[0] & 2);
    free(text);
    return 0;
}
