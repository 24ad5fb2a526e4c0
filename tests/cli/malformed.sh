#!/usr/bin/env bash
# Malformed models and inputs: one clear error line and exit 3 (invalid input)
# or 4 (unsupported), never a crash, an "internal error" or a library's
# exception text. The files come from tests/tools/make_malformed.py.
source "$(dirname "$0")/lib.sh"

fx="$SRC/tests/data/fixture-llama"
m="$WORK/m"
$PY "$SRC/tests/tools/make_malformed.py" "$m" "$fx" || { fail "make_malformed.py"; finish; }

# ---- GGUF hyper-parameters (checked when the runtime loads the file)
"$QF" -q bench "$m/ok.gguf" -p 4 -n 1 >/dev/null 2>"$WORK/ok.err" && ok "the unbroken GGUF runs" || fail "ok.gguf: $(cat "$WORK/ok.err")"
gguf() { expect_exit "$1" "$2" -- "$QF" -q bench "$m/$3.gguf" -p 4 -n 1; }
gguf 3 "heads0.gguf: 'llama.attention.head_count' is 0, must be a positive integer" heads0
gguf 3 "'llama.block_count' is 0" blocks0
gguf 3 "'llama.attention.head_count_kv' is 0" kv0
gguf 3 "metadata 'llama.attention.head_count': expected UINT32, got STRING" heads-string
gguf 3 "'llama.rope.dimension_count' is 0" rope0
gguf 4 "rope.dimension_count' 4 is below the head size 8 \(partial RoPE\)" rope-partial
gguf 3 "'llama.attention.layer_norm_rms_epsilon' is -1e-05, must be a positive finite number" eps-negative
gguf 3 "'llama.attention.layer_norm_rms_epsilon' is nan" eps-nan
gguf 3 "'llama.rope.freq_base' is 0" theta0
gguf 3 "'llama.embedding_length' 32 is not divisible by 'llama.attention.head_count' 3" heads-indivisible
gguf 3 "'llama.attention.head_count' 4 is not a multiple of 'llama.attention.head_count_kv' 3" kv-indivisible
gguf 3 "'llama.block_count' is 2, but there is no tensor for layer 1 \('blk.1.\*'\)" blocks-more
gguf 3 "tensor 'blk.1.attn_norm.weight' belongs to layer 1, but 'llama.block_count' is 1" blocks-fewer
gguf 3 "'llama.embedding_length' is 1073741824, above the limit" embedding-huge
expect_exit 3 "array-huge.gguf: metadata 'tokenizer.ggml.tokens' count 1152921504606846976 cannot fit" -- "$QF" inspect "$m/array-huge.gguf"
expect_exit 3 "string-huge.gguf: .*exceeds the 1 GiB limit" -- "$QF" inspect "$m/string-huge.gguf"
"$QF" inspect "$m/heads-string.gguf" >"$WORK/i.txt" 2>&1 && grep -q 'llama.attention.head_count = "4"' "$WORK/i.txt" \
  && ok "inspect shows a GGUF whose head_count is a string" || fail "inspect heads-string.gguf: $(head -5 "$WORK/i.txt")"

# ---- config.json (checked when it is parsed; the layer count against the tensors when loaded)
"$QF" -q bench "$m/hf-ok" -p 4 -n 1 >/dev/null 2>"$WORK/ok.err" && ok "the unbroken HF folder runs" || fail "hf-ok: $(cat "$WORK/ok.err")"
hf() { expect_exit "$1" "$2" -- "$QF" inspect "$m/$3"; }
hf 3 "hf-eps0/config.json: 'rms_norm_eps' is 0, must be a positive finite number" hf-eps0
hf 3 "'rope_theta' is -10000" hf-theta-negative
hf 3 "key 'hidden_size' must be a positive integer, got 0" hf-hidden0
hf 3 "'hidden_size' 256 is not divisible by 'num_attention_heads' 7, and no 'head_dim' is given" hf-heads-indivisible
hf 3 "'num_attention_heads' 8 is not a multiple of 'num_key_value_heads' 3" hf-kv-indivisible
hf 3 "'rope_scaling.high_freq_factor' must be greater than 'rope_scaling.low_freq_factor'" hf-llama3-equal
hf 3 "hf-number-overflow/config.json: not valid JSON" hf-number-overflow
hf 3 "model.safetensors: header length 1152921504606846976 exceeds the limit" hf-huge-header
expect_exit 3 "config.json: 'num_hidden_layers' is 5, but there is no tensor for layer 4 \('model.layers.4.\*'\)" \
  -- "$QF" -q bench "$m/hf-layers-more" -p 4 -n 1
expect_exit 3 "config.json: tensor 'model.layers.3.[a-z_.]+' belongs to layer 3, but 'num_hidden_layers' is 3" \
  -- "$QF" -q bench "$m/hf-layers-fewer" -p 4 -n 1
expect_exit 3 "huge-id.json: token ids are not contiguous" -- "$QF" tokenize "$m/huge-id.json" --text hi

# ---- a checkpoint contradicting its config: convert refuses it as the loader does, writing nothing
mx="$WORK/mixtral-transposed-router"
mkdir -p "$mx"
cp "$SRC/tests/data/fixture-mixtral/"{config.json,tokenizer.json,tokenizer.model,tokenizer_config.json,special_tokens_map.json} "$mx/"
$PY - "$SRC/tests/data/fixture-mixtral/model.safetensors" "$mx/model.safetensors" <<'PYEOF'
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
with open(src, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    data = f.read()
t = header["model.layers.1.block_sparse_moe.gate.weight"]
t["shape"] = t["shape"][::-1]  # [256, 8]: the same bytes, transposed
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(dst, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + data)
PYEOF
router="tensor 'model.layers.1.block_sparse_moe.gate.weight' has shape \[256, 8\], expected \[8, 256\]"
expect_exit 3 "$router" -- "$QF" -q convert "$mx" --to gguf --type F16 -o "$WORK/mx.gguf"
[[ ! -e "$WORK/mx.gguf" ]] && ok "no GGUF after the refused conversion" || fail "convert left $WORK/mx.gguf"
expect_exit 3 "$router" -- "$QF" -q bench "$mx" -p 4 -n 1
# An empty tensor type is a usage error, not "no override".
expect_exit 2 "--output-tensor-type: unknown tensor type ''" \
  -- "$QF" -q convert "$fx" --to gguf --type Q8_0 --output-tensor-type "" -o "$WORK/e.gguf"
expect_exit 2 "--token-embedding-type: unknown tensor type ''" \
  -- "$QF" -q convert "$fx" --to gguf --type Q8_0 --token-embedding-type "" -o "$WORK/e.gguf"
expect_exit 2 "apply to --to gguf" -- "$QF" -q convert "$m/stories.bin" --to hf --output-tensor-type "" -o "$WORK/h"
[[ ! -e "$WORK/e.gguf" && ! -e "$WORK/h" ]] && ok "no output after the usage errors" || fail "an output was left behind"

# ---- a folder where a file is expected
dir="$m/a-folder"
expect_exit 3 "a-folder: is a folder, not a regular file" -- "$QF" -q eval "$fx" --text "$dir"
expect_exit 3 "a-folder: is a folder, not a regular file" -- "$QF" -q imatrix "$fx" --text "$dir" -o "$WORK/im.gguf"
expect_exit 3 "a-folder: is a folder, not a regular file" -- "$QF" -q quantize "$fx" --recipe "$dir" -o "$WORK/q1"
expect_exit 3 "a-folder: is a folder, not a regular file" \
  -- "$QF" -q quantize "$fx" --recipe "$SRC/tests/data/recipes/w4-gptq.yaml" --calib "$dir" -o "$WORK/q2"
expect_exit 3 "a-folder: is a folder, not a regular file" \
  -- "$QF" -q convert "$fx" --to gguf --type Q8_0 --imatrix "$dir" -o "$WORK/c.gguf"
expect_exit 3 "a-folder: is a folder, not a regular file" \
  -- "$QF" -q convert "$m/stories.bin" --tokenizer "$dir" --to hf -o "$WORK/h"
expect_exit 3 "a-folder: is a folder, not a regular file" -- "$QF" tokenize "$fx" --file "$dir"
[[ ! -e "$WORK/q1" && ! -e "$WORK/q2" && ! -e "$WORK/c.gguf" && ! -e "$WORK/h" ]] && ok "no output after those errors" \
  || fail "an output was left behind"
# A name the system refuses (longer than NAME_MAX): an i/o error naming it, not a std::filesystem exception.
long="$WORK/$(printf 'a%.0s' {1..300})"
expect_exit 5 "i/o error: .*aaaa: cannot access: File name too long" -- "$QF" tokenize "$long" --text hi
expect_exit 5 "i/o error: .*aaaa: cannot access: File name too long" -- "$QF" -q eval "$fx" --text "$long"
expect_exit 5 "i/o error: .*aaaa: (cannot access: )?File name too long" -- "$QF" inspect "$long"
expect_exit 5 "i/o error: .*aaaa: (cannot access: )?File name too long" -- "$QF" -q quantize "$fx" --recipe "$long" -o "$WORK/q4"

# ---- text encodings of calibration and evaluation text
expect_exit 3 "utf16.txt: is UTF-16 text \(byte-order mark\), not UTF-8; convert it to UTF-8" -- "$QF" -q eval "$fx" --text "$m/utf16.txt"
expect_exit 3 "utf16-nobom.txt: has a NUL byte at offset 1: not a text file" -- "$QF" -q eval "$fx" --text "$m/utf16-nobom.txt"
expect_exit 3 "binary.txt: has a NUL byte at offset 0" -- "$QF" -q imatrix "$fx" --text "$m/binary.txt" -o "$WORK/im.gguf"
expect_exit 3 "utf16.txt: is UTF-16 text" \
  -- "$QF" -q quantize "$fx" --recipe "$SRC/tests/data/recipes/w4-gptq.yaml" --calib "$m/utf16.txt" -o "$WORK/q3"
"$QF" -q eval "$fx" --text "$m/latin1.txt" --ctx 64 --max-chunks 1 >/dev/null 2>"$WORK/w.err"
rc=$?
[[ $rc -eq 0 && $(wc -l <"$WORK/w.err") -eq 1 ]] &&
  grep -q "^quantforge: warning: .*latin1.txt: 2 bytes of invalid UTF-8 (the first at offset 2523); they are tokenized as bytes" "$WORK/w.err" \
  && ok "Latin-1 text: one warning, then the evaluation" || fail "latin1.txt: exit $rc, stderr: $(cat "$WORK/w.err")"
"$QF" -q eval "$fx" --text "$m/bom.txt" --ctx 64 --max-chunks 1 >/dev/null 2>"$WORK/b.err" && [[ ! -s "$WORK/b.err" ]] \
  && ok "a UTF-8 byte-order mark is dropped silently" || fail "bom.txt: $(cat "$WORK/b.err")"

# ---- importance matrices: values must be finite and not negative
expect_exit 3 "imatrix-negative.dat: blk.0.attn_q.weight: imatrix value 1 is -2.0+ \(must be finite and not negative" \
  -- "$QF" -q convert "$fx" --to gguf --type Q4_K_M --imatrix "$m/imatrix-negative.dat" -o "$WORK/n.gguf"
expect_exit 3 "imatrix-inf.gguf: blk.0.attn_q.weight: imatrix value 1 is inf" \
  -- "$QF" -q convert "$fx" --to gguf --type Q4_K_M --imatrix "$m/imatrix-inf.gguf" -o "$WORK/n.gguf"
expect_exit 3 "imatrix-huge-nval.dat: truncated legacy imatrix: x values needs 8589934588 bytes" \
  -- "$QF" -q convert "$fx" --to gguf --type Q4_K_M --imatrix "$m/imatrix-huge-nval.dat" -o "$WORK/n.gguf"

finish
