#!/usr/bin/env bash
# LoRA adapters (docs/lora.md): on the fixture and its adapters, perplexity on
# the adapters' held-out text (tests/data/text/adapter_eval.txt, every chunk)
# and KL divergence against the merged f16 model, for the base, the adapter
# merged and unmerged, merged-then-quantized (GPTQ W4A16, GGUF Q4_K_M) and a
# quantized base with the adapter applied unmerged (GPTQ W4A16, bitsandbytes
# NF4, GGUF Q4_K_M + the gguf-lora adapter). Writes OUT/summary.md (the table
# of docs/benchmarks.md, "LoRA adapters") and every output under OUT.
#
#   scripts/bench/lora.sh [QUANTFORGE] [OUT]
set -euo pipefail
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
QF="${1:-$SRC/build/bin/quantforge}"
OUT="${2:-$SRC/build/bench-lora}"
PY=/usr/bin/python3
fx="$SRC/tests/data/fixture-llama"
calib="$SRC/tests/data/text/calibration.txt"
txt="$SRC/tests/data/text/adapter_eval.txt"
rm -rf "$OUT" && mkdir -p "$OUT"
q() { "$QF" -q "$@"; }

rows=()
ev() {  # ev NAME ADAPTER MODEL [eval flags...]: against the merged f16 model
  local name="$1" adapter="$2" model="$3"; shift 3
  q eval "$model" --text "$txt" --baseline "$fx" --baseline-lora "$SRC/tests/data/lora-llama/$adapter" \
    --baseline-lora-mode merge --json "$OUT/$name.json" "$@" >/dev/null
  rows+=("$name")
}
for a in lora dora; do
  ad="$SRC/tests/data/lora-llama/$a"
  ev "$a: base" "$a" "$fx"
  ev "$a: adapter merged (f16)" "$a" "$fx" --lora "$ad" --lora-mode merge
  ev "$a: adapter unmerged (f16 base)" "$a" "$fx" --lora "$ad" --lora-mode forward
  q quantize "$fx" --lora "$ad" --recipe "$SRC/recipes/w4a16-gptq.yaml" --calib "$calib" -o "$OUT/$a-merged-w4a16" >/dev/null
  ev "$a: merged, then GPTQ W4A16" "$a" "$OUT/$a-merged-w4a16"
  [[ -d "$OUT/base-w4a16" ]] || q quantize "$fx" --recipe "$SRC/recipes/w4a16-gptq.yaml" --calib "$calib" -o "$OUT/base-w4a16" >/dev/null
  ev "$a: GPTQ W4A16 base + adapter unmerged" "$a" "$OUT/base-w4a16" --lora "$ad"
  [[ -d "$OUT/base-nf4" ]] || q quantize "$fx" --recipe "$SRC/recipes/nf4-bnb.yaml" -o "$OUT/base-nf4" >/dev/null
  ev "$a: NF4 base + adapter unmerged (QLoRA)" "$a" "$OUT/base-nf4" --lora "$ad"
  q convert "$fx" --lora "$ad" --to gguf --type Q4_K_M -o "$OUT/$a-merged-q4km.gguf"
  ev "$a: merged, then GGUF Q4_K_M" "$a" "$OUT/$a-merged-q4km.gguf"
done
q convert "$fx" --to gguf --type Q4_K_M -o "$OUT/base-q4km.gguf"
q convert "$SRC/tests/data/lora-llama/lora" --to gguf-lora --base "$fx" -o "$OUT/lora.gguf"
ev "lora: GGUF Q4_K_M base + lora.gguf unmerged" lora "$OUT/base-q4km.gguf" --lora "$OUT/lora.gguf"

$PY - "$OUT" "${rows[@]}" >"$OUT/summary.md" <<'PYEOF'
import json, sys
out, rows = sys.argv[1], sys.argv[2:]
print("| model | perplexity | KL vs merged f16 (mean) | top-1 agreement |")
print("|---|---|---|---|")
for r in rows:
    j = json.load(open(f"{out}/{r}.json"))
    k = j['kld']['mean']
    print(f"| {r} | {j['ppl']:.3f} | {k:.6f} | {100 * j['top1_agreement']:.2f}% |" if k >= 1e-4 else
          f"| {r} | {j['ppl']:.3f} | {k:.1e} | {100 * j['top1_agreement']:.2f}% |")
PYEOF
cat "$OUT/summary.md"
