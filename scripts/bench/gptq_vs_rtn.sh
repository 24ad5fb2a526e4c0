#!/usr/bin/env bash
# RTN against GPTQ on the bundled fixture: quantize time and peak RSS, file
# size, and perplexity / KL divergence against the f16 model on the first 40
# chunks (llama.cpp's convention) of tests/data/text/evaluation.txt and, when
# ../shared is present, of the WikiText-2 test set.
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/build.sh --target quantforge >/dev/null
qf=build/bin/quantforge
fx=tests/data/fixture-llama
out=build/bench/gptq
wiki=../shared/data/wikitext-2-raw/wiki.test.raw
rm -rf "$out" && mkdir -p "$out"
echo "| recipe | method | calibration | quantize s | peak RSS MiB | MiB | evaluation.txt ppl (delta) | KLD | top-1 | WikiText-2 ppl (delta) | KLD | top-1 |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for r in recipes/w4a16-rtn.yaml recipes/w4a16-gptq.yaml tests/data/recipes/w3-rtn.yaml recipes/w3a16-gptq.yaml \
         tests/data/recipes/w8-rtn.yaml recipes/w8a16-gptq.yaml; do
  name=$(basename "$r" .yaml)
  start=$(date +%s.%N)
  "$qf" -q quantize "$fx" --recipe "$r" --calib tests/data/text/calibration.txt -o "$out/$name" >"$out/$name.log"
  secs=$(echo "$(date +%s.%N) - $start" | bc)
  "$qf" -q eval "$out/$name" --text tests/data/text/evaluation.txt --max-chunks 40 --baseline "$fx" --json "$out/$name.eval.json" >/dev/null
  if [[ -f $wiki ]]; then
    "$qf" -q eval "$out/$name" --text "$wiki" --max-chunks 40 --baseline "$fx" --json "$out/$name.wiki.json" >/dev/null
  fi
  /usr/bin/python3 - "$r" "$out/$name" "$secs" <<'PY'
import json, os, re, sys
r, d, secs = sys.argv[1:]
log = open(d + ".log").read()
m = re.search(r"with (\w+) \((\d+) calibration samples, (\d+) tokens\)", log)
rss = re.search(r"peak RSS ([\d.]+) MiB", log)[1]
size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
calib = "none" if m[1] == "rtn" else f"{m[2]} x {int(m[3]) // int(m[2])}"
cells = []
for t in ("eval", "wiki"):
    p = f"{d}.{t}.json"
    if not os.path.exists(p):
        cells += ["-", "-", "-"]
        continue
    j = json.load(open(p))
    cells += [f"{j['ppl']:.3f} ({j['ppl_delta']:+.3f})", f"{j['kld']['mean']:.6f}", f"{100 * j['top1_agreement']:.2f}%"]
print(f"| {r} | {m[1]} | {calib} | {float(secs):.1f} | {rss} | {size / 1048576:.2f} | " + " | ".join(cells) + " |")
PY
done
