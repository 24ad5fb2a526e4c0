#!/usr/bin/env bash
# Runs one libFuzzer target under ASan + UBSan.
#   scripts/fuzz.sh --list                    the targets (tests/fuzz/fuzz_<target>.cpp)
#   scripts/fuzz.sh TARGET MINUTES [FLAGS]    build build-fuzz/ and fuzz TARGET for MINUTES
# The seed corpus is tests/fuzz/corpus/TARGET (read only). New inputs go to
# $QF_FUZZ_WORK/TARGET/corpus and findings (crash-*, leak-*, timeout-*, oom-*)
# to $QF_FUZZ_WORK/TARGET/artifacts; QF_FUZZ_WORK defaults to
# ${TMPDIR:-/tmp}/qf-fuzz, outside the repository. The run stops after
# MINUTES or QF_FUZZ_RUNS executions (default 10,000,000), whichever comes
# first; extra FLAGS go to libFuzzer (e.g. -jobs=2, -only_ascii=1). Ends with
# the executions, exec/s, coverage and the findings. Exit status: 0 when
# nothing was found, 1 otherwise.
# Needs clang++-14 and libclang-rt-14-dev (scripts/setup.sh --fuzz); QF_FUZZ_CXX
# picks another clang. To keep a finding fixed, minimise it
# (build-fuzz/bin/fuzz_TARGET -minimize_crash=1 -runs=10000 CRASH) and add it
# to tests/fuzz/corpus/TARGET: ctest's fuzz_replay.TARGET replays the corpus.
set -euo pipefail
cd "$(dirname "$0")/.."

targets() { for f in tests/fuzz/fuzz_*.cpp; do f=${f##*/fuzz_}; echo "${f%.cpp}"; done; }

if [[ "${1:-}" == "--list" ]]; then
  targets
  exit 0
fi
if [[ $# -lt 2 || ! "$2" =~ ^[0-9]+$ ]]; then
  echo "usage: scripts/fuzz.sh TARGET MINUTES [libFuzzer flags] | scripts/fuzz.sh --list" >&2
  exit 2
fi
target="$1"
minutes="$2"
shift 2
if ! targets | grep -qx "$target"; then
  echo "fuzz.sh: unknown target '$target'; targets: $(targets | tr '\n' ' ')" >&2
  exit 2
fi

cxx="${QF_FUZZ_CXX:-clang++-14}"
if ! command -v "$cxx" >/dev/null; then
  echo "fuzz.sh: $cxx not found; run scripts/setup.sh --fuzz" >&2
  exit 2
fi
build=build-fuzz
cmake -S . -B "$build" -DQF_FUZZ=ON -DQF_CUDA=OFF -DQF_BUILD_TESTS=OFF -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" >/dev/null
cmake --build "$build" -j "${QF_JOBS:-2}" --target "fuzz_$target"

work="${QF_FUZZ_WORK:-${TMPDIR:-/tmp}/qf-fuzz}/$target"
mkdir -p "$work/corpus" "$work/artifacts" "$work/tmp"
seeds="tests/fuzz/corpus/$target"
dict=()
[[ -f "tests/fuzz/$target.dict" ]] && dict=("-dict=tests/fuzz/$target.dict")
log="$work/fuzz.log"
echo "fuzz.sh: $target for $minutes min; corpus $work/corpus (seeds $seeds), artifacts $work/artifacts, log $log" >&2

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
rc=0
TMPDIR="$work/tmp" "$build/bin/fuzz_$target" "$work/corpus" "$seeds" "${dict[@]}" \
  -max_total_time=$((minutes * 60)) -runs="${QF_FUZZ_RUNS:-10000000}" -rss_limit_mb=2048 -timeout=10 \
  -artifact_prefix="$work/artifacts/" -print_final_stats=1 "$@" >"$log" 2>&1 || rc=$?

# Summary: executions, speed, coverage, corpus, findings.
execs=$(grep -o 'stat::number_of_executed_units:[[:space:]]*[0-9]*' "$log" | tail -1 | awk '{print $2}')
speed=$(grep -o 'stat::average_exec_per_sec:[[:space:]]*[0-9]*' "$log" | tail -1 | awk '{print $2}')
last=$(grep -E '^#[0-9]+' "$log" | grep -E 'cov: ' | tail -1 || true)
cov=$(echo "$last" | grep -o 'cov: [0-9]*' | awk '{print $2}')
ft=$(echo "$last" | grep -o 'ft: [0-9]*' | awk '{print $2}')
corp=$(echo "$last" | grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' | awk '{print $2}')
findings=$(find "$work/artifacts" -type f | sort)
echo "target:      $target"
echo "executions:  ${execs:-?} in up to $minutes min (${speed:-?} exec/s)"
echo "coverage:    cov ${cov:-?}, ft ${ft:-?}, corpus ${corp:-?}"
if [[ -n "$findings" ]]; then
  echo "findings:"
  echo "$findings" | sed 's/^/  /'
  grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error|fuzz: )' "$log" | head -5 | sed 's/^/  /'
  exit 1
fi
if [[ $rc -ne 0 ]]; then
  echo "findings:    none saved, but libFuzzer exited $rc; see $log"
  exit 1
fi
echo "findings:    none"
