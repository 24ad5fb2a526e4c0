#!/usr/bin/env bash
# quantforge and llama.cpp side by side on the same machine and the same files.
#
#   scripts/bench/vs_llamacpp.sh LLAMA_BIN_DIR [options]
#
# LLAMA_BIN_DIR holds llama-quantize, llama-bench and llama-perplexity from a
# CPU build of llama.cpp made elsewhere (this repository contains none of its
# code). The model is an f16 Hugging Face folder, by default the random
# TinyLlama-1.1B-shaped checkpoint of make_synthetic_model.py under build/.
#
# 1. Conversion: for each preset, llama-quantize (from the f16 GGUF that
#    `quantforge convert --type F16` writes) and `quantforge convert` (from the
#    safetensors), alternating, --reps times each; median wall seconds, their
#    ratio, and a byte comparison of every tensor (gguf_tensor_diff.py).
# 2. Runtime on llama-quantize's GGUF files (F16, Q8_0, Q4_K_M, Q6_K):
#    llama-bench pp/tg against `quantforge bench -p P -n 0` and
#    `quantforge bench -p 1 -n N` (both tools measure each from an empty
#    cache), alternating, best of --reps; perplexity with ctx 512 over --chunks chunks of the text,
#    the forward time of llama-perplexity against `quantforge eval`'s
#    (median; loading and tokenizing not counted), and both
#    perplexities (they should agree closely: same weights, same tokens).
# Prints markdown tables; ratios are llama.cpp time / quantforge time (or
# quantforge tok/s / llama.cpp tok/s): above 1 means quantforge is faster.
#
# Options:
#   --model DIR          f16 HF folder (default build/tinyllama-synth, made if absent)
#   --threads N          threads for both tools (default: all cores)
#   --reps N             runs per tool and measurement (default 3)
#   --presets "..."      conversion presets (default "Q4_K_M Q5_K_M Q6_K Q3_K_M Q2_K")
#   --types "..."        runtime types (default "F16 Q8_0 Q4_K_M Q6_K")
#   --pp N --tg N        prompt and generated tokens (default 512 and 128)
#   --text FILE          perplexity text (default tests/data/text/evaluation.txt)
#   --chunks N           perplexity chunks of 512 tokens (default 4)
#   --skip-convert | --skip-runtime | --skip-ppl
#   --llama-no-mmap      llama.cpp reads the weights into memory too (llama-bench
#                        -mmp 0, llama-perplexity --no-mmap); by default it maps
#                        them, its own default, while quantforge reads a model
#                        that fits into memory (QF_WEIGHTS, docs/runtime.md)
#   --work DIR           where GGUF files go (default build/vs_llamacpp)
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ $# -ge 1 && -d "$1" ]] || { sed -n 2,38p "$0" >&2; exit 2; }
llama="$(cd "$1" && pwd)"; shift
model=build/tinyllama-synth threads=$(nproc) reps=3 pp=512 tg=128 chunks=4
presets="Q4_K_M Q5_K_M Q6_K Q3_K_M Q2_K" types="F16 Q8_0 Q4_K_M Q6_K"
text=tests/data/text/evaluation.txt work=build/vs_llamacpp
do_convert=1 do_runtime=1 do_ppl=1
lb_mmap=() lp_mmap=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --presets) presets="$2"; shift 2 ;;
    --types) types="$2"; shift 2 ;;
    --pp) pp="$2"; shift 2 ;;
    --tg) tg="$2"; shift 2 ;;
    --text) text="$2"; shift 2 ;;
    --chunks) chunks="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --skip-convert) do_convert=0; shift ;;
    --skip-runtime) do_runtime=0; shift ;;
    --skip-ppl) do_ppl=0; shift ;;
    --llama-no-mmap) lb_mmap=(-mmp 0) lp_mmap=(--no-mmap); shift ;;
    *) echo "vs_llamacpp.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
for tool in llama-quantize llama-bench llama-perplexity; do
  [[ -x "$llama/$tool" ]] || { echo "vs_llamacpp.sh: $llama/$tool not found" >&2; exit 2; }
done
scripts/build.sh --target quantforge >/dev/null
qf="$PWD/build/bin/quantforge"
py=/usr/bin/python3
if [[ "$model" == build/tinyllama-synth && ! -f "$model/model.safetensors" ]]; then
  $py scripts/bench/make_synthetic_model.py "$model" >/dev/null
fi
mkdir -p "$work"
f16="$work/model-F16.gguf"
[[ -f "$f16" ]] || "$qf" convert "$model" --to gguf --type F16 -o "$f16" >/dev/null 2>&1

wall() {  # wall seconds of a command, its output discarded
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >/dev/null 2>&1 || { echo "vs_llamacpp.sh: failed: $*" >&2; exit 1; }
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }'
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
best() { printf '%s\n' "$@" | sort -g | tail -1; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

simd=scalar
grep -qw avx2 /proc/cpuinfo && simd=AVX2
grep -qw avx512bw /proc/cpuinfo && simd=AVX-512
grep -qw avx512_vnni /proc/cpuinfo && simd="AVX-512 VNNI"
grep -qw amx_bf16 /proc/cpuinfo && simd="$simd, AMX (quantforge level: ${QF_SIMD:-best})"
echo "machine: $(nproc) threads, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $simd"
echo "llama.cpp: $llama"
echo "model: $model, $threads threads, $reps runs each, alternating"
echo

if [[ $do_convert -eq 1 ]]; then
  echo "| preset | llama-quantize s | quantforge convert s | ratio | tensors byte-identical |"
  echo "|---|---|---|---|---|"
  for p in $presets; do
    lt=() qt=()
    for ((r = 0; r < reps; ++r)); do
      rm -f "$work/llama-$p.gguf" "$work/qf-$p.gguf"
      lt+=("$(wall "$llama/llama-quantize" "$f16" "$work/llama-$p.gguf" "$p" "$threads")")
      qt+=("$(wall "$qf" convert "$model" --to gguf --type "$p" -o "$work/qf-$p.gguf" --threads "$threads")")
    done
    ml=$(median "${lt[@]}") mq=$(median "${qt[@]}")
    same=$($py scripts/bench/gguf_tensor_diff.py "$work/qf-$p.gguf" "$work/llama-$p.gguf" | head -1 || true)
    printf '| %s | %.2f | %.2f | %sx | %s |\n' "$p" "$ml" "$mq" "$(ratio "$ml" "$mq")" "$same"
    rm -f "$work/qf-$p.gguf"
    [[ " $types " == *" $p "* ]] || rm -f "$work/llama-$p.gguf"
  done
  echo
fi

gguf_of() {  # the llama-quantize file of a runtime type (made if absent)
  local t=$1
  if [[ $t == F16 ]]; then echo "$f16"; return; fi
  [[ -f "$work/llama-$t.gguf" ]] || "$llama/llama-quantize" "$f16" "$work/llama-$t.gguf" "$t" "$threads" >/dev/null 2>&1
  echo "$work/llama-$t.gguf"
}

if [[ $do_runtime -eq 1 ]]; then
  echo "| type | llama.cpp pp$pp tok/s | quantforge prefill tok/s | ratio | llama.cpp tg$tg tok/s | quantforge decode tok/s | ratio |"
  echo "|---|---|---|---|---|---|---|"
  for t in $types; do
    g=$(gguf_of "$t")
    lp=() lg=() qp=() qd=()
    for ((r = 0; r < reps; ++r)); do
      "$llama/llama-bench" -m "$g" -p "$pp" -n "$tg" -t "$threads" -r 1 "${lb_mmap[@]}" -o json > "$work/lb.json" 2>/dev/null
      lp+=("$($py -c 'import json,sys; d=json.load(open(sys.argv[1])); print([x["avg_ts"] for x in d if x["n_prompt"]>0][0])' "$work/lb.json")")
      lg+=("$($py -c 'import json,sys; d=json.load(open(sys.argv[1])); print([x["avg_ts"] for x in d if x["n_gen"]>0][0])' "$work/lb.json")")
      # As llama-bench runs pp and tg: two runs, each from an empty cache
      # (decode after a 1-token prompt, not after the pp prompt).
      "$qf" bench "$g" -p "$pp" -n 0 --threads "$threads" --json "$work/qb.json" >/dev/null 2>&1
      qp+=("$($py -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["prefill_tokens_per_s"])' "$work/qb.json")")
      "$qf" bench "$g" -p 1 -n "$tg" --threads "$threads" --json "$work/qb.json" >/dev/null 2>&1
      qd+=("$($py -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["decode_tokens_per_s"])' "$work/qb.json")")
    done
    bp=$(best "${lp[@]}") bg=$(best "${lg[@]}") bqp=$(best "${qp[@]}") bqd=$(best "${qd[@]}")
    printf '| %s | %.1f | %.1f | %sx | %.1f | %.1f | %sx |\n' "$t" "$bp" "$bqp" "$(ratio "$bqp" "$bp")" "$bg" "$bqd" "$(ratio "$bqd" "$bg")"
  done
  $py -c 'import json,sys; d=json.load(open(sys.argv[1]))[0]; print("\nllama.cpp build %s (%s)" % (d["build_number"], d["build_commit"]))' "$work/lb.json"
  lw="mapped from the file (its default)"; [[ ${#lb_mmap[@]} -gt 0 ]] && lw="read into memory (-mmp 0)"
  echo "weights: llama.cpp $lw, quantforge $($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["weights"])' "$work/qb.json")"
  echo
fi

if [[ $do_ppl -eq 1 ]]; then
  # Forward time of the scoring only: llama-perplexity's "prompt eval time"
  # and eval's "seconds" (neither counts loading or tokenizing the text).
  echo "| type | llama-perplexity forward s | quantforge eval forward s | ratio | llama.cpp PPL | quantforge PPL |"
  echo "|---|---|---|---|---|---|"
  for t in $types; do
    g=$(gguf_of "$t")
    lt=() qt=()
    for ((r = 0; r < reps; ++r)); do
      "$llama/llama-perplexity" -m "$g" -f "$text" -c 512 --chunks "$chunks" -t "$threads" "${lp_mmap[@]}" > "$work/lp.txt" 2>&1
      lt+=("$(grep 'prompt eval time' "$work/lp.txt" | awk -F= '{print $2}' | awk '{print $1 / 1000}')")
      "$qf" eval "$g" --text "$text" --ctx 512 --max-chunks "$chunks" --threads "$threads" --json "$work/qe.json" >/dev/null 2>&1
      qt+=("$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["seconds"])' "$work/qe.json")")
    done
    lppl=$(grep -o 'Final estimate: PPL = [0-9.]*' "$work/lp.txt" | awk '{print $NF}')
    qppl=$($py -c 'import json,sys; print("%.4f" % json.load(open(sys.argv[1]))["ppl"])' "$work/qe.json")
    ml=$(median "${lt[@]}") mq=$(median "${qt[@]}")
    printf '| %s | %.1f | %.1f | %sx | %s | %s |\n' "$t" "$ml" "$mq" "$(ratio "$ml" "$mq")" "${lppl:-?}" "$qppl"
  done
fi
