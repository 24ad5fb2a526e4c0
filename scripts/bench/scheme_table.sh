#!/usr/bin/env bash
# One table for every quantization scheme on the bundled fixture: model size,
# bits per weight of the decoder Linears, and perplexity / KL divergence
# against the f16 model on the first 40 chunks (llama.cpp's convention) of
# tests/data/text/evaluation.txt and, when ../shared is present, of the
# WikiText-2 test set. Recipes calibrate on tests/data/text/calibration.txt.
# A recipe the model does not support gets a row saying so. The last row is
# Q4_K_M with output.weight and token_embd.weight kept f16, as the recipes
# keep lm_head and the embeddings.
#
#   scripts/bench/scheme_table.sh [--chunks 40] [--model tests/data/fixture-mixtral]
set -euo pipefail
cd "$(dirname "$0")/../.."
chunks=40
fx=tests/data/fixture-llama
while [[ $# -gt 0 ]]; do
  case "$1" in
    --chunks) chunks="$2"; shift 2 ;;
    --model) fx="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
scripts/build.sh --target quantforge >/dev/null
qf=build/bin/quantforge
out=build/bench/schemes-$(basename "$fx")
wiki=../shared/data/wikitext-2-raw/wiki.test.raw
rm -rf "$out" && mkdir -p "$out"

row() {  # row NAME MODEL COMMAND
  local name="$1" model="$2" cmd="$3"
  "$qf" -q eval "$model" --text tests/data/text/evaluation.txt --max-chunks "$chunks" --baseline "$fx" \
    --json "$out/$name.eval.json" >/dev/null
  if [[ -f $wiki ]]; then
    "$qf" -q eval "$model" --text "$wiki" --max-chunks "$chunks" --baseline "$fx" --json "$out/$name.wiki.json" >/dev/null
  fi
  /usr/bin/python3 scripts/bench/model_bits.py "$name" "$model" "$out/$name" "$cmd" "$fx"
}

echo "| scheme | size (bytes) | bits/weight (decoder Linears) | evaluation.txt ppl (delta) | KLD | WikiText-2 ppl (delta) | KLD | command |"
echo "|---|---|---|---|---|---|---|---|"
row "FP16" "$fx" "(the fixture itself)"
while read -r name recipe; do
  cmd="quantforge quantize $fx --recipe $recipe -o OUT"
  if ! "$qf" -q quantize "$fx" --recipe "$recipe" -o "$out/$name" >"$out/$name.log" 2>"$out/$name.err"; then
    grep -q "unsupported" "$out/$name.err" || { cat "$out/$name.err" >&2; exit 1; }
    echo "| $name | refused: $(sed 's/.*: \([A-Za-z]*Modifier is not supported for [a-z-]* models\).*/\1/' "$out/$name.err") | | | | | | \`$cmd\` |"
    continue
  fi
  row "$name" "$out/$name" "$cmd"
done <<'LIST'
W4A16-RTN recipes/w4a16-rtn.yaml
W4A16-GPTQ recipes/w4a16-gptq.yaml
W4A16_ASYM-AWQ recipes/w4a16-awq.yaml
W4A16-AWQ+GPTQ recipes/w4a16-awq-gptq.yaml
W8A8-RTN recipes/w8a8-rtn.yaml
W8A8-SmoothQuant+GPTQ recipes/w8a8-smoothquant.yaml
FP8 recipes/fp8.yaml
FP8_DYNAMIC recipes/fp8-dynamic.yaml
NVFP4 recipes/nvfp4.yaml
NVFP4A16 recipes/nvfp4a16.yaml
LIST
for p in Q8_0 Q6_K Q5_K_M Q4_K_M Q3_K_M Q2_K; do
  "$qf" -q convert "$fx" --to gguf --type "$p" -o "$out/$p.gguf"
  row "GGUF-$p" "$out/$p.gguf" "quantforge convert $fx --to gguf --type $p -o OUT.gguf"
done
keep="--output-tensor-type f16 --token-embedding-type f16"
"$qf" -q convert "$fx" --to gguf --type Q4_K_M $keep -o "$out/Q4_K_M-f16-ends.gguf"
row "GGUF-Q4_K_M-f16-output-embd" "$out/Q4_K_M-f16-ends.gguf" "quantforge convert $fx --to gguf --type Q4_K_M $keep -o OUT.gguf"
