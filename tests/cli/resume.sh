# quantize --resume: a run killed with SIGKILL at several points (before the
# first layer is finished, after one, after several; twice in a row) and then
# resumed writes the same bytes as an uninterrupted run, also when a saved
# layer was damaged in between (its checksum fails, it runs again). Also: a saved state
# is used only for the same inputs, a run without --resume discards it, and
# two runs to the same output exclude each other. AWQ on a mixture-of-experts
# model resumes with its scaled routers.
source "$(dirname "$0")/lib.sh"
M="$SRC/tests/data/fixture-llama"
R="$SRC/tests/data/recipes"

# kill_when STATE N OUT -- cmd...: starts cmd, kills it with SIGKILL as soon
# as the resume state file STATE exists and (N >= 1) records N finished
# layers; fails the test when the run finished (or 120 s passed) first.
kill_when() {
  local state="$1" n="$2" out="$3"
  shift 4
  "$@" >/dev/null 2>"$WORK/kill.err" &
  local pid=$! t=0
  ready() { [[ -e $state ]] && { ((n == 0)) || grep -q "\"layers_done\": $n\$" "$state" 2>/dev/null; }; }
  while ! ready && ((t < 12000)) && kill -0 "$pid" 2>/dev/null; do
    sleep 0.01
    t=$((t + 1))
  done
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  if [[ -e $out ]] || ! ready; then
    fail "the run to $out was not killed with $n finished layers: $(cat "$WORK/kill.err")"
    return 1
  fi
  return 0
}

# GPTQ, killed three times: while layer 0 runs, after layer 1, after layer 2.
"$QF" -q quantize "$M" --recipe "$R/w4-gptq.yaml" -o "$WORK/ref" --threads 1 >/dev/null
S="$WORK/.g.resume"
if kill_when "$S/state.json" 0 "$WORK/g" -- "$QF" quantize "$M" --recipe "$R/w4-gptq.yaml" -o "$WORK/g" --threads 1 &&
   kill_when "$S/state.json" 2 "$WORK/g" -- "$QF" quantize "$M" --recipe "$R/w4-gptq.yaml" -o "$WORK/g" --threads 1 --resume &&
   kill_when "$S/state.json" 3 "$WORK/g" -- "$QF" quantize "$M" --recipe "$R/w4-gptq.yaml" -o "$WORK/g" --threads 2 --resume; then
  # 1000 bytes of the third saved layer flipped: its checksum no longer
  # matches, so it and what follows are discarded and run again.
  $PY - "$S/layer-00002.safetensors" <<'PYEOF'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
mid = len(b) // 2
for i in range(mid, mid + 1000):
    b[i] ^= 0xFF
open(p, "wb").write(b)
PYEOF
  "$QF" quantize "$M" --recipe "$R/w4-gptq.yaml" -o "$WORK/g" --threads 1 --resume --json >"$WORK/g.json" 2>"$WORK/g.err"
  if grep -q "layer-00002.safetensors does not match its SHA-256 in .*state.json; that layer and the ones after it are discarded" "$WORK/g.err" &&
     grep -q "resuming: 2 finished layer" "$WORK/g.err" && grep -q '"resumed_layers": 2' "$WORK/g.json"; then
    ok "the last run found the damaged layer and resumed after the 2 layers before it"
  else
    fail "the last run did not resume after 2 intact layers: $(cat "$WORK/g.err")"
  fi
  if same_output "$WORK/ref" "$WORK/g"; then ok "GPTQ killed three times, a layer damaged, resumed: same bytes"; else fail "GPTQ resumed output differs"; fi
  [[ ! -e $S ]] && ok "the state is removed once the output is committed" || fail "the state folder is left behind"
  [[ -z $(find "$WORK" -maxdepth 1 -name '.g.tmp.*') ]] && ok "no temporary of the killed runs is left" || fail "temporaries left: $(ls -a "$WORK")"
fi

# AWQ rewrites norms and the Linears it does not quantize (on the
# mixture-of-experts fixture the routers as well); FP8 with static input
# scales and KV-cache scales keeps per-layer ranges.
C="$SRC/tests/data/text/calibration.txt"
for case in "w4-awq $M w4-awq" "fp8 $M fp8" "moe-awq $SRC/tests/data/fixture-mixtral w4-awq"; do
  read -r tag model recipe <<<"$case"
  "$QF" -q quantize "$model" --recipe "$R/$recipe.yaml" -o "$WORK/$tag-ref" --calib "$C" --threads 2 >/dev/null \
    || { fail "quantize $model with $recipe"; continue; }
  if kill_when "$WORK/.$tag.resume/state.json" 2 "$WORK/$tag" -- \
       "$QF" quantize "$model" --recipe "$R/$recipe.yaml" -o "$WORK/$tag" --calib "$C" --threads 1; then
    "$QF" -q quantize "$model" --recipe "$R/$recipe.yaml" -o "$WORK/$tag" --calib "$C" --threads 2 --resume >/dev/null
    if same_output "$WORK/$tag-ref" "$WORK/$tag"; then ok "$tag killed and resumed: same bytes"; else fail "$tag resumed output differs"; fi
  fi
done

# A state made with another recipe is not used.
if kill_when "$WORK/.x.resume/state.json" 1 "$WORK/x" -- \
     "$QF" quantize "$M" --recipe "$R/w4-gptq.yaml" -o "$WORK/x" --threads 1; then
  "$QF" quantize "$M" --recipe "$R/w4-rtn.yaml" -o "$WORK/x" --resume >/dev/null 2>"$WORK/x.err"
  if grep -q "is not used: it was made for different inputs (changed: recipe, calibration); starting over" "$WORK/x.err"; then
    ok "a state for another recipe is discarded"
  else
    fail "state for another recipe: $(cat "$WORK/x.err")"
  fi
fi
# Without --resume a saved state is discarded (and said so).
if kill_when "$WORK/.y.resume/state.json" 1 "$WORK/y" -- \
     "$QF" quantize "$M" --recipe "$R/w4-gptq.yaml" -o "$WORK/y" --threads 1; then
  "$QF" quantize "$M" --recipe "$R/w4-gptq.yaml" -o "$WORK/y" --threads 2 >/dev/null 2>"$WORK/y.err"
  if grep -q "discarding the state of an interrupted run" "$WORK/y.err" && ! grep -q "(restored)" "$WORK/y.err" &&
     same_output "$WORK/ref" "$WORK/y"; then
    ok "without --resume the state is discarded and the run starts over"
  else
    fail "without --resume: $(cat "$WORK/y.err")"
  fi
fi

# Two runs to one output: the second is refused while the first holds the lock.
"$QF" -q quantize "$M" --recipe "$R/w4-gptq.yaml" -o "$WORK/z" --threads 1 >/dev/null 2>&1 &
zpid=$!
t=0
while [[ ! -e $WORK/.z.resume/state.json ]] && ((t < 6000)); do sleep 0.01; t=$((t + 1)); done
expect_exit 5 "another quantforge process is writing this output" -- \
  "$QF" quantize "$M" --recipe "$R/w4-gptq.yaml" -o "$WORK/z" --threads 1
wait "$zpid" && ok "the first run finished" || fail "the first run failed"
same_output "$WORK/ref" "$WORK/z" && ok "the first run's output is intact" || fail "the first run's output differs"

# A state that cannot be read (here state.json is a folder) is discarded
# with a note, as a state for other inputs is: the run starts over and
# finishes (it used to fail and leave the folder with its lock behind).
mkdir -p "$WORK/.s.resume/state.json"
if "$QF" quantize "$M" --recipe "$R/w4-rtn.yaml" -o "$WORK/s" --resume >/dev/null 2>"$WORK/s.err" &&
   grep -q "is not used: it cannot be read" "$WORK/s.err" && [[ -d $WORK/s && ! -e $WORK/.s.resume ]]; then
  ok "an unreadable state is discarded and the run finishes"
else
  fail "unreadable state: $(cat "$WORK/s.err")"
fi

# A run that fails before its first layer leaves no state folder.
expect_exit 6 "" -- "$QF" quantize "$M" --recipe "$R/w4-gptq.yaml" -o "$WORK/f" --calib "$WORK/missing.txt"
[[ ! -e $WORK/.f.resume ]] && ok "no state folder after an early failure" || fail "state folder left after an early failure"
finish
