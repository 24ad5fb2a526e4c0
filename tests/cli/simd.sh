#!/usr/bin/env bash
# QF_SIMD: an unknown value is a usage error for every command; a level above
# the CPU's is clamped with one note; eval --json and bench report the level in use.
source "$(dirname "$0")/lib.sh"

fx="$SRC/tests/data/fixture-llama"
evaltxt="$SRC/tests/data/text/evaluation.txt"

for bad in avx3 "AVX2 " AVX2 " avx2" sse auto; do
  expect_exit 2 "^quantforge: usage error: QF_SIMD: unknown SIMD level '$bad' \(allowed: scalar\|avx2\|avx512\|amx\)$" \
    -- env QF_SIMD="$bad" "$QF" inspect "$fx"
done
expect_exit 2 "QF_SIMD: unknown SIMD level 'avx3'" -- env QF_SIMD=avx3 "$QF" bench "$fx" -p 8 -n 2
env QF_SIMD= "$QF" -q inspect "$fx" >/dev/null && ok "an empty QF_SIMD means the CPU's best" || fail "empty QF_SIMD"

# The best level this CPU has, by the rule of core/simd.cpp.
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
has() { [[ " $flags " == *" $1 "* ]]; }
best=scalar
if has avx2 && has fma && has f16c; then
  best=avx2
  if has avx512f && has avx512bw; then
    best=avx512
    # AMX: the tiles with bf16 dot products and AVX512-BF16 (Linux lists
    # amx_tile only when it saves the tile state).
    if has amx_tile && has amx_bf16 && has avx512_bf16; then best=amx; fi
  fi
fi
rank() { case "$1" in scalar) echo 0 ;; avx2) echo 1 ;; avx512) echo 2 ;; amx) echo 3 ;; esac; }

for want in scalar avx2 avx512 amx; do
  used=$want
  [[ $(rank "$want") -gt $(rank "$best") ]] && used=$best
  rc=0
  env QF_SIMD=$want "$QF" -q bench "$fx" -p 8 -n 2 --json "$WORK/b.json" >/dev/null 2>"$WORK/b.err" || rc=$?
  env QF_SIMD=$want "$QF" -q eval "$fx" --text "$evaltxt" --max-chunks 1 --ctx 32 --json "$WORK/e.json" >/dev/null 2>>"$WORK/b.err" || rc=$?
  if [[ $rc -ne 0 ]]; then
    fail "QF_SIMD=$want: exit $rc: $(cat "$WORK/b.err")"
    continue
  fi
  $PY - "$WORK/b.json" "$WORK/e.json" "$used" <<'PYEOF' && ok "QF_SIMD=$want: bench and eval report $used" \
    || fail "QF_SIMD=$want: reports $(cat "$WORK/b.json" "$WORK/e.json"), expected $used"
import json, sys
b, e, used = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
assert b["simd"] == used and e["simd"] == used, (b["simd"], e["simd"])
PYEOF
  notes=$(grep -c "QF_SIMD=$want but this CPU supports at most $best; using $best" "$WORK/b.err" || true)
  if [[ $want != "$used" ]]; then
    [[ $notes -eq 2 ]] && ok "QF_SIMD=$want above the CPU: one note per command" || fail "QF_SIMD=$want notes: $(cat "$WORK/b.err")"
  else
    [[ ! -s "$WORK/b.err" ]] && ok "QF_SIMD=$want: nothing on stderr" || fail "QF_SIMD=$want stderr: $(cat "$WORK/b.err")"
  fi
done

finish
