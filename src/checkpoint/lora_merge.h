// Merging LoRA adapters into a base model's weights: once, in f32, from the
// stored weights, rounded once to the stored dtype. The merge is an overlay
// on the base's Checkpoint (formats/safetensors.h), so every reader of the
// checkpoint (the runtime, calibration, quantize's export, convert) sees the
// merged model without a merged copy on disk.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/lora_adapter.h"
#include "core/thread_pool.h"
#include "formats/safetensors.h"

namespace qf {

// Every adapter in order on the f32 weight W [out, in] (row-major) of
// `tensor`: a replacement sets W; a module adds scale * B A (an embedding:
// scale * (B A)^T), DoRA then scales row i by m_i / ||W_i||. Each element of
// B A is a chain of f32 multiply-adds over the rank in order.
void apply_lora_updates(const std::vector<LoraAdapter>& adapters, const std::string& tensor, std::vector<float>& w,
                        int64_t out, int64_t in, ThreadPool& pool);

// The overlay of `adapters` (read against the checkpoint it is set on).
std::shared_ptr<const Checkpoint::Overlay> lora_merge_overlay(std::vector<LoraAdapter> adapters);

// The base folder's checkpoint with the adapters of `specs` merged in
// (read_peft_adapter each, against the folder's config.json); without
// specs, the plain checkpoint. Unsupported when the base is a quantized
// checkpoint (merging would requantize it: merge into the f16/bf16 base).
Checkpoint open_checkpoint_with_loras(const std::filesystem::path& dir, const std::vector<LoraSpec>& specs,
                                      FileResidency residency = FileResidency::Mapped);

// `quantforge merge`: every tensor of the base with the adapters merged
// (rounded once to the base's dtype), written to the folder `out` (which must
// not exist, or be empty; staged and renamed into place) with the base's
// other files (config.json, tokenizer, generation config) copied.
struct MergeResult {
  std::filesystem::path path;
  int64_t tensors = 0, merged = 0;  // written; changed by an adapter
  uint64_t bytes = 0;
};
MergeResult write_merged_model(const std::filesystem::path& base_dir, const std::vector<LoraSpec>& specs,
                               const std::filesystem::path& out);

// The adapters' description for reports: [{"path", "scale", "dora", "modules", "replaced"}].
nlohmann::json lora_provenance(const std::vector<LoraSpec>& specs);

}  // namespace qf
