#!/usr/bin/env bash
# Checks the cuda build on an NVIDIA GPU: what a user with a GPU runs.
#
#   scripts/gpu_check.sh [--dry-run] [--skip-8b] [--steps LIST]
#
# Runs on Debian 12 and on Ubuntu 22.04/24.04 with the CUDA toolkit (12 or
# later; the nvidia/cuda "devel" images have everything but the packages
# below), as root or with sudo, from any directory. Steps, in order (--steps
# takes a comma-separated subset of tests,quantize,formats,faults,sanitizer,
# gptq8b,tiny; setup, inputs and probe always run):
#   setup     installs what the build needs with apt-get, only the packages
#             missing (Debian and Ubuntu: GPU_PACKAGES below; elsewhere they
#             are listed and nothing is installed); finds nvcc ($CUDACXX,
#             then $CUDA_HOME/bin, PATH, /usr/local/cuda/bin) and builds
#             build-cuda/ (Release, QF_CUDA=ON, QF_PYTHON=OFF, with
#             -DCMAKE_CUDA_COMPILER=that nvcc, and g++-12 as the C++ and CUDA
#             host compiler where it is installed and $CXX is unset): the
#             targets quantforge, qf_tests, qf_gptq_device_bench;
#   inputs    every fixture, text and recipe named below exists, each recipe
#             parses (`quantforge quantize --dry-run`, on the CPU), the Python
#             checks compile, numpy imports, and the test filter matches every
#             suite of the device tests (the suites of src/**/*device*_test.cpp
#             and src/*/cuda/*_test.cpp, from `qf_tests --gtest_list_tests`);
#   probe     eval of 64 tokens of the fixture on cuda: without a usable GPU
#             the run ends here (exit 1);
#   tests     qf_tests --gtest_filter='*Device*:*Cuda*': every test passes,
#             each device suite runs, no cuda case is skipped;
#   quantize  the fixture (tests/data/fixture-llama) quantized with --device
#             cuda and with --device cpu: W4 RTN byte-identical; W4 GPTQ, FP8
#             and NVFP4 (calibrated on the device's forward) with a KL
#             divergence against the f16 fixture (evaluation.txt, on the cpu)
#             within 5% of the CPU checkpoint's (or 1e-4 above it), AWQ and
#             SmoothQuant (their searches run on the device) within 10%: a
#             search that picks another candidate in one layer changes the
#             rest of the run, as between the CPU's own SIMD levels (W4 AWQ:
#             4% between AVX-512 and AVX2); imatrix --device cuda runs;
#   formats   every export format, written on the CPU from the fixture and
#             evaluated on evaluation.txt with --device cuda and --device cpu
#             (the cpu eval runs beside the cuda one): compressed-tensors
#             pack-quantized (W4 RTN, W4 and W3 GPTQ, W4 AWQ), int-quantized
#             (W8A8 SmoothQuant), float-quantized (FP8 static with KV-cache
#             scales, FP8 dynamic), nvfp4-pack-quantized (NVFP4, NVFP4A16);
#             GPTQ; AutoAWQ GEMM; modelopt FP8 and NVFP4; bitsandbytes NF4 and
#             FP4; GGUF Q4_K_M and Q8_0 (convert --to gguf); and the f16
#             fixture itself. The perplexities must agree within 1e-4 relative
#             where only weights are quantized: the device sums in another
#             order (cuBLAS), in f32 over at most 768 terms (the fixture's
#             MLP width), at most 768 x 6e-8 = 4.6e-5 relative per dot product
#             and typically sqrt(768) x 6e-8 = 1.7e-6, averaged over 177k
#             tokens (measured: 1.6e-7 for the f16 fixture on one H100, 1e-6
#             to 2e-6 between the host build and the cpu). With quantized
#             activations (W8A8, FP8, NVFP4) a rounding difference now and
#             then moves an activation to the next code, and the CPU's own
#             SIMD levels differ by up to 2e-3: within 5e-3;
#   faults    QF_DEVICE_FAULT=alloc:3, then blas:2 (the third device
#             allocation fails as cudaMalloc out of memory would, the second
#             cuBLAS call fails), quantize W4 GPTQ with --device cuda: exit 5,
#             exactly one line on stderr, starting "quantforge: " and naming
#             the device, and nothing in the output's folder (no output, no
#             temporaries);
#   sanitizer compute-sanitizer (on PATH, else under the CUDA home) with
#             --tool memcheck over quantize W4 GPTQ and over eval of 2 x 128
#             tokens, and --tool racecheck over eval of 64 tokens, all on cuda:
#             each exits 0 and reports 0 errors;
#   gptq8b    qf_gptq_device_bench on Llama-3-8B-shaped layers, 4096 x 4096
#             (q_proj) and 4096 x 14336 (down_proj), 128 x 2048 calibration
#             tokens: upload, Hessian, download and GPTQ timed apart, each
#             beside its time at the GPU's peak rates (--skip-8b leaves it out);
#   tiny      the TinyLlama-shaped synthetic model (1.1B, random weights,
#             made once in build-cuda/tinyllama-synth) quantized W4A16 GPTQ on
#             cuda and on cpu (both times printed), then benched on cuda.
#
# --dry-run prints every step's commands and checks and runs nothing that
# needs a GPU or a build: setup, probe and the GPU steps are printed only;
# the inputs step runs in full (with the binaries it finds), so the dry run
# still fails on a missing input, a recipe that does not parse, a Python
# check that does not compile or a device suite the filter misses. ctest runs
# it (scripts.gpu_check_dry_run) against the build's own binaries.
#
# Environment:
#   QF_GPU_PREBUILT=DIR  no setup and no build: DIR/quantforge, DIR/qf_tests
#                        and DIR/qf_gptq_device_bench are run (for an image
#                        without the packages or a network: build elsewhere,
#                        bring the binaries and their shared libraries, found
#                        through LD_LIBRARY_PATH);
#   QF_PY=PYTHON         a python3 with numpy (default /usr/bin/python3);
#   QF_GPU_TINY_CPU=0    leaves out the CPU quantization of the 1.1B model
#                        (minutes on the CPU);
#   QF_GPU_SETUP=0       installs nothing (the packages are there already);
#   QF_GPU_EVAL_CHUNKS=N evaluates N chunks of evaluation.txt in the quantize
#                        and formats steps instead of all of it (a shorter
#                        run; the bounds stay: with quantized activations the
#                        difference shrinks with the tokens, NVFP4 between the
#                        host build and the cpu 2.1e-3 at 4 chunks, 1.2e-3 at
#                        16, 1e-4 over the whole text, so N >= 16);
#   CUDACXX, CUDA_HOME   where nvcc and the toolkit are; CXX: the C++ compiler;
#   QF_PEAK_FLOPS, QF_PEAK_BW, QF_PEAK_LINK_BW: the GPU's FP64 FLOP/s, memory
#                        and host-link bytes/s for qf_gptq_device_bench, where
#                        its table does not know the GPU.
# The CUDA toolkit's library folders are added to LD_LIBRARY_PATH (cuBLAS and
# cuSOLVER are loaded at run time).
#
# Output: "== STEP" headers; each command as "  $ ..." and its check as
# "  check: ..."; "ok: ..." or "FAIL: ..." for each check (a failing check is
# counted and the run goes on, so one run reports every number); the numbers
# (KL divergences, perplexities, timings; see docs/benchmarks.md, "First run
# on a GPU"); and
# last "gpu_check: all checks passed" (exit 0) or "gpu_check: N check(s)
# failed" (exit 1). The dry run ends with "gpu_check: dry run: ..." the same
# way. Exit 2: a usage error.
set -euo pipefail
cd "$(dirname "$0")/.."
export LC_NUMERIC=C  # EPOCHREALTIME and awk with a decimal point

# What the CUDA build and this script need on Debian and Ubuntu (the CUDA
# toolkit itself excepted): the compilers and CMake, the libraries
# CMakeLists.txt finds (Thrust comes from the toolkit), Python with numpy.
GPU_PACKAGES=(
  cmake make pkg-config g++-12
  libeigen3-dev nlohmann-json3-dev libcli11-dev libzstd-dev libyaml-cpp-dev
  libgtest-dev libpcre2-dev libsentencepiece-dev libpng-dev libjpeg-dev
  python3 python3-numpy
)
ALL_STEPS=tests,quantize,formats,faults,sanitizer,gptq8b,tiny

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }
dry_run=0
skip_8b=0
steps=$ALL_STEPS
while (($#)); do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --skip-8b) skip_8b=1 ;;
    --steps=*) steps=${1#--steps=} ;;
    --steps)
      if (($# < 2)); then echo "gpu_check: --steps needs a list ($ALL_STEPS)" >&2; exit 2; fi
      steps=$2
      shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (--dry-run, --skip-8b, --steps LIST, --help)" >&2; exit 2 ;;
  esac
  shift
done
for s in ${steps//,/ }; do
  if [[ ",$ALL_STEPS," != *",$s,"* ]]; then echo "gpu_check: unknown step '$s' (steps: $ALL_STEPS)" >&2; exit 2; fi
done
want() {
  if [[ $1 == gptq8b && $skip_8b == 1 ]]; then return 1; fi
  [[ ",$steps," == *",$1,"* ]]
}
eval_chunks=()
if [[ -n ${QF_GPU_EVAL_CHUNKS:-} ]]; then
  if ! [[ $QF_GPU_EVAL_CHUNKS =~ ^[1-9][0-9]*$ ]]; then
    echo "gpu_check: QF_GPU_EVAL_CHUNKS='$QF_GPU_EVAL_CHUNKS' is not a positive integer" >&2; exit 2
  fi
  eval_chunks=(--max-chunks "$QF_GPU_EVAL_CHUNKS")
fi

PY="${QF_PY:-/usr/bin/python3}"
fx=tests/data/fixture-llama
calib=tests/data/text/calibration.txt
evaltxt=tests/data/text/evaluation.txt
rec=tests/data/recipes
filter='*Device*:*Cuda*'
build_dir=build-cuda
bin=$build_dir/bin
if [[ -n ${QF_GPU_PREBUILT:-} ]]; then bin=$QF_GPU_PREBUILT; fi
Q=$bin/quantforge
T=$bin/qf_tests
B=$bin/qf_gptq_device_bench

work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
bg_pid=""
cleanup() {
  if [[ -n $bg_pid ]]; then kill "$bg_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# ---- output helpers ----------------------------------------------------------
fails=0
ok() { echo "ok: $*"; }
ran_ok() { if ((!dry_run)); then ok "$@"; fi; }  # the verdict of a command the dry run only shows
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
step() { echo; echo "== $*"; }
check() { echo "  check: $*"; }
# show CMD...: the command as one would type it ($WORK: this run's scratch folder).
show() {
  local w line="" safe='^[A-Za-z0-9_./:=,+@%-]+$'
  for w in "$@"; do
    if [[ $w =~ $safe ]]; then line+=" $w"; else line+=" '${w//\'/\'\\\'\'}'"; fi
  done
  line=${line//"$work"/\$WORK}
  echo "  \$${line}"
}
now() { echo "${EPOCHREALTIME:-$(date +%s.%N)}"; }
# run_logged LABEL LOG CMD...: shows CMD and (not in the dry run) runs it with
# its output to LOG, printing "LABEL: S s wall" when LABEL is not empty and
# the end of LOG when CMD fails. Returns CMD's status.
run_logged() {
  local label=$1 log=$2 rc=0 t0
  shift 2
  show "$@"
  if ((dry_run)); then return 0; fi
  t0=$(now)
  "$@" >"$log" 2>&1 || rc=$?
  if [[ -n $label ]]; then
    awk -v a="$t0" -v b="$(now)" -v l="$label" 'BEGIN { printf "  %s: %.2f s wall\n", l, b - a }'
  fi
  if ((rc != 0)); then
    echo "  exit $rc; the end of its output:"
    tail -n 5 "$log" | sed 's/^/    /'
  fi
  return "$rc"
}
# run_shown CMD...: shows CMD and (not in the dry run) runs it, output to the terminal.
run_shown() {
  show "$@"
  if ((dry_run)); then return 0; fi
  "$@"
}
# run_tee LOG CMD...: as run_shown, a copy of the output in LOG; CMD's status.
run_tee() {
  local log=$1 rc=0
  shift
  show "$@"
  if ((dry_run)); then return 0; fi
  "$@" 2>&1 | tee "$log" || rc=${PIPESTATUS[0]}
  return "$rc"
}

# ---- the Python checks (compiled by the inputs step, dry run included) -------
mkdir -p "$work/py"
cat >"$work/py/kl.py" <<'PYEOF'
# kl.py CPU.json CUDA.json NAME REL: the checkpoint made on cuda is within REL
# (relative) or 1e-4 (absolute) of the CPU's KL divergence from the f16 model.
import json, math, sys
cpu, dev = (json.load(open(p)) for p in sys.argv[1:3])
name, rel = sys.argv[3], float(sys.argv[4])
kc, kg = cpu["kld"]["mean"], dev["kld"]["mean"]
bound = max((1 + rel) * kc, kc + 1e-4)
print(f"  {name}: KL divergence from f16: cpu {kc:.6f}, cuda {kg:.6f} (bound {bound:.6f})")
if not (math.isfinite(kc) and math.isfinite(kg) and kg <= bound):
    sys.exit(f"  {name}: the checkpoint quantized on cuda is worse than the CPU's")
PYEOF
cat >"$work/py/ppl.py" <<'PYEOF'
# ppl.py CPU.json CUDA.json NAME TOL: eval on cuda gives the CPU's perplexity
# within TOL (relative), on the same tokens, both measurements valid.
import json, math, sys
c, g = (json.load(open(p)) for p in sys.argv[1:3])
name, tol = sys.argv[3], float(sys.argv[4])
problems = []
if (c.get("device"), g.get("device")) != ("cpu", "cuda"):
    problems.append(f"devices {c.get('device')} and {g.get('device')}, not cpu and cuda")
if not (c.get("valid") and g.get("valid")):
    problems.append("a measurement is not valid")
if not c.get("tokens_scored") or c.get("tokens_scored") != g.get("tokens_scored"):
    problems.append(f"tokens scored: cpu {c.get('tokens_scored')}, cuda {g.get('tokens_scored')}")
rel = abs(g["ppl"] / c["ppl"] - 1) if c["ppl"] else math.inf
print(f"  {name}: perplexity cpu {c['ppl']:.6f} ({c['seconds']:.2f} s), cuda {g['ppl']:.6f} "
      f"({g['seconds']:.2f} s), relative difference {rel:.2e} (bound {tol:g})")
if not rel < tol:
    problems.append("the perplexities differ by more than the bound")
if problems:
    sys.exit(f"  {name}: " + "; ".join(problems))
PYEOF
cat >"$work/py/sanitizer.py" <<'PYEOF'
# sanitizer.py LOG: compute-sanitizer finished and reported no error.
import re, sys
text = open(sys.argv[1], errors="replace").read()
errors = [int(n) for n in re.findall(r"ERROR SUMMARY: (\d+) errors?", text)]
races = [int(n) for n in re.findall(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?", text)]
for line in text.splitlines():
    if "SUMMARY:" in line:
        print("  " + line.strip())
if not errors and not races:
    sys.exit("  no ERROR SUMMARY or RACECHECK SUMMARY line: compute-sanitizer did not finish")
if sum(errors) + sum(races):
    sys.exit(f"  {sum(errors) + sum(races)} error(s) reported")
PYEOF

# ---- the toolkit ---------------------------------------------------------------
find_nvcc() {
  local c
  if [[ -n ${CUDACXX:-} ]]; then
    c=$(command -v "$CUDACXX" || true)
    if [[ -n $c ]]; then echo "$c"; return 0; fi
  fi
  for c in "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" "$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc; do
    if [[ -n $c && -x $c ]]; then echo "$c"; return 0; fi
  done
  return 0
}
nvcc=$(find_nvcc)
cuda_home=${CUDA_HOME:-}
if [[ -z $cuda_home && -n $nvcc ]]; then cuda_home=$(cd "$(dirname "$(readlink -f "$nvcc")")/.." && pwd); fi
if [[ -z $cuda_home && -d /usr/local/cuda ]]; then cuda_home=/usr/local/cuda; fi
san=""
for c in "$(command -v compute-sanitizer || true)" "${cuda_home:+$cuda_home/bin/compute-sanitizer}" \
  "${cuda_home:+$cuda_home/compute-sanitizer/compute-sanitizer}"; do
  if [[ -z $san && -n $c && -x $c ]]; then san=$c; fi
done
for d in "${cuda_home:+$cuda_home/lib64}" "${cuda_home:+$cuda_home/targets/x86_64-linux/lib}"; do
  if [[ -n $d && -d $d && ":${LD_LIBRARY_PATH:-}:" != *":$d:"* ]]; then
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
  fi
done
mode=""
if ((dry_run)); then mode="; dry run: nothing that needs a GPU or a build runs"; fi
echo "gpu_check: binaries ${bin}; nvcc ${nvcc:-not found}; CUDA home ${cuda_home:-not found};" \
  "compute-sanitizer ${san:-not found}; python ${PY}${mode}"

# ---- setup: packages and the build -------------------------------------------
step "setup"
if [[ -n ${QF_GPU_PREBUILT:-} ]]; then
  echo "  QF_GPU_PREBUILT=$QF_GPU_PREBUILT: no setup, no build"
else
  os_like=""
  # shellcheck disable=SC1091
  if [[ -r /etc/os-release ]]; then os_like=$(. /etc/os-release && echo " ${ID:-} ${ID_LIKE:-} "); fi
  if [[ $os_like != *" debian "* && $os_like != *" ubuntu "* ]] || ! command -v dpkg-query >/dev/null; then
    echo "  not Debian or Ubuntu: install these (or their equivalents) and the CUDA toolkit: ${GPU_PACKAGES[*]}"
  else
    missing=()
    for p in "${GPU_PACKAGES[@]}"; do
      status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
      if [[ $status != *"install ok installed"* ]]; then missing+=("$p"); fi
    done
    if ((${#missing[@]} == 0)); then
      echo "  every package is installed: ${GPU_PACKAGES[*]}"
    elif [[ ${QF_GPU_SETUP:-1} == 0 ]]; then
      echo "  QF_GPU_SETUP=0: not installing the missing ${missing[*]}"
    else
      sudo=()
      if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi
      run_shown "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
        || { echo "gpu_check: FAIL: apt-get update"; exit 1; }
      run_shown "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
        || { echo "gpu_check: FAIL: apt-get install"; exit 1; }
    fi
  fi
  cxx=${CXX:-}
  if [[ -z $cxx ]] && command -v g++-12 >/dev/null; then cxx=$(command -v g++-12); fi
  cmake_args=(-S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DQF_CUDA=ON -DQF_PYTHON=OFF -DQF_BUILD_TESTS=ON)
  if [[ -n $nvcc ]]; then cmake_args+=("-DCMAKE_CUDA_COMPILER=$nvcc"); fi
  if [[ -n $cxx ]]; then cmake_args+=("-DCMAKE_CXX_COMPILER=$cxx" "-DCMAKE_CUDA_HOST_COMPILER=$cxx"); fi
  if [[ -z $nvcc ]] && ((!dry_run)); then
    echo "gpu_check: FAIL: nvcc not found (looked at \$CUDACXX, \$CUDA_HOME/bin, PATH, /usr/local/cuda/bin)"; exit 1
  fi
  run_shown cmake "${cmake_args[@]}" || { echo "gpu_check: FAIL: cmake could not configure $build_dir"; exit 1; }
  run_shown cmake --build "$build_dir" -j "$(nproc)" --target quantforge qf_tests qf_gptq_device_bench \
    || { echo "gpu_check: FAIL: the build failed"; exit 1; }
fi

# ---- inputs: what every step reads, checked in the dry run too -----------------
step "inputs"
q_recipes=(w4-rtn w4-gptq fp8 nvfp4 w4-awq w8a8-sq-search)
# name|source|bound|format: source is a recipe, "fixture" or gguf:TYPE; bound
# 1e-4 where only weights are quantized, 5e-3 with quantized activations.
formats=(
  "f16|fixture|1e-4|the f16 fixture itself"
  "w4-rtn|$rec/w4-rtn.yaml|1e-4|compressed-tensors pack-quantized, W4 RTN"
  "w4-gptq|$rec/w4-gptq.yaml|1e-4|compressed-tensors pack-quantized, W4 GPTQ"
  "w3-gptq|$rec/w3-gptq.yaml|1e-4|compressed-tensors pack-quantized, W3 GPTQ"
  "w4-awq|$rec/w4-awq.yaml|1e-4|compressed-tensors pack-quantized, W4 AWQ"
  "w8a8-sq-search|$rec/w8a8-sq-search.yaml|5e-3|compressed-tensors int-quantized, W8A8 SmoothQuant"
  "fp8|$rec/fp8.yaml|5e-3|compressed-tensors float-quantized, FP8 static with KV-cache scales"
  "fp8-dynamic|$rec/fp8-dynamic.yaml|5e-3|compressed-tensors float-quantized, FP8 dynamic"
  "nvfp4|$rec/nvfp4.yaml|5e-3|compressed-tensors nvfp4-pack-quantized, NVFP4"
  "nvfp4a16|$rec/nvfp4a16.yaml|1e-4|compressed-tensors nvfp4-pack-quantized, NVFP4A16"
  "w4-gptq-gptqfmt|$rec/w4-gptq-gptqfmt.yaml|1e-4|GPTQ (AutoGPTQ, GPTQModel)"
  "w4asym-awq-awqfmt|$rec/w4asym-awq-awqfmt.yaml|1e-4|AutoAWQ GEMM"
  "fp8-modelopt|$rec/fp8-modelopt.yaml|5e-3|modelopt FP8"
  "nvfp4-modelopt|$rec/nvfp4-modelopt.yaml|5e-3|modelopt NVFP4"
  "nf4-bnb|recipes/nf4-bnb.yaml|1e-4|bitsandbytes NF4"
  "fp4-bnb|recipes/fp4-bnb.yaml|1e-4|bitsandbytes FP4"
  "q4_k_m|gguf:Q4_K_M|1e-4|GGUF Q4_K_M"
  "q8_0|gguf:Q8_0|1e-4|GGUF Q8_0"
)
recipes=()
for r in "${q_recipes[@]}"; do recipes+=("$rec/$r.yaml"); done
for f in "${formats[@]}"; do
  IFS='|' read -r _ src _ _ <<<"$f"
  if [[ $src == *.yaml && " ${recipes[*]} " != *" $src "* ]]; then recipes+=("$src"); fi
done
recipes+=(recipes/w4a16-gptq.yaml)
check "every input exists"
missing_inputs=()
for f in "$fx/config.json" "$fx/model.safetensors" "$fx/tokenizer.json" "$calib" "$evaltxt" \
  scripts/bench/make_synthetic_model.py "${recipes[@]}"; do
  if [[ ! -f $f ]]; then missing_inputs+=("$f"); fi
done
if ((${#missing_inputs[@]})); then fail "missing: ${missing_inputs[*]}"; else ok "${#recipes[@]} recipes, the fixture and the texts are present"; fi

check "the Python checks compile; numpy imports"
if [[ ! -x $PY ]]; then
  fail "no python at $PY (QF_PY names another)"
else
  py_files=("$work"/py/*.py scripts/bench/make_synthetic_model.py)
  if "$PY" -c 'import sys
for f in sys.argv[1:]:
    compile(open(f).read(), f, "exec")' "${py_files[@]}"; then
    ok "${#py_files[@]} Python files compile (the checks, make_synthetic_model.py)"
  else
    fail "a Python check does not compile"
  fi
  if want tiny; then
    if "$PY" -c 'import numpy' 2>/dev/null; then ok "numpy imports"; else fail "$PY has no numpy (make_synthetic_model.py needs it)"; fi
  fi
fi

if [[ -x $Q ]]; then
  check "each recipe parses: quantforge quantize FIXTURE --recipe R --dry-run (on the CPU)"
  bad=()
  for r in "${recipes[@]}"; do
    if [[ -f $r ]] && ! "$Q" -q quantize "$fx" --recipe "$r" --calib "$calib" -o "$work/plan" --dry-run \
      >"$work/plan.log" 2>&1; then
      bad+=("$r: $(tail -n 1 "$work/plan.log")")
    fi
  done
  if ((${#bad[@]})); then fail "recipes: $(printf '%s; ' "${bad[@]}")"; else ok "every recipe parses"; fi
else
  echo "  ($Q is not built: the recipes are parsed when it is)"
fi

check "the filter '$filter' matches every suite of the device tests"
mapfile -t device_sources < <(find src \( -path '*/cuda/*_test.cpp' -o -name '*device*_test.cpp' \) -type f | sort)
mapfile -t expected_suites < <(grep -hoE '^[[:space:]]*(TEST|TEST_F|TEST_P|TYPED_TEST|TYPED_TEST_P)\([[:space:]]*[A-Za-z0-9_]+' \
  "${device_sources[@]}" /dev/null | sed -E 's/.*\([[:space:]]*//' | sort -u)
if ((${#expected_suites[@]} == 0)); then
  fail "no device test suites found in src/ (*device*_test.cpp, cuda/*_test.cpp)"
elif [[ -x $T ]]; then
  # Suite lines of --gtest_list_tests: "Suite." or "Prefix/Suite.", maybe "  # TypeParam = ...".
  if ! "$T" --gtest_filter="$filter" --gtest_list_tests >"$work/list.txt" 2>&1; then
    fail "$T --gtest_list_tests: $(tail -n 1 "$work/list.txt")"
  else
    matched=" $(grep -v '^ ' "$work/list.txt" | sed -E 's/[[:space:]].*//; s/\.$//' | tr '/\n' '  ') "
    absent=()
    for s in "${expected_suites[@]}"; do
      if [[ $matched != *" $s "* ]]; then absent+=("$s"); fi
    done
    if ((${#absent[@]})); then
      fail "not matched by '$filter' in $T (or not in that binary: older than the sources?): ${absent[*]}"
    else
      ok "'$filter' matches all ${#expected_suites[@]} device suites: ${expected_suites[*]}"
    fi
  fi
else
  echo "  ($T is not built: the filter is checked against it when it is; device suites in the sources: ${expected_suites[*]})"
fi
if want gptq8b && [[ ! -x $B ]]; then
  if ((dry_run)) && [[ -z ${QF_GPU_PREBUILT:-} ]]; then echo "  ($B is not built yet)"; else fail "$B is missing"; fi
fi

# ---- probe: is there a GPU? -----------------------------------------------------
step "probe: a usable GPU"
if command -v nvidia-smi >/dev/null && ((!dry_run)); then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
check "exit 0: otherwise no usable GPU, and the run ends"
if ! run_logged "" "$work/probe.log" "$Q" -q eval "$fx" --text "$evaltxt" --ctx 64 --max-chunks 1 --device cuda; then
  echo "gpu_check: FAIL: no usable GPU (or no cuda build): $(tail -n 1 "$work/probe.log")"; exit 1
fi

# ---- tests ---------------------------------------------------------------------
if want tests; then
  step "tests: the device tests"
  check "exit 0; each of the ${#expected_suites[@]} device suites runs; no cuda case skipped ('no CUDA device')"
  if run_tee "$work/tests.txt" "$T" --gtest_filter="$filter"; then ran_ok "device tests passed"; else fail "device tests"; fi
  if ((!dry_run)); then
    if grep -q "no CUDA device" "$work/tests.txt"; then fail "the cuda cases were skipped: no usable GPU"; fi
    not_run=()
    for s in "${expected_suites[@]}"; do
      if ! grep -qE "^\[ RUN      \] ([A-Za-z0-9_]+/)*$s(/[0-9]+)?\." "$work/tests.txt"; then not_run+=("$s"); fi
    done
    if ((${#not_run[@]})); then fail "suites that ran no test: ${not_run[*]}"; else ok "every device suite ran"; fi
    skipped=$(grep -m1 -oE '^\[  SKIPPED \] [0-9]+ tests?' "$work/tests.txt" | grep -oE '[0-9]+' || echo 0)
    echo "  skipped: $skipped (each with its reason above)"
  fi
fi

# ---- quantize: cuda against cpu --------------------------------------------------
if want quantize; then
  step "quantize: the fixture on cuda against cpu"
  for r in "${q_recipes[@]}"; do
    made=1
    for d in cpu cuda; do
      run_logged "$r on $d" "$work/q-$d-$r.log" "$Q" -q quantize "$fx" --recipe "$rec/$r.yaml" --calib "$calib" \
        -o "$work/q-$d-$r" --device "$d" || { fail "quantize $r on $d"; made=0; }
    done
    if [[ $r == w4-rtn ]]; then
      check "the two checkpoints are byte-identical (model.safetensors, config.json)"
      show cmp "$work/q-cpu-$r/model.safetensors" "$work/q-cuda-$r/model.safetensors"
      show cmp "$work/q-cpu-$r/config.json" "$work/q-cuda-$r/config.json"
      if ((!dry_run && made)); then
        if cmp -s "$work/q-cpu-$r/model.safetensors" "$work/q-cuda-$r/model.safetensors" \
          && cmp -s "$work/q-cpu-$r/config.json" "$work/q-cuda-$r/config.json"; then
          ok "$r byte-identical"
        else
          fail "$r differs between cuda and cpu"
        fi
      fi
      continue
    fi
    rel=0.05
    if [[ $r == w4-awq || $r == w8a8-sq-search ]]; then rel=0.10; fi
    for d in cpu cuda; do
      if ((made)); then
        run_logged "" "$work/kl-$d-$r.log" "$Q" -q eval "$work/q-$d-$r" --text "$evaltxt" "${eval_chunks[@]}" \
          --baseline "$fx" --json "$work/kl-$d-$r.json" || { fail "eval of $r from $d"; made=0; }
      fi
    done
    check "KL divergence from f16 of the cuda checkpoint <= max($(awk -v r="$rel" 'BEGIN { print 1 + r }') x the cpu's, the cpu's + 1e-4)"
    if ((made)); then
      if run_shown "$PY" "$work/py/kl.py" "$work/kl-cpu-$r.json" "$work/kl-cuda-$r.json" "$r" "$rel"; then
        ran_ok "$r on cuda as good as on cpu"
      else
        fail "$r: KL on cuda"
      fi
    fi
  done
  check "imatrix on cuda runs"
  if run_logged "" "$work/imatrix.log" "$Q" -q imatrix "$fx" --text "$calib" --ctx 128 -o "$work/i.gguf" --device cuda; then
    ran_ok "imatrix on cuda"
  else
    fail "imatrix on cuda"
  fi
fi

# ---- formats: every export format, eval on cuda against cpu ----------------------
if want formats; then
  step "formats: every export format, evaluated on cuda and on cpu"
  for f in "${formats[@]}"; do
    IFS='|' read -r name src tol what <<<"$f"
    echo "  -- $name: $what"
    model=$work/q-cpu-$name
    if [[ $src == fixture ]]; then
      model=$fx
    elif [[ $src == gguf:* ]]; then
      model=$work/f-$name.gguf
      run_logged "" "$work/f-$name.make.log" "$Q" -q convert "$fx" --to gguf --type "${src#gguf:}" -o "$model" \
        || { fail "convert $name"; continue; }
    elif [[ -d $model ]] || { ((dry_run)) && want quantize && [[ " ${q_recipes[*]} " == *" $name "* ]]; }; then
      echo "  (the checkpoint the quantize step made on the cpu: ${model//"$work"/\$WORK})"
    else
      run_logged "" "$work/f-$name.make.log" "$Q" -q quantize "$fx" --recipe "$src" --calib "$calib" -o "$model" \
        || { fail "quantize $name"; continue; }
    fi
    cpu_cmd=("$Q" -q eval "$model" --text "$evaltxt" "${eval_chunks[@]}" --device cpu --json "$work/f-$name.cpu.json")
    cuda_cmd=("$Q" -q eval "$model" --text "$evaltxt" "${eval_chunks[@]}" --device cuda --json "$work/f-$name.cuda.json")
    show "${cpu_cmd[@]}"
    show "${cuda_cmd[@]}"
    check "perplexity on cuda within $tol (relative) of the cpu's, the same tokens scored, both valid"
    show "$PY" "$work/py/ppl.py" "$work/f-$name.cpu.json" "$work/f-$name.cuda.json" "$name" "$tol"
    if ((dry_run)); then continue; fi
    rc_cpu=0 rc_cuda=0
    "${cpu_cmd[@]}" >"$work/f-$name.cpu.log" 2>&1 &
    bg_pid=$!
    "${cuda_cmd[@]}" >"$work/f-$name.cuda.log" 2>&1 || rc_cuda=$?
    wait "$bg_pid" || rc_cpu=$?
    bg_pid=""
    if ((rc_cpu)); then fail "eval of $name on cpu: exit $rc_cpu: $(tail -n 1 "$work/f-$name.cpu.log")"; fi
    if ((rc_cuda)); then fail "eval of $name on cuda: exit $rc_cuda: $(tail -n 1 "$work/f-$name.cuda.log")"; fi
    if ((rc_cpu == 0 && rc_cuda == 0)); then
      if "$PY" "$work/py/ppl.py" "$work/f-$name.cpu.json" "$work/f-$name.cuda.json" "$name" "$tol"; then
        ok "$name: eval on cuda agrees with cpu"
      else
        fail "$name: eval on cuda disagrees with cpu"
      fi
    fi
  done
fi

# ---- faults: a failing device ends the run cleanly -------------------------------
if want faults; then
  step "faults: injected device failures"
  for plan in alloc:3 blas:2; do
    dir=$work/fault-${plan/:/-}
    mkdir -p "$dir"
    show env "QF_DEVICE_FAULT=$plan" "$Q" -q quantize "$fx" --recipe "$rec/w4-gptq.yaml" --calib "$calib" \
      -o "$dir/out" --device cuda
    check "exit 5; stderr exactly one line, starting 'quantforge: ' and naming the device; nothing left in ${dir//"$work"/\$WORK}/ (no out, out.tmp* or hidden temporaries)"
    if ((dry_run)); then continue; fi
    rc=0
    env "QF_DEVICE_FAULT=$plan" "$Q" -q quantize "$fx" --recipe "$rec/w4-gptq.yaml" --calib "$calib" \
      -o "$dir/out" --device cuda >"$dir.out" 2>"$dir.err" || rc=$?
    lines=$(wc -l <"$dir.err")
    first=$(head -n 1 "$dir.err")
    left=$(ls -A "$dir")
    echo "  exit $rc; stderr: $first"
    if [[ $rc == 5 && $lines == 1 && $first == "quantforge: "* && $first == *device* && -z $left ]]; then
      ok "$plan: exit 5, one line naming the device, nothing left"
    else
      fail "$plan: exit $rc, $lines stderr line(s), left in the folder: ${left:-nothing}"
    fi
  done
fi

# ---- sanitizer: compute-sanitizer memcheck and racecheck --------------------------
if want sanitizer; then
  step "sanitizer: compute-sanitizer"
  san_cmd=${san:-compute-sanitizer}
  if [[ -z $san ]]; then
    if ((dry_run)); then echo "  (compute-sanitizer is not found here)"; else fail "compute-sanitizer not found (PATH, \$CUDA_HOME/bin, \$CUDA_HOME/compute-sanitizer)"; fi
  fi
  # san_case TOOL WHAT CMD...: compute-sanitizer --tool TOOL over CMD.
  san_case() {
    local tool=$1 what=$2 log=$work/san-$1-$2.log
    shift 2
    check "$tool over $what: exit 0, 0 errors in its summary"
    if run_logged "$tool over $what" "$log" "$san_cmd" --tool "$tool" --error-exitcode 86 "$@"; then
      if ((!dry_run)); then
        if "$PY" "$work/py/sanitizer.py" "$log"; then ok "$tool over $what: no errors"; else fail "$tool over $what"; fi
      fi
    else
      "$PY" "$work/py/sanitizer.py" "$log" || true
      fail "$tool over $what"
    fi
  }
  if [[ -n $san ]] || ((dry_run)); then
    san_case memcheck quantize "$Q" -q quantize "$fx" --recipe "$rec/w4-gptq.yaml" --calib "$calib" -o "$work/san-q" --device cuda
    san_case memcheck eval "$Q" -q eval "$fx" --text "$evaltxt" --ctx 128 --max-chunks 2 --device cuda
    san_case racecheck eval "$Q" -q eval "$fx" --text "$evaltxt" --ctx 64 --max-chunks 1 --device cuda
  fi
fi

# ---- gptq8b: GPTQ of Llama-3-8B-shaped layers --------------------------------------
if want gptq8b; then
  step "gptq8b: GPTQ, Llama-3-8B-shaped layers, 128 x 2048 calibration tokens (cuda)"
  check "both run on cuda (no 'skipped'); each phase printed beside its time at peak"
  for shape in "4096 4096" "4096 14336"; do
    read -r rows cols <<<"$shape"
    if run_tee "$work/bench-$cols.txt" "$B" "$rows" "$cols" 262144 cuda; then
      if ((!dry_run)) && grep -q "skipped" "$work/bench-$cols.txt"; then fail "qf_gptq_device_bench $rows x $cols: skipped"; fi
    else
      fail "qf_gptq_device_bench $rows x $cols"
    fi
  done
fi

# ---- tiny: the TinyLlama-shaped synthetic model --------------------------------------
if want tiny; then
  step "tiny: TinyLlama-shaped synthetic model (1.1B), W4A16 GPTQ"
  model=$build_dir/tinyllama-synth
  if [[ ! -f $model/model.safetensors ]]; then
    if ((!dry_run)); then mkdir -p "$build_dir"; fi
    run_shown "$PY" scripts/bench/make_synthetic_model.py "$model" || fail "make_synthetic_model.py"
  fi
  devices=(cuda cpu)
  if [[ ${QF_GPU_TINY_CPU:-1} == 0 ]]; then devices=(cuda); fi
  check "quantize runs on ${devices[*]} (times printed); bench on cuda runs"
  for d in "${devices[@]}"; do
    if run_logged "tinyllama w4a16-gptq on $d" "$work/tiny-$d.log" "$Q" -q quantize "$model" \
      --recipe recipes/w4a16-gptq.yaml -o "$work/tiny-$d" --device "$d"; then
      if ((!dry_run)); then grep -E '^(time:|wrote )' "$work/tiny-$d.log" | sed "s#$work#\$WORK#; s/^/  /" || true; fi
    else
      fail "tinyllama quantize on $d"
    fi
  done
  run_shown "$Q" bench "$model" -p 512 -n 128 --device cuda || fail "tinyllama bench on cuda"
fi

echo
if ((dry_run)); then
  if ((fails)); then echo "gpu_check: dry run: $fails problem(s)"; exit 1; fi
  echo "gpu_check: dry run: every input present, the recipes and Python checks sound$([[ -x $T ]] && echo ', the filter covers every device suite'); nothing run"
  exit 0
fi
if ((fails)); then echo "gpu_check: $fails check(s) failed"; exit 1; fi
echo "gpu_check: all checks passed"
