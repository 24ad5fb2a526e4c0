#!/usr/bin/env bash
# Tokenizer throughput: times `quantforge tokenize VOCAB --file TEXT --json`
# (load + encode + JSON output) for a SentencePiece-BPE vocabulary and a
# byte-level BPE vocabulary, and prints tokens per second. Both must stay
# near-linear: the 1.29 MB WikiText-2 test file well under a second.
#
# usage: scripts/bench_tokenizer.sh [QUANTFORGE_BINARY]   (default build/bin/quantforge)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build/bin/quantforge}
text=$root/../shared/data/wikitext-2-raw/wiki.test.raw
vectors=$root/../shared/data/tokenizer-vectors

[[ -x $bin ]] || { echo "bench_tokenizer: $bin is not built (cmake --build build)" >&2; exit 1; }
[[ -f $text ]] || { echo "bench_tokenizer: $text is absent" >&2; exit 1; }

bytes=$(wc -c < "$text")
plain=$(mktemp)
trap 'rm -f "$plain"' EXIT
printf '%-16s %10s %10s %8s %14s\n' vocabulary bytes tokens seconds tokens/s
for name in llama-spm gpt-2; do
  vocab=$vectors/ggml-vocab-$name.gguf
  [[ -f $vocab ]] || { echo "bench_tokenizer: $vocab is absent, skipped" >&2; continue; }
  start=$(date +%s.%N)
  "$bin" tokenize "$vocab" --file "$text" --json > /dev/null
  end=$(date +%s.%N)
  # The plain output's first line is "ids: 1 2 3 ...".
  "$bin" tokenize "$vocab" --file "$text" > "$plain"
  tokens=$(( $(head -n 1 "$plain" | wc -w) - 1 ))
  awk -v n="$name" -v b="$bytes" -v t="$tokens" -v s="$start" -v e="$end" \
    'BEGIN { d = e - s; printf "%-16s %10d %10d %8.3f %14.0f\n", n, b, t, d, t / d }'
done
