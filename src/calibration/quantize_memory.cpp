#include "calibration/quantize_memory.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "quantizers/gptq.h"

namespace qf {
namespace {

constexpr uint64_t kBaseline = 48ull << 20;  // the program, its libraries, the tokenizer, thread stacks

std::string gib(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1ull << 30));
  else std::snprintf(buf, sizeof buf, "%.0f MiB", static_cast<double>(b) / (1ull << 20));
  return buf;
}

uint64_t sq(int64_t n) { return static_cast<uint64_t>(n) * static_cast<uint64_t>(n); }

}  // namespace

uint64_t QuantizeMemory::total() const {
  return activations + layer_weights + layer_output + forward + solve + search + fixed;
}

nlohmann::ordered_json QuantizeMemory::json() const {
  return {{"predicted_peak_bytes", total()},
          {"activations_bytes", activations},
          {"layer_weights_bytes", layer_weights},
          {"layer_output_bytes", layer_output},
          {"forward_bytes", forward},
          {"solve_bytes", solve},
          {"search_bytes", search},
          {"fixed_bytes", fixed}};
}

std::string QuantizeMemory::line() const {
  std::string s = "about " + gib(total()) + " at the peak: calibration activations " + gib(activations) +
                  ", one layer's weights " + gib(layer_weights) + " and its quantized form " + gib(layer_output) +
                  ", forward " + gib(forward) + ", solve " + gib(solve);
  if (search) s += ", search " + gib(search);
  return s + ", fixed " + gib(fixed) + " (the model's other layers stay on disk)";
}

QuantizeMemory estimate_quantize_memory(const rt::Model& model, const QuantizePlan& plan,
                                        const std::vector<std::vector<int32_t>>& samples, uint64_t max_memory_bytes) {
  const ModelConfig& c = model.config();
  const uint64_t h = static_cast<uint64_t>(c.hidden_size);
  uint64_t tokens = 0, longest = 1;
  std::set<int32_t> distinct;
  for (const auto& s : samples) {
    tokens += s.size(), longest = std::max<uint64_t>(longest, s.size());
    distinct.insert(s.begin(), s.end());
  }
  QuantizeMemory m;
  // Hidden states (and a sparse layer's MLP inputs) in memory, or spilled
  // beyond --max-memory with one sample in memory at a time.
  const uint64_t hidden = tokens * h * 4;
  const uint64_t held = max_memory_bytes > 0 && hidden > max_memory_bytes ? longest * h * 4 : hidden;
  m.activations = held * (c.is_moe() ? 2 : 1);

  const bool gptq = plan.quantizer == QuantMethod::Gptq;
  const int64_t bs = std::max<int64_t>(1, plan.gptq.block_size);
  for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
    const rt::LayerWeights& L = model.weights().layers[static_cast<size_t>(li)];
    uint64_t weights = 0, params = 0, widest = 0;
    uint64_t linear_work = 0;
    for (const rt::LayerLinearId& id : rt::layer_linears(c, li)) {
      const rt::Linear& lin = *rt::layer_linear(L, id);
      weights += lin.weight_bytes();
      const uint64_t n = static_cast<uint64_t>(lin.out_features()) * static_cast<uint64_t>(lin.in_features());
      params += n;
      widest = std::max<uint64_t>(widest, static_cast<uint64_t>(lin.in_features()));
      // decode_all's f32 copy; GPTQ's double working copy, its codes and a block of errors.
      uint64_t work = n * 4;
      if (gptq) work += n * 9 + static_cast<uint64_t>(lin.out_features()) * static_cast<uint64_t>(bs) * 8;
      linear_work = std::max(linear_work, work);
    }
    m.layer_weights = std::max(m.layer_weights, weights);
    // Codes (a byte each) and the packed form (up to a byte each) for this
    // layer, and the previous layer's while its resume state is written.
    m.layer_output = std::max(m.layer_output, 2 * params * 2);
    // The Hessians of a dense layer's four inputs (double), all alive after
    // the capture pass, with the first one's factor; later, the largest
    // Hessian with its factor. A factor is one n x n matrix (the damped
    // copy, factored and inverted in place) and the inverse's (n/2)^2
    // scratch: 5/4 of a Hessian.
    uint64_t solve = linear_work;
    if (gptq) {
      const int64_t ffn = c.ffn_width(li);
      const uint64_t all = (2 * sq(c.hidden_size) + sq(c.q_dim()) + (c.moe_layer(li) ? 0 : sq(ffn))) * 8;
      const uint64_t one = sq(static_cast<int64_t>(widest)) * 8;
      const uint64_t expert = c.moe_layer(li) ? (sq(c.hidden_size) + sq(ffn)) * 8 : 0;  // one expert's two Hessians
      solve += std::max(all + expert + sq(c.hidden_size) * 8 * 5 / 4, one * 9 / 4);
    }
    m.solve = std::max(m.solve, solve);
    // One sample through one layer: the layer's activations (normed input,
    // q, attention output, gate and up, the output), its K/V cache (every
    // layer's blocks are allocated), the Hessian's pending rows.
    const uint64_t ffn = static_cast<uint64_t>(c.moe_layer(li) ? c.moe_intermediate_size : c.intermediate_size);
    const uint64_t per_token = (3 * h + 2 * static_cast<uint64_t>(c.q_dim()) + 2 * ffn + 2 * static_cast<uint64_t>(c.kv_dim())) * 4;
    const uint64_t cache = longest * static_cast<uint64_t>(c.num_hidden_layers) * static_cast<uint64_t>(c.kv_dim()) * 2 * 2;
    m.forward = std::max(m.forward, longest * per_token + cache + HessianAccumulator::kChunk * widest * 4);
    if (plan.awq || plan.smoothquant) {
      // The layer's inputs, the attention and MLP outputs and MLP inputs, a
      // candidate's output, and (AWQ) the down projection's inputs.
      const uint64_t rows = tokens * 4;
      m.search = std::max(m.search, rows * (5 * h + (plan.awq ? ffn : 0)));
    }
  }
  m.fixed = kBaseline + static_cast<uint64_t>(distinct.size()) * h * 4 +
            static_cast<uint64_t>(c.num_hidden_layers) * 2 * h * 4;
  return m;
}

}  // namespace qf
