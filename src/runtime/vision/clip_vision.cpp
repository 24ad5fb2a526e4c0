// LLaVA's CLIP tower and projector on one image's [3, S, S] pixel values.
//
// hidden_states are counted as transformers counts them: [0] the embeddings
// (class embedding, then the patches in row-major order, plus position
// embeddings) after pre_layrnorm, [i] the output of encoder layer i - 1. A
// negative vision_feature_layer counts from the end (-1: the last layer);
// only the layers up to the deepest selected one run. post_layernorm feeds
// only CLIP's pooled output, which LLaVA does not read.
#include "runtime/vision/clip_vision.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "formats/safetensors.h"

namespace qf::rt {
namespace {

using vision::DenseLinear;
using vision::Norm;

const std::string kPrefix = "vision_tower.vision_model.";

struct Layer {
  Norm norm1, norm2;
  DenseLinear qkv, out, fc1, fc2;  // q, k and v stacked into one Linear
};

// A string key of the llava config itself (not of vision_config).
std::string top_string(const nlohmann::json& top, const char* key, const char* fallback, const std::string& where) {
  auto it = top.find(key);
  if (it == top.end() || it->is_null()) return fallback;
  if (!it->is_string())
    throw invalid_input(where, std::string(key) + " must be a string, got " + printable_text(it->dump()));
  return it->get<std::string>();
}

// The hidden_states index of a vision_feature_layer value.
int64_t state_index(int64_t layer, int64_t layers) { return layer < 0 ? layers + 1 + layer : layer; }

class ClipVision final : public VisionTower {
 public:
  ClipVision(const ClipVisionConfig& c, const vision::VisionTensors& t) : c_(c) {
    const int64_t E = c.hidden, p = c.patch_size, P = c.grid() * c.grid();
    const float eps = static_cast<float>(c.layer_norm_eps);
    const std::string why = "vision_config (hidden_size " + std::to_string(E) + ", intermediate_size " +
                            std::to_string(c.intermediate) + ", image_size " + std::to_string(c.image_size) +
                            ", patch_size " + std::to_string(p) + ")";
    for (int64_t l : c.feature_layers) deepest_ = std::max(deepest_, state_index(l, c.layers));
    patch_.in = 3 * p * p;
    patch_.out = E;
    patch_.w = t.get(kPrefix + "embeddings.patch_embedding.weight", {E, 3, p, p}, why);  // no bias
    cls_ = t.get(kPrefix + "embeddings.class_embedding", {E}, why);
    pos_ = t.get(kPrefix + "embeddings.position_embedding.weight", {P + 1, E}, why);
    pre_norm_ = vision::load_layer_norm(t, kPrefix + "pre_layrnorm", E, eps, why);
    for (int64_t i = 0; i < c.layers; ++i) {
      const std::string b = kPrefix + "encoder.layers." + std::to_string(i) + ".";
      if (i >= deepest_) {  // never run: only checked when present
        for (const char* n : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj"}) {
          t.check_if_present(b + n + ".weight", {E, E}, why);
          t.check_if_present(b + n + ".bias", {E}, why);
        }
        for (const char* n : {"layer_norm1", "layer_norm2"}) {
          t.check_if_present(b + n + ".weight", {E}, why);
          t.check_if_present(b + n + ".bias", {E}, why);
        }
        t.check_if_present(b + "mlp.fc1.weight", {c.intermediate, E}, why);
        t.check_if_present(b + "mlp.fc1.bias", {c.intermediate}, why);
        t.check_if_present(b + "mlp.fc2.weight", {E, c.intermediate}, why);
        t.check_if_present(b + "mlp.fc2.bias", {E}, why);
        continue;
      }
      Layer l;
      l.norm1 = vision::load_layer_norm(t, b + "layer_norm1", E, eps, why);
      l.norm2 = vision::load_layer_norm(t, b + "layer_norm2", E, eps, why);
      l.qkv.in = E;
      l.qkv.out = 3 * E;
      for (const char* n : {"q_proj", "k_proj", "v_proj"}) {
        DenseLinear part = vision::load_linear(t, b + "self_attn." + n, E, E, true, why);
        // One product for the three needs one input quantizer (vLLM fuses
        // them into qkv_proj under one scheme too).
        if (n[0] == 'q') l.qkv.act = part.act;
        else if (part.act.has_value() != l.qkv.act.has_value() ||
                 (part.act && (part.act->scheme.describe() != l.qkv.act->scheme.describe() ||
                                  part.act->scale != l.qkv.act->scale || part.act->global_scale != l.qkv.act->global_scale)))
          throw unsupported(t.where(), b + "self_attn." + n + " quantizes its input differently from q_proj; q, k "
                                       "and v share one input quantizer");
        l.qkv.w.insert(l.qkv.w.end(), part.w.begin(), part.w.end());
        l.qkv.b.insert(l.qkv.b.end(), part.b.begin(), part.b.end());
      }
      l.out = vision::load_linear(t, b + "self_attn.out_proj", E, E, true, why);
      l.fc1 = vision::load_linear(t, b + "mlp.fc1", c.intermediate, E, true, why);
      l.fc2 = vision::load_linear(t, b + "mlp.fc2", E, c.intermediate, true, why);
      layers_.push_back(std::move(l));
    }
    t.check_if_present(kPrefix + "post_layernorm.weight", {E}, why);
    t.check_if_present(kPrefix + "post_layernorm.bias", {E}, why);
    const int64_t feat = E * static_cast<int64_t>(c.feature_layers.size());
    const std::string pwhy = "vision_config.hidden_size " + std::to_string(E) + " x " +
                             std::to_string(c.feature_layers.size()) + " feature layer(s) and the text hidden_size " +
                             std::to_string(c.out_hidden);
    proj1_ = vision::load_linear(t, "multi_modal_projector.linear_1", c.out_hidden, feat, c.projector_bias, pwhy);
    proj2_ =
        vision::load_linear(t, "multi_modal_projector.linear_2", c.out_hidden, c.out_hidden, c.projector_bias, pwhy);
  }

  int64_t hidden() const override { return c_.out_hidden; }

  ImageEmbedding forward(const PixelValues& pv, ThreadPool& pool) const override {
    const int64_t E = c_.hidden, p = c_.patch_size, g = c_.grid(), S = c_.image_size;
    if (pv.shape != Shape{3, S, S} || pv.values.size() != static_cast<size_t>(3 * S * S))
      throw invalid_input("llava vision tower", "pixel values of shape " + shape_str(pv.shape) +
                                                    " are not the [3, " + std::to_string(S) + ", " + std::to_string(S) +
                                                    "] image vision_config.image_size asks for (check crop_size in "
                                                    "preprocessor_config.json)");
    // The Conv2d patch embedding as one product over flattened patches (c, y, x).
    const int64_t P = g * g, T = P + 1;
    std::vector<float> patches(static_cast<size_t>(P * patch_.in));
    for (int64_t gy = 0; gy < g; ++gy)
      for (int64_t gx = 0; gx < g; ++gx) {
        float* dst = patches.data() + (gy * g + gx) * patch_.in;
        for (int64_t c = 0; c < 3; ++c)
          for (int64_t y = 0; y < p; ++y)
            for (int64_t x = 0; x < p; ++x) *dst++ = pv.values[(c * S + gy * p + y) * S + gx * p + x];
      }
    std::vector<float> x(static_cast<size_t>(T * E));
    std::copy(cls_.begin(), cls_.end(), x.begin());
    vision::linear_forward(patch_, patches.data(), P, x.data() + E, pool);
    for (size_t i = 0; i < x.size(); ++i) x[i] += pos_[i];
    vision::layer_norm_rows(pre_norm_, x.data(), T, E, x.data());

    std::vector<std::vector<float>> states{x};  // hidden_states[0 .. deepest]
    std::vector<float> h(x.size()), qkv(static_cast<size_t>(T * 3 * E)), att(x.size()), tmp(x.size());
    std::vector<float> mlp(static_cast<size_t>(T * c_.intermediate));
    const float scale = 1.0f / std::sqrt(static_cast<float>(c_.head_dim()));
    const std::vector<int64_t> whole{0, T};
    for (const Layer& l : layers_) {
      vision::layer_norm_rows(l.norm1, x.data(), T, E, h.data());
      vision::linear_forward(l.qkv, h.data(), T, qkv.data(), pool);
      vision::attention(qkv.data(), qkv.data() + E, qkv.data() + 2 * E, 3 * E, T, c_.heads, c_.head_dim(), scale,
                        whole, att.data(), pool);
      vision::linear_forward(l.out, att.data(), T, tmp.data(), pool);
      for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
      vision::layer_norm_rows(l.norm2, x.data(), T, E, h.data());
      vision::linear_forward(l.fc1, h.data(), T, mlp.data(), pool);
      vision::activate(c_.act, mlp.data(), static_cast<int64_t>(mlp.size()));
      vision::linear_forward(l.fc2, mlp.data(), T, tmp.data(), pool);
      for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
      states.push_back(x);
    }
    // The selected states side by side, the CLS row dropped ("default").
    const int64_t first = c_.keep_cls ? 0 : 1, rows = T - first, L = static_cast<int64_t>(c_.feature_layers.size());
    std::vector<float> feats(static_cast<size_t>(rows * E * L));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < L; ++j) {
        const std::vector<float>& s = states[static_cast<size_t>(state_index(c_.feature_layers[j], c_.layers))];
        std::copy_n(s.data() + (r + first) * E, E, feats.data() + (r * L + j) * E);
      }
    std::vector<float> mid(static_cast<size_t>(rows * c_.out_hidden));
    vision::linear_forward(proj1_, feats.data(), rows, mid.data(), pool);
    vision::activate(c_.projector_act, mid.data(), static_cast<int64_t>(mid.size()));
    ImageEmbedding e;
    e.rows.resize(mid.size());
    vision::linear_forward(proj2_, mid.data(), rows, e.rows.data(), pool);
    e.n_rows = rows;
    e.hidden = c_.out_hidden;
    e.grid_t = 1;
    e.grid_h = 1;
    e.grid_w = rows;
    return e;
  }

 private:
  ClipVisionConfig c_;
  int64_t deepest_ = 0;
  DenseLinear patch_;
  std::vector<float> cls_, pos_;
  Norm pre_norm_;
  std::vector<Layer> layers_;
  DenseLinear proj1_, proj2_;
};

}  // namespace

ClipVisionConfig parse_clip_vision_config(const ModelConfig& cfg, const std::string& where) {
  const nlohmann::json& vc = cfg.vlm->vision;
  const nlohmann::json& top = cfg.raw;
  ClipVisionConfig c;
  const std::string vt = vision::config_string(vc, "model_type", "clip_vision_model", where);
  if (vt != "clip_vision_model")
    throw unsupported(where, "vision_config.model_type '" + printable_text(vt) +
                                 "': only CLIP vision towers (clip_vision_model) are supported for LLaVA");
  c.hidden = vision::config_int(vc, "hidden_size", c.hidden, where);
  c.intermediate = vision::config_int(vc, "intermediate_size", c.intermediate, where);
  c.layers = vision::config_int(vc, "num_hidden_layers", c.layers, where);
  c.heads = vision::config_int(vc, "num_attention_heads", c.heads, where);
  c.image_size = vision::config_int(vc, "image_size", c.image_size, where);
  c.patch_size = vision::config_int(vc, "patch_size", c.patch_size, where);
  c.layer_norm_eps = vision::config_number(vc, "layer_norm_eps", c.layer_norm_eps, where);
  c.act = vision::parse_activation(vision::config_string(vc, "hidden_act", "quick_gelu", where), where,
                                   "vision_config.hidden_act");
  if (vision::config_int(vc, "num_channels", 3, where) != 3)
    throw unsupported(where, "vision_config.num_channels must be 3 (images are RGB)");
  if (c.hidden % c.heads != 0)
    throw invalid_input(where, "vision_config.hidden_size " + std::to_string(c.hidden) +
                                   " is not a multiple of num_attention_heads " + std::to_string(c.heads));
  if (c.image_size % c.patch_size != 0)
    throw invalid_input(where, "vision_config.image_size " + std::to_string(c.image_size) +
                                   " is not a multiple of patch_size " + std::to_string(c.patch_size));

  c.feature_layers.clear();
  auto fl = top.find("vision_feature_layer");
  if (fl == top.end() || fl->is_null()) {
    c.feature_layers = {-2};
  } else if (fl->is_number_integer()) {
    c.feature_layers = {fl->get<int64_t>()};
  } else if (fl->is_array() && !fl->empty()) {
    for (const auto& e : *fl) {
      if (!e.is_number_integer())
        throw invalid_input(where, "vision_feature_layer must be an integer or a list of integers, got " +
                                       printable_text(fl->dump()));
      c.feature_layers.push_back(e.get<int64_t>());
    }
  } else {
    throw invalid_input(where, "vision_feature_layer must be an integer or a list of integers, got " +
                                   printable_text(fl->dump()));
  }
  for (int64_t l : c.feature_layers)
    if (l < -(c.layers + 1) || l > c.layers)
      throw invalid_input(where, "vision_feature_layer " + std::to_string(l) + " is outside the " +
                                     std::to_string(c.layers + 1) + " hidden states of a " + std::to_string(c.layers) +
                                     "-layer vision tower");
  const std::string strategy = top_string(top, "vision_feature_select_strategy", "default", where);
  if (strategy != "default" && strategy != "full")
    throw unsupported(where, "vision_feature_select_strategy '" + printable_text(strategy) +
                                 "' (supported: default, full)");
  c.keep_cls = strategy == "full";
  c.projector_act = vision::parse_activation(top_string(top, "projector_hidden_act", "gelu", where), where,
                                             "projector_hidden_act");
  if (auto b = top.find("multimodal_projector_bias"); b != top.end() && !b->is_null()) {
    if (!b->is_boolean())
      throw invalid_input(where, "multimodal_projector_bias must be true or false, got " + printable_text(b->dump()));
    c.projector_bias = b->get<bool>();
  }
  c.out_hidden = cfg.hidden_size;
  return c;
}

std::unique_ptr<VisionTower> load_clip_vision(const ModelConfig& cfg, const Checkpoint& ck, const std::string& where) {
  const ClipVisionConfig c = parse_clip_vision_config(cfg, where);
  vision::check_layer_count(ck, kPrefix + "encoder.layers.", c.layers, where, "vision_config.num_hidden_layers");
  return std::make_unique<ClipVision>(c, vision::VisionTensors(cfg, ck, where));
}

}  // namespace qf::rt
