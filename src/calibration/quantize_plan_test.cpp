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
    EXPECT_EQ(p.awq_group_size, -1);          // the quantizer's per-channel scheme
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

}  // namespace
}  // namespace qf
