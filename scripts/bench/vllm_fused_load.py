#!/usr/bin/env python3
"""What vLLM does to an NVFP4 checkpoint's global scales when it fuses Linears.

vLLM loads q_proj/k_proj/v_proj as one qkv_proj and gate_proj/up_proj as one
gate_up_proj, and keeps a single global scale per fused Linear:

  compressed-tensors (CompressedTensorsW4A4Fp4 / W4A16Fp4): the max over the
      parts of weight_global_scale and of input_global_scale (multipliers,
      448 * 6 / amax);
  modelopt (ModelOptNvFp4LinearMethod): the max over the parts of
      weight_scale_2 and of input_scale (divisors, amax / (448 * 6)).

The e4m3 block scales of each part are used as stored, so a part quantized
against another global scale than the kept one is dequantized wrongly.

    vllm_fused_load.py IN_DIR OUT_DIR   copy IN_DIR with every fused set's
                                        global scales replaced by the kept one
    vllm_fused_load.py --check IN_DIR   exit 1 when some fused set has
                                        differing global scales

Prints one line per fused set whose scales differ. Standard library only.
"""
import json
import os
import shutil
import struct
import sys

SETS = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("mlp.gate_proj", "mlp.up_proj"))


def shard_files(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        return sorted(set(json.load(open(idx))["weight_map"].values()))
    return [f for f in sorted(os.listdir(d)) if f.endswith(".safetensors")]


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


def scale_names(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    method = cfg.get("quantization_config", {}).get("quant_method")
    if method == "compressed-tensors":
        return ("weight_global_scale", "input_global_scale")
    if method == "modelopt":
        return ("weight_scale_2", "input_scale")
    sys.exit(f"{d}: quant_method {method!r} is neither compressed-tensors nor modelopt")


def main(argv):
    check = argv[:1] == ["--check"]
    if check:
        argv = argv[1:]
    if len(argv) != (1 if check else 2):
        sys.exit(__doc__)
    src = argv[0]
    suffixes = scale_names(src)
    # name -> (file, absolute offset, value) for every F32 scalar global scale
    scalars = {}
    for fn in shard_files(src):
        path = os.path.join(src, fn)
        header, data0 = read_header(path)
        with open(path, "rb") as f:
            for name, info in header.items():
                if name == "__metadata__" or not name.endswith(suffixes):
                    continue
                if info["dtype"] != "F32" or info["shape"] not in ([], [1]):
                    continue
                off = data0 + info["data_offsets"][0]
                f.seek(off)
                scalars[name] = (fn, off, struct.unpack("<f", f.read(4))[0])
    patches = {}  # file -> [(offset, value)]
    layers = sorted({int(n.split(".")[2]) for n in scalars if n.startswith("model.layers.")})
    differing = 0
    for li in layers:
        for members in SETS:
            for suffix in suffixes:
                names = [f"model.layers.{li}.{m}.{suffix}" for m in members]
                if not all(n in scalars for n in names):
                    continue
                values = [scalars[n][2] for n in names]
                kept = max(values)
                if any(v != kept for v in values):
                    differing += 1
                    print(f"layer {li} {'/'.join(m.split('.')[1] for m in members)} {suffix}: "
                          + ", ".join(f"{v:.9g}" for v in values) + f" -> {kept:.9g}")
                for n in names:
                    fn, off, _ = scalars[n]
                    patches.setdefault(fn, []).append((off, kept))
    if check:
        return 1 if differing else 0
    dst = argv[1]
    if os.path.exists(dst):
        sys.exit(f"{dst} exists")
    shutil.copytree(src, dst)
    for fn, ps in patches.items():
        with open(os.path.join(dst, fn), "r+b") as f:
            for off, v in ps:
                f.seek(off)
                f.write(struct.pack("<f", v))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
