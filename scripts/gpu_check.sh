#!/usr/bin/env bash
# What a user with an NVIDIA GPU runs to check the cuda build on it:
#   scripts/gpu_check.sh [--skip-8b]
#  1. builds with CUDA (build-cuda/, QF_CUDA=ON: fails without nvcc);
#  2. runs the device tests (*Device*): with a GPU, none of the cuda cases may
#     be skipped;
#  3. quantizes the fixture with --device cuda and --device cpu: RTN must be
#     byte-identical; FP8, NVFP4 and GPTQ (calibrated on the device's
#     forward) must have a KL divergence against the f16 fixture within 5%
#     of the CPU's (or 1e-4); eval of the fixture on cuda must give the CPU's
#     perplexity within 1e-4, and imatrix on cuda must run;
#  4. times GPTQ (Hessian + algorithm) of Llama-3-8B-shaped layers on cuda:
#     4096 x 4096 (q_proj) and 4096 x 14336 (down_proj) with 128 x 2048
#     calibration tokens (--skip-8b leaves this out);
#  5. quantizes the TinyLlama-shaped synthetic model (1.1B, random weights)
#     with W4A16 GPTQ on cuda and on cpu and prints both times, and benches
#     it (prefill, decode) on cuda.
# Expected output: "gpu_check: all checks passed" and the timings (see
# docs/benchmarks.md, "GPU"). Exit 0 when every check passed.
#
# On a machine without the Debian packages (a stock CUDA image, no network),
# build here and bring the binaries: QF_GPU_PREBUILT=DIR skips setup and the
# build and runs DIR/quantforge, DIR/qf_tests and DIR/qf_gptq_device_bench
# (their shared libraries found through LD_LIBRARY_PATH); QF_PY names a
# python3 with numpy (default /usr/bin/python3); QF_GPU_TINY_CPU=0 leaves out
# the CPU quantization of the 1.1B synthetic model (minutes on the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
skip_8b=0
[[ "${1:-}" == "--skip-8b" ]] && skip_8b=1
PY="${QF_PY:-/usr/bin/python3}"
bin=build-cuda/bin
if [[ -n "${QF_GPU_PREBUILT:-}" ]]; then
  bin="$QF_GPU_PREBUILT"
else
  scripts/setup.sh
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

if [[ -z "${QF_GPU_PREBUILT:-}" ]]; then
  cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DQF_CUDA=ON >/dev/null
  cmake --build build-cuda -j "$(nproc)" --target quantforge qf_tests qf_gptq_device_bench
fi
Q=$bin/quantforge
# timed LABEL cmd...: runs cmd and prints "LABEL: S s wall" (GNU time's peak RSS too where it is installed).
timed() {
  local label="$1"; shift
  if [[ -x /usr/bin/time ]]; then /usr/bin/time -f "$label: %e s wall, %M KiB peak RSS" "$@"
  else local t0=$EPOCHREALTIME; "$@"; awk -v a="$t0" -v b="$EPOCHREALTIME" -v l="$label" 'BEGIN { printf "%s: %.2f s wall\n", l, b - a }'; fi
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0

echo "== device tests"
# A failing check is counted and the script goes on, so one run reports every number.
"$bin/qf_tests" --gtest_filter='*Device*:*Cuda*' | tee "$work/tests.txt" || { echo "FAIL: device tests"; fails=$((fails + 1)); }
if grep -q "no CUDA device" "$work/tests.txt"; then
  echo "gpu_check: FAIL: the CUDA cases were skipped: no usable GPU"; exit 1
fi

echo "== fixture: cuda against cpu"
fx=tests/data/fixture-llama
calib=tests/data/text/calibration.txt
evaltxt=tests/data/text/evaluation.txt
for r in w4-rtn fp8 nvfp4 w4-gptq; do
  for d in cpu cuda; do
    timed "$r $d" "$Q" -q quantize "$fx" --recipe tests/data/recipes/$r.yaml --calib "$calib" \
      -o "$work/$d-$r" --device "$d" >/dev/null || { echo "FAIL: quantize $r on $d"; fails=$((fails + 1)); }
  done
  if [[ $r == w4-rtn ]]; then
    if cmp -s "$work/cpu-$r/model.safetensors" "$work/cuda-$r/model.safetensors"; then echo "ok: $r byte-identical"
    else echo "FAIL: $r differs between cuda and cpu"; fails=$((fails + 1)); fi
    continue
  fi
  for d in cpu cuda; do
    "$Q" -q eval "$work/$d-$r" --text "$evaltxt" --baseline "$fx" --json "$work/$d-eval.json" >/dev/null \
      || { echo "FAIL: eval of $r from $d"; fails=$((fails + 1)); }
  done
  $PY - "$work/cpu-eval.json" "$work/cuda-eval.json" "$r" <<'PYEOF' || fails=$((fails + 1))
import json, sys
cpu, gpu = (json.load(open(p)) for p in sys.argv[1:3])
kc, kg = cpu["kld"]["mean"], gpu["kld"]["mean"]
print(f"{sys.argv[3]} KL vs f16: cpu {kc:.6f}, cuda {kg:.6f}")
assert kg == kg and kg <= max(1.05 * kc, kc + 1e-4), f"{sys.argv[3]} on cuda is worse than on cpu"
print(f"ok: {sys.argv[3]} on cuda as good as on cpu")
PYEOF
done
for d in cpu cuda; do
  "$Q" -q eval "$fx" --text "$evaltxt" --device "$d" --json "$work/$d-ppl.json" >/dev/null || { echo "FAIL: eval on $d"; fails=$((fails + 1)); }
done
$PY - "$work/cpu-ppl.json" "$work/cuda-ppl.json" <<'PYEOF' || fails=$((fails + 1))
import json, sys
c, g = (json.load(open(p)) for p in sys.argv[1:3])
print(f"fixture perplexity: cpu {c['ppl']:.6f} ({c['seconds']:.2f} s), cuda {g['ppl']:.6f} ({g['seconds']:.2f} s)")
assert g["device"] == "cuda" and abs(g["ppl"] / c["ppl"] - 1) < 1e-4, "eval on cuda disagrees with cpu"
print("ok: eval on cuda agrees with cpu")
PYEOF
"$Q" -q imatrix "$fx" --text "$calib" --ctx 128 -o "$work/i.gguf" --device cuda && echo "ok: imatrix on cuda" \
  || { echo "FAIL: imatrix on cuda"; fails=$((fails + 1)); }

if [[ $skip_8b -eq 0 ]]; then
  echo "== GPTQ, Llama-3-8B-shaped layers, 128 x 2048 calibration tokens (cuda)"
  "$bin/qf_gptq_device_bench" 4096 4096 262144 cuda
  "$bin/qf_gptq_device_bench" 4096 14336 262144 cuda
fi

echo "== TinyLlama-shaped synthetic model, W4A16 GPTQ"
model=build-cuda/tinyllama-synth
[[ -f $model/model.safetensors ]] || $PY scripts/bench/make_synthetic_model.py "$model"
devices="cuda cpu"
[[ "${QF_GPU_TINY_CPU:-1}" == 0 ]] && devices=cuda
for d in $devices; do
  timed "tinyllama w4a16-gptq on $d" "$Q" -q quantize "$model" \
    --recipe recipes/w4a16-gptq.yaml -o "$work/tiny-$d" --device "$d" >/dev/null
done
"$Q" bench "$model" -p 512 -n 128 --device cuda

if [[ $fails -ne 0 ]]; then echo "gpu_check: $fails check(s) failed"; exit 1; fi
echo "gpu_check: all checks passed"
