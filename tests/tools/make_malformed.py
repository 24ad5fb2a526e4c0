#!/usr/bin/env python3
"""Writes the malformed inputs of tests/cli/malformed.sh into a folder.

    make_malformed.py OUT_DIR FIXTURE_DIR

GGUF models (tiny llama: embedding 32, 4 heads of 8, 2 KV heads, 1 block)
with one hyper-parameter broken each; Hugging Face folders that link the
fixture's weights and tokenizer beside a broken config.json; imatrix files
with negative or non-finite values; text in UTF-16, with NUL bytes or in
Latin-1; files whose length fields claim far more than the file holds.
"""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fuzz"))
import make_corpus as mc  # noqa: E402  (the GGUF / safetensors builders of the seed corpus)


def write(path, data):
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(path, "wb") as f:
        f.write(data)


def main(out, fixture):
    os.makedirs(out, exist_ok=True)
    g = lambda name, **kw: write(os.path.join(out, name + ".gguf"), mc.gguf_model(**kw))  # noqa: E731
    g("ok")
    g("heads0", replace={"llama.attention.head_count": (mc.U32, 0)})
    g("blocks0", replace={"llama.block_count": (mc.U32, 0)}, tensor_layers=1)
    g("heads-string", replace={"llama.attention.head_count": (mc.STRING, "4")})
    g("rope0", replace={"llama.rope.dimension_count": (mc.U32, 0)})
    g("rope-partial", replace={"llama.rope.dimension_count": (mc.U32, 4)})
    g("eps-negative", replace={"llama.attention.layer_norm_rms_epsilon": (mc.F32, -1e-5)})
    g("eps-nan", replace={"llama.attention.layer_norm_rms_epsilon": (mc.F32, float("nan"))})
    g("theta0", replace={"llama.rope.freq_base": (mc.F32, 0.0)})
    g("heads-indivisible", replace={"llama.attention.head_count": (mc.U32, 3), "llama.attention.head_count_kv": (mc.U32, 3)})
    g("kv-indivisible", replace={"llama.attention.head_count_kv": (mc.U32, 3)})
    g("kv0", replace={"llama.attention.head_count_kv": (mc.U32, 0)})
    g("blocks-more", replace={"llama.block_count": (mc.U32, 2)}, tensor_layers=1)
    g("blocks-fewer", layers=2, replace={"llama.block_count": (mc.U32, 1)})
    g("embedding-huge", replace={"llama.embedding_length": (mc.U32, 1 << 30)})
    # An array that claims 2^60 elements, a string that claims 2^62 bytes.
    head = struct.pack("<IIQQ", 0x46554747, 3, 0, 1) + mc.gstr("tokenizer.ggml.tokens")
    write(os.path.join(out, "array-huge.gguf"), head + struct.pack("<IIQ", mc.ARRAY, mc.STRING, 1 << 60) + b"\0" * 64)
    write(os.path.join(out, "string-huge.gguf"), head + struct.pack("<IQ", mc.STRING, 1 << 62) + b"abc")

    # Hugging Face folders: the fixture's weights and tokenizer, a broken config.json.
    fixture = os.path.abspath(fixture)
    base = json.load(open(os.path.join(fixture, "config.json")))

    def hf(name, **change):
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        for f in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            dst = os.path.join(d, f)
            if not os.path.lexists(dst):
                os.symlink(os.path.join(fixture, f), dst)
        c = dict(base)
        for k, v in change.items():
            if v is None:
                c.pop(k, None)
            else:
                c[k] = v
        write(os.path.join(d, "config.json"), json.dumps(c, indent=1))

    hf("hf-ok")
    hf("hf-eps0", rms_norm_eps=0.0)
    hf("hf-theta-negative", rope_theta=-10000.0)
    hf("hf-hidden0", hidden_size=0)
    hf("hf-heads-indivisible", head_dim=None, num_attention_heads=7, num_key_value_heads=7)
    hf("hf-kv-indivisible", num_key_value_heads=3)
    hf("hf-layers-more", num_hidden_layers=5)
    hf("hf-layers-fewer", num_hidden_layers=3)
    hf("hf-llama3-equal", rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0,
                                        "high_freq_factor": 2.0, "original_max_position_embeddings": 1024})
    d = os.path.join(out, "hf-number-overflow")
    hf("hf-number-overflow")
    write(os.path.join(d, "config.json"), open(os.path.join(d, "config.json")).read().replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": 1e999'))

    # Importance matrices with a negative and a non-finite value.
    names = ["blk.0.attn_q.weight"]

    def dat(values):
        b = names[0].encode()
        return struct.pack("<ii", 1, len(b)) + b + struct.pack("<ii", 1, len(values)) + mc.f32(values)

    write(os.path.join(out, "imatrix-negative.dat"), dat([1.0, -2.0] + [1.0] * 254))
    write(os.path.join(out, "imatrix-huge-nval.dat"), struct.pack("<ii", 1, 1) + b"x" + struct.pack("<ii", 1, 0x7fffffff))
    kvs = [("general.type", mc.STRING, "imatrix"), ("imatrix.datasets", mc.ARRAY, (mc.STRING, ["x"])),
           ("imatrix.chunk_count", mc.U32, 1), ("imatrix.chunk_size", mc.U32, 512)]
    write(os.path.join(out, "imatrix-inf.gguf"), mc.gguf(kvs, [
        (names[0] + ".in_sum2", mc.GGML_F32, [4], mc.f32([1.0, float("inf"), 1.0, 1.0])),
        (names[0] + ".counts", mc.GGML_F32, [1], mc.f32([10.0]))]))

    # A safetensors header length of 2^60 (in a model folder) and a tokenizer.json id near 2^31.
    d = os.path.join(out, "hf-huge-header")
    os.makedirs(d, exist_ok=True)
    write(os.path.join(d, "config.json"), json.dumps(base))
    write(os.path.join(d, "model.safetensors"), struct.pack("<Q", 1 << 60) + b"{}")
    write(os.path.join(out, "huge-id.json"), json.dumps({"model": {"type": "BPE", "vocab": {"a": 2147483646}, "merges": []}}))

    # Text: UTF-16 with a BOM, UTF-16 without one (NUL bytes), binary, Latin-1.
    text = "The cat sat on the mat and looked at the door for a long time. " * 40
    write(os.path.join(out, "utf16.txt"), "\ufeff".encode("utf-16-le") + text.encode("utf-16-le"))
    write(os.path.join(out, "utf16-nobom.txt"), text.encode("utf-16-le"))
    write(os.path.join(out, "binary.txt"), bytes(range(256)) * 8)
    write(os.path.join(out, "latin1.txt"), (text + "caf\xe9 cr\xe8me ").encode("latin-1"))
    write(os.path.join(out, "bom.txt"), "\ufeff" + text)
    os.makedirs(os.path.join(out, "a-folder"), exist_ok=True)
    write(os.path.join(out, "stories.bin"), mc.llama2c_checkpoint(8, 16, 1, 2, 2, 260, 4))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
