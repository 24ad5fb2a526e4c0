# Helpers for the CLI tests: sourced, not run. $QF is the binary, $SRC the source tree.
set -euo pipefail
QF="$1"
SRC="$2"
PY=/usr/bin/python3
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
fails=0
passes=0

ok() { passes=$((passes + 1)); echo "ok: $*"; }
fail() { fails=$((fails + 1)); echo "FAIL: $*"; }

# expect_exit CODE PATTERN -- cmd...: runs cmd, checks the exit code, that stderr
# is exactly one line, and that it matches PATTERN (grep -E).
expect_exit() {
  local code="$1" pattern="$2"
  shift 3
  local rc=0
  "$@" >"$WORK/out" 2>"$WORK/err" || rc=$?
  local lines
  lines=$(wc -l <"$WORK/err")
  if [[ $rc -ne $code ]]; then
    fail "$* exited $rc, expected $code; stderr: $(cat "$WORK/err")"
  elif [[ $lines -ne 1 ]]; then
    fail "$* printed $lines lines on stderr, expected one: $(cat "$WORK/err")"
  elif ! grep -Eq -- "$pattern" "$WORK/err"; then
    fail "$* stderr does not match /$pattern/: $(cat "$WORK/err")"
  else
    ok "$* -> exit $rc: $(cat "$WORK/err")"
  fi
}

# same_output A B: two outputs are the same. GGUF files: byte-identical.
# Quantize folders: the same files, byte-identical, except that the report
# (and the manifest's line for it) may differ in times (the timing section
# too), the measured memory, the command line and resumed_layers.
same_output() {
  $PY - "$1" "$2" <<'PYEOF'
import json, os, sys
a, b = sys.argv[1], sys.argv[2]
if os.path.isfile(a) or os.path.isfile(b):
    assert open(a, "rb").read() == open(b, "rb").read(), f"{a} and {b} differ"
    sys.exit(0)
fa, fb = sorted(os.listdir(a)), sorted(os.listdir(b))
assert fa == fb, f"files differ: {fa} vs {fb}"
volatile = {"seconds", "peak_rss_bytes", "measured_peak_rss_bytes", "timing", "invocation", "resumed_layers"}
def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if k not in volatile}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x
for f in fa:
    da, db = open(os.path.join(a, f), "rb").read(), open(os.path.join(b, f), "rb").read()
    if f == "quantization_report.json":
        assert strip(json.loads(da)) == strip(json.loads(db)), "the reports differ beyond times"
    elif f == "quantforge_manifest.json":
        ma = [e for e in json.loads(da)["files"] if e["path"] != "quantization_report.json"]
        mb = [e for e in json.loads(db)["files"] if e["path"] != "quantization_report.json"]
        assert ma == mb, "the manifests differ"
    else:
        assert da == db, f"{f} differs"
PYEOF
}

finish() {
  echo "$passes passed, $fails failed"
  [[ $fails -eq 0 ]]
}
