#!/usr/bin/env bash
# The main job on the bundled fixture model: installs dependencies, builds the
# CLI, inspects the fixture, quantizes it to GGUF Q4_K_M and (GPTQ, from
# recipes/w4a16-gptq.yaml) to a compressed-tensors W4A16 checkpoint, generates
# from the GGUF file and evaluates both against the f16 model on the held-out
# text with a KL-divergence gate. Without the fixture (a partial checkout) it
# inspects a small generated checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh --target quantforge
qf=build/bin/quantforge
model=tests/data/fixture-llama
if [[ ! -f "$model/config.json" ]]; then
  model=build/demo-model
  rm -rf "$model"
  /usr/bin/python3 tests/tools/make_checkpoint.py "$model" --shards 2 >/dev/null
  echo "== quantforge inspect $model" >&2
  "$qf" inspect "$model"
  exit 0
fi
echo "== quantforge inspect $model" >&2
"$qf" inspect "$model"
mkdir -p build/demo
rm -f build/demo/fixture-Q4_K_M.gguf  # a second run makes it again
echo "== quantforge convert $model --to gguf --type Q4_K_M -o build/demo/fixture-Q4_K_M.gguf" >&2
"$qf" convert "$model" --to gguf --type Q4_K_M -o build/demo/fixture-Q4_K_M.gguf
echo "== quantforge generate build/demo/fixture-Q4_K_M.gguf --prompt 'The President' -n 32" >&2
"$qf" generate build/demo/fixture-Q4_K_M.gguf --prompt "The President" -n 32
echo "== quantforge eval build/demo/fixture-Q4_K_M.gguf --baseline $model (gate: mean KL <= 0.01)" >&2
"$qf" eval build/demo/fixture-Q4_K_M.gguf --text tests/data/text/evaluation.txt --max-chunks 40 \
  --baseline "$model" --max-kld 0.01 --json build/demo/eval.json
rm -rf build/demo/fixture-w4a16-gptq
echo "== quantforge quantize $model --recipe recipes/w4a16-gptq.yaml -o build/demo/fixture-w4a16-gptq" >&2
"$qf" quantize "$model" --recipe recipes/w4a16-gptq.yaml -o build/demo/fixture-w4a16-gptq
echo "== quantforge eval build/demo/fixture-w4a16-gptq --baseline $model (gate: mean KL <= 0.01)" >&2
"$qf" eval build/demo/fixture-w4a16-gptq --text tests/data/text/evaluation.txt --max-chunks 40 \
  --baseline "$model" --max-kld 0.01 --json build/demo/eval-gptq.json
echo "== reports: build/demo/eval.json, build/demo/eval-gptq.json" >&2
