#!/usr/bin/env bash
# The main job on the bundled fixture model: installs dependencies, builds the
# CLI and inspects the fixture (later steps quantize and evaluate it). Without
# the fixture (a partial checkout) it inspects a small generated checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh --target quantforge
model=tests/data/fixture-llama
if [[ ! -f "$model/config.json" ]]; then
  model=build/demo-model
  rm -rf "$model"
  /usr/bin/python3 tests/tools/make_checkpoint.py "$model" --shards 2 >/dev/null
fi
echo "== quantforge inspect $model" >&2
build/bin/quantforge inspect "$model"
