#!/usr/bin/env bash
# --device: the device code's host build gives the CPU reference's bytes end
# to end; cuda without a GPU, the runtime commands and the mse observer over
# a whole tensor are one clear error each, with nothing written.
source "$(dirname "$0")/lib.sh"

fx="$SRC/tests/data/fixture-llama"
rec="$SRC/tests/data/recipes"
calib="$SRC/tests/data/text/calibration.txt"

# The same checkpoint from the CPU reference and the device host build.
for r in w4-gptq w4-rtn nvfp4 fp8; do
  "$QF" -q quantize "$fx" --recipe "$rec/$r.yaml" --calib "$calib" -o "$WORK/cpu-$r" >/dev/null 2>"$WORK/cpu-$r.err" \
    || fail "quantize $r on cpu: $(cat "$WORK/cpu-$r.err")"
  "$QF" -q quantize "$fx" --recipe "$rec/$r.yaml" --calib "$calib" -o "$WORK/host-$r" --device host >/dev/null 2>"$WORK/host-$r.err" \
    || fail "quantize $r on host: $(cat "$WORK/host-$r.err")"
  if cmp -s "$WORK/cpu-$r/model.safetensors" "$WORK/host-$r/model.safetensors" \
     && cmp -s "$WORK/cpu-$r/config.json" "$WORK/host-$r/config.json"; then
    ok "$r: --device host writes the CPU reference's bytes"
  else
    fail "$r: --device host and --device cpu differ"
  fi
done
$PY - "$WORK/host-w4-gptq/quantization_report.json" "$WORK/cpu-w4-gptq/quantization_report.json" <<'PYEOF' \
  && ok "the report names the device" || fail "report device field"
import json, sys
assert json.load(open(sys.argv[1]))["device"] == "host"
assert json.load(open(sys.argv[2]))["device"] == "cpu"
PYEOF

# The device memory GPTQ will need is said before the run: for the fixture's
# largest Linear (down_proj, 256 x 768): 13 bytes a weight, 3 x 768^2
# doubles, a block of errors and the parameters: 17.7, rounded up to 18 MiB.
"$QF" quantize "$fx" --recipe "$rec/w4-gptq.yaml" --calib "$calib" -o "$WORK/log" --device host >/dev/null 2>"$WORK/log.err" \
  && grep -q "^device host: GPTQ needs up to 18 MiB of device memory per Linear" "$WORK/log.err" \
  && ok "the device memory estimate is printed" || fail "estimate: $(grep -m3 device "$WORK/log.err")"

# Errors: one line, the exit code of its kind, no output.
have_gpu=0
"$QF" -q quantize "$fx" --recipe "$rec/w4-rtn.yaml" -o "$WORK/probe" --device auto >/dev/null 2>&1 \
  && grep -q '"device": "cuda"' "$WORK/probe/quantization_report.json" && have_gpu=1
if [[ $have_gpu -eq 0 ]]; then
  expect_exit 4 "quantize --device cuda: no usable CUDA device: " \
    -- "$QF" quantize "$fx" --recipe "$rec/w4-rtn.yaml" -o "$WORK/c" --device cuda
  [[ ! -e "$WORK/c" ]] && ok "nothing written for --device cuda" || fail "$WORK/c exists"
  grep -q '"device": "cpu"' "$WORK/probe/quantization_report.json" && ok "--device auto without a GPU runs on the cpu" \
    || fail "auto: $(grep device "$WORK/probe/quantization_report.json")"
fi
# The mse observer: the same bytes; over a whole tensor it is refused.
sed 's/            group_size: 128/            group_size: 128\n            observer: mse/' "$rec/w4-gptq.yaml" >"$WORK/mse.yaml"
for d in cpu host; do
  "$QF" -q quantize "$fx" --recipe "$WORK/mse.yaml" --calib "$calib" -o "$WORK/mse-$d" --device $d >/dev/null 2>&1 \
    || fail "mse on $d"
done
cmp -s "$WORK/mse-cpu/model.safetensors" "$WORK/mse-host/model.safetensors" \
  && ok "GPTQ with the mse observer: --device host writes the CPU's bytes" || fail "mse: host and cpu differ"
sed 's/            strategy: group/            strategy: tensor/; s/            group_size: 128/            observer: mse/' \
  "$rec/w4-rtn.yaml" >"$WORK/mse-tensor.yaml"
expect_exit 4 "the mse observer with the tensor strategy .* has no device version; quantize with --device cpu" \
  -- "$QF" quantize "$fx" --recipe "$WORK/mse-tensor.yaml" -o "$WORK/m" --device host
[[ ! -e "$WORK/m" ]] && ok "nothing written for mse over a whole tensor on the device" || fail "$WORK/m exists"
for cmd in eval bench imatrix; do
  case $cmd in
    eval) args=(eval "$fx" --text "$SRC/tests/data/text/evaluation.txt") ;;
    bench) args=(bench "$fx" -p 8 -n 2) ;;
    imatrix) args=(imatrix "$fx" --text "$SRC/tests/data/text/calibration.txt" -o "$WORK/i.gguf") ;;
  esac
  expect_exit 4 "$cmd runs on the CPU only for now" -- "$QF" "${args[@]}" --device host
done
expect_exit 2 "--device: gpu not in \{" -- "$QF" bench "$fx" --device gpu

finish
