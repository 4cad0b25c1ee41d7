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

/* Chat prompt rendering (GLM-5.2 format, docs/TOKENIZER.md §1.6; details UNCERTAIN, see there):
 *   [gMASK]<sop>  [<|system|>Reasoning Effort: EFFORT]   (only if thinking && effort)
 *   system:    <|system|>CONTENT
 *   user:      <|user|>CONTENT
 *   assistant: <|assistant|><think>REASONING</think>CONTENT       (reasoning kept)
 *              <|assistant|>EMPTY CONTENT                          (no/cleared reasoning)
 *   tool:      <|observation|> (once per run of tool messages) <tool_response>CONTENT</tool_response>
 *   generation prompt: <|assistant|><think> (thinking) or <|assistant|>EMPTY (thinking off)
 * EMPTY is "<think></think>" (GLM-5.2) or "</think>" (GLM-5/5.1 style, glm51_empty=1).
 * Assistant content and reasoning are stripped of surrounding white space. Reasoning of
 * assistant turns before the last user message is dropped only when clear_thinking is set.
 * The rendered text is then encoded like any text (so added-token strings inside content
 * become added tokens, exactly as HF's apply_chat_template + encode would do). */
typedef struct {
    const char *role;        /* "system", "user", "assistant" or "tool" */
    const char *content;     /* NULL = "" */
    const char *reasoning;   /* assistant only; NULL = none */
} ChatMessage;

typedef struct {
    int thinking;            /* 1 = generation prompt opens <think> (default), 0 = thinking off */
    const char *effort;      /* "Max" (default), "High", or NULL for no effort line */
    int clear_thinking;      /* 1 = drop reasoning of turns before the last user message (default 0) */
    int glm51_empty;         /* 1 = "</think>" as the empty marker instead of "<think></think>" */
} ChatOptions;

void tokenizer_chat_defaults(ChatOptions *opt);   /* thinking 1, effort "Max", others 0 */

/* Renders msgs (opt NULL = defaults) to text (malloc'd, NUL-terminated), or NULL + err on a
 * bad role / out of memory. */
char *tokenizer_render_chat_text(const ChatMessage *msgs, int n, const ChatOptions *opt,
                                 int add_generation_prompt, char *err, size_t errlen);
/* Same, encoded: returns the id count and a malloc'd *ids, or -1 + err. */
int tokenizer_render_chat(const Tokenizer *t, const ChatMessage *msgs, int n, const ChatOptions *opt,
                          int add_generation_prompt, int **ids, char *err, size_t errlen);

/* The `glm tokenize` subcommand; argv[0] is "tokenize". Returns the exit code.
 *   tokenize -m DIR [--] "text"       ids, space-separated, one line ("--": text may start with '-')
 *   tokenize -m DIR --decode 1,2,3    the decoded text (lossy UTF-8) and a newline
 *   tokenize -m DIR --jsonl           stdin: one JSON string per line; stdout: one JSON array of ids per line
 *   --tokenizer FILE                  use FILE instead of DIR/tokenizer.json
 * Errors: one line "glm: error: ..." on stderr, exit code 1. */
int tokenize_main(int argc, char **argv);

#endif
