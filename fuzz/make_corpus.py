#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/ (committed; rerun only to refresh them).

    /usr/bin/python3 fuzz/make_corpus.py CKDIR [TOKENIZER_JSON]

CKDIR holds tiny checkpoints made by tests/make_tiny.py (one folder per variant, e.g.
tests/out/forward after tests/test_forward.py ran: bf16/ fp8/ mxfp4/ mixed/ ngroup/).
TOKENIZER_JSON defaults to build/tokenizer.json (make build/tokenizer.json unpacks it).
Standard library only. Output stays small (< 1 MB): shard files are cut after their
header (fuzz_checkpoint synthesizes the data section, see fuzz/fuzz_checkpoint.c)."""
import hashlib
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")
SEP = b"\n\x00GLMFUZZ\x00\n"   # part separator of fuzz_checkpoint inputs (must match fuzz_checkpoint.c)


def put(target, data, name=None):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    name = name or hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def st_prefix(path):
    """A shard for fuzz_checkpoint: 8-byte LE data-section size, then the file cut after its header."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    return struct.pack("<Q", len(raw) - 8 - n) + raw[:8 + n]


def st_file(header, data_size):
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((-len(hj)) % 8)
    return struct.pack("<Q", data_size) + struct.pack("<Q", len(hj)) + hj


def checkpoints(ckdir):
    for v in sorted(os.listdir(ckdir)):
        d = os.path.join(ckdir, v)
        if os.path.isfile(os.path.join(d, "config.json")) and os.path.isfile(os.path.join(d, "model.safetensors.index.json")):
            yield v, d


def trim_tokenizer(tok, n_vocab):
    """The real tokenizer.json with the vocab cut to the n_vocab lowest ids (the 256 byte
    tokens first) and the merges whose parts and result survive; everything else kept."""
    t = json.loads(json.dumps(tok))
    m = t["model"]
    vocab = {k: i for k, i in m["vocab"].items() if i < n_vocab}
    merges = []
    for mg in m["merges"]:
        a, b = mg if isinstance(mg, list) else mg.split(" ", 1)
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(mg)
    m["vocab"] = vocab
    m["merges"] = merges
    # added tokens keep their (large) ids: the loader must cope with gaps
    return json.dumps(t, ensure_ascii=False, separators=(",", ":"))


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    ckdir = sys.argv[1]
    tokpath = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "..", "build", "tokenizer.json")

    cks = list(checkpoints(ckdir))
    # --- json: real configs, an index, shard headers; small hand-written edge cases
    for v, d in cks:
        put("json", open(os.path.join(d, "config.json"), "rb").read(), "config-%s.json" % v)
    for v, d in cks[:1]:
        idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
        put("json", json.dumps(idx, indent=1)[:0] + json.dumps({"metadata": idx.get("metadata", {}),
            "weight_map": dict(list(idx["weight_map"].items())[:40])}, indent=2), "index-%s.json" % v)
        for f in sorted(os.listdir(d)):
            if f.endswith(".safetensors"):
                raw = open(os.path.join(d, f), "rb").read()
                (n,) = struct.unpack("<Q", raw[:8])
                put("json", raw[8:8 + n], "header-%s-%s.json" % (v, f[:11]))
    for s in ['{}', '[]', '""', '0', '-0.0e+0', '1e999', '18446744073709551615', '18446744073709551616',
              '"\\ud83d\\ude00 \\u00e9 \\u0000 \\"\\\\\\/\\b\\f\\n\\r\\t"', '"\u00e9\u4e2d\U0001f600"',
              '{"a":[1,2.5,-3e-7,true,false,null,{"b":{}}],"a":"dup"}', '[' * 40 + ']' * 40,
              '{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]}']:
        put("json", s)

    # --- tokenizer_load / encode
    if os.path.isfile(tokpath):
        tok = json.load(open(tokpath, encoding="utf-8"))
        put("tokenizer_load", trim_tokenizer(tok, 300), "tokenizer-300.json")
        put("tokenizer_load", trim_tokenizer(tok, 2000), "tokenizer-2000.json")
        t2 = json.loads(trim_tokenizer(tok, 300))
        t2["model"]["merges"] = [" ".join(m) for m in t2["model"]["merges"]]
        t2["model"]["ignore_merges"] = False
        t2["added_tokens"] = t2["added_tokens"][:4]
        put("tokenizer_load", json.dumps(t2, ensure_ascii=False, indent=1), "tokenizer-300-strmerges.json")
        put("json", trim_tokenizer(tok, 260), "tokenizer-260.json")
        ka = os.path.join(os.path.dirname(tokpath), "known-answers.json")
        if os.path.isfile(ka):
            for text, _ in json.load(open(ka, encoding="utf-8")):
                put("encode", text)
    for s in ["Hello world", "  leading and trailing  \n\n", "[gMASK]<sop><|user|>hi<|assistant|><think>",
              "Ünïcödé 中文 日本語 한국어 🙂 emoji\u200d mixed", "x = 1234567 + 3.14159;\r\n\tif (a) { b(); }",
              "it's they're I'LL we'VE", b"\xff\xfe invalid \xc0\xaf utf8 \xed\xa0\x80 \xf4\x90\x80\x80 \xe2\x82",
              "\u0000nul\u0000", " " * 50 + "\n" * 5 + "\t" * 3]:
        put("encode", s)

    # --- checkpoint: config + index + shards (cut after the header), the loader's whole input
    for v, d in cks:
        idx = open(os.path.join(d, "model.safetensors.index.json"), "rb").read()
        files = []
        for f in json.loads(idx)["weight_map"].values():
            if f not in files:
                files.append(f)
        parts = [open(os.path.join(d, "config.json"), "rb").read(), idx] + [st_prefix(os.path.join(d, f)) for f in files]
        put("checkpoint", SEP.join(parts), "ck-%s" % v)
    # small synthetic ones: a single-file checkpoint and a two-shard one
    cfg = open(os.path.join(cks[0][1], "config.json"), "rb").read() if cks else b"{}"
    h1 = {"__metadata__": {"format": "pt"},
          "a.weight": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
          "b.weight": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [12, 16]},
          "b.weight_scale_inv": {"dtype": "F32", "shape": [1, 1], "data_offsets": [16, 20]},
          "c": {"dtype": "U8", "shape": [], "data_offsets": [20, 21]}}
    put("checkpoint", SEP.join([cfg, b"", st_file(h1, 21)]), "ck-single")
    h2 = {"x.weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    ix = {"metadata": {}, "weight_map": {"a.weight": "s1.safetensors", "x.weight": "s2.safetensors",
                                         "b.weight": "s1.safetensors"}}
    put("checkpoint", SEP.join([cfg, json.dumps(ix).encode(), st_file(h1, 21), st_file(h2, 8)]), "ck-two")
    # config variants: the other ways to give the layer schedules, rope theta and eos
    base = json.loads(cfg)
    variants = [
        {"indexer_types": None, "index_topk_pattern": "FSSFSF"},
        {"indexer_types": None, "index_topk_pattern": None, "index_topk_freq": 2, "index_skip_topk_offset": 1},
        {"mlp_layer_types": None, "first_k_dense_replace": 3, "eos_token_id": [1, 2, 3]},
        {"rope_parameters": None, "rope_theta": 10000, "qk_head_dim": None, "eos_token_id": 7},
        {"n_group": 4, "topk_group": 2, "num_experts_per_tok": 4},
        {"n_routed_experts": 16, "n_group": 8, "topk_group": 1, "num_experts_per_tok": 2},
    ]
    for i, v in enumerate(variants):
        c = dict(base)
        for k, val in v.items():
            if val is None:
                c.pop(k, None)
            else:
                c[k] = val
        put("checkpoint", json.dumps(c, indent=1).encode(), "config-variant-%d" % i)
        put("json", json.dumps(c, indent=1).encode(), "config-variant-%d.json" % i)
    return 0


if __name__ == "__main__":
    sys.exit(main())
