#!/usr/bin/env bash
# glm chat and glm run -p on a tiny random model that uses the real GLM-5.2 tokenizer:
# - multi-turn chat keeps the KV cache (turn 2 runs only its new tokens) and produces
#   exactly what re-reading the whole conversation from scratch produces;
# - run -p streams text; invalid UTF-8 and an over-long prompt fail with one line;
# - every command answers --help (usage, exit 0); glm synth names an unknown flag;
# - --draft N (speculative decoding with the MTP layer, which synth --mtp writes) gives the
#   same greedy chat as --draft 0, reusing the cache or re-reading, thinking on or off.
export GLM_PRECISION="${GLM_PRECISION:-fp32}" # compared with an fp32 reference (see test.sh)
set -u
cd "$(dirname "$0")/.."
GLM=${GLM:-./glm}
out=tests/out/chat; rm -rf "$out"; mkdir -p "$out"
pass=0; fail=0
# ok RESULT NAME [FILE]: on failure also prints FILE's first lines (the command's stderr)
ok() {
    if [ "$1" = 1 ]; then pass=$((pass + 1)); echo "PASS $2"
    else fail=$((fail + 1)); echo "FAIL $2"; [ -n "${3:-}" ] && [ -s "$3" ] && head -n 3 "$3" | sed 's/^/    /'; fi
}
# the model every case below uses; without it they could only fail, so stop with the reason
. tests/tokenizer_json.sh
if ! need_tokenizer; then echo "FAIL $TOK_WHY"; echo "0 passed, 1 failed"; exit 1; fi
if ! $GLM synth "$out/m" --tiny --layers 2 --experts 8 --mtp --tokenizer "$TOK" 2>"$out/synth.err"; then
    echo "FAIL synth the tiny model: $(tr '\n' ' ' < "$out/synth.err")"; echo "0 passed, 1 failed"; exit 1
fi

turns=$'Hello there!\nAnd what is 2+2?\nThird turn, thinking off?'
printf '%s\n' "$turns" | $GLM chat -m "$out/m" -n 12 --temp 0 >"$out/reuse.txt" 2>"$out/reuse.err"; rc1=$?
printf '%s\n' "$turns" | GLM_CHAT_NO_REUSE=1 $GLM chat -m "$out/m" -n 12 --temp 0 >"$out/fresh.txt" 2>"$out/fresh.err"; rc2=$?
ok "$([ $rc1 = 0 ] && [ $rc2 = 0 ] && cmp -s "$out/reuse.txt" "$out/fresh.txt" && [ -s "$out/reuse.txt" ] && echo 1 || echo 0)" "chat_reuse_equals_reread" "$out/reuse.err"
# prefill counts per turn: with reuse, turns 2 and 3 run fewer tokens than a re-read does
r=$(grep -o 'prefill: [0-9]*' "$out/reuse.err" | awk '{print $2}' | tr '\n' ' ')
f=$(grep -o 'prefill: [0-9]*' "$out/fresh.err" | awk '{print $2}' | tr '\n' ' ')
ok "$(echo "$r|$f" | awk -F'|' '{split($1,a," "); split($2,b," "); print (length(a)==3 && a[1]==b[1] && a[2]<b[2] && a[3]<b[3]) ? 1 : 0}')" "chat_turns_reuse_cache (prefill tokens reuse: $r; re-read: $f)"

$GLM run -m "$out/m" -p "[gMASK]<sop><|user|>Hi<|assistant|><think>" -n 6 --temp 0 >"$out/run.txt" 2>"$out/run.err"; rc=$?
ok "$([ $rc = 0 ] && [ -s "$out/run.txt" ] && grep -q 'decode: 5 tokens' "$out/run.err" && echo 1 || echo 0)" "run_text_prompt" "$out/run.err"
# the same prompt as ids gives the same continuation (ids printed instead of text)
ids=$($GLM tokenize -m "$out/m" "[gMASK]<sop><|user|>Hi<|assistant|><think>" 2>/dev/null | tr ' ' ',')
gen=$($GLM run -m "$out/m" --ids "$ids" -n 6 --temp 0 2>/dev/null)
txt=$($GLM tokenize --decode -m "$out/m" "$(echo $gen | tr ' ' ',')" 2>/dev/null)
ok "$([ -n "$ids" ] && [ "$txt" = "$(cat "$out/run.txt")" ] && echo 1 || echo 0)" "run_text_equals_ids"

$GLM run -m "$out/m" -p $'bad \xff byte' >/dev/null 2>"$out/e1"; rc=$?
ok "$([ $rc = 1 ] && [ "$(wc -l < "$out/e1")" = 1 ] && grep -q 'not valid UTF-8' "$out/e1" && echo 1 || echo 0)" "run_invalid_utf8" "$out/e1"
$GLM run -m "$out/m" -p "a b c d e f g h i j k l m n o p" --ctx 4 >/dev/null 2>"$out/e2"; rc=$?
ok "$([ $rc = 1 ] && [ "$(wc -l < "$out/e2")" = 1 ] && grep -q -- '--ctx' "$out/e2" && echo 1 || echo 0)" "run_prompt_longer_than_ctx" "$out/e2"
$GLM chat -m "$out/m" --tokenizer "$out/none.json" </dev/null >/dev/null 2>"$out/e3"; rc=$?
ok "$([ $rc = 1 ] && [ "$(wc -l < "$out/e3")" = 1 ] && grep -q 'none.json' "$out/e3" && echo 1 || echo 0)" "chat_missing_tokenizer" "$out/e3"
# every command answers --help with its usage and exit code 0 (synth and compare once took
# it for a flag with a value, or counted -m first); an unknown synth flag is named as unknown,
# also last on the line (it was "--bogus: missing value")
for c in run chat logits bench compare synth convert tokenize; do
    $GLM $c --help >"$out/h.out" 2>"$out/h.err"; rc=$?
    ok "$([ $rc = 0 ] && grep -q "usage: glm" "$out/h.out" "$out/h.err" && ! grep -q 'glm: error' "$out/h.err" && echo 1 || echo 0)" "help_$c" "$out/h.err"
done
$GLM synth "$out/s" --bogus >/dev/null 2>"$out/e4"; rc=$?
ok "$([ $rc = 1 ] && [ "$(wc -l < "$out/e4")" = 1 ] && grep -q 'unknown flag --bogus' "$out/e4" && [ ! -e "$out/s" ] && echo 1 || echo 0)" "synth_unknown_flag" "$out/e4"
# a checkpoint without tokenizer.json: the error says how to fix it (--tokenizer, or --ids for run)
mkdir -p "$out/notok" && cp "$out/m/"*.json "$out/m/"*.safetensors "$out/notok/" && rm -f "$out/notok/tokenizer.json"
$GLM run -m "$out/notok" -p "Hi" >/dev/null 2>"$out/e5"; rc=$?
ok "$([ $rc = 1 ] && [ "$(wc -l < "$out/e5")" = 1 ] && grep -q -- '--tokenizer FILE' "$out/e5" && grep -q -- '--ids' "$out/e5" && echo 1 || echo 0)" "run_no_tokenizer_json_says_how" "$out/e5"
# per-command help lists that command's own flags (and not another command's); --version
$GLM run --help >"$out/h1" 2>&1; $GLM chat --help >"$out/h2" 2>&1; $GLM --version >"$out/h3" 2>&1; rc=$?
ok "$(grep -q -- '--top-p' "$out/h1" && ! grep -q -- '--system' "$out/h1" && grep -q -- '--system' "$out/h2" && ! grep -q -- '--ids' "$out/h2" && [ $rc = 0 ] && grep -q '^glm [0-9]' "$out/h3" && echo 1 || echo 0)" "help_per_command_and_version" "$out/h1"
$GLM chat -m "$out/m" --ids 1,2 </dev/null >/dev/null 2>"$out/e6"; rc=$?
ok "$([ $rc = 1 ] && [ "$(wc -l < "$out/e6")" = 1 ] && grep -q 'unknown flag --ids' "$out/e6" && echo 1 || echo 0)" "chat_rejects_a_run_flag" "$out/e6"
# a conversation that outgrows --ctx keeps going (thinking off: the tiny model never closes
# </think>, so with thinking on its replies are all reasoning, which the template drops from
# the history): the oldest turns are dropped (and the
# cache reuse after a drop still equals re-reading); a message too long for the context
# is refused and the next one answered
long=$(printf 'word %.0s' $(seq 1 120))
turns=$'First question about cats?
Second question, about dogs?
Third question: birds?
'"$long"$'
Fourth: fish?
Fifth: frogs?'
printf '%s
' "$turns" | $GLM chat -m "$out/m" --ctx 96 -n 10 --temp 0 --no-think >"$out/ctx.txt" 2>"$out/ctx.err"; rc1=$?
printf '%s
' "$turns" | GLM_CHAT_NO_REUSE=1 $GLM chat -m "$out/m" --ctx 96 -n 10 --temp 0 --no-think >"$out/ctx2.txt" 2>"$out/ctx2.err"; rc2=$?
ok "$([ $rc1 = 0 ] && [ $rc2 = 0 ] && grep -q 'dropped the oldest turn' "$out/ctx.err" && grep -q 'was not sent' "$out/ctx.err" \
      && [ "$(grep -c '^> ' "$out/ctx.txt")" = 6 ] && [ "$(grep -c '^prefill:' "$out/ctx.err")" = 5 ] && cmp -s "$out/ctx.txt" "$out/ctx2.txt" && echo 1 || echo 0)" \
   "chat_outgrows_ctx_keeps_going" "$out/ctx.err"
# a reply's last token is printed but never run: a turn that reuses the cache must not
# count it as cached (with --no-think the next prompt repeats it; reusing its empty row
# once made turn 2 differ from re-reading)
turns=$'Hello there!\nAnd what is 2+2?\nThird turn?\nFourth one'
printf '%s\n' "$turns" | $GLM chat -m "$out/m" -n 16 --temp 0 --no-think >"$out/nt.txt" 2>"$out/nt.err"; rc1=$?
printf '%s\n' "$turns" | GLM_CHAT_NO_REUSE=1 $GLM chat -m "$out/m" -n 16 --temp 0 --no-think >"$out/nt2.txt" 2>"$out/nt2.err"; rc2=$?
ok "$([ $rc1 = 0 ] && [ $rc2 = 0 ] && [ -s "$out/nt.txt" ] && cmp -s "$out/nt.txt" "$out/nt2.txt" && echo 1 || echo 0)" "chat_no_think_reuse_equals_reread" "$out/nt.err"
# --draft N: the same greedy replies as --draft 0 (thinking on and off, reusing the cache
# and re-reading), each reply's speed line reporting its drafts. Under the sanitizers (SAN=1)
# N = 3 alone: N = 1 runs the same code, and each chat there takes seconds (CI time).
drafts="1 3"
[ -n "${SAN:-}" ] && [ "${SAN:-}" != 0 ] && drafts=3
for think in "" --no-think; do
    printf '%s\n' "$turns" | $GLM chat -m "$out/m" -n 16 --temp 0 $think --draft 0 >"$out/d0.txt" 2>"$out/d0.err"
    for d in $drafts; do
        for reuse in 0 1; do
            name="chat_draft${d}_equals_draft0${think:+_no_think}$([ $reuse = 1 ] && echo _reread)"
            printf '%s\n' "$turns" | GLM_CHAT_NO_REUSE=$reuse $GLM chat -m "$out/m" -n 16 --temp 0 $think --draft $d >"$out/dn.txt" 2>"$out/dn.err"; rc=$?
            ok "$([ $rc = 0 ] && [ -s "$out/d0.txt" ] && cmp -s "$out/d0.txt" "$out/dn.txt" && [ "$(grep -c -- "--draft $d: [0-9]* of [0-9]* drafts accepted" "$out/dn.err")" = 4 ] && echo 1 || echo 0)" "$name" "$out/dn.err"
        done
    done
done
echo "$pass passed, $fail failed"
[ $fail = 0 ]
