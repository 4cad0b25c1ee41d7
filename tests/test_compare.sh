#!/usr/bin/env bash
# glm compare: a model against itself (KL 0, full agreement, equal perplexity) and a
# BF16 tiny model against its MXFP4 conversion (finite positive KL, plausible agreement).
export GLM_PRECISION="${GLM_PRECISION:-fp32}" # compared with an fp32 reference (see test.sh)
set -u
cd "$(dirname "$0")/.."
GLM=${GLM:-./glm}
out=tests/out/compare; rm -rf "$out"; mkdir -p "$out"
pass=0; fail=0
ok() { if [ "$1" = 1 ]; then pass=$((pass + 1)); echo "PASS $2"; else fail=$((fail + 1)); echo "FAIL $2"; fi; }
/usr/bin/python3 tests/make_tiny.py "$out/bf16" --variant bf16 --seed 7 >/dev/null
ids=$(/usr/bin/python3 -c "import random; random.seed(3); print(','.join(str(random.randrange(500)) for _ in range(48)))")

r=$($GLM compare -m "$out/bf16" -m "$out/bf16" --ids "$ids" 2>"$out/err1")
kl=$(echo "$r" | awk '/KL/ {print $3}'); ag=$(echo "$r" | awk '/agreement/ {print $3}')
pa=$(echo "$r" | awk '/perplexity/ {print $NF}'); pb=$(echo "$r" | awk '/B / {print $NF}')
ok "$(awk -v k="$kl" -v a="$ag" -v p="$pa" -v q="$pb" 'BEGIN {print (k == 0 && a == 48 && p == q && p > 1) ? 1 : 0}')" "compare_self (KL $kl, agree $ag, ppl $pa/$pb)"

$GLM convert "$out/bf16" "$out/mx" 2>"$out/err2" >/dev/null
r=$($GLM compare -m "$out/bf16" -m "$out/mx" --ids "$ids" 2>>"$out/err2")
kl=$(echo "$r" | awk '/KL/ {print $3}'); ag=$(echo "$r" | awk '/agreement/ {print $3}')
pb=$(echo "$r" | awk '/B / {print $NF}')
ok "$(awk -v k="$kl" -v a="$ag" -v p="$pb" 'BEGIN {print (k > 0 && k < 5 && a >= 1 && a <= 48 && p > 1 && p < 1e6) ? 1 : 0}')" "compare_bf16_vs_mxfp4 (KL $kl, agree $ag/48, ppl $pb)"

$GLM compare -m "$out/bf16" --ids "$ids" >/dev/null 2>"$out/err3"; rc=$?
ok "$([ $rc = 1 ] && [ "$(wc -l < "$out/err3")" = 1 ] && grep -q 'two -m' "$out/err3" && echo 1 || echo 0)" "compare_needs_two_models"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
