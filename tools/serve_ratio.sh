#!/usr/bin/env bash
# tools/serve_ratio.sh - glm serve's batching measured through HTTP: the decode tok/s of 8
# concurrent sequences over one sequence's (issue 34's target: >= 5x on the benchmark
# checkpoint). A benchmark, not a test: `make bench-serve` and tests/gpu_check.sh run it.
#
#   tools/serve_ratio.sh MODEL [PAIRS] [-- glm serve flags...]
#   GLM=./glm            the program (gpu_check passes its GPU build and --gpu)
#   PORT=8092            where the server listens
#
# One server (--parallel 8) for the whole run; then PAIRS (default 3) alternating runs of
# `glm loadgen --input 64 --output 48 --shared 0`, 8 clients then 1 (alternating: a VM's
# memory speed swings 1.5x within minutes, so each pair is measured in the same moments).
# A sequence's decode rate is 1 / its median time between tokens (ITL): the prompts' prefill
# lands in TTFT, not in the ITL, so the ratio compares decode steps alone. Per pair:
#   8 sequences: 8 / ITL(8)   one sequence: 1 / ITL(1)   ratio = 8 * ITL(1) / ITL(8)
# The last line is `RATIO <median of the pairs' ratios>` for scripts. Exit status 1 if the
# server did not start or a request failed.
set -u
. "$(dirname "$0")/serve_bench.sh"
serve_bench_args serve_ratio PAIRS 3 "$@"
PAIRS=$COUNT
PORT=${PORT:-8092}
serve_bench_start serve_ratio --parallel 8

# the median ITL (ms) of one loadgen run with C clients, C requests
itl() {
    local out
    out=$("$GLM" loadgen "$URL" --input 64 --output 48 --shared 0 --concurrency "$1" --requests "$1" --seed "$2" --json) ||
        { echo "serve_ratio: loadgen with $1 clients failed: $out" >&2; return 1; }
    echo "$out" | grep -o '"median_itl_ms": [0-9.]*' | awk '{print $2}'
}
itl 1 999 >/dev/null || exit 1 # warm-up: page the weights in, start the threads
ratios=()
for p in $(seq "$PAIRS"); do
    i8=$(itl 8 "$p") && i1=$(itl 1 "$p") || exit 1
    r=$(awk -v a="$i1" -v b="$i8" 'BEGIN { printf "%.2f", 8 * a / b }')
    awk -v p="$p" -v a="$i1" -v b="$i8" -v r="$r" 'BEGIN {
        printf "pair %d: 8 sequences ITL %.1f ms (%.1f tok/s), one %.1f ms (%.1f tok/s): %sx\n", p, b, 8000 / b, a, 1000 / a, r }'
    ratios+=("$r")
done
# the median and the range of the pairs' ratios, then the line for scripts
printf '%s\n' "${ratios[@]}" | sort -g | awk -v pairs="$PAIRS" '{ v[NR] = $1 } END {
    med = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "serve_ratio: 8 sequences over one, median of %d pairs: %gx (range %s-%s); issue 34'"'"'s target 5x\nRATIO %g\n", pairs, med, v[1], v[NR], med }'
