#!/usr/bin/env bash
# Vision-language GGUF files from `quantforge convert` under llama.cpp
# (b4748-era tools; not run by CI, which has no llama.cpp build).
#
#   scripts/bench/vlm_llama_cpp_check.sh LLAMA_BIN_DIR [options]
#
# LLAMA_BIN_DIR is llama.cpp's build/bin with llama-perplexity and, for the
# vision checks, llama-qwen2vl-cli and llama-llava-cli (cmake --build build
# --target llama-qwen2vl-cli llama-llava-cli). This repository contains none
# of llama.cpp's code.
#
# 1. Converts the Qwen2-VL fixture (tests/data/vlm/qwen2-vl) to an f16
#    language model GGUF (arch qwen2vl) and its mmproj, and the same language
#    model as a text-only Qwen2 folder to an arch qwen2 GGUF (the control: for
#    text, multimodal RoPE with equal positions is NEOX RoPE, so both compute
#    the same function).
# 2. llama-perplexity on both (-c CTX --chunks N) and `quantforge eval` of the
#    control (and of the Hugging Face folder) on the same text and context.
#    llama-perplexity feeds a qwen2vl model one position per token where the
#    architecture reads four, so its number for the qwen2vl file only shows
#    that the file loads and runs; the control's is the comparable one. When
#    LLAMA_BIN_DIR is inside a llama.cpp tree (include/llama.h at ../..),
#    vlm_mrope_ppl.cpp scores both files like llama-perplexity but with the
#    qwen2vl file's four positions per token; the two must agree within 0.1%.
# 3. llama-qwen2vl-cli (Q4_K_M language model + f16 mmproj) and llama-llava-cli
#    (LLaVA fixture) on a fixture image for a few tokens: the mmproj files load
#    and run.
# 4. When LLAMA_BIN_DIR is inside a llama.cpp tree whose llava objects are
#    built (build/examples/llava/CMakeFiles/llava.dir/clip.cpp.o), builds
#    vlm_clip_embed.cpp against them and compares clip.cpp's image embeddings
#    for the fixtures' reference pixels with transformers' (the
#    reference_vision.safetensors of each fixture); fails above 2% relative
#    error.
#
# Options:
#   --qf BINARY      quantforge binary (default build/bin/quantforge, built if absent)
#   --text FILE      perplexity text (default tests/data/text/evaluation.txt)
#   --ctx N          context of both perplexities (default 128)
#   --chunks N       chunks (default 8)
#   --threads N      threads (default: all cores)
#   --work DIR       where files go (default build/vlm_llama_cpp)
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ $# -ge 1 && -d "$1" ]] || { sed -n 2,41p "$0" >&2; exit 2; }
llama="$(cd "$1" && pwd)"; shift
qf="" text=tests/data/text/evaluation.txt ctx=128 chunks=8 threads=$(nproc) work=build/vlm_llama_cpp
while [[ $# -gt 0 ]]; do
  case "$1" in
    --qf) qf="$2"; shift 2 ;;
    --text) text="$2"; shift 2 ;;
    --ctx) ctx="$2"; shift 2 ;;
    --chunks) chunks="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
if [[ -z "$qf" ]]; then
  [[ -x build/bin/quantforge ]] || scripts/build.sh --target quantforge >/dev/null
  qf="$PWD/build/bin/quantforge"
fi
[[ -x "$llama/llama-perplexity" ]] || { echo "no llama-perplexity in $llama" >&2; exit 2; }
py=/usr/bin/python3
mkdir -p "$work"
qwen=tests/data/vlm/qwen2-vl llava=tests/data/vlm/llava
status=0
check() { if "$@"; then echo "ok: $*" | cut -c1-160; else echo "FAIL: $*" | cut -c1-160; status=1; fi; }

# ---- 1. conversions
"$qf" -q convert "$qwen" --to gguf --type F16 -o "$work/qwen2vl-f16.gguf" --force
"$qf" -q convert "$qwen" --to gguf --type Q4_K_M -o "$work/qwen2vl-q4_k_m.gguf" --mmproj "$work/mmproj-qwen2vl-for-q4.gguf" --force
"$qf" -q convert "$llava" --to gguf --type F16 -o "$work/llava-f16.gguf" --force
# The language model alone as a Qwen2 folder: its tensors, its tokenizer, a
# text config.
control="$work/qwen2-text"
rm -rf "$control" && mkdir -p "$control"
$py - "$qwen" "$control" <<'PYEOF'
import json, os, shutil, struct, sys
src, dst = sys.argv[1], sys.argv[2]
c = json.load(open(os.path.join(src, "config.json")))
for k in ("vision_config", "rope_scaling", "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"):
    c.pop(k, None)
c.update(c.pop("text_config", {}))
c["model_type"], c["architectures"] = "qwen2", ["Qwen2ForCausalLM"]
json.dump(c, open(os.path.join(dst, "config.json"), "w"), indent=2)
for f in os.listdir(src):
    if f.startswith("tokenizer") or f in ("special_tokens_map.json", "generation_config.json"):
        shutil.copy(os.path.join(src, f), dst)
with open(os.path.join(src, "model.safetensors"), "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    body = f.read()
out_header, chunks, at = {}, [], 0
for name, info in header.items():
    if name == "__metadata__" or name.startswith(("visual.", "model.visual.")):
        continue
    b, e = info["data_offsets"]
    new = "model." + name[len("model.language_model."):] if name.startswith("model.language_model.") else name
    out_header[new] = {"dtype": info["dtype"], "shape": info["shape"], "data_offsets": [at, at + e - b]}
    chunks.append(body[b:e])
    at += e - b
h = json.dumps(out_header).encode()
h += b" " * (-len(h) % 8)
with open(os.path.join(dst, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for ch in chunks:
        f.write(ch)
PYEOF
"$qf" -q convert "$control" --to gguf --type F16 -o "$work/qwen2-control-f16.gguf" --force

# ---- 2. perplexity
ppl() { grep -o 'Final estimate: PPL = [0-9.]* +/- [0-9.]*' "$1" | sed 's/Final estimate: PPL = //'; }
"$llama/llama-perplexity" -m "$work/qwen2vl-f16.gguf" -f "$text" -c "$ctx" --chunks "$chunks" -t "$threads" > "$work/ppl-qwen2vl.txt" 2>&1 \
  || { echo "FAIL: llama-perplexity on the qwen2vl file (see $work/ppl-qwen2vl.txt)"; status=1; }
"$llama/llama-perplexity" -m "$work/qwen2-control-f16.gguf" -f "$text" -c "$ctx" --chunks "$chunks" -t "$threads" > "$work/ppl-qwen2.txt" 2>&1 \
  || { echo "FAIL: llama-perplexity on the qwen2 control (see $work/ppl-qwen2.txt)"; status=1; }
qppl=n/a
if "$qf" -q eval "$work/qwen2-control-f16.gguf" --text "$text" --ctx "$ctx" --max-chunks "$chunks" --threads "$threads" \
  --json "$work/eval-qwen2.json" >/dev/null 2>"$work/eval-qwen2.err"; then
  qppl=$($py -c 'import json,sys; print("%.4f" % json.load(open(sys.argv[1]))["ppl"])' "$work/eval-qwen2.json")
fi
# The qwen2vl file with the positions its architecture reads (four per
# token), through llama.h, scored like llama-perplexity: it must match the
# control.
tree="$(cd "$llama/../.." && pwd)"
mppl=n/a cppl=n/a
if [[ -f "$tree/include/llama.h" ]]; then
  g++ -O2 -std=c++17 -I"$tree/include" -I"$tree/ggml/include" scripts/bench/vlm_mrope_ppl.cpp \
    -L"$llama" -lllama -lggml -lggml-base -Wl,-rpath,"$llama" -o "$work/vlm_mrope_ppl"
  mppl=$("$work/vlm_mrope_ppl" "$work/qwen2vl-f16.gguf" "$text" "$ctx" "$chunks" "$threads" 2>/dev/null | sed 's/.*PPL = //')
  cppl=$("$work/vlm_mrope_ppl" "$work/qwen2-control-f16.gguf" "$text" "$ctx" "$chunks" "$threads" 2>/dev/null | sed 's/.*PPL = //')
  check $py -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a / b - 1) > 1e-3)" "$mppl" "$cppl"
fi
hppl=n/a
if "$qf" -q eval "$qwen" --text "$text" --ctx "$ctx" --max-chunks "$chunks" --threads "$threads" \
  --json "$work/eval-hf.json" >/dev/null 2>"$work/eval-hf.err"; then
  hppl=$($py -c 'import json,sys; print("%.4f" % json.load(open(sys.argv[1]))["ppl"])' "$work/eval-hf.json")
fi
echo
echo "| model (f16) | tool | PPL (ctx $ctx, $chunks chunks) |"
echo "|---|---|---|"
echo "| Qwen2-VL LM as arch qwen2vl | llama-perplexity (positions over-read: load/run check only) | $(ppl "$work/ppl-qwen2vl.txt") |"
echo "| the same LM as arch qwen2 | llama-perplexity | $(ppl "$work/ppl-qwen2.txt") |"
echo "| Qwen2-VL LM as arch qwen2vl | vlm_mrope_ppl.cpp (llama.h, 4 positions per token) | $mppl |"
echo "| the same LM as arch qwen2 | vlm_mrope_ppl.cpp (llama.h, 1 position per token) | $cppl |"
echo "| the same LM as arch qwen2 | quantforge eval (GGUF) | $qppl |"
echo "| the Qwen2-VL folder | quantforge eval (Hugging Face) | $hppl |"
echo

# ---- 3. the mmproj files under llama.cpp's CLIs
img=tests/data/vlm/images/img3_two_shapes.png
if [[ -x "$llama/llama-qwen2vl-cli" ]]; then
  "$llama/llama-qwen2vl-cli" -m "$work/qwen2vl-q4_k_m.gguf" --mmproj "$work/mmproj-qwen2vl-for-q4.gguf" --image "$img" \
    -p "Describe the image." -n 8 --temp 0 -t "$threads" > "$work/qwen2vl-cli.txt" 2>&1 || true
  check grep -q "image embedding created: [0-9]* tokens" "$work/qwen2vl-cli.txt"
  check grep -q "llama_perf_context_print: *eval time" "$work/qwen2vl-cli.txt"
else
  echo "skipped: no llama-qwen2vl-cli in $llama"
fi
if [[ -x "$llama/llama-llava-cli" ]]; then
  "$llama/llama-llava-cli" -m "$work/llava-f16.gguf" --mmproj "$work/mmproj-llava-f16.gguf" --image "$img" \
    -p "Describe the image." -n 8 --temp 0 -t "$threads" > "$work/llava-cli.txt" 2>&1 || true
  check grep -q "image embedding created: 16 tokens" "$work/llava-cli.txt"
  check grep -q "llama_perf_context_print: *eval time" "$work/llava-cli.txt"
else
  echo "skipped: no llama-llava-cli in $llama"
fi

# ---- 4. clip.cpp's embeddings against transformers'
obj="$tree/build/examples/llava/CMakeFiles/llava.dir/clip.cpp.o"
if [[ -f "$tree/examples/llava/clip.h" && -f "$obj" ]]; then
  g++ -O2 -std=c++17 -I"$tree/examples/llava" -I"$tree/ggml/include" -I"$tree/include" scripts/bench/vlm_clip_embed.cpp "$obj" \
    -L"$llama" -lggml -lggml-base -lggml-cpu -Wl,-rpath,"$llama" -lpthread -o "$work/vlm_clip_embed"
  for m in qwen2vl llava; do
    ref=$([[ $m == llava ]] && echo "$llava" || echo "$qwen")/reference_vision.safetensors
    flag=$([[ $m == qwen2vl ]] && echo --qwen2vl || true)
    for i in 0 1 2 3; do
      read -r h w < <($py scripts/bench/vlm_clip_compare.py pixels "$ref" "image$i" "$work/px.f32" $flag)
      "$work/vlm_clip_embed" "$work/mmproj-$m-f16.gguf" "$work/px.f32" "$h" "$w" "$work/emb.f32" >"$work/embed.log" 2>&1 \
        || { echo "FAIL: vlm_clip_embed $m image$i (see $work/embed.log)"; status=1; continue; }
      echo -n "$m "
      $py scripts/bench/vlm_clip_compare.py compare "$ref" "image$i" "$work/emb.f32" || status=1
    done
  done
else
  echo "skipped: embeddings (no llama.cpp tree with built llava objects around $llama)"
fi
exit $status
