#!/usr/bin/env bash
# bitsandbytes 4-bit export (NF4, FP4, with and without double quantization):
# the tensors, dtypes, shapes and quant_state JSON transformers writes; the
# codes and absmax recomputed from the f16 model by a numpy version of
# bitsandbytes' CUDA kernel rule (its threshold constants); the decoded weights within the
# format's bound; inspect; eval against the f16 model under a KL gate; a bad
# recipe key fails with one line and writes nothing.
source "$(dirname "$0")/lib.sh"

fx="$SRC/tests/data/fixture-llama"
evaltxt="$SRC/tests/data/text/evaluation.txt"

mk() {  # mk NAME SCHEME DOUBLE_QUANT
  cat >"$WORK/$1.yaml" <<YEOF
quant_stage:
  quant_modifiers:
    QuantizationModifier:
      targets: [Linear]
      ignore: [lm_head]
      scheme: $2
export:
  format: bitsandbytes
  double_quant: $3
YEOF
}
mk nf4 NF4 false
mk nf4dq NF4 true
mk fp4 FP4 false
mk fp4dq FP4 true

for v in nf4 nf4dq fp4 fp4dq; do
  "$QF" -q quantize "$fx" --recipe "$WORK/$v.yaml" -o "$WORK/$v" >/dev/null 2>"$WORK/$v.err" \
    && ok "quantize $v (no calibration data)" || fail "quantize $v: $(cat "$WORK/$v.err")"
  $PY - "$WORK/$v" "$fx" "$v" <<'PYEOF' && ok "$v: layout, codes and absmax match bitsandbytes' rule" || fail "$v layout"
import json, os, struct, sys
import numpy as np
d, fx, v = sys.argv[1:4]
fp4, dq = v.startswith("fp4"), v.endswith("dq")

def load(folder):
    raw = open(os.path.join(folder, "model.safetensors"), "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    h.pop("__metadata__", None)
    dt = {"F16": np.float16, "F32": np.float32, "U8": np.uint8, "BF16": np.uint16}
    out = {}
    for k, e in h.items():
        b, en = e["data_offsets"]
        out[k] = (e["dtype"], e["shape"], np.frombuffer(raw[8 + n + b:8 + n + en], dtype=dt[e["dtype"]]).reshape(e["shape"]))
    return out

q, ref = load(d), load(fx)
qc = json.load(open(os.path.join(d, "config.json")))["quantization_config"]
want = {"_load_in_4bit": True, "_load_in_8bit": False, "bnb_4bit_compute_dtype": "float32", "bnb_4bit_quant_storage": "uint8",
        "bnb_4bit_quant_type": "fp4" if fp4 else "nf4", "bnb_4bit_use_double_quant": dq,
        "llm_int8_enable_fp32_cpu_offload": False, "llm_int8_has_fp16_weight": False, "llm_int8_skip_modules": ["lm_head"],
        "llm_int8_threshold": 6.0, "load_in_4bit": True, "load_in_8bit": False, "quant_method": "bitsandbytes"}
assert qc == want, qc
assert q["lm_head.weight"][0] == "F16", "lm_head stays unquantized"

NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0], dtype=np.float32)
# get_4bit_type("fp4"): the Python list has the integer -0 at code 8, stored as +0.0.
FP4 = (np.array([0, 0.0625, 8, 12, 4, 6, 2, 3, 0, -0.0625, -8, -12, -4, -6, -2, -3], dtype=np.float32) / np.float32(12))
table = FP4 if fp4 else NF4

# The CUDA kernel's thresholds (dQuantizeNF4 / dQuantizeFP4) as f32: a code
# counts the thresholds x is strictly above (a value on one takes the lower code).
NF4_T = np.array([-0.8480964004993439, -0.6106329262256622, -0.4599952697753906, -0.33967943489551544,
                  -0.23460740596055984, -0.13791173323988914, -0.045525018125772476, 0.03979014977812767,
                  0.1202552504837513, 0.2035212516784668, 0.2920137718319893, 0.3893125355243683,
                  0.5016634166240692, 0.6427869200706482, 0.8614784181118011], dtype=np.float32)
FP4_T = np.array([0.00260417, 0.0859375, 0.20833333, 0.29166667, 0.4166667, 0.583333, 0.8333333], dtype=np.float32)

def codes_of(scaled):
    if not fp4:
        return np.searchsorted(NF4_T, scaled, side="left").astype(np.uint8)
    order = np.array([0, 1, 6, 7, 4, 5, 2, 3])
    c = order[np.searchsorted(FP4_T, np.abs(scaled), side="left")]
    return (c + 8 * (scaled < 0)).astype(np.uint8)

n_lin = 0
worst = 0.0
for name, (dtype, shape, w) in ref.items():
    if not name.endswith("proj.weight"):
        continue
    n_lin += 1
    p = name
    kind = "fp4" if fp4 else "nf4"
    st = json.loads(bytes(q[p + ".quant_state.bitsandbytes__" + kind][2]).decode())
    keys = ["quant_type", "blocksize", "dtype", "shape"] + (["nested_blocksize", "nested_dtype", "nested_offset"] if dq else [])
    assert list(st) == keys, st
    assert st["quant_type"] == kind and st["blocksize"] == 64 and st["dtype"] == "float16" and st["shape"] == shape, st
    flat = w.astype(np.float32).reshape(-1)
    nb = (flat.size + 63) // 64
    assert q[p][0] == "U8" and q[p][1] == [(flat.size + 1) // 2, 1], q[p][:2]
    assert q[p + ".quant_map"][0] == "F32" and q[p + ".quant_map"][2].astype(np.float32).tobytes() == table.tobytes()
    blocks = flat.reshape(nb, 64)
    absmax = np.abs(blocks).max(axis=1).astype(np.float32)
    scaled = (blocks * (np.float32(1) / absmax)[:, None]).astype(np.float32).reshape(-1)
    c = codes_of(scaled)
    packed = ((c[0::2] << 4) | c[1::2]).astype(np.uint8)
    assert np.array_equal(q[p][2].reshape(-1), packed), f"{p}: codes differ at {np.flatnonzero(q[p][2].reshape(-1) != packed)[:5]}"
    if dq:
        assert q[p + ".absmax"][0] == "U8" and q[p + ".absmax"][1] == [nb]
        nabs = q[p + ".nested_absmax"][2]
        nmap = q[p + ".nested_quant_map"][2]
        assert q[p + ".nested_absmax"][1] == [(nb + 255) // 256] and nmap.shape == (256,)
        off = np.float32(st["nested_offset"])
        assert abs(off - absmax.mean(dtype=np.float64)) <= 1e-6 * abs(off), (off, absmax.mean())
        dec = (nmap[q[p + ".absmax"][2]] * np.repeat(nabs, 256)[:nb]).astype(np.float32) + off
        assert np.all(np.abs(dec - absmax) <= np.repeat(nabs, 256)[:nb] * 0.02), p
    else:
        assert q[p + ".absmax"][0] == "F32" and np.array_equal(q[p + ".absmax"][2], absmax), p
        dec = absmax
    deq = (table[c].reshape(nb, 64) * dec[:, None]).astype(np.float16).astype(np.float32).reshape(-1)
    bound = (0.17 if fp4 else 0.16) * np.repeat(dec, 64) + (np.repeat(np.abs(dec - absmax), 64) if dq else 0) + 1e-3
    err = np.abs(deq - flat)
    assert np.all(err <= bound), f"{p}: max error {err.max()}"
    worst = max(worst, float((err / np.repeat(absmax, 64)).max()))
assert n_lin == 28, n_lin
print(f"{v}: 28 Linears, worst |error| / absmax {worst:.4f}")
PYEOF
done

"$QF" inspect "$WORK/nf4dq" >"$WORK/i.txt"
grep -q "^quantization: bitsandbytes: nf4, double quant, compute float32" "$WORK/i.txt" && ok "inspect shows bitsandbytes NF4" \
  || fail "inspect: $(grep quantization "$WORK/i.txt")"

# KL bounds: measured on this fixture over 4 chunks (NF4 0.0039, FP4 0.0074, with or without
# double quantization; docs/benchmarks.md) with about 2x headroom.
declare -A kld=([nf4]=0.008 [nf4dq]=0.008 [fp4]=0.015 [fp4dq]=0.015)
for v in nf4 nf4dq fp4 fp4dq; do
  "$QF" -q eval "$WORK/$v" --text "$evaltxt" --max-chunks 4 --baseline "$fx" --max-kld "${kld[$v]}" \
    --json "$WORK/e-$v.json" >/dev/null 2>"$WORK/e-$v.err" \
    && ok "eval $v passes --max-kld ${kld[$v]}: $($PY -c "import json,sys; j=json.load(open(sys.argv[1])); print(j['kld']['mean'], j['ppl'])" "$WORK/e-$v.json" 2>/dev/null)" \
    || fail "eval $v: $(cat "$WORK/e-$v.err") $(cat "$WORK/e-$v.json" 2>/dev/null | head -c 400)"
done

# A bad key, a GPTQ recipe and a bitsandbytes key for another format: one line, nothing written.
cat >"$WORK/bad.yaml" <<'YEOF'
quant_stage:
  quant_modifiers:
    QuantizationModifier:
      scheme: NF4
export:
  format: bitsandbytes
  double_quants: true
YEOF
expect_exit 3 "bad.yaml:7:3: .*double_quants" -- "$QF" quantize "$fx" --recipe "$WORK/bad.yaml" -o "$WORK/bad"
[[ ! -e "$WORK/bad" ]] && ok "nothing written for the bad recipe" || fail "$WORK/bad exists"
cat >"$WORK/gptq.yaml" <<'YEOF'
quant_stage:
  quant_modifiers:
    GPTQModifier:
      scheme: NF4
export:
  format: bitsandbytes
YEOF
expect_exit 4 "GPTQModifier quantizes integer weights.*round-to-nearest only" -- \
  "$QF" quantize "$fx" --recipe "$WORK/gptq.yaml" --calib "$SRC/tests/data/text/calibration.txt" -o "$WORK/gptq"
[[ ! -e "$WORK/gptq" ]] && ok "nothing written for GPTQ + NF4" || fail "$WORK/gptq exists"
cat >"$WORK/ct.yaml" <<'YEOF'
quant_stage:
  quant_modifiers:
    QuantizationModifier:
      scheme: NF4
export:
  format: compressed-tensors
YEOF
expect_exit 4 "compressed-tensors has no nf4 b64 format" -- "$QF" quantize "$fx" --recipe "$WORK/ct.yaml" -o "$WORK/ct"
cat >"$WORK/dqct.yaml" <<'YEOF'
quant_stage:
  quant_modifiers:
    QuantizationModifier:
      scheme: W4A16
export:
  format: compressed-tensors
  double_quant: true
YEOF
expect_exit 4 "export.double_quant: only for format: bitsandbytes" -- "$QF" quantize "$fx" --recipe "$WORK/dqct.yaml" -o "$WORK/dqct"

finish
