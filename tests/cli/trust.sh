#!/usr/bin/env bash
# Fail-closed behaviour: the eval gate refuses meaningless measurements,
# non-finite weights are refused, flags are validated, outputs never destroy
# inputs or special files, write errors and interrupts are handled.
source "$(dirname "$0")/lib.sh"

fx="$SRC/tests/data/fixture-llama"
calib="$SRC/tests/data/text/calibration.txt"
evaltxt="$SRC/tests/data/text/evaluation.txt"
rec="$SRC/tests/data/recipes"

# A copy of the fixture with one weight set to NAN_VALUE (an f16 bit pattern).
poison() {  # poison DIR TENSOR F16BITS
  mkdir -p "$1"
  cp "$fx"/* "$1"/
  $PY - "$1/model.safetensors" "$2" "$3" <<'PYEOF'
import json, struct, sys
path, name, bits = sys.argv[1], sys.argv[2], int(sys.argv[3], 16)
raw = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
assert h[name]["dtype"] == "F16", h[name]
off = 8 + n + h[name]["data_offsets"][0] + 2 * (3 * h[name]["shape"][1] + 5)  # element [3, 5]
raw[off:off + 2] = struct.pack("<H", bits)
open(path, "wb").write(raw)
PYEOF
}
poison "$WORK/nan" model.layers.1.mlp.down_proj.weight 7e00
poison "$WORK/inf" model.layers.2.self_attn.q_proj.weight 7c00

# ---- 1. the gate fails closed ---------------------------------------------
expect_exit 10 "gate failed: the measurement is not valid.*NaN or infinite logits in the evaluated model" -- \
  "$QF" -q eval "$WORK/nan" --text "$evaltxt" --max-chunks 2 --baseline "$fx" --max-kld 0.05 --json "$WORK/nan.json"
$PY - "$WORK/nan.json" <<'PYEOF' && ok "the report of a NaN model says it is invalid and the gate failed" || fail "nan report: $(cat "$WORK/nan.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["valid"] is False and j["problems"] and j["nonfinite_tokens"] == j["tokens_scored"] > 0, j
assert j["gate"]["passed"] is False and "not valid" in j["gate"]["failures"][0], j["gate"]
PYEOF
expect_exit 10 "not valid.*baseline" -- "$QF" -q eval "$fx" --text "$evaltxt" --max-chunks 2 --baseline "$WORK/nan" --max-ppl-ratio 100
rc=0
"$QF" -q eval "$WORK/nan" --text "$evaltxt" --max-chunks 2 --json "$WORK/nan2.json" >"$WORK/nan2.out" 2>"$WORK/nan2.err" || rc=$?
[[ $rc -eq 0 ]] && grep -q "warning: the measurement is not valid" "$WORK/nan2.err" && grep -q "^INVALID" "$WORK/nan2.out" \
  && $PY -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['valid'] is False, j" "$WORK/nan2.json" \
  && ok "eval without a gate warns about a NaN model and marks the JSON invalid" || fail "ungated nan eval: rc $rc $(cat "$WORK/nan2.err")"
expect_exit 3 "--ctx 2 leaves no token to score in chunks mode" -- "$QF" eval "$fx" --text "$evaltxt" --ctx 2
printf 'Once upon a time.\n' >"$WORK/short.txt"
expect_exit 3 "fewer than one chunk of 512" -- "$QF" eval "$fx" --text "$WORK/short.txt"
expect_exit 3 "model.layers.1.mlp.down_proj.weight \[3, 5\] is nan" -- "$QF" quantize "$WORK/nan" --recipe "$rec/w4-rtn.yaml" -o "$WORK/qnan"
[[ ! -e "$WORK/qnan" ]] && ok "no output after refusing a NaN model" || fail "quantize left $WORK/qnan"
expect_exit 3 "model.layers.2.self_attn.q_proj.weight \[3, 5\] is infinite" -- "$QF" convert "$WORK/inf" --to gguf --type Q8_0 -o "$WORK/inf.gguf"
[[ ! -e "$WORK/inf.gguf" ]] && ok "no GGUF after refusing an Inf model" || fail "convert left $WORK/inf.gguf"
expect_exit 3 "model.layers.1.mlp.down_proj.weight \[3, 5\] is nan" -- "$QF" imatrix "$WORK/nan" --text "$calib" --chunks 1 -o "$WORK/nan.imatrix"
"$QF" -q convert "$WORK/inf" --to gguf --type F16 -o "$WORK/inf16.gguf" --allow-nonfinite 2>/dev/null \
  && ok "--allow-nonfinite overrides the weight check" || fail "convert --allow-nonfinite"

# ---- 2. flags are validated -----------------------------------------------
expect_exit 2 "--ctx: must be an integer >= 2, got '0'" -- "$QF" eval "$fx" --text "$evaltxt" --ctx 0
expect_exit 2 "--ctx: must be an integer >= 2, got '-5'" -- "$QF" eval "$fx" --text "$evaltxt" --ctx -5
expect_exit 2 "--max-chunks: must be an integer >= 1, got '-1'" -- "$QF" eval "$fx" --text "$evaltxt" --max-chunks -1
expect_exit 2 "--max-kld: must be a finite number >= 0, got 'nan'" -- "$QF" eval "$fx" --text "$evaltxt" --baseline "$fx" --max-kld nan
expect_exit 2 "-n: must be an integer from 0 to" -- "$QF" generate "$fx" -n -5
expect_exit 2 "--top-p: must be a finite number > 0 and <= 1" -- "$QF" generate "$fx" --top-p 0
expect_exit 2 "--threads: must be an integer from 1 to [0-9]+, got '100000'" -- "$QF" bench "$fx" --threads 100000
len=$(wc -c <"$WORK/err")
[[ $len -lt 200 ]] && ok "range messages are short ($len bytes)" || fail "range message of $len bytes: $(cat "$WORK/err")"
expect_exit 2 "--chunks: must be an integer >= 1" -- "$QF" imatrix "$fx" --text "$calib" -o "$WORK/x.imatrix" --chunks 0
expect_exit 2 "QF_THREADS must be an integer from 1 to" -- env QF_THREADS=lots "$QF" generate "$fx" -n 1
"$QF" inspect "$fx" -q >/dev/null && ok "-q after the subcommand" || fail "-q after the subcommand"

# ---- 3. outputs never destroy inputs or special files ----------------------
cp -r "$fx" "$WORK/fx"
before=$(sha256sum "$WORK/fx/model.safetensors")
expect_exit 5 "-o would overwrite an input of this run" -- "$QF" convert "$WORK/fx" --to gguf --type Q8_0 -o "$WORK/fx/model.safetensors" --force
ln -s "$WORK/fx/config.json" "$WORK/cfglink"
expect_exit 5 "would overwrite an input" -- "$QF" eval "$WORK/fx" --text "$evaltxt" --max-chunks 1 --json "$WORK/cfglink"
[[ "$(sha256sum "$WORK/fx/model.safetensors")" == "$before" ]] && ok "the input model is untouched" || fail "input changed"
"$QF" -q convert "$fx" --to gguf --type Q8_0 -o "$WORK/a.gguf" 2>/dev/null || fail "convert to a.gguf"
expect_exit 5 "-o already exists; pass --force to replace it" -- "$QF" convert "$fx" --to gguf --type Q8_0 -o "$WORK/a.gguf"
"$QF" -q convert "$fx" --to gguf --type Q8_0 -o "$WORK/a.gguf" --force 2>/dev/null && ok "convert --force replaces an output" || fail "convert --force"
expect_exit 5 "-o is a folder" -- "$QF" convert "$fx" --to gguf --type Q8_0 -o "$WORK" --force
"$QF" -q imatrix "$fx" --text "$calib" --chunks 1 -o "$WORK/m.imatrix" 2>/dev/null || fail "imatrix"
expect_exit 5 "-o already exists; pass --force" -- "$QF" imatrix "$fx" --text "$calib" --chunks 1 -o "$WORK/m.imatrix"
cp "$calib" "$WORK/calib.txt"
expect_exit 5 "would overwrite an input" -- "$QF" imatrix "$fx" --text "$WORK/calib.txt" --chunks 1 -o "$WORK/calib.txt" --force
cmp -s "$calib" "$WORK/calib.txt" && ok "imatrix left its text alone" || fail "imatrix changed its input text"
mkfifo "$WORK/fifo"
cat "$WORK/fifo" >"$WORK/fifo.out" &
reader=$!
"$QF" -q bench "$fx" -p 8 -n 2 --json "$WORK/fifo" >/dev/null
wait $reader
[[ -p "$WORK/fifo" ]] && $PY -c "import json,sys; json.load(open(sys.argv[1]))" "$WORK/fifo.out" \
  && ok "--json writes through a FIFO and leaves it a FIFO" || fail "fifo: $(ls -l "$WORK/fifo")"
echo old >"$WORK/target.json"
ln -s "$WORK/target.json" "$WORK/link.json"
"$QF" -q bench "$fx" -p 8 -n 2 --json "$WORK/link.json" >/dev/null
[[ -L "$WORK/link.json" ]] && grep -q prefill_tokens_per_s "$WORK/target.json" \
  && ok "--json follows a symbolic link and keeps it" || fail "symlink replaced: $(ls -l "$WORK/link.json")"
"$QF" -q bench "$fx" -p 8 -n 2 --json /dev/stdout >"$WORK/stdout.json"
$PY -c "import json,sys; json.load(open(sys.argv[1]))" "$WORK/stdout.json" 2>/dev/null && [[ -c /dev/stdout || -e /dev/stdout ]] \
  && ok "--json /dev/stdout" || fail "--json /dev/stdout: $(head -c 300 "$WORK/stdout.json")"
if [[ -w /dev/full ]]; then
  expect_exit 5 "--json|/dev/full.*(No space|write failed)" -- "$QF" -q bench "$fx" -p 8 -n 2 --json /dev/full
  expect_exit 5 "standard output: write failed" -- sh -c "exec \"$QF\" inspect \"$fx\" >/dev/full"
  # quantize prints before it commits: stdout that cannot be written leaves no output.
  expect_exit 5 "standard output: write failed.*was not written" -- \
    sh -c "exec \"$QF\" -q quantize \"$fx\" --recipe \"$SRC/recipes/w4a16-rtn.yaml\" -o \"$WORK/full-q\" --json >/dev/full"
  # (the finished layers stay in .full-q.resume for a --resume, as after any failure past the first layer)
  [[ ! -e $WORK/full-q && -z $(find "$WORK" -maxdepth 1 -name '.full-q.tmp.*') ]] \
    && ok "quantize --json >/dev/full: no output, no temporary" || fail "left after quantize >/dev/full: $(ls -a "$WORK")"
else
  echo "skip: /dev/full is not writable here"
fi

# ---- 4. interrupted runs clean up ------------------------------------------
# A GPTQ run long enough to be interrupted while its activations are spilled.
cat >"$WORK/slow.yaml" <<EOF
quant_stage:
  quant_modifiers:
    GPTQModifier:
      targets: [Linear]
      ignore: [lm_head]
      scheme: W4A16
calibration:
  dataset: $(realpath "$calib")
  num_samples: 256
  seq_len: 512
  seed: 0
EOF
# interrupt SIGNAL STATUS: starts the run, waits for its spill folder, sends the
# signal, and checks that nothing is left (but after KILL, which cannot be caught).
interrupt() {
  local sig="$1" want="$2" rc=0 seen=0
  rm -rf "$WORK/int" "$WORK"/.int.*
  "$QF" -q quantize "$fx" --recipe "$WORK/slow.yaml" -o "$WORK/int" --max-memory 1M >/dev/null 2>"$WORK/int.err" &
  local pid=$!
  for _ in $(seq 1200); do
    if compgen -G "$WORK/.int.spill.*" >/dev/null && compgen -G "$WORK/.int.tmp.*" >/dev/null; then seen=1; break; fi
    sleep 0.05
  done
  kill -s "$sig" "$pid" 2>/dev/null || true
  wait "$pid" || rc=$?
  if [[ $seen -ne 1 ]]; then
    fail "SIG$sig: the run never showed its temporaries (exit $rc: $(cat "$WORK/int.err"))"
  elif [[ $rc -ne $want ]]; then
    fail "SIG$sig: exit $rc, expected $want: $(cat "$WORK/int.err")"
  elif [[ $sig != KILL ]] && { compgen -G "$WORK/.int.*" >/dev/null || [[ -e "$WORK/int" ]]; }; then
    fail "SIG$sig left $(ls -d "$WORK"/.int.* "$WORK/int" 2>/dev/null)"
  else
    ok "SIG$sig: exit $rc, $([[ $sig == KILL ]] && echo "killed" || echo "temporaries and spilled activations removed"): $(cat "$WORK/int.err")"
  fi
}
interrupt INT 130
interrupt TERM 143
interrupt KILL 137
count_temporaries() { local n=0 f; for f in "$WORK"/.int.*; do [[ -e $f ]] && n=$((n + 1)); done; echo $n; }
left=$(count_temporaries)
[[ $left -ge 1 && ! -e "$WORK/int" ]] && ok "kill -9 leaves nothing under the final name ($left temporaries)" \
  || fail "after kill -9: $left temporaries, final name $(ls -d "$WORK/int" 2>/dev/null)"
"$QF" -q quantize "$fx" --recipe "$rec/w4-rtn.yaml" -o "$WORK/int" >/dev/null 2>&1 || fail "quantize after kill -9"
left=$(count_temporaries)
[[ $left -eq 0 && -f "$WORK/int/config.json" ]] && ok "the next run to the same output removed the stale temporaries" \
  || fail "stale temporaries remain: $(ls -d "$WORK"/.int.* 2>/dev/null)"

finish
