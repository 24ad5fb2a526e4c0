# `quantforge batch` on a real Slurm cluster: one node with 2 CPUs (munged,
# slurmctld and slurmd started here as root with a minimal slurm.conf, state
# and spool under a temporary folder, stopped by pid at the end). An array job
# of 3 tasks runs the example jobs file (with lighter calibration: 4 samples
# of 128 tokens instead of 16 of 256); each task takes its shard from
# SLURM_ARRAY_TASK_ID/COUNT. The union of their outputs must equal a serial
# run byte for byte, and each job must have run exactly once.
# Skips (exit 77) where the daemons cannot start: not root, Slurm or munge
# not installed, or the node never comes up.
source "$(dirname "$0")/lib.sh"
D="$SRC/tests/data"

skip() {
  echo "skipped: $*"
  exit 77
}
[[ $(id -u) -eq 0 ]] || skip "the Slurm test starts munged, slurmctld and slurmd as root"
for b in munged slurmctld slurmd sbatch squeue sinfo; do
  command -v "$b" >/dev/null || skip "$b is not installed (scripts/setup.sh installs slurmctld, slurmd, slurm-client and munge)"
done

T="$WORK/slurm"
mkdir -p "$T/state" "$T/spool"
chmod 755 "$WORK" "$T"
# The example's jobs, ids and shards; its recipes calibrate on fewer tokens.
light() { sed -e 's/num_samples: 16/num_samples: 4/' -e 's/seq_len: 256/seq_len: 128/' -e "s|\.\./text/|$D/text/|" "$D/recipes/$1" >"$WORK/$1"; }
light w4-gptq.yaml
light fp8.yaml
sed -e '/^output:/d' -e "s|\.\./recipes/|$WORK/|" -e "s|\.\./|$D/|g" "$D/batch/example.yaml" >"$WORK/example.yaml"
JOBS="$WORK/example.yaml"
pids=()
stop_daemons() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap 'stop_daemons; rm -rf "$WORK"' EXIT

free_port() { $PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
host=$(hostname -s)
head -c 1024 /dev/urandom >"$T/munge.key"
chmod 600 "$T/munge.key"
munged -F --force --socket="$T/munge.sock" --key-file="$T/munge.key" --pid-file="$T/munged.pid" \
  --log-file="$T/munged.log" --seed-file="$T/munge.seed" >"$T/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -S $T/munge.sock ]] && break; sleep 0.1; done
[[ -S $T/munge.sock ]] || skip "munged did not start: $(tail -3 "$T/munged.out")"

cat >"$T/slurm.conf" <<CONF
ClusterName=qftest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$T/munge.sock
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName=$host CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$T/slurm.conf"
slurmctld -D -f "$SLURM_CONF" >"$T/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" >"$T/slurmd.out" 2>&1 &
pids+=($!)
up=0
for _ in $(seq 150); do
  if sinfo -h -o '%T' 2>/dev/null | grep -Eq '^(idle|mixed|allocated)'; then up=1; break; fi
  sleep 0.2
done
((up)) || skip "the node did not come up: $(tail -3 "$T/slurmctld.log" 2>/dev/null) $(tail -3 "$T/slurmd.log" 2>/dev/null)"
ok "a one-node Slurm cluster is up ($(sinfo -h -o '%P %D %T %c'))"

# The array job: 3 tasks, each `quantforge batch` on its shard.
job=$(sbatch --parsable --array=0-2 --cpus-per-task=1 -o "$T/task-%a.log" \
  --wrap "'$QF' batch '$JOBS' -o '$T/out' --threads 1; echo \$? >'$T/rc-'\$SLURM_ARRAY_TASK_ID")
ok "submitted array job $job"
for _ in $(seq 1200); do
  [[ -z $(squeue -h -j "$job" 2>/dev/null) ]] && break
  sleep 0.5
done
[[ -z $(squeue -h -j "$job" 2>/dev/null) ]] || fail "the array job did not finish in 10 minutes"
for i in 0 1 2; do
  if [[ $(cat "$T/rc-$i" 2>/dev/null) == 0 ]] && grep -q "shard $i/3 (slurm)" "$T/task-$i.log"; then
    ok "task $i ran shard $i/3 and succeeded"
  else
    fail "task $i: rc $(cat "$T/rc-$i" 2>/dev/null || echo none): $(cat "$T/task-$i.log" 2>/dev/null)"
  fi
done
ran=$(cat "$T"/task-*.log | grep -c ": done in " || true)
[[ $ran -eq 4 ]] && ok "the 4 jobs ran once each across the tasks" || fail "$ran job runs across the tasks, expected 4"

# The same jobs in one process; the union of the shards must be identical.
"$QF" -q batch "$JOBS" -o "$WORK/serial" --threads 2 >/dev/null
for o in Q4_K_M.gguf Q8_0.gguf w4a16-gptq fp8; do
  if same_output "$WORK/serial/fixture-llama/$o" "$T/out/fixture-llama/$o"; then
    ok "$o: the sharded output equals the serial one"
  else
    fail "$o: the sharded output differs from the serial one"
  fi
done
$PY - "$T/out/batch-status.json" <<'PYEOF' && ok "batch-status.json: 4 done" || fail "batch-status.json"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["summary"]["done"] == 4 and s["summary"]["jobs"] == 4, s["summary"]
assert sorted({j["shard"] for j in s["jobs"]}) == ["0/3", "1/3", "2/3"], [j["shard"] for j in s["jobs"]]
PYEOF
stop_daemons
pids=()
ok "stopped the daemons"
finish
