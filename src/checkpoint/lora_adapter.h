// LoRA adapters as PEFT saves them (a folder with adapter_config.json and
// adapter_model.safetensors), read and checked against the base model they
// adapt. The merge (lora_merge.h), the runtime's unmerged forward
// (runtime/lora_linear.h) and the GGUF adapter writer (convert/gguf_lora.h)
// all start from the LoraAdapter read here.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "formats/hf/model_config.h"
#include "formats/safetensors.h"

namespace qf {

// One `--lora DIR[:SCALE]` argument: the adapter and the factor its update
// is multiplied by (1 unless given).
struct LoraSpec {
  std::filesystem::path path;
  double scale = 1.0;
};

// "DIR" or "DIR:SCALE" (SCALE a finite number; a path whose last ':' is not
// followed by a number is taken whole). Usage error naming `flag` for an
// empty path or a scale that is not finite.
LoraSpec parse_lora_spec(const std::string& arg, const std::string& flag = "--lora");

// One adapted module: W' = W + scale * B A (an embedding: W' = W + scale *
// (B A)^T), and with DoRA the rows renormalised: W'' = m / ||W'||_row * W'.
struct LoraModule {
  std::string module;  // the base's module name: "model.layers.0.self_attn.q_proj", "lm_head"
  Tensor a;            // F32 [r, in] (an embedding: [r, vocab])
  Tensor b;            // F32 [out, r] (an embedding: [hidden, r])
  float scale = 1;     // alpha / r (rsLoRA: alpha / sqrt(r)), times the spec's scale
  float alpha = 0;     // the module's lora_alpha (after alpha_pattern)
  bool rslora = false;
  bool embedding = false;
  std::vector<float> magnitude;  // DoRA's m [out]; empty without DoRA
  int64_t rank() const { return a.dim(0); }
};

// A whole tensor the adapter replaces: modules_to_save and trained biases.
struct LoraReplacement {
  std::string tensor;  // the base's tensor name, "lm_head.weight"
  Tensor value;        // the base tensor's shape, as stored in the adapter
};

struct LoraAdapter {
  std::string source;       // the folder, for messages
  double user_scale = 1.0;  // the spec's scale (already in each module's scale)
  nlohmann::json config;    // adapter_config.json as read
  bool dora = false;
  std::vector<LoraModule> modules;  // in the base's module order
  std::vector<LoraReplacement> replaced;
};

// Reads and checks a PEFT LoRA adapter against its base (config `c`, tensors
// `base`):
//  - peft_type LORA; every adapter_config.json key either honoured (r,
//    lora_alpha, use_rslora, target_modules as a list or a regex,
//    "all-linear", exclude_modules, layers_to_transform, layers_pattern,
//    rank_pattern, alpha_pattern, fan_in_fan_out, modules_to_save, bias,
//    use_dora), without effect on the weights (task_type, lora_dropout, ...)
//    or refused by name (Unsupported) when it changes what the adapter
//    computes in a way this reader does not (lora_bias, layer_replication, ...);
//  - the modules holding lora_A/lora_B are exactly those the config selects
//    among the base's modules, by PEFT's matching rules;
//  - shapes: lora_A [r, in], lora_B [out, r] with r the module's rank
//    (rank_pattern), DoRA's magnitude [out], replacements the base tensor's;
//  - a pickled adapter_model.bin is refused (it can run code when read).
// InvalidInput / NotFound / Unsupported naming the folder and the key or
// tensor.
LoraAdapter read_peft_adapter(const LoraSpec& spec, const ModelConfig& c, const Checkpoint& base);

// The base's modules an adapter may target, in forward order: each layer's
// Linears (attention, MLP or experts and shared expert, routers), then
// "lm_head"; "model.embed_tokens" first.
std::vector<std::string> lora_candidate_modules(const ModelConfig& c);

// PEFT's matching rules, exposed for tests.
//  - target: target_modules as a regex string (full match), a list (exact
//    name or ".NAME" suffix, then layers_to_transform/layers_pattern), or
//    "all-linear" (every Linear except the output layer);
bool peft_targets(const nlohmann::json& config, const std::string& module);
//  - rank_pattern / alpha_pattern: the first key K in the mapping's order
//    such that the module name matches "(.*\.)?(K)$" from its start; empty
//    when none matches.
std::string peft_pattern_key(const nlohmann::json& patterns, const std::string& module);

}  // namespace qf
