#include "formats/hf/model_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"
#include "core/io.h"

namespace qf {

using nlohmann::json;
namespace fs = std::filesystem;

const std::vector<std::string>& supported_model_types() {
  static const std::vector<std::string> types = {"llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe"};
  return types;
}

const std::vector<std::string>& vision_language_model_types() {
  static const std::vector<std::string> types = {"qwen2_vl", "qwen2_5_vl", "llava", "llava_next"};
  return types;
}

namespace {

// Typed accessors that name the key and the file in every error.
struct Reader {
  const json& j;
  const std::string& where;

  const json* get(const char* key) const {
    auto it = j.find(key);
    return (it == j.end() || it->is_null()) ? nullptr : &*it;
  }
  [[noreturn]] void bad(const char* key, const char* want, const json& got) const {
    throw invalid_input(where, std::string("key '") + key + "' must be " + want + ", got " + got.dump());
  }
  int64_t positive_int(const char* key) const {
    const json* v = get(key);
    if (!v) throw invalid_input(where, std::string("missing required key '") + key + "'");
    if (!v->is_number_integer() || v->get<int64_t>() <= 0) bad(key, "a positive integer", *v);
    return v->get<int64_t>();
  }
  std::optional<int64_t> opt_int(const char* key, bool allow_zero = true) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number_integer() || v->get<int64_t>() < (allow_zero ? 0 : 1))
      bad(key, allow_zero ? "a non-negative integer" : "a positive integer", *v);
    return v->get<int64_t>();
  }
  std::optional<double> opt_number(const char* key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) bad(key, "a number", *v);
    return v->get<double>();
  }
  std::optional<bool> opt_bool(const char* key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) bad(key, "true or false", *v);
    return v->get<bool>();
  }
  std::optional<std::string> opt_string(const char* key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) bad(key, "a string", *v);
    return v->get<std::string>();
  }
};

RopeScaling parse_rope_scaling(const json& j, const std::string& where) {
  if (!j.is_object()) throw invalid_input(where, "key 'rope_scaling' must be an object or null, got " + j.dump());
  std::string w = where + ": rope_scaling";
  Reader r{j, w};
  RopeScaling rs;
  rs.raw = j;
  auto t = r.opt_string("rope_type");
  if (!t) t = r.opt_string("type");
  if (!t) throw invalid_input(w, "missing 'rope_type' (or 'type')");
  rs.type = *t;
  rs.factor = r.opt_number("factor").value_or(1.0);
  rs.low_freq_factor = r.opt_number("low_freq_factor");
  rs.high_freq_factor = r.opt_number("high_freq_factor");
  rs.original_max_position_embeddings = r.opt_int("original_max_position_embeddings");
  rs.beta_fast = r.opt_number("beta_fast");
  rs.beta_slow = r.opt_number("beta_slow");
  rs.attention_factor = r.opt_number("attention_factor");
  rs.mscale = r.opt_number("mscale");
  rs.mscale_all_dim = r.opt_number("mscale_all_dim");
  if (rs.type == "llama3" && (!rs.low_freq_factor || !rs.high_freq_factor || !rs.original_max_position_embeddings))
    throw invalid_input(w, "llama3 scaling needs low_freq_factor, high_freq_factor and original_max_position_embeddings");
  if ((rs.type == "linear" || rs.type == "llama3" || rs.type == "yarn" || rs.type == "dynamic") && !(rs.factor > 0))
    throw invalid_input(w, "'factor' must be positive");
  return rs;
}

std::string list_types() {
  std::string s;
  for (const auto& t : supported_model_types()) s += (s.empty() ? "" : ", ") + t;
  for (const auto& t : vision_language_model_types()) s += ", " + t;
  return s;
}

bool is_vision_language(const std::string& t) {
  const auto& v = vision_language_model_types();
  return std::find(v.begin(), v.end(), t) != v.end();
}

// transformers' LlamaConfig / MistralConfig / Qwen2Config defaults for the
// keys a LLaVA text_config may leave out (llava-1.5's names only what
// differs from them).
void fill_text_defaults(json& t) {
  const std::string mt = t.value("model_type", "llama");
  auto def = [&](const char* k, json v) {
    if (!t.contains(k) || t[k].is_null()) t[k] = std::move(v);
  };
  if (mt == "mistral") {
    def("hidden_size", 4096), def("intermediate_size", 14336), def("num_hidden_layers", 32);
    def("num_attention_heads", 32), def("num_key_value_heads", 8), def("max_position_embeddings", 4096 * 32);
    def("vocab_size", 32000), def("rms_norm_eps", 1e-6), def("rope_theta", 10000.0);
  } else if (mt == "qwen2") {
    def("hidden_size", 4096), def("intermediate_size", 22016), def("num_hidden_layers", 32);
    def("num_attention_heads", 32), def("num_key_value_heads", 32), def("max_position_embeddings", 32768);
    def("vocab_size", 151936), def("rms_norm_eps", 1e-6), def("rope_theta", 10000.0);
  } else {
    def("hidden_size", 4096), def("intermediate_size", 11008), def("num_hidden_layers", 32);
    def("num_attention_heads", 32), def("max_position_embeddings", 2048);
    def("vocab_size", 32000), def("rms_norm_eps", 1e-6), def("rope_theta", 10000.0);
  }
}

ModelConfig parse_vision_language_config(const json& j, const std::string& where, const std::string& type) {
  Reader r{j, where};
  VisionLanguageConfig v;
  v.model_type = type;
  const json* vc = r.get("vision_config");
  if (!vc || !vc->is_object())
    throw invalid_input(where, "a " + type + " config needs a 'vision_config' object");
  v.vision = *vc;
  const json* tc = r.get("text_config");
  if (tc && !tc->is_object()) r.bad("text_config", "an object", *tc);
  const bool qwen = type == "qwen2_vl" || type == "qwen2_5_vl";
  json text;
  if (qwen) {
    // Older configs keep the language model's fields at the top level; newer
    // ones (transformers 4.52 on) also, or only, in text_config.
    v.text_config = tc && tc->contains("hidden_size");
    text = v.text_config ? *tc : j;
    text.erase("vision_config"), text.erase("text_config");
    text["model_type"] = "qwen2";
    json* rs = text.contains("rope_scaling") && text["rope_scaling"].is_object() ? &text["rope_scaling"] : nullptr;
    if (!rs && j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
      text["rope_scaling"] = j["rope_scaling"];
      rs = &text["rope_scaling"];
    }
    if (!rs || !rs->contains("mrope_section"))
      throw invalid_input(where, "a " + type + " config needs rope_scaling.mrope_section (the multimodal RoPE sections)");
    const json& ms = (*rs)["mrope_section"];
    if (!ms.is_array() || ms.size() != 3)
      throw invalid_input(where, "rope_scaling.mrope_section must be a list of 3 positive integers, got " + ms.dump());
    for (const json& e : ms) {
      if (!e.is_number_integer() || e.get<int64_t>() <= 0)
        throw invalid_input(where, "rope_scaling.mrope_section must be a list of 3 positive integers, got " + ms.dump());
      v.mrope_section.push_back(e.get<int64_t>());
    }
    // "mrope" (older) or "default" with sections: ordinary frequencies.
    const std::string rt = rs->value("rope_type", rs->value("type", "default"));
    if (rt == "mrope" || rt == "default") text.erase("rope_scaling");
    for (const char* k : {"image_token_id", "vision_start_token_id", "vision_end_token_id"})
      if (!text.contains(k) && j.contains(k)) text[k] = j[k];
    Reader t{text, where};
    v.image_token_id = t.opt_int("image_token_id").value_or(-1);
    v.vision_start_token_id = t.opt_int("vision_start_token_id").value_or(-1);
    v.vision_end_token_id = t.opt_int("vision_end_token_id").value_or(-1);
    if (v.image_token_id < 0) throw invalid_input(where, "a " + type + " config needs 'image_token_id'");
  } else {
    if (!tc) throw invalid_input(where, "a " + type + " config needs a 'text_config' object");
    v.text_config = true;
    text = *tc;
    if (!text.contains("model_type")) text["model_type"] = "llama";
    const std::string mt = text["model_type"].is_string() ? text["model_type"].get<std::string>() : "";
    if (mt != "llama" && mt != "mistral" && mt != "qwen2")
      throw unsupported(where, "text_config.model_type '" + mt + "' of a " + type +
                                   " model is not supported (supported: llama, mistral, qwen2)");
    fill_text_defaults(text);
    const json* it = r.get("image_token_index");
    if (!it) it = r.get("image_token_id");
    if (!it || !it->is_number_integer() || it->get<int64_t>() < 0)
      throw invalid_input(where, "a " + type + " config needs 'image_token_index' (a non-negative integer)");
    v.image_token_id = it->get<int64_t>();
  }
  for (const char* k : {"torch_dtype", "dtype", "tie_word_embeddings", "quantization_config"})
    if (!text.contains(k) && j.contains(k)) text[k] = j[k];
  ModelConfig c = parse_model_config(text, where + (v.text_config ? ": text_config" : ""));
  if (qwen) {
    int64_t sum = 0;
    for (int64_t s : v.mrope_section) sum += s;
    if (sum != c.head_dim / 2)
      throw invalid_input(where, "rope_scaling.mrope_section sums to " + std::to_string(sum) + ", but head_dim / 2 is " +
                                     std::to_string(c.head_dim / 2));
  }
  if (v.image_token_id >= c.vocab_size)
    throw invalid_input(where, "the image token " + std::to_string(v.image_token_id) + " is outside the vocabulary of " +
                                   std::to_string(c.vocab_size));
  c.architectures.clear();
  if (const json* a = r.get("architectures"); a && a->is_array())
    for (const auto& e : *a)
      if (e.is_string()) c.architectures.push_back(e.get<std::string>());
  c.vlm = std::move(v);
  c.raw = j;
  return c;
}

}  // namespace

ModelConfig parse_model_config(const json& j, const std::string& where) {
  if (!j.is_object()) throw invalid_input(where, "config must be a JSON object");
  Reader r{j, where};
  ModelConfig c;
  c.raw = j;
  auto mt = r.opt_string("model_type");
  if (!mt) throw invalid_input(where, "missing required key 'model_type' (supported: " + list_types() + ")");
  c.model_type = *mt;
  if (is_vision_language(c.model_type)) return parse_vision_language_config(j, where, c.model_type);
  const auto& types = supported_model_types();
  if (std::find(types.begin(), types.end(), c.model_type) == types.end())
    throw unsupported(where, "unsupported architecture '" + c.model_type + "' (model_type); supported: " + list_types());
  if (const json* a = r.get("architectures")) {
    if (!a->is_array()) r.bad("architectures", "a list of strings", *a);
    for (const auto& e : *a) {
      if (!e.is_string()) r.bad("architectures", "a list of strings", *a);
      c.architectures.push_back(e.get<std::string>());
    }
  }
  c.hidden_size = r.positive_int("hidden_size");
  c.num_hidden_layers = r.positive_int("num_hidden_layers");
  c.num_attention_heads = r.positive_int("num_attention_heads");
  c.num_key_value_heads = r.opt_int("num_key_value_heads", false).value_or(c.num_attention_heads);
  c.vocab_size = r.positive_int("vocab_size");
  c.max_position_embeddings = r.opt_int("max_position_embeddings", false).value_or(2048);
  c.rms_norm_eps = r.opt_number("rms_norm_eps").value_or(1e-6);
  c.rope_theta = r.opt_number("rope_theta").value_or(10000.0);
  if (const json* rs = r.get("rope_scaling")) c.rope_scaling = parse_rope_scaling(*rs, where);
  c.tie_word_embeddings = r.opt_bool("tie_word_embeddings").value_or(false);
  c.mlp_bias = r.opt_bool("mlp_bias").value_or(false);
  // Qwen2 has q/k/v biases by construction and no config key for them.
  c.attention_bias = r.opt_bool("attention_bias").value_or(c.model_type == "qwen2" || c.model_type == "qwen2_moe");
  c.torch_dtype = r.opt_string("torch_dtype").value_or(r.opt_string("dtype").value_or(""));
  c.bos_token_id = r.opt_int("bos_token_id");
  c.pad_token_id = r.opt_int("pad_token_id");
  if (const json* e = r.get("eos_token_id")) {
    // eos_token_id may be a list (Llama-3 instruct); keep the first here, all in raw.
    if (e->is_array() && !e->empty() && (*e)[0].is_number_integer()) c.eos_token_id = (*e)[0].get<int64_t>();
    else c.eos_token_id = r.opt_int("eos_token_id");
  }

  // 0 when absent: check_model_config derives it from hidden_size / num_attention_heads.
  if (r.get("head_dim")) c.head_dim = r.positive_int("head_dim");

  // Sliding window: mistral uses it when set; qwen2/qwen3 only with use_sliding_window.
  auto sw = r.opt_int("sliding_window");
  bool use_sw = c.model_type == "mistral" || c.model_type == "mixtral" || r.opt_bool("use_sliding_window").value_or(false);
  const bool qwen = c.model_type == "qwen2" || c.model_type == "qwen3" || c.model_type == "qwen2_moe" ||
                    c.model_type == "qwen3_moe";
  // transformers' Qwen2/Qwen3 configs default sliding_window to 4096 and
  // max_window_layers to 28 when the keys are absent.
  if (qwen && use_sw && !sw) sw = 4096;
  if (sw && use_sw) c.sliding_window = sw;
  c.max_window_layers = r.opt_int("max_window_layers");
  if (qwen && !c.max_window_layers) c.max_window_layers = 28;

  if (c.model_type == "mixtral") {
    c.num_experts = r.positive_int("num_local_experts");
    c.num_experts_per_tok = r.positive_int("num_experts_per_tok");
    c.intermediate_size = r.positive_int("intermediate_size");
    c.moe_intermediate_size = c.intermediate_size;
    c.decoder_sparse_step = 1;
    c.norm_topk_prob = true;  // MixtralSparseMoeBlock always renormalises
  } else if (c.model_type == "qwen2_moe" || c.model_type == "qwen3_moe") {
    c.num_experts = r.positive_int("num_experts");
    c.num_experts_per_tok = r.positive_int("num_experts_per_tok");
    c.moe_intermediate_size = r.positive_int("moe_intermediate_size");
    c.intermediate_size = r.opt_int("intermediate_size").value_or(0);
    if (c.model_type == "qwen2_moe")
      c.shared_expert_intermediate_size = r.opt_int("shared_expert_intermediate_size").value_or(0);
    c.decoder_sparse_step = r.opt_int("decoder_sparse_step", false).value_or(1);
    c.norm_topk_prob = r.opt_bool("norm_topk_prob").value_or(false);
    if (const json* m = r.get("mlp_only_layers")) {
      const char* want = "a list of layer indices (integers from 0)";
      if (!m->is_array()) r.bad("mlp_only_layers", want, *m);
      for (const json& v : *m) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0) r.bad("mlp_only_layers", want, *m);
        c.mlp_only_layers.push_back(v.get<int64_t>());
      }
    }
  } else {
    c.intermediate_size = r.positive_int("intermediate_size");
  }
  if (c.num_experts && c.num_experts_per_tok > c.num_experts)
    throw invalid_input(where, "num_experts_per_tok exceeds the number of experts");

  if (const json* q = r.get("quantization_config")) {
    if (!q->is_object()) r.bad("quantization_config", "an object", *q);
    c.quantization_config = *q;
  }
  check_model_config(c, where);
  return c;
}

void check_model_config(ModelConfig& c, const std::string& where, const ConfigKeyName& key_name) {
  // Built with append(): GCC 12's -Wrestrict misfires on "'" + std::string.
  auto key = [&](const char* k) {
    std::string q(1, '\'');
    q.append(key_name ? key_name(k) : std::string(k)).push_back('\'');
    return q;
  };
  auto fail = [&](const std::string& what) { throw invalid_input(where, what); };
  // Widths and head counts up to 2^20, vocabularies up to 2^24, layers up to
  // 2^16: the largest published models are far below, and the products of
  // sizes the loaders and the runtime form (q_dim, vocab x hidden, hidden x
  // intermediate, layers x kv_dim) stay far inside int64.
  constexpr int64_t kMaxWidth = int64_t{1} << 20, kMaxVocab = int64_t{1} << 24, kMaxLayers = int64_t{1} << 16;
  auto size = [&](const char* k, int64_t v, int64_t max) {
    if (v <= 0) fail(key(k) + " is " + std::to_string(v) + ", must be a positive integer");
    if (v > max) fail(key(k) + " is " + std::to_string(v) + ", above the limit of " + std::to_string(max));
  };
  size("hidden_size", c.hidden_size, kMaxWidth);
  size("num_hidden_layers", c.num_hidden_layers, kMaxLayers);
  size("num_attention_heads", c.num_attention_heads, kMaxWidth);
  size("num_key_value_heads", c.num_key_value_heads, kMaxWidth);
  size("vocab_size", c.vocab_size, kMaxVocab);
  // Qwen MoE models whose every layer is sparse may have no dense MLP
  // (intermediate_size 0); a dense layer needs one.
  bool any_dense = !c.is_moe();
  for (int64_t i = 0; i < c.num_hidden_layers && !any_dense; ++i) any_dense = !c.moe_layer(i);
  if (any_dense || c.intermediate_size != 0) size("intermediate_size", c.intermediate_size, kMaxWidth);
  if (c.is_moe()) {
    const char* experts = c.model_type == "mixtral" ? "num_local_experts" : "num_experts";
    size(experts, c.num_experts, kMaxLayers);
    size("num_experts_per_tok", c.num_experts_per_tok, kMaxLayers);
    if (c.num_experts_per_tok > c.num_experts)
      fail(key("num_experts_per_tok") + " is " + std::to_string(c.num_experts_per_tok) + ", more than the " +
           std::to_string(c.num_experts) + " experts of " + key(experts));
    size(c.model_type == "mixtral" ? "intermediate_size" : "moe_intermediate_size", c.moe_intermediate_size, kMaxWidth);
    // 0: no shared expert.
    if (c.shared_expert_intermediate_size < 0 || c.shared_expert_intermediate_size > kMaxWidth)
      fail(key("shared_expert_intermediate_size") + " is " + std::to_string(c.shared_expert_intermediate_size) +
           ", must be between 0 (no shared expert) and " + std::to_string(kMaxWidth));
    if (c.decoder_sparse_step <= 0)
      fail(key("decoder_sparse_step") + " is " + std::to_string(c.decoder_sparse_step) + ", must be a positive integer");
    for (int64_t l : c.mlp_only_layers)
      if (l >= c.num_hidden_layers)
        fail(key("mlp_only_layers") + " names layer " + std::to_string(l) + ", beyond " + key("num_hidden_layers") +
             " " + std::to_string(c.num_hidden_layers));
  }
  if (c.head_dim == 0) {
    if (c.hidden_size % c.num_attention_heads != 0)
      fail(key("hidden_size") + " " + std::to_string(c.hidden_size) + " is not divisible by " + key("num_attention_heads") +
           " " + std::to_string(c.num_attention_heads) + ", and no " + key("head_dim") + " is given");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  size("head_dim", c.head_dim, kMaxWidth);
  if (c.head_dim % 2 != 0)
    fail(key("head_dim") + " is " + std::to_string(c.head_dim) + ", must be even (RoPE rotates pairs of dimensions)");
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    fail(key("num_attention_heads") + " " + std::to_string(c.num_attention_heads) + " is not a multiple of " +
         key("num_key_value_heads") + " " + std::to_string(c.num_key_value_heads));
  if (c.max_position_embeddings < 0 || c.max_position_embeddings > int64_t{0xffffffff})
    fail(key("max_position_embeddings") + " is " + std::to_string(c.max_position_embeddings) +
         ", must be between 0 and 2^32 - 1");
  auto positive = [&](const char* k, double v) {
    if (!(v > 0) || !std::isfinite(v)) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%g", v);
      fail(key(k) + " is " + buf + ", must be a positive finite number");
    }
  };
  positive("rms_norm_eps", c.rms_norm_eps);
  positive("rope_theta", c.rope_theta);
  if (c.sliding_window && *c.sliding_window < 0)
    fail(key("sliding_window") + " is " + std::to_string(*c.sliding_window) + ", must not be negative");
  if (c.rope_scaling) {
    const RopeScaling& s = *c.rope_scaling;
    if (s.type == "linear" || s.type == "llama3" || s.type == "yarn" || s.type == "dynamic")
      positive("rope_scaling.factor", s.factor);
    if (s.type == "llama3") {
      // rope.cpp and the GGUF converter divide by both factors and by their difference.
      positive("rope_scaling.low_freq_factor", s.low_freq_factor.value_or(0));
      positive("rope_scaling.high_freq_factor", s.high_freq_factor.value_or(0));
      if (!(*s.high_freq_factor > *s.low_freq_factor))
        fail(key("rope_scaling.high_freq_factor") + " must be greater than " + key("rope_scaling.low_freq_factor"));
      if (s.original_max_position_embeddings.value_or(0) <= 0)
        fail(key("rope_scaling.original_max_position_embeddings") + " must be a positive integer");
    }
  }
}

void check_layer_tensors(const std::vector<std::string>& names, const std::string& prefix, int64_t n_layers,
                         const std::string& where, const std::string& key) {
  std::vector<bool> seen(static_cast<size_t>(std::max<int64_t>(n_layers, 0)), false);
  for (const std::string& name : names) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    size_t i = prefix.size();
    uint64_t layer = 0;  // saturates at 2^40, far beyond any layer count
    while (i < name.size() && name[i] >= '0' && name[i] <= '9') {
      if (layer < (uint64_t{1} << 40)) layer = layer * 10 + static_cast<uint64_t>(name[i] - '0');
      ++i;
    }
    if (i == prefix.size() || i >= name.size() || name[i] != '.') continue;  // not a layer tensor
    if (layer >= static_cast<uint64_t>(n_layers))
      throw invalid_input(where, "tensor '" + name + "' belongs to layer " + name.substr(prefix.size(), i - prefix.size()) +
                                     ", but '" + key + "' is " + std::to_string(n_layers) + " (layers 0 to " +
                                     std::to_string(n_layers - 1) + ")");
    seen[layer] = true;
  }
  for (size_t l = 0; l < seen.size(); ++l)
    if (!seen[l])
      throw invalid_input(where, "'" + key + "' is " + std::to_string(n_layers) + ", but there is no tensor for layer " +
                                     std::to_string(l) + " ('" + prefix + std::to_string(l) + ".*')");
}

ModelConfig load_model_config(const fs::path& dir_or_file) {
  fs::path p = is_folder(dir_or_file) ? dir_or_file / "config.json" : dir_or_file;
  if (!path_exists(p)) throw not_found(p.string(), "no config.json (is this a Hugging Face model folder?)");
  std::string text = read_text_file(p);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e999
    throw invalid_input(p.string(), std::string("not valid JSON: ") + e.what());
  }
  return parse_model_config(j, p.string());
}

}  // namespace qf
