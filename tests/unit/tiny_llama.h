// A tiny Llama-family model written as a Hugging Face folder from a Spec
// (every architecture parameter the runtime claims: RoPE scaling, biases,
// sliding windows, qwen3 q/k norm, tied embeddings, f32/f16/bf16 weights),
// and the test reference's view of it (reference_llama.h), taken from the
// Spec alone, never from the runtime's parsed config.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "formats/safetensors.h"
#include "reference_llama.h"
#include "test_util.h"

namespace qf::test::tiny {

using nlohmann::json;
namespace fs = std::filesystem;
namespace reference = test::reference;
using Vec = reference::Vec;

struct Spec {
  std::string model_type = "llama";
  int64_t hidden = 64, layers = 2, heads = 4, kv_heads = 2, head_dim = 16;
  bool write_head_dim = false;  // write "head_dim" (needed when head_dim != hidden / heads)
  int64_t inter = 96, vocab = 64, max_pos = 64;
  // nullopt: the key is left out of config.json and the HF default applies.
  std::optional<double> theta, eps;
  // RoPE scaling as the reference applies it; written as rope_scaling when type is set.
  std::string rope_type;  // "", "linear", "llama3"
  double rope_factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_pos = 0;
  bool attention_bias = false, mlp_bias = false, tie = false;
  std::optional<int64_t> sliding_window, max_window_layers;
  std::optional<bool> use_sliding_window;
  DType dtype = DType::F32;
  uint32_t seed = 1;
  // Scale of the q/k projections: large enough that attention is far from
  // uniform, so RoPE, windows and masks change the output visibly.
  double qk_scale = 1.4;
  // Embedding values are uniform in [-embed_scale, embed_scale]; tiny values
  // make rms_norm_eps matter in the first layer's norm.
  double embed_scale = 1.0;

  int64_t q_dim() const { return heads * head_dim; }
  int64_t kv_dim() const { return kv_heads * head_dim; }
  double theta_value() const { return theta.value_or(10000.0); }
  double eps_value() const { return eps.value_or(1e-6); }
  // HF: q/k/v biases for qwen2 always and for llama-style models with
  // attention_bias; o_proj bias only for the latter (qwen2 has none).
  bool qkv_bias() const { return model_type == "qwen2" || attention_bias; }
  bool o_bias() const { return model_type != "qwen2" && attention_bias; }
  bool qk_norm() const { return model_type == "qwen3"; }
  // The window of a layer per the HF modeling code (0: full attention).
  int64_t window(int64_t layer) const {
    if (!sliding_window) return 0;
    if (model_type == "mistral") return *sliding_window;
    if ((model_type == "qwen2" || model_type == "qwen3") && use_sliding_window.value_or(false) &&
        layer >= max_window_layers.value_or(28))  // Qwen2Config / Qwen3Config default
      return *sliding_window;
    return 0;
  }
};

inline json config_json(const Spec& s) {
  json c = {
      {"architectures", {"X"}},
      {"model_type", s.model_type},
      {"hidden_size", s.hidden},
      {"num_hidden_layers", s.layers},
      {"num_attention_heads", s.heads},
      {"num_key_value_heads", s.kv_heads},
      {"intermediate_size", s.inter},
      {"vocab_size", s.vocab},
      {"max_position_embeddings", s.max_pos},
      {"tie_word_embeddings", s.tie},
      {"torch_dtype", s.dtype == DType::F32 ? "float32" : s.dtype == DType::F16 ? "float16" : "bfloat16"},
  };
  if (s.write_head_dim) c["head_dim"] = s.head_dim;
  if (s.theta) c["rope_theta"] = *s.theta;
  if (s.eps) c["rms_norm_eps"] = *s.eps;
  if (s.attention_bias) c["attention_bias"] = true;
  if (s.mlp_bias) c["mlp_bias"] = true;
  if (s.sliding_window) c["sliding_window"] = *s.sliding_window;
  if (s.use_sliding_window) c["use_sliding_window"] = *s.use_sliding_window;
  if (s.max_window_layers) c["max_window_layers"] = *s.max_window_layers;
  if (s.rope_type == "linear") {
    c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", s.rope_factor}};
  } else if (s.rope_type == "llama3") {
    c["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", s.rope_factor},
                         {"low_freq_factor", s.low_freq_factor},
                         {"high_freq_factor", s.high_freq_factor},
                         {"original_max_position_embeddings", s.original_max_pos}};
  }
  return c;
}

struct TensorSpec {
  std::string name;
  Shape shape;
  double scale;   // values uniform in [center - scale, center + scale]
  double center;
};

inline std::vector<TensorSpec> tensor_specs(const Spec& s) {
  std::vector<TensorSpec> t;
  const int64_t h = s.hidden, qd = s.q_dim(), kvd = s.kv_dim(), ff = s.inter;
  // Uniform(-a, a) has std a / sqrt(3); a = k * sqrt(3 / fan_in) gives outputs
  // of std ~k for unit-RMS inputs.
  auto a = [](double k, int64_t fan_in) { return k * std::sqrt(3.0 / static_cast<double>(fan_in)); };
  t.push_back({"model.embed_tokens.weight", {s.vocab, h}, s.embed_scale, 0.0});
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t.push_back({p + "input_layernorm.weight", {h}, 0.3, 1.0});
    t.push_back({p + "post_attention_layernorm.weight", {h}, 0.3, 1.0});
    t.push_back({p + "self_attn.q_proj.weight", {qd, h}, a(s.qk_scale, h), 0.0});
    t.push_back({p + "self_attn.k_proj.weight", {kvd, h}, a(s.qk_scale, h), 0.0});
    t.push_back({p + "self_attn.v_proj.weight", {kvd, h}, a(1.0, h), 0.0});
    t.push_back({p + "self_attn.o_proj.weight", {h, qd}, a(0.7, qd), 0.0});
    if (s.qkv_bias()) {
      t.push_back({p + "self_attn.q_proj.bias", {qd}, 0.5, 0.0});
      t.push_back({p + "self_attn.k_proj.bias", {kvd}, 0.5, 0.0});
      t.push_back({p + "self_attn.v_proj.bias", {kvd}, 0.5, 0.0});
    }
    if (s.o_bias()) t.push_back({p + "self_attn.o_proj.bias", {h}, 0.3, 0.0});
    if (s.qk_norm()) {
      t.push_back({p + "self_attn.q_norm.weight", {s.head_dim}, 0.5, 1.2});
      t.push_back({p + "self_attn.k_norm.weight", {s.head_dim}, 0.5, 1.2});
    }
    t.push_back({p + "mlp.gate_proj.weight", {ff, h}, a(1.0, h), 0.0});
    t.push_back({p + "mlp.up_proj.weight", {ff, h}, a(1.0, h), 0.0});
    t.push_back({p + "mlp.down_proj.weight", {h, ff}, a(0.7, ff), 0.0});
    if (s.mlp_bias) {
      t.push_back({p + "mlp.gate_proj.bias", {ff}, 0.3, 0.0});
      t.push_back({p + "mlp.up_proj.bias", {ff}, 0.3, 0.0});
      t.push_back({p + "mlp.down_proj.bias", {h}, 0.3, 0.0});
    }
  }
  t.push_back({"model.norm.weight", {h}, 0.3, 1.0});
  if (!s.tie) t.push_back({"lm_head.weight", {s.vocab, h}, a(2.0, h), 0.0});
  return t;
}

// Deterministic uniform numbers in [-1, 1), independent of the standard library.
struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed * 0x9E3779B97F4A7C15ull + 12345) {}
  double next() {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return static_cast<double>(state >> 11) * (2.0 / 9007199254740992.0) - 1.0;
  }
};

// Writes config.json and model.safetensors. `omit` leaves tensors out;
// `reshape` writes a tensor with another shape (random values).
inline void write_model(const Spec& s, const fs::path& dir, const std::set<std::string>& omit = {},
                 const std::map<std::string, Shape>& reshape = {}, json config = nullptr) {
  test::write_file(dir / "config.json", (config.is_null() ? config_json(s) : config).dump(2));
  Rng rng(s.seed);
  SafetensorsWriter w(dir);
  for (const TensorSpec& ts : tensor_specs(s)) {
    Shape shape = ts.shape;
    if (auto it = reshape.find(ts.name); it != reshape.end()) shape = it->second;
    Tensor t = Tensor::zeros(DType::F32, shape);
    float* d = t.mutable_data_as<float>();
    for (int64_t i = 0; i < t.numel(); ++i) d[i] = static_cast<float>(ts.center + ts.scale * rng.next());
    if (omit.count(ts.name)) continue;
    w.add(ts.name, s.dtype == DType::F32 ? t : t.to(s.dtype));
  }
  w.finish();
}

inline Vec ref_inv_freq(const Spec& s) {
  const int64_t half = s.head_dim / 2;
  Vec f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    f[static_cast<size_t>(i)] = std::pow(s.theta_value(), -2.0 * static_cast<double>(i) / static_cast<double>(s.head_dim));
  if (s.rope_type == "linear") {
    for (double& x : f) x /= s.rope_factor;
  } else if (s.rope_type == "llama3") {
    const double orig = static_cast<double>(s.original_max_pos);
    const double lo = s.low_freq_factor, hi = s.high_freq_factor;
    for (double& x : f) {
      const double wavelen = 2.0 * M_PI / x;
      if (wavelen < orig / hi) continue;
      if (wavelen > orig / lo) {
        x /= s.rope_factor;
      } else {
        const double smooth = (orig / wavelen - lo) / (hi - lo);
        x = (1.0 - smooth) * x / s.rope_factor + smooth * x;
      }
    }
  }
  return f;
}

// The reference's view of a Spec: every parameter from the test's own Spec.
inline reference::Arch ref_arch(const Spec& s) {
  reference::Arch a;
  a.hidden = s.hidden, a.layers = s.layers, a.heads = s.heads, a.kv_heads = s.kv_heads, a.head_dim = s.head_dim;
  a.inter = s.inter, a.vocab = s.vocab, a.eps = s.eps_value();
  a.inv_freq = ref_inv_freq(s);
  a.inv_freq_ulps = reference::rope_inv_freq_ulps(s.theta_value(), s.head_dim, !s.rope_type.empty());
  a.qk_norm = s.qk_norm(), a.tie = s.tie;
  for (int64_t l = 0; l < s.layers; ++l) a.window.push_back(s.window(l));
  return a;
}

}  // namespace qf::test::tiny
