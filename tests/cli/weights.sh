#!/usr/bin/env bash
# QF_WEIGHTS: the runtime reads weights into memory or maps them; both give
# the same results, bench reports which, and an unknown value is a usage error.
source "$(dirname "$0")/lib.sh"

fx="$SRC/tests/data/fixture-llama"
evaltxt="$SRC/tests/data/text/evaluation.txt"

for bad in mmap Memory "map " none; do
  expect_exit 2 "^quantforge: usage error: QF_WEIGHTS: unknown value '$bad' \(allowed: auto\|memory\|map\)$" \
    -- env QF_WEIGHTS="$bad" "$QF" bench "$fx" -p 8 -n 2
done
expect_exit 2 "QF_WEIGHTS: unknown value 'x'" -- env QF_WEIGHTS=x "$QF" eval "$fx" --text "$evaltxt" --max-chunks 1 --ctx 32

"$QF" -q convert "$fx" --to gguf --type Q4_K_M -o "$WORK/x.gguf" && ok "convert to Q4_K_M" || fail "convert to Q4_K_M"

# The fixture is a few MiB, so the default (auto) reads it into memory
# wherever /proc/meminfo reports the available memory.
default=map
grep -q '^MemAvailable:' /proc/meminfo 2>/dev/null && default=memory
for model in "$fx" "$WORK/x.gguf"; do
  name=$(basename "$model")
  for w in memory map ""; do
    rc=0
    env QF_WEIGHTS="$w" "$QF" -q bench "$model" -p 8 -n 2 --json "$WORK/b-$w.json" >"$WORK/b-$w.txt" 2>"$WORK/err" || rc=$?
    env QF_WEIGHTS="$w" "$QF" -q eval "$model" --text "$evaltxt" --max-chunks 2 --ctx 64 --json "$WORK/e-$w.json" \
      >/dev/null 2>>"$WORK/err" || rc=$?
    if [[ $rc -ne 0 ]]; then
      fail "$name QF_WEIGHTS=$w: exit $rc: $(cat "$WORK/err")"
      continue
    fi
    want=${w:-$default}
    $PY - "$WORK/b-$w.json" "$want" <<'PYEOF' && ok "$name QF_WEIGHTS=${w:-(unset)}: bench reports weights '$want'" \
      || fail "$name QF_WEIGHTS=${w:-(unset)}: bench reports $(grep weights "$WORK/b-$w.json"), expected $want"
import json, sys
assert json.load(open(sys.argv[1]))["weights"] == sys.argv[2]
PYEOF
    if [[ $want == memory ]]; then line="read into memory"; else line="mapped from the file"; fi
    grep -q "^weights  *$line" "$WORK/b-$w.txt" && ok "$name: bench prints '$line'" \
      || fail "$name: bench output lacks 'weights $line': $(cat "$WORK/b-$w.txt")"
  done
  # Same bytes, same kernels: the perplexity must be identical, not close.
  $PY - "$WORK/e-memory.json" "$WORK/e-map.json" <<'PYEOF' && ok "$name: eval identical in memory and mapped" \
    || fail "$name: eval differs between QF_WEIGHTS=memory and map"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert a["tokens_scored"] > 0 and a["tokens_scored"] == b["tokens_scored"], (a["tokens_scored"], b["tokens_scored"])
assert a["nll"] == b["nll"] and a["ppl"] == b["ppl"], (a["ppl"], b["ppl"])
PYEOF
done

finish
