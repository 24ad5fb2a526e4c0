#!/usr/bin/python3
"""Writes a small random Llama checkpoint for the CLI tests (standard library only).

  make_checkpoint.py OUT [--shards N] [--dtype F16|BF16|F32] [--hf-cache ORG/NAME]

With --hf-cache, OUT is a hub cache root: the model goes to
OUT/models--ORG--NAME/snapshots/<commit>/ as symlinks into blobs/, with refs/main.
"""
import argparse
import hashlib
import json
import os
import random
import struct

DIMS = dict(hidden=64, inter=128, layers=2, heads=4, kv=2, vocab=256)


def tensors():
    d, f, v, h, kv = DIMS["hidden"], DIMS["inter"], DIMS["vocab"], DIMS["heads"], DIMS["kv"]
    hd = d // h
    out = [("model.embed_tokens.weight", [v, d])]
    for i in range(DIMS["layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", [d]), (p + "self_attn.q_proj.weight", [h * hd, d]),
                (p + "self_attn.k_proj.weight", [kv * hd, d]), (p + "self_attn.v_proj.weight", [kv * hd, d]),
                (p + "self_attn.o_proj.weight", [d, h * hd]), (p + "post_attention_layernorm.weight", [d]),
                (p + "mlp.gate_proj.weight", [f, d]), (p + "mlp.up_proj.weight", [f, d]),
                (p + "mlp.down_proj.weight", [d, f])]
    out += [("model.norm.weight", [d]), ("lm_head.weight", [v, d])]
    return out


def encode(values, dtype):
    if dtype == "F32":
        return struct.pack(f"<{len(values)}f", *values)
    if dtype == "F16":
        return struct.pack(f"<{len(values)}e", *values)
    raw = struct.pack(f"<{len(values)}f", *values)  # BF16: upper halves, rounded to nearest even
    out = bytearray()
    for (u,) in struct.iter_unpack("<I", raw):
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        out += struct.pack("<H", u)
    return bytes(out)


def write_file(path, items, dtype):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    size = {"F32": 4, "F16": 2, "BF16": 2}[dtype]
    for name, shape, vals in items:
        raw = encode(vals, dtype)
        assert len(raw) == size * len(vals)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--dtype", default="F16", choices=["F16", "BF16", "F32"])
    ap.add_argument("--hf-cache")
    a = ap.parse_args()
    rng = random.Random(7)
    items = []
    for name, shape in tensors():
        n = 1
        for s in shape:
            n *= s
        vals = [1.0] * n if name.endswith("norm.weight") else [rng.gauss(0, 0.02) for _ in range(n)]
        items.append((name, shape, vals))

    if a.hf_cache:
        org, name = a.hf_cache.split("/")
        repo = os.path.join(a.out, f"models--{org}--{name}")
        commit = hashlib.sha1(a.hf_cache.encode()).hexdigest()
        target = os.path.join(repo, "snapshots", commit)
        os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
        os.makedirs(os.path.join(repo, "blobs"), exist_ok=True)
        with open(os.path.join(repo, "refs", "main"), "w") as f:
            f.write(commit)
        staging = os.path.join(repo, "staging")
    else:
        target = staging = a.out
    os.makedirs(target, exist_ok=True)
    os.makedirs(staging, exist_ok=True)

    files = {}
    per = -(-len(items) // a.shards)
    for s in range(a.shards):
        chunk = items[s * per:(s + 1) * per]
        fname = "model.safetensors" if a.shards == 1 else f"model-{s + 1:05d}-of-{a.shards:05d}.safetensors"
        write_file(os.path.join(staging, fname), chunk, a.dtype)
        for n, _, _ in chunk:
            files[n] = fname
    if a.shards > 1:
        total = sum(len(encode(v, a.dtype)) for _, _, v in items)
        with open(os.path.join(staging, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(files.items()))}, f, indent=2)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": DIMS["hidden"],
              "intermediate_size": DIMS["inter"], "num_hidden_layers": DIMS["layers"],
              "num_attention_heads": DIMS["heads"], "num_key_value_heads": DIMS["kv"], "vocab_size": DIMS["vocab"],
              "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "tie_word_embeddings": False, "torch_dtype": {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}[a.dtype]}
    with open(os.path.join(staging, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    if a.hf_cache:  # move into blobs/ named by content hash, link from the snapshot
        for fname in sorted(os.listdir(staging)):
            src = os.path.join(staging, fname)
            digest = hashlib.sha256(open(src, "rb").read()).hexdigest()
            os.replace(src, os.path.join(repo, "blobs", digest))
            os.symlink(os.path.join("..", "..", "blobs", digest), os.path.join(target, fname))
        os.rmdir(staging)
    print(target)


if __name__ == "__main__":
    main()
