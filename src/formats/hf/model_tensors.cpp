#include "formats/hf/model_tensors.h"

#include <algorithm>

#include "core/error.h"
#include "formats/safetensors.h"

namespace qf {
namespace {

const char* const kAttentionNames[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"};
const LinearRole kMlpRoles[] = {LinearRole::Gate, LinearRole::Up, LinearRole::Down};

// A SwiGLU block's matrix as the architecture names it: mixtral's experts
// call gate, up and down w1, w3 and w2; every other MLP gate_proj, up_proj
// and down_proj.
const char* mlp_part(LinearRole r, bool mixtral_expert) {
  if (r == LinearRole::Gate) return mixtral_expert ? "w1" : "gate_proj";
  if (r == LinearRole::Up) return mixtral_expert ? "w3" : "up_proj";
  return mixtral_expert ? "w2" : "down_proj";
}

// The gate, up and down of one MLP of layer `layer`: the dense one
// (kDenseLinear), a routed expert or the shared expert.
void append_mlp(const ModelConfig& c, int64_t expert, std::vector<HfLinear>& out) {
  const bool mixtral = c.model_type == "mixtral";
  for (LinearRole r : kMlpRoles) {
    if (expert == kDenseLinear) out.push_back({r, expert, std::string("mlp.") + mlp_part(r, false)});
    else if (expert == kSharedExpertLinear) out.push_back({r, expert, std::string("mlp.shared_expert.") + mlp_part(r, false)});
    else out.push_back({r, expert, hf_moe_prefix(c) + "experts." + std::to_string(expert) + "." + mlp_part(r, mixtral)});
  }
}

std::string quoted(const std::string& key) { return "'" + key + "'"; }

std::string experts_key(const ModelConfig& c) { return c.model_type == "mixtral" ? "num_local_experts" : "num_experts"; }

// One tensor the config implies, and what its shape is made of (for messages).
struct Expected {
  std::string name;
  Shape shape;
  bool linear_weight = false;  // stored by the checkpoint format in its own way when quantized
  std::string why;
};

std::vector<Expected> layer_tensors(const ModelConfig& c, int64_t i) {
  const int64_t h = c.hidden_size;
  const std::string p = "model.layers." + std::to_string(i) + ".";
  std::vector<Expected> t;
  t.push_back({p + "input_layernorm.weight", {h}, false, ""});
  t.push_back({p + "post_attention_layernorm.weight", {h}, false, ""});
  if (c.model_type == "qwen3" || c.model_type == "qwen3_moe") {
    t.push_back({p + "self_attn.q_norm.weight", {c.head_dim}, false, "'head_dim'"});
    t.push_back({p + "self_attn.k_norm.weight", {c.head_dim}, false, "'head_dim'"});
  }
  for (const HfRouter& r : hf_layer_routers(c, i)) {
    if (r.shared_gate)
      t.push_back({p + r.name + ".weight", {1, h}, false,
                   "the shared expert's gate, as 'shared_expert_intermediate_size' is " +
                       std::to_string(c.shared_expert_intermediate_size)});
    else
      t.push_back({p + r.name + ".weight", {c.num_experts, h}, false,
                   "the router of sparse layer " + std::to_string(i) + ": [" + quoted(experts_key(c)) + ", 'hidden_size']"});
  }
  for (const HfLinear& l : hf_layer_linears(c, i)) {
    const HfLinearShape s = hf_linear_shape(c, l.role, l.expert);
    std::string why;
    if (l.expert >= 0)
      why = "expert " + std::to_string(l.expert) + " of sparse layer " + std::to_string(i) + ", as " + quoted(experts_key(c)) +
            " is " + std::to_string(c.num_experts);
    else if (l.expert == kSharedExpertLinear)
      why = "the shared expert, as 'shared_expert_intermediate_size' is " + std::to_string(c.shared_expert_intermediate_size);
    else if (l.role == LinearRole::Gate || l.role == LinearRole::Up || l.role == LinearRole::Down)
      why = "the dense MLP of layer " + std::to_string(i) + ", as 'intermediate_size' is " + std::to_string(c.intermediate_size);
    t.push_back({p + l.name + ".weight", {s.out, s.in}, true, why});
    if (hf_linear_has_bias(c, l.role)) t.push_back({p + l.name + ".bias", {s.out}, false, why});
  }
  return t;
}

// Presence and shape of one implied tensor.
void check_expected(const Expected& e, const Checkpoint& ck, bool dense_linears, const std::string& where) {
  if (e.linear_weight && !dense_linears) return;
  const std::string why = e.why.empty() ? "" : " (" + e.why + ")";
  if (!ck.contains(e.name)) throw not_found(where, "tensor '" + e.name + "' is missing" + why);
  const Shape& got = ck.info(e.name).shape;
  if (got != e.shape)
    throw invalid_input(where, "tensor '" + e.name + "' has shape " + shape_str(got) + ", expected " + shape_str(e.shape) + why);
}

// The layer index of a "model.layers.<i>.<rest>" name and where <rest>
// starts; false for any other name.
bool split_layer_name(const std::string& name, int64_t& layer, size_t& rest) {
  static const std::string prefix = "model.layers.";
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  size_t i = prefix.size();
  uint64_t v = 0;  // saturates far beyond any layer count
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') {
    if (v < (uint64_t{1} << 40)) v = v * 10 + static_cast<uint64_t>(name[i] - '0');
    ++i;
  }
  if (i == prefix.size() || i >= name.size() || name[i] != '.') return false;
  layer = static_cast<int64_t>(v);
  rest = i + 1;
  return true;
}

// The dot-separated component of `s` that starts at `from` when it is a
// whole number written in digits ("3" in "experts.3.w1"), else "".
std::string number_component(const std::string& s, size_t from) {
  const size_t dot = s.find('.', from);
  const std::string part = s.substr(from, dot == std::string::npos ? std::string::npos : dot - from);
  return std::all_of(part.begin(), part.end(), [](char d) { return d >= '0' && d <= '9'; }) ? part : "";
}

// Whether module `mod` (under "model.layers.N.", without the tensor's last
// component: "mlp.experts.3.up_proj") is one of layer N's MLP modules.
bool mlp_module_expected(const ModelConfig& c, int64_t layer, const std::string& mod) {
  for (const HfRouter& r : hf_layer_routers(c, layer))
    if (r.name == mod) return true;
  std::vector<HfLinear> mine;
  if (!c.moe_layer(layer)) {
    append_mlp(c, kDenseLinear, mine);
  } else {
    if (c.shared_expert_intermediate_size > 0) append_mlp(c, kSharedExpertLinear, mine);
    // Only the expert the module names, not all of them: a config may declare
    // tens of thousands of experts.
    const std::string experts = hf_moe_prefix(c) + "experts.";
    if (mod.compare(0, experts.size(), experts) == 0) {
      const std::string digits = number_component(mod, experts.size());
      if (!digits.empty() && digits.size() <= 9) {
        const int64_t e = std::stoll(digits);
        if (e < c.num_experts) append_mlp(c, e, mine);
      }
    }
  }
  return std::any_of(mine.begin(), mine.end(), [&](const HfLinear& l) { return l.name == mod; });
}

// Why tensor `name` (module `mod` under its layer's prefix) is no part of
// layer `layer`'s MLP as the config describes it.
std::string why_unexpected(const ModelConfig& c, int64_t layer, const std::string& mod) {
  const std::string L = "layer " + std::to_string(layer);
  const bool sparse = c.moe_layer(layer);
  const size_t first_dot = mod.find('.');
  const std::string block = mod.substr(0, first_dot);  // "mlp" or "block_sparse_moe"
  const std::string inner = first_dot == std::string::npos ? "" : mod.substr(first_dot + 1);
  const bool expert = inner.rfind("experts.", 0) == 0;
  const bool router = inner == "gate";
  const bool shared = inner.rfind("shared_expert.", 0) == 0 || inner == "shared_expert_gate";
  const bool dense_part = block == "mlp" && (inner == "gate_proj" || inner == "up_proj" || inner == "down_proj");
  if (!sparse && (expert || router || shared)) {
    if (!c.is_moe()) return "belongs to a mixture-of-experts block, but a " + c.model_type + " model has none";
    return "belongs to a mixture-of-experts block, but " + L +
           " is dense by the config ('mlp_only_layers', 'decoder_sparse_step')";
  }
  if (sparse && dense_part) return "belongs to a dense MLP, but " + L + " is a mixture-of-experts layer by the config";
  if (sparse && shared) {
    if (c.model_type != "qwen2_moe") return "belongs to a shared expert, which a " + c.model_type + " model does not have";
    return "belongs to a shared expert, but 'shared_expert_intermediate_size' is 0 (no shared expert)";
  }
  if (sparse && expert && block + "." == hf_moe_prefix(c)) {
    const std::string idx = number_component(inner, std::string("experts.").size());
    if (!idx.empty() && (idx.size() > 9 || std::stoll(idx) >= c.num_experts))
      return "belongs to expert " + idx + ", but " + quoted(experts_key(c)) + " is " + std::to_string(c.num_experts) +
             " (experts 0 to " + std::to_string(c.num_experts - 1) + ")";
  }
  return "is not part of " + L + "'s " + (sparse ? "mixture-of-experts block" : "MLP") + " in a " + c.model_type + " model";
}

}  // namespace

std::string hf_moe_prefix(const ModelConfig& c) { return c.model_type == "mixtral" ? "block_sparse_moe." : "mlp."; }

std::vector<HfLinear> hf_layer_linears(const ModelConfig& c, int64_t layer) {
  std::vector<HfLinear> ids;
  const LinearRole attention[] = {LinearRole::Q, LinearRole::K, LinearRole::V, LinearRole::O};
  for (int j = 0; j < 4; ++j) ids.push_back({attention[j], kDenseLinear, kAttentionNames[j]});
  if (!c.moe_layer(layer)) {
    append_mlp(c, kDenseLinear, ids);
    return ids;
  }
  for (int64_t e = 0; e < c.num_experts; ++e) append_mlp(c, e, ids);
  if (c.shared_expert_intermediate_size > 0) append_mlp(c, kSharedExpertLinear, ids);
  return ids;
}

HfLinearShape hf_linear_shape(const ModelConfig& c, LinearRole role, int64_t expert) {
  const int64_t h = c.hidden_size;
  switch (role) {
    case LinearRole::Q: return {c.q_dim(), h};
    case LinearRole::K:
    case LinearRole::V: return {c.kv_dim(), h};
    case LinearRole::O: return {h, c.q_dim()};
    case LinearRole::Gate:
    case LinearRole::Up:
    case LinearRole::Down: {
      const int64_t ff = expert == kSharedExpertLinear ? c.shared_expert_intermediate_size
                         : expert >= 0                 ? c.moe_intermediate_size
                                                       : c.intermediate_size;
      return role == LinearRole::Down ? HfLinearShape{h, ff} : HfLinearShape{ff, h};
    }
  }
  throw Error(ErrorKind::Internal, "hf_linear_shape: unknown role");
}

bool hf_linear_has_bias(const ModelConfig& c, LinearRole role) {
  const bool qwen2 = c.model_type == "qwen2" || c.model_type == "qwen2_moe";
  if (role == LinearRole::Q || role == LinearRole::K || role == LinearRole::V) return qwen2 || c.attention_bias;
  if (role == LinearRole::O) return !qwen2 && c.attention_bias;
  return c.mlp_bias;
}

std::vector<HfRouter> hf_layer_routers(const ModelConfig& c, int64_t layer) {
  if (!c.moe_layer(layer)) return {};
  std::vector<HfRouter> r = {{hf_moe_prefix(c) + "gate", false}};
  if (c.shared_expert_intermediate_size > 0) r.push_back({"mlp.shared_expert_gate", true});
  return r;
}

void check_hf_checkpoint(const ModelConfig& c, const Checkpoint& ck, bool dense_linears, const std::string& where,
                         const std::string& config_file) {
  check_layer_tensors(ck.names(), "model.layers.", c.num_hidden_layers, config_file, "num_hidden_layers");
  const int64_t h = c.hidden_size;
  // Presence and shapes first, in the order a loader reads them, one layer at
  // a time: a config declaring huge expert counts stops at the first absent
  // tensor instead of listing every name it implies.
  check_expected({"model.embed_tokens.weight", {c.vocab_size, h}, true, "['vocab_size', 'hidden_size']"}, ck, dense_linears, where);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    for (const Expected& e : layer_tensors(c, i)) check_expected(e, ck, dense_linears, where);
  check_expected({"model.norm.weight", {h}, false, ""}, ck, dense_linears, where);
  if (!c.tie_word_embeddings)
    check_expected({"lm_head.weight", {c.vocab_size, h}, true, "'tie_word_embeddings' is false"}, ck, dense_linears, where);

  // Then tensors the config has no place for: a loader would silently skip
  // them and a converter would write them into a file no loader accepts.
  for (const std::string& name : ck.names()) {
    int64_t layer = 0;
    size_t rest = 0;
    if (!split_layer_name(name, layer, rest)) continue;
    const std::string tail = name.substr(rest);
    if (tail.rfind("mlp.", 0) != 0 && tail.rfind("block_sparse_moe.", 0) != 0) continue;
    // bitsandbytes keeps a quantized Linear's state under "P.weight.<part>"
    // (absmax, quant_map, quant_state.bitsandbytes__nf4, ...): module P.
    const size_t wpart = tail.find(".weight.");
    const std::string mod = wpart != std::string::npos ? tail.substr(0, wpart) : tail.substr(0, tail.rfind('.'));
    if (mlp_module_expected(c, layer, mod)) continue;
    throw invalid_input(where, "tensor '" + name + "' " + why_unexpected(c, layer, mod));
  }
}

TensorNaming hf_tensor_naming(const ModelConfig& c, const std::vector<std::string>& stored_names) {
  TensorNaming n;
  if (!c.vlm) return n;
  bool current = false;  // transformers 4.52 on
  for (const std::string& s : stored_names)
    if (s.compare(0, 21, "model.language_model.") == 0) current = true;
  const bool llava = c.vlm->model_type == "llava" || c.vlm->model_type == "llava_next";
  if (current) {
    n.prefixes = {{"model.", "model.language_model."}, {"lm_head.", "lm_head."}};
    if (llava)
      n.prefixes.insert(n.prefixes.end(), {{"vision_tower.", "model.vision_tower."},
                                           {"multi_modal_projector.", "model.multi_modal_projector."},
                                           {"image_newline", "model.image_newline"}});
    else
      n.prefixes.push_back({"visual.", "model.visual."});
  } else if (llava) {
    n.prefixes = {{"model.", "language_model.model."}, {"lm_head.", "language_model.lm_head."}};
  }
  return n;
}

void apply_hf_tensor_naming(const ModelConfig& c, Checkpoint& ck) {
  TensorNaming n = hf_tensor_naming(c, ck.names());
  if (!n.identity()) ck.set_naming(std::move(n));
}

std::string linear_weight_module(const Checkpoint& ck, const std::string& name) {
  static const std::string suffix = ".weight";
  if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0 ||
      ck.info(name).shape.size() != 2)
    return "";
  std::string module = name.substr(0, name.size() - suffix.size());
  const size_t dot = module.rfind('.');
  return module.find("embed", dot == std::string::npos ? 0 : dot) == std::string::npos ? module : "";
}

bool is_vision_tensor(const std::string& name) {
  for (const char* p : {"visual.", "vision_tower.", "multi_modal_projector.", "image_newline"})
    if (name.compare(0, std::char_traits<char>::length(p), p) == 0) return true;
  return false;
}

}  // namespace qf
