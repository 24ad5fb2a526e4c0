#include "recipe/recipe.h"

#include <filesystem>

#include <gtest/gtest.h>

#include "core/error.h"
#include "test_util.h"

namespace qf {
namespace {

// Parses `text` as "r.yaml" and returns the error, failing when none is thrown.
Error parse_error(const std::string& text) {
  try {
    parse_recipe_text(text, "r.yaml");
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no error for:\n" << text;
  return Error(ErrorKind::Internal, "");
}

void expect_error(const std::string& text, ErrorKind kind, const std::string& message) {
  const Error e = parse_error(text);
  EXPECT_EQ(e.kind(), kind) << e.what();
  EXPECT_EQ(std::string(e.what()), message);
}

void expect_scheme(const ModifierSpec::Group& g, int bits, bool sym, QuantStrategy strategy, int64_t group_size) {
  EXPECT_TRUE(g.quantize_weights);
  EXPECT_EQ(g.weights.bits, bits);
  EXPECT_EQ(g.weights.symmetric, sym);
  EXPECT_EQ(g.weights.strategy, strategy);
  if (strategy == QuantStrategy::Group) {
    EXPECT_EQ(g.weights.group_size, group_size);
  }
}

const std::filesystem::path kRecipes = std::filesystem::path(QF_SOURCE_DIR) / "recipes";

// ---- the recipes shipped in recipes/ ------------------------------------------

TEST(Recipe, EveryShippedRecipeParses) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kRecipes)) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    const Recipe r = parse_recipe_file(entry.path());
    ASSERT_FALSE(r.modifiers.empty());
    for (const auto& m : r.modifiers) {
      if (m.is_transform()) continue;  // SmoothQuant / AWQ: the quantizer after them has the scheme
      ASSERT_FALSE(m.groups.empty());
      EXPECT_EQ(m.ignore, std::vector<std::string>{"lm_head"});
      // Every Linear but lm_head is quantized.
      EXPECT_TRUE(scheme_for(m, "model.layers.0.self_attn.q_proj").has_value());
      EXPECT_FALSE(scheme_for(m, "lm_head").has_value());
    }
    // The shipped recipes name no GPTQ export (they are for vLLM), or the default.
    EXPECT_TRUE(r.export_.format.empty() || r.export_.format == "compressed-tensors" || r.export_.format == "awq" ||
                r.export_.format == "modelopt" || r.export_.format == "bitsandbytes")
        << r.export_.format;
    ++n;
  }
  EXPECT_GE(n, 5);
}

TEST(Recipe, ShippedRecipesHaveTheirSchemes) {
  struct Case {
    const char* file;
    const char* kind;
    int bits;
    bool sym;
    QuantStrategy strategy;
    const char* actorder;
  };
  const Case cases[] = {
      {"w4a16-gptq.yaml", "GPTQModifier", 4, true, QuantStrategy::Group, "weight"},
      {"w4a16-rtn.yaml", "QuantizationModifier", 4, true, QuantStrategy::Group, ""},
      {"w3a16-gptq.yaml", "GPTQModifier", 3, true, QuantStrategy::Group, "weight"},
      {"w8a16-gptq.yaml", "GPTQModifier", 8, true, QuantStrategy::Channel, "weight"},
      {"w4a16-asym-gptq.yaml", "GPTQModifier", 4, false, QuantStrategy::Group, "weight"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.file);
    const Recipe r = parse_recipe_file(kRecipes / c.file);
    ASSERT_EQ(r.modifiers.size(), 1u);
    const ModifierSpec& m = r.modifiers[0];
    EXPECT_EQ(m.kind, c.kind);
    EXPECT_EQ(m.block_size, 128);
    EXPECT_DOUBLE_EQ(m.dampening_frac, 0.01);
    ASSERT_EQ(m.groups.size(), 1u);
    expect_scheme(m.groups[0], c.bits, c.sym, c.strategy, 128);
    EXPECT_EQ(m.groups[0].actorder, c.actorder);
    EXPECT_EQ(m.groups[0].observer, "minmax");
    EXPECT_FALSE(m.groups[0].scale_dtype_set);
    EXPECT_EQ(r.export_.max_shard_bytes, 5ull << 30);
    EXPECT_EQ(r.source, (kRecipes / c.file).string());
  }
}

// ---- llm-compressor's own recipes ---------------------------------------------

// tests/e2e/recipes/actorder/recipe_w4a16_actorder_weight.yaml (llm-compressor ab1ba3ef), verbatim.
const char* kLlmcActorderWeight = R"(quant_stage:
  quant_modifiers:
    GPTQModifier:
      ignore: ["lm_head", "re:.*vision_tower.*", "re:.*multi_modal_projector.*", "re:.*visual.*", "re:.*vision_model.*"]
      actorder: "weight"
      config_groups:
        group_0:
          weights:
            num_bits: 4
            type: "int"
            symmetric: true
            strategy: "group"
            group_size: 128
          targets: ["Linear"]
)";

// The sample in GPTQModifier's docstring (src/llmcompressor/modifiers/gptq/base.py), verbatim.
const char* kLlmcGptqDocstring = R"(test_stage:
  obcq_modifiers:
    GPTQModifier:
      block_size: 128
      dampening_frac: 0.001
      offload_hessians: False
      actorder: static
      config_groups:
        group_0:
          targets:
            - "Linear"
          input_activations: null
          output_activations: null
          weights:
            num_bits: 8
            type: "int"
            symmetric: true
            strategy: group
            group_size: 128
)";

// tests/llmcompressor/transformers/compression/recipes/new_quant_group.yaml, verbatim:
// the older layout where a bare GPTQModifier quantizes what a QuantizationModifier configured.
const char* kLlmcLegacyGroup = R"(test_stage:
    quant_modifiers:
        QuantizationModifier:
            ignore: ["lm_head", "model.layers.0.mlp.down_proj"]
            config_groups:
                group_0:
                    weights:
                        num_bits: 4
                        type: "int"
                        symmetric: False
                        strategy: "group"
                        group_size: 128
                    input_activations: null
                    output_activations: null
                    targets: ["Linear"]
        GPTQModifier:
            block_size: 128)";

// What llm-compressor's Recipe.yaml() writes next to a model after
// oneshot(recipe=GPTQModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"]))
// (recipe/utils.py get_yaml_serializable_dict: stage "default", every non-None field).
const char* kLlmcSerialized = R"(default_stage:
  default_modifiers:
    GPTQModifier:
      targets: [Linear]
      ignore: [lm_head]
      scheme: W4A16
      bypass_divisibility_checks: false
      block_size: 128
      dampening_frac: 0.01
      actorder: static
      offload_hessians: false
)";

TEST(Recipe, ParsesLlmCompressorRecipes) {
  {
    const Recipe r = parse_recipe_text(kLlmcActorderWeight, "actorder_weight.yaml");
    ASSERT_EQ(r.modifiers.size(), 1u);
    const ModifierSpec& m = r.modifiers[0];
    EXPECT_EQ(m.kind, "GPTQModifier");
    EXPECT_EQ(m.stage, "quant");
    EXPECT_EQ(m.group, "quant");
    EXPECT_EQ(m.where, "actorder_weight.yaml:3:5");
    EXPECT_EQ(m.ignore.size(), 5u);
    ASSERT_EQ(m.groups.size(), 1u);
    EXPECT_EQ(m.groups[0].name, "group_0");
    EXPECT_EQ(m.groups[0].targets, std::vector<std::string>{"Linear"});
    expect_scheme(m.groups[0], 4, true, QuantStrategy::Group, 128);
    EXPECT_EQ(m.groups[0].actorder, "weight");
    EXPECT_FALSE(scheme_for(m, "model.vision_tower.layers.0.q_proj").has_value());
    EXPECT_TRUE(scheme_for(m, "model.layers.0.mlp.up_proj").has_value());
  }
  {
    const Recipe r = parse_recipe_text(kLlmcGptqDocstring, "docstring.yaml");
    ASSERT_EQ(r.modifiers.size(), 1u);
    const ModifierSpec& m = r.modifiers[0];
    EXPECT_EQ(m.stage, "test");
    EXPECT_EQ(m.group, "obcq");
    EXPECT_DOUBLE_EQ(m.dampening_frac, 0.001);
    ASSERT_EQ(m.groups.size(), 1u);
    expect_scheme(m.groups[0], 8, true, QuantStrategy::Group, 128);
    EXPECT_EQ(m.groups[0].actorder, "weight");  // "static" is an alias of "weight"
    EXPECT_EQ(m.groups[0].act_order(), GptqOptions::ActOrder::Weight);
    EXPECT_TRUE(m.is_gptq());
    EXPECT_FALSE(m.is_awq() || m.is_smoothquant() || m.is_transform());
  }
  {
    const Recipe r = parse_recipe_text(kLlmcLegacyGroup, "legacy.yaml");
    ASSERT_EQ(r.modifiers.size(), 1u);  // the QuantizationModifier is folded into GPTQ
    const ModifierSpec& m = r.modifiers[0];
    EXPECT_EQ(m.kind, "GPTQModifier");
    EXPECT_EQ(m.where, "legacy.yaml:16:9");
    ASSERT_EQ(m.groups.size(), 1u);
    expect_scheme(m.groups[0], 4, false, QuantStrategy::Group, 128);
    EXPECT_EQ(m.groups[0].actorder, "weight");
    EXPECT_FALSE(scheme_for(m, "model.layers.0.mlp.down_proj").has_value());
    EXPECT_TRUE(scheme_for(m, "model.layers.1.mlp.down_proj").has_value());
  }
  {
    const Recipe r = parse_recipe_text(kLlmcSerialized, "recipe.yaml");
    ASSERT_EQ(r.modifiers.size(), 1u);
    EXPECT_EQ(r.modifiers[0].stage, "default");
    expect_scheme(r.modifiers[0].groups[0], 4, true, QuantStrategy::Group, 128);
    EXPECT_EQ(r.text, kLlmcSerialized);
  }
}

// ---- presets ----------------------------------------------------------------------

Recipe one_modifier(const std::string& modifier_body, const std::string& kind = "GPTQModifier") {
  return parse_recipe_text("quant_stage:\n  quant_modifiers:\n    " + kind + ":\n" + modifier_body, "r.yaml");
}

TEST(Recipe, PresetsExpandToCompressedTensorsSchemes) {
  // compressed-tensors 0.18.0 quant_scheme.py: W4A16 = _int_wnam(4) (int, sym,
  // group 128); W4A16_ASYM: asym; W8A16 = _int_wnam(8), group 128 since 0.16.0.
  expect_scheme(one_modifier("      scheme: W4A16\n").modifiers[0].groups[0], 4, true, QuantStrategy::Group, 128);
  expect_scheme(one_modifier("      scheme: W4A16_ASYM\n").modifiers[0].groups[0], 4, false, QuantStrategy::Group, 128);
  expect_scheme(one_modifier("      scheme: W8A16\n").modifiers[0].groups[0], 8, true, QuantStrategy::Group, 128);
  expect_scheme(one_modifier("      scheme: W3A16\n").modifiers[0].groups[0], 3, true, QuantStrategy::Group, 128);
  expect_scheme(one_modifier("      scheme: w4a16\n").modifiers[0].groups[0], 4, true, QuantStrategy::Group, 128);

  // The preset takes the modifier's targets.
  const Recipe r = one_modifier("      targets: \"re:.*mlp.*\"\n      scheme: W4A16\n");
  EXPECT_EQ(r.modifiers[0].groups[0].targets, std::vector<std::string>{"re:.*mlp.*"});

  // {PRESET: targets}: one group per preset.
  const Recipe mixed = one_modifier(
      "      scheme:\n        W4A16: [\"re:.*self_attn.*\"]\n        W8A16: \"re:.*mlp.*\"\n"
      "        UNQUANTIZED: [\"model.layers.0.mlp.down_proj\"]\n");
  const ModifierSpec& m = mixed.modifiers[0];
  ASSERT_EQ(m.groups.size(), 3u);
  EXPECT_EQ(m.groups[0].name, "group_0");
  EXPECT_EQ(m.groups[1].name, "group_1");
  EXPECT_FALSE(m.groups[2].quantize_weights);
  EXPECT_EQ(scheme_for(m, "model.layers.3.self_attn.o_proj")->weights.bits, 4);
  EXPECT_EQ(scheme_for(m, "model.layers.3.mlp.down_proj")->weights.bits, 8);
  // An exact name beats a regex: down_proj of layer 0 stays in full precision.
  EXPECT_FALSE(scheme_for(m, "model.layers.0.mlp.down_proj").has_value());
  EXPECT_FALSE(scheme_for(m, "lm_head").has_value());  // matched by no group
}

TEST(Recipe, QuantizationArgsDefaultsAndInference) {
  auto group = [](const std::string& weights) {
    return one_modifier("      config_groups:\n        g:\n          targets: [Linear]\n          weights: " + weights +
                        "\n")
        .modifiers[0]
        .groups[0];
  };
  // num_bits defaults to 8; no group_size and no strategy: tensor.
  expect_scheme(group("{}"), 8, true, QuantStrategy::Tensor, 0);
  expect_scheme(group("{num_bits: 4, group_size: -1}"), 4, true, QuantStrategy::Channel, 0);
  expect_scheme(group("{num_bits: 4, group_size: 32, symmetric: false}"), 4, false, QuantStrategy::Group, 32);
  expect_scheme(group("{num_bits: 2, strategy: GROUP, group_size: 64}"), 2, true, QuantStrategy::Group, 64);
  const auto g = group("{num_bits: 4, strategy: channel, observer: memoryless_mse, scale_dtype: torch.bfloat16}");
  EXPECT_EQ(g.observer, "mse");
  EXPECT_EQ(g.range_observer(), RangeObserver::Mse);
  EXPECT_EQ(group("{}").range_observer(), RangeObserver::MinMax);
  EXPECT_EQ(group("{num_bits: 4, group_size: 32, actorder: true}").act_order(), GptqOptions::ActOrder::Group);
  EXPECT_TRUE(g.scale_dtype_set);
  EXPECT_EQ(g.weights.scale_dtype, DType::BF16);
  // A group without weights quantizes nothing.
  EXPECT_FALSE(one_modifier("      config_groups:\n        g: {targets: [Linear]}\n").modifiers[0].groups[0].quantize_weights);
}

TEST(Recipe, GptqActorderResolution) {
  auto actorder = [](const std::string& body) { return one_modifier(body).modifiers[0].groups[0].actorder; };
  EXPECT_EQ(actorder("      scheme: W4A16\n"), "weight");  // default "static"
  EXPECT_EQ(actorder("      scheme: W4A16\n      actorder: null\n"), "");
  EXPECT_EQ(actorder("      scheme: W4A16\n      actorder: dynamic\n"), "group");
  EXPECT_EQ(actorder("      scheme: W4A16\n      actorder: true\n"), "group");
  EXPECT_EQ(actorder("      scheme: W4A16\n      actorder: false\n"), "");
  // group act-order needs groups; llm-compressor falls back to none.
  EXPECT_EQ(actorder("      actorder: group\n      config_groups:\n        g:\n          targets: [Linear]\n"
                     "          weights: {num_bits: 8, strategy: channel}\n"),
            "");
  // A group's own actorder stands when the modifier leaves the default.
  EXPECT_EQ(actorder("      config_groups:\n        g:\n          targets: [Linear]\n"
                     "          weights: {num_bits: 4, group_size: 128, actorder: group}\n"),
            "group");
  // RTN does not reorder.
  EXPECT_EQ(one_modifier("      scheme: W4A16\n", "QuantizationModifier").modifiers[0].groups[0].actorder, "");
}

TEST(Recipe, ModifierArguments) {
  const Recipe r = one_modifier(
      "      scheme: W4A16\n      block_size: 64\n      dampening_frac: 0.1\n      weight_observer: mse\n"
      "      sequential_targets: [LlamaDecoderLayer]\n      bypass_divisibility_checks: true\n      group: gptq\n");
  const ModifierSpec& m = r.modifiers[0];
  EXPECT_EQ(m.block_size, 64);
  EXPECT_DOUBLE_EQ(m.dampening_frac, 0.1);
  EXPECT_EQ(m.groups[0].observer, "mse");
  EXPECT_EQ(m.sequential_targets, std::vector<std::string>{"LlamaDecoderLayer"});
  EXPECT_TRUE(m.bypass_divisibility_checks);
  EXPECT_EQ(m.group, "gptq");
  EXPECT_EQ(m.targets, std::vector<std::string>{"Linear"});

  // Two stages run in file order.
  const Recipe two = parse_recipe_text(
      "first_stage:\n  a_modifiers:\n    QuantizationModifier: {scheme: W8A16, targets: \"re:.*mlp.*\"}\n"
      "second_stage:\n  b_modifiers:\n    GPTQModifier: {scheme: W4A16, targets: \"re:.*self_attn.*\"}\n",
      "two.yaml");
  ASSERT_EQ(two.modifiers.size(), 2u);
  EXPECT_EQ(two.modifiers[0].kind, "QuantizationModifier");
  EXPECT_EQ(two.modifiers[0].stage, "first");
  EXPECT_EQ(two.modifiers[1].kind, "GPTQModifier");
  EXPECT_EQ(two.modifiers[1].stage, "second");
}

TEST(Recipe, CalibrationAndExportSections) {
  const Recipe r = parse_recipe_text(
      "quant_stage:\n  quant_modifiers:\n    GPTQModifier: {scheme: W4A16}\n"
      "calibration:\n  dataset: data/calib.jsonl\n  text_field: content\n  num_samples: 256\n  seq_len: 2048\n"
      "  seed: 7\nexport:\n  format: gptq\n  shard_size: 2GB\n",
      "r.yaml");
  EXPECT_EQ(r.calibration.dataset, "data/calib.jsonl");
  EXPECT_EQ(r.calibration.text_field, "content");
  EXPECT_EQ(r.calibration.num_samples, 256);
  EXPECT_EQ(r.calibration.seq_len, 2048);
  EXPECT_EQ(r.calibration.seed, 7u);
  EXPECT_FALSE(r.calibration.bf16);  // f32 unless asked
  for (const char* p : {"bf16", "bfloat16", "f32", "float32"}) {
    const Recipe q = parse_recipe_text(std::string("quant_stage:\n  quant_modifiers:\n    GPTQModifier: {scheme: W4A16}\n"
                                                   "calibration: {precision: ") + p + "}\n",
                                       "r.yaml");
    EXPECT_EQ(q.calibration.bf16, p[0] == 'b') << p;
  }
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier: {scheme: W4A16}\ncalibration: {precision: f16}\n",
               ErrorKind::InvalidInput,
               "r.yaml:4:26: calibration.precision: 'f16' is not a calibration precision (f32 or bf16)");
  EXPECT_EQ(r.export_.format, "gptq");
  EXPECT_EQ(r.export_.format_where, "r.yaml:11:11");
  EXPECT_EQ(r.export_.max_shard_bytes, 2000000000ull);

  const Recipe d = one_modifier("      scheme: W4A16\n");
  EXPECT_EQ(d.calibration.dataset, "");
  EXPECT_EQ(d.calibration.text_field, "text");
  EXPECT_EQ(d.calibration.num_samples, 128);
  EXPECT_EQ(d.calibration.seq_len, 512);
  EXPECT_EQ(d.export_.format, "");  // the default format (checkpoint_format.h)
  EXPECT_EQ(d.export_.max_shard_bytes, 5ull << 30);

  auto shard = [](const std::string& v) {
    return parse_recipe_text("q_stage:\n  q_modifiers:\n    GPTQModifier: {scheme: W4A16}\nexport: {shard_size: " + v +
                                 "}\n",
                             "r.yaml")
        .export_.max_shard_bytes;
  };
  EXPECT_EQ(shard("4GiB"), 4ull << 30);
  EXPECT_EQ(shard("500MB"), 500000000ull);
  EXPECT_EQ(shard("1000000"), 1000000ull);
  EXPECT_EQ(shard("\"300 mib\""), 300ull << 20);
  // transformers' whole numbers: a decimal shard size is refused.
  EXPECT_QF_ERROR(shard("1.5GB"), ErrorKind::InvalidInput, "export.shard_size: expected a size");
}

// ---- matching -----------------------------------------------------------------------

TEST(Recipe, MatchesLikeCompressedTensors) {
  const std::string q = "model.layers.0.self_attn.q_proj";
  EXPECT_TRUE(recipe_matches("Linear", q));
  EXPECT_TRUE(recipe_matches("Linear", "lm_head"));
  EXPECT_FALSE(recipe_matches("Linear", "model.embed_tokens", "Embedding"));
  EXPECT_TRUE(recipe_matches("Embedding", "model.embed_tokens", "Embedding"));
  EXPECT_TRUE(recipe_matches(q, q));
  EXPECT_FALSE(recipe_matches("q_proj", q));               // no suffix matching
  EXPECT_FALSE(recipe_matches("self_attn.q_proj", q));
  EXPECT_TRUE(recipe_matches("re:.*q_proj", q));
  EXPECT_TRUE(recipe_matches("re:.*q_proj", q + "_extra"));  // re.match: anchored at the start only
  EXPECT_FALSE(recipe_matches("re:.*q_proj$", q + "_extra"));
  EXPECT_FALSE(recipe_matches("re:layers", q));              // ... but anchored there
  EXPECT_TRUE(recipe_matches("re:model\\.layers\\.0\\.", q));
  EXPECT_TRUE(recipe_matches("re:.*self_attn\\.(k|q|o|v)_proj$", q));
  EXPECT_FALSE(recipe_matches("re:.*mlp\\.(down|gate|up)_proj$", q));
}

TEST(Recipe, SchemeForHonoursIgnoreAndPrecedence) {
  const Recipe r = one_modifier(
      "      ignore: [lm_head, \"re:.*layers\\\\.1\\\\..*\"]\n"
      "      config_groups:\n"
      "        by_class:\n          targets: [Linear]\n          weights: {num_bits: 4, group_size: 128}\n"
      "        by_regex_b:\n          targets: [\"re:.*mlp.*\"]\n          weights: {num_bits: 6, group_size: 64}\n"
      "        by_regex_a:\n          targets: [\"re:.*down_proj$\"]\n          weights: {num_bits: 5, group_size: 32}\n"
      "        by_name:\n          targets: [model.layers.0.mlp.down_proj]\n          weights: {num_bits: 8, group_size: -1}\n");
  const ModifierSpec& m = r.modifiers[0];
  ASSERT_EQ(m.groups.size(), 4u);
  EXPECT_FALSE(scheme_for(m, "lm_head").has_value());
  EXPECT_FALSE(scheme_for(m, "model.layers.1.self_attn.q_proj").has_value());
  EXPECT_EQ(scheme_for(m, "model.layers.0.self_attn.q_proj")->name, "by_class");
  EXPECT_EQ(scheme_for(m, "model.layers.0.mlp.gate_proj")->name, "by_regex_b");
  // Two regexes match: the alphabetically first ("re:.*down..." < "re:.*mlp...") wins.
  EXPECT_EQ(scheme_for(m, "model.layers.2.mlp.down_proj")->name, "by_regex_a");
  EXPECT_EQ(scheme_for(m, "model.layers.0.mlp.down_proj")->name, "by_name");
  EXPECT_EQ(scheme_for(m, "model.layers.0.mlp.down_proj")->weights.strategy, QuantStrategy::Channel);
  // Not a Linear: only name targets could match it.
  EXPECT_FALSE(scheme_for(m, "model.embed_tokens", "Embedding").has_value());
}

// ---- errors: "FILE:LINE:COL: what (hint)" ---------------------------------------

TEST(Recipe, ErrorUnknownModifier) {
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifer:\n      scheme: W4A16\n", ErrorKind::InvalidInput,
               "r.yaml:3:5: unknown modifier 'GPTQModifer' (did you mean 'GPTQModifier'?)");
  expect_error("quant_stage:\n  quant_modifiers:\n    SparseGPTModifier: {}\n    GPTQModifier: {scheme: W4A16}\n",
               ErrorKind::Unsupported,
               "r.yaml:3:5: SparseGPTModifier is not supported yet (supported modifiers: GPTQModifier, "
               "QuantizationModifier, AWQModifier, SmoothQuantModifier)");
}

TEST(Recipe, ErrorUnknownKey) {
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      scheme: W4A16\n      blok_size: 64\n",
               ErrorKind::InvalidInput, "r.yaml:5:7: GPTQModifier: unknown key 'blok_size' (did you mean 'block_size'?)");
  expect_error("quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      scheme: W4A16\n      xyz: 1\n",
               ErrorKind::InvalidInput,
               "r.yaml:5:7: QuantizationModifier: unknown key 'xyz' (valid keys: config_groups, targets, ignore, scheme, "
               "kv_cache_scheme, weight_observer, input_observer, output_observer, observer, "
               "bypass_divisibility_checks, index, group, start, end, update, requires_calibration_data)");
  expect_error("quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      scheme: W4A16\n      block_size: 64\n",
               ErrorKind::InvalidInput,
               "r.yaml:5:7: QuantizationModifier: unknown key 'block_size' ('block_size' is a GPTQModifier argument; "
               "QuantizationModifier rounds to nearest)");
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      config_groups:\n        g:\n"
               "          targets: [Linear]\n          weights: {num_bits: 4, groupsize: 128}\n",
               ErrorKind::InvalidInput,
               "r.yaml:7:34: GPTQModifier.config_groups.g.weights: unknown key 'groupsize' (did you mean 'group_size'?)");
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier: {scheme: W4A16}\ncalibration:\n  num_sample: 5\n",
               ErrorKind::InvalidInput, "r.yaml:5:3: calibration: unknown key 'num_sample' (did you mean 'num_samples'?)");
  expect_error("modifiers:\n  - GPTQModifier: {scheme: W4A16}\n", ErrorKind::InvalidInput,
               "r.yaml:1:1: unknown key 'modifiers' (llm-compressor recipes put modifiers under '<name>_stage: "
               "<name>_modifiers:', e.g. 'quant_stage: {quant_modifiers: {GPTQModifier: {scheme: W4A16}}}')");
  expect_error("quant_stage:\n  GPTQModifier: {scheme: W4A16}\n", ErrorKind::InvalidInput,
               "r.yaml:2:3: quant_stage: unknown key 'GPTQModifier' (put modifiers under a group key ending in "
               "'_modifiers', e.g. 'quant_modifiers: GPTQModifier: ...')");
}

TEST(Recipe, ErrorWrongType) {
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      config_groups:\n        group_0:\n"
               "          targets: [Linear]\n          weights:\n            num_bits: four\n",
               ErrorKind::InvalidInput,
               "r.yaml:8:23: GPTQModifier.config_groups.group_0.weights.num_bits: expected an integer, got 'four'");
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      scheme: W4A16\n      block_size: [1]\n",
               ErrorKind::InvalidInput, "r.yaml:5:19: GPTQModifier.block_size: expected an integer, got a list");
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      config_groups:\n        g:\n"
               "          targets: [Linear]\n          weights:\n            num_bits:\n            group_size: 64\n",
               ErrorKind::InvalidInput,
               "r.yaml:8:13: GPTQModifier.config_groups.g.weights.num_bits: expected a value, got null");
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      scheme: W4A16\n      dampening_frac: lots\n",
               ErrorKind::InvalidInput, "r.yaml:5:23: GPTQModifier.dampening_frac: expected a number, got 'lots'");
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      config_groups:\n        g:\n"
               "          targets: [Linear]\n          weights: {symmetric: \"maybe\"}\n",
               ErrorKind::InvalidInput,
               "r.yaml:7:32: GPTQModifier.config_groups.g.weights.symmetric: expected true or false, got the string "
               "\"maybe\"");
}

TEST(Recipe, ErrorImpossibleCombinations) {
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      config_groups:\n        group_0:\n"
               "          targets: [Linear]\n          weights: {num_bits: 4, strategy: group}\n",
               ErrorKind::InvalidInput,
               "r.yaml:7:44: GPTQModifier.config_groups.group_0.weights.strategy: 'group' needs a positive group_size "
               "(e.g. group_size: 128)");
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      config_groups:\n        group_0:\n"
               "          targets: [Linear]\n          weights: {num_bits: 4, group_size: 0}\n",
               ErrorKind::InvalidInput,
               "r.yaml:7:46: GPTQModifier.config_groups.group_0.weights.group_size: must be > 0 (strategy group) or -1 "
               "(channel), got 0");
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      config_groups:\n        group_0:\n"
               "          targets: [Linear]\n          weights: {num_bits: 4, group_size: 64, strategy: channel}\n",
               ErrorKind::InvalidInput,
               "r.yaml:7:46: GPTQModifier.config_groups.group_0.weights.group_size: group_size 64 needs strategy "
               "'group' (strategy is 'channel')");
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      scheme: W4A16\n      config_groups:\n"
               "        g: {targets: [Linear]}\n",
               ErrorKind::InvalidInput, "r.yaml:5:7: GPTQModifier: set either 'scheme' or 'config_groups', not both");
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      actorder: weight\n      config_groups:\n"
               "        group_0:\n          targets: [Linear]\n"
               "          weights: {num_bits: 4, group_size: 128, actorder: group}\n",
               ErrorKind::InvalidInput,
               "r.yaml:4:7: GPTQModifier.actorder: 'weight' conflicts with actorder 'group' of group_0 (remove one of "
               "them)");
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      block_size: 128\n", ErrorKind::InvalidInput,
               "r.yaml:3:5: GPTQModifier: nothing to quantize (set 'scheme: W4A16' or 'config_groups', or put a "
               "QuantizationModifier with a scheme before it)");
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier: {scheme: W4A16}\n    GPTQModifier: {scheme: W8A16}\n",
               ErrorKind::InvalidInput,
               "r.yaml:4:5: quant_stage.quant_modifiers: duplicate key 'GPTQModifier' (first at line 3)");
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      scheme: W4A16\n      ignore: [\"re:(x\"]\n",
               ErrorKind::InvalidInput,
               "r.yaml:5:16: GPTQModifier.ignore: 're:(x': invalid regular expression: missing closing parenthesis at "
               "offset 2");
}

TEST(Recipe, ErrorYamlSyntax) {
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      scheme: W4A16\n      ignore: [lm_head\n",
               ErrorKind::InvalidInput, "r.yaml:6:1: YAML syntax error: end of sequence flow not found");
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      scheme: W4A16\n     ignore: x\n",
               ErrorKind::InvalidInput, "r.yaml:5:6: YAML syntax error: end of map not found");
  expect_error("quant_stage:\n  quant_modifiers: b: c\n", ErrorKind::InvalidInput,
               "r.yaml:2:21: YAML syntax error: illegal map value");
  expect_error("", ErrorKind::InvalidInput, "r.yaml:1:1: empty recipe (expected a mapping with a '<name>_stage:' key)");
}

TEST(Recipe, ErrorUnsupportedPreset) {
  for (const char* p : {"MXFP4", "MXFP8", "FP8_BLOCK", "W4A4", "W2A4"}) {
    const Error e =
        parse_error(std::string("quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      scheme: ") + p + "\n");
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported) << p << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find("r.yaml:4:15: QuantizationModifier.scheme: preset '"), std::string::npos) << e.what();
  }
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      scheme: W4A61\n", ErrorKind::InvalidInput,
               "r.yaml:4:15: GPTQModifier.scheme: unknown preset scheme 'W4A61' (did you mean 'W4A16'?)");
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      config_groups:\n        g:\n"
               "          targets: [Linear]\n          weights: {num_bits: 6, type: float}\n",
               ErrorKind::Unsupported,
               "r.yaml:7:31: GPTQModifier.config_groups.g.weights.num_bits: float weights have 8 (FP8 E4M3) or 4 "
               "(NVFP4) bits, got 6");
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      config_groups:\n        g:\n"
               "          targets: [Linear]\n          weights: {num_bits: 8}\n"
               "          input_activations: {num_bits: 4, strategy: token, dynamic: true}\n",
               ErrorKind::Unsupported,
               "r.yaml:8:41: GPTQModifier.config_groups.g.input_activations.num_bits: integer activations are "
               "quantized to 8 bits only, not 4");
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      config_groups:\n        g:\n"
               "          targets: [Linear]\n          weights: {num_bits: 8}\n"
               "          input_activations: {num_bits: 8, strategy: token}\n",
               ErrorKind::InvalidInput,
               "r.yaml:8:30: GPTQModifier.config_groups.g.input_activations: per-token activation scales are dynamic "
               "(set dynamic: true, or strategy: tensor for static scales)");
  expect_error("quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      scheme: FP8\n"
               "      kv_cache_scheme: {num_bits: 8, type: int, strategy: tensor}\n",
               ErrorKind::Unsupported,
               "r.yaml:5:24: QuantizationModifier.kv_cache_scheme: only FP8 E4M3 KV caches with static per-tensor "
               "scales are supported (num_bits: 8, type: float, strategy: tensor, dynamic: false)");
}

TEST(Recipe, ActivationAndFloatPresets) {
  auto first = [](const std::string& preset) {
    const Recipe r = parse_recipe_text("quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      scheme: " +
                                           preset + "\n",
                                       "r.yaml");
    return r.modifiers.at(0).groups.at(0);
  };
  const auto w8a8 = first("W8A8");
  EXPECT_EQ(w8a8.weights.describe(), "int8 sym channel");
  ASSERT_TRUE(w8a8.input_activations);
  EXPECT_EQ(w8a8.input_activations->describe(), "int8 token dynamic");
  EXPECT_EQ(first("INT8").weights.describe(), "int8 sym channel");
  const auto fp8 = first("FP8");
  EXPECT_EQ(fp8.weights.describe(), "fp8 tensor");
  ASSERT_TRUE(fp8.input_activations);
  EXPECT_EQ(fp8.input_activations->describe(), "fp8 tensor static");
  const auto fp8d = first("fp8_dynamic");
  EXPECT_EQ(fp8d.weights.describe(), "fp8 channel");
  EXPECT_EQ(fp8d.input_activations->describe(), "fp8 token dynamic");
  const auto nv = first("NVFP4");
  EXPECT_TRUE(nv.weights.is_nvfp4());
  EXPECT_EQ(nv.weights.scale_dtype, DType::F8_E4M3);
  EXPECT_TRUE(nv.scale_dtype_set);
  ASSERT_TRUE(nv.input_activations);
  EXPECT_TRUE(nv.input_activations->is_nvfp4());
  const auto nva16 = first("NVFP4A16");
  EXPECT_TRUE(nva16.weights.is_nvfp4());
  EXPECT_FALSE(nva16.input_activations);
  EXPECT_EQ(first("W4A8").input_activations->describe(), "int8 token dynamic");
  EXPECT_EQ(first("W4AFP8").input_activations->describe(), "fp8 token dynamic");
  EXPECT_FALSE(first("W4A16").input_activations);

  // The same schemes written out as config_groups.
  const Recipe r = parse_recipe_text(
      "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n"
      "      kv_cache_scheme: {num_bits: 8, type: float, strategy: tensor, dynamic: false, symmetric: true}\n"
      "      config_groups:\n"
      "        a:\n          targets: ['re:.*mlp.*']\n"
      "          weights: {num_bits: 4, type: float, strategy: tensor_group, group_size: 16, scale_dtype: float8_e4m3fn}\n"
      "          input_activations: {num_bits: 4, type: float, strategy: tensor_group, group_size: 16, dynamic: local}\n"
      "        b:\n          targets: [Linear]\n"
      "          weights: {num_bits: 8, type: int, strategy: channel}\n"
      "          input_activations: {num_bits: 8, type: int, strategy: tensor, dynamic: false, symmetric: false}\n",
      "r.yaml");
  const ModifierSpec& m = r.modifiers.at(0);
  ASSERT_TRUE(m.kv_cache_scheme);
  EXPECT_EQ(m.kv_cache_scheme->describe(), "fp8 tensor static");
  ASSERT_EQ(m.groups.size(), 2u);
  EXPECT_TRUE(m.groups[0].weights.is_nvfp4());
  EXPECT_TRUE(m.groups[0].input_activations->is_nvfp4());
  EXPECT_EQ(m.groups[1].input_activations->describe(), "int8 asym tensor static");
  EXPECT_EQ(scheme_for(m, "model.layers.0.mlp.up_proj")->name, "a");
  EXPECT_EQ(scheme_for(m, "model.layers.0.self_attn.q_proj")->name, "b");
}

// ---- every accepted key has its effect or is refused ----------------------------

// observer_kwargs: the mse observer's settings, checked and kept (typed for the
// quantizer, raw for the exported config); other observers' keys refused.
TEST(Recipe, ObserverKwargs) {
  auto group = [](const std::string& weights, const std::string& extra = "") {
    return one_modifier(extra + "      config_groups:\n        g:\n          targets: [Linear]\n          weights: " +
                            weights + "\n",
                        "QuantizationModifier")
        .modifiers[0]
        .groups[0];
  };
  const auto d = group("{num_bits: 4, group_size: 128, observer: mse}");
  EXPECT_EQ(d.observer, "mse");
  EXPECT_EQ(d.mse.maxshrink, 0.2);  // llm-compressor's defaults
  EXPECT_EQ(d.mse.patience, 5);
  EXPECT_EQ(d.mse.grid, 100.0);
  EXPECT_EQ(d.mse.norm, 2.4);
  EXPECT_TRUE(d.observer_kwargs.empty());
  const auto g = group("{num_bits: 4, group_size: 128, observer: mse, observer_kwargs: {maxshrink: 0.5, patience: 2, "
                       "grid: 50, norm: 2, expand: 1.5, chunk_size: 10, averaging_constant: 0.1}}");
  EXPECT_EQ(g.mse.maxshrink, 0.5);
  EXPECT_EQ(g.mse.patience, 2);
  EXPECT_EQ(g.mse.grid, 50.0);
  EXPECT_EQ(g.mse.norm, 2.0);
  EXPECT_EQ(g.mse.expand, 1.5);
  EXPECT_EQ(g.observer_kwargs.at("maxshrink"), "0.5");
  EXPECT_EQ(g.observer_kwargs.size(), 7u);
  // The modifier's weight_observer decides which keys apply.
  EXPECT_EQ(group("{num_bits: 4, group_size: 128, observer_kwargs: {patience: 9}}", "      weight_observer: mse\n").mse.patience, 9);
  // minmax reads averaging_constant only (no effect on weights, observed once).
  EXPECT_EQ(group("{num_bits: 4, group_size: 128, observer_kwargs: {averaging_constant: 0.5}}").observer, "minmax");
  expect_error("quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      config_groups:\n        g:\n"
               "          targets: [Linear]\n          weights: {num_bits: 4, group_size: 128, observer_kwargs: {maxshrink: 0.5}}\n",
               ErrorKind::InvalidInput,
               "r.yaml:7:69: QuantizationModifier.config_groups.g.weights.observer_kwargs: unknown key 'maxshrink' for the "
               "'minmax' observer ('maxshrink' is the mse observer's)");
  expect_error("quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      config_groups:\n        g:\n"
               "          targets: [Linear]\n          weights: {observer: mse, observer_kwargs: {max_shrink: 0.5}}\n",
               ErrorKind::InvalidInput,
               "r.yaml:7:54: QuantizationModifier.config_groups.g.weights.observer_kwargs: unknown key 'max_shrink' for the "
               "'mse' observer (did you mean 'maxshrink'?)");
  expect_error("quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      config_groups:\n        g:\n"
               "          targets: [Linear]\n          weights: {observer: mse, observer_kwargs: {patience: -1}}\n",
               ErrorKind::InvalidInput,
               "r.yaml:7:64: QuantizationModifier.config_groups.g.weights.observer_kwargs.patience: must be >= 0, got -1");
  expect_error("quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      config_groups:\n        g:\n"
               "          targets: [Linear]\n          weights: {observer: mse, observer_kwargs: {expand: 0.5}}\n",
               ErrorKind::InvalidInput,
               "r.yaml:7:62: QuantizationModifier.config_groups.g.weights.observer_kwargs.expand: must be >= 1 (the search "
               "starts from expand times the range)");
}

// Observers: mse is implemented for integer weights only; calibrated
// activation scales are static_minmax; dynamic activations have no observer.
TEST(Recipe, ObserversEitherApplyOrAreRefused) {
  const std::string q = "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n";
  expect_error(q + "      scheme: FP8\n      weight_observer: mse\n", ErrorKind::Unsupported,
               "r.yaml:5:24: QuantizationModifier: observer 'mse' is implemented for integer weights; group_0 is fp8 "
               "tensor (FP8, NVFP4, NF4 and FP4 weights use minmax)");
  expect_error(q + "      config_groups:\n        g:\n          targets: [Linear]\n"
                   "          weights: {num_bits: 8, type: float, strategy: channel, observer: mse}\n",
               ErrorKind::Unsupported,
               "r.yaml:7:76: QuantizationModifier.config_groups.g.weights.observer: 'mse' is implemented for integer "
               "weights, not fp8 channel (FP8 and NVFP4 weights use minmax)");
  expect_error(q + "      scheme: FP8\n      input_observer: minmax\n", ErrorKind::Unsupported,
               "r.yaml:5:23: QuantizationModifier (input observer of group_0): observer 'minmax' (a moving average over "
               "calibration batches) is not supported for calibrated input or KV-cache scales; quantforge takes the "
               "running min/max over every calibration sample (static_minmax)");
  expect_error(q + "      scheme: NVFP4\n      observer: {input: memoryless_minmax}\n", ErrorKind::Unsupported,
               "r.yaml:5:25: QuantizationModifier (input observer of group_0): observer 'memoryless_minmax' (the last "
               "calibration batch only) is not supported for calibrated input or KV-cache scales; quantforge takes the "
               "running min/max over every calibration sample (static_minmax)");
  expect_error(q + "      scheme: W4A16\n      kv_cache_scheme: {num_bits: 8, type: float, strategy: tensor, observer: mse}\n",
               ErrorKind::Unsupported,
               "r.yaml:5:79: QuantizationModifier.kv_cache_scheme.observer: observer 'mse' is not supported for "
               "calibrated input or KV-cache scales; quantforge takes the running min/max over every calibration sample "
               "(static_minmax)");
  expect_error(q + "      scheme: FP8\n      input_observer: static_minmax\n      observer: {weights: minmax}\n",
               ErrorKind::InvalidInput,
               "r.yaml:6:7: QuantizationModifier: set either 'observer' or 'weight_observer'/'input_observer'/"
               "'output_observer', not both");
  // What is accepted: static_minmax for calibrated scales, anything known for
  // dynamic ones (no observer runs), output observers (no output activations).
  EXPECT_NO_THROW(parse_recipe_text(q + "      scheme: FP8\n      input_observer: static_minmax\n", "r.yaml"));
  EXPECT_NO_THROW(parse_recipe_text(q + "      scheme: FP8_DYNAMIC\n      input_observer: minmax\n      "
                                        "output_observer: mse\n", "r.yaml"));
  EXPECT_NO_THROW(parse_recipe_text(q + "      scheme: W4A16\n      kv_cache_scheme: {num_bits: 8, type: float, "
                                        "strategy: tensor, observer: static_minmax}\n", "r.yaml"));
  expect_error(q + "      config_groups:\n        g:\n          targets: [Linear]\n          weights: {num_bits: 8}\n"
                   "          input_activations: {num_bits: 8, strategy: tensor, observer_kwargs: {averaging_constant: 0.1}}\n",
               ErrorKind::InvalidInput,
               "r.yaml:8:80: QuantizationModifier.config_groups.g.input_activations.observer_kwargs: unknown key "
               "'averaging_constant' (static_minmax, the observer of calibrated scales, takes no arguments)");
}

// Dtype arguments quantforge cannot choose are refused unless they name what
// it writes.
TEST(Recipe, DtypeArgumentsNameWhatIsWritten) {
  const std::string q = "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      config_groups:\n        g:\n"
                        "          targets: [Linear]\n";
  EXPECT_NO_THROW(parse_recipe_text(q + "          weights: {num_bits: 4, group_size: 128, symmetric: false, zp_dtype: torch.int8}\n", "r.yaml"));
  EXPECT_NO_THROW(parse_recipe_text(q + "          weights: {num_bits: 4, type: float, strategy: tensor_group, group_size: 16}\n"
                                        "          input_activations: {num_bits: 4, type: float, strategy: tensor_group, "
                                        "group_size: 16, dynamic: local, scale_dtype: torch.float8_e4m3fn}\n", "r.yaml"));
  expect_error(q + "          weights: {num_bits: 4, group_size: 128, zp_dtype: int32}\n", ErrorKind::Unsupported,
               "r.yaml:7:61: QuantizationModifier.config_groups.g.weights.zp_dtype: 'int32' is not supported (integer zero "
               "points are written as int8; accepted: int8)");
  expect_error(q + "          weights: {num_bits: 8}\n          input_activations: {num_bits: 8, strategy: tensor, "
                   "scale_dtype: float32}\n",
               ErrorKind::Unsupported,
               "r.yaml:8:75: QuantizationModifier.config_groups.g.input_activations.scale_dtype: 'float32' is not "
               "supported (input and KV-cache scales are stored in the model's dtype)");
}

// Modifier fields with an effect here: bypass_divisibility_checks (where the
// plan's error points), requires_calibration_data, a scheme's format.
TEST(Recipe, BypassFormatAndCalibrationFields) {
  const Recipe r = one_modifier("      scheme: W4A16\n      bypass_divisibility_checks: true\n      requires_calibration_data: true\n",
                                "QuantizationModifier");
  EXPECT_TRUE(r.modifiers[0].bypass_divisibility_checks);
  EXPECT_EQ(r.modifiers[0].bypass_where, "r.yaml:5:7");
  EXPECT_TRUE(r.modifiers[0].requires_calibration_data);
  // The sequential unit is the decoder layer (llm-compressor's default).
  expect_error("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      scheme: W4A16\n      sequential_targets: [LlamaDecoderLayer, Linear]\n",
               ErrorKind::Unsupported,
               "r.yaml:5:47: GPTQModifier.sequential_targets: 'Linear' is not supported: the sequential unit here is the "
               "decoder layer (e.g. LlamaDecoderLayer, llm-compressor's default)");
  const Recipe f = one_modifier("      config_groups:\n        g:\n          targets: [Linear]\n"
                                "          weights: {num_bits: 4, group_size: 128}\n          format: pack-quantized\n");
  EXPECT_EQ(f.modifiers[0].groups[0].format, "pack-quantized");
  EXPECT_EQ(f.modifiers[0].groups[0].format_where, "r.yaml:8:19");
}

TEST(Recipe, TransformModifiers) {
  const Recipe r = parse_recipe_text(
      "smooth_stage:\n  smooth_modifiers:\n    SmoothQuantModifier:\n      smoothing_strength: 0.8\n"
      "quant_stage:\n  quant_modifiers:\n    AWQModifier: {duo_scaling: false, n_grid: 10, apply_clip: false}\n"
      "    GPTQModifier: {scheme: W4A16}\n",
      "r.yaml");
  ASSERT_EQ(r.modifiers.size(), 3u);
  EXPECT_EQ(r.modifiers[0].kind, "SmoothQuantModifier");
  EXPECT_TRUE(r.modifiers[0].is_transform());
  EXPECT_DOUBLE_EQ(r.modifiers[0].smoothing_strength, 0.8);
  EXPECT_FALSE(r.modifiers[0].search_smoothing_strength);
  EXPECT_EQ(r.modifiers[1].kind, "AWQModifier");
  EXPECT_TRUE(r.modifiers[1].groups.empty());
  EXPECT_FALSE(r.modifiers[1].duo_scaling);
  EXPECT_EQ(r.modifiers[1].n_grid, 10);
  EXPECT_FALSE(r.modifiers[1].apply_clip);
  EXPECT_EQ(r.modifiers[2].kind, "GPTQModifier");
  // AWQModifier with its own scheme (llm-compressor < 0.9 style).
  const Recipe legacy = parse_recipe_text(
      "quant_stage:\n  quant_modifiers:\n    AWQModifier: {scheme: W4A16_ASYM, ignore: [lm_head]}\n", "r.yaml");
  ASSERT_EQ(legacy.modifiers.at(0).groups.size(), 1u);
  EXPECT_FALSE(legacy.modifiers[0].groups[0].weights.symmetric);
  const Recipe search = parse_recipe_text(
      "quant_stage:\n  quant_modifiers:\n    SmoothQuantModifier: {search_smoothing_strength: true, "
      "smoothing_strength_grid: [0.5, 0.9]}\n    QuantizationModifier: {scheme: W8A8}\n",
      "r.yaml");
  EXPECT_TRUE(search.modifiers[0].search_smoothing_strength);
  EXPECT_EQ(search.modifiers[0].smoothing_strength_grid, (std::vector<double>{0.5, 0.9}));
  expect_error("quant_stage:\n  quant_modifiers:\n    SmoothQuantModifier: {smoothing_strength: 1.5}\n",
               ErrorKind::InvalidInput, "r.yaml:3:47: SmoothQuantModifier.smoothing_strength: must be in [0, 1]");
  expect_error("quant_stage:\n  quant_modifiers:\n    SmoothQuantModifier: {mappings: [[[a], b]]}\n",
               ErrorKind::Unsupported,
               "r.yaml:3:37: SmoothQuantModifier.mappings: custom mappings are not supported; the llama-family "
               "defaults are used (input_layernorm -> q/k/v, post_attention_layernorm -> gate/up)");
  expect_error("quant_stage:\n  quant_modifiers:\n    AWQModifier: {duo_scaling: both}\n", ErrorKind::Unsupported,
               "r.yaml:3:32: AWQModifier.duo_scaling: 'both' is not supported (true or false)");
  EXPECT_EQ(r.modifiers[1].awq_loss, "");  // not given: the CPU's default
  for (const char* v : {"module", "linear"}) {
    const Recipe l = parse_recipe_text(std::string("quant_stage:\n  quant_modifiers:\n    AWQModifier: {loss: ") + v +
                                           "}\n    QuantizationModifier: {scheme: W4A16}\n",
                                       "r.yaml");
    EXPECT_EQ(l.modifiers[0].awq_loss, v);
  }
  expect_error("quant_stage:\n  quant_modifiers:\n    AWQModifier: {loss: mse}\n", ErrorKind::InvalidInput,
               "r.yaml:3:25: AWQModifier.loss: 'mse' is not a loss (module: the inspected module's output; linear: each "
               "Linear's own output)");
  expect_error("quant_stage:\n  quant_modifiers:\n    SmoothQuantModifier: {alpha: 0.5}\n", ErrorKind::InvalidInput,
               "r.yaml:3:27: SmoothQuantModifier: unknown key 'alpha' (valid keys: smoothing_strength, mappings, ignore, "
               "num_calibration_steps, calibration_function, algorithm, search_smoothing_strength, "
               "smoothing_strength_grid, index, group, start, end, update, requires_calibration_data)");
}

TEST(Recipe, FilesAndMarkdownCards) {
  test::TempDir dir;
  EXPECT_THROW(
      {
        try {
          parse_recipe_file(dir / "missing.yaml");
        } catch (const Error& e) {
          EXPECT_EQ(e.kind(), ErrorKind::NotFound);
          throw;
        }
      },
      Error);
  test::write_file(dir / "card.md",
                   "# A model card\n\ntext\n\n---\nquant_stage:\n  quant_modifiers:\n    GPTQModifier:\n"
                   "      scheme: W4A16\n---\n\nmore text\n");
  const Recipe r = parse_recipe_file(dir / "card.md");
  ASSERT_EQ(r.modifiers.size(), 1u);
  EXPECT_EQ(r.modifiers[0].where, (dir / "card.md").string() + ":8:5");  // lines of the .md file
  test::write_file(dir / "bad.yaml", "quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n      scheme: W4A16\n"
                                     "      block_size: -3\n");
  try {
    parse_recipe_file(dir / "bad.yaml");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), (dir / "bad.yaml").string() + ":5:19: GPTQModifier.block_size: must be >= 1, got -3");
  }
}

// The copy kept beside an output: calibration resolved, everything else the
// same recipe.
TEST(Recipe, ResolvedTextParsesToTheSameRecipe) {
  const Recipe r = parse_recipe_file(kRecipes / "w4a16-gptq.yaml");
  const std::string text = resolved_recipe_text(r, "/data/calib.jsonl", "# header\n");
  EXPECT_EQ(text.rfind("# header\n", 0), 0u);
  const Recipe again = parse_recipe_text(text, "copy.yaml");
  EXPECT_EQ(again.calibration.dataset, "/data/calib.jsonl");
  EXPECT_EQ(again.calibration.seed, r.calibration.seed);
  EXPECT_EQ(again.calibration.num_samples, r.calibration.num_samples);
  EXPECT_EQ(again.calibration.seq_len, r.calibration.seq_len);
  EXPECT_EQ(again.calibration.text_field, r.calibration.text_field);
  ASSERT_EQ(again.modifiers.size(), r.modifiers.size());
  for (size_t i = 0; i < r.modifiers.size(); ++i) {
    EXPECT_EQ(again.modifiers[i].kind, r.modifiers[i].kind);
    ASSERT_EQ(again.modifiers[i].groups.size(), r.modifiers[i].groups.size());
    for (size_t g = 0; g < r.modifiers[i].groups.size(); ++g)
      EXPECT_EQ(again.modifiers[i].groups[g].weights.describe(), r.modifiers[i].groups[g].weights.describe());
  }
  EXPECT_EQ(again.export_.format, r.export_.format);
}

}  // namespace
}  // namespace qf

namespace qf {
namespace {

// Nesting past yaml-cpp's depth limit (which keeps its recursive parser on
// the stack) is an InvalidInput error that says so and names the file; a
// recipe dict from Python arrives as such JSON text.
TEST(Recipe, DeeplyNestedYamlIsInvalidInputNamingTheFile) {
  for (const std::string& text :
       {"quant_stage: " + std::string(100000, '[') + std::string(100000, ']') + "\n",
        [] {
          std::string s;
          for (int i = 0; i < 2000; ++i) s += "{\"x\": ";
          return s + "1" + std::string(2000, '}') + "\n";
        }(),
        "quant_stage:\n  " + [] {
          std::string s;
          for (int i = 0; i < 100000; ++i) s += "- ";
          return s;
        }() + "x\n"}) {
    const Error e = parse_error(text);
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("r.yaml:", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("YAML nested too deeply"), std::string::npos) << e.what();
  }
  // 100 levels are only a recipe with an unknown key.
  std::string text = "quant_stage: ";
  for (int i = 0; i < 100; ++i) text += "{x: ";
  text += "1" + std::string(100, '}') + "\n";
  EXPECT_EQ(parse_error(text).kind(), ErrorKind::InvalidInput);
  EXPECT_EQ(std::string(parse_error(text).what()).find("nested too deeply"), std::string::npos);
}

}  // namespace
}  // namespace qf

namespace qf {
namespace {

TEST(Recipe, BitsandbytesPresetsAndExportKeys) {
  const std::string q = "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      scheme: ";
  const Recipe r = parse_recipe_text(q + "nf4\nexport:\n  format: bitsandbytes\n  double_quant: true\n  compute_dtype: bfloat16\n",
                                     "r.yaml");
  const auto& g = r.modifiers.at(0).groups.at(0);
  EXPECT_TRUE(g.weights.is_bnb4());
  EXPECT_EQ(g.weights.type, QuantType::Nf4);
  EXPECT_EQ(g.weights.group_size, 64);
  EXPECT_FALSE(g.input_activations);
  EXPECT_FALSE(g.scale_dtype_set);  // the plan gives it the model dtype
  EXPECT_TRUE(r.export_.double_quant);
  EXPECT_EQ(r.export_.compute_dtype, "bfloat16");
  const Recipe f = parse_recipe_text(q + "FP4\nexport: {format: bitsandbytes}\n", "r.yaml");
  EXPECT_EQ(f.modifiers.at(0).groups.at(0).weights.type, QuantType::Fp4);
  EXPECT_FALSE(f.export_.double_quant);  // BitsAndBytesConfig's default
  EXPECT_EQ(f.export_.compute_dtype, "");
  EXPECT_QF_ERROR(parse_recipe_text(q + "NF4\nexport: {format: gptq, double_quant: true}\n", "r.yaml"),
                  ErrorKind::Unsupported, "r.yaml:5:24: export.double_quant: only for format: bitsandbytes");
  EXPECT_QF_ERROR(parse_recipe_text(q + "NF4\nexport: {format: bitsandbytes, compute_dtype: float64}\n", "r.yaml"),
                  ErrorKind::InvalidInput, "export.compute_dtype: expected float32, float16 or bfloat16");
  EXPECT_QF_ERROR(parse_recipe_text(q + "NF4\nexport: {format: bitsandbytes, double_quants: true}\n", "r.yaml"),
                  ErrorKind::InvalidInput, "unknown key 'double_quants'");
  EXPECT_QF_ERROR(parse_recipe_text(q + "NF4\n      weight_observer: mse\n", "r.yaml"), ErrorKind::Unsupported,
                  "observer 'mse' is implemented for integer weights");
}

}  // namespace
}  // namespace qf
