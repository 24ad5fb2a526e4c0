#!/usr/bin/python3
"""Reference inputs and outputs of a vision tower, for vlm_clip_embed.

    vlm_clip_compare.py pixels REFERENCE.safetensors IMAGE OUT.f32 [--qwen2vl]
        writes IMAGE's preprocessed pixels (IMAGE.pixel_values) as HEIGHT x
        WIDTH x 3 floats and prints "HEIGHT WIDTH". LLaVA stores [3, H, W];
        Qwen2-VL stores its processor's patch rows [patches, 3 * 2 * p * p]
        (2 equal frames, 2x2 merge groups in raster order), rebuilt here into
        the image.
    vlm_clip_compare.py compare REFERENCE.safetensors IMAGE EMBEDS.f32
        compares llama.cpp's embeddings with IMAGE.embeds and prints the
        largest absolute difference and the relative error (Frobenius).

Plain Python (no numpy): the tensors are small.
"""
import json
import math
import struct
import sys


def read_tensor(path, name):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        info = header[name]
        if info["dtype"] != "F32":
            sys.exit(f"{path}: {name} is {info['dtype']}, expected F32")
        begin, end = info["data_offsets"]
        f.seek(8 + n + begin)
        data = f.read(end - begin)
    return info["shape"], list(struct.unpack(f"<{len(data) // 4}f", data))


def pixels(ref, image, out, qwen):
    shape, v = read_tensor(ref, image + ".pixel_values")
    if not qwen:
        c, h, w = shape
        hwc = [v[(k * h + y) * w + x] for y in range(h) for x in range(w) for k in range(c)]
    else:
        _, grid = read_tensor(ref, image + ".grid_thw")
        t, gh, gw = (int(g) for g in grid)
        rows, width = shape
        p = int(round(math.sqrt(width // 6)))
        assert t == 1 and rows == gh * gw and width == 3 * 2 * p * p, (shape, grid)
        h, w = gh * p, gw * p
        hwc = [0.0] * (h * w * 3)
        r = 0
        for bh in range(gh // 2):
            for bw in range(gw // 2):
                for mh in range(2):
                    for mw in range(2):
                        row = v[r * width:(r + 1) * width]
                        r += 1
                        for k in range(3):
                            for py in range(p):
                                for px in range(p):
                                    y, x = (bh * 2 + mh) * p + py, (bw * 2 + mw) * p + px
                                    hwc[(y * w + x) * 3 + k] = row[(k * 2 + 0) * p * p + py * p + px]
    with open(out, "wb") as f:
        f.write(struct.pack(f"<{len(hwc)}f", *hwc))
    print(h, w)


def compare(ref, image, embeds):
    shape, want = read_tensor(ref, image + ".embeds")
    with open(embeds, "rb") as f:
        data = f.read()
    got = list(struct.unpack(f"<{len(data) // 4}f", data))
    if len(got) != len(want):
        sys.exit(f"{image}: llama.cpp gave {len(got)} values, the reference {shape} has {len(want)}")
    diff = max(abs(a - b) for a, b in zip(got, want))
    rel = math.sqrt(sum((a - b) ** 2 for a, b in zip(got, want)) / max(1e-30, sum(b * b for b in want)))
    print(f"{image}: {shape[0]} tokens x {shape[1]}, max |diff| {diff:.3g}, relative error {rel:.3g}")
    return rel


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "pixels":
        pixels(sys.argv[2], sys.argv[3], sys.argv[4], "--qwen2vl" in sys.argv[5:])
    elif len(sys.argv) == 5 and sys.argv[1] == "compare":
        rel = compare(sys.argv[2], sys.argv[3], sys.argv[4])
        sys.exit(0 if rel < 0.02 else 1)
    else:
        sys.exit(__doc__)
