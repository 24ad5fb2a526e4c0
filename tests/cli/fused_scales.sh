#!/usr/bin/env bash
# NVFP4 exports decoded as vLLM decodes them: vLLM fuses q/k/v and gate/up and
# keeps one global scale per fused Linear (scripts/bench/vllm_fused_load.py);
# our exports already have one per set, so that load changes no perplexity.
# Also: a partly NVFP4 set is refused; modelopt FP8 KV scales are >= 1.
source "$(dirname "$0")/lib.sh"

fx="$SRC/tests/data/fixture-llama"
rec="$SRC/tests/data/recipes"
calib="$SRC/tests/data/text/calibration.txt"
evaltxt="$SRC/tests/data/text/evaluation.txt"
sim="$SRC/scripts/bench/vllm_fused_load.py"

for r in nvfp4 nvfp4-modelopt; do
  "$QF" -q quantize "$fx" --recipe "$rec/$r.yaml" --calib "$calib" -o "$WORK/$r" >/dev/null 2>"$WORK/$r.err" \
    && ok "quantize $r" || fail "$r: $(cat "$WORK/$r.err")"
  $PY "$sim" --check "$WORK/$r" >"$WORK/$r.check" \
    && ok "$r: one weight and one input global scale per fused set" || fail "$r: differing scales: $(cat "$WORK/$r.check")"
  $PY "$sim" "$WORK/$r" "$WORK/$r-vllm" >/dev/null && ok "$r: vLLM's fused load written" || fail "$r: vllm_fused_load.py"
  "$QF" -q eval "$WORK/$r" --text "$evaltxt" --max-chunks 2 --json "$WORK/$r.json" >/dev/null
  "$QF" -q eval "$WORK/$r-vllm" --text "$evaltxt" --max-chunks 2 --json "$WORK/$r-vllm.json" >/dev/null
  $PY - "$WORK/$r.json" "$WORK/$r-vllm.json" <<'PYEOF' && ok "$r: same perplexity under vLLM's fused load" || fail "$r: perplexity changed"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
print(a["ppl"], b["ppl"])
assert a["ppl"] == b["ppl"], (a["ppl"], b["ppl"])
PYEOF
done

# The check can fail: a set whose parts differ is reported (exit 1).
$PY - "$WORK/nvfp4" "$WORK/broken" <<'PYEOF'
import json, os, shutil, struct, sys
src, dst = sys.argv[1:]
shutil.copytree(src, dst)
path = os.path.join(dst, "model.safetensors")
raw = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
info = json.loads(raw[8:8 + n])["model.layers.1.self_attn.k_proj.weight_global_scale"]
off = 8 + n + info["data_offsets"][0]
raw[off:off + 4] = struct.pack("<f", struct.unpack("<f", raw[off:off + 4])[0] * 2)
open(path, "wb").write(raw)
PYEOF
rc=0
$PY "$sim" --check "$WORK/broken" >"$WORK/broken.check" || rc=$?
[[ $rc -eq 1 ]] && grep -q "^layer 1 q_proj/k_proj/v_proj weight_global_scale" "$WORK/broken.check" \
  && ok "a differing global scale is reported" || fail "broken: rc $rc: $(cat "$WORK/broken.check")"

cat >"$WORK/partial.yaml" <<'YEOF'
quant_stage:
  quant_modifiers:
    QuantizationModifier: {targets: [Linear], ignore: [lm_head, 're:.*v_proj$'], scheme: NVFP4A16}
YEOF
expect_exit 4 "self_attn: q_proj, k_proj are NVFP4 but v_proj is not" -- "$QF" quantize "$fx" --recipe "$WORK/partial.yaml" -o "$WORK/p"

"$QF" -q quantize "$fx" --recipe "$rec/fp8-modelopt.yaml" --calib "$calib" -o "$WORK/fp8mo" >/dev/null 2>"$WORK/fp8mo.err" \
  || fail "fp8-modelopt: $(cat "$WORK/fp8mo.err")"
$PY - "$WORK/fp8mo" <<'PYEOF' && ok "modelopt FP8 KV scales are max(amax / 448, 1)" || fail "modelopt KV scales"
import json, os, struct, sys
d = sys.argv[1]
raw = open(os.path.join(d, "model.safetensors"), "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
for li in range(4):
    for t in ("k_proj.k_scale", "v_proj.v_scale"):
        info = h[f"model.layers.{li}.self_attn.{t}"]
        v = struct.unpack("<f", raw[8 + n + info["data_offsets"][0]:][:4])[0]
        assert v >= 1.0, (li, t, v)  # the fixture's |K|, |V| are far below 448: exactly 1
        assert v == 1.0, (li, t, v)
PYEOF
finish
