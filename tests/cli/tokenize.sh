#!/usr/bin/env bash
# quantforge tokenize: llama2.c and GGUF vocabularies, --json, --no-bos, errors.
source "$(dirname "$0")/lib.sh"

shared="$SRC/../shared"
if [[ ! -d "$shared/models/stories260K" ]]; then
  echo "skipped: $shared/models/stories260K is absent"
  finish
  exit 0
fi
tok="$shared/models/stories260K/tok512.bin"
"$QF" tokenize "$tok" --text "Once upon a time" --json >"$WORK/a.json"
$PY - "$WORK/a.json" <<'PYEOF' && ok "llama2.c vocabulary, --json" || fail "llama2.c --json output"
import json, sys
j = json.load(open(sys.argv[1]))
assert set(j) == {"ids", "pieces"}, j.keys()
assert j["ids"][0] == 1 and len(j["ids"]) == len(j["pieces"]) > 2, j
assert "".join(j["pieces"][1:]).replace("\u2581", " ") == " Once upon a time", j["pieces"]
PYEOF
"$QF" tokenize "$tok" --text "Once upon a time" --no-bos --json | $PY -c "import json,sys; assert json.load(sys.stdin)['ids'][0] != 1" \
  && ok "--no-bos" || fail "--no-bos"
printf 'Hello world\n' >"$WORK/in.txt"
"$QF" tokenize "$shared/data/tokenizer-vectors/ggml-vocab-gpt-2.gguf" --file "$WORK/in.txt" --json >"$WORK/g.json"
$PY -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['ids'][:2]==[15496, 995], j" "$WORK/g.json" \
  && ok "GGUF vocabulary from --file" || fail "gpt-2 ids: $(cat "$WORK/g.json")"

expect_exit 2 "usage error" -- "$QF" tokenize "$tok" --text a --file "$WORK/in.txt"
head -c 100 "$tok" >"$WORK/trunc.bin"
expect_exit 3 "trunc.bin" -- "$QF" tokenize "$WORK/trunc.bin" --text hi
printf '{"model": ' >"$WORK/tokenizer.json"
expect_exit 3 "tokenizer.json" -- "$QF" tokenize "$WORK/tokenizer.json" --text hi
finish
