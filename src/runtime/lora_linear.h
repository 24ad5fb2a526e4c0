// LoRA adapters applied in the forward pass, without merging:
// y = x W^T + scale * (x A^T) B^T (+ bias), and with DoRA
// y = m / ||W + scale B A||_row * (x W^T + scale (x A^T) B^T) + bias,
// as PEFT computes an unmerged adapter. The base Linear keeps its stored form
// (f16, GPTQ, NVFP4, GGUF blocks...), so a quantized base plus an adapter
// runs as QLoRA serves it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "checkpoint/lora_adapter.h"
#include "runtime/linear.h"
#include "runtime/model.h"

namespace qf::rt {

// `base` with the module's adapter applied in the forward. Embedding adapters
// are Unsupported here (they run merged).
std::shared_ptr<Linear> make_lora_linear(std::shared_ptr<const Linear> base, const LoraModule& m);

// Wraps every Linear of `model` an adapter adapts (adapters in order, each
// around the previous one); `where` names the model in messages. Module names
// are the Hugging Face ones ("model.layers.0.self_attn.q_proj", "lm_head").
// Replaced tensors (modules_to_save) are not handled here: the loader sets
// them through the checkpoint.
void apply_lora_forward(Model& model, const std::vector<LoraAdapter>& adapters, const std::string& where);

}  // namespace qf::rt
