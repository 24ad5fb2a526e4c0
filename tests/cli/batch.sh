# quantforge batch: the example jobs file end to end; re-running skips every
# job; deleting one output re-runs only it; a changed gate re-runs only the
# evaluation; shards (--shard I/N, Slurm and Kubernetes variables) are
# disjoint and cover the list; concurrent runs over the same list run each
# job once; a failing job does not stop the others; SIGTERM records the
# running job as interrupted; kill -9 during a GPTQ job then --resume gives
# the same bytes; jobs-file errors name FILE:LINE:COL; outputs inside a
# model folder and contradictory shard flags are refused.
source "$(dirname "$0")/lib.sh"
JOBS="$SRC/tests/data/batch/example.yaml"
D="$SRC/tests/data"

# The example's jobs run with lighter calibration (4 samples of 128 tokens
# instead of 16 of 256): the same jobs, ids and checks at half the cost.
# The shipped file itself is parsed, planned and sliced in section 5.
light() { sed -e 's/num_samples: 16/num_samples: 4/' -e 's/seq_len: 256/seq_len: 128/' -e "s|\.\./text/|$D/text/|" "$D/recipes/$1" >"$WORK/$1"; }
light w4-gptq.yaml
light fp8.yaml
sed -e '/^output:/d' -e "s|\.\./recipes/|$WORK/|" -e "s|\.\./|$D/|g" "$JOBS" >"$WORK/example.yaml"
RUN="$WORK/example.yaml"

# 1. End to end.
"$QF" batch "$RUN" -o "$WORK/a" --threads 2 --json >"$WORK/a.json" 2>"$WORK/a.err" && ok "the example runs" || fail "the example failed: $(cat "$WORK/a.err")"
$PY - "$WORK/a.json" "$WORK/a/batch-status.json" <<'PYEOF' && ok "status: 4 jobs done with sizes and evaluations" || fail "status of the example"
import json, os, sys
s = json.load(open(sys.argv[1]))
assert s == json.load(open(sys.argv[2])), "--json differs from batch-status.json"
assert s["summary"] == {"jobs": 4, "done": 4, "failed": 0, "running": 0, "interrupted": 0, "pending": 0}, s["summary"]
ids = [j["id"] for j in s["jobs"]]
assert ids == ["fixture-llama/Q4_K_M", "fixture-llama/Q8_0", "fixture-llama/w4a16-gptq", "fixture-llama/fp8"], ids
for j in s["jobs"]:
    assert j["status"] == "done" and j["output_bytes"] > 0 and j["seconds"] > 0, j
    assert os.path.exists(j["output"]), j["output"]
    e = j["eval"]
    assert e["valid"] and e["ppl"] > 1 and 0 <= e["kld"]["mean"] < 0.5, e
PYEOF
for g in Q4_K_M Q8_0; do
  "$QF" -q convert "$D/fixture-llama" --to gguf --type $g -o "$WORK/$g.gguf"
  cmp -s "$WORK/$g.gguf" "$WORK/a/fixture-llama/$g.gguf" && ok "$g equals convert's output" || fail "$g differs from convert's output"
done
"$QF" -q quantize "$D/fixture-llama" --recipe "$WORK/w4-gptq.yaml" -o "$WORK/gptq" >/dev/null
same_output "$WORK/gptq" "$WORK/a/fixture-llama/w4a16-gptq" && ok "w4a16-gptq equals quantize's output" || fail "w4a16-gptq differs from quantize's output"

# 2. Re-running skips everything and touches nothing.
before=$(stat -c %Y "$WORK/a/fixture-llama/Q8_0.gguf")
"$QF" batch "$RUN" -o "$WORK/a" 2>"$WORK/b.err"
[[ $(grep -c "done before, skipped" "$WORK/b.err") -eq 4 ]] && ok "a re-run skips all 4 jobs" || fail "re-run: $(cat "$WORK/b.err")"
[[ $(stat -c %Y "$WORK/a/fixture-llama/Q8_0.gguf") == "$before" ]] && ok "outputs untouched" || fail "an output was rewritten"

# 3. Deleting one output re-runs only that job.
rm "$WORK/a/fixture-llama/Q8_0.gguf"
"$QF" batch "$RUN" -o "$WORK/a" 2>"$WORK/c.err"
if [[ $(grep -c ": done in " "$WORK/c.err") -eq 1 ]] && grep -q "Q8_0: done in" "$WORK/c.err" && grep -q "is missing" "$WORK/c.err"; then
  ok "deleting Q8_0.gguf re-runs only that job"
else
  fail "after deleting one output: $(cat "$WORK/c.err")"
fi
cmp -s "$WORK/Q8_0.gguf" "$WORK/a/fixture-llama/Q8_0.gguf" && ok "the re-run Q8_0 is identical" || fail "the re-run Q8_0 differs"
# A damaged folder output (a file removed) is re-run too.
rm "$WORK/a/fixture-llama/fp8/config.json"
"$QF" batch "$RUN" -o "$WORK/a" 2>"$WORK/c2.err"
[[ $(grep -c ": done in " "$WORK/c2.err") -eq 1 ]] && grep -q "fp8: done in" "$WORK/c2.err" && ok "a folder missing a file re-runs" || fail "damaged folder: $(cat "$WORK/c2.err")"

# 4. A changed gate re-evaluates without re-quantizing; a failing gate fails
#    only its job, the others still run, and the exit code is 10.
sed -e 's|max_kld: 0.5|max_kld: 0.003|' "$RUN" >"$WORK/gate.yaml"
rc=0
"$QF" batch "$WORK/gate.yaml" -o "$WORK/a" 2>"$WORK/d.err" || rc=$?
n_eval=$(grep -c "the output is up to date; evaluating only" "$WORK/d.err" || true)
if [[ $rc -eq 10 && $n_eval -eq 4 ]] && grep -q "fixture-llama/w4a16-gptq: failed: .*the gate failed" "$WORK/d.err" &&
   grep -q "fixture-llama/Q8_0: done in" "$WORK/d.err" && tail -1 "$WORK/d.err" | grep -q "job(s) failed"; then
  ok "a tighter gate: 4 evaluations only, the failing jobs recorded, exit 10"
else
  fail "tighter gate (rc $rc, $n_eval evaluations): $(cat "$WORK/d.err")"
fi
$PY - "$WORK/a/batch-status.json" <<'PYEOF' && ok "the failures are in batch-status.json" || fail "status after the gate failure"
import json, sys
s = json.load(open(sys.argv[1]))
st = {j["id"]: j for j in s["jobs"]}
assert st["fixture-llama/Q8_0"]["status"] == "done"
f = st["fixture-llama/w4a16-gptq"]
assert f["status"] == "failed" and f["exit_code"] == 10 and "max-kld" in f["error"] or "kld" in f["error"], f
assert s["summary"]["failed"] >= 1
PYEOF

# 5. Shards: --shard I/N slices are disjoint, cover the list and equal the
#    scheduler variables' slices.
for n in 1 2 3 5; do
  all=""
  for ((i = 0; i < n; i++)); do
    all+=$("$QF" batch "$JOBS" -o "$WORK/p" --shard "$i/$n" --dry-run --json | $PY -c 'import json,sys; print(" ".join(j["id"] for j in json.load(sys.stdin)["jobs"]))')" "
  done
  sorted=$(echo $all | tr ' ' '\n' | sort | tr '\n' ' ')
  [[ $sorted == "fixture-llama/Q4_K_M fixture-llama/Q8_0 fixture-llama/fp8 fixture-llama/w4a16-gptq " ]] &&
    ok "$n shards: disjoint and complete" || fail "$n shards give: $all"
done
a=$("$QF" batch "$JOBS" -o "$WORK/p" --shard 1/3 --dry-run --json)
b=$(SLURM_ARRAY_TASK_ID=6 SLURM_ARRAY_TASK_MIN=5 SLURM_ARRAY_TASK_COUNT=3 "$QF" batch "$JOBS" -o "$WORK/p" --dry-run --json)
c=$(JOB_COMPLETION_INDEX=1 "$QF" batch "$JOBS" -o "$WORK/p" --shards 3 --dry-run --json)
[[ $a == "$b" && $a == "$c" ]] && ok "Slurm (array 5-7) and Kubernetes variables pick the same slice as --shard 1/3" || fail "slices differ: $a / $b / $c"
expect_exit 2 "JOB_COMPLETION_INDEX is set .*give --shards N" -- env JOB_COMPLETION_INDEX=0 "$QF" batch "$JOBS" -o "$WORK/p" --dry-run
expect_exit 2 "shard 3 of 3 does not exist" -- "$QF" batch "$JOBS" -o "$WORK/p" --shard 3/3 --dry-run
expect_exit 2 "--shard: expected I/N" -- "$QF" batch "$JOBS" -o "$WORK/p" --shard 2 --dry-run
expect_exit 2 "--shard: expected I/N .*got ''" -- "$QF" batch "$JOBS" -o "$WORK/p" --shard "" --dry-run
expect_exit 2 "--shard 1/2 and --shards 5 do not go together" -- "$QF" batch "$JOBS" -o "$WORK/p" --shard 1/2 --shards 5 --dry-run
# An output folder inside a model folder (its outputs would change the
# model's files and every job's fingerprint) is refused before any work.
expect_exit 5 "fixture-llama/out, inside the model folder .*fixture-llama \(.*example.yaml:8:5\)" -- "$QF" batch "$JOBS" -o "$D/fixture-llama/out" --dry-run
"$QF" batch "$WORK/gate.yaml" -o "$WORK/a" --dry-run >"$WORK/dry.txt"
grep -q "fixture-llama/Q8_0 .* done" "$WORK/dry.txt" && grep -q "disk (est)" "$WORK/dry.txt" && ok "--dry-run shows estimates and what is done" || fail "dry run: $(cat "$WORK/dry.txt")"

# 6. Two processes over the same list at once (the slicing "changed" to
#    overlap completely): the job locks make each job run once.
"$QF" batch "$RUN" -o "$WORK/c" --threads 1 2>"$WORK/c1.err" &
p1=$!
"$QF" batch "$RUN" -o "$WORK/c" --threads 1 2>"$WORK/c2.err" &
p2=$!
wait $p1 && wait $p2 && ok "two concurrent runs succeed" || fail "concurrent runs: $(cat "$WORK/c1.err" "$WORK/c2.err")"
runs=$(cat "$WORK/c1.err" "$WORK/c2.err" | grep -c ": done in " || true)
[[ $runs -eq 4 ]] && ok "each job ran once across the two processes" || fail "$runs job runs across two processes"
for o in Q4_K_M.gguf Q8_0.gguf w4a16-gptq fp8; do
  same_output "$WORK/a/fixture-llama/$o" "$WORK/c/fixture-llama/$o" || fail "$o differs after concurrent runs"
done

# 7. SIGTERM during the GPTQ job: the job is recorded as interrupted before
#    the process ends. Then kill -9 during a --resume of it, and batch
#    --resume again: the job goes on from its last finished layer and the
#    output is the same.
cat >"$WORK/g.yaml" <<YAML
models:
  - path: $D/fixture-llama
targets:
  - recipe: $WORK/w4-gptq.yaml
YAML
ks="$WORK/k/fixture-llama/.w4-gptq.resume/state.json"
kill_at() {  # kill_at SIGNAL LAYERS ARGS...: runs batch ARGS, sends SIGNAL once LAYERS layers are saved; prints the exit status
  local sig=$1 n=$2 t=0 rc=0
  shift 2
  "$QF" batch "$@" >/dev/null 2>&1 &
  local kp=$!
  while ! grep -q "\"layers_done\": $n\$" "$ks" 2>/dev/null && ((t < 12000)) && kill -0 $kp 2>/dev/null; do sleep 0.01; t=$((t + 1)); done
  kill -s "$sig" $kp 2>/dev/null || true
  wait $kp 2>/dev/null || rc=$?
  echo $rc
}
rc=$(kill_at TERM 1 "$WORK/g.yaml" -o "$WORK/k" --threads 1)
$PY - "$WORK/k/batch-status.json" <<'PYEOF' && [[ $rc -eq 143 ]] && ok "SIGTERM: exit 143, batch-status.json says interrupted" || fail "after SIGTERM (exit $rc): $(cat "$WORK/k/batch-status.json")"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["summary"]["interrupted"] == 1 and s["summary"]["running"] == 0, s["summary"]
j = s["jobs"][0]
assert j["status"] == "interrupted" and "signal" in j["error"] and j["finished"], j
PYEOF
rc=$(kill_at KILL 2 "$WORK/g.yaml" -o "$WORK/k" --threads 1 --resume)
"$QF" batch "$WORK/g.yaml" -o "$WORK/k" --dry-run >"$WORK/k.dry"
grep -q "to run (interrupted)" "$WORK/k.dry" && ok "the killed job shows as interrupted" || fail "dry run after kill -9"
"$QF" batch "$WORK/g.yaml" -o "$WORK/k" --resume 2>"$WORK/k.err"
if grep -q "resuming: 2 finished layer" "$WORK/k.err" && same_output "$WORK/gptq" "$WORK/k/fixture-llama/w4-gptq"; then
  ok "batch --resume after kill -9: resumed at layer 2, same bytes"
else
  fail "batch --resume: $(cat "$WORK/k.err")"
fi

# 8. Disk: a job whose estimate does not fit is refused before any work.
printf 'reserve_disk: 100000T\nmodels:\n  - path: %s/fixture-llama\ntargets:\n  - gguf: Q8_0\n' "$D" >"$WORK/disk.yaml"
expect_exit 5 "not enough free disk for job fixture-llama/Q8_0" -- "$QF" -q batch "$WORK/disk.yaml" -o "$WORK/disk"
[[ ! -e $WORK/disk/fixture-llama/Q8_0.gguf ]] && ok "nothing written for the refused job" || fail "the refused job wrote its output"

# Models from a Hugging Face cache: an id and a glob (snapshots of symbolic
# links, as the hub writes them), named ORG--NAME.
for r in tiny tiny2; do
  snap="$WORK/hub/models--org--$r/snapshots/abc123"
  mkdir -p "$snap" "$WORK/hub/models--org--$r/refs"
  for f in "$D/fixture-llama"/*; do ln -s "$f" "$snap/"; done
  echo abc123 >"$WORK/hub/models--org--$r/refs/main"
done
printf 'models:\n  - glob: "org/tiny*"\n  - hf: org/tiny\n    name: again\ntargets:\n  - gguf: Q8_0\n' >"$WORK/hub.yaml"
HF_HUB_CACHE="$WORK/hub" "$QF" -q batch "$WORK/hub.yaml" -o "$WORK/h" --json >"$WORK/h.json" || fail "batch over the cache"
$PY - "$WORK/h.json" <<'PYEOF' && ok "cache glob and id: org--tiny, org--tiny2, again" || fail "cache models: $(cat "$WORK/h.json")"
import json, sys
s = json.load(open(sys.argv[1]))
assert [j["id"] for j in s["jobs"]] == ["org--tiny/Q8_0", "org--tiny2/Q8_0", "again/Q8_0"], s["jobs"]
assert s["summary"]["done"] == 3
PYEOF
HF_HUB_CACHE="$WORK/hub" "$QF" -q convert org/tiny2 --to gguf --type Q8_0 -o "$WORK/tiny2.gguf"
cmp -s "$WORK/h/org--tiny2/Q8_0.gguf" "$WORK/tiny2.gguf" && ok "the cache model's Q8_0 equals convert's" || fail "cache model output differs"
"$QF" inspect "$WORK/tiny2.gguf" --json >"$WORK/tiny2.json"
grep -q '"general.name": "tiny2"' "$WORK/tiny2.json" && ok "a cache snapshot's GGUF is named after its repo" || fail "general.name of a cache snapshot"

# A file at a job's output path that this batch did not write is never replaced.
mkdir -p "$WORK/foreign/fixture-llama"
echo precious >"$WORK/foreign/fixture-llama/Q8_0.gguf"
printf 'models:\n  - path: %s/fixture-llama\ntargets:\n  - gguf: Q8_0\n' "$D" >"$WORK/foreign.yaml"
expect_exit 5 "Q8_0.gguf: exists but was not written by this batch" -- "$QF" -q batch "$WORK/foreign.yaml" -o "$WORK/foreign"
[[ $(cat "$WORK/foreign/fixture-llama/Q8_0.gguf") == precious ]] && ok "the foreign file is untouched" || fail "the foreign file was replaced"

# 9. Jobs-file errors: one line with FILE:LINE:COL, the right exit code.
bad() {  # bad CODE PATTERN YAML
  printf '%b\n' "$3" >"$WORK/bad.yaml"
  expect_exit "$1" "$2" -- "$QF" batch "$WORK/bad.yaml" -o "$WORK/bad" --dry-run
}
M="  - path: $D/fixture-llama"
bad 3 "bad.yaml:1:1: unknown key 'modles' \(did you mean 'models'\?\)" 'modles: []\ntargets: [{gguf: Q8_0}]'
bad 3 "bad.yaml:3:18: targets\[0\].gguf: unknown quantization preset .Q9_K." "models:\n$M\ntargets: [{gguf: Q9_K}]"
bad 6 "bad.yaml:2:11: models\[0\]: /nonexistent/model: no such model folder" 'models:\n  - path: /nonexistent/model\ntargets: [{gguf: Q8_0}]'
bad 3 "bad.yaml:5:5: targets\[1\]: the name 'Q8_0' is used twice" "models:\n$M\ntargets:\n  - {gguf: Q8_0}\n  - {gguf: q8_0}"
bad 3 "bad.yaml:3:14: models\[0\].targets: no target is named 'Q8-0' \(did you mean 'Q8_0'\?\)" "models:\n$M\n    targets: [Q8-0]\ntargets: [{gguf: Q8_0}]"
bad 6 "bad.yaml:2:11: models\[0\].glob: 'nobody/\*' matches no model" 'models:\n  - glob: "nobody/*"\ntargets: [{gguf: Q8_0}]'
bad 3 "bad.yaml:3:11: targets\[0\]: give exactly one of" "models:\n$M\ntargets: [{gguf: Q8_0, recipe: x.yaml}]"
bad 3 "bad.yaml:1:1: models: expected a non-empty list" 'targets: [{gguf: Q8_0}]'
bad 3 "bad.yaml:3:1: YAML syntax error" 'models: [\n  :'
printf 'models:\n%s\ntargets: [{gguf: Q8_0}]\n' "$M" >"$WORK/noout.yaml"
expect_exit 2 "no output folder: give -o OUTDIR" -- "$QF" batch "$WORK/noout.yaml" --dry-run
# A recipe's own error keeps its own position.
printf 'quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      sheme: W4A16\n' >"$WORK/r.yaml"
bad 3 "r.yaml:4:7: .*unknown key 'sheme'" "models:\n$M\ntargets: [{recipe: $WORK/r.yaml}]"
finish
