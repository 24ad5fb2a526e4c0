// Which build runs the device runtime's pieces, and how much device memory they need.
#include <algorithm>
#include <string>

#include "core/error.h"
#include "runtime/device_runtime.h"
#include "runtime/model.h"

namespace qf::rt {

namespace {

// Device bytes of one Linear as the decoder stores it (layer_engine_device.h's
// upload_linear): GGUF blocks and packed integers as they are, f16/bf16 at 2
// bytes a weight, every other form decoded to f32.
uint64_t stored_bytes(const Linear& l) {
  const std::string f = l.format();
  const uint64_t weights = static_cast<uint64_t>(l.out_features() * l.in_features());
  const uint64_t w = l.device_form().kind != DeviceWeightForm::Kind::None ? l.weight_bytes()
                     : f == "f16" || f == "bf16"                        ? weights * 2
                                                                        : weights * 4;
  return w + l.bias_values().size() * 4;
}

// Whether the decoder widens the Linear into its f32 scratch matrix before each GEMM.
bool widened(const Linear& l) {
  const std::string f = l.format();
  return l.device_form().kind != DeviceWeightForm::Kind::None || f == "f16" || f == "bf16";
}

}  // namespace

void refuse_sparse_on_device(const Model& model) {
  if (model.config().is_moe())
    throw unsupported("--device", "the device runtime does not run mixture-of-experts layers (model_type '" +
                                      model.config().model_type + "'); use --device cpu");
}

uint64_t device_decoder_bytes(const Model& model, int64_t capacity) {
  refuse_sparse_on_device(model);
  const ModelConfig& c = model.config();
  const ModelWeights& w = model.weights();
  const uint64_t f = 4, n = static_cast<uint64_t>(std::min(capacity, kDevicePassTokens)), cap = static_cast<uint64_t>(capacity);
  const uint64_t h = static_cast<uint64_t>(c.hidden_size), qd = static_cast<uint64_t>(c.q_dim()),
                 kvd = static_cast<uint64_t>(c.kv_dim()), ff = static_cast<uint64_t>(c.intermediate_size),
                 V = static_cast<uint64_t>(c.vocab_size), hd = static_cast<uint64_t>(c.head_dim);
  uint64_t weights = stored_bytes(*w.lm_head) + h * f, widest = widened(*w.lm_head) ? V * h : 0;
  for (const LayerWeights& L : w.layers) {
    weights += (L.attn_norm.size() + L.ffn_norm.size() + L.q_norm.size() + L.k_norm.size()) * f;
    for (const LayerLinear& ll : kLayerLinears) {
      const Linear& l = *(L.*ll.member);
      weights += stored_bytes(l);
      if (widened(l)) widest = std::max<uint64_t>(widest, static_cast<uint64_t>(l.out_features() * l.in_features()));
    }
  }
  const uint64_t cache = static_cast<uint64_t>(c.num_hidden_layers) * cap * kvd * 2 * f;
  const uint64_t rope = cap * hd * f;  // cos and sin, hd / 2 each
  const uint64_t group = static_cast<uint64_t>(c.num_attention_heads / std::max<int64_t>(1, c.num_key_value_heads));
  // x, xn, y; q, att; k, v; gate, up; one quantized input; scores; logits.
  const uint64_t act = (3 * n * h + 2 * n * qd + 2 * n * kvd + 2 * n * ff + n * std::max(h, ff) + group * n * cap + n * V) * f;
  return weights + widest * f + cache + rope + act;
}

uint64_t device_layer_pass_bytes(const Model& model, int64_t capacity, bool hessians) {
  refuse_sparse_on_device(model);
  const ModelConfig& c = model.config();
  const uint64_t f = 4, n = static_cast<uint64_t>(std::min(capacity, kDevicePassTokens)), cap = static_cast<uint64_t>(capacity);
  const uint64_t h = static_cast<uint64_t>(c.hidden_size), qd = static_cast<uint64_t>(c.q_dim()),
                 kvd = static_cast<uint64_t>(c.kv_dim()), ff = static_cast<uint64_t>(c.intermediate_size),
                 hd = static_cast<uint64_t>(c.head_dim);
  // The layer with the most weight bytes; quantized Linears are f32 on the
  // device, so count every Linear at 4 bytes a weight (a layer's Linears
  // become quantized during the run).
  uint64_t layer = 0, widest = 0;
  for (const LayerWeights& L : model.weights().layers) {
    uint64_t b = (L.attn_norm.size() + L.ffn_norm.size() + L.q_norm.size() + L.k_norm.size()) * f;
    for (const LayerLinear& ll : kLayerLinears) {
      const Linear& l = *(L.*ll.member);
      const uint64_t w = static_cast<uint64_t>(l.out_features() * l.in_features());
      b += w * f + l.bias_values().size() * f;
      widest = std::max(widest, w);
    }
    layer = std::max(layer, b);
  }
  const uint64_t cache = cap * kvd * 2 * f;
  const uint64_t rope = cap * hd * f;
  const uint64_t group = static_cast<uint64_t>(c.num_attention_heads / std::max<int64_t>(1, c.num_key_value_heads));
  const uint64_t act = (3 * n * h + 2 * n * qd + 2 * n * kvd + 2 * n * ff + n * std::max(h, ff) + group * n * cap) * f;
  // Four Hessians (h, q_dim, h, ff columns) in double, and SYRK's double copy of one pass's widest input.
  const uint64_t hess = hessians ? (2 * h * h + qd * qd + ff * ff) * 8 + n * std::max({h, qd, ff}) * 8 : 0;
  return layer + widest * f + cache + rope + act + hess;
}


uint64_t device_smoothing_eval_bytes(const Model& model, int64_t tokens, int64_t longest) {
  const ModelConfig& c = model.config();
  const uint64_t h = static_cast<uint64_t>(c.hidden_size), qd = static_cast<uint64_t>(c.q_dim()),
                 ff = static_cast<uint64_t>(c.intermediate_size), n = static_cast<uint64_t>(std::max<int64_t>(0, tokens));
  // x, its normed rows, o_proj's input, the attention output, the MLP's
  // input, down_proj's input, the MLP's output and the layer's output.
  const uint64_t refs = n * (6 * h + qd + ff) * 4;
  // The layer and the engine as the calibration pass has them, without Hessians.
  return refs + device_layer_pass_bytes(model, longest, false);
}




namespace {

// The device runtime's entry points of one build.
struct Build {
  std::unique_ptr<DeviceDecoder> (*make_decoder)(const Model&, int64_t, int64_t);
  std::unique_ptr<DeviceLayerPass> (*make_layer_pass)(const Model&, int64_t, int64_t);
  std::unique_ptr<DeviceSmoothingEval> (*make_smoothing_eval)(const Model&, int64_t);
  double (*read_bandwidth)(uint64_t);
};

// The build of device `kind`: Unsupported for cuda in a build without it,
// Internal for the CPU (whose runtime is rt::Model itself).
const Build& build_of(device::Kind kind, const char* what) {
  static const Build host_build{host::make_decoder, host::make_layer_pass, host::make_smoothing_eval, host::read_bandwidth};
#if QF_HAVE_CUDA
  static const Build cuda_build{cuda::make_decoder, cuda::make_layer_pass, cuda::make_smoothing_eval, cuda::read_bandwidth};
#endif
  switch (kind) {
    case device::Kind::Host: return host_build;
    case device::Kind::Cuda:
#if QF_HAVE_CUDA
      return cuda_build;
#else
      throw unsupported("--device cuda", "this build has no CUDA code");
#endif
    case device::Kind::Cpu: break;
  }
  throw Error(ErrorKind::Internal, std::string(what) + ": the CPU runs rt::Model itself, not a device build");
}

}  // namespace

std::unique_ptr<DeviceDecoder> make_device_decoder(device::Kind kind, const Model& model, int64_t capacity,
                                                   int64_t pass_tokens) {
  refuse_sparse_on_device(model);
  return build_of(kind, "make_device_decoder").make_decoder(model, capacity, pass_tokens);
}

std::unique_ptr<DeviceLayerPass> make_device_layer_pass(device::Kind kind, const Model& model, int64_t capacity,
                                                        int64_t pass_tokens) {
  refuse_sparse_on_device(model);
  return build_of(kind, "make_device_layer_pass").make_layer_pass(model, capacity, pass_tokens);
}

std::unique_ptr<DeviceSmoothingEval> make_device_smoothing_eval(device::Kind kind, const Model& model, int64_t longest) {
  refuse_sparse_on_device(model);
  return build_of(kind, "make_device_smoothing_eval").make_smoothing_eval(model, longest);
}

double device_read_bandwidth(device::Kind kind, uint64_t bytes) {
  return build_of(kind, "device_read_bandwidth").read_bandwidth(bytes);
}

}  // namespace qf::rt
