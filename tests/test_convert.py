#!/usr/bin/python3
"""Tests of `glm convert` (BF16/FP8 -> Quark MXFP4), run from the repository root:

    /usr/bin/python3 tests/test_convert.py [-k SUBSTRING]

Environment:  GLM       binary under test (default ./glm)
              TEST_OUT  scratch directory (default tests/out/convert-<basename of GLM>; wiped
                        at start, kept afterwards for debugging)

What is checked:
  * bytes: every MXFP4 weight and scale the converter writes equals tests/quark_ref.py (an
    independent NumPy implementation of Quark's rule) applied to the input, on random tensors
    and on crafted edge cases (all-zero and -0 blocks, subnormals, values near the fp32 and
    bf16 maxima, exact ties, the 6 / 7 saturation boundary, the 1.75 scale-rounding edge);
    every tensor not quantized is copied byte for byte.
  * FP8 input (hidden 160 = 128 + 32: partial 128x128 blocks) is dequantized with its block
    scales first: bytes equal quark_ref of ref.py's own dequantization; FP8 weights that stay
    unquantized become BF16 of that dequantization.
  * the output is a valid checkpoint: headers padded to 8, tensors aligned, no holes, the index
    matches the shards, config.json carries a Quark quantization_config whose exclude list is
    what was left unquantized, tokenizer files are copied, no temporary files are left.
  * logits of the converted tiny model (default, --attn, --all-linear; BF16 and FP8 inputs)
    match ref.py run on the converted weights (relative L2 <= 1e-4 per position, same argmax).
  * bad input (missing folders/files, unsupported dtype, NaN/Inf, OUT_DIR == IN_DIR, OUT_DIR a
    file or not empty, not creatable, read-only, disk full, a write failing midway (file size
    limit), interrupted) exits 1 with one
    'glm: error:' line and leaves no partial output. Read-only and disk-full use a private
    tmpfs mount (unshare -m); they are skipped where that is not permitted.

Prints one line per test ("PASS name" / "FAIL name: reason" / "SKIP name: reason"), then
"N passed, N failed"; exits 1 on any failure.
"""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import quark_ref  # noqa: E402
from harness import SANITIZER_MARKS, Fail, Skip, check, parse_args, summary, test  # noqa: E402
import ref  # noqa: E402

GLM = os.environ.get("GLM", "./glm")
OUT = os.environ.get("TEST_OUT", os.path.join(HERE, "out", "convert-" + os.path.basename(GLM)))
PY = "/usr/bin/python3"
IDS = [1, 7, 42, 99, 3, 250, 17, 400, 5, 63, 128, 77, 300, 11, 2, 511]
TOL = 1e-4
EXTRA_FILES = {"tokenizer.json": b'{"model": {"type": "BPE"}}\n',
               "tokenizer_config.json": b'{"eos_token": "<|endoftext|>"}\n',
               "generation_config.json": b'{"top_p": 0.95}\n',
               "chat_template.jinja": b"{{ messages }}\n"}


# --------------------------------------------------------------------------------------
# safetensors, read and written here (independently of make_tiny.py and ref.py)

DT_SIZE = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "BF16": 2, "F16": 2, "U8": 1, "I8": 1,
           "F8_E4M3": 1, "F8_E5M2": 1}


def read_st(path):
    """-> (header dict without __metadata__, header length, raw data bytes)."""
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    h = json.loads(buf[8:8 + n])
    h.pop("__metadata__", None)
    return h, n, buf[8 + n:]


def tensor_bytes(h, data, name):
    b, e = h[name]["data_offsets"]
    return data[b:e]


def write_st(path, tensors):
    """tensors: dict name -> (dtype, shape, raw bytes); wider dtypes first, like the reference."""
    items = sorted(tensors.items(), key=lambda kv: (-DT_SIZE[kv[1][0]], kv[0]))
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, (dt, shape, raw) in items:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj)
        for _, (_, _, raw) in items:
            f.write(raw)


class Folder:
    """All tensors of a checkpoint folder: name -> (dtype, shape, raw bytes), and the shard of each."""

    def __init__(self, d):
        self.dir = d
        self.t, self.where, self.hlen = {}, {}, {}
        for fn in sorted(os.listdir(d)):
            if fn.endswith(".safetensors"):
                h, n, data = read_st(os.path.join(d, fn))
                self.hlen[fn] = (n, h, len(data))
                for name, m in h.items():
                    self.t[name] = (m["dtype"], tuple(m["shape"]), tensor_bytes(h, data, name))
                    self.where[name] = fn
        with open(os.path.join(d, "config.json")) as f:
            self.config = json.load(f)

    def save(self):
        """rewrite the shards (same split) and the index from self.t / self.where."""
        for fn in set(self.where.values()):
            write_st(os.path.join(self.dir, fn), {n: v for n, v in self.t.items() if self.where[n] == fn})
        idx = os.path.join(self.dir, "model.safetensors.index.json")
        if os.path.exists(idx):
            with open(idx, "w") as f:
                json.dump({"metadata": {"total_size": sum(len(v[2]) for v in self.t.values())},
                           "weight_map": dict(sorted(self.where.items()))}, f, indent=2)

    def f32(self, name):
        dt, shape, raw = self.t[name]
        if dt == "BF16":
            return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
        if dt == "F32":
            return np.frombuffer(raw, "<f4").reshape(shape)
        raise ValueError("%s: %s" % (name, dt))


def bf16_bits(x):
    """float32 -> BF16 bits, round to nearest even (NaN not expected)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


# --------------------------------------------------------------------------------------
# running things

def run(cmd, timeout=300, **kw):
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, **kw)
    except subprocess.TimeoutExpired:
        raise Fail("timeout after %ds: %s" % (timeout, " ".join(cmd)))
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def run_glm(args, timeout=300):
    rc, so, se = run([GLM] + args, timeout)
    if rc < 0:
        raise Fail("crashed with signal %d: glm %s; stderr: %s" % (-rc, " ".join(args), se[-400:]))
    if rc > 1:
        raise Fail("exit code %d (crash?): glm %s; stderr: %s" % (rc, " ".join(args), se[-400:]))
    for mk in SANITIZER_MARKS:
        if mk in se:
            raise Fail("sanitizer report (%s): glm %s; stderr: %s" % (mk, " ".join(args), se[-600:]))
    return rc, so, se


def convert(src, dst, *flags):
    rc, so, se = run_glm(["convert", src, dst] + list(flags))
    check(rc == 0, "glm convert %s %s %s: exit %d: %s" % (src, dst, " ".join(flags), rc, se.strip()[-400:]))
    return se


def expect_error(args, want, leave_absent=(), timeout=120):
    """exit 1, stdout empty, exactly one 'glm: error:' line naming one of want; paths absent."""
    rc, so, se = run_glm(args, timeout)
    check(rc == 1, "exit code %d, expected 1 (stderr: %r)" % (rc, se.strip()[-300:]))
    check(so == "", "stdout not empty: %r" % so[:200])
    lines = se.splitlines()
    check(len(lines) == 1, "stderr must be exactly one line, got %d: %r" % (len(lines), se[-400:]))
    check(lines[0].startswith("glm: error:"), "stderr does not start with 'glm: error:': %r" % lines[0])
    check(any(w in lines[0] for w in want), "message does not name any of %r: %r" % (want, lines[0]))
    for p in leave_absent:
        check(not os.path.exists(p), "%s was left behind" % p)
    return lines[0]


def make_tiny(d, variant, seed):
    if os.path.exists(d):
        shutil.rmtree(d)
    rc, so, se = run([PY, os.path.join(HERE, "make_tiny.py"), d, "--variant", variant, "--seed", str(seed)])
    check(rc == 0, "make_tiny.py failed: %s" % se[-400:])
    for fn, data in EXTRA_FILES.items():
        with open(os.path.join(d, fn), "wb") as f:
            f.write(data)
    return d


def fresh(name):
    p = os.path.join(OUT, name)
    if os.path.exists(p):
        shutil.rmtree(p)
    return p


# --------------------------------------------------------------------------------------
# what the converter should have done

EXPERT_PARTS = ("gate_proj", "up_proj", "down_proj")
ATTN = ("self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_a_proj_with_mqa",
        "self_attn.kv_b_proj", "self_attn.o_proj", "self_attn.indexer.wq_b", "self_attn.indexer.wk")


def should_quantize(name, shape, n_layers, mode):
    """the converter's contract, restated: decoder layers only, by module kind, width % 32."""
    if not name.startswith("model.layers.") or not name.endswith(".weight") or len(shape) != 2:
        return False
    layer, rest = name[len("model.layers."):].split(".", 1)
    if int(layer) >= n_layers or shape[1] % 32:
        return False
    rest = rest[:-len(".weight")]
    parts = rest.split(".")
    if rest.startswith("mlp.shared_experts.") and parts[-1] in EXPERT_PARTS:
        return True
    if rest.startswith("mlp.experts.") and len(parts) == 4 and parts[2].isdigit() and parts[3] in EXPERT_PARTS:
        return True
    if mode in ("attn", "all") and rest in ATTN:
        return True
    return mode == "all" and rest in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def input_f32(src, name):
    """an input weight as the converter must see it: BF16/F32 exactly, FP8 via ref.py's dequant."""
    dt, shape, raw = src.t[name]
    if dt == "F8_E4M3":
        _, sshape, sraw = src.t[name + "_scale_inv"]
        codes = np.frombuffer(raw, np.uint8).reshape(shape)
        s = np.frombuffer(sraw, "<f4").reshape(sshape).astype(np.float64)
        return ref.dequant_fp8(codes, s).astype(np.float32)
    return src.f32(name)


def check_output(src_dir, out_dir, mode="default"):
    """every invariant of a converted folder; returns (n quantized, n kept, n copied)."""
    src, dst = Folder(src_dir), Folder(out_dir)
    n_layers = src.config["num_hidden_layers"]
    leftovers = [f for f in os.listdir(out_dir) if f.startswith(".") or f.endswith(".partial")]
    check(not leftovers, "temporary files left: %s" % leftovers)

    # safetensors structure: header multiple of 8, natural alignment, no holes
    for fn, (hlen, h, dlen) in dst.hlen.items():
        check(hlen % 8 == 0, "%s: header length %d not a multiple of 8" % (fn, hlen))
        spans = sorted((m["data_offsets"][0], m["data_offsets"][1], n, m["dtype"]) for n, m in h.items())
        pos = 0
        for b, e, n, dt in spans:
            check(b == pos, "%s: hole or overlap before %s (%d != %d)" % (fn, n, b, pos))
            check((8 + hlen + b) % DT_SIZE[dt] == 0, "%s: %s (%s) not aligned" % (fn, n, dt))
            pos = e
        check(pos == dlen, "%s: data section %d bytes, tensors cover %d" % (fn, dlen, pos))
        check(fn in src.hlen, "%s: output shard without an input shard" % fn)
    # the index
    with open(os.path.join(out_dir, "model.safetensors.index.json")) as f:
        idx = json.load(f)
    check(idx["weight_map"] == dst.where, "index weight_map does not match the shards")
    check(idx["metadata"]["total_size"] == sum(len(v[2]) for v in dst.t.values()), "index total_size wrong")

    n_q = n_kept = n_copy = 0
    excluded = set()
    for name, (dt, shape, raw) in src.t.items():
        if name.endswith("_scale_inv") and src.t.get(name[:-len("_scale_inv")], ("",))[0] == "F8_E4M3":
            check(name not in dst.t, "%s: FP8 scale kept" % name)
            continue
        check(name in dst.t, "%s missing from the output" % name)
        odt, oshape, oraw = dst.t[name]
        if should_quantize(name, shape, n_layers, mode):
            sname = name + "_scale"
            check(odt == "U8" and oshape == (shape[0], shape[1] // 2), "%s: %s %s, expected U8 [%d, %d]"
                  % (name, odt, oshape, shape[0], shape[1] // 2))
            check(sname in dst.t and dst.t[sname][:2] == ("U8", (shape[0], shape[1] // 32)),
                  "%s: bad or missing weight_scale" % name)
            check(dst.where[sname] == dst.where[name], "%s: scale in another shard" % name)
            want_p, want_s = quark_ref.quantize(input_f32(src, name))
            got_p = np.frombuffer(oraw, np.uint8).reshape(want_p.shape)
            got_s = np.frombuffer(dst.t[sname][2], np.uint8).reshape(want_s.shape)
            bad = np.argwhere(got_s != want_s)
            check(len(bad) == 0, "%s: %d scale bytes differ from quark_ref, first at %s: %d vs %d" % (
                name, len(bad), bad[0].tolist() if len(bad) else None,
                got_s[tuple(bad[0])] if len(bad) else 0, want_s[tuple(bad[0])] if len(bad) else 0))
            bad = np.argwhere(got_p != want_p)
            check(len(bad) == 0, "%s: %d packed bytes differ from quark_ref, first at %s: %#x vs %#x" % (
                name, len(bad), bad[0].tolist() if len(bad) else None,
                got_p[tuple(bad[0])] if len(bad) else 0, want_p[tuple(bad[0])] if len(bad) else 0))
            n_q += 1
            continue
        if name.endswith(".weight") and len(shape) == 2:
            excluded.add(name[:-len(".weight")])
        if dt == "F8_E4M3":
            want = bf16_bits(input_f32(src, name)).tobytes()
            check(odt == "BF16" and oshape == shape and oraw == want, "%s: FP8 not converted to BF16 exactly" % name)
            n_kept += 1
        else:
            check((odt, oshape) == (dt, shape) and oraw == raw, "%s: not copied byte for byte" % name)
            n_copy += 1
    extra = set(dst.t) - set(src.t) - {n + "_scale" for n in src.t}
    check(not extra, "unexpected output tensors: %s" % sorted(extra)[:5])
    check(not any(v[0].startswith("F8") for v in dst.t.values()), "F8 tensors in the output")

    # config.json: unchanged except for quantization_config
    qc = dst.config.pop("quantization_config", None)
    want_cfg = dict(src.config)
    want_cfg.pop("quantization_config", None)
    check(dst.config == want_cfg, "config.json changed beyond quantization_config")
    check(qc is not None and qc.get("quant_method") == "quark", "no quark quantization_config")
    w = qc["global_quant_config"]["weight"]
    for k, v in {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "ch_axis": -1,
                 "scale_format": "e8m0", "scale_calculation_mode": "even", "round_method": "half_even",
                 "is_dynamic": False}.items():
        check(w.get(k) == v, "quantization_config weight.%s = %r, expected %r" % (k, w.get(k), v))
    check(qc["global_quant_config"]["input_tensors"] is None, "input_tensors should be null (weight-only)")
    check(qc["export"]["weight_format"] == "real_quantized", "export.weight_format")
    check(set(qc["exclude"]) == excluded, "exclude list differs: extra %s, missing %s" % (
        sorted(set(qc["exclude"]) - excluded)[:4], sorted(excluded - set(qc["exclude"]))[:4]))
    # the other files
    for fn in os.listdir(src_dir):
        if fn.endswith(".safetensors") or fn in ("config.json", "model.safetensors.index.json"):
            continue
        with open(os.path.join(src_dir, fn), "rb") as a, open(os.path.join(out_dir, fn), "rb") as b:
            check(a.read() == b.read(), "%s not copied" % fn)
    return n_q, n_kept, n_copy


def compare_logits(d, tag):
    out_g, out_r = os.path.join(OUT, "logits-%s-glm.f32" % tag), os.path.join(OUT, "logits-%s-ref.f32" % tag)
    ids = ",".join(map(str, IDS))
    rc, so, se = run_glm(["logits", "-m", d, "--ids", ids, "-o", out_g])
    check(rc == 0, "glm logits: %s" % se[-300:])
    rc, so, se = run([PY, os.path.join(HERE, "ref.py"), "logits", d, "--ids", ids, "-o", out_r])
    check(rc == 0, "ref.py logits: %s" % se[-300:])
    g = np.fromfile(out_g, np.float32).reshape(len(IDS), -1)
    r = np.fromfile(out_r, np.float32).reshape(len(IDS), -1)
    rel = np.linalg.norm(g - r, axis=1) / np.linalg.norm(r, axis=1)
    check(np.isfinite(g).all(), "non-finite logits")
    check(rel.max() <= TOL, "relative L2 %.3g > %g at position %d" % (rel.max(), TOL, rel.argmax()))
    check((g.argmax(1) == r.argmax(1)).all(), "argmax differs at %s" % np.nonzero(g.argmax(1) != r.argmax(1))[0])
    return rel.max()


# --------------------------------------------------------------------------------------
# crafted edge cases

def edge_rows(cols, rng):
    """float32 [rows, cols] whose 32-blocks cover the corner cases of the rule."""
    f32max = np.finfo(np.float32).max
    tiny = np.finfo(np.float32).tiny            # 2^-126, smallest normal
    sub = np.float32(1e-45)                     # smallest subnormal
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    blocks = []

    def blk(vals):
        b = np.zeros(32, np.float32)
        b[:len(vals)] = vals
        return b

    blocks.append(np.zeros(32, np.float32))                                     # all zero
    blocks.append(np.full(32, -0.0, np.float32))                                # all -0
    blocks.append(blk([sub, -sub, 3 * sub, sub * 1000]))                        # subnormals only
    blocks.append(blk([np.float32(1e-39), -np.float32(3e-39), tiny * 0.9]))     # subnormal amax, rounds to 2^-126?
    blocks.append(blk([tiny, -tiny / 2, tiny / 4, sub]))                        # smallest normal
    blocks.append(blk([np.float32(0x7FFFFF * 2.0 ** -149), 1e-40]))             # largest subnormal
    blocks.append(blk([f32max, -f32max / 3, 1.0, -1e30]))                       # fp32 max
    blocks.append(blk([np.float32(1.75 * 2.0 ** 127), 2.0 ** 126]))             # rounds to inf exactly
    blocks.append(blk([np.nextafter(np.float32(1.75 * 2.0 ** 127), np.float32(0)), 2.0 ** 125]))
    blocks.append(blk([np.float32(2.0 ** 127), -np.float32(1.5 * 2.0 ** 127)]))
    blocks.append(blk([np.float32(3.3895314e38), 1.0]))                         # bf16 max
    for k in (-130, -126, -20, -1, 0, 3, 60, 125):                              # exact ties at 2^k
        s = 2.0 ** k
        blocks.append(blk(np.concatenate([[4 * s], ties * s, -ties * s, [0.5 * s, 6 * s]]).astype(np.float32)))
    for a in (6.0, 6.5, 7.0, np.nextafter(np.float32(7), np.float32(0)), 5.0, 5.5, 1.75,
              np.nextafter(np.float32(1.75), np.float32(0)), 3.5, 8.0, 12.0, 14.0):
        blocks.append(blk([a, -a, 6.0, 5.0, 5.5, 6.5, 3.5, 0.25, 0.75, -7.0 if a >= 7 else -a / 2]))
    for k in (-127, -100, 0, 100):                                              # ties at the clamp ends
        s = 2.0 ** k
        blocks.append(blk((np.array([4.0, 1.25, 0.25, 2.5, 5.0, -0.75]) * s).astype(np.float32)))
    for _ in range(40):                                                         # random magnitudes
        e = rng.integers(-149, 128)
        v = rng.standard_normal(32) * 2.0 ** float(e)
        blocks.append(np.clip(v, -f32max, f32max).astype(np.float32))
    for _ in range(20):                                                         # values on the E2M1 grid
        e = rng.integers(-20, 20)
        v = rng.choice(quark_ref.E2M1, 32) * rng.choice([-1, 1], 32) * 2.0 ** float(e)
        blocks.append(v.astype(np.float32))
    flat = np.concatenate(blocks)
    rng.shuffle(blocks)  # a second arrangement, so each kind also meets other neighbours in a row
    flat = np.concatenate([flat, np.concatenate(blocks)])
    rows = -(-flat.size // cols)
    out = np.zeros(rows * cols, np.float32)
    out[:flat.size] = flat
    return out.reshape(rows, cols)


def build_edge_checkpoint(d):
    """the tiny BF16 model with some expert weights replaced by edge cases (F32 and BF16), random
    weights of many magnitudes, and a narrow expert Linear that must stay unquantized."""
    make_tiny(d, "bf16", 21)
    ck = Folder(d)
    rng = np.random.default_rng(5)
    names = sorted(n for n in ck.t if ".mlp.experts." in n and n.endswith(".weight")
                   and int(n.split(".")[2]) < ck.config["num_hidden_layers"])
    edge = edge_rows(160, rng)
    # F32 edge cases in place of the first expert's gate_proj [64, 160] (more rows allowed: the
    # converter reads shapes from the header, nothing checks them against the config)
    ck.t[names[0]] = ("F32", edge.shape, edge.astype("<f4").tobytes())
    # BF16 versions of the same edge cases (bf16 has its own subnormals and maximum)
    bf16_max = np.float32(3.3895314e38)
    eb = bf16_bits(np.clip(edge, -bf16_max, bf16_max))
    ck.t[names[1]] = ("BF16", edge.shape, eb.tobytes())
    # random rows of wildly different magnitudes, BF16 and F32
    for i, n in enumerate(names[2:8]):
        dt, shape, _ = ck.t[n]
        w = rng.standard_normal(shape) * 2.0 ** rng.uniform(-40, 40, size=(shape[0], 1))
        if i % 2:
            ck.t[n] = ("F32", shape, w.astype("<f4").tobytes())
        else:
            ck.t[n] = ("BF16", shape, bf16_bits(w.astype(np.float32)).tobytes())
    # an expert Linear whose input width (40) is not a multiple of 32: must be kept as it is
    narrow = "model.layers.3.mlp.experts.100.up_proj.weight"
    ck.t[narrow] = ("BF16", (4, 40), bf16_bits(rng.standard_normal((4, 40)).astype(np.float32)).tobytes())
    ck.where[narrow] = ck.where[names[0]]
    ck.save()
    return d


# --------------------------------------------------------------------------------------
# tests

CK = {}


def t_edge_bytes():
    d = build_edge_checkpoint(fresh("edge"))
    o = fresh("edge-mx")
    se = convert(d, o)
    n_q, n_kept, n_copy = check_output(d, o)
    check(n_q > 0, "nothing quantized")
    check("1 Linears kept" in se, "summary should count the narrow Linear: %s" % se.strip()[-200:])
    with open(os.path.join(o, "config.json")) as f:
        check("model.layers.3.mlp.experts.100.up_proj" in json.load(f)["quantization_config"]["exclude"],
              "narrow Linear not in the exclude list")
    return "%d weights bit-identical to quark_ref, %d copied" % (n_q, n_copy)


def t_bf16(mode):
    src = CK.setdefault("bf16", make_tiny(fresh("tiny-bf16"), "bf16", 31))
    o = fresh("tiny-bf16-mx-" + mode)
    convert(src, o, *{"default": [], "attn": ["--attn"], "all": ["--all-linear"]}[mode])
    n_q, _, _ = check_output(src, o, mode)
    rel = compare_logits(o, "bf16-" + mode)
    return "%d weights MXFP4, logits rel L2 %.2g" % (n_q, rel)


def t_fp8(mode):
    src = CK.setdefault("fp8", make_tiny(fresh("tiny-fp8"), "fp8", 32))
    o = fresh("tiny-fp8-mx-" + mode)
    convert(src, o, *{"default": [], "attn": ["--attn"], "all": ["--all-linear"]}[mode])
    n_q, n_kept, _ = check_output(src, o, mode)
    rel = compare_logits(o, "fp8-" + mode)
    return "%d weights MXFP4, %d FP8 -> BF16, logits rel L2 %.2g" % (n_q, n_kept, rel)


def t_single_file():
    """a folder with one model.safetensors (no index) converts to one model.safetensors."""
    src = CK.setdefault("bf16", make_tiny(fresh("tiny-bf16"), "bf16", 31))
    d = fresh("single")
    os.makedirs(d)
    ck = Folder(src)
    write_st(os.path.join(d, "model.safetensors"), ck.t)
    shutil.copy(os.path.join(src, "config.json"), d)
    o = fresh("single-mx")
    convert(d, o)
    check(sorted(os.listdir(o)) == ["config.json", "model.safetensors"], "files: %s" % sorted(os.listdir(o)))
    compare_logits(o, "single")


def bad_value_checkpoint(tag, value, dtype):
    d = fresh("bad-" + tag)
    shutil.copytree(CK.setdefault("bf16", make_tiny(fresh("tiny-bf16"), "bf16", 31)), d)
    ck = Folder(d)
    name = "model.layers.4.mlp.experts.5.down_proj.weight"
    w = ck.f32(name).copy()
    w[17, 33] = value
    ck.t[name] = (dtype, w.shape, (w.astype("<f4").tobytes() if dtype == "F32" else bf16_bits(w).tobytes()))
    ck.save()
    return d, name


def t_nonfinite(tag, value, dtype):
    d, name = bad_value_checkpoint(tag, value, dtype)
    o = fresh("bad-%s-mx" % tag)
    expect_error(["convert", d, o], [name], leave_absent=[o])


def t_fp8_nan():
    d = fresh("bad-fp8nan")
    shutil.copytree(CK.setdefault("fp8", make_tiny(fresh("tiny-fp8"), "fp8", 32)), d)
    ck = Folder(d)
    for name in ("model.layers.3.mlp.experts.2.up_proj.weight", "model.layers.1.self_attn.o_proj.weight"):
        dt, shape, raw = ck.t[name]
        b = bytearray(raw)
        b[len(b) // 2] = 0x7F  # E4M3FN NaN
        ck.t[name] = (dt, shape, bytes(b))
        ck.save()
        o = fresh("bad-fp8nan-mx")
        expect_error(["convert", d, o], [name], leave_absent=[o])
        ck.t[name] = (dt, shape, raw)


def t_unsupported_dtype():
    d = fresh("bad-dtype")
    shutil.copytree(CK.setdefault("bf16", make_tiny(fresh("tiny-bf16"), "bf16", 31)), d)
    ck = Folder(d)
    name = "model.layers.2.self_attn.q_b_proj.weight"
    dt, shape, raw = ck.t[name]
    ck.t[name] = ("F8_E5M2", shape, raw[:len(raw) // 2])
    ck.save()
    o = fresh("bad-dtype-mx")
    expect_error(["convert", d, o], [name], leave_absent=[o])


def t_already_quantized():
    d = make_tiny(fresh("tiny-mxfp4"), "mxfp4", 33)
    o = fresh("mxfp4-mx")
    expect_error(["convert", d, o], ["quark"], leave_absent=[o])


def t_missing(kind):
    src = CK.setdefault("bf16", make_tiny(fresh("tiny-bf16"), "bf16", 31))
    o = fresh("missing-%s-mx" % kind)
    if kind == "in_dir":
        expect_error(["convert", os.path.join(OUT, "does-not-exist"), o], ["does-not-exist"], [o])
        return
    d = fresh("missing-" + kind)
    shutil.copytree(src, d)
    if kind == "shard":
        os.remove(os.path.join(d, "model-00002-of-00002.safetensors"))
        want = ["model-00002-of-00002.safetensors"]
    elif kind == "config":
        os.remove(os.path.join(d, "config.json"))
        want = ["config.json"]
    else:  # no safetensors at all
        for fn in os.listdir(d):
            if "safetensors" in fn:
                os.remove(os.path.join(d, fn))
        want = ["model.safetensors"]
    expect_error(["convert", d, o], want, [o])


def snapshot(d):
    return sorted((fn, os.path.getsize(os.path.join(d, fn)), os.path.getmtime(os.path.join(d, fn)))
                  for fn in os.listdir(d))


def t_out_is_in():
    src = CK.setdefault("bf16", make_tiny(fresh("tiny-bf16"), "bf16", 31))
    before = snapshot(src)
    expect_error(["convert", src, src + "/."], ["input folder"])
    check(snapshot(src) == before, "input folder changed")


def t_out_is_file():
    src = CK.setdefault("bf16", make_tiny(fresh("tiny-bf16"), "bf16", 31))
    o = os.path.join(OUT, "out-is-a-file")
    with open(o, "w") as f:
        f.write("keep me\n")
    expect_error(["convert", src, o], ["not a folder"])
    with open(o) as f:
        check(f.read() == "keep me\n", "the file was changed")


def t_out_not_empty():
    src = CK.setdefault("bf16", make_tiny(fresh("tiny-bf16"), "bf16", 31))
    o = fresh("out-not-empty")
    os.makedirs(o)
    with open(os.path.join(o, "x"), "w") as f:
        f.write("x")
    expect_error(["convert", src, o], ["not empty"])
    check(os.listdir(o) == ["x"], "output folder changed: %s" % os.listdir(o))


def t_out_not_creatable():
    """a folder the kernel refuses to create even for root (sysfs); or no parent folder."""
    src = CK.setdefault("bf16", make_tiny(fresh("tiny-bf16"), "bf16", 31))
    expect_error(["convert", src, os.path.join(OUT, "no-such-parent", "out")], ["cannot create"],
                 [os.path.join(OUT, "no-such-parent")])
    if os.path.isdir("/sys/kernel"):
        expect_error(["convert", src, "/sys/kernel/glm-convert-test"], ["cannot create"],
                     ["/sys/kernel/glm-convert-test"])


def in_private_tmpfs(script, size="1m"):
    """runs script (sh) with $MNT a fresh tmpfs of the given size, in a private mount namespace."""
    mnt = fresh("mnt")
    os.makedirs(mnt)
    if not shutil.which("unshare"):
        raise Skip("no unshare")
    probe = run(["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=%s tmpfs "$0"' % size, mnt])
    if probe[0] != 0:
        raise Skip("cannot mount a private tmpfs here: %s" % probe[2].strip()[-120:])
    full = 'mount -t tmpfs -o size=%s tmpfs "$MNT" || exit 99\n%s' % (size, script)
    env = dict(os.environ, MNT=mnt, GLM=os.path.abspath(GLM))
    return run(["unshare", "-m", "sh", "-c", full], env=env)


def t_read_only():
    src = os.path.abspath(CK.setdefault("bf16", make_tiny(fresh("tiny-bf16"), "bf16", 31)))
    # OUT_DIR to be created on a read-only mount, and an existing empty OUT_DIR on it
    rc, so, se = in_private_tmpfs(
        'mkdir "$MNT/empty" && mount -o remount,ro "$MNT" || exit 98\n'
        '"$GLM" convert "%s" "$MNT/new"; echo "rc=$?"\n'
        '"$GLM" convert "%s" "$MNT/empty"; echo "rc=$?"\n'
        'ls -A "$MNT" | tr "\\n" " "; echo; ls -A "$MNT/empty" | wc -l\n' % (src, src), size="16m")
    check(rc == 0, "script failed (%d): %s" % (rc, se[-300:]))
    lines = so.splitlines()
    check(lines[:2] == ["rc=1", "rc=1"], "exit codes %s (stderr %r)" % (lines[:2], se[-300:]))
    errs = [ln for ln in se.splitlines() if ln]
    check(len(errs) == 2 and all(e.startswith("glm: error:") and "Read-only" in e for e in errs),
          "expected two read-only errors: %r" % se[-400:])
    check(lines[2].split() == ["empty"] and lines[3].strip() == "0", "left behind: %s / %s" % (lines[2], lines[3]))


def t_disk_full():
    src = os.path.abspath(CK.setdefault("bf16", make_tiny(fresh("tiny-bf16"), "bf16", 31)))
    # 1 MiB holds config.json and the tokenizer files but not the first 1.8 MB shard
    rc, so, se = in_private_tmpfs(
        '"$GLM" convert "%s" "$MNT/out"; echo "rc=$?"\n'
        'ls -A "$MNT"; echo "."\n' % src, size="1m")
    check(rc == 0, "script failed (%d): %s" % (rc, se[-300:]))
    lines = so.splitlines()
    check(lines[0] == "rc=1", "exit code: %s (stderr %r)" % (lines[0], se[-300:]))
    check(lines[1:] == ["."], "left behind on the full disk: %s" % lines[1:-1])
    errs = se.splitlines()
    check(len(errs) == 1 and errs[0].startswith("glm: error:") and "space" in errs[0],
          "expected one disk-full error: %r" % se[-400:])


def t_write_fails_midway():
    """a write error after some files are complete (here: the file size limit, with SIGXFSZ
    ignored, so writes fail with EFBIG): everything written so far is removed."""
    src = os.path.abspath(CK.setdefault("bf16", make_tiny(fresh("tiny-bf16"), "bf16", 31)))
    o = fresh("efbig-mx")
    rc, so, se = run(["sh", "-c", 'trap "" XFSZ; ulimit -f 1000 && exec "$0" convert "$1" "$2"', GLM, src, o])
    check(rc == 1, "exit code %d, expected 1 (stderr %r)" % (rc, se[-300:]))
    errs = se.splitlines()
    check(len(errs) == 1 and errs[0].startswith("glm: error:") and "too large" in errs[0],
          "expected one 'File too large' error: %r" % se[-300:])
    check(not os.path.exists(o), "output left behind: %s" % (os.listdir(o) if os.path.isdir(o) else o))


def t_interrupted():
    """SIGINT in the middle of a conversion: no output left at all."""
    d = fresh("big")
    rc, so, se = run([PY, os.path.join(HERE, "make_big_bf16.py"), d, "--gb", "0.15"])
    check(rc == 0, "make_big_bf16.py: %s" % se[-300:])
    o = fresh("big-mx")
    p = subprocess.Popen([GLM, "convert", d, o, "-t", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    t0 = time.time()
    while time.time() - t0 < 20 and not any(f.endswith(".safetensors.partial") for f in
                                           (os.listdir(o) if os.path.isdir(o) else [])):
        time.sleep(0.005)
    time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    so, se = p.communicate(timeout=60)
    if p.returncode == 0:
        raise Skip("conversion finished before the signal arrived")
    check(p.returncode == -signal.SIGINT, "exit status %d, expected death by SIGINT" % p.returncode)
    check(not os.path.exists(o), "output left behind: %s" % (os.listdir(o) if os.path.isdir(o) else o))
    shutil.rmtree(d)


def t_quark_ref_selftest():
    quark_ref.selftest()


def main():
    if parse_args("test_convert.py"):
        return 2
    if os.path.exists(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    if not (os.path.isfile(GLM) and os.access(GLM, os.X_OK)):
        print("FAIL setup: binary %s not found (set GLM=...)" % GLM)
        print("0 passed, 1 failed")
        return 1
    t0 = time.time()
    test("quark_ref_selftest", t_quark_ref_selftest)
    test("edge_cases_bit_identical", t_edge_bytes)
    for mode in ("default", "attn", "all"):
        test("bf16_%s_bytes_and_logits" % mode, t_bf16, mode)
    for mode in ("default", "attn", "all"):
        test("fp8_%s_bytes_and_logits" % mode, t_fp8, mode)
    test("single_file_checkpoint", t_single_file)
    test("nan_bf16_names_tensor", t_nonfinite, "nan", np.float32("nan"), "BF16")
    test("inf_f32_names_tensor", t_nonfinite, "inf", np.float32("-inf"), "F32")
    test("fp8_nan_names_tensor", t_fp8_nan)
    test("unsupported_dtype", t_unsupported_dtype)
    test("already_quantized_input", t_already_quantized)
    for kind in ("in_dir", "shard", "config", "safetensors"):
        test("missing_%s" % kind, t_missing, kind)
    test("out_dir_is_in_dir", t_out_is_in)
    test("out_dir_is_a_file", t_out_is_file)
    test("out_dir_not_empty", t_out_not_empty)
    test("out_dir_not_creatable", t_out_not_creatable)
    test("out_dir_read_only", t_read_only)
    test("disk_full", t_disk_full)
    test("write_fails_midway", t_write_fails_midway)
    test("interrupted_leaves_nothing", t_interrupted)
    return summary("test_convert", t0)


if __name__ == "__main__":
    sys.exit(main())
