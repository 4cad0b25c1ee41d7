#!/usr/bin/env bash
# Threads must not change a single bit: every product forced parallel (GLM_PARALLEL_MIN=0,
# 2 and 3 threads) against one thread, prefill (70 tokens: two chunks, the panel path)
# and decode, on each tiny variant. Small products normally stay on one thread, which
# would hide a race on tiny models (one was found this way at real widths).
set -u
cd "$(dirname "$0")/.."
GLM=${GLM:-./glm}
out=tests/out/threads; rm -rf "$out"; mkdir -p "$out"
pass=0; fail=0
ids=$(/usr/bin/python3 -c "import random; random.seed(5); print(','.join(str(random.randrange(500)) for _ in range(70)))")
for v in bf16 fp8 mxfp4 mixed; do
    /usr/bin/python3 tests/make_tiny.py "$out/$v" --variant $v --seed 11 >/dev/null
    for mode in "" --decode; do
        $GLM logits -m "$out/$v" --ids "$ids" -o "$out/one.f32" -t 1 $mode 2>/dev/null
        for t in 2 3; do
            GLM_PARALLEL_MIN=0 $GLM logits -m "$out/$v" --ids "$ids" -o "$out/par.f32" -t $t $mode 2>/dev/null
            name="threads_${v}_t${t}${mode:+_decode}"
            if [ -s "$out/one.f32" ] && cmp -s "$out/one.f32" "$out/par.f32"; then pass=$((pass + 1)); echo "PASS $name"
            else fail=$((fail + 1)); echo "FAIL $name: logits differ from one thread"; fi
        done
    done
done
# OpenMP waits passively unless the user chose a policy: threads spinning at barriers made
# decode 10-40x slower whenever another process kept a core busy (glm re-execs itself with
# OMP_WAIT_POLICY=passive; libgomp prints its settings with OMP_DISPLAY_ENV)
policy() { env "$@" OMP_DISPLAY_ENV=true $GLM logits -m "$out/bf16" --ids 1,2 -o "$out/p.f32" 2>&1 | grep -o "OMP_WAIT_POLICY = '[A-Z]*'" | tail -n 1; }
for case in "PASSIVE|" "ACTIVE|OMP_WAIT_POLICY=active"; do
    want=${case%%|*}; set_env=${case#*|}
    got=$(policy $set_env)
    name="wait_policy_${want}${set_env:+_$set_env}"
    if [ "$got" = "OMP_WAIT_POLICY = '$want'" ]; then pass=$((pass + 1)); echo "PASS $name"
    else fail=$((fail + 1)); echo "FAIL $name: got '$got'"; fi
done
echo "$pass passed, $fail failed"
[ $fail = 0 ]
