# quantization_report.json and the recipe copy: the report describes the run,
# `quantize --json` prints it, and re-running the copied recipe.yaml (from
# another folder, without --calib) reproduces the output byte for byte.
source "$(dirname "$0")/lib.sh"
M="$SRC/tests/data/fixture-llama"

# --calib given as a relative path, from the source tree: the copy must not keep it relative.
(cd "$SRC/tests/data" && "$QF" -q quantize fixture-llama --recipe recipes/w4-rtn.yaml -o "$WORK/a" \
   --calib text/calibration.txt --json --threads 2 >"$WORK/a.json")
(cd "$SRC/tests/data" && "$QF" -q quantize fixture-llama --recipe recipes/w4-gptq.yaml -o "$WORK/g" \
   --calib text/calibration.txt --threads 2 --eval text/evaluation.txt --eval-chunks 2 >/dev/null)
$PY - "$WORK" <<'PYEOF' && ok "report contents" || fail "report contents"
import json, os, sys
w = sys.argv[1]
a = json.load(open(os.path.join(w, "a/quantization_report.json")))
assert json.load(open(os.path.join(w, "a.json"))) == a, "--json differs from the file"
assert a["tool"]["name"] == "quantforge" and a["tool"]["version"]
assert "quantize fixture-llama --recipe recipes/w4-rtn.yaml" in a["invocation"]
assert a["calibration"] is None  # RTN reads no calibration data
assert a["evaluation"] is None
assert a["totals"]["linears"] == len(a["linears"]) == 28
assert all(l["bits_per_weight"] == 4.125 for l in a["linears"])  # int4 + an f16 scale per 128
g = json.load(open(os.path.join(w, "g/quantization_report.json")))
c = g["calibration"]
assert os.path.isabs(c["dataset"]) and c["dataset"].endswith("tests/data/text/calibration.txt")
assert c["samples"] == 16 and c["tokens"] == 16 * 256 and c["seed"] == 0
assert g["method"] == "gptq" and all(l["method"] == "gptq" and 0 < l["error"] < 0.2 for l in g["linears"])
assert len(g["layers"]) == 4 and all(l["seconds"] >= 0 for l in g["layers"])
e = g["evaluation"]
assert e["valid"] and e["model"] == os.path.join(w, "g")
assert e["baseline"]["ppl"] > 1 and e["kld"]["mean"] > 0
assert g["totals"]["peak_rss_bytes"] > 0 and g["totals"]["seconds"] > 0
m = json.load(open(os.path.join(w, "g/quantforge_manifest.json")))
assert "quantization_report.json" in [f["path"] for f in m["files"]]
PYEOF

# The copied recipe, run from elsewhere without --calib: the same weights.
(cd "$WORK" && "$QF" -q quantize "$M" --recipe g/recipe.yaml -o "$WORK/g2" --threads 2 >/dev/null)
if cmp -s "$WORK/g/model.safetensors" "$WORK/g2/model.safetensors"; then
  ok "the copied recipe.yaml reproduces the output"
else
  fail "the copied recipe.yaml gives different weights"
fi
finish
