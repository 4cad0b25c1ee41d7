#!/usr/bin/env bash
# tests/test_fuzz.sh - the fuzz targets (fuzz/, issue 7) and the loader's hostile-header checks.
#
#   1. the loader rejects crafted single-file checkpoints (overlapping offsets, offsets past the
#      end of the file, sizes and shapes that overflow 64-bit arithmetic, header lengths past the
#      end or near 2^64, ...) with exit code 1 and exactly one "glm: error:" line ($GLM);
#   2. `make fuzz` builds the libFuzzer targets (needs clang and libFuzzer: Debian packages
#      clang-14 and libclang-rt-14-dev);
#   3. every target replays its regression inputs (fuzz/regressions/TARGET/, each a crash or
#      hang found and fixed) and its seed corpus (fuzz/corpus/TARGET/);
#   4. each target fuzzes for FUZZ_SECONDS (default 6, one target per core at a time; the issue's 60 s x 4 targets does not
#      fit CI's budget; longer runs by hand, see fuzz/README.md) from a copy of its seeds.
#      Skipped under SAN=1 (make test-asan): the targets are sanitizer builds already.
# Ends with "N passed, N failed"; exits non-zero on any failure.
set -u
cd "$(dirname "$0")/.." || exit 1
GLM=${GLM:-./glm}
FUZZ_SECONDS=${FUZZ_SECONDS:-6}
TARGETS="json checkpoint tokenizer_load encode chat http request"
OUT=$(mktemp -d "${TMPDIR:-/tmp}/glm-fuzz-test.XXXXXX") || exit 1
trap 'rm -rf "$OUT"' EXIT
pass=0
fail=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }

# ---- 1. hostile safetensors headers (and config.json values) through the CLI --------------
# Each case: NAME, words the one error line must contain, the model.safetensors bytes, and
# optionally changes to the tiny bf16 config.json.
python3 - "$OUT/loader" <<'PYEOF'
import json, os, struct, sys
out = sys.argv[1]
cfg = open("fuzz/corpus/json/config-bf16.json", "rb").read()
def u64(n): return struct.pack("<Q", n)
def st(h, data=b""):
    hj = h if isinstance(h, bytes) else json.dumps(h, separators=(",", ":")).encode()
    return u64(len(hj)) + hj + data
T = lambda dt, shape, off: {"dtype": dt, "shape": shape, "data_offsets": off}
cases = [
    ("overlap", "overlapping data_offsets", st({"a": T("BF16", [4], [0, 8]), "b": T("BF16", [4], [4, 12])}, bytes(12))),
    ("overlap_same", "overlapping data_offsets", st({"a": T("U8", [4], [0, 4]), "b": T("U8", [4], [0, 4])}, bytes(4))),
    ("overlap_inside", "overlapping data_offsets", st({"a": T("U8", [16], [0, 16]), "b": T("U8", [2], [5, 7])}, bytes(16))),
    ("past_eof", "past the end of the file", st({"a": T("F32", [4], [0, 16])}, bytes(15))),
    ("past_eof_huge", "past the end of the file", st({"a": T("U8", [0], [2**64 - 1, 2**64 - 1])}, bytes(8))),
    ("offsets_not_u64", "fit 64 bits", st({"a": T("U8", [1], [0, 2**64])}, bytes(8))),
    ("offsets_reversed", "end before they begin", st({"a": T("U8", [1], [5, 4])}, bytes(8))),
    ("shape_overflow", "overflows 64-bit", st({"a": T("U8", [2**32, 2**32], [0, 0])}, bytes(8))),
    ("shape_wraps_to_data", "overflows 64-bit", st({"a": T("BF16", [4, 2**62 + 40], [0, 320])}, bytes(320))),
    ("size_overflow", "overflows 64-bit", st({"a": T("F64", [2**62], [0, 0])}, bytes(8))),
    ("size_wraps_to_data", "overflows 64-bit", st({"a": T("F32", [2**62 + 2], [0, 8])}, bytes(8))),
    ("shape_entry_too_big", "shape entries", st({"a": T("U8", [2**63], [0, 0])}, bytes(8))),
    ("size_mismatch", "bytes of data", st({"a": T("F32", [3], [0, 8])}, bytes(8))),
    ("header_len_past_eof", "header length", u64(1000) + b"{}"),
    ("header_len_2^64-1", "header length", u64(2**64 - 1) + b"{}"),
    ("header_len_2^63", "header length", u64(2**63) + b"{}"),
    ("truncated_7_bytes", "truncated", b"\x02\x00\x00\x00\x00\x00\x00"),
    ("header_not_object", "not a JSON object", st(b"[1,2]")),
    ("header_bad_json", "bad JSON", st(b'{"a":')),
    ("dims_9", "dimensions", st({"a": T("U8", [1] * 9, [0, 1])}, bytes(8))),
    # config.json values that were undefined behaviour before (int overflow, float -> int casts)
    ("config_qk_sum_overflow", "qk_head_dim", b"", {"qk_head_dim": None, "qk_nope_head_dim": 2**30, "qk_rope_head_dim": 2**30, "index_head_dim": 2**30}),
    ("config_eos_1e300", "eos_token_id", b"", {"eos_token_id": [1e300]}),
    ("config_norm_topk_1e300", "past the end of the file", st({"a": T("F32", [4], [0, 16])}, bytes(15)), {"norm_topk_prob": 1e300}),
]
for case in cases:
    name, want, raw = case[:3]
    c = json.loads(cfg)
    c.update(case[3] if len(case) > 3 else {})
    d = os.path.join(out, name)
    os.makedirs(d)
    open(os.path.join(d, "config.json"), "w").write(json.dumps(c))
    open(os.path.join(d, "model.safetensors"), "wb").write(raw)
    open(os.path.join(d, "want"), "w").write(want)
PYEOF
if [ ! -x "$GLM" ]; then
    bad "loader: $GLM is not built (make)"
else
    for d in "$OUT"/loader/*/; do
        name=$(basename "$d")
        want=$(cat "$d/want")
        err=$("$GLM" logits -m "$d" --ids 1,2,3 -o "$OUT/x.f32" 2>&1 >"$OUT/stdout"); rc=$?
        lines=$(printf '%s\n' "$err" | wc -l)
        if [ "$rc" -ne 1 ]; then bad "loader_$name: exit code $rc, expected 1: $err"
        elif [ "$lines" -ne 1 ] || [[ "$err" != "glm: error: "* ]]; then bad "loader_$name: expected one 'glm: error:' line, got: $err"
        elif [[ "$err" != *"$want"* ]]; then bad "loader_$name: message lacks '$want': $err"
        elif [ -s "$OUT/stdout" ] || [ -e "$OUT/x.f32" ]; then bad "loader_$name: wrote output"
        else ok "loader_$name"; fi
    done
fi

# ---- 1b. tokenizer.json files the loader must refuse (as HF does) ---------------------------
# fuzz/regressions/tokenizer_load/merge-*.json: a merge whose part is not in the vocabulary (or
# empty) was accepted when the concatenation happened to be the next expected merged token.
cat > "$OUT/tok_reject.c" <<'CEOF'
#include "tokenizer.h"
#include <stdio.h>
int main(int argc, char **argv) {
    int bad = 0;
    for (int i = 1; i < argc; i++) {
        char err[512];
        Tokenizer *t = tokenizer_load(argv[i], err, sizeof err);
        if (t) { printf("loaded %s\n", argv[i]); bad = 1; tokenizer_free(t); }
        else printf("%s\n", err);
    }
    return bad;
}
CEOF
if ${CC:-cc} -std=c11 -I. -o "$OUT/tok_reject" "$OUT/tok_reject.c" tokenizer.c json.c -lm 2>"$OUT/tok_reject.log"; then
    for f in fuzz/regressions/tokenizer_load/merge-*.json; do
        msg=$("$OUT/tok_reject" "$f"); rc=$?
        if [ "$rc" -eq 0 ] && [[ "$msg" == *merge* ]]; then ok "tokenizer_rejects_$(basename "$f" .json)"
        else bad "tokenizer_rejects_$(basename "$f" .json): $msg"; fi
    done
else
    bad "tokenizer_rejects: build failed: $(head -n 3 "$OUT/tok_reject.log")"
fi

# ---- 2. build ------------------------------------------------------------------------------
if ! make -s -j"$(nproc 2>/dev/null || echo 2)" fuzz >"$OUT/build.log" 2>&1; then
    bad "make fuzz (needs clang + libFuzzer: apt-get install clang-14 libclang-rt-14-dev): $(tail -n 5 "$OUT/build.log" | tr '\n' ' ')"
    echo "$pass passed, $fail failed"
    exit 1
fi
ok "make fuzz"
# fuzz_encode runs on the real GLM-5.2 tokenizer.json (build/tokenizer.json, unpacked from the
# repository's copy), not on its trimmed fallback
. tests/tokenizer_json.sh
if need_tokenizer; then ok "tokenizer.json for fuzz_encode"; else bad "fuzz_encode: $TOK_WHY"; fi

# ---- 3. regressions and seeds --------------------------------------------------------------
for t in $TARGETS; do
    for kind in regressions corpus; do
        files=(fuzz/$kind/$t/*)
        [ -e "${files[0]}" ] || continue
        if fuzz/bin/fuzz_$t -timeout=30 -rss_limit_mb=2048 "${files[@]}" >"$OUT/replay-$t-$kind.log" 2>&1; then
            ok "replay_${t}_$kind (${#files[@]} inputs)"
        else
            bad "replay_${t}_$kind: $(grep -E 'ERROR|SUMMARY|Running' "$OUT/replay-$t-$kind.log" | tail -n 3 | tr '\n' ' ')"
        fi
    done
done

# ---- 4. short fuzz runs --------------------------------------------------------------------
if [ "${SAN:-0}" = 1 ]; then
    echo "# SAN=1: fuzz runs skipped (run by the plain ./test.sh)"
elif [ "$FUZZ_SECONDS" -gt 0 ]; then
    # one target per core at a time (each libFuzzer run is single-threaded); results in order after
    fuzz_one() {
        local t=$1 dict=()
        mkdir -p "$OUT/run-$t" "$OUT/art-$t"
        cp fuzz/corpus/$t/* "$OUT/run-$t/" 2>/dev/null
        [ -f fuzz/dict/$t.dict ] && dict=(-dict=fuzz/dict/$t.dict)
        fuzz/bin/fuzz_$t "${dict[@]}" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
            -artifact_prefix="$OUT/art-$t/" "$OUT/run-$t" >"$OUT/fuzz-$t.log" 2>&1
        echo $? >"$OUT/rc-$t"
    }
    cores=$(nproc 2>/dev/null || echo 2)
    for t in $TARGETS; do
        while [ "$(jobs -rp | wc -l)" -ge "$cores" ]; do wait -n; done
        fuzz_one "$t" &
    done
    wait
    for t in $TARGETS; do
        if [ "$(cat "$OUT/rc-$t" 2>/dev/null)" = 0 ]; then
            ok "fuzz_$t ${FUZZ_SECONDS}s: $(grep -E '^stat::number_of_executed_units' "$OUT/fuzz-$t.log" | awk '{print $2}') runs"
        else
            a=$(ls "$OUT/art-$t" 2>/dev/null | head -n 1)
            [ -n "$a" ] && mkdir -p fuzz/found && cp "$OUT/art-$t/$a" "fuzz/found/$t-$a"
            bad "fuzz_$t: $(grep -E 'ERROR|SUMMARY' "$OUT/fuzz-$t.log" | head -n 2 | tr '\n' ' ') input kept in fuzz/found/$t-$a"
            tail -n 40 "$OUT/fuzz-$t.log"
        fi
    done
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
