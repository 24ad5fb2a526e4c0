#!/usr/bin/python3
"""Compares the tensors of two GGUF files byte for byte.

usage: gguf_tensor_diff.py A.gguf B.gguf

Prints "N identical, M differ" (and the first differing tensors with their
types) and exits 0 when every tensor of A exists in B with the same type,
shape and data bytes, 1 otherwise. Metadata and tensor order are not
compared: two writers may order keys or pad differently and still store the
same weights.
"""
import mmap
import struct
import sys

# ggml type -> (elements per block, bytes per block)
BLOCK = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 36),
         10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292), 30: (1, 2)}
TYPE_NAME = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K",
             11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 30: "BF16"}
SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class Reader:
    def __init__(self, buf, path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            sys.exit(f"{self.path}: truncated at byte {self.pos}")
        v = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return v[0] if len(v) == 1 else v

    def string(self):
        n = self.take("Q")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", "replace")
        self.pos += n
        return s

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("I"), self.take("Q")
            return [self.value(et) for _ in range(n)]
        if t not in SCALAR:
            sys.exit(f"{self.path}: unknown metadata value type {t} at byte {self.pos}")
        return self.take(SCALAR[t])


def tensors(path):
    return read_gguf(path)[1]


def read_gguf(path):
    """(metadata dict, {name: (ggml type, ne, data bytes)})."""
    f = open(path, "rb")
    buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    r = Reader(buf, path)
    if bytes(buf[:4]) != b"GGUF":
        sys.exit(f"{path}: not a GGUF file")
    r.pos = 4
    version, n_tensors, n_kv = r.take("I"), r.take("Q"), r.take("Q")
    if version < 2:
        sys.exit(f"{path}: GGUF version {version} is not supported")
    alignment = 32
    kv = {}
    for _ in range(n_kv):
        key, t = r.string(), r.take("I")
        v = r.value(t)
        kv[key] = v
        if key == "general.alignment":
            alignment = v
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("Q") for _ in range(r.take("I"))]
        t, off = r.take("I"), r.take("Q")
        infos.append((name, dims, t, off))
    data = (r.pos + alignment - 1) // alignment * alignment
    out = {}
    for name, dims, t, off in infos:
        if t not in BLOCK:
            sys.exit(f"{path}: tensor {name} has ggml type {t}, unknown here")
        n = 1
        for d in dims:
            n *= d
        bs, ts = BLOCK[t]
        size = n // bs * ts
        if data + off + size > len(buf):
            sys.exit(f"{path}: tensor {name} runs past the end of the file")
        out[name] = (t, dims, buf[data + off:data + off + size])
    return kv, out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
    same, differ = 0, []
    for name, (t, dims, data) in a.items():
        other = b.get(name)
        if other is None:
            differ.append(f"{name}: missing in {sys.argv[2]}")
        elif other[0] != t or other[1] != dims:
            differ.append(f"{name}: {TYPE_NAME[t]} {dims} vs {TYPE_NAME[other[0]]} {other[1]}")
        elif other[2] != data:
            differ.append(f"{name}: {TYPE_NAME[t]} data differs")
        else:
            same += 1
    extra = [n for n in b if n not in a]
    differ += [f"{n}: missing in {sys.argv[1]}" for n in extra]
    print(f"{same} identical, {len(differ)} differ")
    for line in differ[:10]:
        print("  " + line)
    sys.exit(1 if differ or same == 0 else 0)


if __name__ == "__main__":
    main()
