#!/usr/bin/env bash
# LoRA adapters: `merge` checked against W + s B A computed independently
# (lora_merge_check.py, numpy) for LoRA, DoRA, rsLoRA with rank/alpha
# patterns and modules_to_save, and two adapters in order; merged and
# unmerged evaluation agree and beat the base on the adapter's own text;
# merged-then-GPTQ (16 x 256 calibration tokens) keeps the gain; convert --lora equals converting the
# merged folder; a GGUF adapter on a GGUF base runs like the PEFT adapter;
# bad requests fail with one line, their exit code and nothing written.
source "$(dirname "$0")/lib.sh"

fx="$SRC/tests/data/fixture-llama"
ad="$SRC/tests/data/lora-llama"
txt="$SRC/tests/data/text/adapter_eval.txt"
calib="$SRC/tests/data/text/calibration.txt"
check="$SRC/tests/cli/lora_merge_check.py"

merge_ok() {  # merge_ok NAME ADAPTER...
  local name="$1"; shift
  local args=()
  for a in "$@"; do args+=(--lora "$a"); done
  if "$QF" merge "$fx" "${args[@]}" -o "$WORK/$name" 2>"$WORK/$name.err" \
    && $PY "$check" "$fx" "$WORK/$name" "$@" >"$WORK/$name.check" 2>&1; then
    ok "merge $name: $(cat "$WORK/$name.check")"
  else
    fail "merge $name: $(cat "$WORK/$name.err" "$WORK/$name.check" 2>/dev/null)"
  fi
}
merge_ok lora "$ad/lora"
merge_ok dora "$ad/dora"
merge_ok rslora "$ad/rslora-patterns:0.5"
merge_ok two "$ad/lora" "$ad/dora:0.7"
cmp -s "$fx/tokenizer.json" "$WORK/lora/tokenizer.json" && cmp -s "$fx/config.json" "$WORK/lora/config.json" \
  && ok "merge copies config and tokenizer" || fail "merge did not copy the base's files"

ppl() { $PY -c "import json,sys; print(json.load(open(sys.argv[1]))['ppl'])" "$1"; }
ev() {  # ev NAME MODEL [flags...]
  local name="$1" model="$2"; shift 2
  "$QF" eval "$model" --text "$txt" --max-chunks 8 --json "$WORK/$name.json" "$@" >/dev/null 2>"$WORK/$name.eval.err" \
    || fail "eval $name: $(cat "$WORK/$name.eval.err")"
}
ev base "$fx"
ev auto "$fx" --lora "$ad/lora"
ev forward "$fx" --lora "$ad/lora" --lora-mode forward
ev merged "$WORK/lora"
$PY - "$WORK" <<'PYEOF' && ok "the adapter lowers perplexity on its text; --lora equals the merged folder; forward within f16 rounding" || fail "perplexities: $(cat "$WORK"/{base,auto,forward,merged}.json)"
import json, sys
w = sys.argv[1]
p = {k: json.load(open(f"{w}/{k}.json"))["ppl"] for k in ("base", "auto", "forward", "merged")}
print(p)
assert p["auto"] < 0.99 * p["base"], p            # the adapter helps on its own text
assert p["auto"] == p["merged"], p                # the same merge, in memory or on disk
assert abs(p["forward"] / p["merged"] - 1) < 1e-4, p  # unmerged: the f16 rounding of the merge only
assert json.load(open(f"{w}/auto.json"))["lora"]["adapters"][0]["scale"] == 1.0
PYEOF

# Merge, then quantize: GPTQ W4A16 of the merged model, evaluated against it.
"$QF" quantize "$fx" --lora "$ad/lora" --recipe "$SRC/tests/data/recipes/w4-gptq.yaml" --calib "$calib" -o "$WORK/q" \
  --eval "$txt" --eval-chunks 8 >"$WORK/q.out" 2>"$WORK/q.err" || fail "quantize --lora: $(cat "$WORK/q.err")"
ev q "$WORK/q"
$PY - "$WORK" <<'PYEOF' && ok "merged-then-GPTQ keeps most of the adapter's gain; the report names the adapter" || fail "quantize --lora: $(cat "$WORK/q.json")"
import json, sys
w = sys.argv[1]
p = {k: json.load(open(f"{w}/{k}.json"))["ppl"] for k in ("base", "merged", "q")}
print(p)
assert p["q"] < p["base"], p
assert (p["base"] - p["q"]) > 0.5 * (p["base"] - p["merged"]), p
r = json.load(open(f"{w}/q/quantization_report.json"))
assert r["model"]["lora"][0]["path"].endswith("lora-llama/lora"), r["model"]
assert r["evaluation"]["baseline"]["lora"]["mode"] == "merge", r["evaluation"]["baseline"]
PYEOF

# convert --lora merges as `merge` does: the same GGUF as converting the merged folder.
"$QF" convert "$fx" --lora "$ad/dora" --to gguf --type Q8_0 -o "$WORK/a.gguf" 2>/dev/null \
  && "$QF" convert "$WORK/dora" --to gguf --type Q8_0 -o "$WORK/b.gguf" 2>/dev/null \
  && ev ga "$WORK/a.gguf" && ev gb "$WORK/b.gguf" \
  && $PY -c "import json,sys; a,b=[json.load(open(f)) for f in sys.argv[1:]]; assert a['nll']==b['nll'], (a['nll'], b['nll'])" "$WORK/ga.json" "$WORK/gb.json" \
  && ok "convert --lora gives the model of converting the merged folder" || fail "convert --lora"

# A GGUF adapter on a GGUF base: what the PEFT adapter does on the HF base.
"$QF" convert "$fx" --to gguf --type F16 -o "$WORK/base.gguf" 2>/dev/null
"$QF" convert "$ad/lora" --to gguf-lora --base "$fx" -o "$WORK/lora.gguf" 2>"$WORK/gl.err" \
  && ev gl "$WORK/base.gguf" --lora "$WORK/lora.gguf" \
  && $PY -c "import json,sys; a,b=[json.load(open(f))['ppl'] for f in sys.argv[1:]]; assert abs(a/b-1)<1e-4, (a,b)" "$WORK/gl.json" "$WORK/forward.json" \
  && ok "gguf-lora on the GGUF base: $(cat "$WORK/gl.err")" || fail "gguf-lora: $(cat "$WORK/gl.err")"

"$QF" generate "$fx" --prompt "The ship" -n 12 >"$WORK/g0" 2>/dev/null
"$QF" generate "$fx" --prompt "The ship" -n 12 --lora "$ad/rslora-patterns" >"$WORK/g1" 2>/dev/null
"$QF" generate "$fx" --prompt "The ship" -n 12 --lora "$ad/rslora-patterns" --lora-mode forward >"$WORK/g2" 2>/dev/null
! cmp -s "$WORK/g0" "$WORK/g1" && cmp -s "$WORK/g1" "$WORK/g2" \
  && ok "generate --lora: merged and forward give the same text, not the base's" || fail "generate: $(cat "$WORK"/g0 "$WORK"/g1 "$WORK"/g2)"

# Bad requests: one line, the exit code, nothing written.
mkdir -p "$WORK/pickled" && echo '{"peft_type": "LORA"}' >"$WORK/pickled/adapter_config.json" && echo x >"$WORK/pickled/adapter_model.bin"
expect_exit 4 "pickled adapters are not read" -- "$QF" merge "$fx" --lora "$WORK/pickled" -o "$WORK/x1"
[[ ! -e "$WORK/x1" ]] || fail "merge left $WORK/x1"
expect_exit 2 "at least one --lora" -- "$QF" merge "$fx" -o "$WORK/x2"
expect_exit 6 "no such adapter folder" -- "$QF" eval "$fx" --text "$txt" --lora "$WORK/absent"
expect_exit 2 "expected auto, merge or forward" -- "$QF" eval "$fx" --text "$txt" --lora "$ad/lora" --lora-mode fused
expect_exit 4 "--to gguf-lora" -- "$QF" eval "$WORK/base.gguf" --text "$txt" --lora "$ad/lora"
expect_exit 4 "not merged into a GGUF model" -- "$QF" eval "$WORK/base.gguf" --text "$txt" --lora "$WORK/lora.gguf" --lora-mode merge
expect_exit 2 "needs --base" -- "$QF" convert "$ad/lora" --to gguf-lora -o "$WORK/x3.gguf"
expect_exit 4 "DoRA adapters have no llama.cpp adapter form" -- "$QF" convert "$ad/dora" --to gguf-lora --base "$fx" -o "$WORK/x4.gguf"
[[ ! -e "$WORK/x4.gguf" ]] || fail "gguf-lora left $WORK/x4.gguf"
expect_exit 3 "does not have as a Linear|do not select|not a Linear|shape" -- "$QF" merge "$SRC/tests/data/fixture-mixtral" --lora "$ad/lora" -o "$WORK/x5"
expect_exit 4 "quantized" -- "$QF" eval "$WORK/q" --text "$txt" --lora "$ad/lora" --lora-mode merge

echo "$passes passed, $fails failed"
[[ $fails -eq 0 ]]
