#include "calibration/pipeline_times.h"

#include <algorithm>

#include "runtime/model.h"

namespace qf {

double layer_forward_flops(const ModelConfig& c, int64_t layer, int64_t tokens, int64_t window) {
  const double n = static_cast<double>(tokens);
  double weights = 0, routed = 0;
  for (const rt::LayerLinearId& id : rt::layer_linears(c, layer)) {
    const rt::LinearShape s = rt::layer_linear_shape(c, id);
    (id.expert >= 0 ? routed : weights) += static_cast<double>(s.out) * static_cast<double>(s.in);
  }
  if (c.moe_layer(layer)) {
    weights += static_cast<double>(c.hidden_size) * static_cast<double>(c.num_experts);  // the router
    if (c.shared_expert_intermediate_size > 0) weights += static_cast<double>(c.hidden_size);  // the shared expert's gate
    weights += routed * static_cast<double>(c.num_experts_per_tok) / static_cast<double>(c.num_experts);
  }
  // Keys a query sees: position + 1, at most the window.
  double keys = 0;
  if (window > 0 && window < tokens) {
    const double w = static_cast<double>(window);
    keys = w * (w + 1) / 2 + (n - w) * w;
  } else {
    keys = n * (n + 1) / 2;
  }
  const double attention = 2.0 * 2.0 * static_cast<double>(c.q_dim()) * keys;
  return 2.0 * weights * n + attention;
}

nlohmann::ordered_json phase_json(const PhaseCount& p) {
  const double g = p.gflops();
  return {{"seconds", p.seconds},
          {"gflop", p.flops / 1e9},
          {"gflops", g > 0 ? nlohmann::ordered_json(g) : nlohmann::ordered_json()}};
}

}  // namespace qf
