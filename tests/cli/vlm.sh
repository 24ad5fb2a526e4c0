#!/usr/bin/env bash
# Vision-language models end to end on the Qwen2-VL and LLaVA fixtures
# (tests/data/vlm): inspect shows the vision tower, projector and language
# model apart; quantize writes the vision tower and projector bit-identical
# under the checkpoint's own names (transformers before and after 4.52),
# lists exactly their Linears (and lm_head) in ignore and copies the
# processor files, for W4A16 GPTQ, AWQ, FP8 and NVFP4; calibration with image
# records runs the images through the vision side; eval scores the text of
# image records given the image, against the f16 model; the outputs load
# back in the runtime; the recipe's vision: section quantizes the vision
# tower and projector instead.
source "$(dirname "$0")/lib.sh"

vlm="$SRC/tests/data/vlm"
qwen="$vlm/qwen2-vl"
llava="$vlm/llava"
rec="$SRC/tests/data/recipes"
for d in "$qwen" "$llava"; do
  [[ -f "$d/model.safetensors" ]] || { echo "FAIL: $d is missing"; exit 1; }
done
check() { $PY "$SRC/tests/cli/vlm_check.py" "$@"; }

# The same checkpoints under transformers' current names.
check rename "$qwen" "$WORK/qwen-new" && check rename "$llava" "$WORK/llava-new" \
  && ok "renamed copies" || fail "rename"

# LLaVA-NeXT: the LLaVA fixture's language model with the anyres vision side
# of tests/data/vlm/llava-next-vision; its images are tiled (base tile +
# grid, image_newline rows) in calibration and eval below.
check assemble "$vlm/llava-next-vision" "$llava" "$WORK/llava-next" && ok "llava-next assembled" || fail "assemble llava-next"

# inspect: the three parts, both namings.
for m in "$qwen" "$WORK/qwen-new"; do
  "$QF" inspect "$m" >"$WORK/inspect.out" 2>&1 || fail "inspect $m: $(cat "$WORK/inspect.out")"
  grep -q "^vision: .*qwen2_vl: vision tower .* (2 blocks, width 64, patch 14), projector .* language model qwen2 .*multimodal RoPE sections \[4,6,6\]" "$WORK/inspect.out" \
    && grep -q "^vision tower (" "$WORK/inspect.out" && grep -q "^projector (" "$WORK/inspect.out" \
    && grep -q "^layer 3 " "$WORK/inspect.out" \
    && ok "inspect $(basename "$m"): vision tower, projector, language model" || fail "inspect $m: $(cat "$WORK/inspect.out")"
done
"$QF" inspect "$WORK/llava-new" --json >"$WORK/inspect.json" 2>&1 && $PY - "$WORK/inspect.json" <<'PYEOF' \
  && ok "inspect --json llava (current names): the parts apart" || fail "inspect llava: $(cat "$WORK/inspect.json")"
import json, sys
j = json.load(open(sys.argv[1]))
v = j["vision_language"]
assert v["model_type"] == "llava" and v["tensor_naming"] == "renamed", v
assert v["language_model"]["model_type"] == "llama", v
assert all(t["name"].startswith("model.vision_tower.") for t in v["vision_tower"]["tensors"]), v["vision_tower"]
assert {t["name"] for t in v["projector"]["tensors"]} >= {"model.multi_modal_projector.linear_1.weight"}, v["projector"]
assert len(j["layers"]) == 4, len(j["layers"])
PYEOF

# quantize: every scheme keeps the vision side and lists its Linears.
calib_txt="$SRC/tests/data/text/calibration.txt"
for r in w4-gptq w4-awq fp8 nvfp4; do
  for m in "$qwen" "$WORK/qwen-new" "$llava" "$WORK/llava-new"; do
    name="$r-$(basename "$m")"
    if "$QF" quantize "$m" --recipe "$rec/$r.yaml" --calib "$calib_txt" -o "$WORK/$name" \
      >"$WORK/$name.out" 2>"$WORK/$name.err"; then
      out=$(check kept "$m" "$WORK/$name" 2>&1) && ok "$name: $out" || fail "$name: $out"
    else
      fail "quantize $name: $(cat "$WORK/$name.err")"
    fi
  done
done

# The outputs load and run: text eval of a quantized Qwen2-VL and LLaVA.
for name in w4-gptq-qwen2-vl w4-gptq-llava-new; do
  "$QF" eval "$WORK/$name" --text "$SRC/tests/data/text/evaluation.txt" --ctx 128 --max-chunks 2 --json "$WORK/e.json" \
    >/dev/null 2>"$WORK/e.err" && $PY -c 'import json, math, sys; j = json.load(open(sys.argv[1])); assert math.isfinite(j["ppl"]) and j["ppl"] < 200, j["ppl"]' "$WORK/e.json" \
    && ok "eval $name on text" || fail "eval $name: $(cat "$WORK/e.err")"
done

# Image calibration: the images' rows in the language model's calibration.
# KL against the f16 model on image-and-text records, text-only vs image
# calibration (GPTQ W4A16 and AWQ), both reported.
kl_records() {  # kl_records MODEL BASE -> mean KL over evaluation.jsonl's records
  "$QF" eval "$1" --baseline "$2" --text "$vlm/evaluation.jsonl" --json "$WORK/klr.json" >/dev/null 2>"$WORK/klr.err" \
    || { echo "eval $1: $(cat "$WORK/klr.err")" >&2; return 1; }
  $PY - "$WORK/klr.json" <<'PYEOF'
import json, math, sys
j = json.load(open(sys.argv[1]))
assert j["mode"] == "image-text records", j["mode"]
k = j["kld"]["mean"]
assert math.isfinite(k) and k > 0 and math.isfinite(j["ppl"]), j
print(k)
PYEOF
}
for m in "$qwen" "$llava" "$WORK/llava-next"; do
  b=$(basename "$m")
  for r in w4-gptq w4-awq; do
    "$QF" quantize "$m" --recipe "$rec/$r.yaml" --calib "$vlm/calibration.jsonl" -o "$WORK/$r-img-$b" \
      >"$WORK/img.out" 2>"$WORK/img.err" || { fail "quantize $r $b with images: $(cat "$WORK/img.err")"; continue; }
    grep -q "calibration: 6 samples, 4 with an image" "$WORK/img.err" \
      && $PY -c 'import json, sys; c = json.load(open(sys.argv[1]))["calibration"]; assert c["image_samples"] == 4, c' \
           "$WORK/$r-img-$b/quantization_report.json" \
      && ok "$r $b: 4 image records in the calibration" || fail "$r $b image calibration: $(cat "$WORK/img.err")"
    out=$(check kept "$m" "$WORK/$r-img-$b" 2>&1) && ok "$r-img-$b: $out" || fail "$r-img-$b: $out"
    # The same records without their images: text-only calibration on the same captions.
    $PY -c 'import json, sys
for l in open(sys.argv[1]):
    j = json.loads(l); j.pop("image", None); print(json.dumps(j))' "$vlm/calibration.jsonl" >"$WORK/captions.jsonl"
    "$QF" quantize "$m" --recipe "$rec/$r.yaml" --calib "$WORK/captions.jsonl" -o "$WORK/$r-txt-$b" \
      >/dev/null 2>"$WORK/txt.err" || { fail "quantize $r $b text-only: $(cat "$WORK/txt.err")"; continue; }
    k_img=$(kl_records "$WORK/$r-img-$b" "$m") && k_txt=$(kl_records "$WORK/$r-txt-$b" "$m") \
      && ok "$r $b: KL on image records, image calibration $k_img, text-only calibration $k_txt" \
      || fail "$r $b: KL on image records: ${k_img:-?} ${k_txt:-?}"
  done
done
# The images change what GPTQ sees: the packed codes differ from text-only calibration's.
check changed "$WORK/w4-gptq-img-qwen2-vl/model.safetensors" "$WORK/w4-gptq-txt-qwen2-vl/model.safetensors" \
  model.layers.0.self_attn.q_proj.weight_packed \
  && ok "image calibration changes the GPTQ codes" || fail "image calibration left the codes as text-only calibration's"

# The vision side quantized on request: the tower W8A16 (per channel where
# 128 does not divide the 64-wide stream, with a log line), the projector
# FP8_DYNAMIC, under the current names. The language model comes out as
# without the section, so against the output with the vision side kept the
# KL on image records is the vision side's alone: above zero only because
# the baseline runs the images through its own vision tower.
vrec="$WORK/vision.yaml"
{ cat "$rec/w4-gptq.yaml"; printf 'vision:\n  tower: W8A16\n  projector: FP8_DYNAMIC\n'; } >"$vrec"
for m in "$WORK/qwen-new" "$WORK/llava-new"; do
  b=$(basename "$m")
  "$QF" quantize "$m" --recipe "$vrec" --calib "$calib_txt" -o "$WORK/vq-$b" >/dev/null 2>"$WORK/vq.err" \
    || { fail "quantize $b with vision: $(cat "$WORK/vq.err")"; continue; }
  grep -q "^vision tower: .* Linears with 64 input columns .* not divisible by the group size 128: quantized with one scale per output channel instead" "$WORK/vq.err" \
    && grep -q "^vision: .* Linears quantized by round to nearest" "$WORK/vq.err" \
    && ok "$b vision: the per-channel fallback said" || fail "$b vision log: $(cat "$WORK/vq.err")"
  out=$(check quantized "$m" "$WORK/vq-$b" 2>&1) && ok "vq-$b: $out" || fail "vq-$b: $out"
  $PY - "$WORK/vq-$b/model.safetensors" "$WORK/w4-gptq-$b/model.safetensors" "$SRC/tests/cli" <<'PYEOF' \
    && ok "vq-$b: the language model as without the vision section" || fail "vq-$b: the language model differs"
import sys
sys.path.insert(0, sys.argv[3])
from codes_differ import load
(da, ha), (db, hb) = load(sys.argv[1]), load(sys.argv[2])
lm = [k for k in ha if ".layers." in k and "vision" not in k and "visual" not in k]
assert lm and all(da[slice(*ha[k]["data_offsets"])] == db[slice(*hb[k]["data_offsets"])] for k in lm)
PYEOF
  k_f16=$(kl_records "$WORK/vq-$b" "$m") && k_own=$(kl_records "$WORK/vq-$b" "$WORK/w4-gptq-$b") \
    && $PY -c 'import sys; a, b = map(float, sys.argv[1:]); assert 0 < b < a, (a, b)' "$k_f16" "$k_own" \
    && ok "vq-$b: KL on image records $k_f16 against f16, $k_own against the same language model with the vision side kept" \
    || fail "vq-$b: KL ${k_f16:-?} ${k_own:-?}"
done
# Not on a text model; not in a format with one scheme per model.
expect_exit 3 "has no vision tower" -- "$QF" quantize "$SRC/tests/data/fixture-llama" --recipe "$vrec" --calib "$calib_txt" -o "$WORK/bad3"
sed 's/format: compressed-tensors/format: gptq/' "$vrec" >"$WORK/vision-gptq.yaml"
expect_exit 4 "holds one scheme" -- "$QF" quantize "$qwen" --recipe "$WORK/vision-gptq.yaml" --calib "$calib_txt" -o "$WORK/bad4"
[[ ! -e "$WORK/bad3" && ! -e "$WORK/bad4" ]] && ok "no output for a refused vision section" || fail "output left by a refused vision section"

# Bad input: an image record for a text model, a missing image, the device.
printf '{"image": "nope.png", "text": "x y z"}\n' >"$WORK/missing.jsonl"
expect_exit 6 "nope.png" -- "$QF" quantize "$qwen" --recipe "$rec/w4-gptq.yaml" --calib "$WORK/missing.jsonl" -o "$WORK/bad1"
[[ ! -e "$WORK/bad1/model.safetensors" ]] && ok "no output for a missing image" || fail "output left for a missing image"
expect_exit 3 "not a vision-language model" -- "$QF" eval "$SRC/tests/data/fixture-llama" --text "$vlm/evaluation.jsonl"
expect_exit 4 "CPU only" -- "$QF" -q quantize "$qwen" --recipe "$rec/w4-gptq.yaml" --calib "$vlm/calibration.jsonl" --device host -o "$WORK/bad2"

echo "$passes passed, $fails failed"
[[ $fails -eq 0 ]]
