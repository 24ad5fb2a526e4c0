#include "convert/gguf_mmproj.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/gguf/gguf.h"
#include "formats/hf/model_tensors.h"
#include "formats/safetensors.h"

namespace qf {
namespace {

using json = nlohmann::json;

// Reads vision_config (or the top-level config) values with the defaults of
// transformers' config classes, naming the key on a wrong type.
struct ConfigValues {
  const json& j;
  std::string where;   // "<dir>/config.json"
  std::string prefix;  // "vision_config." or ""

  const json* get(const char* k) const {
    auto it = j.find(k);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] void bad(const char* k, const std::string& want) const {
    throw invalid_input(where, prefix + k + " must be " + want + ", got " + j.at(k).dump());
  }
  int64_t integer(const char* k, int64_t def) const {
    const json* v = get(k);
    if (!v) return def;
    if (!v->is_number_integer() || v->get<int64_t>() <= 0 || v->get<int64_t>() > (int64_t{1} << 24))
      bad(k, "a positive integer");
    return v->get<int64_t>();
  }
  double number(const char* k, double def) const {
    const json* v = get(k);
    if (!v) return def;
    if (!v->is_number() || !(v->get<double>() > 0) || !std::isfinite(v->get<double>())) bad(k, "a positive number");
    return v->get<double>();
  }
  std::string text(const char* k, const std::string& def) const {
    const json* v = get(k);
    if (!v) return def;
    if (!v->is_string()) bad(k, "a string");
    return v->get<std::string>();
  }
};

// clip.cpp's activations: use_gelu (ggml_gelu), use_silu, else quick GELU.
void set_activation(MmprojSpec& s, const std::string& act, const std::string& where, const std::string& key) {
  if (act == "gelu" || act == "gelu_pytorch_tanh" || act == "gelu_new") s.use_gelu = true;
  else if (act == "silu") s.use_silu = true;
  else if (act != "quick_gelu")
    throw unsupported(where, key + " '" + act + "' has no counterpart in llama.cpp's CLIP encoder (gelu, silu, quick_gelu)");
}

// image_mean / image_std of preprocessor_config.json; without the file, the
// defaults of both processors (OpenAI CLIP's).
void read_image_stats(MmprojSpec& s, const std::filesystem::path& dir) {
  s.image_mean = {0.48145466f, 0.4578275f, 0.40821073f};
  s.image_std = {0.26862954f, 0.26130258f, 0.27577711f};
  const std::filesystem::path p = dir / "preprocessor_config.json";
  if (!std::filesystem::exists(p)) return;
  json j;
  try {
    std::ifstream in(p);
    if (!in) throw io_error(p.string(), "cannot be read");
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw invalid_input(p.string(), std::string("is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw invalid_input(p.string(), "must hold a JSON object");
  for (auto [key, out] : {std::pair<const char*, std::vector<float>*>{"image_mean", &s.image_mean}, {"image_std", &s.image_std}}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    std::vector<float> v;
    if (it->is_array() && it->size() == 3)
      for (const json& e : *it)
        if (e.is_number() && std::isfinite(e.get<double>())) v.push_back(e.get<float>());
    if (v.size() != 3 || (std::string(key) == "image_std" && (v[0] <= 0 || v[1] <= 0 || v[2] <= 0)))
      throw invalid_input(p.string(), std::string(key) + " must be a list of 3 numbers (one per RGB channel" +
                                          (std::string(key) == "image_std" ? ", positive" : "") + "), got " + it->dump());
    *out = v;
  }
}

// Collects the plan's tensors and checks each source against the checkpoint.
struct Planner {
  const Checkpoint& ck;
  std::string where;
  MmprojSpec& s;
  std::set<std::string> used;
  bool f16 = true;  // every source matrix is f16

  const TensorInfo& source(const std::string& name, const Shape& shape, const std::string& why) {
    if (!ck.contains(name)) throw not_found(where, "vision tensor '" + name + "' is missing" + (why.empty() ? "" : " (" + why + ")"));
    const TensorInfo& ti = ck.info(name);
    if (!dtype_is_float(ti.dtype))
      throw invalid_input(where, "vision tensor '" + name + "' is " + dtype_name(ti.dtype) + ", not a float type");
    if (ti.shape != shape)
      throw invalid_input(where, "vision tensor '" + name + "' has shape " + shape_str(ti.shape) + ", but the config implies " +
                                     shape_str(shape) + (why.empty() ? "" : " (" + why + ")"));
    used.insert(name);
    return ti;
  }
  static std::vector<uint64_t> ne_of(const Shape& shape) { return {shape.rbegin(), shape.rend()}; }

  // A 1-D tensor (norm, bias, embedding row): always f32.
  void vector(const std::string& out, const std::string& src, int64_t n, const std::string& why = "") {
    source(src, {n}, why);
    s.tensors.push_back({out, ggml_type::F32, {static_cast<uint64_t>(n)}, {MmprojSource::Kind::Whole, src, 0, 0}});
  }
  // A matrix: f16 or f32, decided once all are known (finish()).
  void matrix(const std::string& out, const std::string& src, const Shape& shape, const std::string& why = "") {
    const TensorInfo& ti = source(src, shape, why);
    if (ti.dtype != DType::F16) f16 = false;
    s.tensors.push_back({out, ggml_type::F16, ne_of(shape), {MmprojSource::Kind::Whole, src, 0, 0}});
  }
  // Rows [part * n, (part + 1) * n) of a fused [3n, ...] tensor.
  void third(const std::string& out, const std::string& src, const Shape& fused, int part) {
    const TensorInfo& ti = source(src, fused, "");
    Shape piece = fused;
    piece[0] /= 3;
    const bool vec = fused.size() == 1;
    if (!vec && ti.dtype != DType::F16) f16 = false;
    s.tensors.push_back({out, vec ? ggml_type::F32 : ggml_type::F16, ne_of(piece),
                         {MmprojSource::Kind::Rows, src, part * piece[0], (part + 1) * piece[0]}});
  }
  // A placeholder of zeros (matrices declared f16 follow the matrices' type).
  void zeros(const std::string& out, uint32_t type, const Shape& shape) {
    s.tensors.push_back({out, type, ne_of(shape), {MmprojSource::Kind::Zeros, "", 0, 0}});
  }
  // The matrices' type: the checkpoint's f16, or f32 for bf16 and f32 sources
  // (llama.cpp's CLIP encoder takes f16 and f32 weights). Convolution kernels
  // are f16 in any case.
  void finish(const std::set<std::string>& conv) {
    s.file_type = f16 ? 1 : 0;
    for (MmprojTensor& t : s.tensors)
      if (t.ne.size() >= 2 && t.type == ggml_type::F16 && !conv.count(t.name))
        t.type = f16 ? ggml_type::F16 : ggml_type::F32;
  }
  // Every vision tensor of the checkpoint is used or explicitly skipped.
  template <typename Skip>
  void check_unused(const Skip& skip, const std::string& what) const {
    for (const std::string& n : ck.names())
      if (is_vision_tensor(n) && !used.count(n) && !skip(n))
        throw invalid_input(where, "vision tensor '" + n + "' has no place in " + what);
  }
};

MmprojSpec plan_qwen2_vl(const ModelConfig& c, const Checkpoint& ck, const std::filesystem::path& dir) {
  const std::string where = dir.string(), cfg = (dir / "config.json").string();
  const ConfigValues v{c.vlm->vision, cfg, "vision_config."};
  const int64_t depth = v.integer("depth", 32), E = v.integer("embed_dim", 1280), heads = v.integer("num_heads", 16);
  const double ratio = v.number("mlp_ratio", 4.0);
  const int64_t patch = v.integer("patch_size", v.integer("spatial_patch_size", 14));
  const int64_t temporal = v.integer("temporal_patch_size", 2), merge = v.integer("spatial_merge_size", 2);
  const int64_t channels = v.integer("in_chans", v.integer("in_channels", 3));
  const int64_t out_hidden = v.integer("hidden_size", c.hidden_size);
  const int64_t F = static_cast<int64_t>(static_cast<double>(E) * ratio);
  if (E % heads != 0 || (E / heads) % 4 != 0)
    throw invalid_input(cfg, "vision_config.embed_dim " + std::to_string(E) + " must be num_heads (" + std::to_string(heads) +
                                 ") times a head width divisible by 4 (the vision RoPE's four sections)");
  if (temporal != 2 || merge != 2 || channels != 3)
    throw unsupported(cfg, "llama.cpp's Qwen2-VL encoder takes RGB images (in_chans 3) in temporal patches of 2 merged 2x2 "
                           "(temporal_patch_size 2, spatial_merge_size 2); this model has in_chans " + std::to_string(channels) +
                           ", temporal_patch_size " + std::to_string(temporal) + ", spatial_merge_size " + std::to_string(merge));
  if (out_hidden != c.hidden_size)
    throw invalid_input(cfg, "vision_config.hidden_size " + std::to_string(out_hidden) + " (the merger's output) differs from the "
                                 "language model's hidden_size " + std::to_string(c.hidden_size));

  MmprojSpec s;
  s.description = "image encoder for Qwen2-VL";
  s.projector_type = "qwen2vl_merger";
  s.qwen2vl_merger = true;
  set_activation(s, v.text("hidden_act", "quick_gelu"), cfg, "vision_config.hidden_act");
  // clip.cpp sizes its first compute buffer for image_size x image_size and
  // runs each image at its own resolution (rounded up to 2 x patch_size); 40
  // patches a side is a multiple of the 2x2 merge.
  s.image_size = static_cast<uint32_t>(patch * 40);
  s.patch_size = static_cast<uint32_t>(patch);
  s.embedding_length = static_cast<uint32_t>(E);
  s.feed_forward_length = static_cast<uint32_t>(F);
  s.head_count = static_cast<uint32_t>(heads);
  s.block_count = static_cast<uint32_t>(depth);
  s.projection_dim = static_cast<uint32_t>(c.hidden_size);
  s.layer_norm_epsilon = 1e-6f;  // the vision blocks' and the merger's LayerNorm(eps=1e-6)
  read_image_stats(s, dir);

  Planner p{ck, where, s, {}, true};
  const std::string conv = "visual.patch_embed.proj.weight";
  const Shape conv_shape{E, 3, 2, patch, patch};
  p.source(conv, conv_shape, "vision_config embed_dim, in_chans, temporal_patch_size, patch_size");
  // The Conv3d over two frames is two Conv2d kernels summed; clip.cpp holds
  // them as patch_embd.weight (frame 0) and patch_embd.weight.1 (frame 1).
  s.tensors.push_back({"v.patch_embd.weight", ggml_type::F16, {uint64_t(patch), uint64_t(patch), 3, uint64_t(E)},
                       {MmprojSource::Kind::Temporal, conv, 0, 1}});
  s.tensors.push_back({"v.patch_embd.weight.1", ggml_type::F16, {uint64_t(patch), uint64_t(patch), 3, uint64_t(E)},
                       {MmprojSource::Kind::Temporal, conv, 1, 2}});
  // clip.cpp loads a position embedding with the patch embedding even though
  // Qwen2-VL positions its patches with RoPE: a small placeholder.
  p.zeros("v.position_embd.weight", ggml_type::F32, {10, 10});
  const std::string depth_why = "vision_config.depth is " + std::to_string(depth);
  for (int64_t i = 0; i < depth; ++i) {
    const std::string b = "visual.blocks." + std::to_string(i) + ".", o = "v.blk." + std::to_string(i) + ".";
    const char* qkv[] = {"attn_q", "attn_k", "attn_v"};
    for (int part = 0; part < 3; ++part) {
      p.third(o + qkv[part] + ".weight", b + "attn.qkv.weight", {3 * E, E}, part);
      p.third(o + qkv[part] + ".bias", b + "attn.qkv.bias", {3 * E}, part);
    }
    p.matrix(o + "attn_out.weight", b + "attn.proj.weight", {E, E});
    p.vector(o + "attn_out.bias", b + "attn.proj.bias", E);
    p.vector(o + "ln1.weight", b + "norm1.weight", E, depth_why);
    p.vector(o + "ln1.bias", b + "norm1.bias", E);
    p.vector(o + "ln2.weight", b + "norm2.weight", E);
    p.vector(o + "ln2.bias", b + "norm2.bias", E);
    // clip.cpp's names: ffn_down is the first MLP matrix (fc1, embed -> ffn),
    // ffn_up the second (fc2, ffn -> embed).
    p.matrix(o + "ffn_down.weight", b + "mlp.fc1.weight", {F, E}, "embed_dim x mlp_ratio");
    p.vector(o + "ffn_down.bias", b + "mlp.fc1.bias", F);
    p.matrix(o + "ffn_up.weight", b + "mlp.fc2.weight", {E, F}, "embed_dim x mlp_ratio");
    p.vector(o + "ffn_up.bias", b + "mlp.fc2.bias", E);
  }
  p.vector("v.post_ln.weight", "visual.merger.ln_q.weight", E);
  p.vector("v.post_ln.bias", "visual.merger.ln_q.bias", E);
  p.matrix("mm.0.weight", "visual.merger.mlp.0.weight", {4 * E, 4 * E}, "4 x embed_dim: the 2x2 merge");
  p.vector("mm.0.bias", "visual.merger.mlp.0.bias", 4 * E);
  p.matrix("mm.2.weight", "visual.merger.mlp.2.weight", {c.hidden_size, 4 * E}, "the language model's hidden_size");
  p.vector("mm.2.bias", "visual.merger.mlp.2.bias", c.hidden_size);
  p.check_unused([](const std::string&) { return false; }, "Qwen2-VL's vision tower (" + depth_why + ")");
  p.finish({"v.patch_embd.weight", "v.patch_embd.weight.1"});
  return s;
}

MmprojSpec plan_llava(const ModelConfig& c, const Checkpoint& ck, const std::filesystem::path& dir) {
  const std::string where = dir.string(), cfg = (dir / "config.json").string();
  const bool next = c.vlm->model_type == "llava_next";
  const ConfigValues v{c.vlm->vision, cfg, "vision_config."};
  const ConfigValues top{c.raw, cfg, ""};
  const std::string vtype = v.text("model_type", "clip_vision_model");
  if (vtype != "clip_vision_model")
    throw unsupported(cfg, "vision_config.model_type '" + vtype + "': llama.cpp's LLaVA encoder is a CLIP vision tower (clip_vision_model)");
  // transformers' CLIPVisionConfig defaults.
  const int64_t E = v.integer("hidden_size", 768), F = v.integer("intermediate_size", 3072);
  const int64_t L = v.integer("num_hidden_layers", 12), heads = v.integer("num_attention_heads", 12);
  const int64_t image = v.integer("image_size", 224), patch = v.integer("patch_size", 32);
  const int64_t channels = v.integer("num_channels", 3);
  const double eps = v.number("layer_norm_eps", 1e-5);
  if (channels != 3) throw unsupported(cfg, "vision_config.num_channels is " + std::to_string(channels) + "; llama.cpp's CLIP encoder takes RGB images (3)");
  if (E % heads != 0)
    throw invalid_input(cfg, "vision_config.hidden_size " + std::to_string(E) + " is not a multiple of num_attention_heads " + std::to_string(heads));
  if (image % patch != 0)
    throw invalid_input(cfg, "vision_config.image_size " + std::to_string(image) + " is not a multiple of patch_size " + std::to_string(patch));
  const std::string strategy = top.text("vision_feature_select_strategy", "default");
  if (strategy != "default")
    throw unsupported(cfg, "vision_feature_select_strategy '" + strategy + "': llama.cpp's LLaVA encoder drops the CLS token "
                           "(the \"default\" strategy) and has no other");
  const std::string pact = top.text("projector_hidden_act", "gelu");
  if (pact != "gelu")
    throw unsupported(cfg, "projector_hidden_act '" + pact + "': llama.cpp's LLaVA projector applies GELU");
  // vision_feature_layer indexes transformers' hidden_states, whose entry 0
  // is the embeddings and entry i the output of layer i: the feature layer k
  // is the output after k layers.
  int64_t feature = -2;
  if (const json* f = top.get("vision_feature_layer")) {
    if (f->is_array())
      throw unsupported(cfg, "vision_feature_layer " + f->dump() + ": llama.cpp's LLaVA encoder takes the features of one layer, not a list");
    if (!f->is_number_integer()) top.bad("vision_feature_layer", "an integer");
    feature = f->get<int64_t>();
  }
  const int64_t k = feature < 0 ? L + 1 + feature : feature;
  if (k < 0 || k > L)
    throw invalid_input(cfg, "vision_feature_layer " + std::to_string(feature) + " is outside the vision tower's " +
                                 std::to_string(L + 1) + " hidden states (num_hidden_layers " + std::to_string(L) + ")");
  const int64_t H = c.hidden_size;

  MmprojSpec s;
  s.description = next ? "image encoder for LLaVA-NeXT" : "image encoder for LLaVA";
  s.projector_type = "mlp";
  s.llava_projector = true;
  set_activation(s, v.text("hidden_act", "quick_gelu"), cfg, "vision_config.hidden_act");
  s.image_size = static_cast<uint32_t>(image);
  s.patch_size = static_cast<uint32_t>(patch);
  s.embedding_length = static_cast<uint32_t>(E);
  s.feed_forward_length = static_cast<uint32_t>(F);
  s.head_count = static_cast<uint32_t>(heads);
  // b4748's clip.cpp runs block_count - 1 layers of a LLaVA tower and has no
  // feature-layer key: block_count is the feature layer + 1, so that it runs
  // exactly the layers whose output the model reads (all layers stored but
  // the last for vision_feature_layer -2). The last stored block is loaded,
  // never run.
  s.block_count = static_cast<uint32_t>(k + 1);
  s.projection_dim = static_cast<uint32_t>(H);
  s.layer_norm_epsilon = static_cast<float>(eps);
  read_image_stats(s, dir);
  if (next) {
    s.mm_patch_merge_type = "spatial_unpad";
    s.image_crop_resolution = static_cast<uint32_t>(top.integer("image_crop_resolution", image));
    const json* pins = top.get("image_grid_pinpoints");
    if (pins) {
      bool ok = pins->is_array() && !pins->empty();
      for (const json& pair : ok ? *pins : json::array()) {
        ok = ok && pair.is_array() && pair.size() == 2;
        for (const json& e : ok ? pair : json::array()) {
          ok = ok && e.is_number_integer() && e.get<int64_t>() > 0 && e.get<int64_t>() <= (1 << 20);
          if (ok) s.image_grid_pinpoints.push_back(static_cast<int32_t>(e.get<int64_t>()));
        }
      }
      if (!ok) top.bad("image_grid_pinpoints", "a list of [height, width] pairs of positive integers");
      if (s.image_grid_pinpoints.size() > 32)
        throw unsupported(cfg, "image_grid_pinpoints has " + std::to_string(pins->size()) +
                                   " resolutions; llama.cpp's LLaVA-NeXT encoder reads at most 16");
    }
  }

  Planner p{ck, where, s, {}, true};
  const std::string vm = "vision_tower.vision_model.";
  const int64_t positions = (image / patch) * (image / patch) + 1;
  p.vector("v.class_embd", vm + "embeddings.class_embedding", E);
  p.matrix("v.patch_embd.weight", vm + "embeddings.patch_embedding.weight", {E, 3, patch, patch}, "vision_config hidden_size, patch_size");
  p.matrix("v.position_embd.weight", vm + "embeddings.position_embedding.weight", {positions, E},
           "(image_size / patch_size)^2 + 1 positions");
  p.vector("v.pre_ln.weight", vm + "pre_layrnorm.weight", E);
  p.vector("v.pre_ln.bias", vm + "pre_layrnorm.bias", E);
  for (int64_t i = 0; i <= k; ++i) {
    const std::string b = vm + "encoder.layers." + std::to_string(i) + ".", o = "v.blk." + std::to_string(i) + ".";
    if (i == L) {
      // vision_feature_layer -1: every layer runs, and clip.cpp still loads
      // one block more than it runs; that block is zeros.
      for (const char* m : {"attn_q", "attn_k", "attn_v", "attn_out"}) {
        p.zeros(o + m + ".weight", ggml_type::F16, {E, E});
        p.zeros(o + m + ".bias", ggml_type::F32, {E});
      }
      for (const char* m : {"ln1", "ln2"}) {
        p.zeros(o + m + ".weight", ggml_type::F32, {E});
        p.zeros(o + m + ".bias", ggml_type::F32, {E});
      }
      p.zeros(o + "ffn_down.weight", ggml_type::F16, {F, E});
      p.zeros(o + "ffn_down.bias", ggml_type::F32, {F});
      p.zeros(o + "ffn_up.weight", ggml_type::F16, {E, F});
      p.zeros(o + "ffn_up.bias", ggml_type::F32, {E});
      break;
    }
    const std::string layers_why = "vision_config.num_hidden_layers is " + std::to_string(L);
    for (auto [hf, out] : {std::pair<const char*, const char*>{"q_proj", "attn_q"}, {"k_proj", "attn_k"}, {"v_proj", "attn_v"},
                           {"out_proj", "attn_out"}}) {
      p.matrix(o + out + ".weight", b + "self_attn." + hf + ".weight", {E, E}, layers_why);
      p.vector(o + out + ".bias", b + "self_attn." + hf + ".bias", E);
    }
    p.vector(o + "ln1.weight", b + "layer_norm1.weight", E);
    p.vector(o + "ln1.bias", b + "layer_norm1.bias", E);
    p.vector(o + "ln2.weight", b + "layer_norm2.weight", E);
    p.vector(o + "ln2.bias", b + "layer_norm2.bias", E);
    // clip.cpp's names: ffn_down is fc1 (hidden -> intermediate), ffn_up fc2.
    p.matrix(o + "ffn_down.weight", b + "mlp.fc1.weight", {F, E}, "vision_config.intermediate_size");
    p.vector(o + "ffn_down.bias", b + "mlp.fc1.bias", F);
    p.matrix(o + "ffn_up.weight", b + "mlp.fc2.weight", {E, F}, "vision_config.intermediate_size");
    p.vector(o + "ffn_up.bias", b + "mlp.fc2.bias", E);
  }
  const std::string mp = "multi_modal_projector.";
  p.matrix("mm.0.weight", mp + "linear_1.weight", {H, E}, "the language model's hidden_size x the vision hidden_size");
  // Without multimodal_projector_bias the projector has no biases; clip.cpp
  // requires them, and zeros add nothing.
  if (ck.contains(mp + "linear_1.bias")) p.vector("mm.0.bias", mp + "linear_1.bias", H);
  else p.zeros("mm.0.bias", ggml_type::F32, {H});
  p.matrix("mm.2.weight", mp + "linear_2.weight", {H, H}, "the language model's hidden_size");
  if (ck.contains(mp + "linear_2.bias")) p.vector("mm.2.bias", mp + "linear_2.bias", H);
  else p.zeros("mm.2.bias", ggml_type::F32, {H});
  if (next) p.vector("model.image_newline", "image_newline", H, "LLaVA-NeXT's row separator");
  // Not part of the features: the post-layernorm (applied to the pooled CLS
  // output only), the layers after the feature layer, position ids.
  const std::string layers = vm + "encoder.layers.";
  p.check_unused(
      [&](const std::string& n) {
        if (n.rfind(vm + "post_layernorm.", 0) == 0 || n.find("position_ids") != std::string::npos) return true;
        if (n.rfind(layers, 0) != 0) return false;
        size_t end = layers.size();
        while (end < n.size() && n[end] >= '0' && n[end] <= '9') ++end;
        if (end == layers.size() || end - layers.size() > 6) return false;
        const int64_t i = std::stoll(n.substr(layers.size(), end - layers.size()));
        return i > k && i < L;
      },
      "a LLaVA CLIP tower of " + std::to_string(L) + " layers");
  p.finish({"v.patch_embd.weight"});
  return s;
}

void fill(const MmprojTensor& t, const Checkpoint& ck, std::vector<uint8_t>& out, std::vector<float>& f32, bool allow_nonfinite,
          const std::string& where) {
  uint64_t n = 1;
  for (uint64_t d : t.ne) n *= d;
  const DType dst = t.type == ggml_type::F16 ? DType::F16 : DType::F32;
  out.assign(n * dtype_size(dst), 0);
  if (t.src.kind == MmprojSource::Kind::Zeros) return;
  const Tensor src = ck.tensor(t.src.tensor);
  // The source elements in output order, as (pointer, count) runs.
  std::vector<std::pair<const uint8_t*, size_t>> runs;
  const size_t es = dtype_size(src.dtype());
  const auto* base = static_cast<const uint8_t*>(src.data());
  if (t.src.kind == MmprojSource::Kind::Whole) {
    runs.push_back({base, static_cast<size_t>(src.numel())});
  } else if (t.src.kind == MmprojSource::Kind::Rows) {
    const Tensor r = src.rows(t.src.begin, t.src.end);
    runs.push_back({static_cast<const uint8_t*>(r.data()), static_cast<size_t>(r.numel())});
  } else {  // Temporal: [O, C, T, kh, kw] -> [O, C, kh, kw] at T = begin
    const int64_t O = src.dim(0), C = src.dim(1), T = src.dim(2), khw = src.dim(3) * src.dim(4);
    for (int64_t o = 0; o < O; ++o)
      for (int64_t c = 0; c < C; ++c)
        runs.push_back({base + static_cast<size_t>(((o * C + c) * T + t.src.begin) * khw) * es, static_cast<size_t>(khw)});
  }
  uint8_t* dstp = out.data();
  size_t at = 0;
  for (const auto& [ptr, count] : runs) {
    f32.resize(count);
    convert(ptr, src.dtype(), f32.data(), DType::F32, count);
    if (src.dtype() == dst) std::memcpy(dstp, ptr, count * es);
    else convert(f32.data(), DType::F32, dstp, dst, count);
    if (!allow_nonfinite)
      for (size_t i = 0; i < count; ++i) {
        const bool overflow = dst == DType::F16 && std::isfinite(f32[i]) &&
                              !std::isfinite(f16_to_f32(reinterpret_cast<const uint16_t*>(dstp)[i]));
        if (!std::isfinite(f32[i]) || overflow)
          throw invalid_input(where, "vision tensor '" + t.src.tensor + "' (for " + t.name + ") holds " +
                                         (overflow ? "a value beyond f16's range (" + std::to_string(f32[i]) + ")"
                                                   : std::string(std::isnan(f32[i]) ? "nan" : "an infinite value")) +
                                         " at element " + std::to_string(at + i) +
                                         "; --allow-nonfinite converts it anyway");
      }
    dstp += count * dtype_size(dst);
    at += count;
  }
}

}  // namespace

std::filesystem::path default_mmproj_path(const std::filesystem::path& lm_out) {
  return lm_out.parent_path() / ("mmproj-" + lm_out.filename().string());
}

MmprojSpec plan_mmproj(const ModelConfig& c, const Checkpoint& ck, const std::filesystem::path& dir, const std::string& name) {
  if (!c.vlm) throw invalid_input(dir.string(), "is a text model (model_type '" + c.model_type + "'); it has no vision encoder for an mmproj file");
  const std::string& t = c.vlm->model_type;
  MmprojSpec s;
  if (t == "qwen2_vl") s = plan_qwen2_vl(c, ck, dir);
  else if (t == "llava" || t == "llava_next") s = plan_llava(c, ck, dir);
  else if (t == "qwen2_5_vl")
    throw unsupported(dir.string(), "llama.cpp b4748's CLIP encoder has no Qwen2.5-VL vision tower (RMSNorm, gated MLP, window "
                                    "attention); convert the language model alone with --no-mmproj");
  else throw unsupported(dir.string(), "model_type '" + t + "' has no llama.cpp mmproj layout (qwen2_vl, llava, llava_next)");
  s.name = name;
  return s;
}

std::unique_ptr<GgufWriter> write_mmproj(const MmprojSpec& s, const Checkpoint& ck, const std::filesystem::path& out,
                                         bool allow_nonfinite, const std::string& where) {
  auto w = std::make_unique<GgufWriter>(out);
  w->add_string("general.architecture", "clip");
  w->add_string("general.name", s.name);
  w->add_string("general.description", s.description);
  w->add_u32("general.file_type", s.file_type);
  w->add_bool("clip.has_text_encoder", false);
  w->add_bool("clip.has_vision_encoder", true);
  if (s.llava_projector) w->add_bool("clip.has_llava_projector", true);
  if (s.qwen2vl_merger) w->add_bool("clip.has_qwen2vl_merger", true);
  w->add_string("clip.projector_type", s.projector_type);
  w->add_bool("clip.use_gelu", s.use_gelu);
  w->add_bool("clip.use_silu", s.use_silu);
  w->add_u32("clip.vision.image_size", s.image_size);
  w->add_u32("clip.vision.patch_size", s.patch_size);
  w->add_u32("clip.vision.embedding_length", s.embedding_length);
  w->add_u32("clip.vision.feed_forward_length", s.feed_forward_length);
  w->add_u32("clip.vision.projection_dim", s.projection_dim);
  w->add_u32("clip.vision.attention.head_count", s.head_count);
  w->add_f32("clip.vision.attention.layer_norm_epsilon", s.layer_norm_epsilon);
  w->add_u32("clip.vision.block_count", s.block_count);
  w->add_f32_array("clip.vision.image_mean", s.image_mean);
  w->add_f32_array("clip.vision.image_std", s.image_std);
  if (!s.image_grid_pinpoints.empty()) w->add_i32_array("clip.vision.image_grid_pinpoints", s.image_grid_pinpoints);
  if (!s.mm_patch_merge_type.empty()) w->add_string("clip.vision.mm_patch_merge_type", s.mm_patch_merge_type);
  if (s.image_crop_resolution) w->add_u32("clip.vision.image_crop_resolution", s.image_crop_resolution);
  for (const MmprojTensor& t : s.tensors) w->declare_tensor(t.name, t.type, t.ne);
  std::vector<uint8_t> buf;
  std::vector<float> f32;
  for (const MmprojTensor& t : s.tensors) {
    fill(t, ck, buf, f32, allow_nonfinite, where);
    w->write_tensor_data(t.name, buf.data(), buf.size());
  }
  return w;
}

}  // namespace qf
