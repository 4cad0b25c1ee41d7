#!/usr/bin/env python3
"""tests/chat_template/oracle.py - the oracle of tests/test_chat_template.sh: GLM-5.2's chat
template itself, rendered the way Hugging Face's apply_chat_template renders it, and the
generated conversations it is compared on.

  oracle.py gen N SEED > cases.jsonl            N random conversations (+ the hand-written ones
                                                 below), one JSON object per line: the template's
                                                 variables, as `glm tokenize --chat --jsonl` reads them
  oracle.py render TEMPLATE < cases.jsonl       one line per case: the prompt as a JSON string, or
                                                 {"error": ...} where the template raises
  oracle.py compare CASES WANT GOT [WANT_IDS GOT_IDS]
                                                 PASS/FAIL lines; exits 1 on a difference

Rendering as transformers does (utils/chat_template_utils.py): jinja2's ImmutableSandboxedEnvironment
with trim_blocks, lstrip_blocks and the loopcontrols extension; tojson is json.dumps with
ensure_ascii (default False), indent, separators, sort_keys passed through; the variables are
the JSON object's members as keyword arguments (tools=None and add_generation_prompt=False when
absent, as apply_chat_template passes them). Needs python3-jinja2 (Debian) or jinja2 from pip.
"""
import json
import random
import struct
import sys


def make_env():
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def render(template, case):
    kw = dict(case)
    kw.setdefault("tools", None)
    kw.setdefault("add_generation_prompt", False)
    return template.render(**kw)


# ---------------------------------------------------------------- generated conversations

# Python's str.strip() white space, all of it, and look-alikes that are not white space
WS = [" ", "\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x85", "\xa0", "\u1680",
      "\u2000", "\u2005", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"]
NOT_WS = ["\u200b", "\ufeff", "\u180e", "\x7f", "\x01"]
WORDS = ["Hello", "world", "What is 2+2?", "4", "你好，世界！", "こんにちは", "مرحبا بالعالم", "Привет",
         "😀", "👩‍👩‍👧", "🇺🇸", "e\u0301", "ſ", "İstanbul", "x" * 300, "a b  c", "quote \" and \\ backslash",
         "{\"json\": [1, 2]}", "None", "null", "<think>", "</think>", "<|user|>", "<|assistant|>",
         "<|observation|>", "<tool_call>f<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>",
         "<tool_response>", "[gMASK]", "line1\nline2", "\\u0041", "100%", "{{ not jinja }}", "{% raw %}"]
KEYS = ["city", "query", "n", "unit", "path", "ключ", "名前", "with space", "quote\"key", "back\\slash",
        "emoji😀", "", "type", "name", "defer_loading", "strict", "function"]
FLOATS = [0.0, -0.0, 0.1, 0.5, 1.0, -1.5, 1e16, 1e15, 123456789012345.6, 1e-4, 1e-5, 0.0001234, 1e22,
          1e23, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 9007199254740993.0,
          2.0 ** 60, 2.0 ** -60, 3.141592653589793, 1 / 3, 2 / 3, 100.0, 1e100, 123e-20, 4.35, 0.3]
INTS = [0, 1, -1, 42, -7, 2 ** 31, 2 ** 53 + 1, 2 ** 64, -(2 ** 70), 10 ** 30]


def rfloat(r):
    if r.random() < 0.5:
        return r.choice(FLOATS)
    while True:   # any finite double, from its bits
        v = struct.unpack("<d", struct.pack("<Q", r.getrandbits(64)))[0]
        if v == v and abs(v) != float("inf"):
            return v


def rtext(r, allow_empty=True):
    k = r.choice([0, 1, 1, 2, 3]) if allow_empty else r.choice([1, 2, 3])
    s = "".join(r.choice([" ", "", "\n"]) + r.choice(WORDS) for _ in range(k))
    if r.random() < 0.3:
        s = "".join(r.choice(WS) for _ in range(r.randint(1, 3))) + s
    if r.random() < 0.3:
        s = s + "".join(r.choice(WS) for _ in range(r.randint(1, 3)))
    if r.random() < 0.1:
        s = r.choice(NOT_WS) + s + r.choice(NOT_WS)
    if r.random() < 0.05:
        s = "".join(r.choice(WS) for _ in range(r.randint(1, 4)))   # white space only
    return s


def rvalue(r, depth=0):
    c = r.randrange(8 if depth < 2 else 5)
    if c == 0: return rtext(r)
    if c == 1: return r.choice(INTS)
    if c == 2: return rfloat(r)
    if c == 3: return r.choice([True, False])
    if c == 4: return None
    if c == 5: return [rvalue(r, depth + 1) for _ in range(r.randint(0, 3))]
    return {r.choice(KEYS): rvalue(r, depth + 1) for _ in range(r.randint(0, 3))}


def rarguments(r):
    args = {}
    for _ in range(r.randint(0, 4)):
        k = r.choice(KEYS)
        args[k] = rtext(r) if r.random() < 0.5 else rvalue(r)
    return args


def rtool_call(r):
    name = r.choice(["get_weather", "search", "run_code", "函数", "f"])
    call = {"name": name, "arguments": rarguments(r)}
    c = r.randrange(4)
    if c == 0: return call
    if c == 1: return {"id": "call_%d" % r.randrange(1000), "type": "function", "function": call}
    if c == 2: return {"type": "function", "function": call, "extra": 1}
    return dict(call, function={})   # a falsy "function": the call itself is used


def rtool(r):
    fn = {"name": r.choice(["get_weather", "search", "run_code", "函数", "lookup"]),
          "description": rtext(r, False),
          "parameters": {"type": "object",
                         "properties": {k: {"type": r.choice(["string", "number", "integer", "boolean"]),
                                            "description": rtext(r)} for k in r.sample(KEYS, r.randint(0, 3))},
                         "required": []}}
    if r.random() < 0.3: fn["strict"] = r.choice([True, False])
    if r.random() < 0.3: fn["defer_loading"] = r.choice([True, False, 1, 0, "", "yes", None])
    if r.random() < 0.2: fn[r.choice(KEYS)] = rvalue(r)   # keys written unescaped by the template
    if r.random() < 0.6:
        tool = {"type": "function", "function": fn}
        if r.random() < 0.2: tool["defer_loading"] = True   # outside "function": ignored
        return tool
    return fn


def rcontent(r, role):
    c = r.random()
    if c < 0.75: return rtext(r)
    if c < 0.8: return None
    if c < 0.85 and role != "tool": return "absent"
    items = []
    for _ in range(r.randint(0, 4)):
        k = r.randrange(7)
        if k == 0: items.append({"type": "text", "text": rtext(r)})
        elif k == 1: items.append(rtext(r))
        elif k == 2: items.append({"type": r.choice(["image", "image_url"]), "image_url": {"url": "x"}})
        elif k == 3: items.append({"type": r.choice(["video", "video_url", "audio", "audio_url", "input_audio"])})
        elif k == 4: items.append({"type": "text"})   # no text: nothing
        elif k == 5: items.append({"type": "other", "text": "ignored"})
        else: items.append(r.choice([5, None, ["nested"]]))   # ignored by visible_text
    return items


def rthink_content(r):
    a, b, c = rtext(r), rtext(r), rtext(r)
    return r.choice([a + "</think>" + b, "<think>" + a + "</think>" + b, c + "<think>" + a + "</think>" + b,
                     "<think>" + a + "<think>" + c + "</think>" + b + "</think>" + c, a + "</think>",
                     "</think>", "<think></think>" + b, a + "<think>" + b])


def rmessage(r, role):
    m = {"role": role}
    content = rcontent(r, role)
    if role == "assistant" and r.random() < 0.3:
        content = rthink_content(r)
    if content != "absent":
        m["content"] = content
    if role == "assistant":
        c = r.random()
        if c < 0.45: m["reasoning_content"] = rtext(r)
        elif c < 0.5: m["reasoning_content"] = r.choice([None, 5, ["x"]])   # not a string: as if absent
        if r.random() < 0.3: m["tool_calls"] = [rtool_call(r) for _ in range(r.randint(1, 3))]
        elif r.random() < 0.05: m["tool_calls"] = r.choice([[], None])
    if r.random() < 0.1: m["name"] = "ignored"
    if role == "tool" and r.random() < 0.3: m["tool_call_id"] = "call_1"
    return m


def rconversation(r, long=False):
    n = r.randint(40, 120) if long else r.randint(0, 10)
    msgs = []
    if r.random() < 0.4:
        msgs.append(rmessage(r, "system"))
    for _ in range(n):
        c = r.random()
        if c < 0.35: role = "user"
        elif c < 0.7: role = "assistant"
        elif c < 0.88: role = "tool"
        elif c < 0.95: role = "system"
        else: role = r.choice(["developer", "function", "observation", "USER", ""])
        msgs.append(rmessage(r, role))
        if role == "tool" and r.random() < 0.5:   # runs of tool results
            for _ in range(r.randint(1, 3)):
                msgs.append(rmessage(r, "tool"))
    if r.random() < 0.03:
        msgs.insert(r.randrange(len(msgs) + 1), r.choice(["not an object", None, 7, {"content": "no role"}, {"role": 5}]))
    case = {"messages": msgs}
    if r.random() < 0.4: case["tools"] = [rtool(r) for _ in range(r.randint(0, 4))]
    elif r.random() < 0.1: case["tools"] = None
    for key, vals in (("add_generation_prompt", [True, True, True, False, 0, 1, ""]),
                      ("enable_thinking", [True, False, False, None, 0, 1, "yes", ""]),
                      ("reasoning_effort", ["high", "max", "low", "High", None, 1, ""]),
                      ("clear_thinking", [True, False, False, None, 0, 1, "no"])):
        if r.random() < 0.6:
            case[key] = r.choice(vals)
    return case


# Written by hand: JSON spellings a Python round trip never makes (repeated keys, number forms,
# escapes), and errors both sides must report.
HAND = [
    r'{"messages": [{"role": "user", "content": "a", "content": "b"}], "add_generation_prompt": true}',
    r'{"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"name": "f", "arguments": {"a": 1E5, "b": 0.10000000000000001, "c": -0, "d": 123456789012345678901234567890, "e": 1e400, "f": -0.0, "g": -1e-400, "h": 2.5e-324, "i": 1.0e+2, "j": 0e0, "a": "repeat wins, first place"}}]}]}',
    r'{"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"s": "\u00e9\/\ud83d\ude00\t\u0001\u001f\u007f\u2028", "o": {"k": {"k": 1, "k": [true, false, null]}, "\"q\"": "\\"}}}}]}]}',
    r'{"messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "t", "x": 1, "x": 2, "strict": 1, "z\"q": {"y": 1, "y": -0}, "defer_loading": false}], "add_generation_prompt": true}',
    r'{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "a", "defer_loading": true}}, {"function": {"name": "b"}, "defer_loading": true}], "add_generation_prompt": true}',
    r'{"messages": [], "tools": [], "add_generation_prompt": true, "enable_thinking": false}',
    r'{"messages": [], "add_generation_prompt": false, "enable_thinking": true, "reasoning_effort": "high"}',
    r'{"messages": [{"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}, {"role": "x"}, {"role": "tool", "content": null}]}',
    r'{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "r</think>a", "reasoning_content": "given"}], "clear_thinking": false}',
    r'{"messages": [{"role": "user", "content": " \u3000x\u3000 "}, {"role": "assistant", "content": "\u3000\u0085 answer \u00a0", "reasoning_content": "\n keep white space \n"}], "add_generation_prompt": true}',
    # errors on both sides
    r'{"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}]}',
    r'{"messages": [{"role": "assistant", "tool_calls": [{"name": "f"}]}]}',
    r'{"messages": [{"role": "assistant", "tool_calls": [{"name": "f", "arguments": [1, 2]}]}]}',
    r'{"messages": [{"role": "assistant", "tool_calls": [{"function": "f"}]}]}',
    r'{"messages": [{"role": "assistant", "tool_calls": [{"name": 5, "arguments": {}}]}]}',
    r'{"messages": [], "tools": [{"type": "function", "function": null}]}',
    r'{"messages": [], "tools": ["a tool name"]}',
    r'{"messages": [], "tools": [{"function": ["x"]}]}',
]


def float_case(r):
    """One tool call whose arguments hold every power of two, its neighbours and random doubles:
    repr()'s shortest digits are hardest next to powers of two (uneven gaps on either side)."""
    import math
    vals = []
    for e in range(-1074, 1024):
        v = math.ldexp(1.0, e)
        vals += [v, math.nextafter(v, 0), math.nextafter(v, math.inf)]
    vals = [v for v in vals if v != math.inf] + [rfloat(r) for _ in range(3000)]
    return {"messages": [{"role": "assistant", "tool_calls": [{"name": "f", "arguments": {"v": vals, "n": [-v for v in vals[:500]]}}]}]}


def gen(n, seed):
    r = random.Random(seed)
    for line in HAND:
        print(line)
    print(json.dumps(float_case(r)))
    for i in range(n):
        print(json.dumps(rconversation(r, long=(i % 25 == 0)), ensure_ascii=r.random() < 0.5))


def render_all(path):
    env = make_env()
    template = env.from_string(open(path, encoding="utf-8").read())
    for line in sys.stdin:
        case = json.loads(line)
        try:
            out = json.dumps(render(template, case), ensure_ascii=False)
        except Exception as e:   # what the template cannot render
            out = json.dumps({"error": "%s: %s" % (type(e).__name__, e)})
        print(out)


def compare(cases, want, got, want_ids=None, got_ids=None):
    rd = lambda p: open(p, encoding="utf-8").read().split("\n")[:-1]   # not splitlines(): U+2028 is no line end here
    cases, want, got = rd(cases), rd(want), rd(got)
    fails = 0

    def check(ok, what, detail=""):
        nonlocal fails
        print(("PASS " if ok else "FAIL ") + what)
        if not ok:
            fails += 1
            if detail: print(detail)

    check(len(want) == len(cases) == len(got), "one output line per conversation (%d cases, %d rendered, %d from glm)" % (len(cases), len(want), len(got)))
    same, errs, bad = 0, 0, []
    for i, (c, w, g) in enumerate(zip(cases, want, got)):
        w, g = json.loads(w), json.loads(g)
        if isinstance(w, dict):   # the template raised: glm must refuse the line too
            errs += 1
            if g is not None: bad.append((i, "template raised %s, glm rendered" % w["error"]))
        elif w == g:
            same += 1
        else:
            k = next((j for j in range(min(len(w), len(g or ""))) if w[j] != g[j]), min(len(w), len(g or "")))
            bad.append((i, "first difference at byte %d:\n      template %r\n      glm      %r" % (
                len(w[:k].encode()), w[max(0, k - 40):k + 60], None if g is None else g[max(0, k - 40):k + 60])))
    n_ok = len(cases) - errs
    detail = "\n".join("    line %d: %s\n      case %s" % (i + 1, why, cases[i][:300]) for i, why in bad[:5])
    check(not bad, "prompt text byte-identical to the template on %d of %d conversations; %d refused by both" % (same, n_ok, errs), detail)
    long_ = sum(1 for c in cases if len(json.loads(c).get("messages", [])) >= 40)
    print("    (%d conversations with 40+ messages; %d with tools; %d with tool_calls)" % (
        long_, sum(1 for c in cases if json.loads(c).get("tools")), sum(1 for c in cases if '"tool_calls": [{' in c)))
    if want_ids:
        wi, gi = rd(want_ids), rd(got_ids)
        texts = [i for i, w in enumerate(want) if not isinstance(json.loads(w), dict)]
        diff = [texts[j] for j, (a, b) in enumerate(zip(wi, [gi[i] for i in texts])) if a != b]
        check(len(wi) == len(texts) and not diff,
              "token ids of the rendered conversations (tokenizer_render_chat) equal the ids of the template's text on %d conversations" % len(texts),
              "    first differing lines: %s" % [d + 1 for d in diff[:5]])
    return fails


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "gen":
        gen(int(sys.argv[2]), int(sys.argv[3]))
    elif cmd == "render":
        render_all(sys.argv[2])
    elif cmd == "compare":
        sys.exit(1 if compare(*sys.argv[2:]) else 0)
    else:
        sys.exit(__doc__)
