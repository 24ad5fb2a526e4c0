#!/usr/bin/env bash
# Mixture-of-experts end to end on the trained Mixtral-layout fixture: bench
# reports the active parameters; GPTQ beats RTN on KL divergence; every
# export format writes one entry per expert and reads back; GGUF stacks the
# experts and its imatrix keeps one row per expert; a calibration set that
# reaches only some experts still gives finite scales for every expert, with
# the fallback reported; AWQ and SmoothQuant fold their scales into the
# routers; eval and quantize --device host give the CPU's results within the
# dense path's bounds; what does not support MoE says so in one line.
source "$(dirname "$0")/lib.sh"

fx="$SRC/tests/data/fixture-mixtral"
rec="$SRC/tests/data/recipes"
calib="$SRC/tests/data/text/calibration.txt"
evaltxt="$SRC/tests/data/text/evaluation.txt"
if [[ ! -f "$fx/model.safetensors" ]]; then
  echo "FAIL: $fx is missing"
  exit 1
fi

# bench: total and active parameters (3 sparse layers, 6 of 8 experts idle per token).
"$QF" bench "$fx" -p 32 -n 8 --json "$WORK/bench.json" >"$WORK/bench.out" 2>&1 || fail "bench: $(cat "$WORK/bench.out")"
grep -q "2 of 8 experts" "$WORK/bench.out" && $PY - "$WORK/bench.json" <<'PYEOF' && ok "bench: active parameters" || fail "bench: $(cat "$WORK/bench.out")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["parameters"] - j["active_parameters"] == 3 * 6 * 3 * 256 * 256, j
assert j["decode_tokens_per_s"] > 0 and j["prefill_tokens_per_s"] > 0, j
PYEOF

kl() {  # kl MODEL -> mean KL divergence from the fixture over 8 chunks of 256 tokens
  "$QF" eval "$1" --baseline "$fx" --text "$evaltxt" --ctx 256 --max-chunks 8 --json "$WORK/kl.json" >/dev/null 2>"$WORK/kl.err" \
    || { echo "eval $1: $(cat "$WORK/kl.err")" >&2; return 1; }
  $PY -c 'import json, math, sys; j = json.load(open(sys.argv[1])); k = j["kld"]["mean"]; assert math.isfinite(k) and math.isfinite(j["ppl"]); print(k)' "$WORK/kl.json"
}

# GPTQ against round-to-nearest in the same W4 g128 scheme.
for r in w4a16-gptq w4a16-rtn; do
  "$QF" quantize "$fx" --recipe "$SRC/recipes/$r.yaml" -o "$WORK/$r" >"$WORK/$r.out" 2>"$WORK/$r.err" \
    || fail "quantize $r: $(cat "$WORK/$r.err")"
done
grep -Eq "^layer 1/3: calibration tokens per expert: 0:[0-9]+ 1:[0-9]+ .* 7:[0-9]+$" "$WORK/w4a16-gptq.err" \
  && ok "quantize reports the calibration tokens of every expert" || fail "no token counts: $(cat "$WORK/w4a16-gptq.err")"
k_gptq=$(kl "$WORK/w4a16-gptq") && k_rtn=$(kl "$WORK/w4a16-rtn") \
  && $PY -c "import sys; g, r = map(float, sys.argv[1:]); assert g < r, (g, r)" "$k_gptq" "$k_rtn" \
  && ok "KL: GPTQ $k_gptq < RTN $k_rtn" || fail "KL: GPTQ ${k_gptq:-?} RTN ${k_rtn:-?}"
$PY - "$WORK/w4a16-gptq" <<'PYEOF' && ok "compressed-tensors: one entry per expert, routers unquantized and ignored" || fail "layout of w4a16-gptq"
import json, struct, sys
d = sys.argv[1]
qc = json.load(open(d + "/config.json"))["quantization_config"]
assert qc["ignore"] == ["lm_head"] + [f"model.layers.{i}.block_sparse_moe.gate" for i in range(3)], qc["ignore"]
raw = open(d + "/model.safetensors", "rb").read()
h = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
for i in range(3):
    assert h[f"model.layers.{i}.block_sparse_moe.gate.weight"]["dtype"] == "F16"
    for e in range(8):
        for w in ("w1", "w2", "w3"):
            p = f"model.layers.{i}.block_sparse_moe.experts.{e}.{w}."
            assert h[p + "weight_packed"]["dtype"] == "I32" and p + "weight_scale" in h, p
PYEOF

# AWQ: the post-attention norm's scales fold into the router and every
# expert's gate/up, each expert's up -> down is searched on its own tokens.
# Its KL is below RTN's in the same W4 g128 scheme; where a layer's norm is
# scaled its router is too (scaled, never quantized).
"$QF" quantize "$fx" --recipe "$rec/w4-awq.yaml" --calib "$calib" -o "$WORK/awq" >"$WORK/awq.out" 2>"$WORK/awq.err" \
  || fail "quantize w4-awq: $(cat "$WORK/awq.err")"
n_searched=$(grep -c "expert [0-7] up_proj->down_proj: \(ratio\|no scaling\)" "$WORK/awq.err")
[[ $n_searched -eq 24 ]] && grep -q "post_attention_layernorm->router,experts' gate,up" "$WORK/awq.err" \
  && ok "AWQ searches the norm -> router/experts mapping and 24 experts' up -> down" \
  || fail "AWQ searches: $n_searched expert lines; $(head -c 2000 "$WORK/awq.err")"
k_awq=$(kl "$WORK/awq") && $PY -c "import sys; a, r = map(float, sys.argv[1:]); assert a < r, (a, r)" "$k_awq" "$k_rtn" \
  && ok "KL: AWQ $k_awq < RTN $k_rtn" || fail "KL: AWQ ${k_awq:-?} RTN ${k_rtn:-?}"
$PY - "$fx" "$WORK/awq" <<'PYEOF' && ok "AWQ: routers and norms written as scaled, routers unquantized" || fail "AWQ output routers"
import json, struct, sys
def tensors(d):
    raw = open(d + "/model.safetensors", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    return {k: (v["dtype"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
scaled = 0
for i in range(3):
    router, norm = f"model.layers.{i}.block_sparse_moe.gate.weight", f"model.layers.{i}.post_attention_layernorm.weight"
    for name in (router, norm):
        assert b[name][0] == "F16" and len(b[name][1]) == len(a[name][1]), name
    # A layer whose norm search kept s = 1 leaves both alone; one that scaled changes both.
    assert (b[router][1] != a[router][1]) == (b[norm][1] != a[norm][1]), f"layer {i}: router and norm disagree"
    scaled += b[norm][1] != a[norm][1]
assert scaled > 0, "no layer's norm -> router/experts fold was kept"
ig = json.load(open(sys.argv[2] + "/config.json"))["quantization_config"]["ignore"]
assert all(f"model.layers.{i}.block_sparse_moe.gate" in ig for i in range(3)), ig
PYEOF

# Every export format, read back by the runtime (AutoAWQ's layout from AWQ's
# own search; W8A8 with SmoothQuant folded into the routers and experts).
cp "$rec"/{fp8,nvfp4,nvfp4a16-modelopt,w4-gptq-gptqfmt,w8a8-rtn,w8a8-sq,w4asym-awq-awqfmt}.yaml "$WORK/"
k_gptqfmt=
for r in fp8 nvfp4 nvfp4a16-modelopt w4-gptq-gptqfmt w8a8-rtn w8a8-sq w4asym-awq-awqfmt; do
  "$QF" -q quantize "$fx" --recipe "$WORK/$r.yaml" --calib "$calib" -o "$WORK/$r" >/dev/null 2>"$WORK/$r.err" \
    && k=$(kl "$WORK/$r") && ok "$r: exported and read back, KL $k" || fail "$r: $(cat "$WORK/$r.err")"
  [[ $r == w4-gptq-gptqfmt ]] && k_gptqfmt=${k:-}
done

# A calibration set that reaches only some experts: one sample of two tokens
# (with BOS) routes to at most 4 of the 8 experts of each layer.
cat >"$WORK/few.yaml" <<EOF
quant_stage:
  quant_modifiers:
    GPTQModifier:
      targets: [Linear]
      ignore: [lm_head]
      scheme: W4A16
calibration:
  dataset: $calib
  num_samples: 1
  seq_len: 2
EOF
"$QF" quantize "$fx" --recipe "$WORK/few.yaml" -o "$WORK/few" >"$WORK/few.out" 2>"$WORK/few.err" \
  || fail "quantize with two calibration tokens: $(cat "$WORK/few.err")"
grep -q "experts.[0-9].w1: no calibration token reached this expert; quantized with round-to-nearest instead of GPTQ" "$WORK/few.err" \
  && grep -q "dampening raised tenfold" "$WORK/few.err" \
  && ok "experts without calibration tokens: round-to-nearest, reported" || fail "fallback not reported: $(cat "$WORK/few.err")"
cat >"$WORK/finite.py" <<'PYEOF'
# Every float tensor finite, and every expert's scales (weight_scale, input_scale, global scales) positive.
import json, struct, sys
import numpy as np
raw = open(sys.argv[1] + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
h.pop("__metadata__", None)
dt = {"F16": np.float16, "F32": np.float32}
scales = 0
for k, v in h.items():
    if v["dtype"] not in dt:
        continue
    a, b = v["data_offsets"]
    x = np.frombuffer(raw[8 + n + a:8 + n + b], dt[v["dtype"]]).astype(np.float32)
    assert np.isfinite(x).all(), k
    if ".experts." in k and "scale" in k:
        assert (x > 0).all(), k
        scales += 1
assert scales >= 3 * 8 * 3, scales
PYEOF
$PY "$WORK/finite.py" "$WORK/few" && ok "every expert's scales are finite and positive" || fail "scales of $WORK/few"
# Static input scales and NVFP4 global scales from the same two tokens.
for r in fp8 nvfp4; do
  sed -e 's/^  num_samples:.*/  num_samples: 1/' -e 's/^  seq_len:.*/  seq_len: 2/' "$rec/$r.yaml" >"$WORK/few-$r.yaml"
  "$QF" quantize "$fx" --recipe "$WORK/few-$r.yaml" --calib "$calib" -o "$WORK/few-$r" >/dev/null 2>"$WORK/few-$r.err" \
    && grep -q "no calibration token reached this expert (its input ranges are taken over every calibration token)" "$WORK/few-$r.err" \
    && $PY "$WORK/finite.py" "$WORK/few-$r" && k=$(kl "$WORK/few-$r") \
    && ok "$r from two calibration tokens: finite scales for every expert, KL $k" || fail "few-token $r: $(cat "$WORK/few-$r.err")"
done
# AWQ from the same two tokens: the experts they miss keep their up -> down unscaled.
sed -e 's/^  num_samples:.*/  num_samples: 1/' -e 's/^  seq_len:.*/  seq_len: 2/' "$rec/w4-awq.yaml" >"$WORK/few-awq.yaml"
"$QF" quantize "$fx" --recipe "$WORK/few-awq.yaml" --calib "$calib" -o "$WORK/few-awq" >/dev/null 2>"$WORK/few-awq.err" \
  && grep -q "expert [0-7] up_proj->down_proj: no calibration token reaches it, not scaled" "$WORK/few-awq.err" \
  && $PY "$WORK/finite.py" "$WORK/few-awq" && k=$(kl "$WORK/few-awq") \
  && ok "w4-awq from two calibration tokens: unreached experts reported, finite scales, KL $k" || fail "few-token w4-awq: $(cat "$WORK/few-awq.err")"
$PY - "$WORK/few/quantization_report.json" <<'PYEOF' && ok "the report gives every expert's calibration tokens and its fallback" || fail "report of $WORK/few"
import json, sys
lin = [l for l in json.load(open(sys.argv[1]))["linears"] if ".experts." in l["name"]]
assert len(lin) == 3 * 8 * 3, len(lin)
none = [l for l in lin if l["expert_calibration_tokens"] == 0]
assert none and all("round-to-nearest" in l["note"] for l in none), none[:2]
assert sum(l["expert_calibration_tokens"] for l in lin if l["name"].endswith(".w1")) == 3 * 2 * 2, lin
PYEOF
k=$(kl "$WORK/few") && ok "the checkpoint from two calibration tokens evaluates (KL $k)" || fail "eval of $WORK/few"

# Every token to every expert's statistics: 4 x 64 tokens, as many as the
# experts' input columns, so no expert is short of tokens.
sed -e 's/^  num_samples: 1$/  num_samples: 4/' -e 's/^  seq_len: 2$/  seq_len: 64\n  moe_calibrate_all_experts: true/' \
  "$WORK/few.yaml" >"$WORK/all.yaml"
"$QF" quantize "$fx" --recipe "$WORK/all.yaml" -o "$WORK/all" >/dev/null 2>"$WORK/all.err" \
  && grep -q "^layer 2/3: calibration tokens per expert (every token to every expert): 0:256 1:256 2:256 3:256 4:256 5:256 6:256 7:256$" "$WORK/all.err" \
  && ! grep -q "reached this expert" "$WORK/all.err" \
  && ok "moe_calibrate_all_experts: every expert sees all 256 tokens" || fail "all experts: $(cat "$WORK/all.err")"

# GGUF: stacked experts, routers in f32, llama.cpp's MoE keys; the imatrix
# keeps one row and one count per expert; both evaluate.
"$QF" imatrix "$fx" --text "$calib" --ctx 256 --chunks 8 -o "$WORK/imatrix.gguf" >/dev/null 2>"$WORK/im.err" || fail "imatrix: $(cat "$WORK/im.err")"
for t in Q4_K_M Q6_K; do
  "$QF" -q convert "$fx" --to gguf --type $t --imatrix "$WORK/imatrix.gguf" -o "$WORK/$t.gguf" >/dev/null 2>"$WORK/$t.err" \
    && k=$(kl "$WORK/$t.gguf") && ok "GGUF $t with the imatrix: KL $k" || fail "GGUF $t: $(cat "$WORK/$t.err")"
done
$PY - "$SRC" "$WORK/Q4_K_M.gguf" "$WORK/imatrix.gguf" <<'PYEOF' && ok "GGUF: stacked experts, router f32, MoE keys; imatrix per expert" || fail "GGUF layout"
import sys
sys.path.insert(0, sys.argv[1] + "/scripts/bench")
from gguf_tensor_diff import read_gguf
kv, t = read_gguf(sys.argv[2])
assert kv["llama.expert_count"] == 8 and kv["llama.expert_used_count"] == 2, kv
for i in range(3):
    assert t[f"blk.{i}.ffn_gate_inp.weight"][0] == 0, t[f"blk.{i}.ffn_gate_inp.weight"][:2]  # f32
    assert t[f"blk.{i}.ffn_down_exps.weight"][1] == [256, 256, 8], t[f"blk.{i}.ffn_down_exps.weight"][:2]
    assert f"blk.{i}.ffn_gate.weight" not in t
ikv, it = read_gguf(sys.argv[3])
for i in range(3):
    for part in ("gate", "up", "down"):
        s = it[f"blk.{i}.ffn_{part}_exps.weight.in_sum2"][1]
        c = it[f"blk.{i}.ffn_{part}_exps.weight.counts"][1]
        assert s == [256, 8] and c == [1, 8], (s, c)
PYEOF

# The device runtime (host build) runs the MoE fixture as the CPU does,
# within the dense path's bounds (tests/cli/device.sh): quantize --device
# host (GPTQ W4 in the GPTQ format, 16 x 256 calibration tokens: the layer
# pass routes on the device, each expert's Hessians come from its rows
# there) writes the CPU's checkpoint above up to rounding: at most 10% of
# the codes differ (measured 3.7%) and the KL divergence from the fixture is
# within 10% (measured 0.1%); eval scores the same perplexity (1e-4
# relative; measured 3e-7) on the f16 fixture and on that GPTQ export (its
# packed experts decoded on the device), KL within 1e-4.
"$QF" -q quantize "$fx" --recipe "$WORK/w4-gptq-gptqfmt.yaml" --calib "$calib" -o "$WORK/dev-host" --device host \
  >/dev/null 2>"$WORK/dev-host.err" || fail "quantize w4-gptq-gptqfmt on host: $(cat "$WORK/dev-host.err")"
$PY "$SRC/tests/cli/codes_differ.py" "$WORK/w4-gptq-gptqfmt/model.safetensors" "$WORK/dev-host/model.safetensors" qweight --require && ok "quantize --device host: the CPU's tensors, codes within the bound" || fail "quantize --device host: codes"
k_dhost=$(kl "$WORK/dev-host") \
  && $PY -c "import sys; c, h = map(float, sys.argv[1:]); assert c > 0 and abs(h - c) <= 0.10 * c + 1e-6, (c, h)" "$k_gptqfmt" "$k_dhost" \
  && ok "quantize --device host: KL $k_dhost (cpu $k_gptqfmt)" || fail "KL of the device checkpoint: ${k_dhost:-?} against ${k_gptqfmt:-?}"
for m in "$fx" "$WORK/w4-gptq-gptqfmt"; do
  base=()
  [[ $m == "$WORK/w4-gptq-gptqfmt" ]] && base=(--baseline "$fx")
  for d in cpu host; do
    "$QF" -q eval "$m" --text "$evaltxt" --ctx 128 --max-chunks 4 "${base[@]}" --device $d --json "$WORK/ev-$d.json" \
      >/dev/null 2>"$WORK/ev-$d.err" || fail "eval $(basename "$m") on $d: $(cat "$WORK/ev-$d.err")"
  done
  $PY - "$WORK/ev-cpu.json" "$WORK/ev-host.json" <<'PYEOF' && ok "eval --device host agrees with cpu on $(basename "$m")" \
    || fail "eval cpu/host on $(basename "$m")"
import json, sys
c, h = (json.load(open(p)) for p in sys.argv[1:3])
assert c["device"] == "cpu" and h["device"] == "host" and h["device_bytes"] > 0, (c["device"], h["device"])
assert c["valid"] and h["valid"] and c["tokens_scored"] == h["tokens_scored"] > 0
assert abs(h["ppl"] / c["ppl"] - 1) < 1e-4, (c["ppl"], h["ppl"])
if "kld" in c:
    assert abs(h["kld"]["mean"] - c["kld"]["mean"]) < 1e-4, (c["kld"], h["kld"])
    print(f"  KL cpu {c['kld']['mean']:.6f} host {h['kld']['mean']:.6f}")
print(f"  ppl cpu {c['ppl']:.6f} host {h['ppl']:.6f}")
PYEOF
done

# What does not run MoE models on the device yet says so, and writes nothing.
expect_exit 4 "does not collect the per-expert sums of a mixture-of-experts model's experts; use --device cpu" \
  -- "$QF" imatrix "$fx" --text "$calib" -o "$WORK/dev.gguf" --device host
expect_exit 4 "AWQ with --device host: the smoothing searches' device evaluation runs dense layers only" \
  -- "$QF" quantize "$fx" --recipe "$rec/w4-awq.yaml" --calib "$calib" -o "$WORK/dev-awq" --device host
[[ ! -e "$WORK/dev-awq" && ! -e "$WORK/dev.gguf" ]] && ok "nothing written for the refused device runs" || fail "output of a refused device run exists"

echo "$passes passed, $fails failed"
[[ $fails -eq 0 ]]
