#!/usr/bin/python3
"""One row of scripts/bench/scheme_table.sh: size of a model (folder or .gguf),
bits per weight of its decoder Linears (every tensor of the q/k/v/o/gate/up/down
modules, and of a mixture-of-experts model's experts, except biases: codes,
scales, zero points, global scales; routers are not counted), and the two eval
JSON results.

usage: model_bits.py NAME MODEL PREFIX COMMAND [BASE_MODEL_DIR]"""
import json
import os
import re
import struct
import sys

LINEAR = re.compile(r"model\.layers\.\d+\.((self_attn|mlp)\.(q|k|v|o|gate|up|down)_proj"
                    r"|(block_sparse_moe|mlp)\.experts\.\d+\.(w1|w2|w3|gate_proj|up_proj|down_proj)"
                    r"|mlp\.shared_expert\.(gate|up|down)_proj)\.(?!bias$)")
GGUF_LINEAR = re.compile(r"blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down"
                         r"|ffn_gate_exps|ffn_up_exps|ffn_down_exps|ffn_gate_shexp|ffn_up_shexp|ffn_down_shexp)\.weight$")


def safetensors_linear_bytes(folder):
    total = 0
    for f in sorted(os.listdir(folder)):
        if not f.endswith(".safetensors"):
            continue
        with open(os.path.join(folder, f), "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        for name, info in header.items():
            if name != "__metadata__" and LINEAR.match(name):
                b, e = info["data_offsets"]
                total += e - b
    return total


def gguf_linear_bytes(path):
    with open(path, "rb") as f:
        data = f.read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("Q")
        s = data[pos:pos + n].decode()
        pos += n
        return s

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def value(t):
        nonlocal pos
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        pos += sizes[t]
        return None

    assert data[:4] == b"GGUF"
    pos = 4
    take("I")
    n_tensors, n_kv = take("Q"), take("Q")
    align = 32
    for _ in range(n_kv):
        k = string()
        t = take("I")
        v = value(t)
        if k == "general.alignment":
            align = struct.unpack_from("<I", data, pos - 4)[0]
    infos = []
    for _ in range(n_tensors):
        name = string()
        nd = take("I")
        for _ in range(nd):
            take("Q")
        take("I")
        infos.append((take("Q"), name))
    start = (pos + align - 1) // align * align
    infos.sort()
    total = 0
    for i, (off, name) in enumerate(infos):
        end = infos[i + 1][0] if i + 1 < len(infos) else len(data) - start
        if GGUF_LINEAR.match(name):
            total += end - off
    return total


def linear_params(fixture):
    c = json.load(open(os.path.join(fixture, "config.json")))
    h, ff, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    experts = c.get("num_local_experts") or c.get("num_experts") or 0
    if experts:  # every layer sparse (the bundled MoE fixture)
        ff = experts * (c.get("moe_intermediate_size") or ff) + c.get("shared_expert_intermediate_size", 0)
    return L * (h * q + 2 * h * kv + q * h + 3 * h * ff)


def main():
    name, model, prefix, cmd = sys.argv[1:5]
    if os.path.isdir(model):
        size = sum(os.path.getsize(os.path.join(model, f)) for f in os.listdir(model) if f.endswith(".safetensors"))
        lin = safetensors_linear_bytes(model)
    else:
        size = os.path.getsize(model)
        lin = gguf_linear_bytes(model)
    bpw = 8.0 * lin / linear_params(sys.argv[5] if len(sys.argv) > 5 else "tests/data/fixture-llama")
    cells = []
    for t in ("eval", "wiki"):
        p = f"{prefix}.{t}.json"
        if not os.path.exists(p):
            cells += ["-", "-"]
            continue
        j = json.load(open(p))
        cells += [f"{j['ppl']:.3f} ({j['ppl_delta']:+.3f})", f"{j['kld']['mean']:.6f}"]
    print(f"| {name} | {size:,} | {bpw:.2f} | " + " | ".join(cells) + f" | `{cmd}` |")


main()
