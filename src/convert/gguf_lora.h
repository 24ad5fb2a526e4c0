// LoRA adapters as llama.cpp reads them (`llama-cli --lora A.gguf`):
// general.type "adapter", adapter.type "lora", adapter.lora.alpha, and for
// each adapted weight "<gguf name>.lora_a" (ne [in, r]) and ".lora_b"
// (ne [r, out]); llama's q/k rows permuted in lora_b as in the base GGUF.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/lora_adapter.h"
#include "core/dtype.h"
#include "formats/gguf/gguf.h"
#include "formats/hf/model_config.h"

namespace qf {

struct GgufLoraResult {
  std::filesystem::path path;
  float alpha = 0;       // adapter.lora.alpha as written
  int64_t tensors = 0;   // lora_a + lora_b tensors
  int64_t rescaled = 0;  // modules whose lora_b carries a factor (see write_gguf_lora)
  uint64_t bytes = 0;
};

// The tensor type of a GGUF adapter from its name (F16, BF16, F32, either
// case); Usage error naming `flag` otherwise.
DType parse_gguf_lora_type(const std::string& name, const std::string& flag);

// Converts the PEFT adapter of `spec` (read against the Hugging Face base
// `base_dir`) to `out`, tensors in `type` (F32, F16 or BF16). llama.cpp
// scales each pair by adapter_scale * alpha / r with one alpha per file:
// where a module's own scale (rsLoRA, rank_pattern, alpha_pattern, the
// spec's scale) differs, lora_b is multiplied by the ratio, so the file
// computes exactly what the adapter does. DoRA, replaced tensors
// (modules_to_save, biases), embeddings, routers and routed experts are
// Unsupported (llama.cpp's adapters hold none of them).
GgufLoraResult write_gguf_lora(const LoraSpec& spec, const std::filesystem::path& base_dir,
                               const std::filesystem::path& out, DType type);

// A GGUF LoRA adapter read for a GGUF base whose config is `c` and
// architecture `arch`: module names are the Hugging Face ones (so
// rt::apply_lora_forward finds the Linears); lora_b stays in the GGUF's row
// order, which is the base GGUF's. Scale: alpha / r per pair (alpha 0: 1),
// times spec.scale, as llama.cpp computes it. InvalidInput / Unsupported
// naming the file for a file that is not a LoRA adapter of this base.
LoraAdapter read_gguf_lora(const LoraSpec& spec, const ModelConfig& c, const std::string& arch);

}  // namespace qf
