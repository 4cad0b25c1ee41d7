/* tokenizer.h - the GLM-5.2 tokenizer (byte-level BPE) read straight from a Hugging Face
 * tokenizer.json, with exact parity with the HF Rust engine (tokenizers 0.23.2).
 *
 * Encode pipeline (see docs/TOKENIZER.md):
 *   1. added tokens (36 for GLM: [gMASK], <|user|>, <think>, ...) are split out of the raw
 *      text first, leftmost-longest, and become their ids;
 *   2. each remaining gap goes through the GLM/cl100k split regex, implemented by hand
 *      (Unicode 16.0 class tables in tokenizer_unicode.h);
 *   3. each piece is looked up whole (ignore_merges), else merged by BPE rank (heap, O(k log k)).
 * No normalizer, no BOS/EOS. Decode maps ids back to bytes; text output is "lossy" UTF-8
 * (each maximal invalid sequence becomes one U+FFFD), as in HF.
 *
 * Invalid UTF-8 input: each byte that does not start a valid UTF-8 sequence (bad lead byte,
 * stray continuation, truncated/overlong sequence, surrogate, > U+10FFFF) counts as one
 * character of class "other" (like punctuation); it then byte-maps to its single-byte token
 * as usual. So encoding never fails on bytes, and decode(encode(s)) == s for any bytes s.
 *
 * Supported tokenizer.json: model BPE (merges as "a b" strings or ["a","b"] arrays,
 * ignore_merges true or false, no dropout / unk / prefixes), normalizer null, pre_tokenizer
 * Split(the GLM regex, Isolated) + ByteLevel(add_prefix_space false, use_regex false),
 * decoder ByteLevel, added tokens without lstrip/rstrip/single_word. That covers GLM-4.7 /
 * GLM-5.x and Llama-3. Anything else is refused at load with an error.
 *
 * All functions taking a const Tokenizer are thread-safe. */
#ifndef GLM_TOKENIZER_H
#define GLM_TOKENIZER_H

#include <stddef.h>

typedef struct Tokenizer Tokenizer;   /* opaque */

/* Loads a tokenizer.json. Returns NULL and a one-line error naming the file on failure. */
Tokenizer *tokenizer_load(const char *path, char *err, size_t errlen);
void tokenizer_free(Tokenizer *t);

/* Encodes text[0..len) (UTF-8; invalid bytes are handled as described above; NUL bytes are
 * ordinary characters). Returns the number of ids and sets *ids to a malloc'd array the
 * caller frees (NULL when 0 ids); returns -1 with err filled only when out of memory. */
int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int **ids, char *err, size_t errlen);

/* Pre-tokenization only (tests, debugging): the pieces BPE sees, as end offsets into text
 * (an added token is one piece). Returns the count and a malloc'd *ends, or -1 (out of memory). */
int tokenizer_split(const Tokenizer *t, const char *text, size_t len, size_t **ends);

/* Points *bytes at the raw bytes of token id (regular or added; not NUL-terminated) and
 * returns their count; 0 (and *bytes = "") for ids that are not in the table. */
int tokenizer_token_bytes(const Tokenizer *t, int id, const char **bytes);
/* Number of ids: 1 + the largest regular or added id (GLM-5.2: 154856). */
int tokenizer_vocab_size(const Tokenizer *t);
/* Id of an added token or vocab entry given its text (vocab entries by their raw bytes,
 * e.g. " the", not the byte-level form "Ġthe"); -1 if none. */
int tokenizer_token_id(const Tokenizer *t, const char *token_text);
/* 1 if id is an added token flagged "special" (GLM: 154820..154837), else 0. */
int tokenizer_is_special(const Tokenizer *t, int id);
/* The longest token in bytes (GLM-5.2: 512). */
int tokenizer_max_token_bytes(const Tokenizer *t);

/* Decodes ids to text (lossy UTF-8, unknown ids skipped, special tokens kept unless
 * skip_special). Returns a malloc'd NUL-terminated string (length in *len if not NULL),
 * NULL when out of memory. */
char *tokenizer_decode(const Tokenizer *t, const int *ids, int n, int skip_special, size_t *len);

/* Streaming decoder: feed ids one at a time and get back only complete UTF-8 characters;
 * an incomplete sequence at the end of a token is held back until a later token completes
 * it; a byte sequence that can no longer become valid is emitted as U+FFFD (one per maximal
 * invalid subpart, like HF's lossy decode). The concatenated output of push calls and the
 * final flush equals tokenizer_decode() of all ids.
 * out must hold at least tokenizer_stream_out_max(t) bytes (3 * (max token bytes + 3));
 * output never exceeds cap (a smaller cap truncates at a character boundary). */
typedef struct {
    unsigned char pending[4];   /* an incomplete but so far valid UTF-8 prefix */
    int npending;
} TokenizerStream;

void tokenizer_stream_init(TokenizerStream *s);
size_t tokenizer_stream_out_max(const Tokenizer *t);
size_t tokenizer_stream_push(TokenizerStream *s, const Tokenizer *t, int id, char *out, size_t cap);
/* Emits the held-back bytes (if any) as one U+FFFD; returns bytes written (0 or 3). */
size_t tokenizer_stream_flush(TokenizerStream *s, char *out, size_t cap);

/* Chat prompt rendering: GLM-5.2's own chat template (data/glm-5.2-tokenizer/chat_template.jinja),
 * byte for byte as Hugging Face renders it (jinja2 with trim_blocks and lstrip_blocks; tojson is
 * Python's json.dumps), for text content; tests/test_chat_template.sh compares with the template.
 *   [gMASK]<sop>  <|system|>Reasoning Effort: Max      (High for reasoning_effort "high"; thinking on only)
 *   tools:     <|system|>\n# Tools\n\n...<tools>\n{"name": ..., ...}\n...</tools>\n\n...</tool_call>
 *              (one line per tool, its "function" object if it has one, defer_loading and strict
 *              members left out, tools with a true defer_loading left out)
 *   system:    <|system|>CONTENT           user: <|user|>CONTENT
 *   assistant: <|assistant|><think>REASONING</think>ANSWER<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>...
 *              REASONING is kept for turns after the last user message (all turns with clear_thinking 0),
 *              else the turn gets <think></think>; ANSWER is the content stripped of white space
 *              (Python's str.strip); V is a string argument as is, any other value as json.dumps writes it
 *   tool:      <|observation|> (once per run of tool messages) <tool_response>CONTENT</tool_response>
 *   other roles: skipped
 *   generation prompt: <|assistant|><think> (thinking on) or <|assistant|><think></think> (off)
 * Reasoning is written as given (GLM-5.2 and 5.1 keep its white space). The rendered text is then
 * encoded like any text (so added-token strings inside content become added tokens, exactly as
 * HF's apply_chat_template + encode would do). */
typedef struct {
    const char *name;        /* the function's name */
    const char *arguments;   /* JSON text of an object {"KEY": VALUE, ...} (or of a string holding one, as
                                OpenAI sends it); rendered member by member, in order */
} ChatToolCall;

typedef struct {
    const char *role;        /* "system", "user", "assistant" or "tool"; any other (or NULL) is skipped */
    const char *content;     /* NULL = "" */
    const char *reasoning;   /* assistant: its reasoning_content; NULL = none, and then "R</think>A" inside
                                content is split into reasoning R (after the last <think>) and answer A */
    const ChatToolCall *tool_calls;   /* assistant: the calls it made, rendered after its answer */
    int n_tool_calls;
} ChatMessage;

typedef struct {
    int thinking;            /* enable_thinking: 1 (default) = effort line, prompt opens <think>; 0 = neither */
    const char *effort;      /* the effort line's value: "Max" (default), "High", or NULL = no line (GLM-5/5.1) */
    int clear_thinking;      /* 1 (default, as the template) = drop the reasoning of assistant turns before the
                                last user message; 0 = keep all reasoning */
    const char *tools;       /* JSON text of the tools list (OpenAI's {"type": "function", "function": {...}}
                                or the function objects themselves); NULL (or an empty list) = no tools block */
    int glm51_empty;         /* GLM-5/5.1: "</think>" as the empty marker (history and thinking-off prompt), but
                                "<think></think>" for an assistant turn after the last user message */
    int strip_reasoning;     /* GLM-5: kept reasoning stripped of white space at both ends */
} ChatOptions;

void tokenizer_chat_defaults(ChatOptions *opt);   /* thinking 1, effort "Max", clear_thinking 1, others 0/NULL */

/* Renders msgs (opt NULL = defaults) to text (malloc'd, NUL-terminated), or NULL + err when out of
 * memory or when tools / tool call arguments are not what the template can render (invalid JSON,
 * a tool that is not an object, arguments that are not an object, U+0000 in the output). */
char *tokenizer_render_chat_text(const ChatMessage *msgs, int n, const ChatOptions *opt,
                                 int add_generation_prompt, char *err, size_t errlen);
/* Same, encoded: returns the id count and a malloc'd *ids, or -1 + err. */
int tokenizer_render_chat(const Tokenizer *t, const ChatMessage *msgs, int n, const ChatOptions *opt,
                          int add_generation_prompt, int **ids, char *err, size_t errlen);

/* A conversation given as the template's variables in one JSON object (what `glm tokenize --chat
 * --jsonl` reads; an OpenAI chat request carries the same names):
 *   {"messages": [...], "tools": [...], "add_generation_prompt": bool, "enable_thinking": bool,
 *    "reasoning_effort": "high" | other, "clear_thinking": bool}
 * Each value means what it means to the template: a missing enable_thinking or clear_thinking is
 * true, any JSON value counts by Python's truth (0, "", [], null are false), only "high" gives
 * "High". Messages: role, content (a string; null, which jinja2 prints as "None"; or a list of
 * strings and {"type": "text", "text": ...} items, images and other media as the template's
 * markers), reasoning_content, tool_calls ({"function": {"name", "arguments"}} or {"name",
 * "arguments"}; arguments an object, or a string holding one); other members are ignored, a
 * message that is not an object or has no string role is skipped. Refused, with err naming the
 * field: content that is a number/bool/object, a tool_calls entry without a string name or object
 * arguments, U+0000 in a string the prompt copies, and with strict any other top-level member (a
 * typo would change nothing, silently; a server reading an OpenAI request passes strict 0). */
typedef struct {
    ChatMessage *msgs;
    int n;
    ChatOptions opt;
    int add_generation_prompt;
    void *own;               /* private: the memory msgs and opt point into */
} ChatRequest;

int tokenizer_chat_read_json(ChatRequest *req, const char *json, size_t len, int strict, char *err, size_t errlen);
void tokenizer_chat_request_free(ChatRequest *req);

/* Tool calls in the model's output (the answer, after </think>): each well-formed
 *   <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>
 * (white space allowed between the parts) becomes a ChatToolCall with arguments {"K": V, ...}: V's
 * own text where it parses as JSON (42, true, [1, 2], {"a": 1}, "s"), else V as a JSON string. With
 * tools (the same JSON text as ChatOptions.tools), an argument whose parameter is declared "type":
 * "string" always stays a string. Everything else is content (the text minus the well-formed
 * calls, as is), a malformed or unfinished call included, and a call whose name or key holds '<'
 * or whose value holds "<tool_call>", U+0000 or invalid UTF-8. Time is linear in len. Returns 0,
 * or -1 + err when tools is not valid JSON or when out of memory; never fails on the text. */
typedef struct {
    char *content;           /* malloc'd, NUL-terminated (content_len bytes; the text may hold NULs) */
    size_t content_len;
    ChatToolCall *calls;     /* n_calls calls in order; name and arguments malloc'd */
    int n_calls;
} ChatToolCalls;

int tokenizer_parse_tool_calls(const char *text, size_t len, const char *tools, ChatToolCalls *out,
                               char *err, size_t errlen);
void tokenizer_tool_calls_free(ChatToolCalls *tc);

/* The `glm tokenize` subcommand; argv[0] is "tokenize". Returns the exit code.
 *   tokenize -m DIR [--] "text"       ids, space-separated, one line ("--": text may start with '-')
 *   tokenize -m DIR --decode 1,2,3    the decoded text (lossy UTF-8) and a newline
 *   tokenize -m DIR --jsonl           stdin: one JSON string per line; stdout: one JSON array of ids per line
 *   tokenize --chat --jsonl [--ids -m DIR]   stdin: one conversation per line (tokenizer_chat_read_json);
 *                                     stdout: its prompt as a JSON string (json.dumps style, UTF-8), or
 *                                     with --ids its ids; a bad line: null, and one error line naming the
 *                                     line and field (exit code 1 at the end)
 *   --tokenizer FILE                  use FILE instead of DIR/tokenizer.json
 * Errors: one line "glm: error: ..." on stderr, exit code 1. */
int tokenize_main(int argc, char **argv);

#endif
