#!/usr/bin/env bash
# quantforge inspect: sharded fp16 checkpoint, HF cache layouts, JSON output, error lines.
source "$(dirname "$0")/lib.sh"

$PY "$SRC/tests/tools/make_checkpoint.py" "$WORK/sharded" --shards 3 >/dev/null
"$QF" inspect "$WORK/sharded" >"$WORK/table"
# 256x64 embedding + lm_head, 2 layers of 36,992, final norm 64
grep -q "parameters:   106.8K" "$WORK/table" && ok "parameter count" || fail "parameter count: $(grep parameters "$WORK/table")"
grep -q "3 file(s)" "$WORK/table" && ok "three shards listed" || fail "shards: $(grep weights "$WORK/table")"
grep -Eq "^layer 1 " "$WORK/table" && ok "per-layer table" || fail "no layer 1 section"
grep -Eq "model.layers.1.mlp.down_proj.weight +\[64, 128\] +f16 +16384" "$WORK/table" && ok "tensor row" || fail "tensor row missing"
grep -Eq "^  lm_head.weight" "$WORK/table" && ok "lm_head outside the layers" || fail "lm_head row"

"$QF" inspect "$WORK/sharded" --json >"$WORK/info.json"
$PY - "$WORK/info.json" <<'PYEOF' && ok "--json is valid and complete" || fail "--json content"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["architecture"] == "llama" and j["parameters"] == 106816, j["parameters"]
assert j["config"]["num_key_value_heads"] == 2 and j["config"]["head_dim"] == 16
assert len(j["files"]) == 3 and len(j["layers"]) == 2
assert j["dtypes"] == {"f16": 106816}
assert j["total_bytes"] == 2 * 106816
PYEOF

$PY "$SRC/tests/tools/make_checkpoint.py" "$WORK/hub" --hf-cache acme/tiny-llama --dtype BF16 >/dev/null
"$QF" inspect "$WORK/hub/models--acme--tiny-llama" >"$WORK/cache_table"
grep -q "Hugging Face cache, acme/tiny-llama @ " "$WORK/cache_table" && ok "cache repo folder" || fail "cache repo folder: $(head -3 "$WORK/cache_table")"
HF_HUB_CACHE="$WORK/hub" "$QF" inspect acme/tiny-llama --json >"$WORK/cache.json"
$PY -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['source']['repo_id']=='acme/tiny-llama' and j['dtypes']=={'bf16':106816}" "$WORK/cache.json" \
  && ok "ORG/NAME through HF_HUB_CACHE" || fail "ORG/NAME lookup"
snap=$(ls -d "$WORK"/hub/models--acme--tiny-llama/snapshots/*)
"$QF" inspect "$snap" >"$WORK/snap.txt" && grep -q "acme/tiny-llama" "$WORK/snap.txt" && ok "snapshot folder" || fail "snapshot folder"

# Errors: one line naming the file and the problem, documented exit codes.
cp -r "$WORK/sharded" "$WORK/bad"
head -c 100 "$WORK/sharded/model-00002-of-00003.safetensors" >"$WORK/bad/model-00002-of-00003.safetensors"
expect_exit 3 "model-00002-of-00003.safetensors" -- "$QF" inspect "$WORK/bad"
cp -r "$WORK/sharded" "$WORK/gpt2"
sed -i 's/"model_type": "llama"/"model_type": "gpt2"/' "$WORK/gpt2/config.json"
expect_exit 4 "config.json: unsupported architecture 'gpt2'.*supported: llama" -- "$QF" inspect "$WORK/gpt2"
expect_exit 6 "no-such-model" -- "$QF" inspect "$WORK/no-such-model"
expect_exit 2 "usage error" -- "$QF" inspect
expect_exit 2 "usage error" -- "$QF" inspect "$WORK/sharded" --no-such-flag
finish
