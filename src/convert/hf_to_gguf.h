// Hugging Face folder -> GGUF, as llama.cpp's convert_hf_to_gguf.py followed
// by llama-quantize would produce it: llama.cpp's tensor names and metadata
// keys, the q/k row permutation of the llama architecture, and per-tensor
// types from a preset's mixing rules (quantizers/gguf_mix.h), quantized with
// the reference block algorithms (quantizers/kquants.h), optionally weighted
// by an importance matrix. A vision-language model becomes two files: its
// language model (Qwen2-VL as llama.cpp's "qwen2vl" architecture, LLaVA as
// its text model's) and its vision encoder + projector as a CLIP "mmproj"
// GGUF (convert/gguf_mmproj.h) that stays f16/f32 whatever the preset.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/lora_adapter.h"
#include "core/thread_pool.h"
#include "formats/gguf/imatrix.h"
#include "formats/hf/model_config.h"
#include "formats/safetensors.h"
#include "quantizers/gguf_mix.h"

namespace qf {

struct GgufConvertOptions {
  std::string preset = "F16";            // gguf_mix preset name
  std::filesystem::path imatrix;         // optional importance matrix (.gguf or .dat)
  // An importance matrix already in memory (used instead of reading
  // `imatrix`, which then only names it in the file's metadata).
  std::shared_ptr<const Imatrix> imatrix_data;
  std::function<void(const std::string&)> note;  // messages (fallbacks, missing imatrix entries)
  bool allow_nonfinite = false;          // false: a NaN/Inf weight is InvalidInput naming the tensor
  // llama-quantize's --output-tensor-type / --token-embedding-type, and a
  // size budget's per-tensor types (gguf_mix::TypeOverrides::tensors).
  gguf_mix::TypeOverrides overrides;
  // LoRA adapters merged into the model before conversion (checkpoint/lora_merge.h).
  std::vector<LoraSpec> loras;
  // A vision-language model: where its mmproj GGUF goes (empty: beside the
  // output, default_mmproj_path), or none at all (no_mmproj: the language
  // model alone). Either set for a text model is InvalidInput.
  std::filesystem::path mmproj;
  bool no_mmproj = false;
};

struct GgufConvertResult {
  std::filesystem::path path;
  uint64_t input_bytes = 0;   // bytes of weights read from the checkpoint
  uint64_t output_bytes = 0;  // size of the GGUF file
  uint64_t parameters = 0;    // elements of the 2-D weights
  double seconds = 0;
  std::vector<std::pair<std::string, uint32_t>> types;  // tensor -> ggml type, in file order
  std::filesystem::path mmproj_path;  // the mmproj GGUF written beside it (empty: none)
  uint64_t mmproj_bytes = 0;
};

// The GGUF name of a Hugging Face tensor ("" when it has none; routed
// experts' matrices see gguf_expert_slab).
std::string gguf_tensor_name(const std::string& hf_name);

// A routed expert's matrix ("model.layers.N.block_sparse_moe.experts.E.w1.weight",
// "model.layers.N.mlp.experts.E.down_proj.weight") is slab E of llama.cpp's
// stacked tensor ("blk.N.ffn_gate_exps.weight", "blk.N.ffn_down_exps.weight");
// name "" for any other tensor.
struct GgufExpertSlab {
  std::string name;
  int64_t expert = -1;
};
GgufExpertSlab gguf_expert_slab(const std::string& hf_name);

// llama's q and k rows go from Hugging Face's rotate-half order to llama.cpp's
// interleaved pairs: within each head of hd rows, output row 2i + t takes
// input row t * hd/2 + i. The input row of output row r of a tensor of `rows`
// rows and `heads` heads (r itself when heads is 0).
int64_t permuted_qk_source(int64_t r, int64_t heads, int64_t rows);
// The heads whose rows a GGUF tensor permutes: attn_q's and attn_k's of the
// "llama" architecture, 0 for every other tensor.
int64_t permuted_qk_heads(const ModelConfig& c, const std::string& arch, const std::string& gguf_name);

// llama.cpp's general.architecture for a config ("llama" for llama, mistral
// and mixtral; "qwen2", "qwen3", "qwen2moe", "qwen3moe"; "qwen2vl" for the
// language model of qwen2_vl and qwen2_5_vl, which takes multimodal RoPE
// positions; a LLaVA model's text architecture); Unsupported naming `where`
// otherwise.
std::string gguf_arch(const ModelConfig& c, const std::string& where);

// The GGUF tensors a Hugging Face checkpoint becomes (a vision-language
// model's language model only): each GGUF name's source tensors (one, or every expert's slab of a stacked tensor in expert order),
// its ne (ggml order; stacked: [cols, rows, experts]) and the descriptions
// gguf_mix plans from. Throws naming `where` for tensors without a GGUF
// counterpart, non-float tensors and missing or misshapen experts.
struct GgufLayout {
  std::map<std::string, std::vector<std::string>> hf_of;
  std::map<std::string, std::vector<uint64_t>> ne_of;
  std::vector<gguf_mix::TensorDesc> descs;
};
GgufLayout gguf_layout(const ModelConfig& c, const Checkpoint& ck, const std::string& where);

GgufConvertResult convert_hf_to_gguf(const std::filesystem::path& model_dir, const std::filesystem::path& out,
                                     const GgufConvertOptions& opts, ThreadPool& pool);

}  // namespace qf
