// The recipe parser: llm-compressor's stage/group/modifier layout, the
// QuantizationMixin and GPTQModifier arguments, compressed-tensors'
// QuantizationScheme/QuantizationArgs and preset schemes, and quantforge's
// calibration/export sections. Every message starts "FILE:LINE:COL: ".
//
// Sources (read at llm-compressor ab1ba3ef, compressed-tensors 0.18.0):
//   llm-compressor  src/llmcompressor/recipe/recipe.py (Recipe.from_dict)
//                   src/llmcompressor/modifiers/modifier.py (extra="forbid", base fields)
//                   src/llmcompressor/modifiers/quantization/quantization/mixin.py
//                   src/llmcompressor/modifiers/gptq/base.py (resolve_actorder)
//   compressed-tensors src/compressed_tensors/quantization/quant_args.py
//                   src/compressed_tensors/quantization/quant_scheme.py (PRESET_SCHEMES)
#include "recipe/recipe.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "core/did_you_mean.h"
#include "core/error.h"
#include "core/io.h"
#include "quantizers/quant_args.h"
#include "recipe/recipe_internal.h"
#include "recipe/yaml_reader.h"

namespace qf {

namespace {

using yaml::join;
using yaml::lower;
using yaml::quote;
std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}


// ---- presets ----------------------------------------------------------------

struct Preset {
  bool supported = false;
  bool has_weights = false;
  QuantScheme weights;
  std::optional<ActivationScheme> input_activations;
};

// compressed-tensors 0.18.0 PRESET_SCHEMES.
const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = {
      "UNQUANTIZED", "W4A16_ASYM", "W8A8",  "INT8",  "W4AFP8", "FP8",   "FP8_DYNAMIC", "FP8_BLOCK",
      "NVFP4A16",    "NVFP4",      "MXFP4A16", "MXFP4", "MXFP8A16", "MXFP8", "W2A4", "W2A8",
      "W2A16",       "W3A4",       "W3A8",  "W3A16", "W4A4",  "W4A8",  "W4A16", "W5A8",
      "W5A16",       "W6A8",       "W6A16", "W7A8",  "W7A16", "W8A16",
      // quantforge: bitsandbytes' 4-bit types (export: {format: bitsandbytes})
      "NF4", "FP4"};
  return names;
}

std::optional<Preset> preset(const std::string& name_any_case) {
  const std::string name = upper(name_any_case);
  const auto& names = preset_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) return std::nullopt;
  Preset p;
  if (name == "UNQUANTIZED") {
    p.supported = true;
    return p;
  }
  const QuantScheme int_g128 = QuantScheme::make(4, true, QuantStrategy::Group, 128);
  if (name == "W4A16_ASYM") {
    p.supported = p.has_weights = true;
    p.weights = QuantScheme::make(4, false, QuantStrategy::Group, 128);
    return p;
  }
  if (name == "W8A8" || name == "INT8") {  // INT8_W8A8: int8 channel weights, int8 per-token dynamic inputs
    p.supported = p.has_weights = true;
    p.weights = QuantScheme::make(8, true, QuantStrategy::Channel, 0);
    p.input_activations = ActivationScheme::int8_token();
    return p;
  }
  // _int_wnam(n[, m]): int, symmetric, group 128 (W8A16 too, since
  // compressed-tensors 0.16.0; it was per-channel before); activations, when
  // named, int m-bit per token, dynamic. Only 8-bit activations are run here.
  if (name.size() == 4 + (name.back() == '6' ? 1 : 0) && name[0] == 'W' && name[2] == 'A' && name[1] >= '2' &&
      name[1] <= '8') {
    const std::string act = name.substr(3);
    if (act != "16" && act != "8") return p;  // W*A4: known, not supported
    p.supported = p.has_weights = true;
    p.weights = int_g128;
    p.weights.bits = name[1] - '0';
    if (act == "8") p.input_activations = ActivationScheme::int8_token();
    return p;
  }
  if (name == "W4AFP8") {
    p.supported = p.has_weights = true;
    p.weights = int_g128;
    p.input_activations = ActivationScheme::fp8_token();
    return p;
  }
  if (name == "FP8") {  // fp8 per-tensor weights, static per-tensor inputs
    p.supported = p.has_weights = true;
    p.weights = QuantScheme::fp8(QuantStrategy::Tensor, DType::F16, 0);
    p.input_activations = ActivationScheme::fp8_tensor_static();
    return p;
  }
  if (name == "FP8_DYNAMIC") {  // fp8 per-channel weights, per-token dynamic inputs
    p.supported = p.has_weights = true;
    p.weights = QuantScheme::fp8(QuantStrategy::Channel, DType::F16, 0);
    p.input_activations = ActivationScheme::fp8_token();
    return p;
  }
  if (name == "NF4" || name == "FP4") {  // bitsandbytes: blocks of 64, f32 absmax, round to nearest only
    p.supported = p.has_weights = true;
    p.weights = QuantScheme::bnb4(name == "NF4" ? QuantType::Nf4 : QuantType::Fp4);
    return p;
  }
  if (name == "NVFP4A16" || name == "NVFP4") {
    p.supported = p.has_weights = true;
    p.weights = QuantScheme::nvfp4();
    if (name == "NVFP4") p.input_activations = ActivationScheme::nvfp4();
    return p;
  }
  return p;  // known, not supported yet (FP8_BLOCK, MXFP*, W*A4)
}

const char* kSupportedPresets =
    "W4A16, W4A16_ASYM, W8A16, W2A16..W7A16, W8A8 (INT8), W4A8, W4AFP8, FP8, FP8_DYNAMIC, NVFP4, NVFP4A16, NF4, FP4, "
    "UNQUANTIZED";

// A group of a preset; `prefix` starts the messages after the position.
ModifierSpec::Group make_preset_group(const std::string& name, const std::vector<std::string>& targets,
                                      const std::string& group_name, const std::string& where, const std::string& prefix) {
  std::optional<Preset> p = preset(name);
  if (!p) {
    const std::string c = closest_word(upper(name), preset_names());
    throw invalid_input(where, prefix + "unknown preset scheme " + quote(name) + " (" +
                                   (c.empty() ? std::string("supported presets: ") + kSupportedPresets
                                              : "did you mean " + quote(c) + "?") +
                                   ")");
  }
  if (!p->supported)
    throw unsupported(where, prefix + "preset " + quote(upper(name)) + " is not supported yet (supported presets: " +
                                 kSupportedPresets + "; block and MX formats and 4-bit activations are not)");
  ModifierSpec::Group g;
  g.name = group_name;
  g.where = where;
  g.targets = targets;
  g.quantize_weights = p->has_weights;
  g.weights = p->weights;
  g.input_activations = p->input_activations;
  // Float schemes name their scale dtype (NVFP4: e4m3 blocks); FP8 scales
  // follow the model dtype like integer ones.
  g.scale_dtype_set = g.weights.is_nvfp4();
  return g;
}

// transformers' convert_file_size_to_int: KB/MB/GB/TB are powers of 1000,
// KiB/MiB/GiB/TiB powers of 1024; a bare number is bytes. 0 when `v` is not
// such a size; *too_large when it overflows, *zero when it is a size of 0.
// `fraction`: a decimal number is accepted before a unit ("4.2GiB", rounded
// down to whole bytes); transformers (shard_size) takes whole numbers only.
uint64_t parse_size_string(const std::string& v, bool* too_large, bool* zero, bool fraction = false) {
  *too_large = *zero = false;
  size_t i = 0;
  while (i < v.size() && std::isdigit(static_cast<unsigned char>(v[i]))) ++i;
  uint64_t num = 0;
  const bool num_ok = i > 0 && std::from_chars(v.data(), v.data() + i, num).ec == std::errc();
  // The decimal digits after a point, as a fraction of one unit.
  long double frac = 0;
  size_t digits = 0;
  if (fraction && i < v.size() && v[i] == '.') {
    long double scale = 0.1L;
    for (size_t k = i + 1; k < v.size() && std::isdigit(static_cast<unsigned char>(v[k])); ++k, ++digits, scale /= 10)
      frac += scale * (v[k] - '0');
    if (digits == 0) return 0;
    i += 1 + digits;
  }
  std::string unit = upper(v.substr(i));
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  static const std::vector<std::pair<std::string, uint64_t>> units = {
      {"", 1},           {"B", 1},          {"KB", 1000ull},         {"MB", 1000000ull},
      {"GB", 1000000000ull}, {"TB", 1000000000000ull}, {"KIB", 1ull << 10}, {"MIB", 1ull << 20},
      {"GIB", 1ull << 30}, {"TIB", 1ull << 40}};
  uint64_t mult = 0;
  for (const auto& [u, m] : units)
    if (u == unit) mult = m;
  if (!num_ok || mult == 0 || (digits > 0 && mult == 1)) return 0;
  if (num > UINT64_MAX / mult) {
    *too_large = true;
    return 0;
  }
  const uint64_t extra = static_cast<uint64_t>(frac * static_cast<long double>(mult));
  if (num * mult > UINT64_MAX - extra) {
    *too_large = true;
    return 0;
  }
  if (num * mult + extra == 0) {
    *zero = true;
    return 0;
  }
  return num * mult + extra;
}

// ---- the parser ---------------------------------------------------------------

class Parser : public YamlReader {
 public:
  Parser(std::string file, int line_offset) : YamlReader(std::move(file), line_offset) {}

  Recipe parse(const YAML::Node& root, const YAML::Mark& root_mark);

 private:
  // Targets and ignore entries: "re:" regexes must compile.
  std::vector<std::string> as_patterns(const YAML::Node& n, const std::string& path) {
    std::vector<std::string> out = as_string_list(n, path);
    for (size_t i = 0; i < out.size(); ++i) {
      const YAML::Node item = n.IsSequence() ? n[i] : n;
      if (out[i].empty()) fail(item, path + ": empty pattern");
      if (out[i].rfind("re:", 0) == 0) {
        const std::string err = regex_error(out[i].substr(3));
        if (!err.empty()) fail(item, path + ": " + quote(out[i]) + ": " + err);
      }
    }
    return out;
  }

  // Keys whose value may not be null (llm-compressor's non-Optional fields,
  // and all of quantforge's): "key:" with the value forgotten is an error, not
  // the default.
  void reject_null(const Entries& a, const std::string& path, std::initializer_list<const char*> keys) {
    for (const char* k : keys)
      if (const Entry* e = a.find(k); e && e->value.IsNull())
        fail(e->key_node, path + "." + k + ": expected a value, got null");
  }

  // ---- sections ----
  void parse_stage(const Entry& stage, Recipe& r);
  void parse_modifier(const Entry& mod, const std::string& stage, const std::string& group, Recipe& r);
  ModifierSpec::Group parse_scheme(const Entry& g, const std::string& path);
  ActivationScheme parse_activations(const YAML::Node& n, const std::string& path, bool kv_cache);
  void parse_awq_args(const Entries& a, ModifierSpec& m);
  void parse_smoothquant(const Entry& mod, ModifierSpec& m);
  void parse_weights(const YAML::Node& n, const std::string& path, ModifierSpec::Group& g);
  std::string parse_actorder(const YAML::Node& n, const std::string& path);
  QuantArgs quant_args(const Entries& a, const std::string& path);
  [[noreturn]] void fail_args(const QuantArgsProblem& p, const Entries& a, const YAML::Node& n, const std::string& path);
  std::string parse_observer(const YAML::Node& n, const std::string& path);
  std::string parse_act_observer(const YAML::Node& n, const std::string& path);
  void check_static_act_observer(const std::string& name, const YAML::Node& n, const std::string& path);
  void parse_weight_observer_kwargs(const YAML::Node& n, const std::string& path, ModifierSpec::Group& g);

  // The modifier's weight observer override (weight_observer / observer.weights)
  // while its config_groups are parsed: empty when none.
  std::string weight_obs_override_;
  void parse_calibration(const Entry& e, CalibrationSpec& c);
  void parse_export(const Entry& e, ExportSpec& x);
  void parse_mixed_precision(const Entry& e, Recipe& r);
  void parse_vision(const Entry& e, Recipe& r);
  void check_mixed_precision(const Entry& e, const Recipe& r);

  // The recipe has a mixed_precision section: its quantizer takes its schemes from there.
  bool mixed_ = false;
};

const std::vector<std::string> kModifierKinds = {"GPTQModifier", "QuantizationModifier", "AWQModifier",
                                                "SmoothQuantModifier"};
const char* kSupportedModifiers = "GPTQModifier, QuantizationModifier, AWQModifier, SmoothQuantModifier";
const std::vector<std::string> kKnownModifiers = {
    "AutoRoundModifier",       "ConstantPruningModifier",
    "LogarithmicEqualizationModifier", "MagnitudePruningModifier", "QuIPModifier",
    "REAPPruningModifier", "SparseGPTModifier",
    "SpinQuantModifier", "WandaPruningModifier"};
const std::vector<std::string> kBaseKeys = {"index", "group", "start", "end", "update", "requires_calibration_data"};
const std::vector<std::string> kAwqKeys = {"mappings", "offload_device", "duo_scaling", "n_grid", "apply_clip", "loss"};
const std::vector<std::string> kSmoothQuantKeys = {
    "smoothing_strength", "mappings", "ignore", "num_calibration_steps", "calibration_function", "algorithm",
    "search_smoothing_strength", "smoothing_strength_grid"};

const std::vector<std::string> kMixinKeys = {
    "config_groups", "targets", "ignore", "scheme", "kv_cache_scheme", "weight_observer", "input_observer",
    "output_observer", "observer", "bypass_divisibility_checks",
    // Modifier base fields (start/end/update/index only matter for training)
    "index", "group", "start", "end", "update", "requires_calibration_data"};
const std::vector<std::string> kGptqOnlyKeys = {"block_size", "dampening_frac", "actorder", "offload_hessians",
                                                "sequential_targets", "sequential_update"};
const std::vector<std::string> kArgsKeys = {"num_bits", "type",  "symmetric", "group_size",
                                            "strategy", "block_structure", "dynamic", "actorder",
                                            "scale_dtype", "zp_dtype", "observer", "observer_kwargs"};

std::string hint_quant_modifier_key(const std::string& key) {
  if (std::find(kGptqOnlyKeys.begin(), kGptqOnlyKeys.end(), key) != kGptqOnlyKeys.end())
    return quote(key) + " is a GPTQModifier argument; QuantizationModifier rounds to nearest";
  if (std::find(kArgsKeys.begin(), kArgsKeys.end(), key) != kArgsKeys.end() && key != "observer" &&
      key != "actorder")
    return "quantization arguments go under config_groups.<name>.weights, or use a preset such as scheme: W4A16";
  return "";
}
std::string hint_gptq_key(const std::string& key) {
  if (std::find(kArgsKeys.begin(), kArgsKeys.end(), key) != kArgsKeys.end())
    return "quantization arguments go under config_groups.<name>.weights, or use a preset such as scheme: W4A16";
  return "";
}

Recipe Parser::parse(const YAML::Node& root, const YAML::Mark& root_mark) {
  Recipe r;
  last_ = root_mark;
  if (!root.IsDefined() || root.IsNull()) fail_at(root_mark, "empty recipe (expected a mapping with a '<name>_stage:' key)");
  if (!root.IsMap())
    fail(root, "a recipe is a mapping of stages ('quant_stage: quant_modifiers: GPTQModifier: ...'), got " + got(root));
  Entries top = entries(root, "");
  mixed_ = top.has("mixed_precision");
  for (const Entry& e : top.items) {
    const std::string& k = e.key;
    const size_t us = k.rfind("_stage");
    const bool numbered = us != std::string::npos && us + 6 < k.size() && k[us + 6] == '_' &&
                          k.find_first_not_of("0123456789", us + 7) == std::string::npos && us + 7 < k.size();
    if (ends_with(k, "_stage") || numbered) {
      parse_stage(e, r);
    } else if (k == "calibration") {
      parse_calibration(e, r.calibration);
    } else if (k == "export") {
      parse_export(e, r.export_);
    } else if (k == "mixed_precision") {
      parse_mixed_precision(e, r);
    } else if (k == "vision") {
      parse_vision(e, r);
    } else if (k == "args") {
      // llm-compressor's recipe args: stored by it, not used by quantforge.
      if (!e.value.IsNull() && !e.value.IsMap()) fail(e.value, "args: expected a mapping, got " + got(e.value));
    } else if (k == "modifiers" || k == "stages") {
      fail(e.key_node, "unknown key " + quote(k) +
                           " (llm-compressor recipes put modifiers under '<name>_stage: <name>_modifiers:', e.g. "
                           "'quant_stage: {quant_modifiers: {GPTQModifier: {scheme: W4A16}}}')");
    } else if (std::find(kModifierKinds.begin(), kModifierKinds.end(), k) != kModifierKinds.end() ||
               std::find(kKnownModifiers.begin(), kKnownModifiers.end(), k) != kKnownModifiers.end()) {
      fail(e.key_node, "modifier " + quote(k) +
                           " at the top level (put it under a stage and a group: 'quant_stage: quant_modifiers: " + k +
                           ": ...')");
    } else {
      const std::string c =
          closest_word(k, {"calibration", "export", "args", "quant_stage", "mixed_precision", "vision"});
      fail(e.key_node, "unknown key " + quote(k) + " (" +
                           (c.empty() ? std::string("valid keys: <name>_stage, calibration, export, mixed_precision, vision, args")
                                      : "did you mean " + quote(c) + "?") +
                           ")");
    }
  }
  if (r.modifiers.empty())
    fail_at(root_mark, "the recipe has no modifiers (expected 'quant_stage: quant_modifiers: GPTQModifier: {...}' "
                       "or QuantizationModifier)");
  if (mixed_) check_mixed_precision(*top.find("mixed_precision"), r);
  return r;
}

void Parser::parse_stage(const Entry& stage, Recipe& r) {
  std::string stage_name = stage.key.substr(0, stage.key.rfind("_stage"));
  if (!stage.value.IsMap())
    fail(stage.value, stage.key + ": expected a mapping of '<name>_modifiers:' groups, got " + got(stage.value));
  Entries groups = entries(stage.value, stage.key);
  for (const Entry& g : groups.items) {
    if (!ends_with(g.key, "_modifiers")) {
      const bool is_mod = std::find(kModifierKinds.begin(), kModifierKinds.end(), g.key) != kModifierKinds.end() ||
                          std::find(kKnownModifiers.begin(), kKnownModifiers.end(), g.key) != kKnownModifiers.end();
      fail(g.key_node, stage.key + ": unknown key " + quote(g.key) +
                           (is_mod ? " (put modifiers under a group key ending in '_modifiers', e.g. 'quant_modifiers: " +
                                         g.key + ": ...')"
                                   : " (a stage holds groups: keys ending in '_modifiers')"));
    }
    if (!g.value.IsMap())
      fail(g.value, stage.key + "." + g.key + ": expected a mapping of modifiers ('GPTQModifier: {...}'), got " +
                        got(g.value));
    const std::string group_name = g.key.substr(0, g.key.size() - 10);
    Entries mods = entries(g.value, stage.key + "." + g.key);
    for (const Entry& m : mods.items) parse_modifier(m, stage_name, group_name, r);
  }
}

void Parser::parse_modifier(const Entry& mod, const std::string& stage, const std::string& group, Recipe& r) {
  const std::string& kind = mod.key;
  if (std::find(kModifierKinds.begin(), kModifierKinds.end(), kind) == kModifierKinds.end()) {
    if (std::find(kKnownModifiers.begin(), kKnownModifiers.end(), kind) != kKnownModifiers.end())
      fail(mod.key_node, kind + " is not supported yet (supported modifiers: " + kSupportedModifiers + ")",
           ErrorKind::Unsupported);
    std::vector<std::string> all = kModifierKinds;
    all.insert(all.end(), kKnownModifiers.begin(), kKnownModifiers.end());
    const std::string c = closest_word(kind, all);
    fail(mod.key_node, "unknown modifier " + quote(kind) + " (" +
                           (c.empty() ? std::string("supported modifiers: ") + kSupportedModifiers
                                      : "did you mean " + quote(c) + "?") +
                           ")");
  }
  const bool gptq = kind == "GPTQModifier";
  const bool awq = kind == "AWQModifier";
  ModifierSpec m;
  m.kind = kind;
  m.stage = stage;
  m.group = group;
  m.where = pos(mark(mod.key_node));
  const YAML::Mark mod_mark = mark(mod.key_node);
  if (kind == "SmoothQuantModifier") {
    parse_smoothquant(mod, m);
    r.modifiers.push_back(std::move(m));
    return;
  }

  std::vector<std::string> allowed = kMixinKeys;
  if (gptq) allowed.insert(allowed.end(), kGptqOnlyKeys.begin(), kGptqOnlyKeys.end());
  if (awq) allowed.insert(allowed.end(), kAwqKeys.begin(), kAwqKeys.end());
  Entries a = entries(mod.value, kind, &allowed, gptq ? &hint_gptq_key : &hint_quant_modifier_key);
  if (awq) parse_awq_args(a, m);
  reject_null(a, kind, {"targets", "ignore", "bypass_divisibility_checks", "requires_calibration_data", "block_size",
                        "dampening_frac", "offload_hessians", "sequential_update"});

  // Modifier base fields: accepted, unused in one-shot runs.
  if (a.has("group")) m.group = as_string(a.get("group"), kind + ".group");
  for (const char* k : {"index", "start", "end", "update"})
    if (a.has(k)) as_double(a.get(k), kind + "." + k);
  if (a.has("requires_calibration_data"))
    m.requires_calibration_data = as_bool(a.get("requires_calibration_data"), kind + ".requires_calibration_data");

  if (a.has("targets")) m.targets = as_patterns(a.get("targets"), kind + ".targets");
  if (a.has("ignore")) m.ignore = as_patterns(a.get("ignore"), kind + ".ignore");
  if (a.has("bypass_divisibility_checks")) {
    m.bypass_divisibility_checks = as_bool(a.get("bypass_divisibility_checks"), kind + ".bypass_divisibility_checks");
    m.bypass_where = pos(mark(a.find("bypass_divisibility_checks")->key_node));
  }
  if (a.has("kv_cache_scheme") && !a.get("kv_cache_scheme").IsNull())
    m.kv_cache_scheme = parse_activations(a.get("kv_cache_scheme"), kind + ".kv_cache_scheme", true);

  // Observer overrides (mixin._apply_observer_overrides), read before the
  // groups: a weight observer override decides which observer_kwargs apply.
  if (a.has("observer"))
    for (const char* k : {"weight_observer", "input_observer", "output_observer"})
      if (a.has(k))
        fail(a.find("observer")->key_node,
             kind + ": set either 'observer' or 'weight_observer'/'input_observer'/'output_observer', not both");
  std::string weight_obs, input_obs;
  YAML::Node weight_obs_node, input_obs_node;
  if (a.has("weight_observer")) {
    weight_obs_node = a.get("weight_observer");
    weight_obs = parse_observer(weight_obs_node, kind + ".weight_observer");
  }
  if (a.has("input_observer")) {
    input_obs_node = a.get("input_observer");
    input_obs = parse_act_observer(input_obs_node, kind + ".input_observer");
  }
  // Output activations are never quantized (rejected), so an output observer
  // has nothing to observe, as in llm-compressor: the name is only checked.
  if (a.has("output_observer")) parse_act_observer(a.get("output_observer"), kind + ".output_observer");
  if (a.has("observer")) {
    static const std::vector<std::string> obs_keys = {"weights", "input", "output"};
    Entries o = entries(a.get("observer"), kind + ".observer", &obs_keys);
    for (const Entry& e : o.items) {
      if (e.key == "weights") {
        weight_obs_node = e.value;
        weight_obs = parse_observer(e.value, kind + ".observer." + e.key);
      } else {
        const std::string v = parse_act_observer(e.value, kind + ".observer." + e.key);
        if (e.key == "input") input_obs = v, input_obs_node = e.value;
      }
    }
  }
  weight_obs_override_ = weight_obs;

  // scheme / config_groups
  const bool has_scheme = a.has("scheme");
  const bool has_groups =
      a.has("config_groups") && (!a.get("config_groups").IsMap() || a.get("config_groups").size() > 0);
  if (has_scheme && has_groups) {
    const Entry* later = a.find("scheme")->key_node.Mark().pos > a.find("config_groups")->key_node.Mark().pos
                             ? a.find("scheme")
                             : a.find("config_groups");
    fail(later->key_node, kind + ": set either 'scheme' or 'config_groups', not both");
  }
  if (mixed_ && (has_scheme || has_groups))
    fail(a.find(has_scheme ? "scheme" : "config_groups")->key_node,
         kind + "." + (has_scheme ? "scheme" : "config_groups") +
             ": the recipe has a mixed_precision section, which chooses every Linear's scheme from its 'schemes'; "
             "remove this key (the modifier's targets and ignore still say which Linears are quantized)");
  if (mixed_) {
    // The groups come from the mixed-precision search (calibration/mixed_precision.h).
  } else if (has_scheme) {
    const YAML::Node s = a.get("scheme");
    auto expand = [&](const YAML::Node& name_node, const std::vector<std::string>& targets) {
      const std::string name = as_string(name_node, kind + ".scheme");
      m.groups.push_back(make_preset_group(name, targets, "group_" + std::to_string(m.groups.size()), pos(mark(name_node)),
                                      kind + ".scheme: "));
    };
    if (s.IsScalar()) {
      expand(s, m.targets);
    } else if (s.IsMap()) {
      // {PRESET: targets, ...}: keys must be presets (mixin.validate_scheme).
      Entries ps = entries(s, kind + ".scheme");
      for (const Entry& e : ps.items) expand(e.key_node, as_patterns(e.value, kind + ".scheme." + e.key));
    } else {
      fail(s, kind + ".scheme: expected a preset name (e.g. W4A16) or a mapping {PRESET: targets}, got " + got(s));
    }
  } else if (has_groups) {
    Entries gs = entries(a.get("config_groups"), kind + ".config_groups");
    for (const Entry& e : gs.items) m.groups.push_back(parse_scheme(e, kind + ".config_groups." + e.key));
  } else if (awq) {
    // A transform only: the quantizer that follows supplies the scheme.
  } else if (!gptq) {
    fail_at(mod_mark, "QuantizationModifier: nothing to quantize (set 'scheme: W4A16' or 'config_groups')");
  } else {
    // Legacy layout: a GPTQModifier without scheme/config_groups quantizes the
    // modules that an earlier QuantizationModifier configured (llm-compressor
    // attaches schemes to modules; GPTQModifier then finds them). That
    // QuantizationModifier's rounding is superseded, so it is folded in here.
    auto q = std::find_if(r.modifiers.rbegin(), r.modifiers.rend(),
                          [](const ModifierSpec& x) { return x.kind == "QuantizationModifier"; });
    if (q == r.modifiers.rend())
      fail_at(mod_mark, "GPTQModifier: nothing to quantize (set 'scheme: W4A16' or 'config_groups', or put a "
                        "QuantizationModifier with a scheme before it)");
    m.groups = q->groups;
    m.targets = q->targets;
    for (const auto& ig : q->ignore)
      if (std::find(m.ignore.begin(), m.ignore.end(), ig) == m.ignore.end()) m.ignore.push_back(ig);
    r.modifiers.erase(std::next(q).base());
  }

  // The overrides apply to every group (presets included).
  weight_obs_override_.clear();
  if (!weight_obs.empty())
    for (auto& g : m.groups) {
      if (weight_obs == "mse" && g.quantize_weights && !g.weights.is_int())
        fail(weight_obs_node, kind + ": observer 'mse' is implemented for integer weights; " + g.name + " is " +
                                  g.weights.describe() + " (FP8, NVFP4, NF4 and FP4 weights use minmax)",
             ErrorKind::Unsupported);
      g.observer = weight_obs;
    }
  if (!input_obs.empty())
    for (const auto& g : m.groups)
      if (g.input_activations && g.input_activations->needs_calibration())
        check_static_act_observer(input_obs, input_obs_node, kind + " (input observer of " + g.name + ")");

  if (gptq) {
    if (a.has("block_size")) {
      m.block_size = as_int(a.get("block_size"), kind + ".block_size");
      if (m.block_size < 1) fail(a.get("block_size"), kind + ".block_size: must be >= 1, got " + std::to_string(m.block_size));
    }
    if (a.has("dampening_frac")) {
      const YAML::Node d = a.get("dampening_frac");
      m.dampening_frac = as_double(d, kind + ".dampening_frac");
      if (m.dampening_frac < 0) fail(d, kind + ".dampening_frac: must be >= 0, got " + d.Scalar());
    }
    if (a.has("offload_hessians")) m.offload_hessians = as_bool(a.get("offload_hessians"), kind + ".offload_hessians");
    if (a.has("sequential_update")) as_bool(a.get("sequential_update"), kind + ".sequential_update");
    if (a.has("sequential_targets")) {
      // The unit the sequential pipeline calibrates and propagates (older
      // llm-compressor; default: the model's no-split modules, its decoder
      // layers). quantforge's unit is always the decoder layer.
      const YAML::Node st = a.get("sequential_targets");
      m.sequential_targets = as_string_list(st, kind + ".sequential_targets");
      for (size_t i = 0; i < m.sequential_targets.size(); ++i)
        if (!ends_with(m.sequential_targets[i], "DecoderLayer"))
          fail(st.IsSequence() ? st[i] : st,
               kind + ".sequential_targets: " + quote(m.sequential_targets[i]) +
                   " is not supported: the sequential unit here is the decoder layer (e.g. LlamaDecoderLayer, "
                   "llm-compressor's default)",
               ErrorKind::Unsupported);
    }

    // GPTQModifier.resolve_quantization_config: the modifier's actorder
    // (default "static") applies to every group; an explicit one that differs
    // from a group's is an error.
    const Entry* ao = a.find("actorder");
    const std::string mod_actorder = ao ? parse_actorder(ao->value, kind + ".actorder") : "weight";
    for (auto& g : m.groups) {
      if (!g.quantize_weights) continue;
      if (!ao) {
        if (g.actorder.empty()) g.actorder = mod_actorder;
      } else if (g.actorder.empty() || g.actorder == mod_actorder) {
        g.actorder = mod_actorder;
      } else {
        fail(ao->key_node, kind + ".actorder: " + quote(mod_actorder.empty() ? "null" : mod_actorder) +
                               " conflicts with actorder " + quote(g.actorder) + " of " + g.name +
                               " (remove one of them)");
      }
      // group act-order needs group quantization; llm-compressor falls back to none.
      if (g.actorder == "group" && g.weights.strategy != QuantStrategy::Group) g.actorder = "";
    }
  }
  r.modifiers.push_back(std::move(m));
}

ModifierSpec::Group Parser::parse_scheme(const Entry& e, const std::string& path) {
  static const std::vector<std::string> keys = {"targets", "weights", "input_activations", "output_activations",
                                                "format"};
  ModifierSpec::Group g;
  g.name = e.key;
  g.where = pos(mark(e.key_node));
  if (!e.value.IsMap()) fail(e.value, path + ": expected a mapping with 'targets' and 'weights', got " + got(e.value));
  Entries s = entries(e.value, path, &keys);
  reject_null(s, path, {"targets", "format"});
  if (!s.has("targets")) fail(e.key_node, path + ": missing 'targets' (e.g. targets: [Linear])");
  g.targets = as_patterns(s.get("targets"), path + ".targets");
  if (g.targets.empty()) fail(s.get("targets"), path + ".targets: empty list");
  if (s.has("output_activations") && !s.get("output_activations").IsNull())
    fail(s.get("output_activations"), path + ".output_activations: output activation quantization is not supported",
         ErrorKind::Unsupported);
  if (s.has("input_activations") && !s.get("input_activations").IsNull())
    g.input_activations = parse_activations(s.get("input_activations"), path + ".input_activations", false);
  if (s.has("format")) {
    g.format = as_string(s.get("format"), path + ".format");
    g.format_where = pos(mark(s.get("format")));
  }
  if (s.has("weights")) {
    parse_weights(s.get("weights"), path + ".weights", g);
  } else {
    g.quantize_weights = false;  // an UNQUANTIZED group: the modules it claims stay in full precision
  }
  return g;
}

void Parser::parse_weights(const YAML::Node& n, const std::string& path, ModifierSpec::Group& g) {
  Entries a = entries(n, path, &kArgsKeys);
  reject_null(a, path, {"num_bits", "type", "symmetric", "dynamic", "observer_kwargs"});
  ResolvedWeights r;
  try {
    r = resolve_weight_args(quant_args(a, path));
  } catch (const QuantArgsProblem& p) {
    fail_args(p, a, n, path);
  }
  QuantScheme& w = g.weights;
  w = r.scheme;
  if (r.actorder) g.actorder = *r.actorder;
  if (r.scale_dtype_given) g.scale_dtype_set = true;
  const bool is_float = w.is_float();
  if (a.has("observer")) {
    g.observer = parse_observer(a.get("observer"), path + ".observer");
    if (g.observer == "mse" && is_float && weight_obs_override_.empty())
      fail(a.get("observer"), path + ".observer: 'mse' is implemented for integer weights, not " + w.describe() +
                                  " (FP8 and NVFP4 weights use minmax)",
           ErrorKind::Unsupported);
  }
  if (a.has("observer_kwargs")) parse_weight_observer_kwargs(a.get("observer_kwargs"), path + ".observer_kwargs", g);
}

// observer_kwargs of a weights QuantizationArgs, for the observer the group
// ends up with (the modifier's override, else its own). llm-compressor passes
// them to the observer's constructor, which reads the keys it knows and
// ignores the rest; here an unknown key is an error.
void Parser::parse_weight_observer_kwargs(const YAML::Node& n, const std::string& path, ModifierSpec::Group& g) {
  const std::string obs = weight_obs_override_.empty() ? g.observer : weight_obs_override_;
  // mse: the grid search's settings (observers/mse.py); chunk_size only
  // batches candidates for torch.compile and averaging_constant belongs to the
  // moving average, which weights never use (observed once): both are checked
  // and have no effect, as in llm-compressor's one-shot runs. minmax: weights
  // are observed once, so its averaging_constant has no effect either.
  static const std::vector<std::string> mse_keys = {"maxshrink", "patience", "grid", "norm", "expand", "chunk_size",
                                                    "averaging_constant"};
  static const std::vector<std::string> minmax_keys = {"averaging_constant"};
  const std::vector<std::string>& keys = obs == "mse" ? mse_keys : minmax_keys;
  Entries kw = entries(n, path);
  for (const Entry& e : kw.items) {
    if (std::find(keys.begin(), keys.end(), e.key) == keys.end()) {
      const std::vector<std::string> all = mse_keys;
      const bool mse_only = std::find(all.begin(), all.end(), e.key) != all.end();
      const std::string c = closest_word(e.key, keys);
      fail(e.key_node, path + ": unknown key " + quote(e.key) + " for the " + quote(obs == "mse" ? "mse" : "minmax") +
                           " observer (" +
                           (mse_only ? quote(e.key) + " is the mse observer's" :
                            c.empty() ? "valid keys: " + join(keys) : "did you mean " + quote(c) + "?") +
                           ")");
    }
    const std::string kp = path + "." + e.key;
    if (e.key == "patience" || e.key == "chunk_size") {
      const int64_t v = as_int(e.value, kp);
      if (e.key == "patience" && v < 0) fail(e.value, kp + ": must be >= 0, got " + std::to_string(v));
      if (e.key == "chunk_size" && v < 1) fail(e.value, kp + ": must be >= 1, got " + std::to_string(v));
      if (e.key == "patience") g.mse.patience = v;
    } else {
      const double v = as_double(e.value, kp);
      if (e.key == "averaging_constant") {
        if (!(v >= 0 && v <= 1)) fail(e.value, kp + ": must be in [0, 1]");
      } else if (e.key == "expand") {
        if (!(v >= 1)) fail(e.value, kp + ": must be >= 1 (the search starts from expand times the range)");
        g.mse.expand = v;
      } else {
        if (!(v > 0)) fail(e.value, kp + ": must be > 0");
        if (e.key == "maxshrink" && v > 1) fail(e.value, kp + ": must be <= 1 (a fraction of the range)");
        (e.key == "maxshrink" ? g.mse.maxshrink : e.key == "grid" ? g.mse.grid : g.mse.norm) = v;
      }
    }
    g.observer_kwargs[e.key] = e.value.Scalar();
  }
}

// input_activations / kv_cache_scheme QuantizationArgs (resolved by
// quantizers/quant_args.h) and their observers. Defaults as
// compressed-tensors': num_bits 8, type int, symmetric true, dynamic false;
// the strategy is inferred from group_size like weights (none -> tensor).
ActivationScheme Parser::parse_activations(const YAML::Node& n, const std::string& path, bool kv_cache) {
  Entries a = entries(n, path, &kArgsKeys);
  reject_null(a, path, {"num_bits", "type", "symmetric", "dynamic", "observer_kwargs"});
  ActivationScheme s;
  try {
    s = resolve_activation_args(quant_args(a, path), kv_cache);
  } catch (const QuantArgsProblem& p) {
    fail_args(p, a, n, path);
  }
  // Static scales (and NVFP4's global scale, and the KV cache's) are the
  // running min/max over every calibration sample: static_minmax. Dynamic
  // activations have no observer (llm-compressor drops it): names are checked.
  const bool calibrated = kv_cache || s.needs_calibration();
  if (a.has("observer")) {
    const std::string o = parse_act_observer(a.get("observer"), path + ".observer");
    if (calibrated) check_static_act_observer(o, a.get("observer"), path + ".observer");
  }
  if (a.has("observer_kwargs")) {
    Entries kw = entries(a.get("observer_kwargs"), path + ".observer_kwargs");
    if (calibrated && !kw.items.empty())
      fail(kw.items.front().key_node, path + ".observer_kwargs: unknown key " + quote(kw.items.front().key) +
                                          " (static_minmax, the observer of calibrated scales, takes no arguments)");
  }
  return s;
}

// The QuantizationArgs keys of a weights / input_activations /
// kv_cache_scheme mapping, each read as its type (quantizers/quant_args.h
// gives them their meaning).
QuantArgs Parser::quant_args(const Entries& a, const std::string& path) {
  QuantArgs q;
  if (a.has("type")) q.type = as_string(a.get("type"), path + ".type");
  if (a.has("num_bits")) q.num_bits = as_int(a.get("num_bits"), path + ".num_bits");
  if (a.has("symmetric")) q.symmetric = as_bool(a.get("symmetric"), path + ".symmetric");
  if (a.has("group_size")) q.group_size = as_int(a.get("group_size"), path + ".group_size");
  if (a.has("strategy")) q.strategy = as_string(a.get("strategy"), path + ".strategy");
  if (a.has("dynamic")) {
    const YAML::Node d = a.get("dynamic");
    q.dynamic = d.IsScalar() && lower(d.Scalar()) == "local" ? "local" : as_bool(d, path + ".dynamic") ? "true" : "false";
  }
  if (a.find("actorder")) q.actorder = parse_actorder(a.get("actorder"), path + ".actorder");
  if (a.has("scale_dtype")) q.scale_dtype = as_string(a.get("scale_dtype"), path + ".scale_dtype");
  if (a.has("zp_dtype")) q.zp_dtype = as_string(a.get("zp_dtype"), path + ".zp_dtype");
  q.block_structure = a.has("block_structure");
  return q;
}

// A problem the resolver found, at its key when the mapping has it, else at
// the mapping.
void Parser::fail_args(const QuantArgsProblem& p, const Entries& a, const YAML::Node& n, const std::string& path) {
  const std::string key = quant_arg_key(p.arg);
  if (!key.empty() && a.has(key)) fail(a.get(key), path + "." + key + ": " + p.message, p.kind);
  fail(n, path + ": " + p.message, p.kind);
}

void Parser::parse_awq_args(const Entries& a, ModifierSpec& m) {
  const std::string k = m.kind;
  reject_null(a, k, {"duo_scaling", "n_grid", "apply_clip", "loss"});
  if (a.has("mappings") && !a.get("mappings").IsNull())
    fail(a.get("mappings"), k + ".mappings: custom mappings are not supported; the llama-family defaults are used "
                                "(input_layernorm -> q/k/v, v_proj -> o_proj, post_attention_layernorm -> gate/up, "
                                "up_proj -> down_proj)",
         ErrorKind::Unsupported);
  if (a.has("offload_device")) (void)a.get("offload_device");  // memory placement: no effect on CPU
  if (a.has("duo_scaling")) {
    const YAML::Node d = a.get("duo_scaling");
    if (d.IsScalar() && lower(d.Scalar()) == "both")
      fail(d, k + ".duo_scaling: 'both' is not supported (true or false)", ErrorKind::Unsupported);
    m.duo_scaling = as_bool(d, k + ".duo_scaling");
  }
  if (a.has("n_grid")) {
    m.n_grid = as_int(a.get("n_grid"), k + ".n_grid");
    if (m.n_grid < 1) fail(a.get("n_grid"), k + ".n_grid: must be >= 1");
  }
  if (a.has("apply_clip")) m.apply_clip = as_bool(a.get("apply_clip"), k + ".apply_clip");
  if (a.has("loss")) {
    const std::string v = as_string(a.get("loss"), k + ".loss");
    if (v != "module" && v != "linear")
      fail(a.get("loss"), k + ".loss: " + quote(v) + " is not a loss (module: the inspected module's output; linear: each Linear's own output)");
    m.awq_loss = v;
  }
}

void Parser::parse_smoothquant(const Entry& mod, ModifierSpec& m) {
  const std::string k = m.kind;
  std::vector<std::string> allowed = kSmoothQuantKeys;
  allowed.insert(allowed.end(), kBaseKeys.begin(), kBaseKeys.end());
  Entries a = entries(mod.value, k, &allowed);
  reject_null(a, k, {"smoothing_strength", "ignore", "algorithm", "search_smoothing_strength", "smoothing_strength_grid"});
  if (a.has("group")) m.group = as_string(a.get("group"), k + ".group");
  for (const char* f : {"index", "start", "end", "update"})
    if (a.has(f)) as_double(a.get(f), k + "." + f);
  if (a.has("requires_calibration_data")) as_bool(a.get("requires_calibration_data"), k + ".requires_calibration_data");
  if (a.has("smoothing_strength")) {
    m.smoothing_strength = as_double(a.get("smoothing_strength"), k + ".smoothing_strength");
    if (!(m.smoothing_strength >= 0 && m.smoothing_strength <= 1))
      fail(a.get("smoothing_strength"), k + ".smoothing_strength: must be in [0, 1]");
  }
  if (a.has("mappings") && !a.get("mappings").IsNull())
    fail(a.get("mappings"), k + ".mappings: custom mappings are not supported; the llama-family defaults are used "
                                "(input_layernorm -> q/k/v, post_attention_layernorm -> gate/up)",
         ErrorKind::Unsupported);
  if (a.has("ignore")) m.ignore = as_patterns(a.get("ignore"), k + ".ignore");
  if (a.has("num_calibration_steps") && !a.get("num_calibration_steps").IsNull())
    as_int(a.get("num_calibration_steps"), k + ".num_calibration_steps");  // every calibration sample is used
  if (a.has("calibration_function") && !a.get("calibration_function").IsNull())
    fail(a.get("calibration_function"), k + ".calibration_function: Python callables cannot be given in a recipe",
         ErrorKind::Unsupported);
  if (a.has("algorithm")) {
    const std::string al = lower(as_string(a.get("algorithm"), k + ".algorithm"));
    if (al == "log_equalization")
      fail(a.get("algorithm"), k + ".algorithm: 'log_equalization' is not supported (smoothquant)", ErrorKind::Unsupported);
    if (al != "smoothquant") fail(a.get("algorithm"), k + ".algorithm: expected 'smoothquant', got " + got(a.get("algorithm")));
  }
  if (a.has("search_smoothing_strength"))
    m.search_smoothing_strength = as_bool(a.get("search_smoothing_strength"), k + ".search_smoothing_strength");
  if (a.has("smoothing_strength_grid")) {
    const YAML::Node g = a.get("smoothing_strength_grid");
    if (!g.IsSequence() || g.size() == 0) fail(g, k + ".smoothing_strength_grid: expected a non-empty list of numbers in [0, 1]");
    m.smoothing_strength_grid.clear();
    for (const auto& v : g) {
      const double x = as_double(v, k + ".smoothing_strength_grid");
      if (!(x >= 0 && x <= 1)) fail(v, k + ".smoothing_strength_grid: values must be in [0, 1]");
      m.smoothing_strength_grid.push_back(x);
    }
  }
}

// ActivationOrdering: true -> group, false/null -> none, "static" = "weight",
// "dynamic" = "group" (case-insensitive). Returns the canonical name.
std::string Parser::parse_actorder(const YAML::Node& n, const std::string& path) {
  if (n.IsNull()) return "";
  if (n.IsScalar()) {
    const std::string s = lower(n.Scalar());
    if (!quoted(n) && (s == "true" || s == "yes" || s == "on")) return "group";
    if (!quoted(n) && (s == "false" || s == "no" || s == "off")) return "";
    if (const auto c = canonical_actorder(s)) return *c;
  }
  fail(n, path + ": expected static, weight, group, dynamic, true, false or null, got " + got(n));
}

std::string Parser::parse_observer(const YAML::Node& n, const std::string& path) {
  if (n.IsNull()) return "minmax";
  const std::string s = as_string(n, path);
  const std::string l = lower(s);
  if (l == "minmax" || l == "memoryless_minmax" || l == "static_minmax" || l == "memoryless") return "minmax";
  if (l == "mse" || l == "memoryless_mse") return "mse";
  if (l == "imatrix_mse" || l == "nvfp4_expanded_mse")
    fail(n, path + ": observer " + quote(s) + " is not supported yet (minmax, mse)", ErrorKind::Unsupported);
  const std::string c = closest_word(l, {"minmax", "mse", "memoryless_minmax", "memoryless_mse", "static_minmax"});
  fail(n, path + ": unknown observer " + quote(s) + " (" +
              (c.empty() ? std::string("minmax or mse") : "did you mean " + quote(c) + "?") + ")");
}

// An activation observer name, canonical: llm-compressor's registry names
// (minmax is a moving average over calibration batches, static_minmax the
// running min/max, memoryless_minmax the last batch only).
std::string Parser::parse_act_observer(const YAML::Node& n, const std::string& path) {
  if (n.IsNull()) return "static_minmax";
  const std::string s = as_string(n, path);
  const std::string l = lower(s);
  static const std::vector<std::string> known = {"minmax", "static_minmax", "memoryless_minmax", "mse",
                                                 "memoryless_mse", "imatrix_mse", "nvfp4_expanded_mse"};
  if (l == "memoryless") return "memoryless_minmax";
  if (std::find(known.begin(), known.end(), l) != known.end()) return l;
  const std::string c = closest_word(l, known);
  fail(n, path + ": unknown observer " + quote(s) + " (" +
              (c.empty() ? std::string("static_minmax, minmax, memoryless_minmax or mse") : "did you mean " + quote(c) + "?") + ")");
}

void Parser::check_static_act_observer(const std::string& name, const YAML::Node& n, const std::string& path) {
  if (name == "static_minmax") return;
  const std::string what = name == "minmax" ? " (a moving average over calibration batches)"
                           : name == "memoryless_minmax" ? " (the last calibration batch only)"
                                                         : "";
  fail(n, path + ": observer " + quote(name) + what +
              " is not supported for calibrated input or KV-cache scales; quantforge takes the running min/max over "
              "every calibration sample (static_minmax)",
       ErrorKind::Unsupported);
}

void Parser::parse_calibration(const Entry& e, CalibrationSpec& c) {
  static const std::vector<std::string> keys = {"dataset", "text_field", "num_samples", "seq_len", "seed",
                                                "moe_calibrate_all_experts", "precision"};
  Entries a = entries(e.value, "calibration", &keys);
  reject_null(a, "calibration",
              {"dataset", "text_field", "num_samples", "seq_len", "seed", "moe_calibrate_all_experts", "precision"});
  if (a.has("precision")) {
    const std::string p = as_string(a.get("precision"), "calibration.precision");
    if (p == "bf16" || p == "bfloat16") c.bf16 = true;
    else if (p != "f32" && p != "float32")
      fail(a.get("precision"), "calibration.precision: " + quote(p) + " is not a calibration precision (f32 or bf16)");
  }
  if (a.has("moe_calibrate_all_experts"))
    c.moe_calibrate_all_experts = as_bool(a.get("moe_calibrate_all_experts"), "calibration.moe_calibrate_all_experts");
  if (a.has("dataset")) c.dataset = as_string(a.get("dataset"), "calibration.dataset");
  if (a.has("text_field")) {
    c.text_field = as_string(a.get("text_field"), "calibration.text_field");
    if (c.text_field.empty()) fail(a.get("text_field"), "calibration.text_field: empty");
  }
  for (const char* k : {"num_samples", "seq_len"})
    if (a.has(k)) {
      const int64_t v = as_int(a.get(k), std::string("calibration.") + k);
      if (v < 1) fail(a.get(k), std::string("calibration.") + k + ": must be >= 1, got " + std::to_string(v));
      (std::string(k) == "num_samples" ? c.num_samples : c.seq_len) = v;
    }
  if (a.has("seed")) {
    const int64_t v = as_int(a.get("seed"), "calibration.seed");
    if (v < 0) fail(a.get("seed"), "calibration.seed: must be >= 0, got " + std::to_string(v));
    c.seed = static_cast<uint64_t>(v);
  }
}

void Parser::parse_export(const Entry& e, ExportSpec& x) {
  static const std::vector<std::string> keys = {"format", "shard_size", "double_quant", "compute_dtype"};
  Entries a = entries(e.value, "export", &keys);
  reject_null(a, "export", {"format", "shard_size", "double_quant", "compute_dtype"});
  // bitsandbytes' own keys (BitsAndBytesConfig's bnb_4bit_use_double_quant and
  // bnb_4bit_compute_dtype): refused for every other format.
  for (const char* k : {"double_quant", "compute_dtype"})
    if (const Entry* be = a.find(k); be && (!a.has("format") || a.get("format").Scalar() != "bitsandbytes"))
      fail(be->key_node, std::string("export.") + k + ": only for format: bitsandbytes", ErrorKind::Unsupported);
  if (a.has("double_quant")) {
    const YAML::Node d = a.get("double_quant");
    x.double_quant = as_bool(d, "export.double_quant");
  }
  if (a.has("compute_dtype")) {
    const YAML::Node d = a.get("compute_dtype");
    x.compute_dtype = as_string(d, "export.compute_dtype");
    if (x.compute_dtype != "float32" && x.compute_dtype != "float16" && x.compute_dtype != "bfloat16")
      fail(d, "export.compute_dtype: expected float32, float16 or bfloat16, got " + got(d));
  }
  if (a.has("format")) {
    const YAML::Node f = a.get("format");
    // The name is looked up in the checkpoint-format registry by the quantize
    // plan (checkpoint/checkpoint_format.h), with this position.
    x.format = as_string(f, "export.format");
    x.format_where = pos(mark(f));
  }
  if (a.has("shard_size")) {
    // transformers' convert_file_size_to_int: KB/MB/GB/TB are powers of 1000,
    // KiB/MiB/GiB/TiB powers of 1024; a bare number is bytes.
    const YAML::Node s = a.get("shard_size");
    const std::string v = as_string(s, "export.shard_size");
    bool too_large = false, zero = false;
    const uint64_t bytes = parse_size_string(v, &too_large, &zero);
    if (too_large) fail(s, "export.shard_size: " + v + " is too large");
    if (zero) fail(s, "export.shard_size: must be > 0");
    if (bytes == 0)
      fail(s, "export.shard_size: expected a size such as 5GB, 500MB, 4GiB or a byte count, got " + got(s));
    x.max_shard_bytes = bytes;
  }
}

void Parser::parse_vision(const Entry& e, Recipe& r) {
  static const std::vector<std::string> keys = {"tower", "projector"};
  Entries a = entries(e.value, "vision", &keys);
  reject_null(a, "vision", {"tower", "projector"});
  VisionQuantSpec v;
  v.where = pos(mark(e.key_node));
  for (const char* k : {"tower", "projector"}) {
    if (!a.has(k)) continue;
    const YAML::Node n = a.get(k);
    const std::string path = std::string("vision.") + k;
    const std::string name = upper(as_string(n, path));
    if (name == "KEEP") continue;
    const std::string where = pos(mark(n));
    // Round to nearest without calibration: weight-only int8, or FP8 with
    // per-token input scales computed at run time. Static input scales
    // (FP8, W8A8's tensor variants) would need the vision side's inputs
    // observed, which calibration does not do.
    ModifierSpec::Group g = make_preset_group(name, {}, std::string("vision_") + k, where, path + ": ");
    if (name != "W8A16" && name != "FP8_DYNAMIC")
      fail(n, path + ": " + quote(name) + " is not offered for the vision side (keep, W8A16 or FP8_DYNAMIC)",
           ErrorKind::Unsupported);
    (std::string(k) == "tower" ? v.tower : v.projector) = std::move(g);
  }
  r.vision = std::move(v);
}

void Parser::parse_mixed_precision(const Entry& e, Recipe& r) {
  static const std::vector<std::string> keys = {"target_bits", "target_size", "schemes", "probe_samples", "probe_items"};
  Entries a = entries(e.value, "mixed_precision", &keys);
  reject_null(a, "mixed_precision", {"target_bits", "target_size", "schemes", "probe_samples", "probe_items"});
  MixedPrecisionSpec mp;
  mp.where = pos(mark(e.key_node));
  if (a.has("target_bits") == a.has("target_size"))
    fail(a.has("target_size") ? a.find("target_size")->key_node : e.key_node,
         "mixed_precision: set exactly one of 'target_bits' (stored bits per targeted weight, e.g. 5.0) and "
         "'target_size' (e.g. 4.2GiB)");
  if (a.has("target_bits")) {
    const YAML::Node t = a.get("target_bits");
    mp.target_bits = as_double(t, "mixed_precision.target_bits");
    if (!(mp.target_bits > 0) || !std::isfinite(mp.target_bits))
      fail(t, "mixed_precision.target_bits: must be a number > 0, got " + t.Scalar());
    mp.target_where = pos(mark(t));
  } else {
    const YAML::Node t = a.get("target_size");
    const std::string v = as_string(t, "mixed_precision.target_size");
    bool too_large = false, zero = false;
    mp.target_bytes = parse_size_string(v, &too_large, &zero, true);
    if (too_large) fail(t, "mixed_precision.target_size: " + v + " is too large");
    if (mp.target_bytes == 0)
      fail(t, "mixed_precision.target_size: expected a size > 0 such as 4.2GiB, 4300MiB, 5GB or a byte count, got " +
                  got(t));
    mp.target_where = pos(mark(t));
  }
  if (!a.has("schemes")) fail(e.key_node, "mixed_precision: 'schemes' is missing (e.g. schemes: [NVFP4A16, W8A16])");
  const YAML::Node sl = a.get("schemes");
  if (!sl.IsSequence() || sl.size() == 0)
    fail(sl, "mixed_precision.schemes: expected a non-empty list of preset names, got " + got(sl));
  for (size_t i = 0; i < sl.size(); ++i) {
    const std::string path = "mixed_precision.schemes[" + std::to_string(i) + "]";
    const std::string name = upper(as_string(sl[i], path));
    const std::string where = pos(mark(sl[i]));
    make_preset_group(name, {}, "", where, path + ": ");  // unknown / unsupported presets fail here
    if (std::find(mp.schemes.begin(), mp.schemes.end(), name) != mp.schemes.end())
      fail(sl[i], path + ": " + quote(name) + " is listed twice");
    mp.schemes.push_back(name);
    mp.scheme_where.push_back(where);
  }
  if (a.has("probe_samples")) {
    mp.probe_samples = as_int(a.get("probe_samples"), "mixed_precision.probe_samples");
    if (mp.probe_samples < 1)
      fail(a.get("probe_samples"), "mixed_precision.probe_samples: must be >= 1, got " + std::to_string(mp.probe_samples));
  }
  if (a.has("probe_items")) {
    mp.probe_items = as_int(a.get("probe_items"), "mixed_precision.probe_items");
    if (mp.probe_items < 0)
      fail(a.get("probe_items"), "mixed_precision.probe_items: must be >= 0 (0: every item), got " +
                                     std::to_string(mp.probe_items));
  }
  r.mixed_precision = mp;
}

// The modifiers a mixed_precision section goes with: exactly one quantizer,
// which takes every scheme the section lists.
void Parser::check_mixed_precision(const Entry& e, const Recipe& r) {
  const ModifierSpec* q = nullptr;
  for (const ModifierSpec& m : r.modifiers)
    if (!m.is_transform()) {
      if (q)
        throw invalid_input(m.where, "one quantization modifier goes with mixed_precision (found " + q->kind + " and " +
                                         m.kind + ")");
      q = &m;
    }
  if (!q)
    fail(e.key_node, "mixed_precision needs a quantizer (GPTQModifier or QuantizationModifier) to apply the schemes it "
                     "chooses");
  const MixedPrecisionSpec& mp = *r.mixed_precision;
  for (size_t i = 0; i < mp.schemes.size(); ++i) {
    const ModifierSpec::Group g = make_preset_group(mp.schemes[i], {}, "", mp.scheme_where[i], "");
    if (g.weights.is_bnb4())
      throw unsupported(mp.scheme_where[i], "mixed_precision.schemes: " + mp.schemes[i] +
                                                " is written by the bitsandbytes format, which holds one scheme per model");
    if (q->is_gptq() && g.quantize_weights && g.weights.is_float())
      throw unsupported(mp.scheme_where[i], "mixed_precision.schemes: GPTQModifier quantizes integer weights; " +
                                                mp.schemes[i] + " has " + g.weights.describe() +
                                                " weights (use QuantizationModifier, which rounds every scheme to nearest)");
  }
}

// The YAML front matter of a markdown recipe card, as llm-compressor's
// _parse_recipe_from_md reads it: the text between the first two lines that
// are "---" or "+++". Sets *line_offset to the line count before it.
std::string front_matter(const std::string& text, const std::string& file, int* line_offset) {
  std::vector<std::pair<size_t, size_t>> lines;  // [begin, end) of each line
  size_t b = 0;
  while (b <= text.size()) {
    size_t e = text.find('\n', b);
    if (e == std::string::npos) e = text.size();
    lines.emplace_back(b, e);
    b = e + 1;
  }
  auto is_delim = [&](size_t i) {
    std::string l = text.substr(lines[i].first, lines[i].second - lines[i].first);
    while (!l.empty() && std::isspace(static_cast<unsigned char>(l.back()))) l.pop_back();
    size_t s = 0;
    while (s < l.size() && std::isspace(static_cast<unsigned char>(l[s]))) ++s;
    l = l.substr(s);
    return l == "---" || l == "+++";
  };
  for (size_t i = 0; i < lines.size(); ++i) {
    if (!is_delim(i)) continue;
    for (size_t j = i + 1; j < lines.size(); ++j)
      if (is_delim(j)) {
        *line_offset = static_cast<int>(i + 1);
        const size_t from = lines[i + 1 < j ? i + 1 : j].first;
        return text.substr(from, lines[j].first - from);
      }
    break;
  }
  throw invalid_input(file, "no YAML front matter (a block between '---' lines) in this markdown recipe");
}

Recipe parse_with_offset(const std::string& yaml, const std::string& name, int line_offset) {
  const YAML::Node root = load_yaml(yaml, name, line_offset);
  YAML::Mark start;
  start.pos = 0;
  start.line = 0;
  start.column = 0;
  Parser p(name, line_offset);
  Recipe r;
  try {
    r = p.parse(root, start);
  } catch (const YAML::Exception& e) {  // not expected: the parser reads scalars itself
    std::string where = name;
    if (!e.mark.is_null())
      where += ":" + std::to_string(e.mark.line + 1 + line_offset) + ":" + std::to_string(e.mark.column + 1);
    throw invalid_input(where, e.msg);
  }
  r.source = name;
  r.text = yaml;
  return r;
}

}  // namespace

ModifierSpec::Group preset_group(const std::string& name, const std::vector<std::string>& targets,
                                 const std::string& group_name, const std::string& where) {
  return make_preset_group(name, targets, group_name, where, "");
}

Recipe parse_recipe_text(const std::string& yaml, const std::string& name) { return parse_with_offset(yaml, name, 0); }

Recipe parse_recipe_file(const std::filesystem::path& path) {
  const std::string text = read_text_file(path);
  const std::string name = path.string();
  std::string ext = lower(path.extension().string());
  if (ext == ".md") {
    int offset = 0;
    const std::string yaml = front_matter(text, name, &offset);
    Recipe r = parse_with_offset(yaml, name, offset);
    r.text = yaml;
    return r;
  }
  return parse_with_offset(text, name, 0);
}

std::string resolved_recipe_text(const Recipe& r, const std::string& dataset, const std::string& header) {
  YAML::Node root = YAML::Load(r.text);
  YAML::Node cal = root["calibration"];
  if (!cal || !cal.IsMap()) cal = YAML::Node(YAML::NodeType::Map);
  cal["dataset"] = dataset;
  cal["text_field"] = r.calibration.text_field;
  cal["num_samples"] = r.calibration.num_samples;
  cal["seq_len"] = r.calibration.seq_len;
  cal["seed"] = r.calibration.seed;
  root["calibration"] = cal;
  YAML::Emitter out;
  out << root;
  if (!out.good()) throw Error(ErrorKind::Internal, "resolved_recipe_text: " + out.GetLastError());
  return header + out.c_str() + "\n";
}

}  // namespace qf
