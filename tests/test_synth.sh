#!/usr/bin/env bash
# glm synth (tools/synth.c), the random checkpoints of make demo and make bench:
# - every checkpoint carries a tokenizer.json, by default the repository's build/tokenizer.json
#   (beside the glm binary), so `glm run -m DIR -p TEXT` works on it; without that file and
#   without --tokenizer, synth fails with one line that says how to fix it; a tokenizer with
#   more ids than the model's vocab_size is refused;
# - OUT_DIR must be new or empty: a non-empty folder (or a file) is refused, left untouched;
# - SIGINT/SIGTERM part way and a failed write (glm_fatal) remove every file synth made, and
#   OUT_DIR if synth made it, with one line saying so; no .partial file is left;
# - --help lists every flag with its default.
# Ends with "N passed, N failed".
export GLM_PRECISION="${GLM_PRECISION:-fp32}"
set -u
cd "$(dirname "$0")/.." || exit 1
GLM=${GLM:-./glm}
out=tests/out/synth; rm -rf "$out"; mkdir -p "$out"
pass=0; fail=0
# ok RESULT NAME [FILE]: on failure also prints FILE's first lines (the command's stderr)
ok() {
    if [ "$1" = 1 ]; then pass=$((pass + 1)); echo "PASS $2"
    else fail=$((fail + 1)); echo "FAIL $2"; [ -n "${3:-}" ] && [ -s "$3" ] && head -n 3 "$3" | sed 's/^/    /'; fi
}
. tests/tokenizer_json.sh
if ! need_tokenizer; then echo "FAIL $TOK_WHY"; echo "0 passed, 1 failed"; exit 1; fi
if [ ! -x "$GLM" ]; then echo "FAIL $GLM not found (run make)"; echo "0 passed, 1 failed"; exit 1; fi

# --help: synth's own usage, every flag with its default, exit 0
$GLM synth --help >"$out/help.out" 2>"$out/help.err"; rc=$?
r=1; [ $rc = 0 ] && [ ! -s "$out/help.err" ] && grep -q '^usage: glm synth OUT_DIR' "$out/help.out" || r=0
for f in --layers --experts --dense --format --seed --tiny --mtp --tokenizer; do
    grep -A1 -- "^  $f " "$out/help.out" | grep -q 'default' || { r=0; echo "    --help: no default for $f"; }
done
ok $r "synth_help_lists_flags_and_defaults" "$out/help.err"
# --mtp adds the MTP layer (glm logits --mtp runs it) and leaves the main model as it was
$GLM synth "$out/mtp" --tiny --layers 2 --experts 8 --mtp >/dev/null 2>"$out/mtp.err" \
  && $GLM synth "$out/nomtp" --tiny --layers 2 --experts 8 >/dev/null 2>>"$out/mtp.err" \
  && $GLM logits -m "$out/mtp" --ids 1,2,3,4 -o "$out/m1.f32" 2>>"$out/mtp.err" \
  && $GLM logits -m "$out/nomtp" --ids 1,2,3,4 -o "$out/m0.f32" 2>>"$out/mtp.err" \
  && $GLM logits --mtp -m "$out/mtp" --ids 1,2,3,4 -o "$out/mm.f32" 2>>"$out/mtp.err"; rc=$?
ok "$([ $rc = 0 ] && cmp -s "$out/m1.f32" "$out/m0.f32" && [ "$(stat -c %s "$out/mm.f32")" = $((3 * 154880 * 4)) ] \
      && grep -q '"index_share_for_mtp_iteration": true' "$out/mtp/config.json" && echo 1 || echo 0)" "synth_mtp_layer" "$out/mtp.err"
rm -rf "$out/mtp" "$out/nomtp"

# the default tokenizer: the tiny model is complete without --tokenizer
m="$out/tiny"
$GLM synth "$m" --tiny >/dev/null 2>"$out/tiny.err"; rc=$?
ok "$([ $rc = 0 ] && cmp -s "$m/tokenizer.json" "$TOK" && [ -s "$m/config.json" ] && [ -s "$m/model.safetensors.index.json" ] \
    && [ -z "$(find "$m" -name '*.partial')" ] && echo 1 || echo 0)" "synth_writes_default_tokenizer" "$out/tiny.err"
$GLM run -m "$m" -p "Hello" -n 4 --temp 0 >"$out/run.txt" 2>"$out/run.err"; rc=$?
ok "$([ $rc = 0 ] && [ -s "$out/run.txt" ] && grep -q 'decode: 3 tokens' "$out/run.err" && echo 1 || echo 0)" \
    "run_prompt_on_synth_model_without_tokenizer_flag" "$out/run.err"

# no build/tokenizer.json beside the binary and no --tokenizer: one line saying how to fix it
mkdir -p "$out/bin"; cp "$GLM" "$out/bin/glm"
"$out/bin/glm" synth "$out/notok" --tiny >/dev/null 2>"$out/notok.err"; rc=$?
ok "$([ $rc = 1 ] && [ "$(wc -l < "$out/notok.err")" = 1 ] && grep -q 'make build/tokenizer.json' "$out/notok.err" \
    && grep -q -- '--tokenizer FILE' "$out/notok.err" && [ ! -e "$out/notok" ] && echo 1 || echo 0)" "synth_missing_default_tokenizer" "$out/notok.err"
rm -rf "$out/bin"

# a tokenizer whose ids reach past the model's vocab_size (154880) is refused, not written
sed 's/"id": 273,/"id": 200000,/' tests/tokenizer/toy/merge-order.json > "$out/big.json"
$GLM synth "$out/big" --tiny --tokenizer "$out/big.json" >/dev/null 2>"$out/big.err"; rc=$?
ok "$([ $rc = 1 ] && [ "$(wc -l < "$out/big.err")" = 1 ] && grep -q 'vocab_size 154880' "$out/big.err" && [ ! -e "$out/big" ] \
    && echo 1 || echo 0)" "synth_refuses_tokenizer_past_vocab" "$out/big.err"

# a non-empty OUT_DIR, or a file: exit 1, one line, the existing files untouched
mkdir -p "$out/full"; echo keep > "$out/full/notes.txt"
$GLM synth "$out/full" --tiny >/dev/null 2>"$out/full.err"; rc=$?
ok "$([ $rc = 1 ] && [ "$(wc -l < "$out/full.err")" = 1 ] && grep -q 'not empty' "$out/full.err" \
    && [ "$(ls -A "$out/full")" = notes.txt ] && [ "$(cat "$out/full/notes.txt")" = keep ] && echo 1 || echo 0)" \
    "synth_refuses_non_empty_folder" "$out/full.err"
echo keep > "$out/file"
$GLM synth "$out/file" --tiny >/dev/null 2>"$out/file.err"; rc=$?
ok "$([ $rc = 1 ] && [ "$(wc -l < "$out/file.err")" = 1 ] && grep -q 'not a folder' "$out/file.err" \
    && [ "$(cat "$out/file")" = keep ] && echo 1 || echo 0)" "synth_refuses_a_file" "$out/file.err"

# a signal part way: a checkpoint with the real widths (~3.5 GB if it ran to the end), killed
# as soon as its first shard is being written; nothing of it may remain. $1 signal, $2 the
# folder, $3 1 if the folder exists (empty) before: then it stays, empty.
interrupt() {
    local sig=$1 d=$2 pre=$3 name="synth_${1}_part_way_leaves_nothing$([ "$3" = 1 ] && echo _in_empty_folder)"
    [ "$pre" = 1 ] && mkdir -p "$d"
    $GLM synth "$d" --layers 2 --experts 64 >/dev/null 2>"$d.err" &
    local pid=$! t=0
    until [ -n "$(find "$d" -name '*.safetensors.partial' -size +0 2>/dev/null)" ] || [ $t -ge 300 ]; do
        kill -0 $pid 2>/dev/null || break
        sleep 0.1; t=$((t + 1))
    done
    kill -"$sig" $pid 2>/dev/null
    local k=0
    while kill -0 $pid 2>/dev/null && [ $k -lt 300 ]; do sleep 0.1; k=$((k + 1)); done
    kill -0 $pid 2>/dev/null && { kill -KILL $pid; echo "    synth did not stop within 30 s of SIG$sig"; }
    wait $pid; local rc=$?
    local want=$((128 + $(kill -l "$sig")))
    local left
    if [ "$pre" = 1 ]; then left=$(ls -A "$d" 2>/dev/null); [ -d "$d" ] || left="(the folder itself is gone)"
    else left=$(ls -A "$d" 2>/dev/null; [ -e "$d" ] && echo "$d"); fi
    [ -n "$left" ] && echo "    left behind: $(echo $left)"
    [ $rc = $want ] || echo "    exit code $rc, expected $want (killed by SIG$sig)"
    ok "$([ $rc = $want ] && [ -z "$left" ] && [ "$(wc -l < "$d.err")" = 1 ] && grep -q 'interrupted; removed' "$d.err" \
        && echo 1 || echo 0)" "$name" "$d.err"
    rm -rf "$d"
}
interrupt INT "$out/sig1" 0
interrupt TERM "$out/sig2" 1

# a failed write (glm_fatal) part way: a 10 MB file size limit (SIGXFSZ ignored, so the write
# fails with EFBIG) stops the first shard; the error line, then one line saying what was removed
(trap '' XFSZ; ulimit -f 10240; exec $GLM synth "$out/fatal" --tiny) >/dev/null 2>"$out/fatal.err"; rc=$?
ok "$([ $rc = 1 ] && [ ! -e "$out/fatal" ] && [ "$(wc -l < "$out/fatal.err")" = 2 ] && grep -q '^glm: error: .*write failed' "$out/fatal.err" \
    && grep -q 'failed; removed the output folder' "$out/fatal.err" && echo 1 || echo 0)" "synth_failed_write_leaves_nothing" "$out/fatal.err"

echo "$pass passed, $fail failed"
[ $fail = 0 ]
