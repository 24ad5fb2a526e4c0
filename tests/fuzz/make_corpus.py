#!/usr/bin/env python3
"""Writes the generated seed inputs of the fuzz targets into tests/fuzz/corpus/.

Small valid files of every format the parsers read (GGUF models, vocab-only
GGUF and imatrix files, legacy .dat imatrix files, safetensors, llama2.c
checkpoints and tokenizers, tokenizer.json, a SentencePiece ModelProto,
config.json variants, calibration text and JSON lines) plus copies of the
shipped recipes ("seed-*"), and hand-made inputs for defects that were fixed
("regress-*": each crashed, aborted or broke an invariant before its fix).
Deterministic: running it again rewrites the same bytes. Inputs found by
fuzzing (minimised) live beside them as "crash-*" and are not touched.

    python3 tests/fuzz/make_corpus.py
"""
import json
import os
import shutil
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def floats(n, scale=0.02, offset=0.0):
    return [offset + scale * ((i * 7919) % 23 - 11) / 11.0 for i in range(n)]


def f16(values):
    return struct.pack("<%de" % len(values), *values)


def f32(values):
    return struct.pack("<%df" % len(values), *values)


# ---- GGUF -------------------------------------------------------------------

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
          U64: "<Q", I64: "<q", F64: "<d"}
GGML_F32, GGML_F16, GGML_Q8_0 = 0, 1, 8


def gstr(s):
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gvalue(t, v):
    if t == STRING:
        return gstr(v)
    if t == ARRAY:
        et, items = v
        out = struct.pack("<IQ", et, len(items))
        for x in items:
            out += gvalue(et, x)
        return out
    return struct.pack(SCALAR[t], v)


def q8_0(values):
    """ggml Q8_0 blocks of 32: f16 scale, 32 int8."""
    out = b""
    for b in range(0, len(values), 32):
        blk = values[b:b + 32]
        amax = max(abs(x) for x in blk) or 1.0
        d = amax / 127.0
        out += struct.pack("<e", d) + struct.pack("<32b", *[max(-127, min(127, round(x / d))) for x in blk])
    return out


def gguf(kvs, tensors, alignment=32):
    """kvs: [(key, type, value)]; tensors: [(name, ggml_type, ne list, bytes)]."""
    out = struct.pack("<IIQQ", 0x46554747, 3, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += gstr(k) + struct.pack("<I", t) + gvalue(t, v)
    offset = 0
    blobs = []
    for name, t, ne, data in tensors:
        out += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", t, offset)
        pad = (-len(data)) % alignment
        blobs.append(data + b"\0" * pad)
        offset += len(data) + pad
    out += b"\0" * ((-len(out)) % alignment)
    return out + b"".join(blobs)


def spm_vocab(extra):
    """A SentencePiece-style vocabulary: <unk>, <s>, </s>, 256 byte tokens, then `extra`."""
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + extra
    types = [2, 3, 3] + [6] * 256 + [1] * len(extra)
    scores = [0.0] * 259 + [-float(i) for i in range(len(extra))]
    return tokens, types, scores


def tokenizer_kvs_llama():
    tokens, types, scores = spm_vocab(["\u2581", "e", "t", "h", "\u2581t", "he", "\u2581the", "\u2581a", "s"])
    return [("tokenizer.ggml.model", STRING, "llama"),
            ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
            ("tokenizer.ggml.scores", ARRAY, (F32, scores)),
            ("tokenizer.ggml.token_type", ARRAY, (I32, types)),
            ("tokenizer.ggml.bos_token_id", U32, 1),
            ("tokenizer.ggml.eos_token_id", U32, 2),
            ("tokenizer.ggml.unknown_token_id", U32, 0),
            ("tokenizer.ggml.add_bos_token", BOOL, True)]


def gguf_model(arch="llama", hidden=32, heads=4, kv_heads=2, ff=32, vocab=32, layers=1, quant=False, extra_kvs=(),
               replace=None, tensor_layers=None):
    """A tiny model; `replace` maps metadata keys to (type, value) or None (removed), `tensor_layers`
    (default `layers`) is the number of blk.N tensor groups written."""
    head_dim = hidden // heads
    kvs = [("general.architecture", STRING, arch), ("general.name", STRING, "fuzz-seed"),
           ("general.file_type", U32, 7 if quant else 1),
           (arch + ".block_count", U32, layers), (arch + ".context_length", U32, 64),
           (arch + ".embedding_length", U32, hidden), (arch + ".feed_forward_length", U32, ff),
           (arch + ".attention.head_count", U32, heads), (arch + ".attention.head_count_kv", U32, kv_heads),
           (arch + ".rope.freq_base", F32, 10000.0), (arch + ".attention.layer_norm_rms_epsilon", F32, 1e-5)]
    if arch == "qwen3":
        kvs += [(arch + ".attention.key_length", U32, head_dim), (arch + ".attention.value_length", U32, head_dim)]
    if arch == "llama":
        kvs += [(arch + ".rope.dimension_count", U32, head_dim), (arch + ".vocab_size", U32, vocab)]
    kvs += list(extra_kvs)
    kvs += tokenizer_kvs_llama() if vocab == 268 else []
    for key, tv in (replace or {}).items():
        kvs = [kv for kv in kvs if kv[0] != key] + ([(key,) + tuple(tv)] if tv is not None else [])

    def mat(name, rows, cols):
        vals = floats(rows * cols)
        if quant and cols % 32 == 0:
            return (name, GGML_Q8_0, [cols, rows], q8_0(vals))
        return (name, GGML_F16, [cols, rows], f16(vals))

    def vec(name, n):
        return (name, GGML_F32, [n], f32(floats(n, 0.01, 1.0)))

    t = [mat("token_embd.weight", vocab, hidden)]
    for i in range(layers if tensor_layers is None else tensor_layers):
        p = "blk.%d." % i
        t += [vec(p + "attn_norm.weight", hidden), vec(p + "ffn_norm.weight", hidden)]
        if arch == "qwen3":
            t += [vec(p + "attn_q_norm.weight", head_dim), vec(p + "attn_k_norm.weight", head_dim)]
        t += [mat(p + "attn_q.weight", heads * head_dim, hidden), mat(p + "attn_k.weight", kv_heads * head_dim, hidden),
              mat(p + "attn_v.weight", kv_heads * head_dim, hidden), mat(p + "attn_output.weight", hidden, heads * head_dim)]
        if arch == "qwen2":
            t += [vec(p + "attn_q.bias", heads * head_dim), vec(p + "attn_k.bias", kv_heads * head_dim),
                  vec(p + "attn_v.bias", kv_heads * head_dim)]
        t += [mat(p + "ffn_gate.weight", ff, hidden), mat(p + "ffn_up.weight", ff, hidden), mat(p + "ffn_down.weight", hidden, ff)]
    t += [vec("output_norm.weight", hidden), mat("output.weight", vocab, hidden)]
    return gguf(kvs, t)


def gguf_seeds():
    put("gguf", "seed-llama-f16.gguf", gguf_model())
    put("gguf", "seed-llama-q8_0-vocab.gguf", gguf_model(quant=True, vocab=268))
    put("gguf", "seed-qwen2-bias.gguf", gguf_model(arch="qwen2", layers=2))
    put("gguf", "seed-qwen3-keylength.gguf", gguf_model(arch="qwen3", hidden=16, heads=2, kv_heads=1, ff=16, vocab=16))
    put("gguf", "seed-mistral-window.gguf",
        gguf_model(arch="mistral", hidden=16, heads=2, kv_heads=2, ff=16, vocab=16,
                   extra_kvs=[("mistral.attention.sliding_window", U32, 8),
                              ("mistral.rope.scaling.type", STRING, "linear"),
                              ("mistral.rope.scaling.factor", F32, 2.0)]))
    # A vocab-only file with a byte-level BPE tokenizer.
    byte_chars = [chr(c) for c in range(ord("!"), ord("~") + 1)] + ["\u0120", "\u010a"]
    tokens = byte_chars + ["\u0120t", "he", "\u0120the", "<|endoftext|>"]
    types = [1] * (len(tokens) - 1) + [3]
    put("gguf", "seed-vocab-gpt2.gguf", gguf(
        [("general.architecture", STRING, "llama"), ("tokenizer.ggml.model", STRING, "gpt2"),
         ("tokenizer.ggml.pre", STRING, "llama3"), ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
         ("tokenizer.ggml.token_type", ARRAY, (I32, types)),
         ("tokenizer.ggml.merges", ARRAY, (STRING, ["\u0120 t", "h e", "\u0120t he"])),
         ("tokenizer.ggml.bos_token_id", U32, len(tokens) - 1), ("tokenizer.ggml.eos_token_id", I32, -1)], []))
    # Every value type, arrays of each element type, and an explicit alignment.
    kvs = [("general.alignment", U32, 64)]
    samples = {U8: 200, I8: -5, U16: 60000, I16: -300, U32: 4000000000, I32: -70000, F32: 0.5, BOOL: True,
               U64: 2 ** 40, I64: -(2 ** 40), F64: 1e-300}
    for t, v in samples.items():
        kvs.append(("type.%d" % t, t, v))
        kvs.append(("array.%d" % t, ARRAY, (t, [v, v])))
    kvs += [("type.string", STRING, "caf\u00e9"), ("array.string", ARRAY, (STRING, ["a", "", "\u4e2d"]))]
    put("gguf", "seed-all-types.gguf", gguf(kvs, [("t", GGML_F32, [4, 2], f32(floats(8)))], alignment=64))


# ---- imatrix ------------------------------------------------------------------

def imatrix_seeds():
    entries = {"blk.0.attn_q.weight": [0.5, 1.0, 2.0, 0.25], "blk.0.ffn_down.weight": [3.0, 0.0, 1.5, 4.0, 0.5, 0.1, 2.0, 1.0]}
    kvs = [("general.type", STRING, "imatrix"), ("imatrix.datasets", ARRAY, (STRING, ["calibration.txt"])),
           ("imatrix.chunk_count", U32, 4), ("imatrix.chunk_size", U32, 512)]
    tensors = []
    for name in sorted(entries):
        v = entries[name]
        tensors.append((name + ".in_sum2", GGML_F32, [len(v)], f32(v)))
        tensors.append((name + ".counts", GGML_F32, [1], f32([512.0])))
    put("imatrix", "seed-imatrix.gguf", gguf(kvs, tensors))
    # llama.cpp's newer layout: 2-D in_sum2 [n, 1], counts [1, 1], plus NAME.in_sum.
    tensors = [("blk.0.attn_k.weight.in_sum", GGML_F32, [4, 1], f32([0.1, 0.2, -0.3, 0.4])),
               ("blk.0.attn_k.weight.in_sum2", GGML_F32, [4, 1], f32([1.0, 2.0, 3.0, 4.0])),
               ("blk.0.attn_k.weight.counts", GGML_F32, [1, 1], f32([100.0]))]
    put("imatrix", "seed-imatrix-2d.gguf", gguf(kvs, tensors))

    def dat(trailer):
        out = struct.pack("<i", len(entries))
        for name, v in entries.items():
            b = name.encode()
            out += struct.pack("<i", len(b)) + b + struct.pack("<ii", 8, len(v)) + f32(v)
        if trailer:
            ds = b"wiki.train.raw"
            out += struct.pack("<ii", 10, len(ds)) + ds
        return out

    put("imatrix", "seed-legacy.dat", dat(True))
    put("imatrix", "seed-legacy-no-trailer.dat", dat(False))


# ---- safetensors ------------------------------------------------------------

def safetensors(tensors, metadata=None, pad_to=8):
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    blobs = b""
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs += data
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % pad_to)
    return struct.pack("<Q", len(h)) + h + blobs


def safetensors_seeds():
    put("safetensors", "seed-f32-f16.safetensors", safetensors(
        [("a.weight", "F32", [2, 3], f32(floats(6))), ("b.bias", "F16", [3], f16(floats(3)))], {"format": "pt"}))
    put("safetensors", "seed-dtypes.safetensors", safetensors(
        [("bf16", "BF16", [2], b"\x80\x3f\x00\x40"), ("i8", "I8", [4], b"\x01\xff\x7f\x80"),
         ("u8", "U8", [2], b"\x00\xff"), ("f8", "F8_E4M3", [2], b"\x38\x7f"), ("e5", "F8_E5M2", [2], b"\x3c\x7c"),
         ("i32", "I32", [1], struct.pack("<i", -7)), ("i64", "I64", [1], struct.pack("<q", 7)),
         ("f64", "F64", [1], struct.pack("<d", 0.5)), ("bool", "BOOL", [2], b"\x00\x01"),
         ("i16", "I16", [1], b"\x01\x80"), ("u16", "U16", [1], b"\xff\xff"), ("u32", "U32", [1], b"\x01\0\0\0"),
         ("u64", "U64", [1], b"\x01" + b"\0" * 7)]))
    put("safetensors", "seed-empty-tensors.safetensors", safetensors(
        [("scalar", "F32", [], f32([1.5])), ("zero", "F32", [0, 4], b""), ("z2", "F16", [3, 0], b""),
         ("w", "F16", [2, 2], f16([1, 2, 3, 4]))]))
    put("safetensors", "seed-no-tensors.safetensors", safetensors([], {"note": "nothing here"}))


# ---- config.json -----------------------------------------------------------------

def config(**over):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8, "intermediate_size": 16,
         "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 16,
         "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
         "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}
    c.update(over)
    return json.dumps(c, indent=1)


def model_config_seeds():
    put("model_config", "seed-llama.json", config())
    put("model_config", "seed-llama3-rope.json", config(rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}))
    put("model_config", "seed-mistral-window.json", config(model_type="mistral", sliding_window=4, head_dim=4))
    put("model_config", "seed-qwen2.json", config(model_type="qwen2", use_sliding_window=False, max_window_layers=1))
    put("model_config", "seed-qwen3-moe.json", config(model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2,
                                                       moe_intermediate_size=8, eos_token_id=[2, 3]))
    put("model_config", "seed-compressed-tensors.json", config(quantization_config={
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 8}}},
        "ignore": ["lm_head"],
        "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}}))
    put("model_config", "seed-gptq.json", config(quantization_config={
        "quant_method": "gptq", "bits": 4, "group_size": 8, "desc_act": False, "sym": True}))
    put("model_config", "seed-awq.json", config(quantization_config={
        "quant_method": "awq", "bits": 4, "group_size": 8, "version": "gemm", "zero_point": True}))
    put("model_config", "seed-modelopt.json", config(quantization_config={
        "quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}))


# ---- tokenizers ----------------------------------------------------------------

def gpt2_bytes():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def tokenizer_json_seeds():
    alphabet = gpt2_bytes()
    merges = ["\u0120 t", "h e", "\u0120t he", "\u0120 w", "o r", "\u0120w or", "l d", "\u0120wor ld", "1 2"]
    vocab = {c: i for i, c in enumerate(alphabet)}
    for m in merges:
        vocab.setdefault(m.replace(" ", ""), len(vocab))
    byte_level = {
        "version": "1.0",
        "added_tokens": [{"id": len(vocab), "content": "<|endoftext|>", "special": True},
                         {"id": len(vocab) + 1, "content": "<|user|>", "special": False}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                                                   {"Sequence": {"id": "A", "type_id": 0}}]},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "vocab": vocab, "merges": merges}}
    put("tokenizer_json", "seed-byte-level.json", json.dumps(byte_level, ensure_ascii=False))
    split = dict(byte_level)
    split["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
        {"type": "Digits", "individual_digits": True},
        {"type": "Punctuation"},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    split["model"] = dict(byte_level["model"], merges=[m.split(" ") for m in merges])
    put("tokenizer_json", "seed-split-regex.json", json.dumps(split, ensure_ascii=False))

    tokens, _, _ = spm_vocab(["\u2581", "e", "t", "h", "\u2581t", "he", "\u2581the", "a", "\u2581a"])
    spm = {
        "version": "1.0",
        "added_tokens": [{"id": 0, "content": "<unk>", "special": True}, {"id": 1, "content": "<s>", "special": True},
                         {"id": 2, "content": "</s>", "special": True}],
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                                   {"Sequence": {"id": "A", "type_id": 0}}]},
        "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}]},
        "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": True, "fuse_unk": True,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": ["\u2581 t", "h e", "\u2581t he", "\u2581 a"]}}
    put("tokenizer_json", "seed-sentencepiece-style.json", json.dumps(spm, ensure_ascii=False))
    meta = dict(spm)
    meta["normalizer"] = None
    meta["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    put("tokenizer_json", "seed-metaspace.json", json.dumps(meta, ensure_ascii=False))


def pb_varint(v):
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def pb_field(num, wire, payload):
    key = pb_varint((num << 3) | wire)
    if wire == 0:
        return key + pb_varint(payload)
    if wire == 2:
        return key + pb_varint(len(payload)) + payload
    if wire == 5:
        return key + payload
    raise ValueError(wire)


def sentencepiece_seeds():
    """A SentencePiece ModelProto: BPE with byte fallback, and a unigram model."""
    def model(model_type, byte_fallback):
        tokens, types, scores = spm_vocab(["\u2581", "e", "t", "h", "\u2581t", "he", "\u2581the", "\u2581a", "s"])
        if not byte_fallback:
            keep = [i for i, t in enumerate(types) if t != 6]
            tokens = [tokens[i] for i in keep]
            types = [types[i] for i in keep]
            scores = [scores[i] for i in keep]
        out = b""
        for t, ty, s in zip(tokens, types, scores):
            out += pb_field(1, 2, pb_field(1, 2, t.encode()) + pb_field(2, 5, struct.pack("<f", s)) + pb_field(3, 0, ty))
        trainer = pb_field(3, 0, model_type) + pb_field(35, 0, 1 if byte_fallback else 0)
        trainer += pb_field(40, 0, 0) + pb_field(41, 0, 1) + pb_field(42, 0, 2) + pb_field(43, 0, (1 << 64) - 1)
        out += pb_field(2, 2, trainer)
        out += pb_field(3, 2, pb_field(1, 2, b"identity") + pb_field(3, 0, 1) + pb_field(4, 0, 0) + pb_field(5, 0, 1))
        return out

    put("sentencepiece", "seed-bpe-byte-fallback.model", model(2, True))
    put("sentencepiece", "seed-unigram.model", model(1, False))
    src = os.path.join(ROOT, "tests", "data", "fixture-llama", "tokenizer.model")
    shutil.copyfile(src, os.path.join(CORPUS, "sentencepiece", "seed-fixture.model"))


# ---- llama2.c ---------------------------------------------------------------

def llama2c_tokenizer(n):
    out = struct.pack("<i", 16)
    pieces = ["<unk>", "\n<s>\n", "\n</s>\n"] + ["<0x%02X>" % b for b in range(256)]
    pieces += ["t%d" % i for i in range(len(pieces), n)]
    for i, p in enumerate(pieces):
        b = p.encode()
        out += struct.pack("<fi", -float(i) if i >= 259 else 0.0, len(b)) + b
    return out


def llama2c_checkpoint(dim, hidden, layers, heads, kv_heads, vocab, seq_len, shared=True):
    hd = dim // heads
    kv = hd * kv_heads
    n = vocab * dim + layers * (dim + dim * dim + 2 * kv * dim + dim * dim) + layers * (dim + 3 * hidden * dim) + dim
    n += seq_len * hd + (0 if shared else vocab * dim)
    return struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab if shared else -vocab, seq_len) + f32(floats(n))


def llama2c_seeds():
    put("llama2c", "seed-shared.bin", llama2c_checkpoint(8, 16, 1, 2, 2, 260, 4))
    put("llama2c", "seed-gqa-unshared.bin", llama2c_checkpoint(8, 8, 2, 2, 1, 259, 2, shared=False))
    put("llama2c_tokenizer", "seed-259.bin", llama2c_tokenizer(259))
    put("llama2c_tokenizer", "seed-270.bin", llama2c_tokenizer(270))


# ---- recipes and calibration text -------------------------------------------------

def recipe_seeds():
    for folder, prefix in ((os.path.join(ROOT, "recipes"), "seed-"), (os.path.join(ROOT, "tests", "data", "recipes"), "seed-test-")):
        for name in sorted(os.listdir(folder)):
            if name.endswith(".yaml"):
                shutil.copyfile(os.path.join(folder, name), os.path.join(CORPUS, "recipe", prefix + name))
    put("recipe", "seed-card.md", "---\nquant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n"
        "      targets: [Linear]\n      ignore: [lm_head, 're:.*gate$']\n      scheme: W4A16\n---\n# A model card\n")


def calibration_seeds():
    put("calibration", "seed.jsonl", "\n".join(json.dumps({"text": t}) for t in [
        "the cat sat on the mat", "a text with \u00e9 and \u4e2d", "tea", "", "the the the the the the the the the"]) + "\n")
    put("calibration", "seed-fields.jsonl", '{"text": "the first line", "id": 1}\n\n{"text": "a second one here", "meta": {"a": [1, 2]}}\n')
    put("calibration", "seed.txt", "the theme of the text: tea at three.\nthe end\n" * 3)
    put("calibration", "seed-bom.txt", "\ufeffthe text starts with a byte-order mark, then the words")
    put("calibration", "seed-latin1.txt", "caf\xe9 cr\xe8me br\xfbl\xe9e at the th\xe9\xe2tre".encode("latin-1"))


def regress_seeds():
    """Inputs of defects fixed alongside the fuzz targets."""
    # head_count 0: a division by zero (SIGFPE) in the GGUF loader.
    put("gguf", "regress-head-count-0.gguf", gguf_model(replace={"llama.attention.head_count": (U32, 0)}))
    # Dimensions stored as strings: inspect's report read them as integers (json type_error).
    put("gguf", "regress-string-dims.gguf", gguf_model(replace={"llama.attention.head_count": (STRING, "4"),
                                                                "llama.block_count": (STRING, "1")}))
    # A negative epsilon and a partial RoPE: loaded without complaint before.
    put("gguf", "regress-eps-negative.gguf", gguf_model(replace={"llama.attention.layer_norm_rms_epsilon": (F32, -1e-5)}))
    put("gguf", "regress-rope-partial.gguf", gguf_model(replace={"llama.rope.dimension_count": (U32, 4)}))
    # A number out of double range: nlohmann's out_of_range escaped load_model_config.
    put("model_config", "regress-number-overflow.json", config().replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": 1e999'))
    # More layers declared than present, and the reverse.
    put("model_config", "regress-layers-more.json", config(num_hidden_layers=2))
    # A quantization_config value of the wrong JSON type (type_error from a reader).
    put("model_config", "regress-qcfg-type.json", config(quantization_config={
        "quant_method": "compressed-tensors", "format": 7, "config_groups": []}))
    # tokenizer.json values of the wrong JSON type (type_error).
    put("tokenizer_json", "regress-special-token-type.json", json.dumps({
        "model": {"type": "BPE", "byte_fallback": True, "vocab": {"<s>": 0, "a": 1}, "merges": []},
        "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": 5}, {"SpecialToken": {"id": 3}}]}}))
    put("tokenizer_json", "regress-special-flag-type.json", json.dumps({
        "added_tokens": [{"id": 1, "content": "<s>", "special": "yes"}],
        "model": {"type": "BPE", "byte_fallback": True, "vocab": {"a": 0}, "merges": []}}))
    # A pre-tokenizer regex that matches empty at the end of a piece.
    byte_level = json.loads(open(os.path.join(CORPUS, "tokenizer_json", "seed-byte-level.json")).read())
    byte_level["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "$|\\p{L}+"}, "behavior": "Isolated"},
        {"type": "ByteLevel", "use_regex": False}]}
    put("tokenizer_json", "regress-empty-match-at-end.json", json.dumps(byte_level, ensure_ascii=False))
    # Negative importance values: accepted before, importance() then negative.
    b = b"blk.0.ffn_up.weight"
    put("imatrix", "regress-negative.dat", struct.pack("<ii", 1, len(b)) + b + struct.pack("<ii", 4, 2) + f32([1.0, -3.0]))
    # Text checks: UTF-16 with a BOM, NUL bytes, invalid UTF-8.
    put("calibration", "regress-utf16.txt", "\ufeffthe text".encode("utf-16-le"))
    put("calibration", "regress-nul.jsonl", b'{"text": "a"}\n\0\n')


def main():
    os.makedirs(CORPUS, exist_ok=True)
    os.makedirs(os.path.join(CORPUS, "recipe"), exist_ok=True)
    gguf_seeds()
    imatrix_seeds()
    safetensors_seeds()
    model_config_seeds()
    tokenizer_json_seeds()
    os.makedirs(os.path.join(CORPUS, "sentencepiece"), exist_ok=True)
    sentencepiece_seeds()
    llama2c_seeds()
    recipe_seeds()
    calibration_seeds()
    regress_seeds()
    return 0


if __name__ == "__main__":
    sys.exit(main())
