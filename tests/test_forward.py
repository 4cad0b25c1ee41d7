#!/usr/bin/python3
"""glm.c forward-pass tests against the independent NumPy reference (tests/ref.py).

Run from the repository root:   /usr/bin/python3 tests/test_forward.py [-k SUBSTRING]
Environment:  GLM       binary under test (default ./glm)
              TEST_OUT  scratch directory (default tests/out/forward-<basename of GLM>; wiped
                        at start, kept afterwards for debugging)

Prints one line per test ("PASS name" / "FAIL name: reason"), then "N passed, N failed";
exits 1 on any failure.
"""
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
GLM_ENV = dict(os.environ)  # glm runs with the caller's environment (OpenMP threads etc.)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # tiny matrices; before numpy is imported
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import make_tiny  # noqa: E402
from harness import SANITIZER_MARKS, Fail, check, parse_args, summary, test  # noqa: E402
import ref  # noqa: E402

GLM = os.environ.get("GLM", "./glm")
OUT = os.environ.get("TEST_OUT", os.path.join(HERE, "out", "forward-" + os.path.basename(GLM)))
PY = sys.executable or "/usr/bin/python3"

SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"

# the tiny checkpoints; every variant has 6 decoder layers + the MTP layer 6
VARIANTS = {
    # layers 0,1 dense; indexer F F S S F S (index_topk_freq 3, offset 2); 8 experts top-2
    "bf16": ["--variant", "bf16", "--seed", "11"],
    "fp8": ["--variant", "fp8", "--seed", "12"],
    "mxfp4": ["--variant", "mxfp4", "--seed", "13"],
    "mixed": ["--variant", "mixed", "--seed", "14"],
    # 16 experts in 4 groups, keep 2 groups, top-3; layer 0 dense; indexer F S F S F S from the
    # formula (freq 2, offset 1) because indexer_types is omitted from config.json
    "ngroup": ["--variant", "bf16", "--seed", "15", "--n-group", "4", "--topk-group", "2",
               "--dense-layers", "1", "--topk-freq", "2", "--skip-offset", "1",
               "--no-indexer-types"],
    # index_topk 64 > the sequence: every key is selected, so the later positions attend to
    # 32 consecutive cached rows, which the attention GEMM reads in place (no copy)
    "topk64": ["--variant", "mxfp4", "--seed", "16", "--index-topk", "64"],
}
MTP_VARIANTS = ("bf16", "fp8", "mxfp4", "mixed")  # glm logits --mtp against ref.py's MTP layer
SEQ_LEN = 48        # logits test sequence (index_topk is 8, so most positions are sparse)
PROMPT_LEN = 8      # greedy prompt
GEN = 32            # greedy continuation
TOL_REF = 1e-4      # glm vs reference, relative L2 per position
TOL_DECODE = 1e-5   # prefill vs --decode
GAP_TOL = 2e-5      # reject inputs whose discrete decisions are this close to a tie
ARGMAX_GAP = 1e-3   # reject inputs whose top-1/top-2 logit gap is smaller


def rel_rows(a, b):
    return np.linalg.norm(a - b, axis=1) / np.maximum(np.linalg.norm(b, axis=1), 1e-30)


# --------------------------------------------------------------------------------------
# running the binary

def run_glm(args, timeout=300, env=None):
    try:
        p = subprocess.run([GLM] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=timeout, env=dict(GLM_ENV, **(env or {})))
    except subprocess.TimeoutExpired:
        raise Fail("timeout after %ds: glm %s" % (timeout, " ".join(args)))
    out = p.stdout.decode("utf-8", "replace")
    err = p.stderr.decode("utf-8", "replace")
    if p.returncode < 0:
        raise Fail("crashed with signal %d: glm %s; stderr: %s" % (-p.returncode, " ".join(args), err[-400:]))
    if p.returncode > 1:
        raise Fail("exit code %d (crash?): glm %s; stderr: %s" % (p.returncode, " ".join(args), err[-400:]))
    for mk in SANITIZER_MARKS:
        if mk in err:
            raise Fail("sanitizer report (%s): glm %s; stderr: %s" % (mk, " ".join(args), err[-600:]))
    return p.returncode, out, err


def need_glm():
    check(os.path.isfile(GLM) and os.access(GLM, os.X_OK), "binary %s not found (set GLM=...)" % GLM)


def glm_logits(d, ids, extra=(), tag="x", env=None):
    need_glm()
    out = os.path.join(OUT, "logits-%s.f32" % tag)
    if os.path.exists(out):
        os.remove(out)
    args = ["logits", "-m", d, "--ids", ",".join(str(i) for i in ids), "-o", out] + list(extra)
    rc, so, se = run_glm(args, env=env)
    check(rc == 0, "glm %s: exit %d: %s" % (" ".join(args), rc, se.strip()[-300:]))
    check(os.path.exists(out), "glm logits wrote no %s" % out)
    V = CK[d_to_variant(d)]["cfg"]["vocab_size"]
    rows = len(ids) - 1 if "--mtp" in extra else len(ids)  # --mtp: row i predicts ids[i+2]
    sz = os.path.getsize(out)
    check(sz == 4 * rows * V, "logits file has %d bytes, expected %d x %d x 4 = %d"
          % (sz, rows, V, 4 * rows * V))
    a = np.fromfile(out, dtype="<f4").reshape(rows, V).astype(np.float64)
    check(np.isfinite(a).all(), "non-finite logits")
    return a


# --------------------------------------------------------------------------------------
# fixtures

CK = {}  # variant -> dict(dir, cfg, model, ids, ref_logits, stats, prompt, ref_greedy)


def d_to_variant(d):
    for v, c in CK.items():
        if c["dir"] == d:
            return v
    raise KeyError(d)


def pick_ids(m, rng, n, tries=30):
    """random ids whose reference run has no near-tie in any discrete decision."""
    for _ in range(tries):
        ids = [int(i) for i in rng.integers(0, m.V, n)]
        st = ref.Stats()
        lg = ref.forward(m, ids, stats=st)
        srt = np.sort(lg, axis=1)
        if st.ok(GAP_TOL) and (srt[:, -1] - srt[:, -2]).min() > ARGMAX_GAP:
            return ids, lg, st
    raise RuntimeError("could not find a well-separated input in %d tries" % tries)


def pick_greedy(m, rng, tries=10):
    for _ in range(tries):
        prompt = [int(i) for i in rng.integers(0, m.V, PROMPT_LEN)]
        st = ref.Stats()
        margins = []
        gen = ref.greedy(m, prompt, GEN, stats=st, margins=margins)
        # also insist on a varied continuation (random tiny models can fall into a loop of one
        # token, which would make the comparison weak)
        if st.ok(GAP_TOL) and min(margins) > ARGMAX_GAP and len(set(gen)) >= GEN // 2:
            return prompt, gen
    raise RuntimeError("could not find a well-separated greedy prompt in %d tries" % tries)


def pick_mtp_ids(m, c, k, tries=30):
    """ids whose main AND MTP-layer decisions are far from ties, and whose MTP logits have a
    clear argmax: the main test ids if they qualify, else fresh draws (own generator, so the
    other tests' inputs do not move)."""
    rng = np.random.default_rng(3000 + k)
    for t in range(tries):
        ids = c["ids"] if t == 0 else [int(i) for i in rng.integers(0, m.V, SEQ_LEN)]
        st = ref.Stats()
        lg = ref.mtp_forward(m, ids, stats=st)
        srt = np.sort(lg, axis=1)
        if st.ok(GAP_TOL) and (srt[:, -1] - srt[:, -2]).min() > ARGMAX_GAP:
            return ids, lg
    raise RuntimeError("could not find a well-separated MTP input in %d tries" % tries)


def mtp_case(v):
    """(ids, reference MTP logits [len(ids)-1][V]) of variant v, computed once on first use."""
    c = CK[v]
    if "mtp_ids" not in c:
        check(c["model"].mtp is not None, "ref.py found no MTP layer in the %s checkpoint" % v)
        c["mtp_ids"], c["mtp_ref"] = pick_mtp_ids(c["model"], c, list(VARIANTS).index(v))
    return c["mtp_ids"], c["mtp_ref"]


def setup():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    for k, (v, argv) in enumerate(VARIANTS.items()):
        d = os.path.join(OUT, v)
        cfg = make_tiny.make(d, argv)
        m = ref.Model(d)
        rng = np.random.default_rng(1000 + k)
        ids, lg, st = pick_ids(m, rng, SEQ_LEN)
        CK[v] = dict(dir=d, cfg=cfg, model=m, ids=ids, ref_logits=lg, stats=st, rng=rng)


# --------------------------------------------------------------------------------------
# reference self-checks (no binary needed)

def t_ref_decoders():
    T = ref.FP8_E4M3
    for b, v in [(0x00, 0.0), (0x38, 1.0), (0xB8, -1.0), (0x7E, 448.0), (0xFE, -448.0),
                 (0x01, 2.0 ** -9), (0x07, 7 * 2.0 ** -9), (0x08, 2.0 ** -6), (0x40, 2.0),
                 (0x3C, 1.5), (0x30, 0.5)]:
        check(T[b] == v, "E4M3 0x%02x -> %r, expected %r" % (b, T[b], v))
    check(np.isnan(T[0x7F]) and np.isnan(T[0xFF]), "E4M3 NaN codes")
    check(T[0x80] == 0.0 and np.signbit(T[0x80]), "E4M3 0x80 must be -0")
    # MXFP4: codes [1,2,3,4] pack to bytes [0x21, 0x43] (low nibble = lower element)
    w = ref.dequant_mxfp4(np.array([[0x21, 0x43] + [0x00] * 14], np.uint8), np.array([[127]], np.uint8))
    check(list(w[0, :4]) == [0.5, 1.0, 1.5, 2.0], "nibble order / E2M1 values: %r" % w[0, :4])
    w = ref.dequant_mxfp4(np.array([[0xF9] + [0x8F] * 15], np.uint8), np.array([[129]], np.uint8))
    check(w[0, 0] == -2.0 and w[0, 1] == -24.0 and w[0, 2] == -24.0 and w[0, 3] == 0.0,
          "E2M1 signs / E8M0 scale 129: %r" % w[0, :4])
    check(ref.e8m0_to_f64(np.uint8(0)) == 2.0 ** -127 and ref.e8m0_to_f64(np.uint8(127)) == 1.0
          and np.isnan(ref.e8m0_to_f64(np.uint8(255))), "E8M0")
    check(ref.bf16_to_f64(np.uint16(0x3F80)) == 1.0 and ref.bf16_to_f64(np.uint16(0xC000)) == -2.0
          and ref.bf16_to_f64(np.uint16(0x3E20)) == 0.15625, "BF16")
    # FP8 block scales with partial edge blocks: [130, 136] -> scale [2, 2]
    q = np.full((130, 136), 0x38, np.uint8)
    s = np.array([[1.0, 2.0], [3.0, 4.0]])
    W = ref.dequant_fp8(q, s)
    check(W[0, 0] == 1 and W[127, 127] == 1 and W[0, 128] == 2 and W[128, 0] == 3
          and W[129, 135] == 4 and W[127, 135] == 2, "FP8 block scale indexing")


def t_ref_quant_roundtrip():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((70, 96)) * 0.1
    p, sc = make_tiny.quant_mxfp4(w, rng)
    d = ref.dequant_mxfp4(p, sc)
    step = np.repeat(2.0 ** (sc.astype(np.float64) - 127), 32, axis=1)  # 1 unit of the grid
    check(np.all(np.abs(d - w) <= step * 1.0 + 1e-12), "MXFP4 round trip error too large")
    check(np.corrcoef(d.ravel(), w.ravel())[0, 1] > 0.97, "MXFP4 round trip uncorrelated")
    w = rng.standard_normal((200, 150)) * 0.05
    q, s = make_tiny.quant_fp8(w, rng)
    d = ref.dequant_fp8(q, s.astype(np.float64))
    check(np.abs(d - w).max() <= 0.07 * np.abs(w).max(), "FP8 round trip error too large")
    u = make_tiny.f32_to_bf16_bits(np.array([1.0, -2.0, 0.15625, 1.0 + 2 ** -9]))
    check(list(u) == [0x3F80, 0xC000, 0x3E20, 0x3F80], "BF16 encode %r" % list(u))


def t_ref_safetensors_roundtrip():
    p = os.path.join(OUT, "rt.safetensors")
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(5, dtype=np.uint8)
    make_tiny.write_safetensors(p, [("b", "U8", (5,), b.tobytes()), ("a", "F32", (2, 3), a.tobytes()),
                                    ("e", "F32", (0,), b"")], {"format": "pt"})
    raw = open(p, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    check(n % 8 == 0 and raw[8:9] == b"{", "header length %d not padded to 8 / not JSON" % n)
    f = ref.SafetensorsFile(p)
    check(f.raw("a")[1].tolist() == a.tolist() and f.raw("b")[1].tolist() == b.tolist(), "values")
    check(f.meta == {"format": "pt"}, "metadata")
    check(f.header["a"]["data_offsets"] == [0, 24] and f.header["b"]["data_offsets"] == [24, 29],
          "offsets %r" % f.header)


def t_ref_checkpoint_layout(v):
    c = CK[v]
    d, cfg = c["dir"], c["cfg"]
    L = cfg["num_hidden_layers"]
    idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    files = sorted(set(idx["weight_map"].values()))
    check(files == [SHARD1, SHARD2], "shards %r" % files)
    total = 0
    hdr = {}
    for fn in files:
        f = ref.SafetensorsFile(os.path.join(d, fn))
        for name, h in f.header.items():
            check(idx["weight_map"].get(name) == fn, "%s not mapped to %s" % (name, fn))
            total += h["data_offsets"][1] - h["data_offsets"][0]
            hdr[name] = h
        ends = sorted(h["data_offsets"] for h in f.header.values())
        check(ends[0][0] == 0 and all(x[1] == y[0] for x, y in zip(ends, ends[1:]))
              and ends[-1][1] == len(f.buf) - f.data_start, "%s: tensors not contiguous" % fn)
    check(total == idx["metadata"]["total_size"], "total_size")
    check(len(hdr) == len(idx["weight_map"]), "index and shards disagree")
    freq, off = cfg["index_topk_freq"], cfg["index_skip_topk_offset"]
    types = make_tiny.indexer_types_from_formula(L, freq, off)
    if "indexer_types" in cfg:
        check(cfg["indexer_types"] == types, "indexer_types inconsistent with the formula")
    check("full" in types and "shared" in types, "need both full and shared layers")
    check(cfg["head_dim"] != cfg["qk_head_dim"], "head_dim should be the wrong legacy value")
    check(cfg["v_head_dim"] != cfg["qk_nope_head_dim"], "v_head_dim must differ from qk_nope")
    for i in range(L + 1):
        has = ("model.layers.%d.self_attn.indexer.wk.weight" % i) in hdr
        want = i == L or types[i] == "full"
        check(has == want, "layer %d indexer tensors present=%s, expected %s" % (i, has, want))
    # the MTP layer (§2.3): its four own tensors and a full MoE decoder layer with an indexer
    for n in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
              "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_a_proj.weight",
              "self_attn.kv_b_proj.weight", "self_attn.o_proj.weight", "self_attn.indexer.wq_b.weight",
              "self_attn.indexer.wk.weight", "self_attn.indexer.weights_proj.weight",
              "self_attn.indexer.k_norm.bias", "mlp.gate.weight", "mlp.gate.e_score_correction_bias",
              "mlp.shared_experts.down_proj.weight", "mlp.experts.%d.up_proj.weight" % (cfg["n_routed_experts"] - 1)):
        check("model.layers.%d.%s" % (L, n) in hdr, "MTP tensor %s missing" % n)
    check(hdr["model.layers.%d.mlp.gate.e_score_correction_bias" % (L - 1)]["dtype"] == "F32", "bias dtype")
    moe = cfg["first_k_dense_replace"]
    e0 = "model.layers.%d.mlp.experts.0.down_proj" % moe
    qb = "model.layers.0.self_attn.q_b_proj"
    var = cfg.get("quantization_config", {}).get("quant_method")
    dt = {n: hdr[n]["dtype"] for n in hdr}
    if v in ("fp8", "mixed"):
        check(dt[qb + ".weight"] == "F8_E4M3", "fp8 attention")
        kvb = hdr["model.layers.0.self_attn.kv_b_proj.weight_scale_inv"]["shape"]
        check(kvb == [3, 1], "kv_b scale shape %r" % kvb)
    if v in ("mxfp4", "mixed"):
        check(dt[e0 + ".weight"] == "U8" and hdr[e0 + ".weight_scale"]["shape"] == [cfg["hidden_size"], 2],
              "mxfp4 expert layout")
        check(dt["model.layers.%d.mlp.experts.0.down_proj.weight" % L] == "BF16", "MTP experts BF16")
        check(var == "quark", "quark config")
    if v == "fp8":
        check(var == "fp8" and dt[e0 + ".weight"] == "F8_E4M3", "fp8 experts")
        check(dt["model.layers.0.self_attn.indexer.weights_proj.weight"] == "BF16", "weights_proj BF16")
    if v in ("bf16", "ngroup"):
        check(var is None and set(dt.values()) == {"BF16", "F32"}, "bf16 dtypes %r" % set(dt.values()))


def t_ref_absorbed(v):
    c = CK[v]
    la = ref.forward(c["model"], c["ids"], absorbed=True)
    r = rel_rows(la, c["ref_logits"]).max()
    check(r < 1e-10, "absorbed vs expanded MLA: rel %.3g" % r)


def t_ref_fp32(v):
    c = CK[v]
    m32 = ref.Model(c["dir"], np.float32)
    l32 = ref.forward(m32, c["ids"])
    r = rel_rows(l32, c["ref_logits"])
    check(r.max() < TOL_REF / 10, "an fp32 evaluation differs by %.3g (tolerance unreachable)" % r.max())
    check((l32.argmax(1) == c["ref_logits"].argmax(1)).all(), "fp32 argmax differs")


def t_ref_indexer_matters():
    for v, c in CK.items():
        ld = ref.forward(c["model"], c["ids"], dense=True)
        r = rel_rows(ld, c["ref_logits"])
        k = c["cfg"]["index_topk"]
        check(r[:k].max() < 1e-12, "%s: positions < index_topk must be dense already (rel %.3g)" % (v, r[:k].max()))
        if 2 * k < len(r):  # topk64 selects every key: dense is all it can be
            check(r[2 * k:].min() > 1e-2, "%s: dense vs sparse only differ by %.3g at a late position" % (v, r[2 * k:].min()))
        c["ref_dense"] = ld


def t_ref_tiebreak_exercised():
    ties = sum(c["stats"].idx_ties for c in CK.values())
    check(ties > 0, "no indexer boundary was decided by the tie-break rule")
    worst = 0.0
    for c in CK.values():
        if c["stats"].idx_ties:
            lt = ref.forward(c["model"], c["ids"], opts={"tie_high": True})
            worst = max(worst, rel_rows(lt, c["ref_logits"]).max())
    check(worst > 1e-3, "the tie-break rule never changes the logits (%.3g)" % worst)


def t_ref_bias_matters():
    for v in ("bf16", "mxfp4"):
        c = CK[v]
        lb = ref.forward(c["model"], c["ids"], opts={"no_bias": True})
        r = rel_rows(lb, c["ref_logits"]).max()
        check(r > 1e-2, "%s: e_score_correction_bias does not change selection (%.3g)" % (v, r))


def t_ref_group_matters():
    c = CK["ngroup"]
    check(c["cfg"]["n_group"] > 1 and c["cfg"]["topk_group"] < c["cfg"]["n_group"], "config")
    lg = ref.forward(c["model"], c["ids"], opts={"no_group": True})
    r = rel_rows(lg, c["ref_logits"]).max()
    check(r > 1e-2, "group-limited routing does not change the result (%.3g)" % r)


def t_ref_eps_matters():
    """the eps conventions are visible above the 1e-4 tolerance (latents are small on purpose)."""
    for v in ("bf16", "fp8"):
        c = CK[v]
        for opts, what in (({"eps_lat": 1e-5}, "q_a/kv_a_layernorm eps 1e-5 instead of 1e-6"),
                           ({"eps_rms": 1e-6}, "rms_norm_eps replaced by 1e-6")):
            r = rel_rows(ref.forward(c["model"], c["ids"], opts=opts), c["ref_logits"]).max()
            check(r > 10 * TOL_REF, "%s: %s changes logits by only %.3g" % (v, what, r))
    worst = max(rel_rows(ref.forward(c["model"], c["ids"], opts={"eps_kn": 1e-5}), c["ref_logits"]).max()
                for c in CK.values())
    check(worst > 10 * TOL_REF, "indexer k_norm eps 1e-5 instead of 1e-6 never changes the logits (%.3g)" % worst)


def t_ref_cli():
    c = CK["bf16"]
    out = os.path.join(OUT, "ref-cli.f32")
    ids = c["ids"][:20]
    p = subprocess.run([PY, os.path.join(HERE, "ref.py"), "logits", c["dir"], "--ids",
                        ",".join(map(str, ids)), "-o", out], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    check(p.returncode == 0, "ref.py logits failed: %s" % p.stderr.decode()[-300:])
    a = np.fromfile(out, "<f4").reshape(len(ids), -1)
    check(np.allclose(a, c["ref_logits"][:20], rtol=1e-6, atol=1e-6), "ref.py CLI logits differ")
    p = subprocess.run([PY, os.path.join(HERE, "ref.py"), "greedy", c["dir"], "--ids",
                        ",".join(map(str, ids)), "-n", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    got = p.stdout.decode().split()
    check(p.returncode == 0 and len(got) == 3 and int(got[0]) == int(c["ref_logits"][19].argmax()),
          "ref.py greedy: %r %s" % (got, p.stderr.decode()[-200:]))


def t_ref_mtp_fp32(v):
    ids, want = mtp_case(v)
    l32 = ref.mtp_forward(ref.Model(CK[v]["dir"], np.float32), ids)
    r = rel_rows(l32, want)
    check(r.max() < TOL_REF / 10, "an fp32 evaluation of the MTP layer differs by %.3g (tolerance unreachable)" % r.max())
    check((l32.argmax(1) == want.argmax(1)).all(), "fp32 MTP argmax differs")


def t_ref_mtp_choices_matter():
    """each MTP convention an engine could get wrong moves the logits above the tolerance:
    h_t before model.norm, the branches swapped, the position-0 mask (row 0), the MTP layer's
    own sparse attention (late rows)."""
    for v in ("bf16", "fp8"):
        ids, want = mtp_case(v)
        m = CK[v]["model"]
        for opt, rows, what in (("mtp_prenorm_h", slice(None), "h_t before model.norm"),
                                ("mtp_swap", slice(None), "hidden branch first in eh_proj"),
                                ("mtp_mask0", slice(0, 1), "the embedding zeroed at position 0")):
            r = rel_rows(ref.mtp_forward(m, ids, opts={opt: True})[rows], want[rows]).max()
            check(r > 10 * TOL_REF, "%s: %s changes the MTP logits by only %.3g" % (v, what, r))
        k = CK[v]["cfg"]["index_topk"]
        rd = rel_rows(ref.mtp_forward(m, ids, opts={"mtp_dense": True}), want)
        check(rd[:k].max() < 1e-12, "%s: MTP rows < index_topk must be dense already (%.3g)" % (v, rd[:k].max()))
        check(rd[2 * k:].min() > 1e-2, "%s: the MTP layer's indexer changes a late row by only %.3g" % (v, rd[2 * k:].min()))


def t_ref_cli_mtp():
    c = CK["bf16"]
    ids, want = mtp_case("bf16")
    out = os.path.join(OUT, "ref-cli-mtp.f32")
    p = subprocess.run([PY, os.path.join(HERE, "ref.py"), "logits", c["dir"], "--ids", ",".join(map(str, ids[:20])),
                        "-o", out, "--mtp"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    check(p.returncode == 0, "ref.py logits --mtp failed: %s" % p.stderr.decode()[-300:])
    a = np.fromfile(out, "<f4").reshape(19, -1)
    check(np.allclose(a, ref.mtp_forward(c["model"], ids[:20]), rtol=1e-6, atol=1e-6), "ref.py CLI --mtp logits differ")


# --------------------------------------------------------------------------------------
# glm vs reference

def compare(tag, got, want, tol):
    r = rel_rows(got, want)
    bad = np.nonzero(r > tol)[0]
    check(len(bad) == 0, "%s: rel L2 %.3g at position %d (%d positions over %.0e; max %.3g)"
          % (tag, r[bad[0]], bad[0], len(bad), tol, r.max()) if len(bad) else "")
    am = np.nonzero(got.argmax(1) != want.argmax(1))[0]
    check(len(am) == 0, "%s: argmax differs at position %d (%d vs %d)"
          % (tag, am[0], got[am[0]].argmax(), want[am[0]].argmax()) if len(am) else "")
    return r.max()


def t_logits(v):
    c = CK[v]
    got = glm_logits(c["dir"], c["ids"], tag=v)
    c["glm_logits"] = got
    return "max rel %.1e" % compare("prefill vs ref", got, c["ref_logits"], TOL_REF)


def t_decode(v):
    c = CK[v]
    got = glm_logits(c["dir"], c["ids"], ["--decode"], tag=v + "-decode")
    r1 = compare("--decode vs ref", got, c["ref_logits"], TOL_REF)
    check("glm_logits" in c, "no prefill logits to compare with (prefill test failed)")
    r2 = compare("--decode vs prefill", got, c["glm_logits"], TOL_DECODE)
    return "max rel %.1e vs ref, %.1e vs prefill" % (r1, r2)


def t_logits_plain(v):
    # GLM_KERNELS=c: glm.c's plain reference ops end to end (no SIMD kernel, no fast
    # path), prefill and one token at a time, against the NumPy reference.
    c = CK[v]
    out = []
    for mode, extra in (("prefill", []), ("decode", ["--decode"])):
        got = glm_logits(c["dir"], c["ids"], extra, tag=v + "-plain-" + mode, env={"GLM_KERNELS": "c"})
        out.append("%s max rel %.1e" % (mode, compare("GLM_KERNELS=c %s vs ref" % mode, got, c["ref_logits"], TOL_REF)))
    return "; ".join(out)


def t_mtp(v):
    # glm logits --mtp against ref.py's MTP layer: the default path and GLM_KERNELS=c (the
    # plain reference ops), each as one prefill and one token at a time (--decode, where the
    # MTP row t runs right after the main model's token t+1, as speculative decoding will)
    ids, want = mtp_case(v)
    out, got = [], {}
    for path, env in (("fast", None), ("plain", {"GLM_KERNELS": "c"})):
        for mode, extra in (("prefill", []), ("decode", ["--decode"])):
            g = glm_logits(CK[v]["dir"], ids, ["--mtp"] + extra, tag="%s-mtp-%s-%s" % (v, path, mode), env=env)
            r = compare("--mtp %s %s vs ref" % (path, mode), g, want, TOL_REF)
            got[path, mode] = g
            out.append("%s %s %.1e" % (path, mode, r))
    for path in ("fast", "plain"):
        compare("--mtp %s decode vs prefill" % path, got[path, "decode"], got[path, "prefill"], TOL_DECODE)
    return "max rel " + ", ".join(out)


def expect_fatal(args, want, out=None):
    """glm args fails cleanly: exit 1, nothing on stdout, one stderr line "glm: error: ..."
    naming one of want, and no output file left behind."""
    rc, so, se = run_glm(args, timeout=120)
    check(rc == 1, "exit code %d, expected 1 (stderr: %r)" % (rc, se.strip()[-300:]))
    check(so == "", "stdout not empty: %r" % so[:200])
    lines = se.splitlines()
    check(len(lines) == 1, "stderr must be exactly one line, got %d: %r" % (len(lines), se[-400:]))
    check(lines[0].startswith("glm: error:"), "stderr does not start with 'glm: error:': %r" % lines[0])
    check(any(w in lines[0] for w in want), "message does not name any of %r: %r" % (want, lines[0]))
    check(out is None or not os.path.exists(out), "output file %s left behind" % out)
    return lines[0]


def t_mtp_absent():
    # a checkpoint without the MTP layer (as some releases ship, docs/FORMATS.md §2.3) loads
    # and gives the same main logits bit for bit; --mtp refuses with one line
    c = CK["bf16"]
    full = c["glm_logits"] if "glm_logits" in c else glm_logits(c["dir"], c["ids"], tag="bf16-with-mtp")
    d = clone("bf16", "no-mtp-layer")
    prefix = "model.layers.%d." % c["cfg"]["num_hidden_layers"]
    wmap = json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"]
    remove_tensors(d, set(n for n in wmap if n.startswith(prefix)))
    CK["no-mtp"] = dict(c, dir=d)
    try:
        got = glm_logits(d, c["ids"], tag="no-mtp")
    finally:
        del CK["no-mtp"]
    check(np.array_equal(got, full), "main logits differ without the MTP layer")
    out = os.path.join(OUT, "no-mtp.f32")
    msg = expect_fatal(["logits", "--mtp", "-m", d, "--ids", "1,2,3", "-o", out], ["MTP"], out)
    d0 = clone("bf16", "num-nextn-0")
    edit_config(d0, lambda cfg: cfg.__setitem__("num_nextn_predict_layers", 0))
    msg0 = expect_fatal(["logits", "--mtp", "-m", d0, "--ids", "1,2,3", "-o", out], ["num_nextn_predict_layers"], out)
    return "%s | %s" % (msg, msg0)


def t_mtp_too_few_ids():
    out = os.path.join(OUT, "mtp-one-id.f32")
    return expect_fatal(["logits", "--mtp", "-m", CK["bf16"]["dir"], "--ids", "5", "-o", out], ["2 ids"], out)


def bc_mtp_eh_proj_shape(d):
    # the MTP layer is loaded now: a broken one stops the load even without --mtp
    n = "model.layers.%d.eh_proj.weight" % json.load(open(os.path.join(d, "config.json")))["num_hidden_layers"]
    edit_header(d, n, lambda h: h.__setitem__("shape", h["shape"][::-1]))
    return [n]


def t_logits_bf16(v):
    # The default path on AVX512-BF16 CPUs rounds activations (and FP8 x scale
    # weights) to bf16. The tiny random models turn that ~2e-3 into discrete flips (an
    # expert or an indexer key chosen differently; measured: positions agree to ~1e-2 until
    # the first flip, then rel L2 ~1), so only what survives chaos is checked: the three
    # best positions are within 2e-2 (a wrong panel layout or a lost chunk is off
    # everywhere). The bf16 products themselves are checked exactly in test_kernels.
    # The same holds for decode (--decode: one token at a time through the bf16 matvec).
    c = CK[v]
    out = []
    for mode, extra in (("prefill", []), ("decode", ["--decode"])):
        got = glm_logits(c["dir"], c["ids"], ["--bf16"] + extra, tag=v + "-bf16-" + mode)
        r = np.sort(rel_rows(got, c["ref_logits"]))
        check(r[2] < 2e-2, "bf16 %s vs ref: third best position has rel L2 %.3g (bound 2e-2)" % (mode, r[2]))
        out.append("%s best positions rel %.1e %.1e %.1e, median %.1e" % (mode, r[0], r[1], r[2], np.median(r)))
    return "; ".join(out)


def t_few_rows_as_decode(v):
    # A pass over up to 7 tokens (a --draft verify step) computes each row as a one-token
    # step does, with bf16 and with fp32 products: its logits equal --decode's bit for bit,
    # so drafting changes no greedy token (glm serve --draft's log-probabilities rely on it).
    # Also with the AVX2 kernels (a CPU without AVX-512), whose products are fp32 either way.
    c = CK[v]
    ids = c["ids"][:7]
    out = []
    for kern, prec in (("best", "--bf16"), ("best", "--fp32"), ("avx2", "--bf16"), ("avx2", "--fp32")):
        env = {"GLM_KERNELS": "avx2"} if kern == "avx2" else None
        a = glm_logits(c["dir"], ids, [prec], tag=v + "-few" + prec + kern, env=env)
        b = glm_logits(c["dir"], ids, [prec, "--decode"], tag=v + "-few-decode" + prec + kern, env=env)
        diff = np.nonzero((a != b).any(1))[0]
        check(len(diff) == 0, "%s %s kernels: 7-token pass vs --decode differ at positions %s (max rel %.2g)"
              % (prec, kern, list(diff), rel_rows(a, b).max()))
        out.append("%s %s identical" % (kern, prec[2:]))
    return ", ".join(out)


def t_prompt_rows_any_chunk(v):
    # glm serve computes a prompt's rows so that each comes out the same in any chunk (so the
    # prefix cache can hand out any whole block, and the rows after it run in chunks that
    # start elsewhere); glm logits --chunk N runs a prompt that way. Chunks of 1, 5 and 16
    # rows give the logits of one chunk of the whole prompt bit for bit, with bf16 and fp32
    # products and with the AVX2 kernels; the fp32 ones are within TOL_REF of the reference.
    # Every weight format (the bf16, fp8, mxfp4 and mixed checkpoints), not the routing ones.
    # The checkpoint's 48 ids, then 300 random ones: ~75 per routed expert, several groups of
    # the 16 tokens the few-token kernels take at once. Also the AVX2 kernels' own prefill of
    # 48 rows (no panel kernel there) against the reference.
    c = CK[v]
    long_ids = list(c["ids"]) + [int(x) for x in np.random.default_rng(7).integers(0, c["cfg"]["vocab_size"], 300)]
    out = []
    san = bool(os.environ.get("SAN"))  # the sanitizer pass: the default kernels, the long prompt only
    # (the AVX2 set has no bf16 kernels: --bf16 runs its fp32 products, the same as --fp32)
    for kern, prec in (("best", "--bf16"), ("best", "--fp32")) + ((("avx2", "--fp32"),) if not san else ()):
        env = {"GLM_KERNELS": "avx2"} if kern == "avx2" else None
        for name, ids, chunks in (("48", c["ids"], (1, 5, 16)), ("348", long_ids, (37, 128)))[san:]:
            whole = glm_logits(c["dir"], ids, [prec, "--chunk", str(len(ids))], tag="%s-pr%s%s%s" % (v, prec, kern, name), env=env)
            for k in chunks:
                got = glm_logits(c["dir"], ids, [prec, "--chunk", str(k)], tag="%s-pr%s%s%s-%d" % (v, prec, kern, name, k), env=env)
                diff = np.nonzero((got != whole).any(1))[0]
                check(len(diff) == 0, "%s %s kernels, %s ids: chunks of %d vs one chunk differ at positions %s (max rel %.2g)"
                      % (prec, kern, name, k, list(diff[:8]), rel_rows(got, whole).max()))
            if prec == "--fp32" and name == "48":  # (the reference's logits are of the 48 ids)
                compare("%s kernels --fp32 --chunk vs ref" % kern, whole, c["ref_logits"], TOL_REF)
                if kern == "avx2":  # and the AVX2 kernels' own prefill (a chunk of 48 rows: no panel kernel)
                    got = glm_logits(c["dir"], ids, [prec], tag="%s-avx2-prefill" % v, env=env)
                    compare("avx2 kernels --fp32 prefill vs ref", got, c["ref_logits"], TOL_REF)
        out.append("%s %s identical" % (kern, prec[2:]))
    return ", ".join(out)


def t_no_mmap():
    # --no-mmap reads the shards into memory instead of mapping them: same bytes, same logits
    c = CK["mixed"]
    check("glm_logits" in c, "no prefill logits to compare with (prefill test failed)")
    got = glm_logits(c["dir"], c["ids"], ["--no-mmap"], tag="no-mmap")
    check(np.array_equal(got, c["glm_logits"]), "--no-mmap logits differ from the mmap'd run")


def t_bench_json(extra):
    # glm bench --json on a tiny model: one object with the documented keys, finite
    # positive speeds and ratios, and at least the lm_head's bytes read per decoded token
    c = CK["mixed"]
    rc, so, se = run_glm(["bench", "-m", c["dir"], "-P", "8", "--long", "64", "-n", "2", "--json"] + extra)
    check(rc == 0, "glm bench exit %d: %s" % (rc, se.strip()[-300:]))
    lines = [l for l in so.splitlines() if l.strip()]
    check(len(lines) == 1, "bench --json printed %d lines, expected one object" % len(lines))
    r = json.loads(lines[0])
    for k in ("read_bw_gbs", "fma_peak_gflops", "prefill_tps", "prefill_peak_ratio", "decode_tps_ctx0",
              "decode_bytes_per_token", "decode_bw_ratio", "decode_tps_long", "decode_long_bw_ratio",
              "weights_read_gbs", "decode_weights_bw_ratio"):
        check(k in r and isinstance(r[k], (int, float)) and math.isfinite(r[k]) and r[k] > 0, "bench: %s = %r" % (k, r.get(k)))
    check(r.get("precision") == os.environ.get("GLM_PRECISION", "fp32"), "bench precision %r" % r.get("precision"))
    # the reported prefill is the median of its timed runs (each printed to 4 digits)
    runs = r.get("prefill_peak_ratio_runs")
    check(isinstance(runs, list) and len(runs) == 3 and all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in runs),
          "prefill_peak_ratio_runs %r" % (runs,))
    check(abs(sorted(runs)[1] - r["prefill_peak_ratio"]) <= 1e-3 * r["prefill_peak_ratio"],
          "prefill_peak_ratio %r is not the median of %r" % (r["prefill_peak_ratio"], runs))
    # the read's mean over its passes can be no faster than its fastest pass, so decode's
    # ratio to the fastest passes is the smaller one (both printed to 4 digits)
    best = r.get("read_bw_best_gbs")
    check(isinstance(best, (int, float)) and best >= r["read_bw_gbs"] * (1 - 1e-3), "read_bw_best_gbs %r < read_bw_gbs %r" % (best, r["read_bw_gbs"]))
    bb = r.get("decode_best_bw_ratio")
    check(isinstance(bb, (int, float)) and 0 < bb <= r["decode_bw_ratio"] * (1 + 1e-3), "decode_best_bw_ratio %r vs decode_bw_ratio %r" % (bb, r["decode_bw_ratio"]))
    # glm serve's batch of 8 sequences: its cost in decode steps within its runs' range,
    # and the speedup it implies (8 over that cost; a tiny model's step is mostly fixed costs)
    bc, br = r.get("batch_cost"), r.get("batch_cost_range")
    check(r.get("batch_seqs") == 8 and isinstance(bc, (int, float)) and math.isfinite(bc) and bc > 0 and isinstance(br, list)
          and len(br) == 2 and br[0] * (1 - 1e-3) <= bc <= br[1] * (1 + 1e-3), "batch_cost %r, range %r" % (bc, br))
    check(isinstance(r.get("batch_speedup"), (int, float)) and abs(r["batch_speedup"] - 8 / bc) <= 1e-3 * r["batch_speedup"],
          "batch_speedup %r, 8 / batch_cost %r" % (r.get("batch_speedup"), 8 / bc))
    # where both steps' time goes: every part of the ops table timed (the lm_head, and the
    # experts of this MoE checkpoint, in both), the rest of the step not negative, and the
    # parts adding up to the step (each printed to 1 us)
    st, parts = r.get("batch_step_ms"), r.get("batch_parts_ms")
    names = ["lm_head", "products", "experts", "absorb", "attention", "rest"]
    check(isinstance(st, list) and len(st) == 2 and all(isinstance(x, (int, float)) and x > 0 for x in st), "batch_step_ms %r" % (st,))
    check(isinstance(parts, dict) and list(parts) == names and all(isinstance(v, list) and len(v) == 2 for v in parts.values()),
          "batch_parts_ms %r" % (parts,))
    for k in range(2):
        check(parts["lm_head"][k] > 0 and parts["experts"][k] > 0 and parts["products"][k] > 0 and min(parts[n][k] for n in names) >= -0.002,
              "batch_parts_ms, %s: %r" % (("one sequence", "8")[k], parts))
        total = sum(parts[n][k] for n in names)
        check(abs(total - st[k]) <= 0.01, "batch_parts_ms add up to %.3f ms, the step took %.3f" % (total, st[k]))
    # decode over the weights' own read: bytes per token x tok/s over that read (the ratio
    # printed to 4 digits, the read to 10 MB/s)
    dw = r["decode_bytes_per_token"] * r["decode_tps_ctx0"] / (r["weights_read_gbs"] * 1e9)
    check(abs(r["decode_weights_bw_ratio"] - dw) <= 2e-3 * dw, "decode_weights_bw_ratio %r, bytes x tok/s / weights_read_gbs %r"
          % (r["decode_weights_bw_ratio"], dw))
    hp = r.get("huge_page_fraction")
    check(hp == -1 or 0 <= hp <= 1, "huge_page_fraction %r" % hp)
    cfg = c["cfg"]
    head = ref.SafetensorsFile  # the lm_head's bytes, from the checkpoint's own header
    lm = None
    for fn in (SHARD1, SHARD2):
        f = head(os.path.join(c["dir"], fn))
        if "lm_head.weight" in f.header:
            b, e = f.header["lm_head.weight"]["data_offsets"]
            lm = e - b
    check(lm is not None, "no lm_head.weight in the tiny checkpoint")
    check(r["decode_bytes_per_token"] >= lm, "bench counts %d bytes per token, less than the lm_head's %d"
          % (r["decode_bytes_per_token"], lm))
    # drafting's costs (after every other key): r(N) for N = 1..4 inside their ranges, the
    # MTP draft step's c (this checkpoint has the MTP layer), and the speedups they imply
    keys = list(r)
    check(keys.index("huge_page_fraction") < keys.index("spec_decode_ms") and keys[-1] == "spec_speedup", "bench: key order %r" % keys)
    rv, rr, c_, sp = r.get("spec_verify_cost"), r.get("spec_verify_cost_range"), r.get("spec_draft_cost"), r.get("spec_speedup")
    check(isinstance(rv, list) and len(rv) == 4 and all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in rv),
          "spec_verify_cost %r" % (rv,))
    check(isinstance(rr, list) and all(lo * (1 - 1e-3) <= x <= hi * (1 + 1e-3) for x, (lo, hi) in zip(rv, rr)), "spec_verify_cost_range %r" % (rr,))
    check(isinstance(c_, (int, float)) and c_ > 0 and r.get("spec_decode_ms", 0) > 0, "spec_draft_cost %r" % (c_,))
    check(isinstance(sp, dict) and sorted(sp) == ["0.6", "0.7", "0.8", "0.9"], "spec_speedup %r" % (sp,))
    for a, row in sp.items():
        want = [(1 - float(a) ** (n + 1)) / ((1 - float(a)) * (rv[n - 1] + n * c_)) for n in (1, 2, 3, 4)]
        check(all(abs(x - w) <= 2e-3 * w for x, w in zip(row, want)), "spec_speedup[%s] %r, from r and c %r" % (a, row, want))
    return "decode %.0f bytes/token (lm_head %d, vocab %d), huge pages %.2f; r(1..4) %s, c %.3g" % (
        r["decode_bytes_per_token"], lm, cfg["vocab_size"], hp, rv, c_)


def t_ctx_ok():
    c = CK["bf16"]
    got = glm_logits(c["dir"], c["ids"], ["--ctx", str(len(c["ids"]))], tag="ctx")
    compare("--ctx %d vs ref" % len(c["ids"]), got, c["ref_logits"], TOL_REF)


def t_single_file():
    """the same checkpoint as one model.safetensors without an index."""
    c = CK["mixed"]
    d = os.path.join(OUT, "single-file")
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    shutil.copy(os.path.join(c["dir"], "config.json"), d)
    items = []
    for fn in (SHARD1, SHARD2):
        f = ref.SafetensorsFile(os.path.join(c["dir"], fn))
        for n, h in f.header.items():
            b, e = h["data_offsets"]
            items.append((n, h["dtype"], h["shape"], f.buf[f.data_start + b:f.data_start + e]))
    make_tiny.write_safetensors(os.path.join(d, "model.safetensors"), items, {"format": "pt"})
    CK["single"] = dict(c, dir=d)
    try:
        got = glm_logits(d, c["ids"], tag="single")
    finally:
        del CK["single"]
    return "max rel %.1e" % compare("model.safetensors vs ref", got, c["ref_logits"], TOL_REF)


def t_indexer_matters_glm():
    for v in ("bf16", "ngroup"):
        c = CK[v]
        check("glm_logits" in c and "ref_dense" in c, "%s: prerequisites failed" % v)
        k = c["cfg"]["index_topk"]
        rd = rel_rows(c["glm_logits"], c["ref_dense"])
        rs = rel_rows(c["glm_logits"], c["ref_logits"])
        check(rd[2 * k:].min() > 1e-2, "%s: glm looks like dense attention (rel to dense %.3g)" % (v, rd[2 * k:].min()))
        check(rs.max() <= TOL_REF, "%s: glm does not match the sparse reference (%.3g)" % (v, rs.max()))


def t_greedy(v):
    c = CK[v]
    m = c["model"]
    if "prompt" not in c:
        c["prompt"], c["ref_greedy"] = pick_greedy(m, c["rng"])
    prompt, want = c["prompt"], c["ref_greedy"]
    need_glm()
    args = ["run", "-m", c["dir"], "--ids", ",".join(map(str, prompt)), "-n", str(GEN), "--temp", "0"]
    rc, so, se = run_glm(args)
    check(rc == 0, "glm %s: exit %d: %s" % (" ".join(args), rc, se.strip()[-300:]))
    lines = so.splitlines()
    check(len(lines) == 1, "stdout must be exactly one line, got %d: %r" % (len(lines), so[:200]))
    try:
        got = [int(t) for t in lines[0].split()]
    except ValueError:
        raise Fail("stdout is not a list of ids: %r" % lines[0][:200])
    eos = set(c["cfg"]["eos_token_id"])
    stop = next((i + 1 for i, t in enumerate(want) if t in eos), None)
    ok = got == want or (stop is not None and got == want[:stop])
    check(ok, "greedy differs from the reference\n  ref: %s\n  glm: %s"
          % (" ".join(map(str, want)), " ".join(map(str, got))))


# --------------------------------------------------------------------------------------
# speculative decoding (--draft N, spec.c)

DRAFT_LINE = re.compile(r"--draft (\d+): (\d+) of (\d+) drafts accepted")


def run_ids(d, prompt, n, extra=(), env=None):
    """glm run --ids: (generated ids, stderr)."""
    args = ["run", "-m", d, "--ids", ",".join(map(str, prompt)), "-n", str(n)] + list(extra)
    rc, so, se = run_glm(args, env=env)
    check(rc == 0, "glm %s: exit %d: %s" % (" ".join(args), rc, se.strip()[-300:]))
    try:
        return [int(t) for t in so.split()], se
    except ValueError:
        raise Fail("stdout is not a list of ids: %r" % so[:200])


def drafts_reported(se, n):
    """(accepted, drafted) from the decode line of a --draft n run."""
    m = DRAFT_LINE.search(se)
    check(m is not None and int(m.group(1)) == n, "no '--draft %d: A of D drafts accepted' line: %r" % (n, se[-300:]))
    a, d = int(m.group(2)), int(m.group(3))
    check(0 <= a <= d, "accepted %d of %d drafts" % (a, d))
    return a, d


def greedy_case(v):
    c = CK[v]
    if "prompt" not in c:
        c["prompt"], c["ref_greedy"] = pick_greedy(c["model"], c["rng"])
    want = c["ref_greedy"]
    eos = set(c["cfg"]["eos_token_id"])
    stop = next((i + 1 for i, t in enumerate(want) if t in eos), None)
    return c["prompt"], want[:stop] if stop else want


def t_spec_greedy(v, d=None):
    # greedy --draft 1..4 gives the reference's greedy continuation token for token (prompt
    # + 32), as --draft 0 does; then with GLM_DRAFT_ORACLE (the drafts are that continuation
    # itself) every draft is accepted, so verify and rollback run with long accepted prefixes
    d = d or CK[v]["dir"]
    prompt, want = greedy_case(v)
    got0, _ = run_ids(d, prompt, GEN, ["--temp", "0", "--draft", "0"])
    check(got0 == want, "--draft 0 differs from the reference")
    notes = []
    oracle = ",".join(map(str, prompt + want))
    for n in (1, 2, 3, 4):
        got, se = run_ids(d, prompt, GEN, ["--temp", "0", "--draft", str(n)])
        check(got == want, "--draft %d differs from --draft 0\n  want: %s\n  got:  %s" % (n, want, got))
        a, dr = drafts_reported(se, n)
        got, se = run_ids(d, prompt, GEN, ["--temp", "0", "--draft", str(n)], env={"GLM_DRAFT_ORACLE": oracle})
        check(got == want, "--draft %d with the oracle's drafts differs\n  want: %s\n  got:  %s" % (n, want, got))
        oa, od = drafts_reported(se, n)
        # every oracle draft is right; only a step running past an eos drafts beyond it
        check(od > 0 and oa >= od - n, "oracle drafts: %d of %d accepted" % (oa, od))
        notes.append("N=%d: MTP %d/%d, oracle %d/%d" % (n, a, dr, oa, od))
    return "; ".join(notes)


def t_spec_index_share_off():
    # index_share_for_mtp_iteration false: every draft step runs the MTP layer's indexer
    d = clone("bf16", "no-index-share")
    edit_config(d, lambda cfg: cfg.__setitem__("index_share_for_mtp_iteration", False))
    CK["no-share"] = dict(CK["bf16"], dir=d)
    try:
        return t_spec_greedy("bf16", d)
    finally:
        del CK["no-share"]


def t_spec_no_mtp():
    # without the MTP layer --draft decodes without drafts: same output, one stderr line why
    prompt, want = greedy_case("bf16")
    out = []
    for case, edit, why in (("draft-no-mtp-layer", "tensors", "no model.layers"),
                            ("draft-num-nextn-0", "config", "num_nextn_predict_layers 0")):
        d = clone("bf16", case)
        if edit == "tensors":
            prefix = "model.layers.%d." % CK["bf16"]["cfg"]["num_hidden_layers"]
            wmap = json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"]
            remove_tensors(d, set(n for n in wmap if n.startswith(prefix)))
        else:
            edit_config(d, lambda cfg: cfg.__setitem__("num_nextn_predict_layers", 0))
        got, se = run_ids(d, prompt, GEN, ["--temp", "0", "--draft", "3"])
        check(got == want, "%s: output differs from the reference" % case)
        lines = [l for l in se.splitlines() if "--draft" in l]
        check(len(lines) == 1 and "no MTP layer" in lines[0] and why in lines[0] and "without drafts" in lines[0],
              "%s: expected one line saying why: %r" % (case, se[-400:]))
        check(not se.count("glm: error"), "%s: an error: %r" % (case, se[-300:]))
        out.append(lines[0])
    return " | ".join(out)


def t_spec_default():
    # --draft's CPU default (spec.c): 1 for a checkpoint of 16 or more layers with the MTP
    # layer, 0 below; the output is the same either way (greedy)
    out = []
    for layers, want_n in ((6, 0), (16, 1)):
        d = os.path.join(OUT, "spec-default-%d" % layers)
        if not os.path.isdir(d):
            subprocess.run([sys.executable, os.path.join(HERE, "make_tiny.py"), d, "--variant", "bf16", "--seed", "5", "--layers", str(layers)],
                           check=True, capture_output=True)
        prompt = [5, 6, 7]
        got, se = run_ids(d, prompt, 6, ["--temp", "0"])
        want, _ = run_ids(d, prompt, 6, ["--temp", "0", "--draft", "0"])
        lines = [l for l in se.splitlines() if "--draft" in l]
        check(got == want, "%d layers: the default's output differs from --draft 0's" % layers)
        if want_n:
            check(len(lines) == 1 and ("--draft %d:" % want_n) in lines[0], "%d layers: expected --draft %d by default: %r" % (layers, want_n, se[-300:]))
        else:
            check(not lines, "%d layers: expected no drafts by default: %r" % (layers, lines))
        out.append("%d layers: %s" % (layers, lines[0].split(";")[1].strip() if lines else "no drafts"))
    return "; ".join(out)


def chi2_homogeneity(a, b, min_count=10):
    """Pearson's chi-square of two samples of symbols (bins with fewer than min_count in
    both together merged into one): (statistic, degrees of freedom)."""
    from collections import Counter
    ca, cb = Counter(a), Counter(b)
    keys = [k for k in set(ca) | set(cb) if ca[k] + cb[k] >= min_count]
    rest = [k for k in set(ca) | set(cb) if ca[k] + cb[k] < min_count]
    rows = [(ca[k], cb[k]) for k in keys] + ([(sum(ca[k] for k in rest), sum(cb[k] for k in rest))] if rest else [])
    na, nb = len(a), len(b)
    x2 = 0.0
    for ra, rb in rows:
        tot = ra + rb
        ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
        x2 += (ra - ea) ** 2 / ea + (rb - eb) ** 2 / eb
    return x2, len(rows) - 1


def chi2_z(x2, df):
    """Wilson-Hilferty: the chi-square statistic as a standard normal deviate."""
    k = max(df, 1)
    return ((x2 / k) ** (1.0 / 3) - (1 - 2.0 / (9 * k))) / math.sqrt(2.0 / (9 * k))


def nucleus_probs(logits, top_p):
    """sample()'s distribution at temperature 1 (float64; used to choose a prompt only)."""
    p = np.exp(logits - logits.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    cum = np.cumsum(p[order])
    n = int(np.argmax(cum > top_p)) + 1 if (cum > top_p).any() else len(p)
    q = np.zeros_like(p)
    q[order[:n]] = p[order[:n]]
    return q / q.sum()


def peaked_prompt(d, top_p, tries=6):
    """A prefix of a fixed random sequence after which the next two greedy tokens are likely
    (so that one-hot drafts of them are accepted often): the best p(g1)·p(g2 | g1)."""
    seq = [int(i) for i in np.random.default_rng(7).integers(0, CK["bf16"]["cfg"]["vocab_size"], 120)]
    lg = glm_logits(d, seq, tag="spec-seq")
    p1 = [nucleus_probs(lg[t], top_p).max() for t in range(len(seq))]
    best = None
    for t in sorted(range(9, len(seq)), key=lambda t: -p1[t])[:tries]:
        prompt = seq[:t + 1] + [int(np.argmax(lg[t]))]
        p2 = nucleus_probs(glm_logits(d, prompt, tag="spec-cand")[-1], top_p).max()
        if best is None or p1[t] * p2 > best[0]:
            best = (p1[t] * p2, seq[:t + 1])
    return best[1], best[0]


def t_spec_sampling():
    # speculative sampling keeps the main model's distribution: at temperature 1 (top-p
    # 0.9, applied to the target and the draft alike) the 2nd and 3rd tokens over many seeds
    # are distributed as without drafts (two-sample chi-square, z < 4.5). Drafts from the
    # MTP layer, and one-hot drafts from GLM_DRAFT_ORACLE (the greedy continuation of a
    # prompt chosen so that it is likely, hence often accepted): a rule that accepted every
    # draft, or drew a rejection's token from p instead of norm(max(p - q, 0)), fails this
    # (checked by breaking spec.c).
    from concurrent.futures import ThreadPoolExecutor
    d = CK["bf16"]["dir"]
    prompt, p12 = peaked_prompt(d, 0.9)
    greedy, _ = run_ids(d, prompt, 4, ["--temp", "0", "--draft", "0"])
    # under the sanitizers (SAN=1) only enough seeds to run every path: the plain pass holds
    # the statistics
    seeds = range(1, 1 + (30 if os.environ.get("SAN") else 700))
    oracle = ",".join(map(str, prompt + greedy))
    env1 = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "passive"}

    def sample(extra, env):
        def one(seed):
            # -n 4: the first step after the prompt's token drafts both the 2nd and the 3rd
            got, se = run_ids(d, prompt, 4, ["--temp", "1", "--top-p", "0.9", "--seed", str(seed), "-t", "1"] + extra, env=dict(env1, **env))
            return tuple(got + [-1] * (4 - len(got))), se
        with ThreadPoolExecutor(max_workers=2) as ex:
            return list(ex.map(one, seeds))

    base = [g for g, _ in sample(["--draft", "0"], {})]
    notes = ["prompt of %d, p(g1)p(g2) %.2f" % (len(prompt), p12)]
    for name, extra, env in (("mtp", ["--draft", "2"], {}), ("oracle", ["--draft", "2"], {"GLM_DRAFT_ORACLE": oracle})):
        runs = sample(extra, env)
        acc = [drafts_reported(se, 2) if "drafts accepted" in se else (0, 0) for _, se in runs]  # none if token 1 was eos
        rate = sum(a for a, _ in acc) / max(1, sum(dr for _, dr in acc))
        for pos in (1, 2):
            x2, df = chi2_homogeneity([g[pos] for g in base], [g[pos] for g, _ in runs])
            z = chi2_z(x2, df)
            check(z < 4.5, "%s drafts: token %d's distribution differs from --draft 0: chi2 %.1f, df %d, z %.2f (acceptance %.2f)"
                  % (name, pos + 1, x2, df, z, rate))
            notes.append("%s t%d chi2 %.1f/df %d z %.2f" % (name, pos + 1, x2, df, z))
        notes.append("%s acceptance %.2f" % (name, rate))
    return "; ".join(notes)


# --------------------------------------------------------------------------------------
# broken checkpoints

def read_st(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_st_raw(path, header, data):
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((-len(hj)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + data)


def clone(v, case):
    d = os.path.join(OUT, "broken", case)
    if os.path.isdir(d):
        shutil.rmtree(d)
    shutil.copytree(CK[v]["dir"], d)
    return d


def shard_of(d, name):
    return json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"][name]


def edit_header(d, name, fn):
    """apply fn(entry) to tensor `name`'s header entry (in place) in the shard that holds it."""
    sh = os.path.join(d, shard_of(d, name))
    h, data = read_st(sh)
    fn(h[name])
    write_st_raw(sh, h, data)
    return sh


def edit_config(d, fn):
    p = os.path.join(d, "config.json")
    cfg = json.load(open(p))
    fn(cfg)
    json.dump(cfg, open(p, "w"), indent=2)


def remove_tensor(d, name):
    remove_tensors(d, [name])


def remove_tensors(d, names):
    """drop the tensors `names` from their shards and from the index."""
    ip = os.path.join(d, "model.safetensors.index.json")
    idx = json.load(open(ip))
    for fn in sorted(set(idx["weight_map"][n] for n in names)):
        sh = os.path.join(d, fn)
        f = ref.SafetensorsFile(sh)
        items = []
        for n, h in f.header.items():
            if n in names:
                continue
            b, e = h["data_offsets"]
            items.append((n, h["dtype"], h["shape"], f.buf[f.data_start + b:f.data_start + e]))
        make_tiny.write_safetensors(sh, items, f.meta)
    for n in names:
        del idx["weight_map"][n]
    json.dump(idx, open(ip, "w"), indent=2)


def bc_truncated(d):
    p = os.path.join(d, SHARD2)
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) - 1000)
    return [SHARD2]


def bc_header_len_past_eof(d):
    p = os.path.join(d, SHARD1)
    with open(p, "r+b") as f:
        f.write(struct.pack("<Q", os.path.getsize(p)))
    return [SHARD1]


def bc_header_bad_json(d):
    p = os.path.join(d, SHARD1)
    raw = bytearray(open(p, "rb").read())
    i = raw.index(b'"dtype":')
    raw[i + 7:i + 8] = b";"  # "dtype";"BF16"
    open(p, "wb").write(bytes(raw))
    return [SHARD1]


def bc_config_bad_json(d):
    p = os.path.join(d, "config.json")
    txt = open(p).read()
    open(p, "w").write(txt[:len(txt) // 2])
    return ["config.json"]


def bc_config_missing(d):
    os.remove(os.path.join(d, "config.json"))
    return ["config.json"]


def bc_missing_tensor(d):
    n = "model.layers.3.self_attn.kv_a_layernorm.weight"
    remove_tensor(d, n)
    return [n]


def bc_missing_fp8_scale(d):
    n = "model.layers.1.self_attn.q_b_proj.weight_scale_inv"
    remove_tensor(d, n)
    return ["model.layers.1.self_attn.q_b_proj"]


def bc_wrong_shape(d):
    n = "model.layers.2.mlp.experts.3.up_proj.weight"
    edit_header(d, n, lambda h: h.__setitem__("shape", h["shape"][::-1]))  # [64,160] -> [160,64]
    return [n]


def bc_wrong_shape_norm(d):
    n = "model.layers.1.self_attn.q_a_layernorm.weight"
    edit_header(d, n, lambda h: h.__setitem__("shape", [48, 2]))
    return [n]


def bc_wrong_dtype(d):
    n = "model.layers.0.input_layernorm.weight"
    edit_header(d, n, lambda h: h.__setitem__("dtype", "I16"))  # same byte size
    return [n]


def bc_unknown_dtype(d):
    n = "model.layers.4.post_attention_layernorm.weight"
    edit_header(d, n, lambda h: h.__setitem__("dtype", "Q4_K"))
    return [n, "Q4_K"]


def bc_fp8_scale_shape(d):
    n = "model.layers.0.self_attn.kv_b_proj.weight_scale_inv"
    edit_header(d, n, lambda h: h.__setitem__("shape", [1, 3]))  # correct is [3, 1]
    return ["model.layers.0.self_attn.kv_b_proj"]


def bc_mxfp4_scale_shape(d):
    n = "model.layers.2.mlp.experts.0.down_proj.weight_scale"
    edit_header(d, n, lambda h: h.__setitem__("shape", [80, 4]))  # correct is [160, 2]
    return ["model.layers.2.mlp.experts.0.down_proj"]


def bc_index_missing_shard(d):
    ip = os.path.join(d, "model.safetensors.index.json")
    idx = json.load(open(ip))
    idx["weight_map"]["model.layers.5.mlp.experts.7.gate_proj.weight"] = "model-00003-of-00003.safetensors"
    json.dump(idx, open(ip, "w"), indent=2)
    return ["model-00003-of-00003.safetensors"]


def bc_heads_mismatch(d):
    def f(c):
        c["num_attention_heads"] = 5
        c["num_key_value_heads"] = 5
    edit_config(d, f)
    return ["q_b_proj", "kv_b_proj", "o_proj", "num_attention_heads"]


def bc_qk_head_dim(d):
    edit_config(d, lambda c: c.__setitem__("qk_head_dim", c["qk_nope_head_dim"] + c["qk_rope_head_dim"] + 16))
    return ["qk_head_dim"]


def bc_overlap(d):
    a = "model.layers.0.input_layernorm.weight"
    b = "model.layers.0.post_attention_layernorm.weight"
    sh = os.path.join(d, shard_of(d, a))
    check(shard_of(d, b) == shard_of(d, a), "test setup: tensors in different shards")
    h, data = read_st(sh)
    h[b]["data_offsets"] = list(h[a]["data_offsets"])
    write_st_raw(sh, h, data)
    return [os.path.basename(sh), a, b]


def bc_offsets_past_eof(d):
    n = "model.norm.weight"
    sh = os.path.join(d, shard_of(d, n))
    h, data = read_st(sh)
    nb = h[n]["data_offsets"][1] - h[n]["data_offsets"][0]
    h[n]["data_offsets"] = [len(data), len(data) + nb]
    write_st_raw(sh, h, data)
    return [os.path.basename(sh), n]


def bc_size_overflow(d):
    # [4, 2^62 + 40] BF16: the element count wraps to 160 mod 2^64 and the byte size to 320,
    # which is exactly what data_offsets say; only an overflow check catches it
    n = "model.layers.2.input_layernorm.weight"
    sh = edit_header(d, n, lambda h: h.__setitem__("shape", [4, 2 ** 62 + 40]))
    return [os.path.basename(sh), n]


def bc_offsets_reversed(d):
    n = "model.layers.3.post_attention_layernorm.weight"
    sh = edit_header(d, n, lambda h: h.__setitem__("data_offsets", [h["data_offsets"][1], h["data_offsets"][0]]))
    return [os.path.basename(sh), n]


BROKEN = [
    # name, source variant, builder, extra CLI args (None = default logits args)
    ("truncated_shard", "bf16", bc_truncated, None),
    ("header_len_past_eof", "bf16", bc_header_len_past_eof, None),
    ("header_bad_json", "bf16", bc_header_bad_json, None),
    ("config_bad_json", "bf16", bc_config_bad_json, None),
    ("config_missing", "bf16", bc_config_missing, None),
    ("missing_tensor", "bf16", bc_missing_tensor, None),
    ("missing_fp8_scale", "fp8", bc_missing_fp8_scale, None),
    ("wrong_shape_expert", "bf16", bc_wrong_shape, None),
    ("wrong_shape_norm", "bf16", bc_wrong_shape_norm, None),
    ("wrong_dtype", "bf16", bc_wrong_dtype, None),
    ("unknown_dtype", "bf16", bc_unknown_dtype, None),
    ("fp8_scale_shape", "fp8", bc_fp8_scale_shape, None),
    ("mxfp4_scale_shape", "mxfp4", bc_mxfp4_scale_shape, None),
    ("index_missing_shard", "bf16", bc_index_missing_shard, None),
    ("config_heads_mismatch", "bf16", bc_heads_mismatch, None),
    ("config_qk_head_dim", "bf16", bc_qk_head_dim, None),
    ("overlapping_offsets", "bf16", bc_overlap, None),
    ("offsets_past_eof", "bf16", bc_offsets_past_eof, None),
    ("size_overflow", "bf16", bc_size_overflow, None),
    ("offsets_reversed", "bf16", bc_offsets_reversed, None),
    ("token_id_ge_vocab", "bf16", None, (["--ids", "1,99999"], ["99999"])),
    ("seq_longer_than_ctx", "bf16", None, (["--ids", "1,2,3,4,5,6,7,8,9,10", "--ctx", "4"], ["ctx"])),
    ("bad_flag", "bf16", None, (["--frobnicate"], ["--frobnicate"])),
    ("missing_model_dir", None, None, None),
]


def t_broken(name, v, builder, cli):
    need_glm()
    out = os.path.join(OUT, "broken-%s.f32" % name)
    if os.path.exists(out):
        os.remove(out)
    if name == "missing_model_dir":
        d = os.path.join(OUT, "broken", "does-not-exist")
        args = ["logits", "-m", d, "--ids", "1,2,3", "-o", out]
        want = ["does-not-exist"]
    elif builder is not None:
        d = clone(v, name)
        want = builder(d)
        args = ["logits", "-m", d, "--ids", "1,2,3", "-o", out]
    else:
        d = CK[v]["dir"]
        extra, want = cli
        args = ["logits", "-m", d, "--ids", "1,2,3", "-o", out]
        if "--ids" in extra:
            args = args[:3] + args[5:]
        args += extra
    expect_fatal(args, want, out)


# --------------------------------------------------------------------------------------

def main():
    if parse_args("test_forward.py"):
        return 2
    t0 = time.time()
    try:
        setup()
    except Exception as e:
        traceback.print_exc()
        print("FAIL setup: %s" % e)
        print("0 passed, 1 failed")
        return 1
    print("# checkpoints and reference ready in %.1fs (GLM=%s)" % (time.time() - t0, GLM), flush=True)

    test("ref_decoders", t_ref_decoders)
    test("ref_quant_roundtrip", t_ref_quant_roundtrip)
    test("ref_safetensors_roundtrip", t_ref_safetensors_roundtrip)
    for v in VARIANTS:
        test("ref_layout_%s" % v, t_ref_checkpoint_layout, v)
    for v in VARIANTS:
        test("ref_absorbed_vs_expanded_%s" % v, t_ref_absorbed, v)
    for v in VARIANTS:
        test("ref_fp32_within_tolerance_%s" % v, t_ref_fp32, v)
    test("ref_indexer_matters", t_ref_indexer_matters)
    test("ref_tiebreak_exercised", t_ref_tiebreak_exercised)
    test("ref_bias_matters", t_ref_bias_matters)
    test("ref_group_matters", t_ref_group_matters)
    test("ref_eps_matters", t_ref_eps_matters)
    test("ref_cli", t_ref_cli)
    for v in MTP_VARIANTS:
        test("ref_mtp_fp32_within_tolerance_%s" % v, t_ref_mtp_fp32, v)
    test("ref_mtp_choices_matter", t_ref_mtp_choices_matter)
    test("ref_cli_mtp", t_ref_cli_mtp)

    for v in VARIANTS:
        test("logits_%s" % v, t_logits, v)
        test("decode_%s" % v, t_decode, v)
        test("logits_bf16_%s" % v, t_logits_bf16, v)
        if not os.environ.get("SAN") or v in ("bf16", "mxfp4"):  # the sanitizer pass: two formats
            test("few_rows_as_decode_%s" % v, t_few_rows_as_decode, v)
            if v in ("bf16", "fp8", "mxfp4", "mixed"):
                test("prompt_rows_any_chunk_%s" % v, t_prompt_rows_any_chunk, v)
        test("logits_plain_%s" % v, t_logits_plain, v)
    test("ctx_limit_ok", t_ctx_ok)
    test("no_mmap_same_logits", t_no_mmap)
    test("bench_json", t_bench_json, [])
    test("bench_json_no_mmap", t_bench_json, ["--no-mmap"])
    test("single_file_checkpoint", t_single_file)
    test("indexer_matters", t_indexer_matters_glm)
    for v in VARIANTS:
        test("greedy_%s" % v, t_greedy, v)
    for v in MTP_VARIANTS:
        test("mtp_logits_%s" % v, t_mtp, v)
    test("mtp_absent", t_mtp_absent)
    for v in MTP_VARIANTS:
        test("spec_greedy_%s" % v, t_spec_greedy, v)
    test("spec_index_share_off", t_spec_index_share_off)
    test("spec_no_mtp_layer", t_spec_no_mtp)
    test("spec_cpu_default", t_spec_default)
    test("spec_sampling_distribution", t_spec_sampling)
    test("mtp_too_few_ids", t_mtp_too_few_ids)
    test("broken_mtp_eh_proj_shape", t_broken, "mtp_eh_proj_shape", "bf16", bc_mtp_eh_proj_shape, None)
    for name, v, builder, cli in BROKEN:
        test("broken_%s" % name, t_broken, name, v, builder, cli)

    return summary("# test_forward", t0)


if __name__ == "__main__":
    sys.exit(main())
