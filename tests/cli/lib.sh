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

finish() {
  echo "$passes passed, $fails failed"
  [[ $fails -eq 0 ]]
}
