#include "runtime/router_linears.h"

namespace qf::rt {

std::vector<RouterLinear> router_linears(const ModelConfig& c, int64_t layer) {
  std::vector<RouterLinear> r;
  for (const HfRouter& h : hf_layer_routers(c, layer))
    r.push_back({h.name, h.shared_gate ? &MoeWeights::shared_gate : &MoeWeights::router});
  return r;
}

}  // namespace qf::rt
