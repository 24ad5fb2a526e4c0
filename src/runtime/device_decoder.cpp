// Which build runs the device runtime's pieces, and how much device memory they need.
#include <algorithm>
#include <string>

#include "core/error.h"
#include "device/rows.h"
#include "runtime/device_runtime.h"
#include "runtime/guarded_device.h"
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

// Every Linear of a layer the device holds: the dense ones, or a sparse
// layer's attention, router, experts, shared expert and its gate.
template <class F>
void each_linear(const ModelConfig& c, const LayerWeights& L, int64_t li, F f) {
  for (const LayerLinear& ll : kLayerLinears)
    if (L.*ll.member) f(*(L.*ll.member));
  if (!L.sparse()) return;
  for (const LayerLinearId& id : layer_linears(c, li))
    if (id.expert != kNoExpert) f(*layer_linear(L, id));
  f(*L.moe.router);
  if (L.moe.shared_gate) f(*L.moe.shared_gate);
}

// The widest expert of a sparse layer (its intermediate width, the shared
// expert's included); 0 for a dense layer.
uint64_t expert_ff(const ModelConfig& c, const LayerWeights& L) {
  if (!L.sparse()) return 0;
  return static_cast<uint64_t>(std::max(c.moe_intermediate_size, L.moe.shared.gate ? c.shared_expert_intermediate_size : 0));
}

// The device bytes of moe_device.h's buffers for n tokens of a sparse layer:
// router logits, choices and weights, the expert-ordered rows and weights,
// one expert's input, gate, up and output, the shared expert's gate.
uint64_t moe_scratch_bytes(const ModelConfig& c, uint64_t ff, uint64_t n) {
  const uint64_t h = static_cast<uint64_t>(c.hidden_size), ne = static_cast<uint64_t>(c.num_experts),
                 k = static_cast<uint64_t>(c.num_experts_per_tok);
  return n * ne * 4 + n * k * (4 + 4 + 8 + 4) + n * (2 * h + 2 * ff + 1) * 4;
}

}  // namespace

void refuse_sparse_on_device(const Model& model, const std::string& what) {
  if (model.config().is_moe())
    throw unsupported(what, "the smoothing searches' device evaluation runs dense layers only, and this is a "
                            "mixture-of-experts model (model_type '" + model.config().model_type +
                            "'); quantize with --device cpu");
}

uint64_t device_decoder_bytes(const Model& model, int64_t capacity) {
  const ModelConfig& c = model.config();
  const ModelWeights& w = model.weights();
  const uint64_t f = 4, n = static_cast<uint64_t>(std::min(capacity, kDevicePassTokens)), cap = static_cast<uint64_t>(capacity);
  const uint64_t h = static_cast<uint64_t>(c.hidden_size), qd = static_cast<uint64_t>(c.q_dim()),
                 kvd = static_cast<uint64_t>(c.kv_dim()), ff = static_cast<uint64_t>(c.intermediate_size),
                 V = static_cast<uint64_t>(c.vocab_size), hd = static_cast<uint64_t>(c.head_dim);
  uint64_t weights = stored_bytes(*w.lm_head) + h * f, widest = widened(*w.lm_head) ? V * h : 0, moe_ff = 0;
  bool sparse = false;
  for (size_t li = 0; li < w.layers.size(); ++li) {
    const LayerWeights& L = w.layers[li];
    weights += (L.attn_norm.size() + L.ffn_norm.size() + L.q_norm.size() + L.k_norm.size()) * f;
    each_linear(c, L, static_cast<int64_t>(li), [&](const Linear& l) {
      weights += stored_bytes(l);
      if (widened(l)) widest = std::max<uint64_t>(widest, static_cast<uint64_t>(l.out_features() * l.in_features()));
    });
    sparse = sparse || L.sparse();
    moe_ff = std::max(moe_ff, expert_ff(c, L));
  }
  const uint64_t cache = static_cast<uint64_t>(c.num_hidden_layers) * cap * kvd * 2 * f;
  const uint64_t rope = cap * hd * f;  // cos and sin, hd / 2 each
  const uint64_t group = static_cast<uint64_t>(c.num_attention_heads / std::max<int64_t>(1, c.num_key_value_heads));
  // x, xn, y; q, att; k, v; gate, up; one quantized input; scores with the
  // softmax's lanes; the norm's lanes; logits.
  const uint64_t act = (3 * n * h + 2 * n * qd + 2 * n * kvd + 2 * n * ff + n * std::max({h, ff, moe_ff}) + group * n * (cap + device::kLanes + 1) + n * (2 * device::kLanes + 1) + n * V) * f;
  return weights + widest * f + cache + rope + act + (sparse ? moe_scratch_bytes(c, moe_ff, n) : 0);
}

uint64_t device_layer_pass_bytes(const Model& model, int64_t capacity, bool hessians) {
  const ModelConfig& c = model.config();
  const uint64_t f = 4, n = static_cast<uint64_t>(std::min(capacity, kDevicePassTokens)), cap = static_cast<uint64_t>(capacity);
  const uint64_t h = static_cast<uint64_t>(c.hidden_size), qd = static_cast<uint64_t>(c.q_dim()),
                 kvd = static_cast<uint64_t>(c.kv_dim()), ff = static_cast<uint64_t>(c.intermediate_size),
                 hd = static_cast<uint64_t>(c.head_dim);
  // The layer with the most weight bytes; quantized Linears are f32 on the
  // device, so count every Linear at 4 bytes a weight (a layer's Linears
  // become quantized during the run). The Hessians held at once: a dense
  // layer's four (h, q_dim, h, ff columns), a sparse layer's attention pair
  // (h, q_dim) or one expert's two (h, its ff), in double, with SYRK's double
  // copy of one pass's widest input.
  uint64_t layer = 0, widest = 0, hess = 0, moe_ff = 0;
  bool sparse = false;
  const auto& layers = model.weights().layers;
  for (size_t li = 0; li < layers.size(); ++li) {
    const LayerWeights& L = layers[li];
    uint64_t b = (L.attn_norm.size() + L.ffn_norm.size() + L.q_norm.size() + L.k_norm.size()) * f;
    each_linear(c, L, static_cast<int64_t>(li), [&](const Linear& l) {
      const uint64_t w = static_cast<uint64_t>(l.out_features() * l.in_features());
      b += w * f + l.bias_values().size() * f;
      widest = std::max(widest, w);
    });
    layer = std::max(layer, b);
    const uint64_t eff = expert_ff(c, L);
    const uint64_t held = L.sparse() ? (h * h + std::max(qd * qd, eff * eff)) * 8 + n * std::max({h, qd, eff}) * 8
                                     : (2 * h * h + qd * qd + ff * ff) * 8 + n * std::max({h, qd, ff}) * 8;
    hess = std::max(hess, held);
    sparse = sparse || L.sparse();
    moe_ff = std::max(moe_ff, eff);
  }
  const uint64_t cache = cap * kvd * 2 * f;
  const uint64_t rope = cap * hd * f;
  const uint64_t group = static_cast<uint64_t>(c.num_attention_heads / std::max<int64_t>(1, c.num_key_value_heads));
  const uint64_t act = (3 * n * h + 2 * n * qd + 2 * n * kvd + 2 * n * ff + n * std::max({h, ff, moe_ff}) + group * n * (cap + device::kLanes + 1) + n * (2 * device::kLanes + 1)) * f;
  // A sparse layer's buffers and one sequence's rows of an expert (run_expert).
  const uint64_t moe = sparse ? moe_scratch_bytes(c, moe_ff, n) + cap * h * f : 0;
  return layer + widest * f + cache + rope + act + moe + (hessians ? hess : 0);
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
  std::unique_ptr<DeviceLayerPass> (*make_layer_pass)(const Model&, int64_t, int64_t, bool);
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
  const Build& b = build_of(kind, "make_device_decoder");
  return guard_device(kind, guarded_call(kind, [&] { return b.make_decoder(model, capacity, pass_tokens); }));
}

std::unique_ptr<DeviceLayerPass> make_device_layer_pass(device::Kind kind, const Model& model, int64_t capacity,
                                                        int64_t pass_tokens, bool bf16) {
  const Build& b = build_of(kind, "make_device_layer_pass");
  return guard_device(kind, guarded_call(kind, [&] { return b.make_layer_pass(model, capacity, pass_tokens, bf16); }));
}

std::unique_ptr<DeviceSmoothingEval> make_device_smoothing_eval(device::Kind kind, const Model& model, int64_t longest) {
  refuse_sparse_on_device(model, "the smoothing searches with --device " + std::string(device::kind_name(kind)));
  const Build& b = build_of(kind, "make_device_smoothing_eval");
  return guard_device(kind, guarded_call(kind, [&] { return b.make_smoothing_eval(model, longest); }));
}

double device_read_bandwidth(device::Kind kind, uint64_t bytes) {
  const Build& b = build_of(kind, "device_read_bandwidth");
  return guarded_call(kind, [&] { return b.read_bandwidth(bytes); });
}

}  // namespace qf::rt
