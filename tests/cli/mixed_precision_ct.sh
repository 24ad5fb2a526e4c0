#!/usr/bin/env bash
# mixed_precision (compressed-tensors): a size budget searched on the fixture,
# exported, loaded back and evaluated; the groups' targets match every
# quantized Linear exactly once, fused sets share a group, the stored bytes
# are the report's and fit the budget; --dry-run writes nothing; bad
# sections fail with one line and the recipe's position.
source "$(dirname "$0")/lib.sh"

fx="$SRC/tests/data/fixture-llama"
calib="$SRC/tests/data/text/calibration.txt"
evaltxt="$SRC/tests/data/text/evaluation.txt"

recipe() {  # recipe FILE MIXED [MODIFIER]
  local mod="${3:-}"
  [[ -n "$mod" ]] || mod='QuantizationModifier: {targets: [Linear], ignore: [lm_head]}'
  cat >"$1" <<EOF
quant_stage:
  quant_modifiers:
    $mod
mixed_precision: $2
calibration: {num_samples: 2, seq_len: 128}
EOF
}

recipe "$WORK/mix.yaml" "{target_bits: 5.5, schemes: [NVFP4A16, W8A16, UNQUANTIZED], probe_samples: 2}"
"$QF" quantize "$fx" --recipe "$WORK/mix.yaml" --calib "$calib" -o "$WORK/dry" --dry-run >"$WORK/dry.out" 2>"$WORK/dry.err" \
  && grep -q "^model.layers.0.self_attn.{q,k,v}_proj " "$WORK/dry.out" && grep -q "^total: .* predicted KL" "$WORK/dry.out" \
  && grep -q "^lagrangian bisection: " "$WORK/dry.out" && [[ ! -e "$WORK/dry" ]] \
  && ok "--dry-run prints the allocation and writes nothing" || fail "dry run: $(cat "$WORK/dry.out" "$WORK/dry.err")"

"$QF" quantize "$fx" --recipe "$SRC/recipes/w4a16-rtn.yaml" -o "$WORK/dry" --dry-run >"$WORK/dry2.out" 2>"$WORK/dry2.err" \
  && grep -q "^total: 28 Linears, 1622464 bytes (rtn, compressed-tensors)$" "$WORK/dry2.out" && [[ ! -e "$WORK/dry" ]] \
  && ok "--dry-run of a plain recipe prints each Linear's scheme and the stored bytes" || fail "dry run: $(cat "$WORK/dry2.out" "$WORK/dry2.err")"

"$QF" quantize "$fx" --recipe "$WORK/mix.yaml" --calib "$calib" -o "$WORK/q" >"$WORK/q.out" 2>"$WORK/q.err" \
  && ok "quantize with a mixed-precision budget" || fail "quantize: $(cat "$WORK/q.err")"
$PY - "$WORK/q" <<'PYEOF' && ok "groups match every quantized Linear once, fused sets share one, bytes fit the budget" || fail "layout of $WORK/q"
import json, os, re, struct, sys
d = sys.argv[1]
qc = json.load(open(os.path.join(d, "config.json")))["quantization_config"]
rep = json.load(open(os.path.join(d, "quantization_report.json")))["mixed_precision"]
raw = open(os.path.join(d, "model.safetensors"), "rb").read()
h = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
h.pop("__metadata__", None)
quantized = sorted({k.rsplit(".", 1)[0] for k in h if k.endswith((".weight_packed", ".weight_scale"))})
assert len(quantized) > 0
def groups_of(m):
    out = []
    for name, g in qc["config_groups"].items():
        for t in g["targets"]:
            assert t.startswith("re:^") and t.endswith("$"), t
            if re.match(t[3:], m):
                out.append(name)
    return out
owner = {}
for m in quantized:
    gs = groups_of(m)
    assert len(gs) == 1, (m, gs)
    owner[m] = gs[0]
for L in range(4):
    p = f"model.layers.{L}."
    for fused in (["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], ["mlp.gate_proj", "mlp.up_proj"]):
        got = {owner.get(p + f, "ignored") for f in fused}
        assert len(got) == 1, (p, fused, got)
    for f in ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]:
        assert (p + f in owner) != (p + f in qc["ignore"]), (p + f, qc["ignore"])
        assert not (p + f in qc["ignore"] and groups_of(p + f)), p + f
stored = sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in h.items() if k.rsplit(".", 1)[0] in quantized)
unq = [i for i in rep["items"] if i["scheme"] == "UNQUANTIZED"]
stored += sum(h[m + ".weight"]["data_offsets"][1] - h[m + ".weight"]["data_offsets"][0] for i in unq for m in i["modules"])
assert stored == rep["bytes"], (stored, rep["bytes"])
assert rep["bytes"] <= rep["budget_bytes"] == int(5.5 * rep["targeted_weights"] / 8), rep
assert rep["predicted_kld"] <= rep["lagrangian"]["predicted_kld"] + 1e-12, rep
assert all(i["probe"]["measured_kld"] > 0 for i in rep["items"])
assert len({i["scheme"] for i in rep["items"]}) >= 2, rep["items_per_scheme"]
PYEOF
"$QF" eval "$WORK/q" --baseline "$fx" --text "$evaltxt" --max-chunks 2 --json "$WORK/e.json" >"$WORK/e.out" 2>"$WORK/e.err" \
  && $PY -c "import json,sys; r=json.load(open(sys.argv[1])); k=r['kld']['mean']; assert r['valid'] and 0 < k < 1, k" "$WORK/e.json" \
  && ok "the export loads back and evaluates against the f16 model" || fail "eval: $(cat "$WORK/e.err" "$WORK/e.out")"

# Bad sections: one line, the recipe's position, the codebase's exit codes.
recipe "$WORK/b1.yaml" "{target_bits: 5, schemes: [NVFP4A16], probes: 2}"
expect_exit 3 "b1.yaml:4:56: mixed_precision: unknown key 'probes'" -- "$QF" quantize "$fx" --recipe "$WORK/b1.yaml" --calib "$calib" -o "$WORK/b1"
recipe "$WORK/b2.yaml" "{target_bits: 5, schemes: [NVFP4A61]}"
expect_exit 3 "b2.yaml:4:45: mixed_precision.schemes\[0\]: unknown preset scheme 'NVFP4A61' \(did you mean 'NVFP4A16'\?\)" -- \
  "$QF" quantize "$fx" --recipe "$WORK/b2.yaml" --calib "$calib" -o "$WORK/b2"
recipe "$WORK/b3.yaml" "{target_bits: 4.2, schemes: [NVFP4A16, W8A16]}"
expect_exit 3 "b3.yaml:4:32: mixed_precision: the budget .* is below the smallest of the schemes" -- \
  "$QF" quantize "$fx" --recipe "$WORK/b3.yaml" --calib "$calib" -o "$WORK/b3"
recipe "$WORK/b4.yaml" "{target_bits: 5, schemes: [MXFP4]}"
expect_exit 4 "b4.yaml:4:45: .*preset 'MXFP4' is not supported yet" -- "$QF" quantize "$fx" --recipe "$WORK/b4.yaml" --calib "$calib" -o "$WORK/b4"
recipe "$WORK/b5.yaml" "{target_bits: 5, schemes: [W4A16]}" 'QuantizationModifier: {scheme: W4A16}'
expect_exit 3 "b5.yaml:3:28: QuantizationModifier.scheme: the recipe has a mixed_precision section" -- \
  "$QF" quantize "$fx" --recipe "$WORK/b5.yaml" --calib "$calib" -o "$WORK/b5"
recipe "$WORK/b6.yaml" "{target_bits: 5, schemes: [NVFP4A16, W8A16]}" 'GPTQModifier: {ignore: [lm_head]}'
expect_exit 4 "b6.yaml:4:45: mixed_precision.schemes: GPTQModifier quantizes integer weights" -- \
  "$QF" quantize "$fx" --recipe "$WORK/b6.yaml" --calib "$calib" -o "$WORK/b6"
expect_exit 2 "mixed_precision measures .* calibration data" -- "$QF" quantize "$fx" --recipe "$WORK/mix.yaml" -o "$WORK/b7"
[[ ! -e "$WORK/b1" && ! -e "$WORK/b3" && ! -e "$WORK/b7" ]] && ok "no partial outputs" || fail "a failed run left an output"

finish
