#!/usr/bin/env bash
# Calibration speed and quality on the bundled fixtures: each recipe's
# quantize time with its per-phase breakdown (the `time:` line), peak RSS,
# and the KL divergence of the output against the f16 model on the first 40
# chunks of 512 tokens of tests/data/text/evaluation.txt and (when ../shared
# is present) of WikiText-2; then the time `eval` takes over 128 x 512 tokens
# of the calibration text (one forward pass over as many tokens as the
# calibration set).
#
#   scripts/bench/calibration_speed.sh            # the tree's build
#   QF_BIN=/path/to/quantforge scripts/bench/calibration_speed.sh
#
# Variants are made from the shipped recipes: "bf16" adds
# calibration.precision: bf16, "seed N" changes the calibration sample seed
# (the f32 path's run-to-run spread), "module" sets AWQModifier loss:
# module. A binary that refuses a variant's key gets "refused" in its row.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ -z ${QF_BIN:-} ]]; then
  scripts/build.sh --target quantforge >/dev/null
  QF_BIN=build/bin/quantforge
fi
qf=$QF_BIN
out=build/bench/calib-speed
wiki=../shared/data/wikitext-2-raw/wiki.test.raw
rm -rf "$out" && mkdir -p "$out"

# variant RECIPE KIND NAME: writes $out/NAME.yaml
variant() {
  local src=$1 kind=$2 dst=$out/$3.yaml
  /usr/bin/python3 - "$src" "$kind" "$dst" "$PWD/tests/data/text/calibration.txt" <<'PY'
import re, sys
src, kind, dst, calib = sys.argv[1:]
t = open(src).read()
t = re.sub(r"(?m)^  dataset: .*$", "  dataset: " + calib, t)
if kind == "bf16":
    t = re.sub(r"(?m)^calibration:\n", "calibration:\n  precision: bf16\n", t)
elif kind.startswith("seed"):
    t = re.sub(r"(?m)^  seed: \d+$", "  seed: " + kind[4:], t)
elif kind == "module":
    t = re.sub(r"(?m)^    AWQModifier:\n", "    AWQModifier:\n      loss: module\n", t)
open(dst, "w").write(t)
PY
}

echo "| model | recipe | variant | quantize s | forward | hessian | solve | propagate | search | peak RSS MiB | KLD evaluation.txt | KLD WikiText-2 |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for model in tests/data/fixture-llama tests/data/fixture-mixtral; do
  m=$(basename "$model")
  for spec in "recipes/w4a16-gptq.yaml f32" "recipes/w4a16-gptq.yaml seed1" "recipes/w4a16-gptq.yaml seed2" \
              "recipes/w4a16-gptq.yaml bf16" "recipes/w4a16-awq.yaml f32" "recipes/w4a16-awq.yaml module"; do
    read -r r kind <<<"$spec"
    name=$m-$(basename "$r" .yaml)-$kind
    variant "$r" "$kind" "$name"
    start=$(date +%s.%N)
    if ! "$qf" quantize "$model" --recipe "$out/$name.yaml" -o "$out/$name" >"$out/$name.log" 2>&1; then
      echo "| $m | $r | $kind | refused | | | | | | | | |"
      continue
    fi
    secs=$(echo "$(date +%s.%N) - $start" | bc)
    "$qf" -q eval "$out/$name" --text tests/data/text/evaluation.txt --max-chunks 40 --baseline "$model" \
      --json "$out/$name.eval.json" >/dev/null
    if [[ -f $wiki ]]; then
      "$qf" -q eval "$out/$name" --text "$wiki" --max-chunks 40 --baseline "$model" --json "$out/$name.wiki.json" >/dev/null
    fi
    /usr/bin/python3 - "$m" "$r" "$kind" "$out/$name" "$secs" <<'PY'
import json, os, re, sys
m, r, kind, d, secs = sys.argv[1:]
log = open(d + ".log").read()
rss = re.search(r"peak RSS ([\d.]+) MiB", log)[1]
phase = {}
t = re.search(r"^time: .*$", log, re.M)
if t:
    for name, s in re.findall(r"(forward|hessian|solve|propagate|search) ([\d.]+) s", t[0]):
        phase[name] = s
kl = []
for k in ("eval", "wiki"):
    p = f"{d}.{k}.json"
    kl.append(f"{json.load(open(p))['kld']['mean']:.6f}" if os.path.exists(p) else "-")
cells = [phase.get(k, "-") for k in ("forward", "hessian", "solve", "propagate", "search")]
print(f"| {m} | {r} | {kind} | {float(secs):.1f} | " + " | ".join(cells) + f" | {rss} | {kl[0]} | {kl[1]} |")
PY
  done
  start=$(date +%s.%N)
  "$qf" -q eval "$model" --text tests/data/text/calibration.txt --max-chunks 128 --ctx 512 >/dev/null
  echo "| $m | eval, 128 x 512 tokens of calibration.txt | | $(echo "$(date +%s.%N) - $start" | bc | xargs printf %.1f) | | | | | | | | |"
done
