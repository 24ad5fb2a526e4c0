#include "runtime/router_linears.h"

namespace qf::rt {

std::vector<RouterLinear> router_linears(const ModelConfig& c, int64_t layer) {
  if (!c.moe_layer(layer)) return {};
  std::vector<RouterLinear> r = {{moe_module_prefix(c) + "gate", &MoeWeights::router}};
  if (c.shared_expert_intermediate_size > 0) r.push_back({"mlp.shared_expert_gate", &MoeWeights::shared_gate});
  return r;
}

}  // namespace qf::rt
