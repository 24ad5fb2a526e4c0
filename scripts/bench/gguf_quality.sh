#!/usr/bin/env bash
# Quality of each GGUF preset on the bundled fixture: perplexity, delta and KL
# divergence against the f16 model on tests/data/text/evaluation.txt
# (llama.cpp's chunks convention, first N chunks), without and with an
# importance matrix computed from tests/data/text/calibration.txt.
#
#   scripts/bench/gguf_quality.sh [--chunks 40] [--imatrix-chunks 64]
set -euo pipefail
cd "$(dirname "$0")/../.."
chunks=40 im_chunks=64
while [[ $# -gt 0 ]]; do
  case "$1" in
    --chunks) chunks="$2"; shift 2 ;;
    --imatrix-chunks) im_chunks="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
scripts/build.sh --target quantforge >/dev/null
qf=build/bin/quantforge
fx=tests/data/fixture-llama
out=build/bench
mkdir -p "$out"
rm -f "$out/fixture-imatrix.gguf"
"$qf" -q imatrix "$fx" --text tests/data/text/calibration.txt --chunks "$im_chunks" -o "$out/fixture-imatrix.gguf"
echo "| preset | imatrix | MiB | ppl | delta | KLD mean | KLD p99 | top-1 |"
echo "|---|---|---|---|---|---|---|---|"
for p in F16 Q8_0 Q6_K Q5_K_M Q5_K_S Q4_K_M Q4_K_S Q4_0 Q3_K_L Q3_K_M Q3_K_S Q2_K; do
  for im in no yes; do
    [[ $im == yes && ( $p == F16 || $p == Q8_0 ) ]] && continue  # no importance weights for these types
    args=()
    [[ $im == yes ]] && args=(--imatrix "$out/fixture-imatrix.gguf")
    rm -f "$out/q.gguf"  # convert never replaces an existing output
    "$qf" -q convert "$fx" --to gguf --type "$p" "${args[@]}" -o "$out/q.gguf"
    "$qf" -q eval "$out/q.gguf" --text tests/data/text/evaluation.txt --max-chunks "$chunks" --baseline "$fx" \
      --json "$out/q.json" >/dev/null
    /usr/bin/python3 - "$p" "$im" "$out/q.json" "$(stat -c %s "$out/q.gguf")" <<'PY'
import json, sys
p, im, path, size = sys.argv[1:]
j = json.load(open(path))
print(f"| {p} | {im} | {int(size) / 1048576:.2f} | {j['ppl']:.4f} | {j['ppl_delta']:+.4f} | {j['kld']['mean']:.6f} | "
      f"{j['kld']['p99']:.5f} | {100 * j['top1_agreement']:.2f}% |")
PY
  done
done
rm -f "$out/q.gguf" "$out/q.json"
