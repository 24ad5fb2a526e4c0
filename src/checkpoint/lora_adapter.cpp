// PEFT LoRA adapters: adapter_config.json + adapter_model.safetensors, read
// and checked against the base model, with PEFT's matching rules
// (tuners/tuners_utils.py check_target_module_exists, utils/other.py
// get_pattern_key) written again here.
#include "checkpoint/lora_adapter.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "core/io.h"
#include "formats/hf/model_tensors.h"

namespace qf {
namespace {

constexpr const char* kPrefix = "base_model.model.";

// Python's re.match (anchored at the start) or re.fullmatch of `regex` on
// `text`; InvalidInput naming `where` for a pattern PCRE2 refuses.
bool regex_match(const std::string& regex, const std::string& text, bool full, const std::string& where) {
  int code = 0;
  PCRE2_SIZE off = 0;
  const uint32_t opts = PCRE2_ANCHORED | PCRE2_UTF | (full ? PCRE2_ENDANCHORED : 0);
  pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(regex.data()), regex.size(), opts, &code, &off, nullptr);
  if (!c) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(code, msg, sizeof msg);
    throw invalid_input(where, "invalid regular expression '" + printable_text(regex) + "': " +
                                   reinterpret_cast<const char*>(msg));
  }
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(c, nullptr);
  const int rc = pcre2_match(c, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, 0, md, nullptr);
  pcre2_match_data_free(md);
  pcre2_code_free(c);
  return rc >= 0;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A list target or exclusion: the exact name or a ".NAME" suffix.
bool in_module_list(const nlohmann::json& list, const std::string& module) {
  for (const auto& k : list) {
    const std::string key = k.get<std::string>();
    if (module == key || ends_with(module, "." + key)) return true;
  }
  return false;
}

// The layer index PEFT reads from a module name for layers_to_transform
// (nullopt: none found, so the module is not selected).
std::optional<int64_t> layer_index(const nlohmann::json& config, const std::string& module) {
  std::vector<std::string> patterns;
  const auto lp = config.find("layers_pattern");
  if (lp != config.end() && lp->is_string() && !lp->get<std::string>().empty()) patterns.push_back(*lp);
  if (lp != config.end() && lp->is_array())
    for (const auto& p : *lp) patterns.push_back(p.get<std::string>());
  std::vector<std::string> regexes;
  if (patterns.empty()) regexes.push_back(R"(.*\.[^.]*\.(\d+)\.)");
  for (const auto& p : patterns) regexes.push_back(".*\\." + p + "\\.(\\d+)\\.");
  for (const auto& re : regexes) {
    // The first group's digits: find "<pattern>.<digits>." by hand after the
    // regex has said it matches (Python takes the last such by greediness).
    if (!regex_match(re, module, false, "layers_pattern")) continue;
    // Greedy ".*" makes Python's group the last "<seg>.<digits>." in the name.
    for (size_t end = module.size(); end-- > 0;) {
      if (module[end] != '.') continue;
      size_t b = end;
      while (b > 0 && std::isdigit(static_cast<unsigned char>(module[b - 1]))) --b;
      if (b == end || b == 0 || module[b - 1] != '.') continue;
      const std::string tail = module.substr(0, end + 1);
      if (!regex_match(re + "$", tail, false, "layers_pattern")) continue;
      return std::stoll(module.substr(b, end - b));
    }
  }
  return std::nullopt;
}

bool json_is_default(const nlohmann::json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_array() && v.empty()) ||
         (v.is_object() && v.empty()) || (v.is_string() && v.get<std::string>().empty());
}

// adapter_config.json keys: honoured, or without effect on the weights.
const std::set<std::string>& honoured_keys() {
  static const std::set<std::string> k = {
      "r", "lora_alpha", "use_rslora", "target_modules", "exclude_modules", "layers_to_transform",
      "layers_pattern", "rank_pattern", "alpha_pattern", "fan_in_fan_out", "modules_to_save", "bias", "use_dora",
      // no effect on what a trained adapter computes
      "peft_type", "task_type", "base_model_name_or_path", "revision", "inference_mode", "lora_dropout",
      "init_lora_weights", "auto_mapping", "peft_version", "megatron_core"};
  return k;
}

double number(const nlohmann::json& config, const char* key, double fallback, const std::string& where) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_number()) throw invalid_input(where, std::string("'") + key + "' must be a number");
  return it->get<double>();
}

Tensor as_f32(const Tensor& t) { return t.dtype() == DType::F32 ? t : t.to(DType::F32); }

void check_shape(const Tensor& t, const Shape& want, const std::string& where, const std::string& name,
                 const std::string& why) {
  if (t.shape() != want)
    throw invalid_input(where, "tensor '" + name + "' has shape " + shape_str(t.shape()) + ", expected " +
                                   shape_str(want) + " (" + why + ")");
}

}  // namespace

LoraSpec parse_lora_spec(const std::string& arg, const std::string& flag) {
  LoraSpec s;
  s.path = arg;
  const size_t colon = arg.rfind(':');
  if (colon != std::string::npos && colon + 1 < arg.size()) {
    const std::string tail = arg.substr(colon + 1);
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(tail.c_str(), &end);
    if (end && *end == '\0' && errno == 0) {
      if (!std::isfinite(v)) throw Error(ErrorKind::Usage, flag + " " + arg + ": the scale must be a finite number");
      s.path = arg.substr(0, colon);
      s.scale = v;
    }
  }
  if (s.path.empty()) throw Error(ErrorKind::Usage, flag + " " + arg + ": no adapter folder given");
  return s;
}

namespace {

// The base's adaptable modules in forward order with their [out, in] weight
// shapes, from the config (a quantized base stores its Linears its own way).
std::vector<std::pair<std::string, Shape>> candidate_shapes(const ModelConfig& c) {
  std::vector<std::pair<std::string, Shape>> out = {{"model.embed_tokens", {c.vocab_size, c.hidden_size}}};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const HfLinear& l : hf_layer_linears(c, i)) {
      const HfLinearShape s = hf_linear_shape(c, l.role, l.expert);
      out.push_back({p + l.name, {s.out, s.in}});
    }
    for (const HfRouter& r : hf_layer_routers(c, i))
      out.push_back({p + r.name, {r.shared_gate ? 1 : c.num_experts, c.hidden_size}});
  }
  out.push_back({"lm_head", {c.vocab_size, c.hidden_size}});
  return out;
}

}  // namespace

std::vector<std::string> lora_candidate_modules(const ModelConfig& c) {
  std::vector<std::string> out;
  for (const auto& [m, shape] : candidate_shapes(c)) out.push_back(m);
  return out;
}

bool peft_targets(const nlohmann::json& config, const std::string& module) {
  const auto ex = config.find("exclude_modules");
  if (ex != config.end() && !json_is_default(*ex)) {
    if (ex->is_string() ? regex_match(*ex, module, true, "exclude_modules") : in_module_list(*ex, module))
      return false;
  }
  const nlohmann::json& t = config.at("target_modules");
  if (t.is_string()) {
    if (t.get<std::string>() == "all-linear") return module != "lm_head" && module != "model.embed_tokens";
    return regex_match(t, module, true, "target_modules");
  }
  if (!in_module_list(t, module)) return false;
  const auto lt = config.find("layers_to_transform");
  if (lt == config.end() || lt->is_null() || (lt->is_array() && lt->empty())) return true;
  const std::optional<int64_t> idx = layer_index(config, module);
  if (!idx) return false;
  if (lt->is_number_integer()) return *idx == lt->get<int64_t>();
  for (const auto& v : *lt)
    if (v.get<int64_t>() == *idx) return true;
  return false;
}

std::string peft_pattern_key(const nlohmann::json& patterns, const std::string& module) {
  if (!patterns.is_object()) return "";
  for (auto it = patterns.begin(); it != patterns.end(); ++it)
    if (regex_match("(.*\\.)?(" + it.key() + ")$", module, false, "rank_pattern/alpha_pattern")) return it.key();
  return "";
}

namespace {

LoraAdapter read_peft_adapter_checked(const LoraSpec& spec, const ModelConfig& c, const Checkpoint& base) {
  const std::filesystem::path dir = spec.path;
  const std::string where = dir.string();
  if (is_file(dir)) {
    if (dir.extension() == ".gguf")
      throw unsupported(where, "a GGUF LoRA adapter applies to a GGUF base model; for a Hugging Face base give the "
                               "PEFT adapter folder");
    throw invalid_input(where, "expected a PEFT adapter folder (adapter_config.json, adapter_model.safetensors)");
  }
  if (!is_folder(dir)) throw not_found(where, "no such adapter folder");
  const std::filesystem::path cfg_file = dir / "adapter_config.json";
  const std::filesystem::path st_file = dir / "adapter_model.safetensors";
  if (!is_file(cfg_file)) throw not_found(where, "adapter_config.json is missing (not a PEFT adapter folder)");
  if (!is_file(st_file)) {
    if (is_file(dir / "adapter_model.bin"))
      throw unsupported((dir / "adapter_model.bin").string(),
                        "pickled adapters are not read (unpickling can run code); save the adapter with "
                        "safe_serialization=True to get adapter_model.safetensors");
    throw not_found(where, "adapter_model.safetensors is missing");
  }
  const std::string cfg_where = cfg_file.string();
  LoraAdapter a;
  a.source = where;
  a.user_scale = spec.scale;
  try {
    a.config = nlohmann::json::parse(read_text_file(cfg_file));
  } catch (const nlohmann::json::exception& e) {
    throw invalid_input(cfg_where, std::string("not valid JSON: ") + e.what());
  }
  const nlohmann::json& cfg = a.config;
  if (!cfg.is_object()) throw invalid_input(cfg_where, "expected a JSON object");
  const std::string peft_type = cfg.value("peft_type", "LORA");
  if (peft_type != "LORA")
    throw unsupported(cfg_where, "peft_type '" + printable_text(peft_type) + "' is not read (LoRA adapters only)");
  for (auto it = cfg.begin(); it != cfg.end(); ++it)
    if (!honoured_keys().count(it.key()) && !json_is_default(it.value()))
      throw unsupported(cfg_where, "'" + it.key() + "' = " + printable_text(it.value().dump()) +
                                       " is not supported (it changes what the adapter computes)");
  if (!cfg.contains("target_modules") || !(cfg["target_modules"].is_string() || cfg["target_modules"].is_array()))
    throw invalid_input(cfg_where, "'target_modules' must be a list of module names or a regular expression");
  const std::string bias = cfg.value("bias", "none");
  if (bias != "none" && bias != "all" && bias != "lora_only")
    throw invalid_input(cfg_where, "'bias' must be none, all or lora_only, not '" + printable_text(bias) + "'");
  const bool rslora = cfg.value("use_rslora", false);
  a.dora = cfg.value("use_dora", false);
  const double r_default = number(cfg, "r", 8, cfg_where);
  const double alpha_default = number(cfg, "lora_alpha", 8, cfg_where);
  const nlohmann::json rank_pattern = cfg.value("rank_pattern", nlohmann::json::object());
  const nlohmann::json alpha_pattern = cfg.value("alpha_pattern", nlohmann::json::object());
  // fan_in_fan_out transposes Conv1D weights (GPT-2); for the torch.nn.Linear
  // modules of the architectures read here PEFT resets it to false, and so
  // does this reader.
  nlohmann::json modules_to_save = cfg.value("modules_to_save", nlohmann::json::array());
  if (modules_to_save.is_null()) modules_to_save = nlohmann::json::array();

  const Checkpoint ad = Checkpoint::open(st_file);
  const std::string st_where = st_file.string();
  // Group the adapter's tensors by module.
  struct Parts {
    std::optional<Tensor> a, b, mag;
    bool embedding = false;
  };
  std::map<std::string, Parts> parts;
  for (const std::string& full : ad.names()) {
    if (full.rfind(kPrefix, 0) != 0)
      throw invalid_input(st_where, "tensor '" + full + "' does not start with '" + kPrefix +
                                        "' (not saved by PEFT's save_pretrained)");
    const std::string name = full.substr(std::string(kPrefix).size());
    auto part = [&](const std::string& suffix) -> std::optional<std::string> {
      if (ends_with(name, suffix)) return name.substr(0, name.size() - suffix.size());
      return std::nullopt;
    };
    if (auto m = part(".lora_A.weight")) {
      parts[*m].a = ad.tensor(full);
    } else if (auto m = part(".lora_B.weight")) {
      parts[*m].b = ad.tensor(full);
    } else if (auto m = part(".lora_embedding_A")) {
      parts[*m].a = ad.tensor(full), parts[*m].embedding = true;
    } else if (auto m = part(".lora_embedding_B")) {
      parts[*m].b = ad.tensor(full), parts[*m].embedding = true;
    } else if (auto m = part(".lora_magnitude_vector")) {
      parts[*m].mag = ad.tensor(full);
    } else if (auto m = part(".lora_magnitude_vector.weight")) {
      parts[*m].mag = ad.tensor(full);
    } else if (ends_with(name, ".lora_B.bias")) {
      throw unsupported(st_where, "tensor '" + full + "' is a LoRA bias (lora_bias), which is not supported");
    } else if (name.find(".lora_") != std::string::npos) {
      throw unsupported(st_where, "tensor '" + full + "' is not a part of LoRA this reader knows");
    } else {
      // A whole tensor: modules_to_save or a trained bias (bias "all" and
      // "lora_only" save an adapted module's as "<module>.base_layer.bias").
      std::string target = full.substr(std::string(kPrefix).size());
      const size_t bl = target.find(".base_layer.");
      if (bl != std::string::npos) target.erase(bl, std::string(".base_layer").size());
      if (!base.contains(target))
        throw invalid_input(st_where, "tensor '" + full + "' replaces '" + target + "', which the base model does not have");
      const bool saved_module = in_module_list(modules_to_save, target.substr(0, target.rfind('.')));
      const bool trained_bias = bias != "none" && ends_with(target, ".bias");
      if (!saved_module && !trained_bias)
        throw invalid_input(st_where, "tensor '" + full + "' is neither in modules_to_save nor a trained bias");
      Tensor v = ad.tensor(full);
      check_shape(v, base.info(target).shape, st_where, full, "the base tensor's");
      if (!dtype_is_float(base.info(target).dtype))
        throw unsupported(st_where, "tensor '" + full + "' replaces '" + target +
                                        "', which the base stores quantized; merge into the unquantized model instead");
      if (!dtype_is_float(v.dtype())) throw invalid_input(st_where, "tensor '" + full + "' is not a float tensor");
      a.replaced.push_back({target, v});
    }
  }

  // The modules the config selects must be exactly those the file adapts.
  const std::vector<std::pair<std::string, Shape>> candidates = candidate_shapes(c);
  std::set<std::string> known;
  for (const auto& [m, shape] : candidates) known.insert(m);
  for (const auto& [m, p] : parts)
    if (!known.count(m))
      throw invalid_input(st_where, "adapts module '" + m + "', which the base model (" + c.model_type +
                                        ") does not have as a Linear or embedding");
  for (const auto& [m, ws] : candidates) {
    const bool selected = peft_targets(cfg, m);
    const auto it = parts.find(m);
    if (it == parts.end()) {
      if (selected)
        throw invalid_input(where, "module '" + m + "' is selected by adapter_config.json's target_modules but "
                                   "adapter_model.safetensors has no lora_A/lora_B for it");
      continue;
    }
    if (!selected)
      throw invalid_input(where, "adapter_model.safetensors adapts '" + m + "', which adapter_config.json's "
                                 "target_modules / layers_to_transform do not select");
    const Parts& p = it->second;
    if (!p.a || !p.b) throw invalid_input(st_where, "module '" + m + "' has lora_" + (p.a ? "A" : "B") +
                                                        " without lora_" + (p.a ? "B" : "A"));
    if (p.embedding && a.dora) throw unsupported(st_where, "DoRA on the embedding '" + m + "' is not supported");
    const std::string rk = peft_pattern_key(rank_pattern, m), ak = peft_pattern_key(alpha_pattern, m);
    const double r = rk.empty() ? r_default : rank_pattern[rk].get<double>();
    const double alpha = ak.empty() ? alpha_default : alpha_pattern[ak].get<double>();
    if (!(r >= 1) || r != std::floor(r) || r > (1 << 20))
      throw invalid_input(cfg_where, "the rank of '" + m + "' is not an integer from 1 to 2^20");
    if (c.tie_word_embeddings && (m == "lm_head" || m == "model.embed_tokens"))
      throw unsupported(st_where, "adapts '" + m + "', whose weight the base ties to " +
                                      (m == "lm_head" ? "the embedding" : "the output head") +
                                      " (tie_word_embeddings); such adapters are not supported");
    // The stored weight, where the base stores it plainly, must have the
    // shape the config implies (the merge walks the stored tensor).
    if (base.contains(m + ".weight") && base.info(m + ".weight").shape != ws)
      throw invalid_input(where, "the base's '" + m + ".weight' is " + shape_str(base.info(m + ".weight").shape) +
                                     ", its config.json implies " + shape_str(ws));
    const int64_t ri = static_cast<int64_t>(r);
    LoraModule lm;
    lm.module = m;
    lm.embedding = p.embedding;
    lm.a = as_f32(*p.a);
    lm.b = as_f32(*p.b);
    const std::string why = "rank " + std::to_string(ri) + " from adapter_config.json" +
                            (rk.empty() ? "" : " (rank_pattern '" + rk + "')");
    const std::string an = kPrefix + m + (p.embedding ? ".lora_embedding_A" : ".lora_A.weight");
    const std::string bn = kPrefix + m + (p.embedding ? ".lora_embedding_B" : ".lora_B.weight");
    if (p.embedding) {  // A [r, vocab], B [hidden, r]
      check_shape(lm.a, {ri, ws[0]}, st_where, an, why);
      check_shape(lm.b, {ws[1], ri}, st_where, bn, why);
    } else {
      check_shape(lm.a, {ri, ws[1]}, st_where, an, why);
      check_shape(lm.b, {ws[0], ri}, st_where, bn, why);
    }
    lm.alpha = static_cast<float>(alpha);
    lm.rslora = rslora;
    lm.scale = static_cast<float>((rslora ? alpha / std::sqrt(r) : alpha / r) * spec.scale);
    if (a.dora) {
      if (!p.mag) throw invalid_input(st_where, "module '" + m + "' has no lora_magnitude_vector (use_dora is true)");
      Tensor mag = as_f32(*p.mag);
      check_shape(mag, {ws[0]}, st_where, kPrefix + m + ".lora_magnitude_vector", "one magnitude per output row");
      lm.magnitude = mag.to_f32_vector();
    } else if (p.mag) {
      throw invalid_input(st_where, "module '" + m + "' has a lora_magnitude_vector but use_dora is false");
    }
    for (float v : lm.a.to_f32_vector())
      if (!std::isfinite(v)) throw invalid_input(st_where, "tensor '" + an + "' holds NaN or infinity");
    for (float v : lm.b.to_f32_vector())
      if (!std::isfinite(v)) throw invalid_input(st_where, "tensor '" + bn + "' holds NaN or infinity");
    a.modules.push_back(std::move(lm));
  }
  if (a.modules.empty() && a.replaced.empty()) throw invalid_input(where, "the adapter holds no tensors");
  return a;
}

}  // namespace

LoraAdapter read_peft_adapter(const LoraSpec& spec, const ModelConfig& c, const Checkpoint& base) {
  try {
    return read_peft_adapter_checked(spec, c, base);
  } catch (const nlohmann::json::exception& e) {
    // A value of the wrong JSON type ("target_modules": [1, 2], "use_dora": "yes").
    throw invalid_input((spec.path / "adapter_config.json").string(),
                        std::string("a value has the wrong type: ") + e.what());
  }
}

}  // namespace qf
