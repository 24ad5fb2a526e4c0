// The Linears of a sparse layer that read the MLP input but are never
// quantized: the router (<moe prefix>gate) and qwen2_moe's shared-expert gate
// (mlp.shared_expert_gate). Smoothing folds its scales into them like into
// the experts, so exports and resume states write them as the pipeline left
// them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "formats/hf/model_config.h"
#include "runtime/model.h"

namespace qf::rt {

struct RouterLinear {
  std::string name;  // the module name under "model.layers.N."
  std::shared_ptr<Linear> MoeWeights::*member;
};

// Empty for a dense layer.
std::vector<RouterLinear> router_linears(const ModelConfig& c, int64_t layer);

}  // namespace qf::rt
