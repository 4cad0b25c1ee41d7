#!/usr/bin/env python3
"""tests/serve/checks.py - the HTTP checks of tests/test_serve.sh against a running `glm serve`.

    python3 tests/serve/checks.py GROUP URL [ARGS...]

Each group prints one line per check, "PASS name" or "FAIL name (why)", and nothing else on
stdout (test_serve.sh counts the lines); it exits 0 whatever the checks gave. Only the
standard library: http.client, socket, threading. The groups and what they need:

    basic URL MODEL_ID              /health, /v1/models, 404, 405
    completions URL                 /v1/completions: prompts, usage, max_tokens, stop, seed, top_p
    chat URL                        /v1/chat/completions: reasoning, thinking off, tools
    stream URL                      SSE: the events, the deltas equal the whole response, usage
    errors URL                      400s with an OpenAI error body; raw bad HTTP (400, 411, 431,
                                    505), HTTP/1.0, pipelining
    limits URL KEY ALIAS CTX        a server with --api-key KEY --alias ALIAS --ctx CTX --max-body 2048
    cache URL                       the prefix cache reuses whole blocks of a longer prompt
    continuation URL GLM MODEL      greedy tokens as glm run's, also for a prompt that continues an
                                    answer; logprobs as log_softmax of glm logits (needs numpy, $OUT)
    nocache URL                     --cache-mb 0: nothing cached
    queue URL                       --parallel 1 --queue 1: a third request gets 503; one whose
                                    client left gives its place back
    disconnect URL LOG              --parallel 1: a client that leaves frees its slot
    sigterm URL PID                 SIGTERM during a stream, a request queued: both end (the shell
                                    checks the exit status)
    sigint URL PID                  SIGINT with an idle connection and half a request open: it exits
    invariance URL MODE [N MT]      N prompts (8) sharing 300 ids, MT tokens each (16), alone and
                                    together: the same tokens and logprobs, bit for bit; MODE c
                                    (plain C kernels): alone first, then the prefix cache; MODE fast
                                    (default kernels): together first, and seeded sampling
    drafts URL REF MODE [N]         a --draft server (URL) against one without drafts (REF, the same
                                    flags otherwise): N prompts (4) sharing 300 ids give the same greedy
                                    tokens and bit-identical logprobs alone, together and from the prefix
                                    cache; a seeded sampled text repeats alone and together
    oracle URL PROMPT WANT LOG GLM MODEL  a --draft server whose drafts are the greedy continuation
                                    (GLM_DRAFT_ORACLE): WANT's text, every draft accepted (its LOG)
    load URL PID GLM N C            a glm loadgen warm-up, then N requests from C clients; RSS and
                                    descriptors after them
    sampled_logprobs URL GLM MODEL SCRIPT  a server scripted to write SCRIPT's ids: two requests at
                                    temperature 1 together; their logprobs as log_softmax of glm logits
"""
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

SAN = os.environ.get("SAN", "") not in ("", "0")
TIMEOUT = 240 if SAN else 90  # per request: under ASan a step is several times slower


def out(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def ok(cond, name, why=""):
    if cond:
        out("PASS " + name)
    else:
        why = str(why).replace("\n", " ")
        out("FAIL %s (%s)" % (name, why[:600] if why else "check failed"))
    return bool(cond)


class Server:
    def __init__(self, url, key=None):
        u = urllib.parse.urlsplit(url)
        self.host, self.port = u.hostname, u.port
        self.key = key

    def conn(self, timeout=TIMEOUT):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, key=None, timeout=TIMEOUT):
        """(status, headers dict with lower-case names, body bytes) of one request on its own connection."""
        h = {"Content-Type": "application/json"} if body is not None else {}
        k = key if key is not None else self.key
        if k:
            h["Authorization"] = "Bearer " + k
        h.update(headers or {})
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        c = self.conn(timeout)
        try:
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            c.close()

    def post(self, path, body, **kw):
        """(status, parsed JSON or None, raw bytes)."""
        st, _, data = self.request("POST", path, body, **kw)
        try:
            j = json.loads(data)
        except ValueError:
            j = None
        return st, j, data

    def stream(self, path, body, key=None):
        """A streamed request: (status, [event data strings], saw [DONE], raw text, content type)."""
        h = {"Content-Type": "application/json"}
        if key or self.key:
            h["Authorization"] = "Bearer " + (key or self.key)
        c = self.conn()
        try:
            c.request("POST", path, body=json.dumps(body), headers=h)
            r = c.getresponse()
            raw = r.read().decode("utf-8", "replace")
            return (r.status,) + parse_sse(raw) + (raw, r.getheader("Content-Type"))
        finally:
            c.close()


def parse_sse(raw):
    """([data of each event], whether the last one was [DONE]); data lines of one event join with \\n."""
    events, cur = [], []
    for line in raw.split("\n"):
        if line.endswith("\r"):
            line = line[:-1]
        if line == "":
            if cur:
                events.append("\n".join(cur))
                cur = []
        elif line.startswith("data:"):
            cur.append(line[5:][1:] if line[5:].startswith(" ") else line[5:])
        else:
            cur.append("\0not-a-data-line: " + line)
    if cur:
        events.append("\n".join(cur))
    done = bool(events) and events[-1] == "[DONE]"
    return events, done


def chunks_of(events):
    """The JSON chunks before [DONE] (a ValueError names the first that does not parse)."""
    body = events[:-1] if events and events[-1] == "[DONE]" else events
    return [json.loads(e) for e in body]


def usage_ok(u, n_prompt=None, n_out=None):
    """Why usage is not well formed ('' when it is)."""
    if not isinstance(u, dict):
        return "no usage object"
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        if not isinstance(u.get(k), int):
            return "usage.%s is %r" % (k, u.get(k))
    d = u.get("prompt_tokens_details")
    if not isinstance(d, dict) or not isinstance(d.get("cached_tokens"), int):
        return "usage.prompt_tokens_details.cached_tokens missing: %r" % u
    if u["total_tokens"] != u["prompt_tokens"] + u["completion_tokens"]:
        return "total_tokens != prompt + completion: %r" % u
    if not 0 <= d["cached_tokens"] < u["prompt_tokens"]:
        return "cached_tokens outside 0..prompt_tokens-1: %r" % u
    if n_prompt is not None and u["prompt_tokens"] != n_prompt:
        return "prompt_tokens %d, expected %d" % (u["prompt_tokens"], n_prompt)
    if n_out is not None and u["completion_tokens"] != n_out:
        return "completion_tokens %d, expected %d" % (u["completion_tokens"], n_out)
    return ""


def error_ok(st, j, want_status, param=None):
    """Why a response is not an OpenAI error body with that status (and param, when given)."""
    if st != want_status:
        return "HTTP %d, expected %d: %r" % (st, want_status, j)
    e = j.get("error") if isinstance(j, dict) else None
    if not isinstance(e, dict):
        return "no error object: %r" % j
    for k in ("message", "type", "param", "code"):
        if k not in e:
            return "error.%s missing: %r" % (k, e)
    if not isinstance(e["message"], str) or not e["message"] or not isinstance(e["type"], str):
        return "error.message/type not strings: %r" % e
    if param and e["param"] != param and param not in e["message"]:
        return "neither error.param nor the message names %s: %r" % (param, e)
    return ""


def C(prompt, **kw):
    d = {"prompt": prompt}
    d.update(kw)
    return d


def CHAT(content, **kw):
    d = {"messages": [{"role": "user", "content": content}]}
    d.update(kw)
    return d


def text_of(j):
    return j["choices"][0]["text"]


def ids(a, n, seed):
    r = random.Random(seed)
    return [r.randrange(a, a + 20000) for _ in range(n)]


def concurrently(fns):
    """Runs the callables at once (all released together); their results in order."""
    res = [None] * len(fns)
    gate = threading.Barrier(len(fns))

    def run(i):
        gate.wait()
        try:
            res[i] = fns[i]()
        except Exception as x:  # the check reports it
            res[i] = x
    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return res


# ---------------------------------------------------------------------------------------
def g_basic(url, model_id):
    s = Server(url)
    st, h, b = s.request("GET", "/health")
    ok(st == 200 and json.loads(b) == {"status": "ok"} and h.get("content-type", "").startswith("application/json"),
       "health_200_status_ok", "%d %r" % (st, b[:200]))
    st, h, b = s.request("GET", "/v1/models")
    try:
        j = json.loads(b)
        good = st == 200 and j["object"] == "list" and [m["id"] for m in j["data"]] == [model_id] and j["data"][0]["object"] == "model"
    except Exception as x:
        good, b = False, "%s: %r" % (x, b[:300])
    ok(good, "models_lists_the_folder_name", "%d %r" % (st, b[:300]))
    st, h, b = s.request("GET", "/v1/nope")
    ok(not error_ok(st, json.loads(b or b"null"), 404), "unknown_path_404", error_ok(st, json.loads(b or b"null"), 404))
    st, h, b = s.request("GET", "/v1/completions")
    ok(not error_ok(st, json.loads(b or b"null"), 405), "get_completions_405", error_ok(st, json.loads(b or b"null"), 405))
    st, h, b = s.request("POST", "/health", body=b"{}")
    ok(st == 405, "post_health_405", "HTTP %d" % st)
    # a query string does not change the path
    st, h, b = s.request("GET", "/health?x=1")
    ok(st == 200, "health_with_query_200", "HTTP %d" % st)


def g_completions(url):
    s = Server(url)
    st, j, raw = s.post("/v1/completions", C("Hello there, how are", max_tokens=8, temperature=0))
    try:
        why = "" if st == 200 else "HTTP %d %r" % (st, raw[:200])
        why = why or usage_ok(j["usage"])
        if not why and not (j["object"] == "text_completion" and isinstance(text_of(j), str) and j["id"].startswith("cmpl-")
                            and j["model"] and j["choices"][0]["index"] == 0 and j["choices"][0]["finish_reason"] in ("stop", "length")):
            why = "malformed: %r" % j
        if not why and not 1 <= j["usage"]["completion_tokens"] <= 8:
            why = "completion_tokens %r with max_tokens 8" % j["usage"]
    except Exception as x:
        why = "%s: %r" % (x, raw[:300])
    ok(not why, "completion_text_prompt", why)
    n_text = j["usage"]["prompt_tokens"] if isinstance(j, dict) and "usage" in j else -1

    st, j, raw = s.post("/v1/completions", C([1, 2, 3], max_tokens=5, temperature=0, ignore_eos=True))
    why = "HTTP %d %r" % (st, raw[:200]) if st != 200 else usage_ok(j.get("usage"), 3, 5)
    ok(not why and isinstance(text_of(j), str), "completion_token_id_prompt", why)
    base = text_of(j) if not why else None

    # one prompt inside an array: the same as the prompt itself
    st1, j1, _ = s.post("/v1/completions", C([[1, 2, 3]], max_tokens=5, temperature=0, ignore_eos=True))
    st2, j2, _ = s.post("/v1/completions", C(["Hello there, how are"], max_tokens=1, temperature=0))
    ok(st1 == 200 and st2 == 200 and text_of(j1) == base and j2["usage"]["prompt_tokens"] == n_text,
       "completion_prompt_in_a_list", "%d %d %r %r" % (st1, st2, j1, j2))

    # max_tokens: exactly that many with ignore_eos, finish_reason length; logprobs agree
    st, j, raw = s.post("/v1/completions", C([5, 6, 7, 8], max_tokens=7, temperature=0, ignore_eos=True, logprobs=1))
    try:
        lp = j["choices"][0]["logprobs"]
        why = usage_ok(j["usage"], 4, 7)
        if not why and j["choices"][0]["finish_reason"] != "length":
            why = "finish_reason %r" % j["choices"][0]["finish_reason"]
        if not why and not (len(lp["tokens"]) == 7 and len(lp["token_logprobs"]) == 7 and all(x <= 0 for x in lp["token_logprobs"])
                            and "".join(lp["tokens"]) == text_of(j)):
            why = "logprobs do not match the text: %r" % lp
    except Exception as x:
        why = "%s: %r" % (x, raw[:300])
    ok(not why, "max_tokens_exact_finish_length", why)
    st, j, raw = s.post("/v1/completions", C([5, 6, 7, 8], max_completion_tokens=3, temperature=0, ignore_eos=True))
    ok(st == 200 and j["usage"]["completion_tokens"] == 3, "max_completion_tokens", raw[:300])

    # stop: a piece of the greedy text cuts it there
    P = C([11, 12, 13, 14, 15, 16], max_tokens=24, temperature=0, ignore_eos=True)
    st, j, raw = s.post("/v1/completions", P)
    full = text_of(j) if st == 200 else ""
    stop = None
    for k in range(len(full) // 3, len(full) - 2):  # three ordinary characters from the middle on
        cand = full[k:k + 3]
        if full.find(cand) == k and all(ch.isprintable() and ch != "\ufffd" for ch in cand) and cand.strip():
            stop = cand
            break
    if stop is None:
        ok(False, "stop_string_cuts_text", "no usable piece of %r" % full)
    else:
        want = full[:full.find(stop)]
        st, j, raw = s.post("/v1/completions", dict(P, stop=stop))
        ok(st == 200 and text_of(j) == want and j["choices"][0]["finish_reason"] == "stop",
           "stop_string_cuts_text", "stop %r: want %r, got %r" % (stop, want, raw[:400]))
        st, j, raw = s.post("/v1/completions", dict(P, stop=["\x01never\x02", stop]))
        ok(st == 200 and text_of(j) == want and j["choices"][0]["finish_reason"] == "stop",
           "stop_list_cuts_text", "stop %r: want %r, got %r" % (stop, want, raw[:400]))
        st, ev, done, rawt, ct = s.stream("/v1/completions", dict(P, stop=stop, stream=True))
        try:
            got = "".join(c["choices"][0]["text"] for c in chunks_of(ev) if c["choices"])
            fin = [c["choices"][0]["finish_reason"] for c in chunks_of(ev) if c["choices"] and c["choices"][0]["finish_reason"]]
        except Exception as x:
            got, fin = "%s: %r" % (x, rawt[:300]), []
        ok(st == 200 and done and got == want and fin == ["stop"], "stop_string_streamed",
           "stop %r: want %r, got %r finish %r" % (stop, want, got, fin))

    # seed: temperature 1 with one seed twice gives one text; another seed another text
    Q = C([21, 22, 23], max_tokens=12, temperature=1, ignore_eos=True)
    a = s.post("/v1/completions", dict(Q, seed=42))[1]
    b = s.post("/v1/completions", dict(Q, seed=42))[1]
    c = s.post("/v1/completions", dict(Q, seed=4242))[1]
    try:
        ok(text_of(a) == text_of(b), "seed_reproducible_at_temperature_1", "%r vs %r" % (text_of(a), text_of(b)))
        ok(text_of(a) != text_of(c), "other_seed_other_text", "seed 42 and 4242 both gave %r" % text_of(a))
    except Exception as x:
        ok(False, "seed_reproducible_at_temperature_1", x)
    # temperature 0: the same text whatever the seed
    a = s.post("/v1/completions", dict(Q, temperature=0, seed=1))[1]
    b = s.post("/v1/completions", dict(Q, temperature=0, seed=2))[1]
    c = s.post("/v1/completions", dict(Q, temperature=0))[1]
    ok(a and b and c and text_of(a) == text_of(b) == text_of(c), "temperature_0_deterministic",
       "%r / %r / %r" % (a, b, c))
    # top_p near 0 keeps only the most likely token: the greedy text even at temperature 1
    d = s.post("/v1/completions", dict(Q, temperature=1, top_p=1e-6, seed=9))[1]
    ok(d and a and text_of(d) == text_of(a), "top_p_tiny_is_greedy", "%r vs %r" % (d, a))


def g_chat(url):
    s = Server(url)
    st, j, raw = s.post("/v1/chat/completions", CHAT("Hello! What is 2+2?", max_tokens=16, temperature=0))
    try:
        m = j["choices"][0]["message"]
        why = usage_ok(j["usage"])
        if not why and not (j["object"] == "chat.completion" and j["id"].startswith("chatcmpl-") and m["role"] == "assistant"):
            why = "malformed: %r" % j
        if not why and not (isinstance(m.get("reasoning_content"), str) and isinstance(m.get("content"), str)):
            why = "reasoning_content / content not strings: %r" % m
        if not why and not (m["reasoning_content"] or m["content"]):
            why = "no text at all: %r" % m
    except Exception as x:
        why = "HTTP %d %s: %r" % (st, x, raw[:300])
    ok(not why, "chat_reasoning_content_by_default", why)

    off = CHAT("Hello! What is 2+2?", max_tokens=12, temperature=0, ignore_eos=True)
    st, j, raw = s.post("/v1/chat/completions", dict(off, chat_template_kwargs={"enable_thinking": False}))
    try:
        m = j["choices"][0]["message"]
        why = usage_ok(j["usage"], None, 12)
        if not why and m.get("reasoning_content"):
            why = "reasoning_content with thinking off: %r" % m
        if not why and not (isinstance(m.get("content"), str) and m["content"]):
            why = "content not a non-empty string: %r" % m
    except Exception as x:
        why = "HTTP %d %s: %r" % (st, x, raw[:300])
    ok(not why, "chat_thinking_off_content_only", why)
    # the other spellings of the switch render the same prompt
    st2, j2, raw2 = s.post("/v1/chat/completions", dict(off, thinking={"type": "disabled"}))
    st3, j3, raw3 = s.post("/v1/chat/completions", dict(off, enable_thinking=False))
    try:
        good = j2["choices"][0]["message"] == j["choices"][0]["message"] and j2["usage"] == j["usage"] and \
            j3["choices"][0]["message"] == j["choices"][0]["message"]
    except Exception:
        good = False
    ok(good, "chat_thinking_switch_spellings_agree", "%r / %r / %r" % (raw[:200], raw2[:200], raw3[:200]))

    # a conversation with a system prompt and an earlier answer
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Again?"}]
    st, j, raw = s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "temperature": 0})
    ok(st == 200 and j["choices"][0]["message"]["role"] == "assistant" and j["usage"]["prompt_tokens"] > 10,
       "chat_multi_turn", raw[:300])

    tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    for think in (True, False):
        name = "chat_tools_well_formed" + ("" if think else "_thinking_off")
        body = CHAT("What is the weather in Paris?", max_tokens=16, temperature=0, tools=tools,
                    chat_template_kwargs={"enable_thinking": think})
        st, j, raw = s.post("/v1/chat/completions", body)
        try:
            ch = j["choices"][0]
            m = ch["message"]
            why = usage_ok(j["usage"])
            if not why and not (m["role"] == "assistant" and (m["content"] is None or isinstance(m["content"], str))
                                and ch["finish_reason"] in ("stop", "length", "tool_calls")):
                why = "malformed: %r" % j
            for tc in m.get("tool_calls") or []:
                if not why and not (tc["type"] == "function" and isinstance(tc["function"]["name"], str)
                                    and isinstance(tc["function"]["arguments"], str)):
                    why = "malformed tool call %r" % tc
            if not why and (ch["finish_reason"] == "tool_calls") != bool(m.get("tool_calls")):
                why = "finish_reason %r with tool_calls %r" % (ch["finish_reason"], m.get("tool_calls"))
            # the tools are in the prompt: it is longer than without them
            st0, j0, _ = s.post("/v1/chat/completions", dict(body, tools=None, max_tokens=1))
            if not why and not j0["usage"]["prompt_tokens"] < j["usage"]["prompt_tokens"]:
                why = "the tools did not reach the prompt: %d vs %d tokens" % (j0["usage"]["prompt_tokens"], j["usage"]["prompt_tokens"])
        except Exception as x:
            why = "HTTP %d %s: %r" % (st, x, raw[:300])
        ok(not why, name, why)


def g_stream(url):
    s = Server(url)

    def check_events(name, ev, done, raw, ct, obj):
        if not ct or not ct.startswith("text/event-stream"):
            return "Content-Type %r" % ct
        if not done:
            return "no [DONE] at the end: %r" % raw[-300:]
        if any(e.startswith("\0") for e in ev):
            return "a line that is not 'data: ...': %r" % [e for e in ev if e.startswith("\0")][:2]
        if not raw.endswith("data: [DONE]\n\n"):
            return "does not end with 'data: [DONE]' and a blank line: %r" % raw[-60:]
        cs = chunks_of(ev)
        if not cs or any(c.get("object") != obj for c in cs):
            return "a chunk's object is not %s: %r" % (obj, [c.get("object") for c in cs])
        if len({c["id"] for c in cs}) != 1:
            return "chunks with different ids: %r" % sorted({c["id"] for c in cs})
        return ""

    # completions: the streamed text is the whole one
    P = C([31, 32, 33, 34, 35], max_tokens=16, temperature=0, ignore_eos=True)
    st, j, raw0 = s.post("/v1/completions", P)
    st, ev, done, raw, ct = s.stream("/v1/completions", dict(P, stream=True))
    try:
        why = check_events("c", ev, done, raw, ct, "text_completion")
        cs = chunks_of(ev)
        got = "".join(c["choices"][0]["text"] for c in cs if c["choices"])
        if not why and got != text_of(j):
            why = "streamed %r, whole %r" % (got, text_of(j))
        fin = [c["choices"][0]["finish_reason"] for c in cs if c["choices"] and c["choices"][0]["finish_reason"]]
        if not why and fin != ["length"]:
            why = "finish reasons %r" % fin
        if not why and len(cs) < 3:
            why = "%d chunks for 16 tokens: not streamed as they come" % len(cs)
    except Exception as x:
        why = "HTTP %d %s: %r" % (st, x, raw[:300])
    ok(not why, "stream_completion_equals_whole", why)

    # chat, thinking on and off: reasoning and content deltas join to the whole message
    for think in (True, False):
        name = "stream_chat_equals_whole" + ("" if think else "_thinking_off")
        B = CHAT("Tell me a story.", max_tokens=24, temperature=0, ignore_eos=True, chat_template_kwargs={"enable_thinking": think})
        st, j, raw0 = s.post("/v1/chat/completions", B)
        st, ev, done, raw, ct = s.stream("/v1/chat/completions", dict(B, stream=True))
        try:
            why = check_events("c", ev, done, raw, ct, "chat.completion.chunk")
            cs = chunks_of(ev)
            deltas = [c["choices"][0]["delta"] for c in cs if c["choices"]]
            rc = "".join(d.get("reasoning_content") or "" for d in deltas)
            co = "".join(d.get("content") or "" for d in deltas)
            m = j["choices"][0]["message"]
            if not why and deltas[0].get("role") != "assistant":
                why = "the first delta has no role assistant: %r" % deltas[0]
            if not why and (rc != (m.get("reasoning_content") or "") or co != (m["content"] or "")):
                why = "streamed (%r, %r), whole (%r, %r)" % (rc, co, m.get("reasoning_content"), m["content"])
            if not why and not (rc + co):
                why = "no text"
            if not why and not think and rc:
                why = "reasoning with thinking off: %r" % rc
        except Exception as x:
            why = "HTTP %d %s: %r" % (st, x, raw[:300])
        ok(not why, name, why)

    # stream_options.include_usage: a last chunk with no choices and the usage
    for path, body in (("/v1/completions", C([41, 42, 43], max_tokens=6, temperature=0, ignore_eos=True)),
                       ("/v1/chat/completions", CHAT("Hi", max_tokens=6, temperature=0, ignore_eos=True))):
        name = "stream_include_usage_" + ("chat" if "chat" in path else "completion")
        st, ev, done, raw, ct = s.stream(path, dict(body, stream=True, stream_options={"include_usage": True}))
        try:
            cs = chunks_of(ev)
            last = cs[-1]
            why = "" if done else "no [DONE]"
            if not why and not (last["choices"] == [] and not usage_ok(last.get("usage"), None, 6)):
                why = "last chunk %r" % last
            if not why and any("usage" in c and c["usage"] is not None for c in cs[:-1]):
                why = "usage before the last chunk: %r" % [c for c in cs[:-1] if c.get("usage")][:1]
            if not why and cs[-2]["choices"][0]["finish_reason"] != "length":
                why = "the chunk before the usage has finish_reason %r" % cs[-2]["choices"][0]["finish_reason"]
        except Exception as x:
            why = "HTTP %d %s: %r" % (st, x, raw[:300])
        ok(not why, name, why)


def g_errors(url):
    s = Server(url)
    cases = [
        ("malformed_json_400", "/v1/completions", b'{"prompt": "hi", ', None),
        ("body_not_an_object_400", "/v1/completions", b'[1, 2]', None),
        ("temperature_string_400", "/v1/completions", {"prompt": "hi", "temperature": "hot"}, "temperature"),
        ("temperature_5_400", "/v1/completions", {"prompt": "hi", "temperature": 5}, "temperature"),
        ("max_tokens_negative_400", "/v1/completions", {"prompt": "hi", "max_tokens": -1}, "max_tokens"),
        ("max_tokens_fraction_400", "/v1/completions", {"prompt": "hi", "max_tokens": 1.5}, "max_tokens"),
        ("n_2_400", "/v1/completions", {"prompt": "hi", "n": 2}, "n"),
        ("prompt_object_400", "/v1/completions", {"prompt": {}}, "prompt"),
        ("prompt_missing_400", "/v1/completions", {"max_tokens": 3}, "prompt"),
        ("prompt_empty_400", "/v1/completions", {"prompt": []}, "prompt"),
        ("prompt_id_out_of_vocab_400", "/v1/completions", {"prompt": [1, 2, 999999999]}, "prompt"),
        ("prompt_id_negative_400", "/v1/completions", {"prompt": [1, -2]}, "prompt"),
        ("stream_not_bool_400", "/v1/completions", {"prompt": "hi", "stream": "yes"}, "stream"),
        ("stop_five_strings_400", "/v1/completions", {"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ("top_p_zero_400", "/v1/completions", {"prompt": "hi", "top_p": 0}, "top_p"),
        ("seed_fraction_400", "/v1/completions", {"prompt": "hi", "seed": 1.5}, "seed"),
        ("model_not_string_400", "/v1/completions", {"prompt": "hi", "model": 7}, "model"),
        ("messages_missing_400", "/v1/chat/completions", {"max_tokens": 3}, "messages"),
        ("messages_empty_400", "/v1/chat/completions", {"messages": []}, "messages"),
        ("message_content_number_400", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages"),
        ("invalid_utf8_400", "/v1/completions", b'{"prompt": "\xff", "max_tokens": 1}', None),
        ("unpaired_surrogate_400", "/v1/completions", b'{"prompt": "a\\ud800b", "max_tokens": 1}', None),
        ("chat_content_nul_400", "/v1/chat/completions", {"messages": [{"role": "user", "content": "a\0b"}]}, "messages"),
        ("chat_temperature_string_400", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                                "temperature": "hot"}, "temperature"),
    ]
    for name, path, body, param in cases:
        st, j, raw = s.post(path, body)
        why = error_ok(st, j, 400, param)
        if not why and j["error"]["type"] != "invalid_request_error":
            why = "type %r" % j["error"]["type"]
        ok(not why, name, why)

    # an error keeps a keep-alive connection: the next request on it is answered
    c = s.conn()
    try:
        c.request("POST", "/v1/completions", body=b"{oops", headers={"Content-Type": "application/json"})
        r1 = c.getresponse()
        r1.read()
        c.request("POST", "/v1/completions", body=json.dumps(C([1, 2], max_tokens=2, temperature=0)),
                  headers={"Content-Type": "application/json"})
        r2 = c.getresponse()
        b2 = json.loads(r2.read())
        good, why = r1.status == 400 and r2.status == 200 and b2["usage"]["prompt_tokens"] == 2, "%d %d %r" % (r1.status, r2.status, b2)
    except Exception as x:
        good, why = False, x
    finally:
        c.close()
    ok(good, "error_keeps_the_connection", why)

    # bad HTTP on a raw socket: 400 with an error body, and the connection closes
    for name, req in (("bad_request_line_400", b"GARBAGE\r\n\r\n"),
                      ("bad_header_line_400", b"GET /health HTTP/1.1\r\nNo colon here\r\n\r\n"),
                      ("two_content_lengths_400", b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}")):
        resp = raw_exchange(s, req)
        head, _, body = resp.partition(b"\r\n\r\n")
        try:
            why = error_ok(int(head.split(b" ")[1]), json.loads(body), 400)
        except Exception as x:
            why = "%s: %r" % (x, resp[:200])
        ok(not why and head.startswith(b"HTTP/1.1 400 "), name, why or resp[:100])
    for name, req, code in (("transfer_encoding_chunked_411", b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 411),
                            ("headers_too_long_431", b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n", 431),
                            ("http_2_request_line_505", b"GET /health HTTP/2.0\r\n\r\n", 505)):
        resp = raw_exchange(s, req)
        ok(resp.startswith(b"HTTP/1.1 %d " % code), name, resp[:100])
    # HTTP/1.0: answered, then closed; two pipelined requests: two answers, in order
    resp = raw_exchange(s, b"GET /health HTTP/1.0\r\n\r\n")
    ok(resp.startswith(b"HTTP/1.1 200 ") and resp.endswith(b'{"status":"ok"}'), "http_1_0_request", resp[:200])
    body = json.dumps(C([1, 2], max_tokens=2, temperature=0)).encode()
    one = b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    resp = raw_exchange(s, one + b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
    ok(resp.startswith(b"HTTP/1.1 200 ") and resp.count(b"HTTP/1.1 200 ") == 2 and b'"usage"' in resp
       and resp.endswith(b'{"status":"ok"}'), "pipelined_requests_answered_in_order", resp[:300])
    st, _, _ = s.request("GET", "/health")
    ok(st == 200, "alive_after_the_errors", "HTTP %d" % st)


def raw_exchange(s, data, wait=10):
    """Sends bytes on a new connection and reads until the server closes it (or `wait` s)."""
    so = socket.create_connection((s.host, s.port), timeout=wait)
    try:
        so.sendall(data)
        got = b""
        while True:
            try:
                k = so.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:  # after an error answer: the checks look at the answer
                break
            if not k:
                break
            got += k
        return got
    finally:
        so.close()


def g_limits(url, key, alias, ctx):
    ctx = int(ctx)
    s = Server(url)
    st, h, b = s.request("GET", "/health")
    ok(st == 200, "apikey_health_needs_no_key", "HTTP %d" % st)
    st, h, b = s.request("GET", "/v1/models")
    ok(st == 401 and not error_ok(st, json.loads(b), 401) and h.get("www-authenticate", "").startswith("Bearer"),
       "apikey_missing_401", "HTTP %d %r %r" % (st, h, b[:200]))
    st, j, raw = s.post("/v1/completions", C([1, 2], max_tokens=2), key="wrong")
    ok(not error_ok(st, j, 401), "apikey_wrong_401", error_ok(st, j, 401))
    st, j, raw = s.post("/v1/completions", C([1, 2], max_tokens=2), key=key + "x")
    ok(st == 401, "apikey_longer_401", "HTTP %d" % st)
    st, j, raw = s.post("/v1/completions", C([1, 2], max_tokens=2), headers={"Authorization": "Basic " + key}, key="")
    ok(st == 401, "apikey_other_scheme_401", "HTTP %d" % st)
    st, j, raw = s.post("/v1/completions", C([1, 2], max_tokens=2, temperature=0), key=key)
    ok(st == 200 and j["usage"]["completion_tokens"] >= 1, "apikey_right_200", "HTTP %d %r" % (st, raw[:200]))
    s.key = key
    st, h, b = s.request("GET", "/v1/models")
    try:
        d = json.loads(b)["data"]
        good = st == 200 and [m["id"] for m in d] == [alias] and d[0].get("max_model_len") in (None, ctx)
    except Exception:
        good = False
    ok(good, "models_alias", "HTTP %d %r" % (st, b[:300]))

    # the context: a prompt of ctx tokens or more is refused; max_tokens shrinks to what is left
    st, j, raw = s.post("/v1/completions", C(list(range(1000, 1000 + 100)), max_tokens=4))
    ok(not error_ok(st, j, 400, "prompt") and "context" in j["error"]["message"], "prompt_over_context_400", error_ok(st, j, 400) or j)
    st, j, raw = s.post("/v1/completions", C(list(range(1000, 1000 + ctx)), max_tokens=4))
    ok(not error_ok(st, j, 400, "prompt"), "prompt_of_exactly_ctx_400", error_ok(st, j, 400, "prompt"))
    st, j, raw = s.post("/v1/chat/completions", CHAT("word " * (4 * ctx), max_tokens=4))
    ok(not error_ok(st, j, 400, "messages"), "chat_over_context_400", error_ok(st, j, 400, "messages"))
    st, j, raw = s.post("/v1/completions", C(list(range(1000, 1000 + ctx - 4)), max_tokens=50, temperature=0, ignore_eos=True))
    ok(st == 200 and j["usage"]["completion_tokens"] == 4 and j["choices"][0]["finish_reason"] == "length",
       "max_tokens_capped_by_the_context", raw[:300])
    st, j, raw = s.post("/v1/completions", C(list(range(1000, 1000 + ctx - 1)), temperature=0, ignore_eos=True))
    ok(st == 200 and j["usage"]["completion_tokens"] == 1, "prompt_of_ctx_minus_1_gives_one_token", raw[:300])

    # a body over --max-body (2048): 413 with an error body, not a reset connection
    big = json.dumps({"prompt": "x" * 4096, "max_tokens": 1})
    try:
        st, h, b = s.request("POST", "/v1/completions", big)
        why = error_ok(st, json.loads(b), 413)
    except Exception as x:
        why = "%s: %s" % (type(x).__name__, x)
    ok(not why, "body_over_max_body_413", why)
    # a client that is still sending a large body when the 413 comes (http.client, httpx: they
    # read only after sending) gets it too when the server closes in stages (RFC 9112 9.6:
    # half-close, drain, close) instead of resetting the connection on the unread bytes
    huge = json.dumps({"prompt": "x" * (4 << 20), "max_tokens": 1})
    try:
        st, h, b = s.request("POST", "/v1/completions", huge)
        why = error_ok(st, json.loads(b), 413)
    except Exception as x:
        why = "%s: %s" % (type(x).__name__, x)
    ok(not why, "body_of_4mb_over_max_body_413_not_reset", why)
    # ...and a body just under it is read
    small = json.dumps({"prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0, "user": "x" * 1900})
    st, h, b = s.request("POST", "/v1/completions", small)
    ok(st == 200 and len(small) < 2048, "body_under_max_body_200", "HTTP %d (%d bytes)" % (st, len(small)))
    s.key = None
    st, h, b = s.request("GET", "/health")
    ok(st == 200, "limits_server_alive", "HTTP %d" % st)


def g_cache(url):
    """A 200-token prompt, then it with 20 more: the second starts from the cache, which keeps
    and hands out whole blocks of 16 positions."""
    s = Server(url)
    p = ids(30000, 200, 7)
    st1, j1, r1 = s.post("/v1/completions", C(p, max_tokens=4, temperature=0, ignore_eos=True))
    st2, j2, r2 = s.post("/v1/completions", C(p + ids(60000, 20, 8), max_tokens=4, temperature=0, ignore_eos=True))
    try:
        c1, c2 = j1["usage"]["prompt_tokens_details"]["cached_tokens"], j2["usage"]["prompt_tokens_details"]["cached_tokens"]
        good = c1 == 0 and c2 == 192 and j2["usage"]["prompt_tokens"] == 220
    except Exception:
        good, c1, c2 = False, r1[:200], r2[:200]
    ok(good, "prefix_cache_reuses_blocks", "cached %r then %r (want 0, then 192)" % (c1, c2))
    # the same prompt again: at most n-1 positions come from the cache; the same greedy text
    st3, j3, r3 = s.post("/v1/completions", C(p, max_tokens=4, temperature=0, ignore_eos=True))
    try:
        c3 = j3["usage"]["prompt_tokens_details"]["cached_tokens"]
        good = c3 == 192 and text_of(j3) == text_of(j1)
    except Exception:
        good, c3 = False, r3[:200]
    ok(good, "prefix_cache_same_prompt_same_text", "cached %r (want 192), texts %r / %r" % (c3, j1 and text_of(j1), j3 and text_of(j3)))


def glm_run(glm, model, prompt, n):
    """glm run's greedy ids after a prompt of ids (the CLI's engine, forward, one sequence)."""
    r = subprocess.run([glm, "run", "-m", model, "--ids", ",".join(map(str, prompt)), "-n", str(n), "--temp", "0"],
                       capture_output=True, text=True, timeout=3 * TIMEOUT)
    return [int(x) for x in r.stdout.split()]


def glm_decode(glm, model, ids_):
    r = subprocess.run([glm, "tokenize", "--decode", "-m", model, ",".join(map(str, ids_))],
                       capture_output=True, text=True, timeout=TIMEOUT)
    return r.stdout


def g_continuation(url, glm, model):
    """The server's greedy tokens are glm run's (the CLI's engine: forward, one sequence), for
    a prompt and for the next prompt that continues its answer (a chat's next turn)."""
    s = Server(url)
    p = ids(90000, 20, 21)
    gen = glm_run(glm, model, p, 40)
    st, j, raw = s.post("/v1/completions", C(p, max_tokens=40, temperature=0, ignore_eos=True))
    want = glm_decode(glm, model, gen).rstrip("\n")
    ok(st == 200 and len(gen) == 40 and text_of(j).rstrip("\n") == want, "serve_40_greedy_tokens_equal_glm_run",
       "HTTP %d, %d ids from glm run; serve %r, glm run %r" % (st, len(gen), j and text_of(j), want))
    # the log-probabilities are the model's: log_softmax of glm logits' rows at the chosen ids
    q = ids(90000, 12, 23)
    g8 = glm_run(glm, model, q, 8)
    st, j, raw = s.post("/v1/completions", C(q, max_tokens=8, temperature=0, ignore_eos=True, logprobs=1))
    try:
        import numpy as np
        f = os.path.join(os.environ.get("OUT", "/tmp"), "logits.f32")
        subprocess.run([glm, "logits", "-m", model, "--ids", ",".join(map(str, q + g8[:7])), "-o", f],
                       capture_output=True, timeout=3 * TIMEOUT, check=True)
        rows = np.fromfile(f, dtype=np.float32).reshape(len(q) + 7, -1)[len(q) - 1:].astype(np.float64)
        lse = rows.max(1) + np.log(np.exp(rows - rows.max(1, keepdims=True)).sum(1))
        want = [float(rows[i, g8[i]] - lse[i]) for i in range(8)]
        got = j["choices"][0]["logprobs"]["token_logprobs"]
        err = max(abs(a - b) for a, b in zip(got, want))
        why = "" if len(got) == 8 and err < 2e-3 and all(int(rows[i].argmax()) == g8[i] for i in range(8)) else \
            "serve %r, glm logits %r" % (got, want)
    except Exception as x:
        why = "%s: %s %r" % (type(x).__name__, x, raw[:200])
    ok(not why, "logprobs_are_log_softmax_of_glm_logits", why)
    b = p + gen[:30] + ids(95000, 5, 22)
    st, j, raw = s.post("/v1/completions", C(b, max_tokens=8, temperature=0, ignore_eos=True))
    want = glm_decode(glm, model, glm_run(glm, model, b, 8)).rstrip("\n")
    ok(st == 200 and text_of(j).rstrip("\n") == want, "continuation_greedy_tokens_equal_glm_run",
       "HTTP %d, serve %r, glm run %r" % (st, j and text_of(j), want))


def g_nocache(url):
    s = Server(url)
    p = ids(30000, 200, 7)
    got = []
    for extra in ([], ids(60000, 20, 8)):
        st, j, raw = s.post("/v1/completions", C(p + extra, max_tokens=2, temperature=0, ignore_eos=True))
        got.append(j["usage"]["prompt_tokens_details"]["cached_tokens"] if st == 200 else raw[:200])
    ok(got == [0, 0], "cache_mb_0_caches_nothing", "cached %r" % got)


def g_queue(url):
    s = Server(url)
    mt = 60 if SAN else 200  # long enough that the first request still runs when the third arrives
    body = C([1, 2, 3, 4], max_tokens=mt, temperature=0, ignore_eos=True)
    res = concurrently([lambda: s.post("/v1/completions", body) for _ in range(3)])
    try:
        codes = sorted(r[0] for r in res)
        busy = [r for r in res if r[0] == 503]
        good = 503 in codes and all(c in (200, 503) for c in codes) and 200 in codes
        why = "statuses %r" % codes
        for r in busy:
            if error_ok(503, r[1], 503):
                good, why = False, error_ok(503, r[1], 503)
        for r in res:
            if r[0] == 200 and r[1]["usage"]["completion_tokens"] != mt:
                good, why = False, "a 200 with %r" % r[1]["usage"]
    except Exception as x:
        good, why = False, "%s: %r" % (x, res)
    ok(good, "queue_full_503", why)
    # a queued request whose client left (its job is cancelled) no longer holds the queue's
    # place: with one slot busy and one place, a new request waits instead of getting 503
    def send(body):
        so = socket.create_connection((s.host, s.port), timeout=TIMEOUT)
        d = json.dumps(body).encode()
        so.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(d) + d)
        return so
    a = send(C([1, 2, 3], max_tokens=2000, temperature=0, ignore_eos=True))  # the slot
    time.sleep(0.3)
    b = send(C([4, 5, 6], max_tokens=8, temperature=0, ignore_eos=True))  # the queue's place
    time.sleep(0.3)
    b.close()
    time.sleep(0.5)  # the server looks at a waiting client every 100 ms
    c = send(C([7, 8, 9], max_tokens=2, temperature=0, ignore_eos=True))
    time.sleep(0.3)
    a.close()  # the slot frees: c runs
    c.settimeout(TIMEOUT)
    try:
        got = c.recv(200)
    except Exception as x:
        got = repr(x).encode()
    c.close()
    ok(got.startswith(b"HTTP/1.1 200 "), "abandoned_queued_request_leaves_the_queue", got[:160])
    st, _, _ = s.request("GET", "/health")
    ok(st == 200, "queue_server_alive", "HTTP %d" % st)


def open_stream(s, body):
    """A streamed request on a raw socket; returns the socket and a reader of whole events."""
    so = socket.create_connection((s.host, s.port), timeout=TIMEOUT)
    data = json.dumps(body).encode()
    so.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
    buf = [b""]

    def next_event():
        while b"\n\n" not in buf[0]:
            k = so.recv(65536)
            if not k:
                return None
            buf[0] += k
        ev, _, buf[0] = buf[0].partition(b"\n\n")
        return ev
    return so, next_event


def g_disconnect(url, log):
    s = Server(url)
    # streamed: read the head and two events, then close
    so, nxt = open_stream(s, C([7, 8, 9], max_tokens=2000, temperature=0, ignore_eos=True, stream=True))
    head = nxt()
    e1, e2 = nxt(), nxt()
    rid = None
    try:
        rid = json.loads(e1.split(b"data: ", 1)[1])["id"]
    except Exception:
        pass
    so.close()
    t = time.time()
    st, j, raw = s.post("/v1/completions", C([1, 2, 3], max_tokens=8, temperature=0, ignore_eos=True))
    dt = time.time() - t
    limit = 15 if SAN else 5
    ok(head and b" 200 " in head and e2 and st == 200 and j["usage"]["completion_tokens"] == 8 and dt < limit,
       "disconnect_mid_stream_frees_the_slot", "head %r, event %r, next request HTTP %d in %.1f s (limit %d s)" % (head, e2, st, dt, limit))
    line = None
    for _ in range(100):  # the log line is written as the connection thread ends
        with open(log, errors="replace") as f:
            line = next((l for l in f if rid and ("serve: %s " % rid) in l), None)
        if line:
            break
        time.sleep(0.05)
    n_out = None
    try:
        n_out = int(line.split(" out ")[1].split()[0])
    except Exception:
        pass
    ok(line is not None and n_out is not None and n_out < 2000, "disconnect_logged",
       "no log line for %r" % rid if not line else "line %r" % line.strip())

    # whole (not streamed): the client closes before the answer; the slot frees too
    so = socket.create_connection((s.host, s.port), timeout=TIMEOUT)
    data = json.dumps(C([7, 8, 9, 10], max_tokens=2000, temperature=0, ignore_eos=True)).encode()
    so.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
    time.sleep(0.3)
    so.close()
    t = time.time()
    st, j, raw = s.post("/v1/completions", C([1, 2, 3], max_tokens=8, temperature=0, ignore_eos=True))
    dt = time.time() - t
    ok(st == 200 and dt < limit, "disconnect_whole_request_frees_the_slot", "HTTP %d in %.1f s (limit %d s)" % (st, dt, limit))


def exited(pid):
    """Whether the process is gone (or a zombie its parent, the shell, has not waited for yet)."""
    try:
        with open("/proc/%s/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def g_sigterm(url, pid):
    """SIGTERM with a stream running and a request queued (--parallel 1): both end."""
    s = Server(url)
    so, nxt = open_stream(s, C([7, 8, 9], max_tokens=2000, temperature=0, ignore_eos=True, stream=True))
    head = nxt()
    first = nxt()
    q = socket.create_connection((s.host, s.port), timeout=TIMEOUT)  # queued behind the stream
    data = json.dumps(C([5, 6], max_tokens=50, temperature=0, ignore_eos=True)).encode()
    q.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
    time.sleep(0.2)
    os.kill(int(pid), signal.SIGTERM)
    t = time.time()
    so.settimeout(10)
    last, how = None, "?"
    try:
        while True:
            e = nxt()
            if e is None:
                how = "closed"
                break
            last = e
            if e == b"data: [DONE]":
                how = "[DONE]"
                break
            if time.time() - t > 10:
                how = "still streaming after 10 s"
                break
    except Exception as x:
        how = "%s: %s" % (type(x).__name__, x)
    dt = time.time() - t
    so.close()
    ok(head and first and how in ("[DONE]", "closed") and dt < 5, "sigterm_ends_the_stream",
       "%s after %.1f s; last event %r" % (how, dt, (last or b"")[:200]))
    q.settimeout(10)
    got = b""
    try:
        while True:
            k = q.recv(65536)
            if not k:
                break
            got += k
    except Exception as x:
        got += b" [%s]" % type(x).__name__.encode()
    dt = time.time() - t
    q.close()
    ok(dt < 5 and (got == b"" or got.startswith(b"HTTP/1.1 ")), "sigterm_answers_the_queued_request",
       "after %.1f s: %r" % (dt, got[:300]))


def g_sigint(url, pid):
    """SIGINT on an idle server with an idle connection and half a request open: it exits."""
    s = Server(url)
    idle = socket.create_connection((s.host, s.port), timeout=10)
    half = socket.create_connection((s.host, s.port), timeout=10)
    half.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"prompt\"")
    time.sleep(0.2)
    os.kill(int(pid), signal.SIGINT)
    t = time.time()
    while not exited(pid) and time.time() - t < 10:
        time.sleep(0.05)
    dt = time.time() - t
    ok(exited(pid) and dt < 5, "sigint_exits_with_idle_connections_open", "still running after %.1f s" % dt)
    idle.close()
    half.close()


def g_invariance(url, mode, n="8", mt="16"):
    """n prompts sharing 300 ids (then 40 of their own), greedy, mt tokens each, alone and
    together: the same tokens, and with MODE c the same log-probabilities, bit for bit.
    MODE c runs them alone first (the first one uncached, the others from the cached shared
    prefix), then together, then the first again (from the cache). MODE fast runs them
    together first (every prompt uncached: their prefills share forward steps), then alone."""
    n, mt = int(n), int(mt)
    s = Server(url)
    base = 40000 if mode == "c" else 70000 if mode == "fast" else 100000
    shared = ids(base, 300, 11)
    prompts = [shared + ids(base + 1000 * (i + 1), 40, 100 + i) for i in range(n)]

    def one(p):
        st, j, raw = s.post("/v1/completions", C(p, max_tokens=mt, temperature=0, ignore_eos=True, logprobs=1))
        if st != 200:
            raise RuntimeError("HTTP %d %r" % (st, raw[:200]))
        ch = j["choices"][0]
        return ch["text"], ch["logprobs"]["tokens"], ch["logprobs"]["token_logprobs"], j["usage"]["prompt_tokens_details"]["cached_tokens"]

    def all_together():
        res = concurrently([lambda p=p: one(p) for p in prompts])
        errs = [x for x in res if isinstance(x, Exception)]
        if errs:
            raise errs[0]
        return res
    try:
        if mode == "c":
            alone = [one(p) for p in prompts]
            together = all_together()
        else:
            together = all_together()
            alone = [one(p) for p in prompts]
    except Exception as x:
        ok(False, "batch_invariance_" + mode, x)
        return
    diff = [i for i in range(n) if alone[i][:2] != together[i][:2]]
    ok(not diff and all(len(a[1]) == mt for a in alone), "batch_invariance_%s_tokens (%d prompts)" % (mode, n),
       "prompts %r differ: alone %r, together %r" % (diff, [alone[i][0] for i in diff[:2]], [together[i][0] for i in diff[:2]]))
    diff = [i for i in range(n) if alone[i][2] != together[i][2]]
    ok(not diff, "batch_invariance_%s_logprobs_bit_identical" % mode,
       "prompt %r: alone %r, together %r" % (diff[:1], diff and alone[diff[0]][2][:4], diff and together[diff[0]][2][:4]))
    if mode == "fast":
        # sampling with a seed: each request's own random stream, whatever runs beside it
        def sampled(i):
            st, j, raw = s.post("/v1/completions", C(prompts[i], max_tokens=mt, temperature=1, seed=1000 + i, ignore_eos=True))
            return text_of(j) if st == 200 else "HTTP %d" % st
        together = concurrently([lambda i=i: sampled(i) for i in range(min(n, 4))])
        alone = [sampled(i) for i in range(min(n, 4))]
        ok(together == alone, "seeded_sampling_batch_invariant", "alone %r, together %r" % (alone, together))
        return
    if mode != "c":
        return
    again = one(prompts[0])
    ok(alone[0][3] == 0 and again[3] > 0 and again[:3] == alone[0][:3], "prefix_cache_invariance_c",
       "first run cached %d, again cached %d; same tokens %r, same logprobs %r" % (
           alone[0][3], again[3], again[1] == alone[0][1], again[2] == alone[0][2]))


def g_drafts(url, ref, mode, n="4"):
    """Drafting changes nothing a client sees: greedy tokens and their log-probabilities are
    the server's without drafts, bit for bit (a verify step's rows compute as decoded
    tokens), alone, together and from the prefix cache; seeded sampling is batch invariant."""
    n = int(n)
    s, r = Server(url), Server(ref)
    base = 120000 if mode == "fp32" else 130000
    shared = ids(base, 100 if SAN else 300, 31)  # SAN=1: a shorter prefix (hits of 96 positions with --chunk 24)
    prompts = [shared + ids(base + 1000 * (i + 1), 20 + 3 * i, 40 + i) for i in range(n)]

    def one(srv, p):
        st, j, raw = srv.post("/v1/completions", C(p, max_tokens=12, temperature=0, ignore_eos=True, logprobs=1))
        if st != 200:
            raise RuntimeError("HTTP %d %r" % (st, raw[:200]))
        lp = j["choices"][0]["logprobs"]
        return lp["tokens"], lp["token_logprobs"], j["usage"]["prompt_tokens_details"]["cached_tokens"]
    try:
        want = [one(r, p) for p in prompts]
        together = concurrently([lambda p=p: one(s, p) for p in prompts])
        errs = [x for x in together if isinstance(x, Exception)]
        if errs:
            raise errs[0]
        alone = [one(s, p) for p in prompts]
    except Exception as x:
        ok(False, "drafts_" + mode, x)
        return
    for name, got in (("together", together), ("alone_cached", alone)):
        diff = [i for i in range(n) if got[i][:2] != want[i][:2]]
        ok(not diff, "drafts_%s_%s_tokens_and_logprobs_as_without" % (mode, name),
           "prompt %r: drafts %r, without %r" % (diff[:1], diff and got[diff[0]][:2], diff and want[diff[0]][:2]))
    ok(all(a[2] > 0 for a in alone), "drafts_%s_prefix_cache_hits" % mode, "cached %r" % [a[2] for a in alone])

    def sampled(i):
        st, j, raw = s.post("/v1/completions", C(prompts[i], max_tokens=12, temperature=1, seed=2000 + i, ignore_eos=True))
        return text_of(j) if st == 200 else "HTTP %d" % st
    together = concurrently([lambda i=i: sampled(i) for i in range(n)])
    alone = [sampled(i) for i in range(n)]
    ok(together == alone, "drafts_%s_seeded_sampling_batch_invariant" % mode, "alone %r, together %r" % (alone, together))


def g_oracle(url, prompt, want, log, glm, model):
    """Drafts that are the greedy continuation (GLM_DRAFT_ORACLE) are all accepted: long
    accepted prefixes, the rollback past them, and the text still glm run's."""
    s = Server(url)
    prompt = [int(x) for x in prompt.split(",")]
    want = [int(x) for x in want.split(",")]
    text = glm_decode(glm, model, want).rstrip("\n")
    got = []
    for _ in range(2):
        st, j, raw = s.post("/v1/completions", C(prompt, max_tokens=len(want), temperature=0, ignore_eos=True))
        got.append(text_of(j).rstrip("\n") if st == 200 else "HTTP %d %r" % (st, raw[:200]))
    ok(got == [text, text], "oracle_drafts_text_is_glm_runs", "serve %r, glm run %r" % (got, text))
    time.sleep(0.2)  # the log line follows the response
    acc = re.findall(r"drafts (\d+)/(\d+) accepted", open(log).read())
    ok(len(acc) == 2 and all(a == b and int(b) > 0 for a, b in acc), "oracle_drafts_all_accepted", "log: %r" % acc)


def proc_rss_kb(pid):
    with open("/proc/%s/status" % pid) as f:
        for l in f:
            if l.startswith("VmRSS:"):
                return int(l.split()[1])
    return -1


def proc_fds(pid):
    return len(os.listdir("/proc/%s/fd" % pid))


def g_load(url, pid, glm, n, nc):
    n, nc = int(n), int(nc)
    s = Server(url)
    fd0 = proc_fds(pid)
    # the warm-up: glm loadgen, 32 requests at once (also checks loadgen against the real server)
    t = time.time()
    p = subprocess.run([glm, "loadgen", url, "--requests", "32", "--concurrency", "32", "--input", "40", "--output", "8",
                        "--shared", "0.5", "--stream", "mixed", "--json", "--timeout", str(TIMEOUT)],
                       capture_output=True, text=True, timeout=3 * TIMEOUT)
    try:
        j = json.loads(p.stdout)
        why = "" if p.returncode == 0 and j["successful_requests"] == 32 and j["total_output_tokens"] == 256 \
            else "exit %d: %r" % (p.returncode, {k: j.get(k) for k in ("successful_requests", "total_output_tokens", "cached_tokens", "errors")})
    except Exception as x:
        why = "exit %d, %s: %s %s" % (p.returncode, x, p.stdout[:200], p.stderr[:300])
    ok(not why, "loadgen_warmup_32_requests", why)
    time.sleep(0.2)
    rss1 = proc_rss_kb(pid)

    # the load: n requests from nc clients, each on its own keep-alive connection
    rnd = random.Random(5)
    jobs = []
    for i in range(n):
        plen, mt = rnd.randint(20, 60), rnd.randint(4, 16)
        jobs.append((i, [rnd.randrange(100, 150000) for _ in range(plen)], mt, i % 2 == 0))
    lock = threading.Lock()
    results, problems = {}, []
    it = iter(jobs)

    def client():
        c = s.conn()
        while True:
            with lock:
                job = next(it, None)
            if job is None:
                break
            i, prompt, mt, stream = job
            body = {"prompt": prompt, "max_tokens": mt, "temperature": 0, "ignore_eos": True}
            if stream:
                body.update(stream=True, stream_options={"include_usage": True})
            why, rid = "", None
            try:
                c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
                r = c.getresponse()
                data = r.read()
                if r.status != 200:
                    why = "HTTP %d %r" % (r.status, data[:200])
                elif stream:
                    ev, done = parse_sse(data.decode("utf-8", "replace"))
                    cs = chunks_of(ev)
                    u = cs[-1].get("usage") if cs else None
                    why = "" if done else "no [DONE]"
                    why = why or usage_ok(u, len(prompt), mt)
                    ids_ = {x["id"] for x in cs}
                    if not why and len(ids_) != 1:
                        why = "chunk ids %r" % ids_
                    rid = cs[0]["id"] if cs else None
                    if not why and sum(1 for x in cs if x["choices"] and x["choices"][0]["finish_reason"] == "length") != 1:
                        why = "finish reasons %r" % [x["choices"][0]["finish_reason"] for x in cs if x["choices"]]
                else:
                    jj = json.loads(data)
                    why = usage_ok(jj["usage"], len(prompt), mt)
                    rid = jj["id"]
                    if not why and jj["choices"][0]["finish_reason"] != "length":
                        why = "finish_reason %r" % jj["choices"][0]["finish_reason"]
            except Exception as x:
                why = "%s: %s" % (type(x).__name__, x)
                c.close()
                c = s.conn()
            with lock:
                if why:
                    problems.append("request %d%s: %s" % (i, " (stream)" if stream else "", why))
                results[i] = rid
        c.close()
    ts = [threading.Thread(target=client) for _ in range(nc)]
    t = time.time()
    for x in ts:
        x.start()
    for x in ts:
        x.join()
    dt = time.time() - t
    rids = [r for r in results.values() if r]
    ok(not problems and len(results) == n, "load_%d_requests_%d_clients_all_200_exact_tokens" % (n, nc),
       "%d problems in %d answers: %s" % (len(problems), len(results), "; ".join(problems[:3])))
    ok(len(rids) == n and len(set(rids)) == n, "load_ids_unique_none_lost",
       "%d ids, %d distinct, %d requests" % (len(rids), len(set(rids)), n))
    sys.stderr.write("    (load: %d requests in %.1f s, %.1f req/s)\n" % (n, dt, n / dt))

    # afterwards: memory back near its level after the warm-up, every descriptor closed
    fd1 = proc_fds(pid)
    for _ in range(60):
        fd1 = proc_fds(pid)
        if fd1 <= fd0:
            break
        time.sleep(0.05)
    rss2 = proc_rss_kb(pid)
    limit = (100 if SAN else 30) * 1024
    ok(rss2 - rss1 <= limit, "load_rss_bounded", "VmRSS %d kB after the warm-up, %d kB after the load (+%d kB, limit +%d kB)" % (
        rss1, rss2, rss2 - rss1, limit))
    ok(fd1 <= fd0, "load_fds_closed", "%d descriptors before, %d after: %s" % (fd0, fd1, sorted(
        os.readlink("/proc/%s/fd/%s" % (pid, f)) for f in os.listdir("/proc/%s/fd" % pid))[:20]))
    sys.stderr.write("    (load: VmRSS %d -> %d kB, fds %d -> %d)\n" % (rss1, rss2, fd0, fd1))


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}}}}}]


def g_tools(url, reasoning, answer, call_text):
    """A server whose every request "generates" REASONING</think>ANSWER CALL_TEXT (GLM_SERVE_SCRIPT):
    the reasoning, the answer and the tool call come back in their OpenAI fields, whole and streamed."""
    s = Server(url)
    want_args = {"city": "Paris", "days": 3}
    st, j, raw = s.post("/v1/chat/completions", CHAT("weather in Paris?", tools=TOOLS, max_tokens=64))
    m = (j or {}).get("choices", [{}])[0].get("message", {}) if st == 200 else {}
    calls = m.get("tool_calls") or []
    f = calls[0].get("function", {}) if calls else {}
    try:
        args = json.loads(f.get("arguments", "null"))
    except ValueError:
        args = None
    ok(st == 200 and m.get("reasoning_content") == reasoning and m.get("content") == answer, "tools_reasoning_and_content_split",
       "%d %r" % (st, raw[:400]))
    ok(len(calls) == 1 and f.get("name") == "get_weather" and args == want_args and calls[0].get("type") == "function"
       and isinstance(calls[0].get("id"), str) and calls[0]["id"], "tools_call_parsed", repr(calls))
    ok(j and j["choices"][0].get("finish_reason") == "tool_calls", "tools_finish_reason_tool_calls", repr(j)[:300])
    # streamed: the deltas join to the same fields; the call comes whole at the end, no markup leaks
    st, events, done, raw, _ = s.stream("/v1/chat/completions", CHAT("weather in Paris?", tools=TOOLS, max_tokens=64, stream=True))
    try:
        chunks = chunks_of(events)
    except ValueError as x:
        chunks = []
        ok(False, "tools_stream_json", str(x))
    rc = "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in chunks if c.get("choices"))
    ct = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    sc = [tc for c in chunks if c.get("choices") for tc in (c["choices"][0]["delta"].get("tool_calls") or [])]
    fin = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices") and c["choices"][0].get("finish_reason")]
    try:
        sargs = json.loads(sc[0]["function"]["arguments"]) if sc else None
    except (ValueError, KeyError):
        sargs = None
    ok(st == 200 and done and rc == reasoning and ct == answer, "tools_stream_deltas_join", "%r %r" % (rc, ct))
    ok(len(sc) == 1 and sc[0].get("index") == 0 and sc[0]["function"].get("name") == "get_weather" and sargs == want_args,
       "tools_stream_call", repr(sc))
    ok(fin == ["tool_calls"], "tools_stream_finish_reason", repr(fin))
    # without tools in the request the call is text, as written
    st, j, raw = s.post("/v1/chat/completions", CHAT("weather?", max_tokens=64))
    m = (j or {}).get("choices", [{}])[0].get("message", {}) if st == 200 else {}
    ok(m.get("content") == answer + call_text and not m.get("tool_calls") and j["choices"][0]["finish_reason"] == "stop",
       "tools_none_requested_call_stays_text", repr(raw[:400]))
    # thinking off: the whole output is the answer (</think> included as written)
    st, j, raw = s.post("/v1/chat/completions", CHAT("weather?", max_tokens=64, chat_template_kwargs={"enable_thinking": False}))
    m = (j or {}).get("choices", [{}])[0].get("message", {}) if st == 200 else {}
    ok("reasoning_content" not in m and m.get("content") == reasoning + "</think>" + answer + call_text, "tools_thinking_off_all_content",
       repr(raw[:400]))
    # a stop string inside the reasoning ends the output there, whole and streamed
    word = reasoning.split()[1]
    st, j, raw = s.post("/v1/chat/completions", CHAT("weather?", max_tokens=64, stop=[word]))
    m = (j or {}).get("choices", [{}])[0].get("message", {}) if st == 200 else {}
    ok(m.get("reasoning_content") == reasoning[:reasoning.index(word)] and m.get("content") == ""
       and j["choices"][0]["finish_reason"] == "stop", "tools_stop_in_reasoning", repr(raw[:400]))
    st, events, done, raw, _ = s.stream("/v1/chat/completions", CHAT("weather?", max_tokens=64, stop=[word], stream=True))
    rc = "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in chunks_of(events) if c.get("choices"))
    ok(done and rc == reasoning[:reasoning.index(word)], "tools_stream_stop_in_reasoning", repr(rc))


def g_cache_chunk(url, url_nocache):
    """URL runs prompts in chunks of 24 tokens (not a multiple of the cache's 16-token blocks),
    URL_NOCACHE in chunks of 40 without a cache: a prompt's rows come out the same whatever
    chunks computed them, so a prompt that starts from any whole block of a cached prompt
    (or repeats its tokens at other positions) gets the logits of the server without a cache,
    bit for bit."""
    s, fresh = Server(url), Server(url_nocache)
    p = ids(3000, 90, 41)
    p3 = p[:80] + p[64:80] + ids(3000, 20, 42)
    body = lambda pr: C(pr, max_tokens=8, temperature=0, ignore_eos=True, logprobs=1)
    for _ in range(2):
        s.post("/v1/completions", body(p))
    st, a, _ = s.post("/v1/completions", body(p3))
    st2, b, _ = fresh.post("/v1/completions", body(p3))
    key = lambda j: (j["choices"][0]["text"], j["choices"][0]["logprobs"]["token_logprobs"]) if j else None
    hit = a["usage"]["prompt_tokens_details"]["cached_tokens"] if st == 200 else None
    ok(st == 200 and st2 == 200 and hit == 80 and key(a) == key(b), "cache_any_block_other_chunks_same_logits",
       "cached %r (cached_tokens %r, want 80) vs no cache %r" % (key(a), hit, key(b)))
    # a prompt's last chunk, shorter than --chunk (rows 24..39 of a 40-token prompt), is cached
    # too: a later prompt starts from its block 16..31, which two chunks computed
    q = ids(7000, 110, 43)
    s.post("/v1/completions", body(q[:40]))
    q3 = q[:36] + ids(7000, 10, 44)
    st, a, _ = s.post("/v1/completions", body(q3))
    st2, b, _ = fresh.post("/v1/completions", body(q3))
    hit = a["usage"]["prompt_tokens_details"]["cached_tokens"] if st == 200 else None
    ok(st == 200 and st2 == 200 and hit == 32 and key(a) == key(b), "cache_short_last_chunk_reused_same_logits",
       "cached %r (cached_tokens %r, want 32) vs no cache %r" % (key(a), hit, key(b)))


def g_script2(url, answer):
    """A server scripted to write "</think>" + ANSWER (ANSWER holds a malformed <tool_call>)."""
    s = Server(url)
    st, j, raw = s.post("/v1/chat/completions", CHAT("hi", max_tokens=32))
    m = (j or {}).get("choices", [{}])[0].get("message", {}) if st == 200 else {}
    ok(m.get("reasoning_content") == "" and m.get("content") == answer, "empty_reasoning_marker_not_in_content", repr(raw[:300]))
    for tools in (None, TOOLS):
        kw = {"tools": tools} if tools else {}
        st, j, raw = s.post("/v1/chat/completions", CHAT("hi", max_tokens=32, **kw))
        m = (j or {}).get("choices", [{}])[0].get("message", {}) if st == 200 else {}
        st, events, done, raw2, _ = s.stream("/v1/chat/completions", CHAT("hi", max_tokens=32, stream=True, **kw))
        chunks = chunks_of(events)
        ct = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
        rc = "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in chunks if c.get("choices"))
        ok(m.get("content") == answer and not m.get("tool_calls") and ct == answer and rc == "",
           "malformed_tool_call_is_content%s (whole and streamed)" % ("_with_tools" if tools else ""), "%r / %r %r" % (raw[:200], ct, rc))
    st, j, raw = s.post("/v1/chat/completions", CHAT("hi", max_tokens=8, stop=["a\u0000b"]))
    ok(error_ok(st, j, 400, "stop") == "", "stop_string_with_nul_400", error_ok(st, j, 400, "stop"))


def g_sampled_logprobs(url, glm, model, script):
    """A sampled token's log-probability is log_softmax of the model's logits at it: on a
    server scripted to write SCRIPT's ids (GLM_SERVE_SCRIPT: drawn, then replaced), two
    requests at temperature 1 decoding in the same steps (each row's draw keeps its own copy
    of its logits) against glm logits' rows for their prompts and those ids."""
    s = Server(url)
    want_ids = [int(x) for x in script.split(",")]
    prompts = [ids(90000, 10, 31), ids(90000, 14, 32)]
    res = concurrently([lambda p=p: s.post("/v1/completions", C(p, max_tokens=len(want_ids), temperature=1, seed=5, logprobs=1))
                        for p in prompts])
    why = ""
    try:
        import numpy as np
        for p, (st, j, raw) in zip(prompts, res):
            got = j["choices"][0]["logprobs"]["token_logprobs"] if st == 200 else None
            f = os.path.join(os.environ.get("OUT", "/tmp"), "logits_sampled.f32")
            subprocess.run([glm, "logits", "-m", model, "--ids", ",".join(map(str, p + want_ids[:-1])), "-o", f],
                           capture_output=True, timeout=3 * TIMEOUT, check=True)
            rows = np.fromfile(f, dtype=np.float32).reshape(len(p) + len(want_ids) - 1, -1)[len(p) - 1:].astype(np.float64)
            lse = rows.max(1) + np.log(np.exp(rows - rows.max(1, keepdims=True)).sum(1))
            want = [float(rows[i, t] - lse[i]) for i, t in enumerate(want_ids)]
            if not got or len(got) != len(want) or max(abs(a - b) for a, b in zip(got, want)) > 2e-3:
                why = "prompt of %d ids: serve %r, glm logits %r (HTTP %d)" % (len(p), got, want, st)
                break
    except Exception as x:
        why = "%s: %s" % (type(x).__name__, x)
    ok(not why, "sampled_logprobs_are_log_softmax_of_glm_logits (2 requests together)", why)


GROUPS = {"basic": g_basic, "completions": g_completions, "chat": g_chat, "stream": g_stream, "errors": g_errors,
          "limits": g_limits, "cache": g_cache, "continuation": g_continuation, "nocache": g_nocache, "queue": g_queue, "disconnect": g_disconnect, "drafts": g_drafts, "oracle": g_oracle,
          "sigterm": g_sigterm, "sigint": g_sigint, "invariance": g_invariance, "load": g_load, "tools": g_tools,
          "cache_chunk": g_cache_chunk, "script2": g_script2, "sampled_logprobs": g_sampled_logprobs}

if __name__ == "__main__":
    g = GROUPS.get(sys.argv[1] if len(sys.argv) > 1 else "")
    if not g:
        sys.exit("usage: checks.py %s URL [ARGS...]" % "|".join(GROUPS))
    try:
        g(*sys.argv[2:])
    except Exception as x:  # a check that could not finish is a failure, named
        import traceback
        traceback.print_exc()
        out("FAIL %s_group_crashed (%s: %s)" % (sys.argv[1], type(x).__name__, str(x)[:300]))
