#!/usr/bin/env bash
# Mixed precision to a size budget, compressed-tensors (docs/mixed-precision.md):
# on the fixture, the searched mixes against uniform schemes and the "first
# and last layer in the higher scheme" heuristic at the same size, and the
# predicted KL divergence of 20 searched mixes against the measured one.
# Writes OUT/summary.md (the tables of docs/benchmarks.md, "Mixed precision: compressed-tensors") and every
# output, recipe and eval JSON under OUT.
#
#   scripts/bench/mixed_precision_ct.sh [QUANTFORGE] [OUT]
set -euo pipefail
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
QF="${1:-$SRC/build/bin/quantforge}"
OUT="${2:-$SRC/build/bench-mixed-ct}"
PY=/usr/bin/python3
fx="$SRC/tests/data/fixture-llama"
calib="$SRC/tests/data/text/calibration.txt"
evaltxt="$SRC/tests/data/text/evaluation.txt"
wiki="$SRC/../shared/data/wikitext-2-raw/wiki.test.raw"
SWEEP_CHUNKS="${SWEEP_CHUNKS:-60}"  # evaluation.txt chunks per sweep mix
mkdir -p "$OUT"

# The recipe of a mix: QuantizationModifier (round to nearest) plus a
# mixed_precision section, or a scheme mapping; JSON is YAML.
mixed_recipe() {  # FILE SCHEMES_JSON TARGET_BYTES
  cat >"$1" <<EOF
{"quant_stage": {"quant_modifiers": {"QuantizationModifier": {"targets": ["Linear"], "ignore": ["lm_head"]}}},
 "mixed_precision": {"target_size": "$3", "schemes": $2},
 "calibration": {"num_samples": 8, "seq_len": 512}}
EOF
}
uniform_recipe() {  # FILE SCHEME
  cat >"$1" <<EOF
{"quant_stage": {"quant_modifiers": {"QuantizationModifier": {"targets": ["Linear"], "ignore": ["lm_head"], "scheme": "$2"}}}}
EOF
}
# quantize NAME [eval chunks]: OUT/NAME.yaml -> OUT/NAME, evaluated on the
# evaluation text (all chunks, or N) and, for the table, WikiText-2 (40 chunks).
run() {
  local name="$1" chunks="${2:-0}"
  [[ -d "$OUT/$name" ]] || "$QF" -q quantize "$fx" --recipe "$OUT/$name.yaml" --calib "$calib" -o "$OUT/$name" >/dev/null
  local extra=()
  [[ "$chunks" -gt 0 ]] && extra=(--max-chunks "$chunks")
  [[ -f "$OUT/$name.eval.json" ]] ||
    "$QF" -q eval "$OUT/$name" --baseline "$fx" --text "$evaltxt" "${extra[@]}" --json "$OUT/$name.eval.json" >/dev/null
  if [[ "$chunks" -eq 0 && -f "$wiki" && ! -f "$OUT/$name.wiki.json" ]]; then
    "$QF" -q eval "$OUT/$name" --baseline "$fx" --text "$wiki" --max-chunks 40 --json "$OUT/$name.wiki.json" >/dev/null
  fi
  echo "done: $name"
}

# 1. Every item's options (bytes, predicted KL) in four schemes: a dry run.
mixed_recipe "$OUT/search.yaml" '["W4A16", "NVFP4A16", "W8A16", "FP8"]' 100GB
[[ -f "$OUT/search.json" ]] ||
  "$QF" -q quantize "$fx" --recipe "$OUT/search.yaml" --calib "$calib" -o "$OUT/unused" --dry-run --json >"$OUT/search.json"
read -r B_NV B_W4 B_W8 <<<"$($PY - "$OUT/search.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))["mixed_precision"]
size = lambda s: sum(i["options"][s]["bytes"] for i in r["items"])
w = r["targeted_weights"]
print(size("NVFP4A16") + w // 16, size("W4A16") + w // 8, size("W8A16"))  # +0.5 and +1 bit per weight
PYEOF
)"
echo "budgets: NVFP4A16 + 0.5 bit = $B_NV bytes, W4A16 + 1 bit = $B_W4 bytes"

# 2. Uniform schemes, searched mixes, the heuristic.
for s in NVFP4A16 W4A16 W8A16 FP8; do uniform_recipe "$OUT/uniform-$s.yaml" "$s"; run "uniform-$s"; done
mixed_recipe "$OUT/mix-nv-2.yaml" '["NVFP4A16", "W8A16"]' "$B_NV"; run mix-nv-2
mixed_recipe "$OUT/mix-nv-3.yaml" '["W4A16", "NVFP4A16", "W8A16"]' "$B_NV"; run mix-nv-3
mixed_recipe "$OUT/mix-w4-2.yaml" '["W4A16", "W8A16"]' "$B_W4"; run mix-w4-2
mixed_recipe "$OUT/mix-w4-3.yaml" '["W4A16", "NVFP4A16", "W8A16"]' "$B_W4"; run mix-w4-3
# The heuristic: the first and the last layer's items promoted to W8A16, in
# turn (first layer's q/k/v, last layer's q/k/v, first layer's o, ...), while
# the budget allows; the rest in the base scheme.
$PY - "$OUT" "$B_NV" "$B_W4" <<'PYEOF'
import json, sys
out, b_nv, b_w4 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = json.load(open(f"{out}/search.json"))["mixed_precision"]
items = r["items"]
layers = sorted({int(i["item"].split(".")[2]) for i in items})
first = [i for i in items if int(i["item"].split(".")[2]) == layers[0]]
last = [i for i in items if int(i["item"].split(".")[2]) == layers[-1]]
order = [x for pair in zip(first, last) for x in pair]
for name, base, budget in (("heur-nv", "NVFP4A16", b_nv), ("heur-w4", "W4A16", b_w4)):
    high = set()
    size = sum(i["options"][base]["bytes"] for i in items)
    for i in order:
        extra = i["options"]["W8A16"]["bytes"] - i["options"][base]["bytes"]
        if size + extra <= budget:
            high.add(i["item"])
            size += extra
    mapping = {base: [i["target"] for i in items if i["item"] not in high],
               "W8A16": [i["target"] for i in items if i["item"] in high]}
    rec = {"quant_stage": {"quant_modifiers": {"QuantizationModifier": {"ignore": ["lm_head"], "scheme": mapping}}}}
    json.dump(rec, open(f"{out}/{name}.yaml", "w"), indent=1)
    json.dump({"items_high": sorted(high), "bytes": size, "choice": {i["item"]: ("W8A16" if i["item"] in high else base) for i in items}},
              open(f"{out}/{name}.mix.json", "w"), indent=1)
PYEOF
run heur-nv
run heur-w4

# 3. The sweep: 20 budgets from uniform W4A16 to uniform W8A16, three schemes.
mapfile -t SWEEP < <($PY -c "import sys; a,b=int(sys.argv[1])-int(sys.argv[3])//8+1,int(sys.argv[2]); [print(a+(b-a)*k//19) for k in range(20)]" "$B_W4" "$B_W8" \
  "$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['mixed_precision']['targeted_weights'])" "$OUT/search.json")")
k=0
for b in "${SWEEP[@]}"; do
  mixed_recipe "$OUT/sweep-$k.yaml" '["W4A16", "NVFP4A16", "W8A16"]' "$b"
  run "sweep-$k" "$SWEEP_CHUNKS"
  k=$((k + 1))
done

# 4. The tables.
$PY - "$OUT" "$B_NV" "$B_W4" "$SWEEP_CHUNKS" <<'PYEOF'
import json, os, sys
out, b_nv, b_w4, sweep_chunks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
search = json.load(open(f"{out}/search.json"))["mixed_precision"]
W = search["targeted_weights"]
opts = {i["item"]: i["options"] for i in search["items"]}
def predicted(choice):  # item -> scheme, from the four-scheme search's costs
    return sum(opts[it][s]["predicted_kld"] for it, s in choice.items())
def load(name):
    rep = json.load(open(f"{out}/{name}/quantization_report.json"))
    mp = rep.get("mixed_precision")
    if mp:
        choice = {i["item"]: i["scheme"] for i in mp["items"]}
    elif os.path.exists(f"{out}/{name}.mix.json"):
        choice = json.load(open(f"{out}/{name}.mix.json"))["choice"]
    else:
        s = name.split("-", 1)[1]
        choice = {it: s for it in opts}
    size = sum(opts[it][s]["bytes"] for it, s in choice.items())
    ev = json.load(open(f"{out}/{name}.eval.json"))
    wk = json.load(open(f"{out}/{name}.wiki.json")) if os.path.exists(f"{out}/{name}.wiki.json") else None
    return dict(name=name, bytes=size, bits=8 * size / W, pred=predicted(choice), kld=ev["kld"]["mean"], ppl=ev["ppl"],
                wiki=wk["kld"]["mean"] if wk else float("nan"), mp=mp, choice=choice)
def rank(v):
    s = sorted(range(len(v)), key=lambda i: v[i]); r = [0.0] * len(v); i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and v[s[j + 1]] == v[s[i]]: j += 1
        for k in range(i, j + 1): r[s[k]] = (i + j) / 2
        i = j + 1
    return r
def spearman(a, b):
    ra, rb = rank(a), rank(b); n = len(a); ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    return cov / (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
L = []
L.append(f"Linears targeted: {W} weights; budgets: NVFP4A16 + 0.5 bit = {b_nv} bytes ({8*b_nv/W:.4f} bits per weight), "
         f"W4A16 + 1 bit = {b_w4} bytes ({8*b_w4/W:.4f}).\n")
L.append("| output | schemes (items per scheme) | bytes | bits/weight | predicted KL | KL evaluation.txt | PPL evaluation.txt | KL WikiText-2 (40 chunks) |")
L.append("|---|---|---:|---:|---:|---:|---:|---:|")
rows = ["uniform-W4A16", "uniform-NVFP4A16", "uniform-W8A16", "uniform-FP8", "heur-nv", "mix-nv-2", "mix-nv-3", "heur-w4", "mix-w4-2", "mix-w4-3"]
res = {n: load(n) for n in rows}
for n in rows:
    r = res[n]
    cnt = {}
    for s in r["choice"].values(): cnt[s] = cnt.get(s, 0) + 1
    desc = ", ".join(f"{s} {c}" for s, c in cnt.items())
    L.append(f"| {n} | {desc} | {r['bytes']} | {r['bits']:.4f} | {r['pred']:.6f} | {r['kld']:.6f} | {r['ppl']:.4f} | {r['wiki']:.6f} |")
L.append("")
L.append("Lagrangian bisection against the exact allocation (predicted KL):\n")
L.append("| mix | exact bytes | exact predicted KL | Lagrangian bytes | Lagrangian predicted KL | Lagrangian worse by |")
L.append("|---|---:|---:|---:|---:|---:|")
for n in ["mix-nv-2", "mix-nv-3", "mix-w4-2", "mix-w4-3"]:
    mp = res[n]["mp"]
    L.append(f"| {n} | {mp['bytes']} | {mp['predicted_kld']:.6f} | {mp['lagrangian']['bytes']} | {mp['lagrangian']['predicted_kld']:.6f} | "
             f"{100*(mp['lagrangian']['predicted_kld']/mp['predicted_kld']-1):+.2f}% |")
sweep = [load(f"sweep-{k}") for k in range(20)]
L.append("")
L.append(f"Predicted against measured KL, 20 searched mixes (W4A16, NVFP4A16, W8A16), evaluation.txt {sweep_chunks} chunks:\n")
L.append("| mix | bits/weight | W4A16 / NVFP4A16 / W8A16 items | predicted KL | measured KL | measured / predicted |")
L.append("|---|---:|---|---:|---:|---:|")
for r in sweep:
    c = [sum(1 for s in r["choice"].values() if s == x) for x in ("W4A16", "NVFP4A16", "W8A16")]
    L.append(f"| {r['name']} | {r['bits']:.4f} | {c[0]} / {c[1]} / {c[2]} | {r['pred']:.6f} | {r['kld']:.6f} | {r['kld']/r['pred']:.3f} |")
rho = spearman([r["pred"] for r in sweep], [r["kld"] for r in sweep])
allr = sweep + [res[n] for n in rows if n != "uniform-FP8"]
rho_all = spearman([r["pred"] for r in allr], [r["kld"] for r in allr])
L.append("")
L.append(f"Spearman rank correlation, predicted against measured: {rho:.4f} over the 20 sweep mixes; "
         f"{rho_all:.4f} over those and the weight-only rows of the first table ({len(allr)} mixes; their KL on the whole text).")
text = "\n".join(L) + "\n"
open(f"{out}/summary.md", "w").write(text)
print(text)
PYEOF
