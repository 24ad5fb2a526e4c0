#!/usr/bin/env bash
# quantize: recipe -> GPTQ -> compressed-tensors checkpoint, eval against the f16 model, errors.
source "$(dirname "$0")/lib.sh"

fx="$SRC/tests/data/fixture-llama"
calib="$SRC/tests/data/text/calibration.txt"
evaltxt="$SRC/tests/data/text/evaluation.txt"
rec="$SRC/tests/data/recipes"

"$QF" quantize "$fx" --recipe "$rec/w4-gptq.yaml" -o "$WORK/q" >"$WORK/q.out" 2>"$WORK/q.err" \
  && ok "quantize with GPTQ (calibration.dataset relative to the recipe)" || fail "quantize: $(cat "$WORK/q.err")"
grep -q "^layer 4/4: 7 linears" "$WORK/q.err" && grep -q "relative output error" "$WORK/q.out" \
  && ok "per-layer progress and summary" || fail "progress: $(cat "$WORK/q.err" "$WORK/q.out")"
$PY - "$WORK/q" <<'PYEOF' && ok "compressed-tensors checkpoint layout" || fail "layout of $WORK/q"
import json, os, struct, sys
d = sys.argv[1]
cfg = json.load(open(os.path.join(d, "config.json")))
qc = cfg["quantization_config"]
assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "pack-quantized", qc
w = qc["config_groups"]["group_0"]["weights"]
assert (w["num_bits"], w["strategy"], w["group_size"], w["symmetric"], w["type"]) == (4, "group", 128, True, "int"), w
assert qc["ignore"] == ["lm_head"], qc["ignore"]
raw = open(os.path.join(d, "model.safetensors"), "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
p = "model.layers.0.mlp.down_proj."
assert h[p + "weight_packed"]["dtype"] == "I32" and h[p + "weight_packed"]["shape"] == [256, 768 * 4 // 32], h[p + "weight_packed"]
assert h[p + "weight_scale"]["dtype"] == "F16" and h[p + "weight_scale"]["shape"] == [256, 6], h[p + "weight_scale"]
assert h[p + "weight_shape"]["dtype"] == "I64" and h[p + "weight_shape"]["shape"] == [2]
assert p + "weight_zero_point" not in h and "lm_head.weight" in h and h["lm_head.weight"]["dtype"] == "F16"
m = json.load(open(os.path.join(d, "quantforge_manifest.json")))
assert {f["path"] for f in m["files"]} >= {"config.json", "model.safetensors", "tokenizer.json", "recipe.yaml"}, m
PYEOF
"$QF" inspect "$WORK/q" >"$WORK/iq.txt"  # to a file: grep -q closing a pipe early would fail it under pipefail
grep -q "^quantization: compressed-tensors pack-quantized: group_0 int4 sym g128" "$WORK/iq.txt" \
  && ok "inspect shows the scheme" || fail "inspect: $(grep quantization "$WORK/iq.txt")"
"$QF" -q quantize "$fx" --recipe "$rec/w4-gptq-gptqfmt.yaml" --calib "$calib" -o "$WORK/g" --max-memory 1M >"$WORK/g.out" \
  && grep -q "spilled to disk" "$WORK/g.out" && ok "GPTQ format, activations spilled under --max-memory" || fail "gptq fmt: $(cat "$WORK/g.out")"
"$QF" inspect "$WORK/g" >"$WORK/ig.txt"
grep -q "^quantization: gptq (gptq): int4 sym g128" "$WORK/ig.txt" && ok "inspect shows the GPTQ scheme" \
  || fail "inspect gptq: $(grep quantization "$WORK/ig.txt")"
"$QF" -q bench "$WORK/g" -p 16 -n 4 --json "$WORK/gb.json" >/dev/null \
  && $PY -c "import json,sys; j=json.load(open(sys.argv[1])); assert 'int4 sym g128' in j['weight_format'], j" "$WORK/gb.json" \
  && ok "bench runs the GPTQ checkpoint" || fail "bench gptq"
"$QF" -q eval "$WORK/q" --text "$evaltxt" --max-chunks 4 --baseline "$fx" --max-kld 0.02 --json "$WORK/e.json" >/dev/null \
  && ok "eval OUT --baseline passes a KL gate" || fail "eval quantized: $(cat "$WORK/e.json")"

expect_exit 3 "bad-group.yaml:7:9: group_size 96 does not divide" -- "$QF" quantize "$fx" --recipe "$rec/bad-group.yaml" -o "$WORK/b"
[[ ! -e "$WORK/b" ]] && ok "no output after a failed quantize" || fail "output left behind"
printf 'quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      scheme: W4A16\n      dampening: 0.1\n' >"$WORK/typo.yaml"
expect_exit 3 "typo.yaml:5:7" -- "$QF" quantize "$fx" --recipe "$WORK/typo.yaml" -o "$WORK/c" --calib "$calib"
printf 'quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      scheme: W4A16\n      ignore: [lm_head]\n' >"$WORK/nocal.yaml"
expect_exit 2 "needs calibration data" -- "$QF" quantize "$fx" --recipe "$WORK/nocal.yaml" -o "$WORK/d"
printf 'quant_stage:\n  quant_modifiers:\n    QuantizationModifier: {scheme: W4A16, ignore: [lm_head]}\nexport:\n  format: gtpq\n' >"$WORK/fmt.yaml"
expect_exit 3 "fmt.yaml:5:11: export.format: unknown format 'gtpq' \\(did you mean 'gptq'\\?\\)" \
  -- "$QF" quantize "$fx" --recipe "$WORK/fmt.yaml" -o "$WORK/f"
expect_exit 2 "--max-memory must be a size" -- "$QF" quantize "$fx" --recipe "$rec/w4-rtn.yaml" -o "$WORK/e" --max-memory lots

finish
