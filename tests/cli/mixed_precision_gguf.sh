#!/usr/bin/env bash
# convert --to gguf --target-size / --target-bpw: the allocation meets the
# budget, is written as planned, beats llama.cpp's preset of the same size in
# measured KL divergence, and bad requests fail cleanly with nothing written.
source "$(dirname "$0")/lib.sh"

fx="$SRC/tests/data/fixture-llama"
moe="$SRC/tests/data/fixture-mixtral"
evaltxt="$SRC/tests/data/text/evaluation.txt"
calib="$SRC/tests/data/text/calibration.txt"

"$QF" -q imatrix "$fx" --text "$calib" --chunks 8 -o "$WORK/im.gguf" || fail "imatrix"
"$QF" -q convert "$fx" --to gguf --type Q4_K_M --imatrix "$WORK/im.gguf" -o "$WORK/preset.gguf" || fail "preset"

# The Q4_K_M preset's tensor data (each tensor padded to the alignment) as the budget.
"$QF" inspect "$WORK/preset.gguf" --json >"$WORK/preset.inspect.json"
budget=$($PY -c "import json,sys; print(sum((t['bytes'] + 31) // 32 * 32 for t in json.load(open(sys.argv[1]))['tensors']))" "$WORK/preset.inspect.json")

"$QF" -q convert "$fx" --to gguf --target-size "$budget" --imatrix "$WORK/im.gguf" --calib "$calib" --probe-spans 2 \
  -o "$WORK/mix.gguf" && [[ -f "$WORK/mix.mix.json" ]] && ok "convert to a size budget" || fail "convert --target-size $budget"
"$QF" inspect "$WORK/mix.gguf" --json >"$WORK/mix.inspect.json"
$PY - "$WORK/mix.inspect.json" "$WORK/preset.inspect.json" "$WORK/mix.mix.json" "$budget" "$WORK/mix.gguf" "$WORK/preset.gguf" <<'PYEOF' \
  && ok "the file holds the planned types, within the budget and no larger than the preset" || fail "mix file"
import json, os, sys
mix, preset, plan = [json.load(open(p)) for p in sys.argv[1:4]]
budget = int(sys.argv[4])
types = {t["name"]: t["type"] for t in mix["tensors"]}
planned = {t["name"]: t["type"] for t in plan["tensors"]}
assert types == planned, (types, planned)
data = sum((t["bytes"] + 31) // 32 * 32 for t in mix["tensors"])
assert data == plan["bytes"] <= budget, (data, plan["bytes"], budget)
assert os.path.getsize(sys.argv[5]) <= os.path.getsize(sys.argv[6])
assert len(set(types.values())) > 2, types  # a mix, not one type
assert plan["predicted_kld"] <= plan["lagrangian"]["predicted_kld"] + 1e-12, plan["lagrangian"]
q4 = [p for p in plan["presets"] if p["name"] == "Q4_K_M"][0]
assert q4["bytes"] == budget, (q4, budget)
assert plan["predicted_kld"] < q4["predicted_kld"], (plan["predicted_kld"], q4)
PYEOF
for m in mix preset; do
  "$QF" -q eval "$WORK/$m.gguf" --baseline "$fx" --text "$evaltxt" --max-chunks 8 --json "$WORK/$m.eval.json" >/dev/null || fail "eval $m"
done
$PY - "$WORK/mix.eval.json" "$WORK/preset.eval.json" "$WORK/mix.mix.json" <<'PYEOF' \
  && ok "measured KL below Q4_K_M's at its size, and near the predicted one" || fail "mix vs preset KL: $(cat "$WORK/mix.eval.json")"
import json, sys
mix, preset, plan = [json.load(open(p)) for p in sys.argv[1:4]]
m, p = mix["kld"]["mean"], preset["kld"]["mean"]
print(f"mix {m:.6f} preset {p:.6f} predicted {plan['predicted_kld']:.6f}")
assert 0 < m < 0.9 * p, (m, p)
assert 0.5 < m / plan["predicted_kld"] < 2, (m, plan["predicted_kld"])
PYEOF

# Another budget from the same measurements (--sensitivity): nothing measured
# again, the plan's imatrix file used for the weights.
"$QF" -q convert "$fx" --to gguf --target-bpw 4.4 --sensitivity "$WORK/mix.mix.json" -o "$WORK/re.gguf" \
  && "$QF" inspect "$WORK/re.gguf" --json >"$WORK/re.inspect.json" \
  && $PY - "$WORK/re.mix.json" "$WORK/mix.mix.json" "$WORK/re.inspect.json" <<'PYEOF' && ok "--sensitivity solves another budget from a plan" || fail "--sensitivity"
import json, sys
re, first, ins = [json.load(open(p)) for p in sys.argv[1:4]]
assert re["bits_per_weight"] <= 4.4 and re["bytes"] < first["bytes"], (re["bits_per_weight"], first["bytes"])
assert re["seconds"]["probes"] == 0 and re["imatrix"] == first["imatrix"], re["seconds"]
assert ins["metadata"]["quantize.imatrix.entries_count"] > 0
assert {t["name"]: t["type"] for t in ins["tensors"]} == {t["name"]: t["type"] for t in re["tensors"]}
PYEOF
echo '{"tensors": []}' >"$WORK/notaplan.json"
expect_exit 3 "notaplan.json: not a plan" -- "$QF" convert "$fx" --to gguf --target-bpw 4.4 --sensitivity "$WORK/notaplan.json" -o "$WORK/bad.gguf"
expect_exit 3 "the plan has 39 tensors, the model .* 33" -- "$QF" convert "$moe" --to gguf --target-bpw 4.4 --sensitivity "$WORK/mix.mix.json" -o "$WORK/bad.gguf"

# Sampled probes (as on large models), as a plan only: printed, the JSON
# written, no model; some fits interpolated, the budget still met.
"$QF" -q convert "$fx" --to gguf --target-bpw 4.5 --imatrix "$WORK/im.gguf" --calib "$calib" --probe-spans 1 \
  --max-probes 12 --dry-run --json "$WORK/sampled.json" -o "$WORK/s.gguf" >"$WORK/plan.txt" \
  && grep -q "^total: " "$WORK/plan.txt" && grep -q "Q4_K_M" "$WORK/plan.txt" && [[ ! -e "$WORK/s.gguf" ]] \
  && ok "--dry-run prints the allocation and writes no model" || fail "dry run: $(cat "$WORK/plan.txt")"
$PY - "$WORK/sampled.json" <<'PYEOF' && ok "--max-probes probes a sample and interpolates the rest" || fail "sampled probes"
import json, sys
j = json.load(open(sys.argv[1]))
searched = [t for t in j["tensors"] if "probes" in t]
probed = [t for t in searched if t["probes"]]
assert 0 < len(probed) < len(searched), (len(probed), len(searched))
assert all(t["fit"]["scale"] > 0 for t in searched)
assert j["bytes"] <= j["budget_bytes"] and j["bits_per_weight"] <= 4.5
PYEOF

# Mixture of experts: one type per stacked expert tensor, the file loads.
"$QF" -q convert "$moe" --to gguf --target-bpw 4.5 --calib "$calib" --probe-spans 1 -o "$WORK/moe.gguf" \
  && "$QF" inspect "$WORK/moe.gguf" --json | $PY -c "import json,sys; assert json.load(sys.stdin)['metadata']['quantize.imatrix.entries_count'] > 0" \
  && "$QF" -q eval "$WORK/moe.gguf" --baseline "$moe" --text "$evaltxt" --max-chunks 2 --json "$WORK/moe.eval.json" >/dev/null \
  && $PY - "$WORK/moe.mix.json" "$WORK/moe.eval.json" <<'PYEOF' && ok "MoE: stacked experts in the budget, the file evaluates" || fail "moe mix"
import json, sys
plan, ev = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
exps = [t for t in plan["tensors"] if "_exps." in t["name"]]
assert exps and all(t["probes"] for t in exps), exps
assert plan["bits_per_weight"] <= 4.5 and plan["imatrix"].startswith("computed from"), plan["bits_per_weight"]
assert 0 < ev["kld"]["mean"] < 0.05, ev["kld"]
PYEOF

# Bad requests: one line, the exit code, nothing written.
out="$WORK/bad.gguf"
expect_exit 2 "exclude each other" -- "$QF" convert "$fx" --to gguf --type Q4_K_M --target-bpw 5 --calib "$calib" -o "$out"
expect_exit 2 "needs --calib" -- "$QF" convert "$fx" --to gguf --target-bpw 5 -o "$out"
expect_exit 2 "--types: unknown tensor type 'q9_K'" -- "$QF" convert "$fx" --to gguf --target-bpw 5 --calib "$calib" --types q4_K,q9_K -o "$out"
expect_exit 2 "apply to a size budget" -- "$QF" convert "$fx" --to gguf --type Q4_K_M --calib "$calib" -o "$out"
expect_exit 2 "--target-size" -- "$QF" convert "$fx" --to gguf --target-size 3MiBs --calib "$calib" -o "$out"
expect_exit 3 "below the smallest file the types allow" -- "$QF" -q convert "$fx" --to gguf --target-bpw 2 --calib "$calib" \
  --imatrix "$WORK/im.gguf" --probe-spans 1 -o "$out"
expect_exit 3 "below the smallest file the types allow" -- "$QF" -q convert "$fx" --to gguf --target-bpw 5 --types q8_0 \
  --calib "$calib" --imatrix "$WORK/im.gguf" --probe-spans 1 -o "$out"
echo keep >"$WORK/kept.json"
expect_exit 5 "kept.json: --json already exists" -- "$QF" convert "$fx" --to gguf --target-bpw 5 --calib "$calib" --dry-run \
  --json "$WORK/kept.json" -o "$out"
[[ $(cat "$WORK/kept.json") == keep ]] && ok "a dry run does not replace an existing --json" || fail "--json replaced by a dry run"
expect_exit 2 "the types do not apply" -- "$QF" convert "$fx" --to gguf --target-bpw 4.4 --types q4_K \
  --sensitivity "$WORK/mix.mix.json" -o "$out"
[[ ! -e "$out" && ! -e "$WORK/bad.mix.json" ]] && ok "no output after the failures" || fail "partial output left: $(ls "$WORK")"

finish
