# tools/serve_bench.sh - sourced by tools/serve_ratio.sh and tools/serve_ttft.sh: their
# command line and their one glm serve.
#
#   serve_bench_args NAME WHAT DEFAULT "$@"
#       reads `MODEL [COUNT] [-- glm serve flags...]`: sets MODEL, COUNT (DEFAULT when
#       absent; WHAT names it in the errors) and SERVE_FLAGS; exits 1 on a bad COUNT
#   serve_bench_start NAME [glm serve flags...]
#       starts $GLM (default ./glm) serve -m MODEL on $PORT with those flags and SERVE_FLAGS,
#       waits until it listens (else says why and exits 1); sets URL, LOG and pid, and stops
#       the server and removes LOG when the script exits

serve_bench_args() {
    local name=$1 what=$2
    COUNT=$3
    shift 3
    MODEL=${1:?usage: tools/$name.sh MODEL [$what] [-- glm serve flags...]}
    shift
    if [ $# -gt 0 ] && [ "$1" != "--" ]; then COUNT=$1; shift; fi
    [ "${1:-}" = "--" ] && shift
    case "$COUNT" in '' | *[!0-9]* | 0) echo "$name: $what must be a positive count, not '$COUNT'"; exit 1 ;; esac
    SERVE_FLAGS=("$@")
}

serve_bench_start() {
    local name=$1
    shift
    GLM=${GLM:-./glm}
    URL=http://127.0.0.1:$PORT
    LOG=$(mktemp)
    trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -f "$LOG"' EXIT
    "$GLM" serve -m "$MODEL" --port "$PORT" "$@" "${SERVE_FLAGS[@]}" >"$LOG" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
        grep -q 'listening on' "$LOG" && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    grep -q 'listening on' "$LOG" || { echo "$name: glm serve did not start:"; tail -n 5 "$LOG"; exit 1; }
}
