#!/usr/bin/env python3
"""fake_openai.py - a fake OpenAI-compatible endpoint for tests/test_loadgen.sh (standard library only).

    GET  /health, /v1/models                 {"data": [{"id": MODEL}]}
    POST /v1/completions                     prompt = a list of token ids; stream true or false

Streams are Server-Sent Events: one event per token (text "t<k> ") after --token-delay ms, a
finish_reason on the last, a usage chunk when stream_options.include_usage is true, then
data: [DONE]. The usage reports cached_tokens = the longest common prefix with an earlier
prompt (a perfect prefix cache). Each request is checked (a list of ints, max_tokens,
ignore_eos true, temperature 0, the model's name, include_usage when streaming): a bad one gets
400 with the reason. Every request is logged as one JSON line to --log.

  --chunked          Transfer-Encoding: chunked for every response (llama-server, uvicorn);
                     otherwise streams end by closing the connection, JSON has a Content-Length
  --fail-every K     every K-th completion request (K, 2K, ...) fails, as --fail-mode says:
                       500       HTTP 500 with an OpenAI error body
                       badjson   a stream event that is not JSON
                       truncate  the stream stops after two tokens (connection closed, no [DONE])
                       badchunk  a malformed chunk size (only with --chunked)
                       hang      no response until the client gives up
                       noise     a line that is not SSE
  --api-key KEY      requests without "Authorization: Bearer KEY" get 401
  --port-file FILE   the port (bind to --port, 0: any free one) is written here once listening
"""
import argparse
import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, default=0)
ap.add_argument("--port-file")
ap.add_argument("--model", default="fake-model")
ap.add_argument("--token-delay", type=float, default=0.0, help="ms before each streamed token")
ap.add_argument("--chunked", action="store_true")
ap.add_argument("--fail-every", type=int, default=0)
ap.add_argument("--fail-mode", default="500", choices=["500", "badjson", "truncate", "badchunk", "hang", "noise"])
ap.add_argument("--api-key")
ap.add_argument("--log")
args = ap.parse_args()

lock = threading.Lock()
state = {"n": 0, "prompts": []}


def lcp(a, b):
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *a):
        pass

    # --- writing -----------------------------------------------------------------
    def start(self, status, ctype, length=None):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        if args.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        elif length is not None:
            self.send_header("Content-Length", str(length))
        if not args.chunked and length is None:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()

    def put(self, data):
        if isinstance(data, str):
            data = data.encode()
        if args.chunked:
            data = b"%x\r\n%s\r\n" % (len(data), data)
        self.wfile.write(data)
        self.wfile.flush()

    def finish_body(self):
        if args.chunked:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    def send_json(self, status, obj):
        body = json.dumps(obj).encode()
        self.start(status, "application/json", len(body))
        if args.chunked and len(body) > 8:  # a few chunks, as uvicorn may send
            self.put(body[: len(body) // 3])
            self.put(body[len(body) // 3:])
        else:
            self.put(body)
        self.finish_body()

    def error(self, status, msg):
        self.send_json(status, {"error": {"message": msg, "type": "invalid_request_error", "code": status}})

    # --- requests ----------------------------------------------------------------
    def authorized(self):
        if args.api_key and self.headers.get("Authorization") != "Bearer " + args.api_key:
            self.error(401, "invalid api key")
            return False
        return True

    def do_GET(self):
        if self.path == "/health":
            return self.send_json(200, {"status": "ok"})
        if not self.authorized():
            return
        if self.path == "/v1/models":
            return self.send_json(200, {"object": "list", "data": [{"id": args.model, "object": "model", "owned_by": "fake"}]})
        self.error(404, "no such path " + self.path)

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n)
        if not self.authorized():
            return
        if self.path != "/v1/completions":
            return self.error(404, "no such path " + self.path)
        try:
            req = json.loads(raw)
        except ValueError as e:
            return self.error(400, "bad JSON: %s" % e)
        p, stream = req.get("prompt"), req.get("stream", False)
        so = req.get("stream_options")
        why = None
        if not isinstance(p, list) or not p or not all(isinstance(x, int) and not isinstance(x, bool) for x in p):
            why = "prompt must be a non-empty list of token ids"
        elif not isinstance(req.get("max_tokens"), int) or req["max_tokens"] < 1:
            why = "max_tokens must be a positive integer"
        elif req.get("ignore_eos") is not True:
            why = "ignore_eos must be true"
        elif req.get("temperature") != 0:
            why = "temperature must be 0"
        elif req.get("model") != args.model:
            why = "unknown model %r" % req.get("model")
        elif not isinstance(stream, bool):
            why = "stream must be a boolean"
        elif stream and not (isinstance(so, dict) and so.get("include_usage") is True):
            why = "streaming without stream_options.include_usage"
        elif not stream and so is not None:
            why = "stream_options without stream"  # as vLLM answers
        if why:
            return self.error(400, why)
        with lock:
            state["n"] += 1
            k = state["n"]
            cached = max([lcp(p, q) for q in state["prompts"][-16:]] or [0])
            state["prompts"].append(p)
            if args.log:  # opened per request: a test may remove the file between runs
                with open(args.log, "a") as log:
                    log.write(json.dumps({"k": k, "n_prompt": len(p), "stream": stream, "max_tokens": req["max_tokens"],
                                          "model": req["model"], "cached": cached, "prompt": p}) + "\n")
        failing = args.fail_every and k % args.fail_every == 0
        mode = args.fail_mode if failing else None
        if mode == "500":
            return self.send_json(500, {"error": {"message": "fake failure on request %d" % k, "type": "server_error", "code": 500}})
        if mode == "hang":
            time.sleep(30)
            self.close_connection = True
            return
        m = req["max_tokens"]
        usage = {"prompt_tokens": len(p), "completion_tokens": m, "total_tokens": len(p) + m,
                 "prompt_tokens_details": {"cached_tokens": cached}}
        base = {"id": "cmpl-%d" % k, "object": "text_completion", "created": int(time.time()), "model": args.model}
        if not stream:
            time.sleep(args.token_delay / 1000 * m)
            text = "".join("t%d " % i for i in range(m))
            return self.send_json(200, dict(base, choices=[{"index": 0, "text": text, "finish_reason": "length"}], usage=usage))
        self.start(200, "text/event-stream")
        try:
            for i in range(m):
                time.sleep(args.token_delay / 1000)
                if mode == "truncate" and i == 2:
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if mode == "badjson" and i == 1:
                    self.put('data: {"choices": [{"text": "oops"\n\n')
                    continue
                if mode == "noise" and i == 1:
                    self.put("<html>not an event stream</html>\n\n")
                    continue
                if mode == "badchunk" and i == 1:
                    self.wfile.write(b"zz\r\nxx\r\n")
                    self.wfile.flush()
                    self.close_connection = True
                    return
                ev = dict(base, choices=[{"index": 0, "text": "t%d " % i, "logprobs": None,
                                          "finish_reason": "length" if i == m - 1 else None}])
                self.put("data: %s\n\n" % json.dumps(ev))
            self.put("data: %s\n\n" % json.dumps(dict(base, choices=[], usage=usage)))
            self.put("data: [DONE]\n\n")
            self.finish_body()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256


srv = Server(("127.0.0.1", args.port), Handler)
if args.port_file:
    with open(args.port_file + ".tmp", "w") as f:
        f.write("%d\n" % srv.server_address[1])
    import os
    os.replace(args.port_file + ".tmp", args.port_file)
try:
    srv.serve_forever()
except KeyboardInterrupt:
    pass
