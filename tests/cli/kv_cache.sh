#!/usr/bin/env bash
# KV-cache formats from the CLI: eval's cache KL against the same model with
# an f16 cache (bytes per token, KL by position), separate key/value types,
# the TurboQuant edge rule, bench's bytes and --kv-budget, kv-sweep's table
# and its choice under --max-kld, and the errors.
source "$(dirname "$0")/lib.sh"

fx="$SRC/tests/data/fixture-llama"
moe="$SRC/tests/data/fixture-mixtral"
evaltxt="$SRC/tests/data/text/evaluation.txt"

"$QF" -q eval "$fx" --text "$evaltxt" --baseline "$fx" --ppl-mode windows --ctx 1024 --max-chunks 1 \
  --kv-dtype q4_0 --kld-bucket 256 --json "$WORK/q4.json" >"$WORK/q4.txt" \
  && ok "eval --kv-dtype q4_0 against the f16 cache" || fail "eval q4_0: $(cat "$WORK/q4.txt")"
"$QF" -q eval "$fx" --text "$evaltxt" --baseline "$fx" --ppl-mode windows --ctx 1024 --max-chunks 1 \
  --kv-k-dtype q8_0 --kv-v-dtype q4_0 --json "$WORK/mixed.json" >/dev/null \
  && ok "eval with separate key and value types" || fail "eval mixed"
"$QF" -q eval "$fx" --text "$evaltxt" --baseline "$fx" --ppl-mode windows --ctx 1024 --max-chunks 1 \
  --kv-dtype turboquant_3bit_nc --json "$WORK/tq.json" >/dev/null \
  && "$QF" -q eval "$fx" --text "$evaltxt" --baseline "$fx" --ppl-mode windows --ctx 1024 --max-chunks 1 \
  --kv-dtype turboquant_3bit_nc --kv-f16-edge-layers 0 --json "$WORK/tq0.json" >/dev/null \
  && ok "eval with a TurboQuant preset" || fail "eval turboquant"
$PY - "$WORK" <<'PYEOF' && ok "eval reports: bytes per token, f16 baseline cache, KL by position, the edge rule" || fail "eval kv reports"
import json, os, sys
w = sys.argv[1]
q4 = json.load(open(os.path.join(w, "q4.json")))
# 4 layers x (K, V) x 4 KV heads x one 18-byte block of 32
assert q4["kv_dtype"] == "q4_0" and q4["kv_bytes_per_token"] == 4 * 2 * 4 * 18, q4
assert q4["baseline"]["kv_dtype"] == "f16", q4["baseline"]
assert q4["kld"]["mean"] > 0 and q4["valid"], q4
b = q4["kld_by_position"]
assert [x["from"] for x in b] == [0, 256, 512, 768] and sum(x["tokens"] for x in b) == q4["tokens_scored"], b
assert abs(sum(x["kld_mean"] * x["tokens"] for x in b) / q4["tokens_scored"] - q4["kld"]["mean"]) < 1e-9
m = json.load(open(os.path.join(w, "mixed.json")))
assert m["kv_dtype"] == "k=q8_0,v=q4_0" and m["kv_bytes_per_token"] == 4 * 4 * (34 + 18), m
assert 0 < m["kld"]["mean"] < q4["kld"]["mean"], (m["kld"], q4["kld"])
# vLLM's rule keeps min(2, 4 / 2) layers at each end: all four of the fixture's
tq, tq0 = json.load(open(os.path.join(w, "tq.json"))), json.load(open(os.path.join(w, "tq0.json")))
assert tq["kld"]["mean"] == 0 and tq["kv_bytes_per_token"] == 4 * 2 * 4 * 32 * 2, tq
# 3-bit keys (12 + 2 bytes) and values (12 + 4) for each of 4 heads and 4 layers
assert tq0["kv_dtype"] == "turboquant_3bit_nc+edge0" and tq0["kv_bytes_per_token"] == 4 * 4 * (14 + 16), tq0
assert tq0["kld"]["mean"] > 0, tq0
PYEOF

"$QF" -q eval "$moe" --text "$evaltxt" --baseline "$moe" --ppl-mode windows --ctx 512 --max-chunks 1 \
  --kv-dtype kivi2 --json "$WORK/moe.json" >/dev/null && $PY - "$WORK/moe.json" <<'PYEOF' \
  && ok "eval of the MoE fixture with a KIVI cache" || fail "moe kivi: $(cat "$WORK/moe.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["valid"] and j["kld"]["mean"] > 0 and j["kv_bytes_per_token"] == 3 * 2 * 2 * (8 + 4), j
PYEOF

"$QF" -q bench "$fx" -p 256 -n 8 --kv-dtype kivi2 --kv-budget 1GiB --json "$WORK/b.json" >"$WORK/b.txt" \
  && $PY - "$WORK/b.json" <<'PYEOF' && ok "bench: KIVI bytes from the allocation, tokens in a budget" || fail "bench: $(cat "$WORK/b.txt" "$WORK/b.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["kv_dtype"] == "kivi2" and j["kv_bytes_per_token"] == 4 * 2 * 4 * 12, j
window = 2 * 128 * 4 * 4 * 32 * 2  # 128 keys and 128 values in f16, every layer and head
assert j["kv_bytes_per_sequence"] == window, j
assert j["kv_budget"]["tokens"] == (2**30 - window) // j["kv_bytes_per_token"], j
# 264 positions: 9 blocks of 32, plus f16 copies (keys from 256, values from 136)
assert j["kv_bytes_reserved"] >= 9 * 32 * j["kv_bytes_per_token"], j
PYEOF

"$QF" -q kv-sweep "$fx" --text "$evaltxt" --ctx 512 --max-chunks 1 --types f16,q8_0,q5_1,q4_0,kivi2 \
  --max-kld 0.002 --decode-tokens 8 --json "$WORK/sweep.json" >"$WORK/sweep.txt" \
  && ok "kv-sweep runs" || fail "kv-sweep: $(cat "$WORK/sweep.txt")"
$PY - "$WORK/sweep.json" "$WORK/sweep.txt" <<'PYEOF' && ok "kv-sweep: table, smallest format within the bound, engine flags" || fail "kv-sweep json: $(cat "$WORK/sweep.txt")"
import json, sys
j = json.load(open(sys.argv[1]))
rows = {r["kv_dtype"]: r for r in j["rows"]}
assert list(rows) == ["f16", "q8_0", "q5_1", "q4_0", "kivi2"], list(rows)
assert rows["f16"]["kld"]["mean"] == 0 and j["f16_bytes_per_token"] == rows["f16"]["kv_bytes_per_token"]
assert all(r["valid"] and r["decode_tokens_per_s"] > 0 for r in j["rows"]), j["rows"]
ok = [r for r in j["rows"] if r["kld"]["mean"] <= 0.002]
want = min(ok, key=lambda r: (r["kv_bytes_per_token"], r["kld"]["mean"]))["kv_dtype"]
assert j["best"] == want, (j["best"], want)
assert rows["q4_0"]["llama_cpp"].startswith("-ctk q4_0 -ctv q4_0 -fa"), rows["q4_0"]
assert rows["f16"]["vllm"] == "--kv-cache-dtype auto"
text = open(sys.argv[2]).read()
assert "smallest within mean KLD 0.002: " + want in text, text
PYEOF

expect_exit 2 "unknown KV-cache type 'q4'" -- "$QF" eval "$fx" --text "$evaltxt" --kv-dtype q4
expect_exit 2 "rotate their keys themselves" -- "$QF" eval "$fx" --text "$evaltxt" --kv-dtype turboquant_k8v4 --kv-rotation hadamard
expect_exit 2 "applies to the TurboQuant presets" -- "$QF" bench "$fx" --kv-dtype q4_0 --kv-f16-edge-layers 0
expect_exit 2 "kv-budget" -- "$QF" bench "$fx" --kv-budget lots
expect_exit 2 "unknown KV-cache type 'q9'" -- "$QF" kv-sweep "$fx" --text "$evaltxt" --types f16,q9
expect_exit 4 "f16 KV cache" -- "$QF" eval "$fx" --text "$evaltxt" --device host --kv-dtype q4_0 --max-chunks 1
finish
