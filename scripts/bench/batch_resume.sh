#!/usr/bin/env bash
# What resuming and batching cost and save, on a TinyLlama-shaped model
# (1.1B parameters, 22 layers; random weights, made by make_synthetic_model.py):
#   1. the per-layer resume state's cost: an RTN W4A16 quantize (where writing
#      is the largest share of the time) with this build, and, when
#      OLD_QUANTFORGE (a build without resume state) is given, with it;
#   2. a GPTQ W4A16 run (8 x 512 calibration tokens) end to end, then the same
#      run killed (SIGKILL) once 11 of its 22 layers are finished and resumed
#      with --resume: the resumed run's time and byte identity;
#   3. `batch --dry-run` estimates against the measured times of a batch of
#      Q4_K_M and W4A16 RTN, and a re-run that skips both.
# Usage: scripts/bench/batch_resume.sh [MODEL_DIR] [OLD_QUANTFORGE]
# (MODEL_DIR default: build/bench/tinyllama, made when missing.) With
# REUSE_FULL=1 the reference GPTQ run of a previous invocation is kept.
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/build.sh --target quantforge >/dev/null
qf=$PWD/build/bin/quantforge
model=${1:-build/bench/tinyllama}
old=${2:-}
out=build/bench/batch_resume
[[ -f $model/config.json ]] || /usr/bin/python3 scripts/bench/make_synthetic_model.py "$model" --shape tinyllama-1.1b
model=$(cd "$model" && pwd)
mkdir -p "$out"
find "$out" -mindepth 1 -maxdepth 1 ! -name full ! -name full.seconds -exec rm -rf {} +
[[ ${REUSE_FULL:-0} == 1 && -f $out/full.seconds ]] || rm -rf "$out/full" "$out/full.seconds"
calib=$PWD/tests/data/text/calibration.txt
cat >"$out/gptq.yaml" <<YAML
quant_stage:
  quant_modifiers:
    GPTQModifier:
      targets: [Linear]
      ignore: [lm_head]
      scheme: W4A16
calibration:
  dataset: $calib
  num_samples: 8
  seq_len: 512
  seed: 0
export:
  format: compressed-tensors
YAML
rtn=$PWD/recipes/w4a16-rtn.yaml
now() { date +%s.%N; }
secs() { printf '%.1f' "$(echo "$(now) - $1" | bc)"; }

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
# 1. RTN with and without the state.
t=$(now)
"$qf" -q quantize "$model" --recipe "$rtn" -o "$out/rtn" >/dev/null
echo "1. RTN W4A16, 22 layers: $(secs "$t") s with the resume state; output $(du -sm "$out/rtn" | cut -f1) MiB"
if [[ -n $old ]]; then
  t=$(now)
  "$old" -q quantize "$model" --recipe "$rtn" -o "$out/rtn-old" >/dev/null
  echo "   the same with $old (no resume state): $(secs "$t") s; model.safetensors $(cmp -s "$out/rtn/model.safetensors" "$out/rtn-old/model.safetensors" && echo identical || echo differ)"
fi

# 2. GPTQ: a full run, then killed after 11 finished layers and resumed.
if [[ ! -f $out/full.seconds ]]; then
  t=$(now)
  "$qf" -q quantize "$model" --recipe "$out/gptq.yaml" -o "$out/full" >/dev/null
  secs "$t" >"$out/full.seconds"
fi
"$qf" -q quantize "$model" --recipe "$out/gptq.yaml" -o "$out/killed" >/dev/null 2>&1 &
pid=$!
t=$(now)
until grep -q '"layers_done": 11$' "$out/.killed.resume/state.json" 2>/dev/null; do sleep 0.05; done
state_mib=$(du -sm "$out/.killed.resume" | cut -f1)
kill -9 $pid
wait $pid 2>/dev/null || true
first=$(secs "$t")
t=$(now)
"$qf" -q quantize "$model" --recipe "$out/gptq.yaml" -o "$out/killed" --resume >/dev/null
resumed=$(secs "$t")
same=differ
cmp -s "$out/full/model.safetensors" "$out/killed/model.safetensors" && same=identical
echo "2. GPTQ W4A16, 8 x 512 calibration tokens: a full run $(cat "$out/full.seconds") s; killed after 11 of 22 layers (${first} s, state ${state_mib} MiB); --resume finished in ${resumed} s; model.safetensors ${same}"

# 3. Batch estimates against measured times.
cat >"$out/jobs.yaml" <<YAML
models:
  - path: $model
    name: tinyllama
targets:
  - gguf: Q4_K_M
  - recipe: $rtn
YAML
"$qf" batch "$out/jobs.yaml" -o "$out/batch" --dry-run --json >"$out/dry.json"
t=$(now)
"$qf" -q batch "$out/jobs.yaml" -o "$out/batch" --json >"$out/status.json"
total=$(secs "$t")
/usr/bin/python3 - "$out/dry.json" "$out/status.json" "$total" <<'PY'
import json, sys
dry = {j["id"]: j["estimate"] for j in json.load(open(sys.argv[1]))["jobs"]}
st = json.load(open(sys.argv[2]))
print(f"3. batch of {len(st['jobs'])} jobs in {sys.argv[3]} s")
print("| job | estimated s | measured s | estimated disk MiB | output MiB | estimated memory MiB |")
print("|---|---|---|---|---|---|")
for j in st["jobs"]:
    e = dry[j["id"]]
    print(f"| {j['id']} | {e['seconds']:.0f} | {j['seconds']:.1f} | {e['disk_bytes'] / 2**20:.0f} | {j['output_bytes'] / 2**20:.0f} | {e['memory_bytes'] / 2**20:.0f} |")
PY
t=$(now)
"$qf" -q batch "$out/jobs.yaml" -o "$out/batch" >/dev/null
echo "   re-running the finished batch: $(secs "$t") s (both jobs skipped)"
