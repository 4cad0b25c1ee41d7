#!/usr/bin/env bash
# tests/test_chat_template.sh - the chat format is GLM-5.2's own template, byte for byte (issue 36).
#
#   1. The oracle is the template itself, data/glm-5.2-tokenizer/chat_template.jinja (its provenance
#      in that folder's README.md), rendered by jinja2 the way Hugging Face's apply_chat_template
#      renders it (tests/chat_template/oracle.py: sandboxed environment, trim_blocks, lstrip_blocks,
#      tojson = json.dumps). On the hand-written cases (repeated keys, number spellings, escapes,
#      every power of two as a float, errors) and CHAT_CASES generated conversations (default 400,
#      seed CHAT_SEED, default 36: every role, unicode, empty and white-space-only content, <think>
#      inside content, tools with and without "function", defer_loading, strict, tool_calls with
#      string and JSON arguments, runs of tool results, histories of 40-120 messages, every option
#      as true/false/absent/odd values), `$GLM tokenize --chat --jsonl` must give the template's
#      bytes, `--ids` the ids of the template's text, and refuse exactly the lines the template
#      cannot render;
#   2. `tokenize --chat` errors: one line naming the input line and the field, null in the output;
#   3. tests/chat_template/chat_test.c: the GLM-5/5.1 options, the C API (tool_calls structs, tools,
#      what is refused), tokenizer_chat_read_json's errors, tokenizer_parse_tool_calls (and
#      CHAT_FUZZ_SECONDS, default 5, of random texts into it); with sanitizers under SAN=1;
#   4. glm chat with the template's default (history reasoning dropped) still equals re-reading the
#      whole conversation from scratch, thinking off and with a system prompt (test_chat.sh covers
#      thinking on).
# Needs jinja2 (Debian: python3-jinja2) and the repository's tokenizer.json. Ends with
# "N passed, N failed".
set -u
cd "$(dirname "$0")/.." || exit 1
GLM=${GLM:-./glm}
CC=${CC:-cc}
N=${CHAT_CASES:-400}
SEED=${CHAT_SEED:-36}
FUZZ_SECONDS=${CHAT_FUZZ_SECONDS:-5}
T=tests/chat_template
TEMPLATE=data/glm-5.2-tokenizer/chat_template.jinja
OUT=$(mktemp -d "${TMPDIR:-/tmp}/glm-chat-template-test.XXXXXX") || exit 1
trap 'rm -rf "$OUT"' EXIT
pass=0
fail=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
check() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }
count() {   # adds a log's PASS/FAIL lines; a crash without FAIL lines is a failure
    cat "$1"
    pass=$((pass + $(grep -c '^PASS' "$1")))
    fail=$((fail + $(grep -c '^FAIL' "$1")))
    if [ "$2" -ne 0 ] && ! grep -q '^FAIL' "$1"; then bad "$3 exited $2"; fi
}

. tests/tokenizer_json.sh
need_tokenizer || bad "$TOK_WHY"
PY=
for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import jinja2' 2>/dev/null; then PY=$p; break; fi
done

# ---------------------------------------------------------------- 1. against the template
if [ -z "$PY" ]; then
    bad "jinja2 not found (Debian: apt-get install python3-jinja2; make deps installs it)"
elif [ ! -x "$GLM" ]; then
    bad "$GLM not found (make glm)"
else
    start=$(date +%s)
    "$PY" $T/oracle.py gen "$N" "$SEED" > "$OUT/cases.jsonl"
    "$PY" $T/oracle.py render "$TEMPLATE" < "$OUT/cases.jsonl" > "$OUT/want.jsonl"
    "$GLM" tokenize --chat --jsonl < "$OUT/cases.jsonl" > "$OUT/got.jsonl" 2> "$OUT/got.err"
    # ids: the rendered conversations' ids against the ids of the template's own text
    grep -v '^{"error"' "$OUT/want.jsonl" > "$OUT/want-texts.jsonl"
    "$GLM" tokenize --tokenizer "$TOK" --jsonl < "$OUT/want-texts.jsonl" > "$OUT/want-ids.jsonl" 2> "$OUT/ids.err"
    "$GLM" tokenize --tokenizer "$TOK" --chat --jsonl --ids < "$OUT/cases.jsonl" > "$OUT/got-ids.jsonl" 2>> "$OUT/ids.err"
    "$PY" $T/oracle.py compare "$OUT/cases.jsonl" "$OUT/want.jsonl" "$OUT/got.jsonl" "$OUT/want-ids.jsonl" "$OUT/got-ids.jsonl" > "$OUT/cmp.log" 2>&1
    count "$OUT/cmp.log" $? "oracle.py compare"
    refused=$(grep -c '^{"error"' "$OUT/want.jsonl")
    check "each refused line has one error line naming it ($refused lines)" \
        "[ \$(wc -l < '$OUT/got.err') = $refused ] && ! grep -qv '^glm: error: stdin line [0-9]*: ' '$OUT/got.err'"
    echo "    (seed $SEED, $(wc -l < "$OUT/cases.jsonl") conversations, $(($(date +%s) - start)) s)"
fi

# ---------------------------------------------------------------- 2. tokenize --chat errors
if [ -x "$GLM" ]; then
    printf '%s\n' '{"messages": [{"role": "user", "content": "hi"}]}' '{"messages": [{"role": "user", "content": 5}]}' \
        '{"messages": []' '{"messages": [], "enable_thinkng": false}' > "$OUT/bad.jsonl"
    "$GLM" tokenize --chat --jsonl < "$OUT/bad.jsonl" > "$OUT/bad.out" 2> "$OUT/bad.err"
    rc=$?
    check "tokenize --chat: bad lines get null and one error line each naming line and field; exit 1" \
        "[ $rc = 1 ] && [ \"\$(sed -n 2,4p '$OUT/bad.out' | tr '\n' ' ')\" = 'null null null ' ] && [ \$(wc -l < '$OUT/bad.err') = 3 ] \
         && grep -q '^glm: error: stdin line 2: messages\[0\].content: ' '$OUT/bad.err' \
         && grep -q '^glm: error: stdin line 3: request: invalid JSON' '$OUT/bad.err' \
         && grep -q '^glm: error: stdin line 4: unknown field \"enable_thinkng\"' '$OUT/bad.err'"
    check "tokenize --chat: the good line is the prompt as a JSON string" \
        "[ \"\$(head -n 1 '$OUT/bad.out')\" = '\"[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>hi\"' ]"
    "$GLM" tokenize --chat "x" > /dev/null 2> "$OUT/e1"
    check "tokenize --chat without --jsonl is refused with one line" "[ \$(wc -l < '$OUT/e1') = 1 ] && grep -q -- '--jsonl' '$OUT/e1'"
fi

# ---------------------------------------------------------------- 3. C checks
flags="-std=c11 -O2 -g"
[ "${SAN:-0}" = 1 ] && flags="-std=c11 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
# shellcheck disable=SC2086
if $CC $flags -Wall -Wextra -Wno-missing-field-initializers -o "$OUT/chat_test" $T/chat_test.c tokenizer.c json.c 2> "$OUT/build.log"; then
    "$OUT/chat_test" "$FUZZ_SECONDS" "${CHAT_FUZZ_SEED:-$(date +%s)}" > "$OUT/c.log" 2>&1
    count "$OUT/c.log" $? "chat_test"
else
    cat "$OUT/build.log"
    bad "build tests/chat_template/chat_test.c"
fi

# ---------------------------------------------------------------- 4. glm chat reuses the cache correctly
m="$OUT/m"
if [ -x "$GLM" ] && [ -n "${TOK:-}" ] && "$GLM" synth "$m" --tiny --layers 2 --experts 8 --tokenizer "$TOK" > /dev/null 2> "$OUT/synth.err"; then
    turns=$'Hello there!\nAnd what is 2+2?\nThird turn.\nA fourth, longer turn: tell me about tokenizers.'
    for opts in "--no-think" "--system Be_brief. --effort high"; do
        # shellcheck disable=SC2086
        printf '%s\n' "$turns" | GLM_PRECISION=fp32 "$GLM" chat -m "$m" -n 10 --temp 0 $opts > "$OUT/reuse.txt" 2> "$OUT/reuse.err"; r1=$?
        # shellcheck disable=SC2086
        printf '%s\n' "$turns" | GLM_PRECISION=fp32 GLM_CHAT_NO_REUSE=1 "$GLM" chat -m "$m" -n 10 --temp 0 $opts > "$OUT/fresh.txt" 2> "$OUT/fresh.err"; r2=$?
        r=$(grep -o 'prefill: [0-9]*' "$OUT/reuse.err" | awk '{print $2}' | tr '\n' ' ')
        f=$(grep -o 'prefill: [0-9]*' "$OUT/fresh.err" | awk '{print $2}' | tr '\n' ' ')
        check "glm chat $opts: reusing the cache equals re-reading (prefill tokens: $r vs $f)" \
            "[ $r1 = 0 ] && [ $r2 = 0 ] && [ -s '$OUT/reuse.txt' ] && cmp -s '$OUT/reuse.txt' '$OUT/fresh.txt' && [ \"\$(echo $r | wc -w)\" = 4 ]"
    done
else
    bad "glm synth a tiny model for the chat checks: $(head -c 300 "$OUT/synth.err" 2>/dev/null)"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
