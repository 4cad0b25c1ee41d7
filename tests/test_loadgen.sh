#!/usr/bin/env bash
# glm loadgen (tools/loadgen.c) against tests/fake_openai.py, a fake OpenAI endpoint:
# - every request succeeds, streamed (SSE ending in a close), whole, mixed, and with
#   Transfer-Encoding: chunked; the counts are exact (requests, input = requests x --input,
#   output = requests x --output); the requests are what a server expects (token-id prompts of
#   --input ids in --vocab, one common prefix of --shared of them, distinct suffixes,
#   max_tokens, ignore_eos, stream_options.include_usage, the model from GET /v1/models, the
#   API key); TTFT/TPOT/ITL/E2E follow the fake's per-token delay; the cache-hit share is the
#   fake's cached_tokens over the prompt tokens; --rate spreads the arrivals;
# - a server's failures (HTTP 500, a malformed event, a non-SSE line, a stream cut short, a
#   bad chunk, no answer before --timeout) fail those requests only: they are counted and the
#   first messages reported, exit 1; connection refused fails every request, exit 1;
# - --json is one JSON object with every key; a bad flag or URL is one error line, exit 1.
# Uses `$GLM loadgen` when the binary has it, else a driver built here from tools/loadgen.c
# (always built once, with -Werror, as a check). Ends with "N passed, N failed".
set -u
cd "$(dirname "$0")/.." || exit 1
GLM=${GLM:-./glm}
out=tests/out/loadgen; rm -rf "$out"; mkdir -p "$out"
pass=0; fail=0
# ok RESULT NAME [FILE]: on failure also prints FILE's first lines
ok() {
    if [ "$1" = 1 ]; then pass=$((pass + 1)); echo "PASS $2"
    else fail=$((fail + 1)); echo "FAIL $2"; [ -n "${3:-}" ] && [ -s "$3" ] && head -n 5 "$3" | sed 's/^/    /'; fi
}
if ! command -v python3 >/dev/null; then echo "FAIL python3 not found (make deps)"; echo "0 passed, 1 failed"; exit 1; fi

# the driver: loadgen_main as a program of its own, warnings are errors
printf 'int loadgen_main(int argc, char **argv);\nint main(int argc, char **argv) { return loadgen_main(argc, argv); }\n' >"$out/driver.c"
${CC:-cc} -std=c11 -Wall -Wextra -Werror -O1 -pthread -I. -o "$out/loadgen" "$out/driver.c" tools/loadgen.c model.c json.c -lm 2>"$out/cc.err"; rc=$?
ok "$([ $rc = 0 ] && [ ! -s "$out/cc.err" ] && echo 1 || echo 0)" "loadgen_compiles_clean_wall_wextra" "$out/cc.err"
if [ -x "$GLM" ] && "$GLM" loadgen --help 2>/dev/null | grep -q '^usage: glm loadgen'; then LG=("$GLM" loadgen); echo "    (testing $GLM loadgen)"
elif [ $rc = 0 ]; then LG=("$out/loadgen"); echo "    ($GLM has no loadgen command yet: testing the driver built from tools/loadgen.c)"
else echo "$pass passed, $((fail + 1)) failed"; exit 1; fi

FAKE_PID=; FAKE_LOG=/dev/null
trap '[ -n "$FAKE_PID" ] && kill "$FAKE_PID" 2>/dev/null' EXIT
# start_fake NAME [fake flags]: the fake on a free port, its requests logged to $out/NAME.log; sets URL
start_fake() {
    local name=$1; shift
    python3 tests/fake_openai.py --port-file "$out/$name.port" --log "$out/$name.log" "$@" 2>"$out/$name.srv.err" &
    FAKE_PID=$!
    FAKE_LOG="$out/$name.log"
    for _ in $(seq 200); do [ -s "$out/$name.port" ] && break; sleep 0.05; done
    URL="http://127.0.0.1:$(cat "$out/$name.port" 2>/dev/null)"
}
stop_fake() { [ -n "$FAKE_PID" ] && kill "$FAKE_PID" 2>/dev/null && wait "$FAKE_PID" 2>/dev/null; FAKE_PID=; FAKE_LOG=/dev/null; }
# check NAME PYTHON_EXPR...: python3 prints 1 if every expression holds, else the first that does not;
# j = the JSON report $out/NAME.json (None if it does not parse), log = the running fake's request log
check() {
    local name=$1; shift
    python3 - "$out/$name.json" "$FAKE_LOG" "$@" <<'EOF'
import json, sys
try: j = json.load(open(sys.argv[1]))
except Exception: j = None
try: log = [json.loads(l) for l in open(sys.argv[2])]
except Exception: log = []
for e in sys.argv[3:]:
    try: r = eval(e)
    except Exception as x: r = False; e += " (%s)" % x
    if not r: print("not: " + e); sys.exit()
print(1)
EOF
}
KEYS="url model stream input_len output_len shared shared_prefix_len request_rate max_concurrency requests successful_requests
failed_requests duration_s total_input_tokens total_output_tokens request_throughput input_throughput output_throughput total_throughput
prompt_tokens cached_tokens cache_hit_rate concurrency mean_ttft_ms median_ttft_ms p90_ttft_ms p99_ttft_ms mean_tpot_ms median_tpot_ms
p90_tpot_ms p99_tpot_ms mean_itl_ms median_itl_ms p90_itl_ms p99_itl_ms mean_e2e_latency_ms median_e2e_latency_ms p90_e2e_latency_ms
p99_e2e_latency_ms errors"
keys_expr="all(k in j for k in '$(echo $KEYS)'.split())"
# run NAME [loadgen flags]: stdout to $out/NAME.json, stderr to $out/NAME.err, exit status in rc
run() { local name=$1; shift; "${LG[@]}" "$URL" "$@" >"$out/$name.json" 2>"$out/$name.err"; rc=$?; }
# report NAME RC EXPR...: one check of the exit status and the expressions
report() {
    local name=$1 want=$2; shift 2
    local r; r=$(check "$name" "$@")
    [ "$rc" != "$want" ] && r="exit $rc, expected $want"
    [ "$r" != 1 ] && echo "$r" >"$out/$name.why" && cat "$out/$name.err" >>"$out/$name.why"
    ok "$([ "$r" = 1 ] && echo 1 || echo 0)" "$name" "$out/$name.why"
}

# --help: every flag with its default, the http-only note, exit 0
"${LG[@]}" --help >"$out/help.out" 2>"$out/help.err"; rc=$?
r=1; [ $rc = 0 ] && [ ! -s "$out/help.err" ] && grep -q '^usage: glm loadgen URL' "$out/help.out" && grep -q 'no TLS' "$out/help.out" || r=0
for f in --input --output --shared --concurrency --requests --rate --model --seed --vocab --stream --api-key --timeout --json; do
    grep -A2 -- "^  $f " "$out/help.out" | grep -q 'default' || { r=0; echo "    --help: no default for $f"; }
done
ok $r "loadgen_help_lists_flags_and_defaults" "$out/help.err"

# streamed (SSE until close): exact counts, and the requests as a server sees them
start_fake plain --token-delay 1
run stream --input 64 --output 8 --requests 16 --concurrency 4 --shared 0.5 --json
report stream 0 "$keys_expr" "j['successful_requests'] == 16 and j['failed_requests'] == 0 and j['errors'] == []" \
    "j['total_input_tokens'] == 16 * 64 and j['total_output_tokens'] == 16 * 8 and j['model'] == 'fake-model'" \
    "j['shared_prefix_len'] == 32 and j['stream'] == '1' and j['max_concurrency'] == 4 and j['request_rate'] is None" \
    "len(log) == 16 and all(l['n_prompt'] == 64 and l['stream'] and l['max_tokens'] == 8 and l['model'] == 'fake-model' for l in log)" \
    "all(l['prompt'][:32] == log[0]['prompt'][:32] for l in log) and len({tuple(l['prompt'][32:]) for l in log}) == 16" \
    "all(100 <= x < 10000 for l in log for x in l['prompt'])" \
    "j['mean_ttft_ms'] > 0 and j['median_tpot_ms'] > 0 and j['mean_itl_ms'] > 0 and j['p99_e2e_latency_ms'] >= j['median_e2e_latency_ms']"
# whole responses, the table: the same counts in its rows
rm -f "$out/plain.log"
run whole --input 50 --output 5 --requests 16 --concurrency 8 --stream 0
r=1; [ $rc = 0 ] || r=0
for row in "Successful requests: 16" "Failed requests: 0" "Total input tokens: 800" "Total generated tokens: 80" "Max concurrency: 8"; do
    sed 's/  */ /g' "$out/whole.json" | grep -qx "$row" || { r=0; echo "    no row '$row'"; }
done
# (TTFT is the whole response's time; TPOT and ITL need a stream)
for row in "Mean TTFT (ms):" "P90 E2E (ms):" "Cache hit share:" "Request throughput (req/s):" "Output token throughput (tok/s):" "Concurrency:" "TPOT n/a" "ITL n/a"; do
    sed 's/  */ /g' "$out/whole.json" | grep -qF "$row" || { r=0; echo "    no row '$row'"; }
done
[ "$(check whole "len(log) == 16 and not any(l['stream'] for l in log)")" = 1 ] || r=0
ok $r "whole_responses_table" "$out/whole.err"
rm -f "$out/plain.log"
run mixed --input 30 --output 4 --requests 16 --stream mixed --json --vocab 5..20
report mixed 0 "j['successful_requests'] == 16 and j['total_output_tokens'] == 64 and j['total_input_tokens'] == 480" \
    "sum(l['stream'] for l in log) == 8 and len(log) == 16 and all(5 <= x < 20 for l in log for x in l['prompt'])"
# a base URL with /v1/ (as OpenAI clients take it) is the same server
URL0=$URL; URL="$URL0/v1/"
run base_url --input 10 --output 2 --requests 2 --json
report base_url 0 "j['successful_requests'] == 2"
URL=$URL0
# the cache-hit share: one at a time, half of each prompt shared: 0 + 3 x 20 of 4 x 40 cached
rm -f "$out/plain.log"
run cache --input 40 --output 2 --requests 4 --concurrency 1 --shared 0.5 --seed 7 --json
report cache 0 "j['cached_tokens'] == 60 and abs(j['cache_hit_rate'] - 0.375) < 1e-9 and j['prompt_tokens'] == 160"
# --rate: Poisson arrivals at 40/s spread 8 requests over ~0.2 s
run rate --input 10 --output 2 --requests 8 --rate 40 --json
report rate 0 "j['successful_requests'] == 8 and j['duration_s'] > 0.05 and j['request_rate'] == 40"
stop_fake
# the timings follow the fake's 20 ms per token: TTFT ~20, TPOT and ITL ~20, E2E ~6 x 20 ms
start_fake slow --token-delay 20
run timing --input 20 --output 6 --requests 4 --concurrency 4 --json
report timing 0 "15 <= j['median_ttft_ms'] < 100 and 15 <= j['median_tpot_ms'] < 60 and 15 <= j['median_itl_ms'] < 60" \
    "110 <= j['median_e2e_latency_ms'] < 400 and 2 < j['concurrency'] <= 4.01"
stop_fake

# Transfer-Encoding: chunked (llama-server, uvicorn), streamed and whole
start_fake chunked --chunked
run chunked_stream --input 64 --output 8 --requests 12 --concurrency 3 --json
report chunked_stream 0 "j['successful_requests'] == 12 and j['total_input_tokens'] == 768 and j['total_output_tokens'] == 96"
run chunked_whole --input 64 --output 8 --requests 12 --stream 0 --json
report chunked_whole 0 "j['successful_requests'] == 12 and j['total_output_tokens'] == 96"
stop_fake

# failures: every 4th request gets HTTP 500; counted, reported, exit 1
start_fake fail500 --fail-every 4
run fail500 --input 16 --output 4 --requests 16 --concurrency 4 --json
report fail500 1 "$keys_expr" "j['failed_requests'] == 4 and j['successful_requests'] == 12 and j['total_input_tokens'] == 12 * 16" \
    "len(j['errors']) == 4 and all('HTTP 500: fake failure on request' in e for e in j['errors'])"
run fail500_table --input 16 --output 4 --requests 8
r=1; [ $rc = 1 ] && sed 's/  */ /g' "$out/fail500_table.json" | grep -qx "Failed requests: 2" \
    && grep -q "^  request [0-9]*: HTTP 500: fake failure" "$out/fail500_table.json" || r=0
for row in "Median TTFT (ms):" "P99 TPOT (ms):" "Median ITL (ms):" "Mean E2E (ms):"; do
    grep -qF "$row" "$out/fail500_table.json" || { r=0; echo "    no row '$row'"; }
done
ok $r "fail500_table" "$out/fail500_table.err"
stop_fake
# malformed streams: each fails its request (every 2nd of 8: 4 failures), no crash
for m in badjson:"malformed SSE event" noise:"malformed SSE line" truncate:"without \[DONE\]" badchunk:"chunked encoding"; do
    mode=${m%%:*}; msg=${m#*:}
    extra=(); [ "$mode" = badchunk ] && extra=(--chunked)
    start_fake "bad_$mode" --fail-every 2 --fail-mode "$mode" "${extra[@]}"
    run "malformed_$mode" --input 16 --output 4 --requests 8 --concurrency 2 --json
    report "malformed_$mode" 1 "j['failed_requests'] == 4 and j['successful_requests'] == 4" \
        "all(__import__('re').search(r'$msg', e) for e in j['errors'])"
    stop_fake
done
# a server that never answers: --timeout fails those requests
start_fake hang --fail-every 2 --fail-mode hang
run timeout --input 16 --output 2 --requests 4 --concurrency 4 --timeout 1 --json
report timeout 1 "j['failed_requests'] == 2 and all('timed out after 1 s' in e for e in j['errors'])"
stop_fake
# --api-key: Authorization: Bearer KEY (the fake answers 401 without it)
start_fake key --api-key sekrit
run key_missing --model fake-model --input 8 --output 2 --requests 3 --json
report key_missing 1 "j['failed_requests'] == 3 and all('HTTP 401: invalid api key' in e for e in j['errors'])"
run key_given --api-key sekrit --input 8 --output 2 --requests 3 --json
report key_given 0 "j['successful_requests'] == 3 and j['model'] == 'fake-model'"
stop_fake

# connection refused: every request fails, the report is printed, exit 1; without --model,
# GET /v1/models is the one error line
URL="http://127.0.0.1:$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
run refused --model m --input 8 --output 2 --requests 5 --json
report refused 1 "$keys_expr" "j['failed_requests'] == 5 and j['successful_requests'] == 0 and j['mean_ttft_ms'] is None" \
    "len(j['errors']) == 5 and all('Connection refused' in e for e in j['errors'])"
run refused_models --input 8 --requests 2
r=1; [ $rc = 1 ] && [ "$(wc -l <"$out/refused_models.err")" = 1 ] && grep -q '^glm: error: .*/v1/models: .*refused' "$out/refused_models.err" \
    && [ ! -s "$out/refused_models.json" ] || r=0
ok $r "refused_without_model_one_error_line" "$out/refused_models.err"

# bad flags and URLs: one line "glm: error: ...", exit 1, nothing on stdout
r=1; n=0
while IFS='|' read -r url args want; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    "${LG[@]}" $url $args >"$out/flag$n.out" 2>"$out/flag$n.err"; rc=$?
    if [ $rc != 1 ] || [ "$(wc -l <"$out/flag$n.err")" != 1 ] || [ -s "$out/flag$n.out" ] || ! grep -q "^glm: error: $want" "$out/flag$n.err"; then
        r=0; echo "    '$url $args': exit $rc: $(head -c 200 "$out/flag$n.err")"
    fi
done <<EOF
http://127.0.0.1:1|--input 0|--input 0: expected
http://127.0.0.1:1|--input 12x|--input 12x: expected
http://127.0.0.1:1|--output -1|--output -1: expected
http://127.0.0.1:1|--shared 1.5|--shared 1.5: expected
http://127.0.0.1:1|--shared abc|--shared abc: expected
http://127.0.0.1:1|--concurrency 0|--concurrency 0: expected
http://127.0.0.1:1|--requests 0|--requests 0: expected
http://127.0.0.1:1|--rate 0|--rate 0: expected
http://127.0.0.1:1|--rate -2|--rate -2: expected
http://127.0.0.1:1|--rate fast|--rate fast: expected
http://127.0.0.1:1|--seed -1|--seed -1: expected
http://127.0.0.1:1|--vocab 10..5|--vocab 10..5: expected
http://127.0.0.1:1|--vocab 50|--vocab 50: expected
http://127.0.0.1:1|--vocab a..b|--vocab a..b: expected
http://127.0.0.1:1|--stream 2|--stream 2: expected
http://127.0.0.1:1|--timeout 0|--timeout 0: expected
http://127.0.0.1:1|--timeout x|--timeout x: expected
http://127.0.0.1:1|--bogus 1|loadgen: unknown flag --bogus
http://127.0.0.1:1|--input|--input: missing value
http://127.0.0.1:1|http://x|loadgen: unexpected argument
|--input 5|loadgen: URL is required
https://127.0.0.1:1||URL https://127.0.0.1:1: https is not supported
ftp://127.0.0.1:1||URL ftp://127.0.0.1:1: expected http://
http://127.0.0.1:99999||URL http://127.0.0.1:99999: expected a port
http://:80||URL http://:80: expected http://
EOF
ok $r "bad_flags_one_error_line_exit_1"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
