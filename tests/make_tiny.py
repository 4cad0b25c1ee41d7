#!/usr/bin/python3
"""Write a tiny random GLM-5.2 (glm_moe_dsa) checkpoint in the exact Hugging Face layout.

    make_tiny.py OUT_DIR --variant {bf16,fp8,mxfp4,mixed} [--n-group 4 --topk-group 2] [--seed N]

Layout written:
  OUT_DIR/config.json                        real GLM-5.2 field names (sizes are tiny)
  OUT_DIR/model-00001-of-00002.safetensors   our own safetensors writer
  OUT_DIR/model-00002-of-00002.safetensors
  OUT_DIR/model.safetensors.index.json       {metadata: {total_size}, weight_map}

Variants (per-tensor formats, as the public releases do it):
  bf16   everything BF16, e_score_correction_bias F32.
  fp8    zai-org FP8 pattern: q_a, q_b, kv_a, kv_b, o_proj, indexer wq_b + wk, dense MLP,
         shared + routed experts (MTP layer included) are F8_E4M3 + weight_scale_inv F32
         [ceil(out/128), ceil(in/128)]; norms, router, weights_proj, k_norm, embed, lm_head,
         eh_proj BF16.
  mxfp4  AMD Quark pattern: routed + shared experts of the MoE layers 0..L-1 are U8 weight
         [out, in/2] (low nibble first) + U8 weight_scale [out, in/32] (E8M0); everything
         else BF16, MTP layer left BF16.
  mixed  MXFP4 routed/shared experts and dense MLP + FP8 block-scaled attention (incl. the
         indexer wq_b/wk and the MTP attention); MTP experts BF16.

Everything is deterministic from --seed. Only numpy is used (run with /usr/bin/python3).
"""
import argparse
import json
import math
import os
import struct

import numpy as np

# --------------------------------------------------------------------------------------
# number formats (encoders; the decoders live independently in ref.py)

def f32_to_bf16_bits(x):
    """float array -> uint16 BF16 bit patterns, round to nearest even."""
    f = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    u = f.view(np.uint32).astype(np.uint64)
    rnd = ((u >> 16) & 1) + 0x7FFF
    return ((u + rnd) >> 16).astype(np.uint16)


def bf16_bits_to_f64(b):
    return (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _e4m3_pos_values():
    vals = []
    for code in range(0x7F):  # 0x7F is NaN
        e, m = code >> 3, code & 7
        if e == 0:
            vals.append(m / 8.0 * 2.0 ** -6)
        else:
            vals.append((1 + m / 8.0) * 2.0 ** (e - 7))
    return np.array(vals)


E4M3_POS = _e4m3_pos_values()  # index = code, strictly increasing, max 448


def encode_e4m3(x):
    """float array (|x| <= 448 expected, saturates) -> uint8 E4M3FN codes, RNE."""
    x = np.asarray(x, dtype=np.float64)
    a = np.minimum(np.abs(x), 448.0)
    hi = np.searchsorted(E4M3_POS, a, side="left")
    hi = np.clip(hi, 0, len(E4M3_POS) - 1)
    lo = np.clip(hi - 1, 0, None)
    dlo = np.abs(a - E4M3_POS[lo])
    dhi = np.abs(E4M3_POS[hi] - a)
    code = np.where(dlo < dhi, lo, hi)
    tie = dlo == dhi
    code = np.where(tie & (lo % 2 == 0), lo, code)
    code = np.where(tie & (lo % 2 == 1), hi, code)
    sign = (x < 0) | ((x == 0) & np.signbit(x))
    return (code.astype(np.uint8) | np.where(sign, 0x80, 0).astype(np.uint8)).astype(np.uint8)


E2M1_POS = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def encode_e2m1(q):
    """scaled values -> 4-bit codes (sign bit 3), round to nearest, ties to even, saturate 6."""
    a = np.minimum(np.abs(q), 6.0)
    d = np.abs(a[..., None] - E2M1_POS)  # [..., 8]
    best = d.min(axis=-1, keepdims=True)
    cand = d == best
    # ties: prefer even mantissa (code & 1 == 0)
    even = cand & (np.arange(8) % 2 == 0)
    use = np.where(even.any(axis=-1, keepdims=True), even, cand)
    code = np.argmax(use, axis=-1).astype(np.uint8)
    return code | np.where(q < 0, 8, 0).astype(np.uint8)


def quant_mxfp4(w, rng):
    """w [out, in] float -> (packed U8 [out, in/2], scale U8 [out, in/32]); Quark 'even' mode."""
    out, inn = w.shape
    assert inn % 32 == 0
    blk = w.reshape(out, inn // 32, 32)
    amax = np.abs(blk).max(axis=-1).astype(np.float32)
    bits = amax.view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x00200000) & 0xFF800000).astype(np.uint32)
    rounded = bits.view(np.float32).astype(np.float64)
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.where(rounded > 0, rounded, 2.0 ** -127))) - 2
    e = np.clip(e, -127, 127)
    sbyte = (e + 127).astype(np.uint8)
    q = blk / (2.0 ** e)[..., None]
    codes = encode_e2m1(q).reshape(out, inn)
    # turn a few +0 codes into -0 (code 8): valid encodings the decoder must treat as 0
    zero = codes == 0
    flip = zero & (rng.random(codes.shape) < 0.3)
    codes = np.where(flip, 8, codes).astype(np.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, sbyte


def quant_fp8(w, rng):
    """w [out, in] -> (E4M3 codes [out, in], scale_inv F32 [ceil(out/128), ceil(in/128)])."""
    out, inn = w.shape
    ro, ci = -(-out // 128), -(-inn // 128)
    codes = np.zeros((out, inn), np.uint8)
    sinv = np.zeros((ro, ci), np.float32)
    for r in range(ro):
        for c in range(ci):
            blk = w[r * 128:(r + 1) * 128, c * 128:(c + 1) * 128]
            amax = float(np.abs(blk).max())
            # vary the scale a bit (not exactly amax/448) so scales are "random-looking";
            # a few values may saturate at 448, which is a legal encoding
            s = np.float32(amax / 448.0 * rng.uniform(0.9, 1.6))
            sinv[r, c] = s
            codes[r * 128:(r + 1) * 128, c * 128:(c + 1) * 128] = encode_e4m3(blk / float(s))
    return codes, sinv


# --------------------------------------------------------------------------------------
# safetensors writer

DT_SIZE = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "U8": 1, "F16": 2, "I32": 4, "I16": 2, "F64": 8}


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, dtype_str, shape, raw_bytes). Sorted like the reference writer
    (descending dtype alignment, then name) so every tensor is naturally aligned."""
    items = sorted(tensors, key=lambda t: (-DT_SIZE[t[1]], t[0]))
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    off = 0
    for name, dt, shape, raw in items:
        n = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
        assert n * DT_SIZE[dt] == len(raw), (name, dt, shape, len(raw))
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((-len(hj)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for _, _, _, raw in items:
            f.write(raw)
    return off


# --------------------------------------------------------------------------------------
# model definition


def indexer_types_from_formula(L, freq, offset):
    return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(L)]


def build_config(a):
    L = a.layers
    itypes = indexer_types_from_formula(L, a.topk_freq, a.skip_offset)
    nope, rope, v = 32, 16, 48
    cfg = {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "dtype": "bfloat16",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": 160,
        "initializer_range": 0.02,
        "intermediate_size": 192,
        "max_position_embeddings": 4096,
        "num_hidden_layers": L,
        "num_nextn_predict_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": 96,
        "kv_lora_rank": 64,
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "qk_head_dim": nope + rope,
        "v_head_dim": v,
        "head_dim": nope,  # the legacy, WRONG value (as in GLM-5.2: head_dim 192 = qk_nope)
        "rope_parameters": {"rope_theta": 5000.0, "rope_type": "default"},
        "rope_interleave": True,
        "indexer_rope_interleave": True,
        "index_topk": a.index_topk,
        "index_n_heads": a.index_heads,
        "index_head_dim": 32,
        "index_topk_freq": a.topk_freq,
        "index_skip_topk_offset": a.skip_offset,
        "index_topk_pattern": None,
        "index_share_for_mtp_iteration": True,
        "first_k_dense_replace": a.dense_layers,
        "mlp_layer_types": ["dense"] * a.dense_layers + ["sparse"] * (L - a.dense_layers),
        "moe_layer_freq": 1,
        "n_routed_experts": a.experts,
        "num_experts_per_tok": a.topk,
        "n_shared_experts": 1,
        "moe_intermediate_size": 64,
        "n_group": a.n_group,
        "topk_group": a.topk_group,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "rms_norm_eps": 1e-5,
        "vocab_size": 512,
        "tie_word_embeddings": False,
        "eos_token_id": [500, 507, 509],
        "pad_token_id": 500,
        "transformers_version": "5.0.0.dev0",
        "use_cache": True,
    }
    if not a.no_indexer_types:
        cfg["indexer_types"] = itypes
    if a.variant in ("fp8",):
        cfg["moe_router_dtype"] = "float32"
        cfg["quantization_config"] = {
            "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
            "modules_to_not_convert": ["model.embed_tokens", "lm_head"],
        }
    elif a.variant in ("mxfp4", "mixed"):
        fp4 = {
            "dtype": "fp4", "qscheme": "per_group", "group_size": 32, "ch_axis": -1,
            "scale_format": "e8m0", "scale_type": "float", "scale_calculation_mode": "even",
            "round_method": "half_even", "is_dynamic": False, "symmetric": None,
            "mx_element_dtype": None, "observer_cls": "PerBlockMXObserver", "block_size": None,
            "is_scale_quant": False,
        }
        fp4_in = dict(fp4, is_dynamic=True)
        if a.variant == "mxfp4":
            exclude = ["*self_attn*", "*mlp.gate", "*lm_head", "*mlp.gate_proj", "*mlp.up_proj",
                       "*mlp.down_proj", "*layers.%d.*" % L]
            layer_q = {}
        else:
            exclude = ["*lm_head", "*embed_tokens", "*eh_proj", "*mlp.gate",
                       "*self_attn.indexer.weights_proj", "*layers.%d.mlp*" % L]
            fp8w = {"dtype": "fp8_e4m3", "qscheme": "per_block", "block_size": [128, 128],
                    "is_dynamic": False, "scale_type": "float", "ch_axis": None}
            layer_q = {"*self_attn*": {"weight": fp8w, "input_tensors": None,
                                       "output_tensors": None, "bias": None}}
        cfg["quantization_config"] = {
            "quant_method": "quark",
            "global_quant_config": {"weight": fp4, "input_tensors": fp4_in, "output_tensors": None,
                                    "bias": None, "target_device": None},
            "exclude": exclude,
            "layer_quant_config": layer_q,
            "layer_type_quant_config": {},
            "export": {"weight_format": "real_quantized", "pack_method": "reorder",
                       "kv_cache_group": [], "min_kv_scale": 0.0, "weight_merge_groups": None},
            "kv_cache_quant_config": {},
            "quant_mode": "eager_mode",
            "version": "0.11",
        }
    return cfg, itypes


class Writer:
    def __init__(self, rng, variant):
        self.rng = rng
        self.variant = variant
        self.tensors = []  # (name, dtype, shape, raw)

    def add(self, name, dt, shape, raw):
        self.tensors.append((name, dt, tuple(int(s) for s in shape), bytes(raw)))

    def bf16(self, name, arr):
        arr = np.asarray(arr)
        self.add(name, "BF16", arr.shape, f32_to_bf16_bits(arr).tobytes())

    def f32(self, name, arr):
        arr = np.asarray(arr, dtype=np.float32)
        self.add(name, "F32", arr.shape, arr.astype("<f4").tobytes())

    def norm(self, name, n):
        self.bf16(name, 1.0 + 0.25 * self.rng.standard_normal(n))

    def linear(self, prefix, out, inn, fmt="bf16", gain=1.0):
        """gain: scalar or per-output-row array."""
        gain = np.asarray(gain, dtype=np.float64).reshape(-1, 1) if np.ndim(gain) else gain
        w = self.rng.standard_normal((out, inn)) * (gain / math.sqrt(inn))
        if fmt == "bf16":
            self.bf16(prefix + ".weight", w)
        elif fmt == "fp8":
            codes, sinv = quant_fp8(w, self.rng)
            self.add(prefix + ".weight", "F8_E4M3", (out, inn), codes.tobytes())
            self.f32(prefix + ".weight_scale_inv", sinv)
        elif fmt == "mxfp4":
            # vary row magnitudes a little so the E8M0 bytes spread over ~120..127
            w = w * (2.0 ** self.rng.uniform(-1.5, 1.0, size=(out, 1)))
            packed, sc = quant_mxfp4(w, self.rng)
            self.add(prefix + ".weight", "U8", (out, inn // 2), packed.tobytes())
            self.add(prefix + ".weight_scale", "U8", (out, inn // 32), sc.tobytes())
        else:
            raise ValueError(fmt)


def formats(variant, is_mtp):
    """-> dict: attn, idx (indexer wq_b/wk), dense (dense MLP), expert (routed+shared)."""
    if variant == "bf16":
        return dict(attn="bf16", idx="bf16", dense="bf16", expert="bf16")
    if variant == "fp8":
        return dict(attn="fp8", idx="fp8", dense="fp8", expert="fp8")
    if variant == "mxfp4":
        return dict(attn="bf16", idx="bf16", dense="bf16",
                    expert="bf16" if is_mtp else "mxfp4")
    if variant == "mixed":
        return dict(attn="fp8", idx="fp8", dense="mxfp4",
                    expert="bf16" if is_mtp else "mxfp4")
    raise ValueError(variant)


LAT_GAIN = 0.01


def build_tensors(cfg, itypes, a, rng):
    W = Writer(rng, a.variant)
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    NH = cfg["num_attention_heads"]
    qr, kvr = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    IH, ID = cfg["index_n_heads"], cfg["index_head_dim"]
    E, MI, DI = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["intermediate_size"]
    L = cfg["num_hidden_layers"]

    # small embeddings (like the real model's): the layer-0 input RMSNorm then depends on
    # rms_norm_eps, so an engine using the wrong eps fails the 1e-4 tolerance
    W.bf16("model.embed_tokens.weight", 0.006 * rng.standard_normal((V, H)))
    W.norm("model.norm.weight", H)
    W.linear("lm_head", V, H, "bf16", gain=2.0)

    for i in range(L + 1):
        mtp = i == L
        fm = formats(a.variant, mtp)
        p = "model.layers.%d." % i
        W.norm(p + "input_layernorm.weight", H)
        W.norm(p + "post_attention_layernorm.weight", H)
        # small q/kv latents (mean square ~1e-4) so that the q_a/kv_a RMSNorm eps (1e-6) and the
        # indexer LayerNorm eps (1e-6) visibly matter; the k_pe rows of kv_a stay O(1)
        W.linear(p + "self_attn.q_a_proj", qr, H, fm["attn"], gain=LAT_GAIN)
        W.norm(p + "self_attn.q_a_layernorm.weight", qr)
        W.linear(p + "self_attn.q_b_proj", NH * (nope + rope), qr, fm["attn"])
        W.linear(p + "self_attn.kv_a_proj_with_mqa", kvr + rope, H, fm["attn"],
                 gain=np.r_[np.full(kvr, LAT_GAIN), np.ones(rope)])
        W.norm(p + "self_attn.kv_a_layernorm.weight", kvr)
        W.linear(p + "self_attn.kv_b_proj", NH * (nope + vd), kvr, fm["attn"])
        W.linear(p + "self_attn.o_proj", H, NH * vd, fm["attn"])
        if mtp or itypes[i] == "full":
            W.linear(p + "self_attn.indexer.wq_b", IH * ID, qr, fm["idx"])
            W.linear(p + "self_attn.indexer.wk", ID, H, fm["idx"], gain=LAT_GAIN)
            W.norm(p + "self_attn.indexer.k_norm.weight", ID)
            kb = 0.3 * rng.standard_normal(ID)
            kb[rope:] += a.kbias  # push the no-rope key part off-centre => many ReLU zeros
            W.bf16(p + "self_attn.indexer.k_norm.bias", kb)
            W.linear(p + "self_attn.indexer.weights_proj", IH, H, "bf16")
        dense = (not mtp) and i < cfg["first_k_dense_replace"]
        if dense:
            for n in ("gate_proj", "up_proj"):
                W.linear(p + "mlp." + n, DI, H, fm["dense"])
            W.linear(p + "mlp.down_proj", H, DI, fm["dense"])
        else:
            W.linear(p + "mlp.gate", E, H, "bf16", gain=1.5)
            W.f32(p + "mlp.gate.e_score_correction_bias", rng.uniform(-0.25, 0.25, E))
            sp = p + "mlp.shared_experts."
            W.linear(sp + "gate_proj", MI * cfg["n_shared_experts"], H, fm["expert"])
            W.linear(sp + "up_proj", MI * cfg["n_shared_experts"], H, fm["expert"])
            W.linear(sp + "down_proj", H, MI * cfg["n_shared_experts"], fm["expert"])
            for e in range(E):
                ep = p + "mlp.experts.%d." % e
                W.linear(ep + "gate_proj", MI, H, fm["expert"])
                W.linear(ep + "up_proj", MI, H, fm["expert"])
                W.linear(ep + "down_proj", H, MI, fm["expert"])
        if mtp:
            W.norm(p + "enorm.weight", H)
            W.norm(p + "hnorm.weight", H)
            W.linear(p + "eh_proj", H, 2 * H, "bf16")
            W.norm(p + "shared_head.norm.weight", H)
    return W.tensors


def write_checkpoint(out_dir, cfg, tensors):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    # split in name order at half of the bytes (a weight and its scale may land in different
    # shards; that is legal)
    tensors = sorted(tensors, key=lambda t: t[0])
    total = sum(len(t[3]) for t in tensors)
    shard = [[], []]
    acc = 0
    for t in tensors:
        shard[0 if acc < total // 2 else 1].append(t)
        acc += len(t[3])
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    wmap = {}
    for k in range(2):
        write_safetensors(os.path.join(out_dir, names[k]), shard[k], {"format": "pt"})
        for t in shard[k]:
            wmap[t[0]] = names[k]
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(wmap.items()))}
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--variant", choices=["bf16", "fp8", "mxfp4", "mixed"], default="bf16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-group", dest="n_group", type=int, default=1)
    ap.add_argument("--topk-group", dest="topk_group", type=int, default=1)
    ap.add_argument("--experts", type=int, default=None, help="n_routed_experts (8, or 16 if n_group>1)")
    ap.add_argument("--topk", type=int, default=None, help="num_experts_per_tok (2, or 3 if n_group>1)")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--dense-layers", dest="dense_layers", type=int, default=2)
    ap.add_argument("--topk-freq", dest="topk_freq", type=int, default=3)
    ap.add_argument("--skip-offset", dest="skip_offset", type=int, default=2)
    ap.add_argument("--index-heads", dest="index_heads", type=int, default=4)
    ap.add_argument("--index-topk", dest="index_topk", type=int, default=8)
    ap.add_argument("--kbias", type=float, default=1.0,
                    help="offset added to the no-rope part of the indexer k_norm bias")
    ap.add_argument("--no-indexer-types", dest="no_indexer_types", action="store_true",
                    help="omit indexer_types from config.json (engines must use the formula)")
    a = ap.parse_args(argv)
    if a.experts is None:
        a.experts = 8 if a.n_group == 1 else 16
    if a.topk is None:
        a.topk = 2 if a.n_group == 1 else 3
    if a.experts % a.n_group or a.topk_group > a.n_group:
        ap.error("n_routed_experts must divide into n_group groups, topk_group <= n_group")
    return a


def make(out_dir, argv_extra=()):
    """Python entry point: make(out_dir, ['--variant', 'fp8', '--seed', '3'])."""
    a = parse_args([out_dir] + list(argv_extra))
    return _make(a)


def _make(a):
    rng = np.random.Generator(np.random.PCG64(a.seed))
    cfg, itypes = build_config(a)
    tensors = build_tensors(cfg, itypes, a, rng)
    write_checkpoint(a.out_dir, cfg, tensors)
    return cfg


def main():
    a = parse_args()
    _make(a)


if __name__ == "__main__":
    main()
