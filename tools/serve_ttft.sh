#!/usr/bin/env bash
# tools/serve_ttft.sh - glm serve's prefix cache measured through HTTP: the time to first
# token of 2,000-token prompts whose first 60% an earlier prompt left in the cache, over
# that of prompts the cache knows nothing of (issue 34's target: <= 0.5x). A benchmark, not
# a test: `make bench-serve` runs it.
#
#   tools/serve_ttft.sh MODEL [RUNS] [-- glm serve flags...]
#   GLM=./glm            the program
#   PORT=8093            where the server listens
#
# One server for the whole run. Its first request pages the weights in and is not counted
# (counted, it would make the uncached prompts look slower than they are). Then RUNS
# (default 2) times, one client: `glm loadgen --shared 0.6 --requests 3` (its first request
# computes the shared 1,200 tokens, uncached; the other two find them in the cache), then
# `--shared 0 --requests 1` (uncached). Each request's TTFT and cached tokens come from the
# server's log line. Prints every request, the medians and their ratio; the last line is
# `TTFT_RATIO <cached median / uncached median>` for scripts. Exit status 1 if the server
# did not start or a request failed.
set -u
. "$(dirname "$0")/serve_bench.sh"
serve_bench_args serve_ttft RUNS 2 "$@"
RUNS=$COUNT
PORT=${PORT:-8093}
serve_bench_start serve_ttft

# C requests of 2,000 tokens with SHARE of each a prefix common to the run's requests
load() {
    "$GLM" loadgen "$URL" --input 2000 --output 4 --shared "$1" --concurrency 1 --requests "$2" --seed "$3" >/dev/null 2>&1 ||
        { echo "serve_ttft: loadgen --shared $1 --requests $2 failed" >&2; return 1; }
}
load 0 1 999 || exit 1
for r in $(seq "$RUNS"); do
    load 0.6 3 "$r" && load 0 1 $((1000 + r)) || exit 1
done
# the log lines "serve: cmpl-N 200 in 2000 cached C out 4 ttft T s ...", past the first
grep '^serve: cmpl' "$LOG" | tail -n +2 | awk '
    { cached = $7; t = $11; printf "request %d: %d tokens from the cache, TTFT %.2f s\n", NR, cached, t
      if (cached > 0) c[++nc] = t; else u[++nu] = t }
    function median(v, n,    i, j, x) {
        for (i = 2; i <= n; i++) { x = v[i]; for (j = i - 1; j > 0 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
        return (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }
    END {
        if (!nc || !nu) { print "serve_ttft: no cached or no uncached request"; exit 1 }
        mc = median(c, nc); mu = median(u, nu)
        printf "serve_ttft: median TTFT %.2f s from the cache (%d requests), %.2f s uncached (%d): %.2fx; issue 34'"'"'s target <= 0.5x\n", mc, nc, mu, nu, mc / mu
        printf "TTFT_RATIO %.3f\n", mc / mu }'
