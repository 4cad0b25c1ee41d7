#!/usr/bin/python3
"""Write a multi-GB BF16 checkpoint with GLM-5.2's real expert shapes, quickly, for measuring
`glm convert` throughput and peak memory by hand (not used by the CI tests except a small one):

    make_big_bf16.py OUT_DIR [--gb 2.5] [--shard-gb 1.0] [--vocab 0] [--fp8]

Layout: config.json with GLM-5.2 field names (hidden 6144, moe_intermediate 2048), MoE layers
of routed experts (gate/up [2048, 6144], down [6144, 2048]) plus one shared expert and a
router per layer, until about --gb GB; --vocab V also adds embed_tokens and lm_head [V, 6144]
(the largest tensors of the real model: V = 154880 gives 1.9 GB each). Shards of about
--shard-gb GB and model.safetensors.index.json. The forward pass cannot run on it (attention
is missing); only the converter reads it.

Values: one 32 MB block of BF16 normal(0, 1/sqrt(fan_in)) numbers, reused with a per-tensor
byte rotation and a random sign pattern, so that writing is disk-bound, not RNG-bound.
--fp8 writes the expert and shared-expert weights as F8_E4M3 (random non-NaN bytes) with F32
weight_scale_inv [ceil(out/128), ceil(in/128)], like zai-org's FP8 release (--gb counts BF16
bytes, so the files are about half as big).
"""
import argparse
import json
import os
import struct

import numpy as np

H, FI = 6144, 2048


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--gb", type=float, default=2.5)
    ap.add_argument("--shard-gb", type=float, default=1.0)
    ap.add_argument("--vocab", type=int, default=0)
    ap.add_argument("--fp8", action="store_true")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    base = (rng.standard_normal(16 << 20, dtype=np.float32) / np.sqrt(H)).view(np.uint32)
    base = ((base + 0x7FFF + ((base >> 16) & 1)) >> 16).astype(np.uint16)

    def data(n, k):
        """n BF16 values, different for each k."""
        reps = -(-n // base.size)
        out = np.tile(np.roll(base, 7919 * k), reps)[:n]
        return out ^ np.uint16(0x8000 * (k & 1))

    tensors = []  # (name, shape)
    if a.vocab:
        tensors += [("model.embed_tokens.weight", (a.vocab, H)), ("lm_head.weight", (a.vocab, H))]
    per_expert = 3 * FI * H * 2
    budget = a.gb * 1e9 - sum(2 * s[0] * s[1] for _, s in tensors)
    n_experts = max(1, int(budget // per_expert))
    layers, e = 0, 0
    while e < n_experts:
        p = "model.layers.%d.mlp." % layers
        tensors += [(p + "gate.weight", (256, H)), (p + "shared_experts.gate_proj.weight", (FI, H)),
                    (p + "shared_experts.up_proj.weight", (FI, H)), (p + "shared_experts.down_proj.weight", (H, FI))]
        for i in range(min(256, n_experts - e)):
            q = p + "experts.%d." % i
            tensors += [(q + "gate_proj.weight", (FI, H)), (q + "up_proj.weight", (FI, H)), (q + "down_proj.weight", (H, FI))]
        e += min(256, n_experts - e)
        layers += 1
    cfg = {"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "dtype": "bfloat16",
           "hidden_size": H, "intermediate_size": 12288, "num_hidden_layers": layers, "num_nextn_predict_layers": 0,
           "num_attention_heads": 64, "q_lora_rank": 2048, "kv_lora_rank": 512, "qk_nope_head_dim": 192,
           "qk_rope_head_dim": 64, "v_head_dim": 256, "index_topk": 2048, "index_n_heads": 32, "index_head_dim": 128,
           "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1, "moe_intermediate_size": FI,
           "first_k_dense_replace": 0, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
           "vocab_size": max(a.vocab, 1), "rms_norm_eps": 1e-5, "max_position_embeddings": 202752}
    os.makedirs(a.out_dir, exist_ok=True)
    with open(os.path.join(a.out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    # split into shards of about shard-gb
    shards, cur, size = [], [], 0
    for t in tensors:
        nb = 2 * t[1][0] * t[1][1]
        if cur and size + nb > a.shard_gb * 1e9:
            shards.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += nb
    shards.append(cur)
    wmap, total, k = {}, 0, 0
    for s, items in enumerate(shards):
        fn = "model-%05d-of-%05d.safetensors" % (s + 1, len(shards))
        header, off, blobs = {"__metadata__": {"format": "pt"}}, 0, []
        for name, shape in items:
            n = shape[0] * shape[1]
            if a.fp8 and "experts" in name:
                # E4M3 bytes: the low byte of the BF16 pattern, NaN codes (x111 1111) avoided
                b = (data(n, k) & 0xFF).astype(np.uint8)
                b[(b & 0x7F) == 0x7F] ^= 1
                sinv = np.full((-(-shape[0] // 128), -(-shape[1] // 128)), 1.0 / 448 / np.sqrt(shape[1]), "<f4")
                blobs += [(name, "F8_E4M3", shape, b), (name + "_scale_inv", "F32", sinv.shape, sinv)]
            else:
                blobs.append((name, "BF16", shape, data(n, k)))
            k += 1
        blobs.sort(key=lambda x: x[1] != "F32")  # F32 first: natural alignment
        for name, dt, shape, arr in blobs:
            header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + arr.nbytes]}
            off += arr.nbytes
            wmap[name] = fn
        hj = json.dumps(header, separators=(",", ":")).encode()
        hj += b" " * (-len(hj) % 8)
        with open(os.path.join(a.out_dir, fn), "wb") as f:
            f.write(struct.pack("<Q", len(hj)) + hj)
            for _, _, _, arr in blobs:
                f.write(arr.tobytes())
        total += off
    with open(os.path.join(a.out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2)
    print("%s: %d tensors, %d layers, %.2f GB in %d shards" % (a.out_dir, len(tensors), layers, total / 1e9, len(shards)))


if __name__ == "__main__":
    main()
