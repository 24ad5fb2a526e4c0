#!/usr/bin/env bash
# Checks that two quantforge binaries write byte-identical outputs: a refactor
# must not change any result unless the change is a documented fix.
#   scripts/compare_builds.sh OLD_BINARY NEW_BINARY [WORK_DIR]
# Runs both on the bundled fixture model (tests/data/fixture-llama): quantize
# with every test recipe (tests/data/recipes/*.yaml, those that are meant to
# fail included: their exit code and message must agree too), convert to GGUF
# at F16, Q8_0, Q4_K_M and Q2_K (with an importance matrix), the importance
# matrix itself, inspect of every quantized checkpoint, and eval --json on
# the held-out text; then compares every
# file (JSON without its timings). Prints one line per case and exits 1 on any difference.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -lt 2 ]]; then
  echo "usage: scripts/compare_builds.sh OLD_BINARY NEW_BINARY [WORK_DIR]" >&2
  exit 2
fi
old=$(realpath "$1")
new=$(realpath "$2")
work="${3:-$(mktemp -d "${TMPDIR:-/tmp}/qf-compare.XXXXXX")}"
mkdir -p "$work"
model=tests/data/fixture-llama
calib=tests/data/text/calibration.txt
text=tests/data/text/evaluation.txt
export QF_THREADS=2

# run SIDE CASE CMD...: runs the binary of SIDE, keeping its outputs under
# $work/SIDE/CASE, its exit code and its stderr (with the side's paths made
# equal) in $work/SIDE/CASE.log.
run() {
  local side=$1 case=$2 bin
  shift 2
  [[ $side == old ]] && bin=$old || bin=$new
  local out="$work/$side/$case"
  mkdir -p "$out"
  local rc=0
  "$bin" -q "$@" 2>"$out.err" >"$out.out" || rc=$?
  { echo "exit $rc"; sed "s|$work/$side|WORK|g" "$out.err"; } >"$out.log"
  # The report on stdout without what differs from run to run: paths, times, memory.
  sed -E "s|$work/$side|WORK|g; s/ in [0-9.]+ s\b/ in T s/g; s/peak RSS [0-9.]+ [KMG]?i?B/peak RSS M/g" "$out.out" >"$out.stdout"
  rm -f "$out.err" "$out.out"
}

cases=()
for side in old new; do
  o="$work/$side"
  for r in tests/data/recipes/*.yaml; do
    name=$(basename "$r" .yaml)
    run "$side" "quantize-$name" quantize "$model" --recipe "$r" --calib "$calib" -o "$o/quantize-$name/out"
    [[ $side == old ]] && cases+=("quantize-$name")
    if [[ -d "$o/quantize-$name/out" ]]; then  # what inspect reports of the checkpoint
      run "$side" "inspect-$name" inspect "$o/quantize-$name/out"
      [[ $side == old ]] && cases+=("inspect-$name")
    fi
  done
  run "$side" imatrix imatrix "$model" --text "$calib" -o "$o/imatrix/imatrix.gguf"
  for t in F16 Q8_0 Q4_K_M; do
    run "$side" "convert-$t" convert "$model" --to gguf --type "$t" -o "$o/convert-$t/model.gguf"
    [[ $side == old ]] && cases+=("convert-$t")
  done
  # Both sides read the same imatrix file: its path is written into the GGUF
  # (the imatrix itself is compared as its own case).
  run "$side" convert-Q2_K-imatrix convert "$model" --to gguf --type Q2_K --imatrix "$work/old/imatrix/imatrix.gguf" \
    -o "$o/convert-Q2_K-imatrix/model.gguf"
  run "$side" eval eval "$model" --text "$text" --json "$o/eval/eval.json"
done
cases+=(imatrix convert-Q2_K-imatrix eval)

# same DIR_A DIR_B: the same files with the same bytes, except that JSON files
# are compared without their timings (keys "seconds", "*_per_s", "*time*").
same() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, os, re, sys
a, b = sys.argv[1:3]
def files(d):
    return sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs)
def untimed(v):
    if isinstance(v, dict):
        return {k: untimed(x) for k, x in v.items() if not re.search(r"(^seconds$|_per_s$|time)", k)}
    if isinstance(v, list):
        return [untimed(x) for x in v]
    return v
fa, fb = files(a), files(b)
if fa != fb:
    print("    files differ:", sorted(set(fa) ^ set(fb))[:5]); sys.exit(1)
bad = []
for f in fa:
    x, y = open(os.path.join(a, f), "rb").read(), open(os.path.join(b, f), "rb").read()
    if x == y:
        continue
    if f.endswith(".json"):
        try:
            if untimed(json.loads(x)) == untimed(json.loads(y)):
                continue
        except ValueError:
            pass
    bad.append(f)
if bad:
    print("    differ:", bad[:5]); sys.exit(1)
PY
}

diffs=0
for c in "${cases[@]}"; do
  if same "$work/old/$c" "$work/new/$c" && cmp -s "$work/old/$c.log" "$work/new/$c.log" &&
     { [[ $c == eval ]] || cmp -s "$work/old/$c.stdout" "$work/new/$c.stdout"; }; then  # eval prints its timing
    printf 'same       %s (%s)\n' "$c" "$(head -1 "$work/old/$c.log")"
  else
    printf 'DIFFERENT  %s\n' "$c"
    diff "$work/old/$c.log" "$work/new/$c.log" | head -5 | sed 's/^/    /' || true
    diffs=$((diffs + 1))
  fi
done
echo "compare_builds: ${#cases[@]} cases, $diffs different (outputs under $work)"
[[ $diffs -eq 0 ]]
