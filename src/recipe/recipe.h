// Quantization recipes: llm-compressor's YAML recipe format, plus quantforge's
// `calibration:` and `export:` sections. See docs/recipes.md for every key.
//
// A recipe is a YAML (or JSON) mapping. Modifiers live under
//   <name>_stage:            (any top-level key ending in "_stage", or "_stage_<N>")
//     <name>_modifiers:      (any key ending in "_modifiers")
//       GPTQModifier: {...}  (the class name, then its keyword arguments)
// exactly as llm-compressor's Recipe.from_dict reads them
// [llm-compressor:src/llmcompressor/recipe/recipe.py]. Stages and groups run
// in file order. Supported: SmoothQuantModifier and AWQModifier (transforms),
// then GPTQModifier or QuantizationModifier with integer (2..8 bits), FP8 or
// NVFP4 weights, optional input activations (int8 or FP8 per token / static
// per tensor, NVFP4) and an FP8 kv_cache_scheme; presets W2A16..W8A16,
// W4A16_ASYM, W8A8/INT8, W4A8, W4AFP8, FP8, FP8_DYNAMIC, NVFP4, NVFP4A16,
// UNQUANTIZED, or explicit `config_groups`. Everything llm-compressor knows
// but quantforge does not do (block/MX formats, 4-bit activations, custom
// smoothing mappings, pruning, ...) is rejected with ErrorKind::Unsupported;
// everything malformed with ErrorKind::InvalidInput. Both messages read
// "FILE:LINE:COLUMN: what (hint)" with 1-based line and column.
//
// Not checked here: whether a group size divides a layer's input columns
// (make_quantize_plan checks that per layer; `bypass_divisibility_checks`
// only changes the message, since no such layer can be quantized), whether
// a scheme's `format` is the one it will be written in, and whether targets
// match any module of the model.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "quantizers/act_quant.h"
#include "quantizers/gptq.h"
#include "quantizers/quant_scheme.h"
#include "quantizers/rtn.h"

namespace qf {

struct ModifierSpec {
  // "GPTQModifier" | "QuantizationModifier" (quantizers) | "AWQModifier" |
  // "SmoothQuantModifier" (transforms; AWQModifier may also carry a scheme,
  // as llm-compressor < 0.9 did, and then quantizes by RTN unless a
  // quantizer follows it)
  std::string kind;
  std::string stage;                      // "quant" for quant_stage
  std::string group;                      // "quant" for quant_modifiers (or the `group:` argument)
  std::string where;                      // "FILE:LINE:COL" of the modifier's name, for messages
  // Modifier-level `targets` (default ["Linear"]). With a `scheme` preset the
  // groups get these targets; with `config_groups` each group has its own.
  std::vector<std::string> targets{"Linear"};
  std::vector<std::string> ignore;        // exact names ("lm_head"), class names, "re:" regexes

  struct Group {
    std::string name;                     // "group_0", ... (config_groups key, or group_<i> for presets)
    std::string where;                    // "FILE:LINE:COL"
    std::vector<std::string> targets;
    // False for a group with no `weights` (UNQUANTIZED): modules it claims are
    // left in full precision.
    bool quantize_weights = true;
    QuantScheme weights;
    // True when the recipe named a scale dtype; otherwise the pipeline stores
    // scales in the model's dtype (weights.scale_dtype is then F16, a placeholder).
    bool scale_dtype_set = false;
    // Canonical activation order: "" (none), "weight" (llm-compressor's
    // "static": GPTQ permutes columns by diag(H), no g_idx is written) or
    // "group" ("dynamic", deprecated upstream: g_idx is written). For
    // GPTQModifier it is already resolved against the modifier's `actorder`
    // (default "static" -> "weight"); QuantizationModifier (RTN) ignores it.
    std::string actorder;
    std::string observer = "minmax";      // "minmax" | "mse" (memoryless_/static_ variants map here)
    // The weights' observer_kwargs as written (raw scalars, e.g. {"maxshrink": "0.5"}),
    // and the mse observer's settings they give (llm-compressor's defaults otherwise).
    std::map<std::string, std::string> observer_kwargs;
    MseOptions mse;
    // The group's input_activations (nullopt: weight-only).
    std::optional<ActivationScheme> input_activations;
    // The scheme's `format` (empty: not given) and its position: it must name
    // the compressed-tensors format the scheme is written in (the plan checks).
    std::string format, format_where;

    // The typed forms the pipeline uses (no recipe string is compared outside src/recipe).
    GptqOptions::ActOrder act_order() const {
      return actorder == "group" ? GptqOptions::ActOrder::Group
             : actorder == "weight" ? GptqOptions::ActOrder::Weight
                                    : GptqOptions::ActOrder::None;
    }
    RangeObserver range_observer() const { return observer == "mse" ? RangeObserver::Mse : RangeObserver::MinMax; }
  };
  std::vector<Group> groups;

  // GPTQModifier
  int64_t block_size = 128;
  double dampening_frac = 0.01;
  bool offload_hessians = false;          // accepted, no effect
  // Older llm-compressor's sequential unit; only decoder-layer classes
  // (`*DecoderLayer`, the unit used here) are accepted.
  std::vector<std::string> sequential_targets;
  // QuantizationMixin: skips llm-compressor's early check that a group size
  // divides each layer's columns; such a layer still cannot be quantized (the
  // plan reports it at `bypass_where`).
  bool bypass_divisibility_checks = false;
  std::string bypass_where;
  // Modifier base field: true demands calibration data even for a method that
  // needs none (llm-compressor then picks its calibration pipeline).
  bool requires_calibration_data = false;
  // kv_cache_scheme: FP8 E4M3, static per-tensor k/v scales (nullopt: none).
  std::optional<ActivationScheme> kv_cache_scheme;

  // AWQModifier
  bool duo_scaling = true;
  int64_t n_grid = 20;
  bool apply_clip = true;                 // quantforge: AutoAWQ's clip search after the scales
  // quantforge: "linear" scores the scales by each balance Linear's own
  // output error (the AWQ paper's objective, from Gram matrices), "module" by
  // the inspected module's (AutoAWQ's and llm-compressor's); "" (not given):
  // linear on the CPU, module on a device (calibration/smoothing.h)
  std::string awq_loss;
  // SmoothQuantModifier
  double smoothing_strength = 0.5;
  // quantforge: choose the strength per layer from the grid by the quantized
  // layer's output error (smoothing_strength is then unused)
  bool search_smoothing_strength = false;
  std::vector<double> smoothing_strength_grid = {0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9};

  bool is_gptq() const { return kind == "GPTQModifier"; }
  bool is_awq() const { return kind == "AWQModifier"; }
  bool is_smoothquant() const { return kind == "SmoothQuantModifier"; }
  bool is_transform() const { return kind == "AWQModifier" || kind == "SmoothQuantModifier"; }
};

struct CalibrationSpec {
  std::string dataset;                    // path; empty: none given (CLI --calib overrides)
  std::string text_field = "text";        // field of each JSON line holding the text
  int64_t num_samples = 128;
  int64_t seq_len = 512;
  uint64_t seed = 0;
  // Mixture-of-experts models: every calibration token reaches every
  // expert's statistics (not only the tokens routed to it); the layer
  // outputs still follow the router (SequentialOptions).
  bool moe_calibrate_all_experts = false;
  // The arithmetic of the calibration forward (the capture and propagation
  // passes' Linears): "f32" (default) or "bf16" (weights and activations
  // rounded to bf16, products summed in f32; docs/calibration.md).
  bool bf16 = false;
};

struct ExportSpec {
  std::string format;        // a checkpoint format's name (checkpoint/checkpoint_format.h); empty: the default
  std::string format_where;  // "FILE:LINE:COL" of the value, for messages
  uint64_t max_shard_bytes = 5ull << 30;      // `shard_size`: "5GB" (10^9), "5GiB" (2^30), or bytes
  // format: bitsandbytes only (refused for the others):
  bool double_quant = false;  // `double_quant`: bnb_4bit_use_double_quant (BitsAndBytesConfig's default, false)
  std::string compute_dtype;  // `compute_dtype`: bnb_4bit_compute_dtype ("": float32, BitsAndBytesConfig's default)
};

// quantforge's `mixed_precision:` section (docs/mixed-precision.md): the
// quantizer's targeted Linears each take one of `schemes`, chosen by the
// measured sensitivity search (calibration/mixed_precision.h) to fit the
// size budget. The quantizer modifier then has no scheme of its own.
struct MixedPrecisionSpec {
  std::string where;                      // "FILE:LINE:COL" of the section's key
  // The budget, exactly one of: stored bits per targeted weight (codes,
  // scales, zero points, g_idx, global scales), or bytes in all.
  double target_bits = 0;
  uint64_t target_bytes = 0;
  std::string target_where;               // position of target_bits / target_size
  std::vector<std::string> schemes;       // preset names, upper case, no repeats
  std::vector<std::string> scheme_where;  // their positions
  // Calibration windows the probes' KL divergence and the proxy's input
  // statistics are measured on, and how many items are probed (0: all;
  // the others take the median calibration factor).
  int64_t probe_samples = 8;
  int64_t probe_items = 0;
};

// quantforge's `vision:` section (docs/vlm.md, "Quantizing the vision
// side"): a vision-language model's vision tower and projector rounded to
// nearest in one of the presets offered for them (W8A16, FP8_DYNAMIC) and
// written as their own config groups. Absent, or `keep`: written as stored.
struct VisionQuantSpec {
  std::string where;                              // "FILE:LINE:COL" of the section's key
  std::optional<ModifierSpec::Group> tower;       // `tower:` (nullopt: kept)
  std::optional<ModifierSpec::Group> projector;   // `projector:` (the merger for Qwen2-VL)
};

struct Recipe {
  std::vector<ModifierSpec> modifiers;    // in recipe order, across stages
  CalibrationSpec calibration;
  ExportSpec export_;
  std::optional<MixedPrecisionSpec> mixed_precision;
  std::optional<VisionQuantSpec> vision;
  std::string source;                     // the file name (or the name given to parse_recipe_text)
  std::string text;                       // the recipe text as read (exporters copy it as recipe.yaml)
};

// Reads and validates a recipe. Missing file: NotFound; unreadable: Io.
// A ".md" file is read from its YAML front matter (between "---" lines), as
// llm-compressor does; line numbers in messages are those of the .md file.
Recipe parse_recipe_file(const std::filesystem::path& path);
// `name` is used as FILE in messages.
Recipe parse_recipe_text(const std::string& yaml, const std::string& name);

// The recipe as a run used it, for the copy kept beside an output: its text
// with calibration.dataset replaced by `dataset` (the absolute path actually
// read, so the copy resolves from anywhere) and num_samples, seq_len, seed
// and text_field written out. Comments are not kept; `header` (comment lines)
// goes first. Parsing the result gives the same Recipe.
std::string resolved_recipe_text(const Recipe& r, const std::string& dataset, const std::string& header);

// A config group of preset `name` (case-insensitive) over `targets`, as a
// recipe's `scheme: {PRESET: targets}` gives it (named `group_name`, at
// `where`). InvalidInput for an unknown preset, Unsupported for a known one
// quantforge does not implement (both naming `where`).
ModifierSpec::Group preset_group(const std::string& name, const std::vector<std::string>& targets,
                                 const std::string& group_name, const std::string& where);

// Does `pattern` (a target or ignore entry) select the module? Semantics of
// compressed-tensors' is_match [compressed-tensors:src/compressed_tensors/utils/match.py]:
//   "re:REGEX"  Python re.match: the regex must match at the start of the name,
//               not necessarily the whole name ("re:.*q_proj" also matches
//               "...q_proj_x"; write "re:.*q_proj$" to anchor). PCRE2 syntax,
//               which is a superset of what recipes use from Python's re.
//   otherwise   exact module name ("lm_head", "model.layers.0.mlp.down_proj";
//               no suffix matching), or the module's class name: "Linear"
//               matches every Linear, lm_head included.
bool recipe_matches(const std::string& pattern, const std::string& module_name,
                    std::string_view module_class = "Linear");

// The group that quantizes `module_name`, or nullopt when the module is not
// quantized (ignored, matched by no group, or claimed by a group without
// weights). Precedence when several groups match, as compressed-tensors'
// apply_quantization_config: exact-name targets first, then "re:" targets,
// then class-name targets; among names/regexes the alphabetically first
// target wins; a target listed by several groups belongs to the last of them.
std::optional<ModifierSpec::Group> scheme_for(const ModifierSpec& m, const std::string& module_name,
                                              std::string_view module_class = "Linear");

}  // namespace qf
