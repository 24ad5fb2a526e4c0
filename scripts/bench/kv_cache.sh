#!/usr/bin/env bash
# KV-cache formats on the bundled fixtures: every format's table from
# `kv-sweep` (bytes per token, KL against the f16 cache, perplexity, decode
# speed) at the fixtures' full context of 2048, over 4 windows of
# tests/data/text/evaluation.txt (and of WikiText-2 when ../shared is
# present); decode tokens/s at short (128) and long (1984) context; and, when
# LLAMA_BIN names llama.cpp's build/bin, llama-perplexity -fa with the same
# cache types on the same f16 GGUF against `quantforge eval`.
#
#   scripts/bench/kv_cache.sh
#   QF_BIN=/path/to/quantforge LLAMA_BIN=/path/to/llama.cpp/build/bin scripts/bench/kv_cache.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ -z ${QF_BIN:-} ]]; then
  scripts/build.sh --target quantforge >/dev/null
  QF_BIN=build/bin/quantforge
fi
qf=$QF_BIN
out=build/bench/kv-cache
text=tests/data/text/evaluation.txt
wiki=../shared/data/wikitext-2-raw/wiki.test.raw
rm -rf "$out" && mkdir -p "$out"

for fx in fixture-llama fixture-mixtral; do
  "$qf" -q kv-sweep "tests/data/$fx" --text "$text" --ctx 2048 --max-chunks 4 --max-kld 0.005 \
    --json "$out/$fx.json" >"$out/$fx.txt"
  echo "### $fx, evaluation.txt, 4 x 2048"
  cat "$out/$fx.txt"
  if [[ -f $wiki ]]; then
    "$qf" -q kv-sweep "tests/data/$fx" --text "$wiki" --ctx 2048 --max-chunks 4 --decode-tokens 0 \
      --json "$out/$fx-wiki.json" >"$out/$fx-wiki.txt"
    echo "### $fx, WikiText-2, 4 x 2048"
    cat "$out/$fx-wiki.txt"
  fi
done

echo "### decode tokens/s, fixture-llama, best of 5 (-n 64)"
echo "| cache | p 128 | p 1984 |"
echo "|---|---|---|"
for kv in f16 q8_0 q4_0 iq4_nl q4_1 nvfp4 kivi2 "turboquant_4bit_nc --kv-f16-edge-layers 0"; do
  "$qf" -q bench tests/data/fixture-llama -p 128 -n 64 --reps 5 --kv-dtype $kv --json "$out/b.json" >/dev/null
  short=$(/usr/bin/python3 -c 'import json,sys; print("%.1f" % json.load(open(sys.argv[1]))["decode_tokens_per_s"])' "$out/b.json")
  "$qf" -q bench tests/data/fixture-llama -p 1984 -n 64 --reps 5 --kv-dtype $kv --json "$out/b.json" >/dev/null
  long=$(/usr/bin/python3 -c 'import json,sys; print("%.1f" % json.load(open(sys.argv[1]))["decode_tokens_per_s"])' "$out/b.json")
  echo "| $kv | $short | $long |"
done

if [[ -n ${LLAMA_BIN:-} ]]; then
  "$qf" -q convert tests/data/fixture-llama --to gguf --type F16 -o "$out/fx-f16.gguf" --force
  echo "### llama-perplexity -fa against quantforge eval, fixture-llama F16 GGUF, 10 x 2048 (chunks)"
  echo "| cache | llama.cpp | quantforge | difference |"
  echo "|---|---|---|---|"
  for kv in f16 q8_0 q5_1 q5_0 q4_1 q4_0 iq4_nl; do
    a=$(LD_LIBRARY_PATH=$LLAMA_BIN "$LLAMA_BIN/llama-perplexity" -m "$out/fx-f16.gguf" -f "$text" -c 2048 --chunks 10 \
      -fa -ctk $kv -ctv $kv -t 2 2>&1 | sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p')
    "$qf" -q eval "$out/fx-f16.gguf" --text "$text" --ctx 2048 --max-chunks 10 --kv-dtype $kv --json "$out/e.json" >/dev/null
    b=$(/usr/bin/python3 -c 'import json,sys; print("%.4f" % json.load(open(sys.argv[1]))["ppl"])' "$out/e.json")
    d=$(/usr/bin/python3 -c "print('%+.3f%%' % (100 * ($b / $a - 1)))")
    echo "| $kv | $a | $b | $d |"
  done
fi
