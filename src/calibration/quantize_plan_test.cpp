// make_quantize_plan: every shipped recipe plans on the bundled fixture, and
// the plan refuses what a format cannot hold before any work is done.
#include "calibration/quantize_plan.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace qf {
namespace {

using namespace qf::test;

const rt::Model& fixture_model() {
  static auto m = rt::load_hf_model(source_dir() / "tests" / "data" / "fixture-llama");
  return *m;
}

TEST(QuantizePlan, EveryShippedRecipePlansOnTheFixture) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(source_dir() / "recipes")) {
    if (e.path().extension() != ".yaml") continue;
    SCOPED_TRACE(e.path().string());
    const Recipe r = parse_recipe_file(e.path());
    const QuantizePlan plan = make_quantize_plan(r, fixture_model());
    EXPECT_EQ(plan.linears.size(), 28u);  // 4 layers x 7 Linears; lm_head stays f16
    ++n;
  }
  EXPECT_GE(n, 15);
}

TEST(QuantizePlan, ModifierOrderCalibrationAndFormats) {
  auto plan = [](const std::string& text) { return make_quantize_plan(parse_recipe_text(text, "r.yaml"), fixture_model()); };
  const std::string quant = "    QuantizationModifier: {targets: [Linear], ignore: [lm_head], scheme: ";
  {
    const QuantizePlan p = plan("q_stage:\n  q_modifiers:\n    SmoothQuantModifier: {}\n    AWQModifier: {}\n" + quant + "W8A8}\n");
    EXPECT_EQ(p.method, "smoothquant+awq+rtn");
    EXPECT_TRUE(p.needs_calibration);
    EXPECT_FALSE(p.needs_activation_ranges);  // per-token dynamic inputs
    ASSERT_TRUE(p.awq.has_value());
    EXPECT_EQ(p.awq->group_size, -1);         // the quantizer's per-channel scheme
    EXPECT_TRUE(p.smoothquant.has_value());
    EXPECT_EQ(p.quantizer, QuantMethod::Rtn);
  }
  {
    // The typed plan: GPTQ's options, each Linear's resolved scheme, the export groups.
    const QuantizePlan p = plan("q_stage:\n  q_modifiers:\n    GPTQModifier: {targets: [Linear], ignore: [lm_head], "
                                "scheme: W4A16, dampening_frac: 0.05, block_size: 64, actorder: group}\n");
    EXPECT_EQ(p.quantizer, QuantMethod::Gptq);
    EXPECT_DOUBLE_EQ(p.gptq.dampening_frac, 0.05);
    EXPECT_EQ(p.gptq.block_size, 64);
    EXPECT_FALSE(p.smoothquant || p.awq || p.export_config.kv_cache);
    ASSERT_EQ(p.export_config.groups.size(), 1u);
    EXPECT_TRUE(p.export_config.by_gptq);
    EXPECT_EQ(p.export_config.groups[0].actorder, GptqOptions::ActOrder::Group);
    const PlannedLinear& down = p.linears.at("model.layers.3.mlp.down_proj");
    EXPECT_EQ(down.actorder, GptqOptions::ActOrder::Group);
    EXPECT_EQ(down.weights.describe(), "int4 sym g128");
    EXPECT_EQ(down.weights.scale_dtype, DType::F16);  // the fixture's dtype
    EXPECT_FALSE(down.act.has_value());
  }
  EXPECT_FALSE(plan("q_stage:\n  q_modifiers:\n" + quant + "FP8_DYNAMIC}\n").needs_calibration);
  EXPECT_TRUE(plan("q_stage:\n  q_modifiers:\n" + quant + "FP8}\n").needs_activation_ranges);
  EXPECT_TRUE(plan("q_stage:\n  q_modifiers:\n" + quant + "NVFP4}\n").needs_activation_ranges);
  // Legacy AWQModifier with its own scheme quantizes by RTN.
  EXPECT_EQ(plan("q_stage:\n  q_modifiers:\n    AWQModifier: {scheme: W4A16, ignore: [lm_head]}\n").method, "awq+rtn");
  EXPECT_QF_ERROR(plan("q_stage:\n  q_modifiers:\n" + quant + "W4A16}\n    SmoothQuantModifier: {}\n"),
                  ErrorKind::Unsupported, "SmoothQuantModifier must come first");
  EXPECT_QF_ERROR(plan("q_stage:\n  q_modifiers:\n    AWQModifier: {}\n"), ErrorKind::InvalidInput,
                  "the recipe quantizes nothing");
  EXPECT_QF_ERROR(plan("q_stage:\n  q_modifiers:\n    GPTQModifier: {targets: [Linear], ignore: [lm_head], scheme: FP8}\n"),
                  ErrorKind::Unsupported, "GPTQModifier quantizes integer weights");
  EXPECT_QF_ERROR(plan("q_stage:\n  q_modifiers:\n" + quant + "FP8_DYNAMIC}\nexport: {format: modelopt}\n"),
                  ErrorKind::Unsupported, "the modelopt format holds FP8 (per-tensor weights");
  EXPECT_EQ(plan("q_stage:\n  q_modifiers:\n" + quant + "W4A16}\nexport: {format: awq}\n").linears.size(), 28u);
  EXPECT_QF_ERROR(plan("q_stage:\n  q_modifiers:\n" + quant + "W8A16}\nexport: {format: awq}\n"), ErrorKind::Unsupported,
                  "the AutoAWQ GEMM format holds 4-bit group quantization, not int8 sym g128");
  EXPECT_QF_ERROR(plan("q_stage:\n  q_modifiers:\n" + quant + "W8A8}\nexport: {format: gptq}\n"),
                  ErrorKind::Unsupported, "the gptq format holds weight-only schemes");
}

// q/k/v and gate/up are NVFP4 as a set or not at all (vLLM fuses each into one
// Linear with one global scale; llm-compressor refuses a partial set too).
TEST(QuantizePlan, FusedSetsAreNvfp4AsAWhole) {
  auto plan = [](const std::string& body) {
    return make_quantize_plan(parse_recipe_text("q_stage:\n  q_modifiers:\n    QuantizationModifier:\n" + body, "r.yaml"),
                              fixture_model());
  };
  EXPECT_TRUE(plan("      scheme: NVFP4A16\n      ignore: [lm_head]\n").fused_nvfp4);
  EXPECT_FALSE(plan("      scheme: W4A16\n      ignore: [lm_head]\n").fused_nvfp4);
  // NVFP4 attention, int4 MLP: each set is whole.
  EXPECT_TRUE(plan("      ignore: [lm_head]\n      scheme: {NVFP4A16: ['re:.*self_attn.*'], W4A16: ['re:.*mlp.*']}\n").fused_nvfp4);
  // o_proj and down_proj are not fused: they may differ.
  EXPECT_TRUE(plan("      ignore: [lm_head, 're:.*o_proj$']\n      scheme: NVFP4\n").fused_nvfp4);
  EXPECT_QF_ERROR(plan("      ignore: [lm_head, 're:.*v_proj$']\n      scheme: NVFP4\n"), ErrorKind::Unsupported,
                  "r.yaml:5:15: model.layers.0.self_attn: q_proj, k_proj are NVFP4 but v_proj is not: vLLM fuses them into "
                  "one Linear with one NVFP4 global scale (llm-compressor refuses this too); quantize all of them with "
                  "NVFP4 or none");
  EXPECT_QF_ERROR(plan("      ignore: [lm_head]\n      scheme: {NVFP4: ['re:.*gate_proj$', 're:.*self_attn.*', 're:.*down_proj$'], "
                       "W4A16: ['re:.*up_proj$']}\n"),
                  ErrorKind::Unsupported, "model.layers.0.mlp: gate_proj is NVFP4 but up_proj is not");
}

// bypass_divisibility_checks skips llm-compressor's early check, but the
// quantizer still cannot make partial groups: the error then names the key.
TEST(QuantizePlan, BypassDivisibilityChecks) {
  auto plan = [](const std::string& extra) {
    return make_quantize_plan(
        parse_recipe_text("q_stage:\n  q_modifiers:\n    QuantizationModifier:\n" + extra +
                              "      config_groups:\n        g:\n          targets: [Linear]\n"
                              "          weights: {num_bits: 4, group_size: 96}\n      ignore: [lm_head]\n",
                          "r.yaml"),
        fixture_model());
  };
  EXPECT_QF_ERROR(plan(""), ErrorKind::InvalidInput,
                  "r.yaml:5:9: group_size 96 does not divide the 256 input columns of model.layers.0.self_attn.q_proj");
  EXPECT_QF_ERROR(plan("      bypass_divisibility_checks: true\n"), ErrorKind::Unsupported,
                  "r.yaml:4:7: bypass_divisibility_checks: group_size 96 does not divide the 256 input columns of "
                  "model.layers.0.self_attn.q_proj: a group size that does not divide the columns cannot be quantized");
  // With group sizes that divide, the key changes nothing.
  const std::string ok = "q_stage:\n  q_modifiers:\n    QuantizationModifier:\n      scheme: W4A16\n      ignore: [lm_head]\n";
  EXPECT_EQ(make_quantize_plan(parse_recipe_text(ok + "      bypass_divisibility_checks: true\n", "r.yaml"), fixture_model()).linears.size(),
            28u);
}

// A scheme's format must be the one it is written in; requires_calibration_data
// demands calibration data.
TEST(QuantizePlan, SchemeFormatAndRequiresCalibrationData) {
  auto plan = [](const std::string& body) {
    return make_quantize_plan(parse_recipe_text("q_stage:\n  q_modifiers:\n    QuantizationModifier:\n" + body, "r.yaml"),
                              fixture_model());
  };
  const std::string groups = "      ignore: [lm_head]\n      config_groups:\n        g:\n          targets: [Linear]\n"
                             "          weights: {num_bits: 4, group_size: 128}\n";
  EXPECT_EQ(plan(groups + "          format: pack-quantized\n").linears.size(), 28u);
  EXPECT_QF_ERROR(plan(groups + "          format: marlin-24\n"), ErrorKind::Unsupported,
                  "r.yaml:9:19: format 'marlin-24': this group is written as 'pack-quantized' (the format "
                  "compressed-tensors infers for int4 sym g128 weight-only); another format is not supported");
  EXPECT_FALSE(plan("      scheme: W4A16\n").needs_calibration);
  const QuantizePlan p = plan("      scheme: W4A16\n      requires_calibration_data: true\n");
  EXPECT_TRUE(p.needs_calibration);
  EXPECT_EQ(p.calibration_reason, "QuantizationModifier.requires_calibration_data");
}

}  // namespace
}  // namespace qf
