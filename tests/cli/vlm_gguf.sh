#!/usr/bin/env bash
# convert --to gguf of vision-language models: the language model GGUF plus the
# CLIP mmproj GGUF (default name, --mmproj, --no-mmproj), and the refusals.
source "$(dirname "$0")/lib.sh"

qwen="$SRC/tests/data/vlm/qwen2-vl"
llava="$SRC/tests/data/vlm/llava"
text_model="$SRC/tests/data/fixture-llama"
[[ -d "$qwen" && -d "$llava" ]] || { echo "skipped: no VLM fixtures under tests/data/vlm"; exit 77; }

# inspect_check FILE PYTHON: runs PYTHON with j = inspect's JSON of FILE.
inspect_check() {
  "$QF" inspect "$1" --json | $PY -c "
import json, sys
j = json.load(sys.stdin)
m = j['metadata']
names = {t['name']: t for t in j['tensors']}
$2"
}

mkdir -p "$WORK/a"
"$QF" convert "$qwen" --to gguf -o "$WORK/a/qwen.gguf" 2>"$WORK/conv.err" && ok "convert Qwen2-VL" || fail "convert: $(cat "$WORK/conv.err")"
grep -q "mmproj-qwen.gguf: the vision encoder and projector" "$WORK/conv.err" && ok "mmproj reported" || fail "no mmproj line: $(cat "$WORK/conv.err")"
[[ "$(ls "$WORK/a" | tr '\n' ' ')" == "mmproj-qwen.gguf qwen.gguf " ]] && ok "mmproj-<name> beside the output" || fail "files: $(ls -a "$WORK/a")"
inspect_check "$WORK/a/qwen.gguf" "
assert j['architecture'] == 'qwen2vl', j['architecture']
s = m['qwen2vl.rope.dimension_sections']
assert s == {'array': 'INT32', 'count': 4}, s
assert not any(n.startswith(('v.', 'mm.')) for n in names), sorted(names)
assert 'blk.0.attn_q.bias' in names and 'blk.3.attn_v.bias' in names" \
  && ok "language model: qwen2vl, rope sections, biases, no vision tensors" || fail "language model GGUF"
inspect_check "$WORK/a/mmproj-qwen.gguf" "
assert j['architecture'] == 'clip'
assert m['clip.has_vision_encoder'] is True and m['clip.has_text_encoder'] is False and m['clip.has_qwen2vl_merger'] is True, m
assert m['clip.projector_type'] == 'qwen2vl_merger' and m['clip.vision.block_count'] == 2 and m['clip.vision.projection_dim'] == 256, m
assert names['v.patch_embd.weight']['ne'] == [14, 14, 3, 64] and names['v.patch_embd.weight.1']['type'] == 'f16', names['v.patch_embd.weight']
assert names['v.blk.1.attn_k.weight']['ne'] == [64, 64] and names['v.blk.0.ffn_down.weight']['ne'] == [64, 256]
assert names['mm.2.weight']['ne'] == [256, 256] and 'v.post_ln.weight' in names and 'v.class_embd' not in names" \
  && ok "mmproj: qwen2vl merger keys and tensors" || fail "Qwen2-VL mmproj"

"$QF" -q convert "$qwen" --to gguf --type Q4_K_M --mmproj "$WORK/vision.gguf" -o "$WORK/q4.gguf" \
  && [[ -f "$WORK/vision.gguf" && ! -e "$WORK/mmproj-q4.gguf" ]] && ok "--mmproj PATH" || fail "--mmproj PATH"
cmp -s "$WORK/vision.gguf" "$WORK/a/mmproj-qwen.gguf" && ok "the mmproj stays f16 under --type Q4_K_M" || fail "mmproj depends on --type"
inspect_check "$WORK/q4.gguf" "assert names['blk.0.attn_q.weight']['type'] == 'q4_K', names['blk.0.attn_q.weight']" \
  && ok "the language model is quantized" || fail "Q4_K_M language model"
"$QF" -q convert "$qwen" --to gguf --no-mmproj -o "$WORK/lm-only.gguf" && [[ ! -e "$WORK/mmproj-lm-only.gguf" ]] \
  && cmp -s "$WORK/lm-only.gguf" "$WORK/a/qwen.gguf" && ok "--no-mmproj: the same language model, no mmproj" || fail "--no-mmproj"

"$QF" -q convert "$llava" --to gguf -o "$WORK/llava.gguf" && ok "convert LLaVA" || fail "convert LLaVA"
inspect_check "$WORK/llava.gguf" "
assert j['architecture'] == 'llama' and len(names) == 39 and not any(n.startswith(('v.', 'mm.')) for n in names), sorted(names)" \
  && ok "LLaVA language model: llama, 39 tensors" || fail "LLaVA language model"
inspect_check "$WORK/mmproj-llava.gguf" "
assert m['clip.has_llava_projector'] is True and m['clip.projector_type'] == 'mlp' and m['clip.use_gelu'] is False, m
assert m['clip.vision.block_count'] == 3 and m['clip.vision.image_size'] == 56, m  # feature layer -2 of 3: clip.cpp runs 2
assert names['v.position_embd.weight']['ne'] == [64, 17] and names['v.class_embd']['type'] == 'f32'
assert names['mm.0.weight']['ne'] == [64, 256] and 'v.blk.2.ffn_up.weight' in names and 'v.blk.3.ln1.weight' not in names
assert 'v.post_ln.weight' not in names and 'v.pre_ln.bias' in names" \
  && ok "LLaVA mmproj: llava projector, block_count = feature layer + 1" || fail "LLaVA mmproj"

# Refusals: one line, the right exit code, nothing written.
mkdir -p "$WORK/e"
expect_exit 2 "--mmproj applies to vision-language models" -- "$QF" convert "$text_model" --to gguf --mmproj "$WORK/e/m.gguf" -o "$WORK/e/x.gguf"
expect_exit 2 "--no-mmproj applies to vision-language models" -- "$QF" convert "$text_model" --to gguf --no-mmproj -o "$WORK/e/x.gguf"
expect_exit 2 "exclude each other" -- "$QF" convert "$qwen" --to gguf --no-mmproj --mmproj "$WORK/e/m.gguf" -o "$WORK/e/x.gguf"
expect_exit 2 "apply to --to gguf" -- "$QF" convert "$qwen" --to hf --mmproj "$WORK/e/m.gguf" -o "$WORK/e/h"
expect_exit 5 "no-such-folder" -- "$QF" convert "$qwen" --to gguf --mmproj "$WORK/no-such-folder/m.gguf" -o "$WORK/e/x.gguf"
cp "$WORK/vision.gguf" "$WORK/e/mmproj-x.gguf"
expect_exit 5 "mmproj-x.gguf: the mmproj file already exists; pass --force" -- "$QF" convert "$qwen" --to gguf -o "$WORK/e/x.gguf"
rm "$WORK/e/mmproj-x.gguf"
mkdir -p "$WORK/q25"
for f in "$qwen"/*; do ln -s "$f" "$WORK/q25/"; done
rm "$WORK/q25/config.json"
$PY -c "
import json, sys
c = json.load(open(sys.argv[1])); c['model_type'] = 'qwen2_5_vl'; c['architectures'] = ['Qwen2_5_VLForConditionalGeneration']
json.dump(c, open(sys.argv[2], 'w'))" "$qwen/config.json" "$WORK/q25/config.json"
expect_exit 4 "Qwen2.5-VL.*--no-mmproj" -- "$QF" convert "$WORK/q25" --to gguf -o "$WORK/e/x.gguf"
[[ -z "$(ls -A "$WORK/e")" ]] && ok "no output after the refusals" || fail "left behind: $(ls -A "$WORK/e")"
"$QF" -q convert "$WORK/q25" --to gguf --no-mmproj -o "$WORK/e/q25.gguf" && [[ "$(ls "$WORK/e")" == "q25.gguf" ]] \
  && inspect_check "$WORK/e/q25.gguf" "assert j['architecture'] == 'qwen2vl'" && ok "Qwen2.5-VL with --no-mmproj: the language model" \
  || fail "Qwen2.5-VL --no-mmproj"

# The runtime runs the qwen2vl language model GGUF on text as the Hugging Face folder.
"$QF" -q convert "$qwen" --to gguf --type F16 --no-mmproj -o "$WORK/lm16.gguf" || fail "convert F16"
ppl() { "$QF" eval "$1" --text "$SRC/tests/data/text/evaluation.txt" --ctx 128 --max-chunks 4 --json "$WORK/p.json" >/dev/null 2>&1 \
  && $PY -c 'import json, sys; print(json.load(open(sys.argv[1]))["ppl"])' "$WORK/p.json"; }
p_hf=$(ppl "$qwen") && p_gguf=$(ppl "$WORK/lm16.gguf") \
  && $PY -c "import sys; a, b = map(float, sys.argv[1:]); assert abs(a - b) <= 1e-4 * a, (a, b)" "$p_hf" "$p_gguf" \
  && ok "eval of the qwen2vl GGUF: ppl $p_gguf, the folder's $p_hf" || fail "eval qwen2vl GGUF: ${p_gguf:-?} vs ${p_hf:-?}"

finish
