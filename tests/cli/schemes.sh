#!/usr/bin/env bash
# quantize with activation and float schemes, AWQ and SmoothQuant: every export
# format read back by inspect, eval (with a KL gate, and the FP8 KV cache with
# its calibrated scales) and bench; recipes the format cannot hold are refused.
source "$(dirname "$0")/lib.sh"

fx="$SRC/tests/data/fixture-llama"
rec="$SRC/tests/data/recipes"
calib="$SRC/tests/data/text/calibration.txt"
evaltxt="$SRC/tests/data/text/evaluation.txt"

"$QF" -q quantize "$fx" --recipe "$rec/fp8-modelopt.yaml" --calib "$calib" -o "$WORK/fp8" >/dev/null 2>"$WORK/fp8.err" \
  && ok "FP8 with KV-cache scales, modelopt layout" || fail "fp8: $(cat "$WORK/fp8.err")"
$PY - "$WORK/fp8" <<'PYEOF' && ok "modelopt FP8 layout" || fail "layout of $WORK/fp8"
import json, os, struct, sys
d = sys.argv[1]
hq = json.load(open(os.path.join(d, "hf_quant_config.json")))
assert hq["quantization"]["quant_algo"] == "FP8" and hq["quantization"]["kv_cache_quant_algo"] == "FP8", hq
assert json.load(open(os.path.join(d, "config.json")))["quantization_config"]["quant_method"] == "modelopt"
raw = open(os.path.join(d, "model.safetensors"), "rb").read()
h = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
p = "model.layers.0.self_attn."
assert h[p + "q_proj.weight"]["dtype"] == "F8_E4M3" and h[p + "q_proj.weight"]["shape"] == [256, 256], h[p + "q_proj.weight"]
for t in ("q_proj.weight_scale", "q_proj.input_scale", "k_proj.k_scale", "v_proj.v_scale"):
    assert h[p + t]["dtype"] == "F32" and h[p + t]["shape"] == [], (t, h[p + t])
PYEOF
"$QF" inspect "$WORK/fp8" >"$WORK/i1.txt"
grep -q "^quantization: modelopt: FP8, kv cache fp8" "$WORK/i1.txt" && ok "inspect shows modelopt FP8" \
  || fail "inspect: $(grep quantization "$WORK/i1.txt")"
"$QF" -q eval "$WORK/fp8" --text "$evaltxt" --max-chunks 4 --baseline "$fx" --kv-dtype f8 --max-kld 0.01 \
  --json "$WORK/e1.json" >/dev/null && ok "eval FP8 with the FP8 KV cache passes a KL gate" || fail "eval fp8: $(cat "$WORK/e1.json")"

"$QF" -q quantize "$fx" --recipe "$rec/w8a8-sq.yaml" --calib "$calib" -o "$WORK/w8a8" >/dev/null 2>"$WORK/w8a8.err" \
  && ok "SmoothQuant + W8A8" || fail "w8a8: $(cat "$WORK/w8a8.err")"
"$QF" inspect "$WORK/w8a8" >"$WORK/i2.txt"
grep -q "^quantization: compressed-tensors int-quantized: group_0 int8 sym channel / int8 token dynamic" "$WORK/i2.txt" \
  && ok "inspect shows W8A8" || fail "inspect w8a8: $(grep quantization "$WORK/i2.txt")"
"$QF" -q bench "$WORK/w8a8" -p 16 -n 4 --json "$WORK/b2.json" >/dev/null \
  && $PY -c "import json,sys; j=json.load(open(sys.argv[1])); assert 'int8 token dynamic' in j['weight_format'], j" "$WORK/b2.json" \
  && ok "bench runs W8A8" || fail "bench w8a8: $(cat "$WORK/b2.json")"

"$QF" -q quantize "$fx" --recipe "$rec/w4asym-awq-awqfmt.yaml" --calib "$calib" -o "$WORK/awq" >/dev/null 2>"$WORK/awq.err" \
  && ok "AWQ, AutoAWQ GEMM layout" || fail "awq: $(cat "$WORK/awq.err")"
"$QF" inspect "$WORK/awq" >"$WORK/i3.txt"
grep -q "^quantization: awq (gemm): int4 asym g128" "$WORK/i3.txt" && ok "inspect shows AWQ" \
  || fail "inspect awq: $(grep quantization "$WORK/i3.txt")"
"$QF" -q eval "$WORK/awq" --text "$evaltxt" --max-chunks 4 --baseline "$fx" --max-kld 0.02 --json "$WORK/e3.json" >/dev/null \
  && ok "eval AWQ passes a KL gate" || fail "eval awq: $(cat "$WORK/e3.json")"

cat >"$WORK/bad.yaml" <<'YEOF'
quant_stage:
  quant_modifiers:
    QuantizationModifier: {targets: [Linear], ignore: [lm_head], scheme: W8A8}
export:
  format: gptq
YEOF
expect_exit 4 "the gptq format holds weight-only schemes" -- "$QF" quantize "$fx" --recipe "$WORK/bad.yaml" -o "$WORK/x"
[[ ! -e "$WORK/x" ]] && ok "no output after a refused recipe" || fail "output left behind"
cat >"$WORK/nocal.yaml" <<'YEOF'
quant_stage:
  quant_modifiers:
    QuantizationModifier: {targets: [Linear], ignore: [lm_head], scheme: FP8}
YEOF
expect_exit 2 "static activation scales needs calibration data" -- "$QF" quantize "$fx" --recipe "$WORK/nocal.yaml" -o "$WORK/y"
finish
