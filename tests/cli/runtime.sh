#!/usr/bin/env bash
# convert (llama2.c -> HF), generate, eval (modes, baseline, gate), bench, and their errors.
source "$(dirname "$0")/lib.sh"

fx="$SRC/tests/data/fixture-llama"
evaltxt="$SRC/tests/data/text/evaluation.txt"
shared="$SRC/../shared"
st="$shared/models/stories260K"

if [[ -d "$st" ]]; then
  "$QF" -q convert "$st/stories260K.bin" --tokenizer "$st/tok512.bin" --to hf -o "$WORK/s260" \
    && ok "convert stories260K to hf" || fail "convert stories260K"
  "$QF" -q generate "$WORK/s260" -n 256 >"$WORK/g1.txt"
  cmp -s "$WORK/g1.txt" "$st/greedy_bos_n256.txt" && ok "greedy from BOS matches llama2.c" || fail "greedy from BOS differs"
  "$QF" -q generate "$WORK/s260" --prompt "Once upon a time" -n 60 >"$WORK/g2.txt"
  cmp -s "$WORK/g2.txt" "$st/greedy_once_upon_a_time_n64.txt" && ok "greedy from a prompt matches llama2.c" \
    || fail "greedy from a prompt differs"
  "$QF" -q generate "$WORK/s260" --prompt "Once" -n 30 --temperature 0.8 --top-p 0.9 --seed 7 >"$WORK/s1.txt" 2>"$WORK/s1.err"
  "$QF" -q generate "$WORK/s260" --prompt "Once" -n 30 --temperature 0.8 --top-p 0.9 --seed 7 >"$WORK/s2.txt"
  if cmp -s "$WORK/s1.txt" "$WORK/s2.txt" && [[ ! -s "$WORK/s1.err" ]] && grep -q '^Once' "$WORK/s1.txt"; then
    ok "sampling is reproducible with --seed, stdout only"
  else
    fail "sampling: $(cat "$WORK/s1.txt" "$WORK/s2.txt" "$WORK/s1.err")"
  fi
  "$QF" -q eval "$WORK/s260" --text "$st/ts_fragment.txt" --ppl-mode lines --json "$WORK/st.json" >/dev/null
  $PY - "$WORK/st.json" <<'PYEOF' && ok "stories260K reference perplexity" || fail "stories260K perplexity: $(cat "$WORK/st.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["tokens_scored"] == 15507, j
assert abs(j["nll"] - 1.6854) < 5e-4 and abs(j["ppl"] - 5.395) < 5e-3, j
PYEOF
  expect_exit 2 "needs --tokenizer" -- "$QF" convert "$st/stories260K.bin" --to hf -o "$WORK/x"
  expect_exit 5 "already exists" -- "$QF" convert "$st/stories260K.bin" --tokenizer "$st/tok512.bin" --to hf -o "$WORK/s260"
  expect_exit 3 "vocabulary sizes differ|tokenizer differs" -- "$QF" eval "$fx" --text "$evaltxt" --baseline "$WORK/s260" --max-chunks 1
  head -c 1000 "$st/stories260K.bin" >"$WORK/trunc.bin"
  expect_exit 3 "trunc.bin: file has 1000 bytes" -- "$QF" convert "$WORK/trunc.bin" --tokenizer "$st/tok512.bin" --to hf -o "$WORK/t"
  [[ ! -e "$WORK/t" ]] && ok "no output after a failed conversion" || fail "output left after a failed conversion"
else
  echo "skipped the stories260K checks: $st is absent"
fi

# The fixture against itself: KL 0, delta 0, and the gate.
"$QF" -q eval "$fx" --text "$evaltxt" --max-chunks 3 --baseline "$fx" --max-kld 0 --max-ppl-delta 0 --json "$WORK/self.json" >"$WORK/self.txt" \
  && ok "eval --baseline against itself passes a zero gate" || fail "self gate: $(cat "$WORK/self.txt")"
$PY - "$WORK/self.json" <<'PYEOF' && ok "self comparison: KL 0, delta 0, full agreement" || fail "self json: $(cat "$WORK/self.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["kld"] == {"mean": 0.0, "p99": 0.0, "max": 0.0}, j
assert j["ppl_delta"] == 0.0 and j["ppl_ratio"] == 1.0 and j["top1_agreement"] == 1.0, j
assert j["mode"] == "chunks" and j["ctx"] == 512 and j["tokens_scored"] == 3 * 255, j
assert j["gate"]["passed"] is True and j["tokens_per_s"] > 0, j
PYEOF
grep -q "^gate       passed" "$WORK/self.txt" && ok "table says the gate passed" || fail "no gate line: $(cat "$WORK/self.txt")"
expect_exit 10 "gate failed: perplexity ratio 1.00000 exceeds --max-ppl-ratio 0.99000 by 0.01000" -- \
  "$QF" -q eval "$fx" --text "$evaltxt" --max-chunks 2 --baseline "$fx" --max-ppl-ratio 0.99 --json "$WORK/fail.json"
$PY -c "import json,sys; g=json.load(open(sys.argv[1]))['gate']; assert g['passed'] is False and len(g['failures'])==1, g" "$WORK/fail.json" \
  && ok "failed gate recorded in the JSON report" || fail "failed gate json"
expect_exit 2 "need --baseline" -- "$QF" eval "$fx" --text "$evaltxt" --max-kld 0.1
"$QF" -q eval "$fx" --text "$evaltxt" --ppl-mode windows --ctx 256 --max-chunks 2 --kv-dtype int8 --json "$WORK/w.json" >/dev/null
$PY -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['mode']=='windows' and j['tokens_scored']==2*255 and 30<j['ppl']<200, j" "$WORK/w.json" \
  && ok "windows mode with an int8 KV cache" || fail "windows: $(cat "$WORK/w.json")"

# Bad input.
mkdir -p "$WORK/notok"
cp "$fx/config.json" "$fx/model.safetensors" "$WORK/notok/"
expect_exit 6 "no tokenizer.json or tokenizer.model" -- "$QF" eval "$WORK/notok" --text "$evaltxt"
head -c 300 "$evaltxt" >"$WORK/short.txt"
expect_exit 3 "fewer than one chunk of 512" -- "$QF" eval "$fx" --text "$WORK/short.txt"
expect_exit 3 "context 4096 exceeds the model's maximum of 2048" -- "$QF" eval "$fx" --text "$evaltxt" --ctx 4096
expect_exit 2 "unknown --ppl-mode" -- "$QF" eval "$fx" --text "$evaltxt" --ppl-mode strided
expect_exit 3 "exceeds the model's context of 2048" -- "$QF" generate "$fx" --prompt hi -n 5000
expect_exit 2 "unknown KV-cache type" -- "$QF" bench "$fx" --kv-dtype q4

# bench
"$QF" -q bench "$fx" -p 64 -n 8 --batch 2 --kv-dtype f8 --json "$WORK/b.json" >"$WORK/b.txt" \
  && ok "bench runs" || fail "bench: $(cat "$WORK/b.txt")"
$PY - "$WORK/b.json" <<'PYEOF' && ok "bench report: rates, KV bytes, bandwidth bound" || fail "bench json: $(cat "$WORK/b.json")"
import json, sys
j = json.load(open(sys.argv[1]))
for k in ("prefill_tokens_per_s", "decode_tokens_per_s", "ttft_seconds", "read_bandwidth_bytes_per_s",
          "decode_bound_tokens_per_s", "peak_rss_bytes"):
    assert j[k] > 0, (k, j)
# the bound is batch * read bandwidth / bytes per step, and decode stays under it
assert abs(j["decode_bound_tokens_per_s"] - 2 * j["read_bandwidth_bytes_per_s"] / j["weight_bytes_per_step"]) < 1e-6 * j["decode_bound_tokens_per_s"], j
assert 0 < j["decode_fraction_of_bound"] <= 1.0, j
# 4 layers x (K + V) x 4 KV heads x 32 x 1 byte (f8)
assert j["kv_bytes_per_token"] == 4 * 2 * 128, j
assert j["kv_bytes_used"] == 2 * (64 + 8) * j["kv_bytes_per_token"], j
assert j["kv_bytes_reserved"] >= j["kv_bytes_used"], j
# every Linear (4.19M f16 parameters with lm_head) plus one embedding row and the norms
assert 8_388_608 < j["weight_bytes_per_step"] < 8_500_000, j
assert j["peak_rss_bytes"] < 200 << 20, j
PYEOF

finish
