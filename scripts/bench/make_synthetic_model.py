#!/usr/bin/python3
"""Writes a random-weight Llama checkpoint with real model shapes, for benchmarks.

  make_synthetic_model.py OUT [--shape tinyllama-1.1b|llama-3-8b] [--seed 0]

tinyllama-1.1b: hidden 2048, intermediate 5632, 22 layers, 32 heads, 4 KV heads,
vocab 32000, context 2048, float16, untied lm_head (1.1B parameters, 2.2 GB).
llama-3-8b: hidden 4096, intermediate 14336, 32 layers, 32 heads, 8 KV heads,
vocab 128256, context 8192, RoPE theta 500000, float16, untied lm_head (8.0B
parameters, 16 GB), written as shards of at most 5 GB with
model.safetensors.index.json, as Hugging Face stores it.
Weights are N(0, 0.02) (norms 1.0), so throughput and memory are those of the
real model while the outputs are meaningless. The tokenizer is a placeholder
of the right size (special tokens, 256 byte tokens, then unique filler
pieces), enough for conversion and benchmarks, not for text.
Needs numpy (Debian's python3-numpy); nothing is downloaded.
"""
import argparse
import json
import os
import struct

import numpy as np

SHAPES = {
    "tinyllama-1.1b": dict(hidden=2048, inter=5632, layers=22, heads=32, kv=4, vocab=32000, ctx=2048, theta=10000.0),
    "llama-3-8b": dict(hidden=4096, inter=14336, layers=32, heads=32, kv=8, vocab=128256, ctx=8192, theta=500000.0),
}
SHARD_BYTES = 5 * 10**9


def tensor_list(s):
    d, f, v, hd = s["hidden"], s["inter"], s["vocab"], s["hidden"] // s["heads"]
    out = [("model.embed_tokens.weight", (v, d))]
    for i in range(s["layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (d,)), (p + "self_attn.q_proj.weight", (s["heads"] * hd, d)),
                (p + "self_attn.k_proj.weight", (s["kv"] * hd, d)), (p + "self_attn.v_proj.weight", (s["kv"] * hd, d)),
                (p + "self_attn.o_proj.weight", (d, s["heads"] * hd)), (p + "post_attention_layernorm.weight", (d,)),
                (p + "mlp.gate_proj.weight", (f, d)), (p + "mlp.up_proj.weight", (f, d)),
                (p + "mlp.down_proj.weight", (d, f))]
    return out + [("model.norm.weight", (d,)), ("lm_head.weight", (v, d))]


def write_safetensors(path, tensors, rng):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in tensors:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name, shape in tensors:
            if len(shape) == 1:
                f.write(np.ones(shape, np.float16).tobytes())
                continue
            rows = shape[0]
            for r0 in range(0, rows, 1024):  # bounded memory
                r1 = min(rows, r0 + 1024)
                block = rng.standard_normal((r1 - r0, shape[1]), dtype=np.float32) * 0.02
                f.write(block.astype(np.float16).tobytes())
    os.replace(tmp, path)


def write_tokenizer(out, vocab):
    space = "\u2581"
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"{space}t{i}" for i in range(vocab - len(tokens))]
    tj = {"version": "1.0", "truncation": None, "padding": None,
          "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                            "normalized": False, "special": True} for i, c in enumerate(tokens[:3])],
          "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": space},
                                                             {"type": "Replace", "pattern": {"String": " "}, "content": space}]},
          "pre_tokenizer": None, "post_processor": None,
          "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": space}, "content": " "},
                                                       {"type": "ByteFallback"}, {"type": "Fuse"}]},
          "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                    "vocab": {t: i for i, t in enumerate(tokens)}, "merges": []}}
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tj, f)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>", "tokenizer_class": "LlamaTokenizer"}, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--shape", default="tinyllama-1.1b", choices=sorted(SHAPES))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    s = SHAPES[a.shape]
    os.makedirs(a.out, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": s["hidden"],
           "intermediate_size": s["inter"], "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"],
           "num_key_value_heads": s["kv"], "vocab_size": s["vocab"], "max_position_embeddings": s["ctx"],
           "rms_norm_eps": 1e-5, "rope_theta": s["theta"], "tie_word_embeddings": False, "hidden_act": "silu",
           "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float16"}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    write_tokenizer(a.out, s["vocab"])
    rng = np.random.default_rng(a.seed)
    shards, cur, size = [], [], 0
    for t in tensor_list(s):
        n = int(np.prod(t[1])) * 2
        if cur and size + n > SHARD_BYTES:
            shards.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += n
    shards.append(cur)
    if len(shards) == 1:
        write_safetensors(os.path.join(a.out, "model.safetensors"), shards[0], rng)
        return
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(os.path.join(a.out, name), shard, rng)
        for t, shape in shard:
            weight_map[t] = name
            total += int(np.prod(shape)) * 2
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


if __name__ == "__main__":
    main()
