#!/usr/bin/env bash
# Runtime and GGUF-conversion benchmarks on the bundled fixture and on a random
# checkpoint with TinyLlama-1.1B shapes (generated under build/, not committed).
# Prints markdown tables for docs/benchmarks.md.
#
#   scripts/bench/bench_runtime.sh [--presets "F16 Q8_0 ..."] [--skip-tinyllama]
set -euo pipefail
cd "$(dirname "$0")/../.."
presets="F16 Q8_0 Q6_K Q5_K_M Q4_K_M Q3_K_M Q2_K Q4_0"
skip_tl=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --presets) presets="$2"; shift 2 ;;
    --skip-tinyllama) skip_tl=1; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
scripts/build.sh --target quantforge >/dev/null
qf=build/bin/quantforge
out=build/bench
mkdir -p "$out"
models=("fixture:tests/data/fixture-llama")
if [[ $skip_tl -eq 0 ]]; then
  [[ -f build/tinyllama-synth/model.safetensors ]] || /usr/bin/python3 scripts/bench/make_synthetic_model.py build/tinyllama-synth
  models+=("tinyllama-1.1b-synthetic:build/tinyllama-synth")
fi
echo "machine: $(nproc) threads, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo
echo "| model | preset | file MiB | bits/weight | convert s | MB/s of input |"
echo "|---|---|---|---|---|---|"
for entry in "${models[@]}"; do
  name="${entry%%:*}" dir="${entry#*:}"
  for p in $presets; do
    "$qf" convert "$dir" --to gguf --type "$p" -o "$out/$name-$p.gguf" 2>"$out/$name-$p.log" >/dev/null
    line=$(grep '^wrote' "$out/$name-$p.log")
    # wrote X: 3.28 MiB (5.25 bits per weight) from 10.00 MiB in 0.22 s (48.6 MB/s of input)
    /usr/bin/python3 - "$name" "$p" "$line" <<'PY'
import re, sys
name, p, line = sys.argv[1:]
m = re.search(r": ([\d.]+) MiB \(([\d.]+) bits per weight\) from [\d.]+ MiB in ([\d.]+) s \(([\d.]+) MB/s", line)
print(f"| {name} | {p} | {m[1]} | {m[2]} | {m[3]} | {m[4]} |")
PY
  done
done
echo
echo "| model | weights | prompt | gen | prefill tok/s | decode tok/s | bound tok/s | decode/bound | TTFT ms | KV MiB | peak RSS MiB |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for entry in "${models[@]}"; do
  name="${entry%%:*}" dir="${entry#*:}"
  if [[ $name == fixture ]]; then p=512 n=128; else p=256 n=32; fi
  for w in "$dir" "$out/$name-Q8_0.gguf" "$out/$name-Q4_K_M.gguf"; do
    [[ -e "$w" ]] || continue
    "$qf" -q bench "$w" -p $p -n $n --json "$out/bench.json" >/dev/null
    /usr/bin/python3 - "$name" "$out/bench.json" <<'PY'
import json, sys
name, path = sys.argv[1:]
j = json.load(open(path))
mib = lambda b: b / 1048576
print(f"| {name} | {j['weight_format']} | {j['prompt']} | {j['gen']} | {j['prefill_tokens_per_s']:.1f} | "
      f"{j['decode_tokens_per_s']:.1f} | {j['decode_bound_tokens_per_s']:.1f} | "
      f"{100 * j['decode_tokens_per_s'] / j['decode_bound_tokens_per_s']:.0f}% | {1000 * j['ttft_seconds']:.0f} | "
      f"{mib(j['kv_bytes_reserved']):.1f} | {mib(j['peak_rss_bytes']):.0f} |")
PY
  done
done
