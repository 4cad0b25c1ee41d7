#!/usr/bin/python3
"""Independent NumPy float64 reference forward pass for GLM-5.2 (glm_moe_dsa).

Written from docs/MODEL.md (§1-§5, §7) and docs/FORMATS.md (§1-§4) only.

    ref.py logits DIR --ids 1,2,3 -o FILE [--dense]   float32 LE logits [len(ids)][vocab]
    ref.py logits DIR --ids 1,2,3 -o FILE --mtp        the MTP layer's logits [len(ids)-1][vocab]
    ref.py greedy DIR --ids 1,2,3 -n 32 [--dense]      greedy continuation ids, one line

Conventions (the spec leaves them implementation-defined; glm.c must use the same):
  * indexer top-k: Sel(t) = top min(index_topk, t+1) of I[t, 0..t]; equal scores -> the LOWER
    position wins.
  * MoE top-k and group top-k: equal scores -> the LOWER index wins; group score = sum of the
    2 largest bias-corrected scores of the group.
  * q_a_layernorm / kv_a_layernorm eps 1e-6; indexer k_norm LayerNorm eps 1e-6; every other
    RMSNorm uses rms_norm_eps.
  * norm_topk_prob divides by (sum + 1e-20).
  * the MTP layer (index num_hidden_layers, §5.1), when the checkpoint has it: row t pairs the
    main model's final-normed hidden state h_t with the embedding of ids[t+1] (embedding first,
    no mask at position 0), runs a full MoE decoder layer with its own indexer at position t
    over its own rows 0..t, and predicts ids[t+2] through shared_head.norm and the main lm_head.
  * greedy: argmax, equal logits -> the lower id; generation does not stop at eos here.
"""
import argparse
import json
import os
import struct
import sys

# tiny matrices: BLAS threads only add overhead (set before numpy is imported)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

# --------------------------------------------------------------------------------------
# number formats (decoders)

def bf16_to_f64(u16):
    u = np.asarray(u16, dtype=np.uint16)
    f = (u.reshape(-1).astype(np.uint32) << 16).view(np.float32)
    return f.astype(np.float64).reshape(u.shape)


def _fp8_e4m3fn_table():
    t = np.zeros(256)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e = (b >> 3) & 0xF
        m = b & 0x7
        if e == 0xF and m == 0x7:
            t[b] = np.nan
        elif e == 0:
            t[b] = s * (m / 8.0) * 2.0 ** -6
        else:
            t[b] = s * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return t


FP8_E4M3 = _fp8_e4m3fn_table()
FP4_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                     -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def e8m0_to_f64(u8):
    u8 = np.asarray(u8, dtype=np.uint8)
    v = np.ldexp(1.0, u8.astype(np.int64) - 127)
    return np.where(u8 == 255, np.nan, v)


def dequant_fp8(q_u8, scale_inv):
    """q [out,in] E4M3FN bytes, scale_inv [ceil(out/128), ceil(in/128)] -> W float64."""
    out, inn = q_u8.shape
    ro, ci = -(-out // 128), -(-inn // 128)
    if scale_inv.shape != (ro, ci):
        raise ValueError("weight_scale_inv shape %s, expected %s" % (scale_inv.shape, (ro, ci)))
    s = np.repeat(np.repeat(scale_inv, 128, axis=0)[:out], 128, axis=1)[:, :inn]
    return FP8_E4M3[q_u8] * s


def dequant_mxfp4(packed, scale):
    """packed U8 [out, in/2] (element 2j = low nibble of byte j), scale U8 E8M0 [out, in/32]."""
    out, half = packed.shape
    inn = half * 2
    if scale.shape != (out, inn // 32):
        raise ValueError("weight_scale shape %s, expected %s" % (scale.shape, (out, inn // 32)))
    codes = np.empty((out, inn), np.uint8)
    codes[:, 0::2] = packed & 0x0F
    codes[:, 1::2] = packed >> 4
    vals = FP4_E2M1[codes]
    return vals * np.repeat(e8m0_to_f64(scale), 32, axis=1)


# --------------------------------------------------------------------------------------
# safetensors reader

ST_DTYPES = {"BF16": (2, "<u2"), "F16": (2, "<f2"), "F32": (4, "<f4"), "F64": (8, "<f8"),
             "F8_E4M3": (1, "u1"), "U8": (1, "u1"), "I8": (1, "i1"), "I16": (2, "<i2"),
             "I32": (4, "<i4"), "I64": (8, "<i8"), "F8_E8M0": (1, "u1")}


class SafetensorsFile:
    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            self.buf = f.read()
        if len(self.buf) < 8:
            raise ValueError("%s: too short" % path)
        (n,) = struct.unpack("<Q", self.buf[:8])
        if 8 + n > len(self.buf):
            raise ValueError("%s: header length past end of file" % path)
        self.header = json.loads(self.buf[8:8 + n].decode("utf-8"))
        self.data_start = 8 + n
        self.meta = self.header.pop("__metadata__", None)
        dlen = len(self.buf) - self.data_start
        spans = []
        for name, h in self.header.items():
            sz, _ = ST_DTYPES[h["dtype"]]
            cnt = 1
            for d in h["shape"]:
                cnt *= int(d)
            b, e = h["data_offsets"]
            if e - b != cnt * sz or b < 0 or e > dlen:
                raise ValueError("%s: bad data_offsets for %s" % (path, name))
            spans.append((b, e))
        spans.sort()
        for (b0, e0), (b1, e1) in zip(spans, spans[1:]):
            if b1 < e0:
                raise ValueError("%s: overlapping tensors" % path)

    def raw(self, name):
        h = self.header[name]
        sz, np_dt = ST_DTYPES[h["dtype"]]
        b, e = h["data_offsets"]
        a = np.frombuffer(self.buf, dtype=np.dtype(np_dt), count=(e - b) // sz,
                          offset=self.data_start + b)
        return h["dtype"], a.reshape(h["shape"])


class Checkpoint:
    def __init__(self, d):
        self.dir = d
        with open(os.path.join(d, "config.json")) as f:
            self.config = json.load(f)
        idx = os.path.join(d, "model.safetensors.index.json")
        self.files = {}
        self.where = {}
        if os.path.exists(idx):
            with open(idx) as f:
                wm = json.load(f)["weight_map"]
            for name, fn in wm.items():
                if fn not in self.files:
                    self.files[fn] = SafetensorsFile(os.path.join(d, fn))
                self.where[name] = fn
        else:
            fn = "model.safetensors"
            self.files[fn] = SafetensorsFile(os.path.join(d, fn))
            for name in self.files[fn].header:
                self.where[name] = fn
        for name, fn in self.where.items():
            if name not in self.files[fn].header:
                raise KeyError("%s: index names %s but the shard lacks it" % (fn, name))

    def has(self, name):
        return name in self.where

    def raw(self, name):
        return self.files[self.where[name]].raw(name)

    def tensor(self, name):
        """a plain (BF16/F32/F16/F64) tensor as float64."""
        dt, a = self.raw(name)
        if dt == "BF16":
            return bf16_to_f64(a)
        if dt in ("F32", "F16", "F64"):
            return a.astype(np.float64)
        raise ValueError("%s: unexpected dtype %s" % (name, dt))

    def linear(self, prefix):
        """weight of a Linear, dequantized per its on-disk format -> float64 [out, in]."""
        dt, a = self.raw(prefix + ".weight")
        if dt == "F8_E4M3":
            _, s = self.raw(prefix + ".weight_scale_inv")
            return dequant_fp8(a, s.astype(np.float64))
        if dt == "U8" and self.has(prefix + ".weight_scale"):
            _, s = self.raw(prefix + ".weight_scale")
            return dequant_mxfp4(a, s)
        return self.tensor(prefix + ".weight")


# --------------------------------------------------------------------------------------
# model

class Model:
    def __init__(self, d, dtype=np.float64):
        """dtype=np.float32 gives an fp32 emulation (used only to size test tolerances)."""
        ck = Checkpoint(d)
        c = ck.config
        self.cfg = c
        self.H = c["hidden_size"]
        self.V = c["vocab_size"]
        self.L = c["num_hidden_layers"]
        self.NH = c["num_attention_heads"]
        self.nope = c["qk_nope_head_dim"]
        self.rope = c["qk_rope_head_dim"]
        self.vd = c["v_head_dim"]
        self.kvr = c["kv_lora_rank"]
        self.eps = c["rms_norm_eps"]
        rp = c.get("rope_parameters") or {}
        self.theta = float(rp.get("rope_theta", c.get("rope_theta", 10000.0)))
        self.IH = c["index_n_heads"]
        self.ID = c["index_head_dim"]
        self.topk = c["index_topk"]
        if "indexer_types" in c and c["indexer_types"] is not None:
            self.full = [t == "full" for t in c["indexer_types"]]
        else:
            freq = c.get("index_topk_freq", 1) or 1
            off = c.get("index_skip_topk_offset", 2)
            self.full = [max(i - off + 1, 0) % freq == 0 for i in range(self.L)]
        if "mlp_layer_types" in c and c["mlp_layer_types"] is not None:
            self.dense = [t == "dense" for t in c["mlp_layer_types"]]
        else:
            self.dense = [i < c["first_k_dense_replace"] for i in range(self.L)]
        self.E = c["n_routed_experts"]
        self.K = c["num_experts_per_tok"]
        self.n_group = c.get("n_group", 1) or 1
        self.topk_group = c.get("topk_group", 1) or 1
        self.norm_topk = c.get("norm_topk_prob", True)
        self.rsf = c.get("routed_scaling_factor", 1.0)
        self.embed = ck.tensor("model.embed_tokens.weight")
        self.final_norm = ck.tensor("model.norm.weight")
        self.lm_head = ck.linear("lm_head")
        self.layers = [self._layer(ck, i, self.full[i], self.dense[i]) for i in range(self.L)]
        # §2.3: the MTP layer is model.layers.{L}: a MoE layer with its own indexer, plus its
        # enorm, hnorm, eh_proj [H, 2H] and shared_head.norm. Optional (some releases drop it).
        self.mtp = None
        p = "model.layers.%d." % self.L
        if c.get("num_nextn_predict_layers", 0) and ck.has(p + "input_layernorm.weight"):
            w = self._layer(ck, self.L, True, False)
            w["enorm"] = ck.tensor(p + "enorm.weight")
            w["hnorm"] = ck.tensor(p + "hnorm.weight")
            w["eh_proj"] = ck.linear(p + "eh_proj")
            w["head_norm"] = ck.tensor(p + "shared_head.norm.weight")
            self.mtp = w
        if dtype != np.float64:
            for w in self.layers + ([self.mtp] if self.mtp else []):
                for k in w:
                    w[k] = w[k].astype(dtype)
            self.embed = self.embed.astype(dtype)
            self.final_norm = self.final_norm.astype(dtype)
            self.lm_head = self.lm_head.astype(dtype)
        del ck  # drop the file buffers; everything needed is dequantized

    def _layer(self, ck, i, full, dense):
        """decoder layer i's weights (§2.2): indexer if full, dense MLP or MoE."""
        p = "model.layers.%d." % i
        w = {}
        w["in_norm"] = ck.tensor(p + "input_layernorm.weight")
        w["post_norm"] = ck.tensor(p + "post_attention_layernorm.weight")
        w["q_a"] = ck.linear(p + "self_attn.q_a_proj")
        w["q_a_norm"] = ck.tensor(p + "self_attn.q_a_layernorm.weight")
        w["q_b"] = ck.linear(p + "self_attn.q_b_proj")
        w["kv_a"] = ck.linear(p + "self_attn.kv_a_proj_with_mqa")
        w["kv_a_norm"] = ck.tensor(p + "self_attn.kv_a_layernorm.weight")
        w["kv_b"] = ck.linear(p + "self_attn.kv_b_proj")
        w["o"] = ck.linear(p + "self_attn.o_proj")
        if full:
            w["wq_b"] = ck.linear(p + "self_attn.indexer.wq_b")
            w["wk"] = ck.linear(p + "self_attn.indexer.wk")
            w["k_norm_w"] = ck.tensor(p + "self_attn.indexer.k_norm.weight")
            w["k_norm_b"] = ck.tensor(p + "self_attn.indexer.k_norm.bias")
            w["wproj"] = ck.linear(p + "self_attn.indexer.weights_proj")
        if dense:
            w["gate"] = ck.linear(p + "mlp.gate_proj")
            w["up"] = ck.linear(p + "mlp.up_proj")
            w["down"] = ck.linear(p + "mlp.down_proj")
        else:
            w["router"] = ck.linear(p + "mlp.gate")
            w["bias"] = ck.tensor(p + "mlp.gate.e_score_correction_bias")
            w["sh_gate"] = ck.linear(p + "mlp.shared_experts.gate_proj")
            w["sh_up"] = ck.linear(p + "mlp.shared_experts.up_proj")
            w["sh_down"] = ck.linear(p + "mlp.shared_experts.down_proj")
            w["ex_gate"] = np.stack([ck.linear(p + "mlp.experts.%d.gate_proj" % e) for e in range(self.E)])
            w["ex_up"] = np.stack([ck.linear(p + "mlp.experts.%d.up_proj" % e) for e in range(self.E)])
            w["ex_down"] = np.stack([ck.linear(p + "mlp.experts.%d.down_proj" % e) for e in range(self.E)])
        return w


def rmsnorm(x, w, eps):
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return w * (x * r)


def layernorm(x, w, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def rope(u, pos, theta):
    """interleaved (GPT-J) RoPE on the last axis of u (even length d), positions pos [S].
    u: [S, ..., d]."""
    d = u.shape[-1]
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # theta^(-2i/d)
    ang = pos.astype(np.float64)[:, None] * inv[None, :]  # [S, d/2]
    shape = (u.shape[0],) + (1,) * (u.ndim - 2) + (d // 2,)
    cos = np.cos(ang).reshape(shape).astype(u.dtype)
    sin = np.sin(ang).reshape(shape).astype(u.dtype)
    x0 = u[..., 0::2]
    x1 = u[..., 1::2]
    out = np.empty_like(u)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def swiglu(b, g, u, d):
    return (silu(b @ g.T) * (b @ u.T)) @ d.T


def topk_lower_wins(scores, k):
    """indices of the k largest entries of a 1-D array; equal values -> lower index first."""
    order = np.argsort(-scores, kind="stable")
    return order[:k]


class Stats:
    """closest calls in discrete decisions (for picking test inputs far from near-ties)."""

    def __init__(self):
        self.idx_gap = np.inf      # relative gap at the indexer top-k boundary (non-zero gaps)
        self.idx_zero_dot = np.inf  # smallest |q.k| among exact-zero-score keys at a boundary tie
        self.idx_ties = 0           # boundaries decided by the tie-break rule
        self.moe_gap = np.inf       # gap at the expert top-k boundary (bias-corrected scores)
        self.grp_gap = np.inf       # gap at the group top-k boundary
        self.moe_ties = 0

    def ok(self, tol=2e-5):
        return (self.idx_gap > tol and self.idx_zero_dot > tol and self.moe_gap > tol
                and self.grp_gap > tol)

    def __repr__(self):
        return ("idx_gap=%.3g idx_zero_dot=%.3g idx_ties=%d moe_gap=%.3g grp_gap=%.3g" %
                (self.idx_gap, self.idx_zero_dot, self.idx_ties, self.moe_gap, self.grp_gap))


def indexer_select(m, w, a, cq, pos, stats, opts):
    """-> boolean mask [S, S]: sel[t, s] = s in Sel(t)."""
    S = a.shape[0]
    r = m.rope
    qi = (cq @ w["wq_b"].T).reshape(S, m.IH, m.ID)
    qi = np.concatenate([rope(qi[..., :r], pos, m.theta), qi[..., r:]], axis=-1)
    ki = layernorm(a @ w["wk"].T, w["k_norm_w"], w["k_norm_b"], opts.get("eps_kn", 1e-6))
    ki = np.concatenate([rope(ki[:, :r], pos, m.theta), ki[:, r:]], axis=-1)
    hw = (a @ w["wproj"].T) * m.IH ** -0.5  # [S, IH]
    dots = (qi @ ki.T) * m.ID ** -0.5  # [t, h, s]
    I = np.matmul(hw[:, None, :], np.maximum(dots, 0.0))[:, 0, :]  # sum_h w[t,h] relu(dots)
    causal = np.tril(np.ones((S, S), bool))
    Im = np.where(causal, I, -np.inf)
    if opts.get("tie_high"):
        # reversed tie-break (used only to prove that the convention is exercised)
        order = S - 1 - np.argsort(-Im[:, ::-1], axis=1, kind="stable")
    else:
        order = np.argsort(-Im, axis=1, kind="stable")  # equal scores: lower position first
    k = np.minimum(m.topk, np.arange(S) + 1)  # per query
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(S)[None, :].repeat(S, 0), axis=1)
    sel = causal & (rank < k[:, None])
    # closeness of the boundary decisions
    for t in range(m.topk, S):  # rows where something is dropped
        kk = k[t]
        row = I[t, :t + 1]
        v_in, v_out = row[order[t, kk - 1]], row[order[t, kk]]
        scale = np.abs(row).max() + 1e-30
        gap = (v_in - v_out) / scale
        if gap == 0.0:
            stats.idx_ties += 1
            # an exact tie is only robust if the tied scores are exact zeros that stay zero
            # under rounding: all their per-head dots clearly negative
            if v_in == 0.0:
                tied = np.nonzero(row == 0.0)[0]
                dz = np.abs(dots[t][:, tied])[hw[t] != 0.0]
                stats.idx_zero_dot = min(stats.idx_zero_dot, dz.min() / (np.abs(dots[t]).max() + 1e-30))
            else:
                stats.idx_gap = 0.0
        else:
            stats.idx_gap = min(stats.idx_gap, gap)
    return sel


def mla_expanded(m, w, q_nope, q_pe, c, kpe, mask):
    S = c.shape[0]
    kv = (c @ w["kv_b"].T).reshape(S, m.NH, m.nope + m.vd)
    k_nope, v = kv[..., :m.nope], kv[..., m.nope:]
    scale = (m.nope + m.rope) ** -0.5
    logits = (np.matmul(q_nope.transpose(1, 0, 2), k_nope.transpose(1, 2, 0)) +
              (q_pe @ kpe.T).transpose(1, 0, 2)) * scale  # [h, t, s]
    logits = np.where(mask[None], logits, -np.inf)
    logits -= logits.max(axis=-1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=-1, keepdims=True)
    o = np.matmul(p, v.transpose(1, 0, 2)).transpose(1, 0, 2)  # [t, h, v]
    return o.reshape(S, m.NH * m.vd)


def mla_absorbed(m, w, q_nope, q_pe, c, kpe, mask):
    """§4 weight absorption: MQA over the 576-wide latent cache [c; k_pe]."""
    S = c.shape[0]
    Wkv = w["kv_b"].reshape(m.NH, m.nope + m.vd, m.kvr)
    W_UK, W_UV = Wkv[:, :m.nope], Wkv[:, m.nope:]
    q_lat = np.matmul(q_nope.transpose(1, 0, 2), W_UK)  # [h, t, kvr]
    scale = (m.nope + m.rope) ** -0.5  # stays 1/sqrt(qk_head_dim), not 1/sqrt(kvr+rope)
    logits = (q_lat @ c.T + (q_pe @ kpe.T).transpose(1, 0, 2)) * scale  # [h, t, s]
    logits = np.where(mask[None], logits, -np.inf)
    logits -= logits.max(axis=-1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=-1, keepdims=True)
    o_lat = p @ c  # [h, t, kvr]
    o = np.matmul(o_lat, W_UV.transpose(0, 2, 1)).transpose(1, 0, 2)  # [t, h, v]
    return o.reshape(S, m.NH * m.vd)


def moe(m, w, b, stats, opts):
    S = b.shape[0]
    z = b @ w["router"].T  # [S, E]
    s = sigmoid(z)
    bias = 0.0 if opts.get("no_bias") else w["bias"]
    s_sel = s + bias
    G = 1 if opts.get("no_group") else m.n_group
    TG = 1 if opts.get("no_group") else m.topk_group
    out = swiglu(b, w["sh_gate"], w["sh_up"], w["sh_down"])
    gsz = m.E // G
    sc = s_sel.copy()
    if G > 1:
        gs = sc.reshape(S, G, gsz)
        gscore = -np.sort(-gs, axis=2)[:, :, :2].sum(axis=2)  # sum of the 2 largest per group
        go = np.argsort(-gscore, axis=1, kind="stable")  # equal: lower group index first
        if TG < G:
            r = np.arange(S)
            stats.grp_gap = min(stats.grp_gap, (gscore[r, go[:, TG - 1]] - gscore[r, go[:, TG]]).min())
        keep = np.zeros((S, G), bool)
        np.put_along_axis(keep, go[:, :TG], True, axis=1)
        sc = np.where(np.repeat(keep, gsz, axis=1), sc, -np.inf)
    order = np.argsort(-sc, axis=1, kind="stable")  # equal: lower expert index first
    sel = order[:, :m.K]
    r = np.arange(S)
    nxt = sc[r, order[:, m.K]] if m.K < m.E else np.full(S, -np.inf)
    fin = np.isfinite(nxt)
    if fin.any():
        stats.moe_gap = min(stats.moe_gap, (sc[r, order[:, m.K - 1]] - nxt)[fin].min())
    g = np.take_along_axis(s, sel, axis=1)  # unbiased sigmoid scores
    if m.norm_topk:
        g = g / (g.sum(axis=1, keepdims=True) + 1e-20)
    g = g * m.rsf
    gate = np.zeros((S, m.E))
    np.put_along_axis(gate, sel, g, axis=1)
    for e in range(m.E):
        tok = np.nonzero(gate[:, e])[0]
        if len(tok):
            out[tok] += gate[tok, e, None] * swiglu(b[tok], w["ex_gate"][e], w["ex_up"][e], w["ex_down"][e])
    return out


def decoder_layer(m, w, x, full, dense_mlp, sel, dense=False, absorbed=False, stats=None, opts=None):
    """one decoder layer (§3.9, §3.10) on x [S, H] at positions 0..S-1 with its own cache:
    -> (x, sel). A full layer computes the selection, a shared one reuses sel (§3.6)."""
    S = x.shape[0]
    pos = np.arange(S)
    causal = np.tril(np.ones((S, S), bool))
    eps = opts.get("eps_rms", m.eps)
    eps_lat = opts.get("eps_lat", 1e-6)  # q_a_layernorm / kv_a_layernorm (spec pitfall 4)
    a = rmsnorm(x, w["in_norm"], eps)
    cq = rmsnorm(a @ w["q_a"].T, w["q_a_norm"], eps_lat)
    q = (cq @ w["q_b"].T).reshape(S, m.NH, m.nope + m.rope)
    q_nope = q[..., :m.nope]
    q_pe = rope(q[..., m.nope:], pos, m.theta)
    ckv = a @ w["kv_a"].T
    c = rmsnorm(ckv[:, :m.kvr], w["kv_a_norm"], eps_lat)
    kpe = rope(ckv[:, m.kvr:], pos, m.theta)
    if full and not dense:
        sel = indexer_select(m, w, a, cq, pos, stats, opts)
    if dense:
        mask = causal
    else:
        assert sel is not None, "a shared layer but no full layer precedes it"
        mask = causal & sel
    attn = (mla_absorbed if absorbed else mla_expanded)(m, w, q_nope, q_pe, c, kpe, mask)
    x = x + attn @ w["o"].T
    b = rmsnorm(x, w["post_norm"], eps)
    if dense_mlp:
        x = x + swiglu(b, w["gate"], w["up"], w["down"])
    else:
        x = x + moe(m, w, b, stats, opts)
    return x, sel


def forward(m, ids, dense=False, absorbed=False, stats=None, opts=None, return_hidden=False):
    """logits [S, vocab] (float64) of a full causal prefill of ids; with return_hidden also
    the final-normed hidden states h [S, H] (the lm_head's input) and the residual x before
    model.norm."""
    opts = opts or {}
    stats = stats if stats is not None else Stats()
    ids = np.asarray(ids, dtype=np.int64)
    x = m.embed[ids].copy()
    sel = None
    for i in range(m.L):
        x, sel = decoder_layer(m, m.layers[i], x, m.full[i], m.dense[i], sel, dense, absorbed, stats, opts)
    h = rmsnorm(x, m.final_norm, opts.get("eps_rms", m.eps))
    logits = h @ m.lm_head.T
    if return_hidden:
        return logits, h, x
    return logits


def mtp_forward(m, ids, dense=False, absorbed=False, stats=None, opts=None):
    """the MTP layer's logits [S-1, vocab] (§5.1) for ids [S]: row t predicts ids[t+2] from the
    main model's normed h_t and the embedding of ids[t+1], at position t (rows 0..S-2 form the
    MTP layer's own causal sequence: its own latents, its own indexer keys and selection).
    opts (only to show that the tests can see each choice): mtp_prenorm_h (h_t before
    model.norm), mtp_swap (hidden branch first), mtp_mask0 (zero the embedding at position 0),
    mtp_dense (the MTP layer attends to all its rows, no indexer)."""
    opts = opts or {}
    stats = stats if stats is not None else Stats()
    assert m.mtp is not None, "the checkpoint has no MTP layer"
    ids = np.asarray(ids, dtype=np.int64)
    _, h, x_pre = forward(m, ids, dense, absorbed, stats, opts, return_hidden=True)
    if opts.get("mtp_prenorm_h"):
        h = x_pre
    w = m.mtp
    eps = opts.get("eps_rms", m.eps)
    e = m.embed[ids[1:]].copy()
    if opts.get("mtp_mask0"):
        e[0] = 0.0
    parts = [rmsnorm(e, w["enorm"], eps), rmsnorm(h[:-1], w["hnorm"], eps)]  # embedding FIRST
    if opts.get("mtp_swap"):
        parts = parts[::-1]
    u = np.concatenate(parts, axis=1) @ w["eh_proj"].T
    u, _ = decoder_layer(m, w, u, True, False, None, dense or opts.get("mtp_dense", False), absorbed, stats, opts)
    return rmsnorm(u, w["head_norm"], eps) @ m.lm_head.T


def greedy(m, ids, n, dense=False, stats=None, margins=None):
    """greedy continuation of n tokens by full recompute; margins collects top1-top2 gaps."""
    seq = list(ids)
    out = []
    for _ in range(n):
        lg = forward(m, seq, dense=dense, stats=stats)[-1]
        nxt = int(np.argmax(lg))
        if margins is not None:
            srt = np.sort(lg)
            margins.append(srt[-1] - srt[-2])
        out.append(nxt)
        seq.append(nxt)
    return out


def _parse_ids(s):
    return [int(t) for t in s.split(",") if t.strip() != ""]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p1 = sub.add_parser("logits")
    p1.add_argument("dir")
    p1.add_argument("--ids", required=True)
    p1.add_argument("-o", dest="out", required=True)
    p1.add_argument("--dense", action="store_true")
    p1.add_argument("--absorbed", action="store_true")
    p1.add_argument("--mtp", action="store_true")
    p2 = sub.add_parser("greedy")
    p2.add_argument("dir")
    p2.add_argument("--ids", required=True)
    p2.add_argument("-n", type=int, default=32)
    p2.add_argument("--dense", action="store_true")
    a = ap.parse_args(argv)
    m = Model(a.dir)
    ids = _parse_ids(a.ids)
    if any(i < 0 or i >= m.V for i in ids):
        sys.exit("ref.py: token id out of range")
    st = Stats()
    if a.cmd == "logits" and a.mtp:
        if m.mtp is None or len(ids) < 2:
            sys.exit("ref.py: --mtp needs a checkpoint with an MTP layer and at least 2 ids")
        mtp_forward(m, ids, dense=a.dense, absorbed=a.absorbed, stats=st).astype("<f4").tofile(a.out)
    elif a.cmd == "logits":
        lg = forward(m, ids, dense=a.dense, absorbed=a.absorbed, stats=st)
        lg.astype("<f4").tofile(a.out)
    else:
        print(" ".join(str(t) for t in greedy(m, ids, a.n, dense=a.dense, stats=st)))
    if not st.ok():
        print("ref.py: warning: near-tie in a discrete decision (%r)" % st, file=sys.stderr)


if __name__ == "__main__":
    main()
