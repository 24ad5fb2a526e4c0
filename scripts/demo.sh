#!/usr/bin/env bash
# The main job on the bundled fixture model: installs dependencies, builds the
# CLI, inspects the fixture, generates from it and evaluates its perplexity on
# the held-out text (later steps quantize it first). Without the fixture (a
# partial checkout) it inspects a small generated checkpoint.
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
echo "== quantforge generate $model --prompt 'The President' -n 32" >&2
"$qf" generate "$model" --prompt "The President" -n 32
echo "== quantforge eval $model --text tests/data/text/evaluation.txt --max-chunks 40" >&2
"$qf" eval "$model" --text tests/data/text/evaluation.txt --max-chunks 40 --json build/demo-eval.json
echo "== report: build/demo-eval.json" >&2
