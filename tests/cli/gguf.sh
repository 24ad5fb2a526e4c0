#!/usr/bin/env bash
# convert --to gguf (presets, imatrix, output/embedding type overrides), the runtime on GGUF (eval, generate, bench), inspect, errors.
source "$(dirname "$0")/lib.sh"

fx="$SRC/tests/data/fixture-llama"
evaltxt="$SRC/tests/data/text/evaluation.txt"
calib="$SRC/tests/data/text/calibration.txt"

"$QF" convert "$fx" --to gguf --type Q4_K_M -o "$WORK/x.gguf" 2>"$WORK/conv.err" && ok "convert to Q4_K_M" \
  || fail "convert: $(cat "$WORK/conv.err")"
grep -q "bits per weight" "$WORK/conv.err" && ok "conversion summary on stderr" || fail "no summary: $(cat "$WORK/conv.err")"
"$QF" -q eval "$WORK/x.gguf" --text "$evaltxt" --max-chunks 6 --baseline "$fx" --json "$WORK/e.json" >/dev/null \
  && ok "eval x.gguf --baseline" || fail "eval gguf"
$PY - "$WORK/e.json" <<'PYEOF' && ok "Q4_K_M is close to the f16 model" || fail "Q4_K_M eval: $(cat "$WORK/e.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert 0 < j["kld"]["mean"] < 0.01 and abs(j["ppl_ratio"] - 1) < 0.03 and j["top1_agreement"] > 0.9, j
PYEOF
"$QF" -q generate "$WORK/x.gguf" --prompt "The President" -n 12 >"$WORK/g.txt" && grep -q "^The President" "$WORK/g.txt" \
  && ok "generate from GGUF" || fail "generate gguf: $(cat "$WORK/g.txt")"
"$QF" -q bench "$WORK/x.gguf" -p 32 -n 4 --json "$WORK/b.json" >/dev/null \
  && $PY -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['weight_format'].startswith('mixed') and j['decode_tokens_per_s']>0, j" "$WORK/b.json" \
  && ok "bench on GGUF" || fail "bench gguf: $(cat "$WORK/b.json")"
"$QF" inspect "$WORK/x.gguf" --json >"$WORK/i.json"
$PY - "$WORK/i.json" <<'PYEOF' && ok "inspect reads GGUF" || fail "inspect gguf: $(head -c 600 "$WORK/i.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["format"] == "gguf" and j["file_type"] == "Q4_K_M" and j["architecture"] == "llama", j["file_type"]
types = {t["name"]: t["type"] for t in j["tensors"]}
assert types["output.weight"] == "q6_K" and types["blk.0.attn_q.weight"] == "q4_K", types
assert 4.5 < j["bits_per_weight"] < 5.5, j["bits_per_weight"]
PYEOF

"$QF" -q imatrix "$fx" --text "$calib" --chunks 4 -o "$WORK/im.gguf" && ok "imatrix" || fail "imatrix"
"$QF" inspect "$WORK/im.gguf" --json | $PY -c "
import json, sys
j = json.load(sys.stdin)
m = j['metadata']
assert m['general.type'] == 'imatrix' and m['imatrix.chunk_count'] == 4 and m['imatrix.chunk_size'] == 512, m
names = {t['name'] for t in j['tensors']}
assert 'blk.0.attn_q.weight.in_sum2' in names and 'blk.3.ffn_down.weight.counts' in names, names
" && ok "imatrix file in llama.cpp's GGUF layout" || fail "imatrix layout"
"$QF" -q convert "$fx" --to gguf --type Q2_K --imatrix "$WORK/im.gguf" -o "$WORK/q2.gguf" && ok "convert with --imatrix" \
  || fail "convert --imatrix"
"$QF" inspect "$WORK/q2.gguf" --json | $PY -c "import json,sys; m=json.load(sys.stdin)['metadata']; assert m['quantize.imatrix.chunks_count']==4, m" \
  && ok "imatrix provenance recorded" || fail "no quantize.imatrix keys"

# llama-quantize's --output-tensor-type / --token-embedding-type.
"$QF" -q convert "$fx" --to gguf --type Q4_K_M --output-tensor-type f16 --token-embedding-type Q8_0 -o "$WORK/ov.gguf" \
  && "$QF" inspect "$WORK/ov.gguf" --json | $PY -c "
import json, sys
t = {x['name']: x['type'] for x in json.load(sys.stdin)['tensors']}
assert t['output.weight'] == 'f16' and t['token_embd.weight'] == 'q8_0' and t['blk.0.attn_q.weight'] == 'q4_K', t" \
  && ok "--output-tensor-type f16 --token-embedding-type Q8_0" || fail "type overrides"
expect_exit 2 "--output-tensor-type: unknown tensor type 'q4_K_M'" -- \
  "$QF" convert "$fx" --to gguf --type Q4_K_M --output-tensor-type q4_K_M -o "$WORK/y.gguf"
expect_exit 2 "apply to --to gguf" -- "$QF" convert "$fx" --to hf --output-tensor-type f16 -o "$WORK/h"
expect_exit 2 "unknown preset|Q4_K_M" -- "$QF" convert "$fx" --to gguf --type Q4_K_XL -o "$WORK/y.gguf"
[[ ! -e "$WORK/y.gguf" ]] && ok "no output after a failed conversion" || fail "y.gguf left behind"
expect_exit 2 "--imatrix applies to --to gguf" -- "$QF" convert "$fx" --to hf --imatrix "$WORK/im.gguf" -o "$WORK/h"
head -c 100000 "$WORK/x.gguf" >"$WORK/trunc.gguf"
expect_exit 3 "trunc.gguf" -- "$QF" eval "$WORK/trunc.gguf" --text "$evaltxt"
expect_exit 3 "trunc.gguf" -- "$QF" inspect "$WORK/trunc.gguf"
printf 'not an imatrix' >"$WORK/bad.dat"
expect_exit 3 "bad.dat" -- "$QF" convert "$fx" --to gguf --type Q4_K_M --imatrix "$WORK/bad.dat" -o "$WORK/z.gguf"

finish
