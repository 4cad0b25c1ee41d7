#!/usr/bin/env bash
# glm serve (serve.c, http.c), the OpenAI-compatible server, on a tiny random model with the
# real GLM-5.2 tokenizer; the HTTP checks are tests/serve/checks.py (standard library only),
# the SDK checks tests/serve/sdk_test.mjs (the official openai npm package: make deps):
# - /health, /v1/models (the folder name, or --alias), 404, 405;
# - /v1/completions with a text or token-id prompt: usage, max_tokens exact (ignore_eos),
#   stop strings cut the text (whole and streamed), a seed repeats a sampled text, temperature
#   0 is deterministic, the greedy tokens are glm run's; /v1/chat/completions: reasoning_content
#   by default, content only with thinking off (each spelling of the switch), tools give a
#   well-formed answer;
# - streaming: "data: {...}" events and "data: [DONE]", the deltas join to the whole response,
#   stream_options.include_usage adds a last chunk with no choices and the usage;
# - errors as OpenAI error bodies: malformed JSON, wrong types (400 naming the field), a prompt
#   over --ctx (400), a body over --max-body (413), --api-key (401; /health is open), bad HTTP
#   (400), a full queue (503); Expect: 100-continue is answered at once;
# - tool calls (GLM_SERVE_SCRIPT: scripted output): reasoning_content, content and tool_calls
#   whole and streamed, finish_reason "tool_calls"; no tools requested or thinking off: text;
#   a stop string inside the reasoning; sampled tokens' log-probabilities (two requests drawn
#   in the same steps) as log_softmax of glm logits;
# - batch invariance: with fp32 products, 8 prompts sharing 300 ids give the same tokens and
#   bit-identical log-probabilities alone and together (SAN=1: 2 prompts of 8 tokens; plain C kernels, GLM_KERNELS=c: alone
#   first, then together, then again from the prefix cache; the default kernels: together
#   first, every prompt uncached, then alone; and the same with bf16 products);
# - the prefix cache: a 220-token prompt after its first 200 starts from 192 cached positions
#   (16-token blocks); a prompt that starts from any whole block (one a short last chunk wrote
#   too) gets the logits of a server without a cache whose chunks start elsewhere, bit for
#   bit; --cache-mb 0: none;
# - --draft N (the MTP layer drafts; the tiny model has one): greedy tokens and logprobs
#   bit-identical to a server without drafts, alone, 4 together (SAN=1: 2) and from the prefix
#   cache, with fp32 and (not SAN=1) with bf16 products; seeded sampling batch invariant; drafts that are
#   glm run's greedy continuation (GLM_DRAFT_ORACLE) all accepted, the text glm run's;
# - load: 500 requests from 32 clients (SAN=1: 50 from 16), streamed and not, every one
#   answered with its exact token count and a distinct id; RSS (+30 MB; SAN=1: +100 MB) and
#   the open descriptors come back;
# - a client that leaves mid-stream, or before a whole answer, frees its slot, or its place in
#   the queue; SIGTERM during a stream ends it, answers the queued request and the server exits
#   0 within 5 s; the same under load; SIGINT on an idle server with an idle connection and half
#   a request open the same.
# Ends with "N passed, N failed"; exits non-zero on any failure. Takes ~55 s on 2 cores
# (SAN=1, ./glm_asan: ~60 s); the logs are left in tests/out/serve/
export GLM_PRECISION="${GLM_PRECISION:-fp32}"
set -u
cd "$(dirname "$0")/.." || exit 1
GLM=${GLM:-./glm}
SAN=${SAN:-}
export SAN
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
out=tests/out/serve; rm -rf "$out"; mkdir -p "$out"
pass=0; fail=0
t_start=$(date +%s)
# ok RESULT NAME [FILE]: on failure also prints FILE's first lines
ok() {
    if [ "$1" = 1 ]; then pass=$((pass + 1)); echo "PASS $2"
    else fail=$((fail + 1)); echo "FAIL $2"; [ -n "${3:-}" ] && [ -s "$3" ] && head -n 5 "$3" | sed 's/^/    /'; fi
}
# count: echoes the PASS/FAIL lines of a checker from stdin and adds them up; a checker that
# printed none fails once under NAME
count() {
    local name=$1 line n=0
    while IFS= read -r line; do
        case $line in
            "PASS "*) pass=$((pass + 1)); n=$((n + 1));;
            "FAIL "*) fail=$((fail + 1)); n=$((n + 1));;
        esac
        echo "$line"
    done
    [ $n = 0 ] && { fail=$((fail + 1)); echo "FAIL $name printed no result"; }
}
# py GROUP ARGS...: one group of tests/serve/checks.py, its stderr in $out/GROUP.py.err; a group
# that runs past its time fails once more
py() {
    local group=$1 t0=$SECONDS rc; shift
    timeout "$((SAN_MUL * 150))" "$PY" tests/serve/checks.py "$group" "$@" >"$out/$group.py.out" 2>"$out/$group.py.err"; rc=$?
    count "$group" <"$out/$group.py.out"
    [ $rc = 124 ] && ok 0 "${group}_finished_in_time ($((SAN_MUL * 150)) s)" "$out/$group.py.err"
    grep '^    (' "$out/$group.py.err"
    grep -q Traceback "$out/$group.py.err" && tail -n 8 "$out/$group.py.err" | sed 's/^/    /'
    echo "    ($group: $((SECONDS - t0)) s)"
    return 0
}
# SAN=1 (ASan + UBSan, several times slower): less load, fewer and shorter plain-C prompts
if [ -n "$SAN" ] && [ "$SAN" != 0 ]; then SAN_MUL=3; N_LOAD=50; C_LOAD=16; N_INV=2; T_INV=8; N_DRAFT=2
else SAN_MUL=1; N_LOAD=500; C_LOAD=32; N_INV=8; T_INV=16; N_DRAFT=4; fi

. tests/tokenizer_json.sh
if ! need_tokenizer; then echo "FAIL $TOK_WHY"; echo "0 passed, 1 failed"; exit 1; fi
if [ ! -x "$GLM" ]; then echo "FAIL $GLM not found (run make)"; echo "0 passed, 1 failed"; exit 1; fi
if ! $GLM synth "$out/m" --tiny --mtp --seed 3 --tokenizer "$TOK" >/dev/null 2>"$out/synth.err"; then
    echo "FAIL synth the tiny model: $(tr '\n' ' ' < "$out/synth.err")"; echo "0 passed, 1 failed"; exit 1
fi

# the servers: every one started is killed on exit, whatever happened
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done' EXIT
# start NAME [VAR=VALUE...] -- [serve flags]: a server on a free port, its stderr in
# $out/NAME.log; sets URL and PID; returns 1 (after a FAIL line) when it never listened
start() {
    local name=$1 envs=() try
    shift
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    for try in 1 2 3 4 5 6 7 8; do
        local port=$((20000 + RANDOM % 20000))
        : >"$out/$name.log"
        env ${envs[@]+"${envs[@]}"} "$GLM" serve -m "$out/m" --port "$port" "$@" >"$out/$name.log" 2>&1 &
        PID=$!
        PIDS+=("$PID")
        for _ in $(seq $((SAN_MUL * 200))); do # 10 s (SAN=1: 30 s)
            if grep -q '^serve: listening on' "$out/$name.log"; then URL="http://127.0.0.1:$port"; return 0; fi
            kill -0 "$PID" 2>/dev/null || break
            sleep 0.05
        done
        kill -9 "$PID" 2>/dev/null; wait "$PID" 2>/dev/null
        grep -q 'cannot listen' "$out/$name.log" || break # anything but a busy port: no retry
    done
    ok 0 "start_server_$name (no 'serve: listening' line)" "$out/$name.log"
    return 1
}
# stop_wait PID SECONDS: waits for the process to exit; sets RC (its status, or "running")
stop_wait() {
    local pid=$1 n=$(($2 * 20))
    RC=running
    for _ in $(seq "$n"); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    if ! kill -0 "$pid" 2>/dev/null; then wait "$pid"; RC=$?; fi
}

# --help: every flag and request field is there
$GLM serve --help >"$out/help.out" 2>"$out/help.err"; rc=$?
r=1; [ $rc = 0 ] && grep -q '^usage: glm serve' "$out/help.out" || r=0
for f in --host --port --parallel --ctx --chunk --cache-mb --queue --max-body --api-key --alias --tokenizer --draft; do
    grep -q -- "^  $f " "$out/help.out" || { r=0; echo "    --help: no $f"; }
done
ok $r "serve_help" "$out/help.err"
$GLM serve -m "$out/m" --bogus 1 >/dev/null 2>"$out/flag.err"; rc=$?
ok "$([ $rc = 1 ] && [ "$(wc -l <"$out/flag.err")" = 1 ] && grep -q "unknown flag '--bogus'" "$out/flag.err" && echo 1 || echo 0)" \
    "serve_unknown_flag_one_line" "$out/flag.err"

# the main server: default kernels, fp32 products, 8 sequences, prompts in chunks of 24 tokens
# (not a multiple of the cache's 16-token blocks, which it hands out whatever the chunks)
if start main -- --fp32 --parallel 8 --chunk 24; then
    MAIN_URL=$URL
    py basic "$URL" m
    py completions "$URL"
    py chat "$URL"
    py stream "$URL"
    py errors "$URL"
    py cache "$URL"
    OUT=$out py continuation "$URL" "$GLM" "$out/m"
    py invariance "$URL" fast "$N_INV" "$T_INV"
    # curl: a stream is "data: ..." lines and blank lines, ending with [DONE]
    curl -sS -N "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
        -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":8,"stream":true}' >"$out/curl_stream.txt" 2>"$out/curl_stream.err"
    r=1; [ "$(head -c 7 "$out/curl_stream.txt")" = "data: {" ] && [ "$(grep -v '^$' "$out/curl_stream.txt" | tail -n 1)" = "data: [DONE]" ] \
        && ! grep -qv '^data: \|^$' "$out/curl_stream.txt" || r=0
    ok $r "curl_stream_sse_lines" "$out/curl_stream.err"
    # "Expect: 100-continue" (older curls send it with a body over 1 KB, then wait up to 1 s for the 100)
    pad=$(head -c 1500 /dev/zero | tr '\0' x)
    res=$(curl -sS -o "$out/curl_big.json" -w '%{http_code} %{time_total}' "$URL/v1/completions" -H 'Content-Type: application/json' \
        -H 'Expect: 100-continue' \
        -d "{\"prompt\":[1,2,3],\"max_tokens\":1,\"user\":\"$pad\"}" 2>&1)
    ok "$(echo "$res" | awk '{print ($1 == 200 && $2 < 0.8) ? 1 : 0}')" "curl_expect_100_continue_no_delay (HTTP code, seconds: $res)"
fi

# --draft (the model has the MTP layer): greedy tokens and logprobs bit-identical to the main
# server's (the same flags, no drafts), alone, together and from the prefix cache
if [ -n "${MAIN_URL:-}" ] && start drafts -- --fp32 --parallel 8 --chunk 24 --draft 3; then
    py drafts "$URL" "$MAIN_URL" fp32 "$N_DRAFT"
    kill "$PID" 2>/dev/null
fi
# drafts that are glm run's greedy continuation (GLM_DRAFT_ORACLE): every one accepted
OP=$(seq 500 523 | tr '\n' , | sed 's/,$//')
OW=$($GLM run -m "$out/m" --ids "$OP" -n 16 --temp 0 2>/dev/null | tr -s ' \n' ',' | sed 's/^,//; s/,$//')
if [ -n "$OW" ] && start oracle "GLM_DRAFT_ORACLE=$OP,$OW" -- --fp32 --parallel 2 --chunk 24 --draft 3; then
    py oracle "$URL" "$OP" "$OW" "$out/oracle.log" "$GLM" "$out/m"
    kill "$PID" 2>/dev/null
fi

# --api-key, --alias, a short context, a small body limit
KEY=secret
if start limits -- --api-key "$KEY" --alias tiny-glm --ctx 64 --max-body 2048 --parallel 2; then
    LIM_URL=$URL; LIM_PID=$PID
    py limits "$URL" "$KEY" tiny-glm 64
    # the OpenAI SDK against the main server, and its 401 against this one
    if [ -n "${MAIN_URL:-}" ]; then
        if command -v node >/dev/null; then
            timeout $((SAN_MUL * 120)) node tests/serve/sdk_test.mjs "$MAIN_URL" "$LIM_URL" "$KEY" >"$out/sdk.out" 2>"$out/sdk.err"; rc=$?
            count sdk <"$out/sdk.out"
            [ $rc = 124 ] && ok 0 "sdk_finished_in_time" "$out/sdk.err"
            [ -s "$out/sdk.err" ] && head -n 5 "$out/sdk.err" | sed 's/^/    /'
        else ok 0 "sdk (node not found: run make deps)"; fi
    fi
    # SIGINT on an idle server (an idle connection and half a request open): exit status 0 within 5 s
    py sigint "$URL" "$LIM_PID"
    stop_wait "$LIM_PID" 5
    ok "$([ "$RC" = 0 ] && grep -q '^serve: stopped' "$out/limits.log" && echo 1 || echo 0)" "sigint_idle_exits_0 (status $RC)" "$out/limits.log"
fi

# one sequence, a queue of one, no prefix cache: 503, --cache-mb 0, disconnects, SIGTERM
if start p1 -- --parallel 1 --queue 1 --cache-mb 0; then
    P1_PID=$PID
    py queue "$URL"
    py nocache "$URL"
    py disconnect "$URL" "$out/p1.log"
    py sigterm "$URL" "$P1_PID"
    stop_wait "$P1_PID" 5
    ok "$([ "$RC" = 0 ] && echo 1 || echo 0)" "sigterm_during_stream_exits_0 (status $RC)" "$out/p1.log"
fi

# batch invariance with the plain C kernels: logprobs bit-identical alone, together, cached
if start plain GLM_KERNELS=c -- --fp32 --parallel 8; then
    py invariance "$URL" c "$N_INV" "$T_INV"
fi

# tool calls, reasoning and stop strings on output the tiny model cannot be made to write:
# GLM_SERVE_SCRIPT makes every request generate these ids (then the end-of-sequence id)
REASON="Looks like weather." ANSWER="Checking." CALL="<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"
SCRIPT=$($GLM tokenize -m "$out/m" "$REASON</think>$ANSWER$CALL" | tr ' ' ,)
if [ -n "$SCRIPT" ] && start tools "GLM_SERVE_SCRIPT=$SCRIPT" -- --parallel 2; then
    py tools "$URL" "$REASON" "$ANSWER" "$CALL"
fi

# "</think>" first (empty reasoning) and a malformed call: all of it is the answer, whole and streamed
ANSWER2="Hello<tool_call> world"
SCRIPT2=$($GLM tokenize -m "$out/m" "</think>$ANSWER2" | tr ' ' ,)
if [ -n "$SCRIPT2" ] && start script2 "GLM_SERVE_SCRIPT=$SCRIPT2" -- --parallel 2; then
    py script2 "$URL" "$ANSWER2"
    py sampled_logprobs "$URL" "$GLM" "$out/m" "$SCRIPT2"
fi
# prefix-cache hits with --chunk 24 (not a multiple of the 16-token blocks) against no cache
# and chunks of 40: the same logits
if [ -n "${MAIN_URL:-}" ] && start nocache40 -- --fp32 --parallel 8 --chunk 40 --cache-mb 0; then
    py cache_chunk "$MAIN_URL" "$URL"
fi

# load: a small prefix cache (full after the warm-up, so RSS measures leaks, not the cache), and
# bf16 products (the other servers run fp32: the checks compare logits)
if start load -- --parallel 16 --cache-mb 1 --bf16; then
    LOAD_PID=$PID
    # bf16 products too: a batch of decodes (matvec_bf16_n, the few-token MoE pool)
    # gives each sequence its lone logits, bit for bit
    py invariance "$URL" fast_bf16 "$N_INV" "$T_INV"
    # --draft with bf16 products: the same as this server's, bit for bit (not under
    # SAN=1: the fp32 drafts above ran the same code under the sanitizers)
    LOAD_URL=$URL
    if [ "$SAN_MUL" = 1 ] && start drafts_bf16 -- --parallel 4 --cache-mb 4 --bf16 --draft 3; then
        py drafts "$URL" "$LOAD_URL" bf16 "$N_DRAFT"
        kill "$PID" 2>/dev/null
    fi
    URL=$LOAD_URL
    py load "$URL" "$LOAD_PID" "$GLM" "$N_LOAD" "$C_LOAD"
    # SIGTERM under load (32 clients, streamed and not, running and queued): exit 0 within 5 s,
    # and every client gets an answer or a closed connection (loadgen ends)
    $GLM loadgen "$URL" --requests 300 --concurrency 32 --input 40 --output 50 --stream mixed --json --timeout 60 \
        >"$out/term_load.json" 2>"$out/term_load.err" &
    LG_PID=$!
    sleep $((SAN_MUL))
    kill -TERM "$LOAD_PID"; stop_wait "$LOAD_PID" 5
    ok "$([ "$RC" = 0 ] && echo 1 || echo 0)" "sigterm_under_load_exits_0 (status $RC)" "$out/load.log"
    stop_wait "$LG_PID" 10
    ok "$([ "$RC" != running ] && echo 1 || echo 0)" "sigterm_under_load_clients_end (loadgen: $RC)" "$out/term_load.err"
    [ "$RC" = running ] && kill "$LG_PID" 2>/dev/null
fi

# nothing in any log says a sanitizer found something (SAN=1), or that the server crashed
bad=$(grep -l 'ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error:\|glm: error' "$out"/*.log 2>/dev/null | tr '\n' ' ')
ok "$([ -z "$bad" ] && echo 1 || echo 0)" "logs_clean${bad:+ ($bad)}"
echo "    (test_serve: $(( $(date +%s) - t_start )) s)"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
