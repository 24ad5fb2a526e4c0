// Mixed precision for compressed-tensors: the stored bytes are those the
// export writes, fused sets take one scheme, every Linear is matched by
// exactly one group, the allocation is the optimum of its costs (brute
// force), and the recipe section is validated.
#include "calibration/mixed_precision.h"

#include <gtest/gtest.h>

#include "calibration/calibration_data.h"
#include "calibration/quantize_plan.h"
#include "checkpoint/compressed_tensors.h"
#include "formats/safetensors.h"
#include "formats/tokenizer/tokenizer.h"
#include "test_util.h"

namespace qf {
namespace {

using namespace qf::test;

const rt::Model& fixture_model() {
  static auto m = rt::load_hf_model(source_dir() / "tests" / "data" / "fixture-llama");
  return *m;
}

const std::vector<std::vector<int32_t>>& fixture_windows() {
  static const std::vector<std::vector<int32_t>> w = [] {
    const auto tok = load_tokenizer(source_dir() / "tests" / "data" / "fixture-llama");
    CalibrationOptions co;
    co.num_samples = 2;
    co.seq_len = 64;
    return load_calibration(source_dir() / "tests" / "data" / "text" / "calibration.txt", *tok, co);
  }();
  return w;
}

Recipe mixed_recipe(const std::string& mixed, const std::string& modifier = "QuantizationModifier: {targets: [Linear], ignore: [lm_head]}") {
  return parse_recipe_text("quant_stage:\n  quant_modifiers:\n    " + modifier + "\nmixed_precision: " + mixed + "\n", "r.yaml");
}

const ModifierSpec& quantizer_of(const Recipe& r) {
  for (const ModifierSpec& m : r.modifiers)
    if (!m.is_transform()) return m;
  throw Error(ErrorKind::Internal, "no quantizer");
}

TEST(MixedPrecision, StoredBytesAreWhatTheExportWrites) {
  const int64_t rows = 48, cols = 256;
  const std::vector<float> w = randn(static_cast<size_t>(rows * cols), 7, 0.05f);
  for (const char* name : {"W4A16", "W4A16_ASYM", "W8A16", "W3A16", "W8A8", "W4AFP8", "FP8", "FP8_DYNAMIC", "NVFP4A16", "NVFP4"}) {
    SCOPED_TRACE(name);
    ModifierSpec::Group g = preset_group(name, {"Linear"}, "group_0", "r.yaml:1:1");
    if (!g.scale_dtype_set) g.weights.scale_dtype = DType::F16;
    PlannedLinear p;
    p.weights = g.weights;
    p.act = g.input_activations;
    const QuantizedTensor q = round_to_nearest(w.data(), rows, cols, p);
    std::optional<ActQuantParams> act;
    if (p.act) act = calibrate_activation(*p.act, -3.f, 2.f, "x");
    TempDir dir;
    {
      SafetensorsWriter writer(dir.path());
      add_compressed_tensors_linear(writer, "m", q, act ? &*act : nullptr);
      writer.finish();
    }
    const Checkpoint ck = Checkpoint::open(dir.path());
    uint64_t written = 0;
    for (const std::string& n : ck.names()) written += ck.info(n).nbytes();
    EXPECT_EQ(compressed_tensors_linear_bytes(g.weights, p.act ? &*p.act : nullptr, rows, cols), written);
  }
}

TEST(MixedPrecision, FusedSetsAndExactTargets) {
  const rt::Model& m = fixture_model();
  Recipe r = mixed_recipe("{target_bits: 6, schemes: [NVFP4A16, W8A16, UNQUANTIZED]}",
                          "QuantizationModifier: {targets: [Linear], ignore: [lm_head, model.layers.1.mlp.down_proj]}");
  const std::vector<MixedItem> items = mixed_items(m, quantizer_of(r));
  ASSERT_EQ(items.size(), 15u);  // 4 layers x {qkv, o, gate_up, down}, one down ignored
  EXPECT_EQ(items[0].name, "model.layers.0.self_attn.{q,k,v}_proj");
  EXPECT_EQ(items[0].modules.size(), 3u);
  EXPECT_EQ(items[2].name, "model.layers.0.mlp.{gate,up}_proj");
  EXPECT_EQ(mixed_item_target(items[0]), "re:^model\\.layers\\.0\\.self_attn\\.(q|k|v)_proj$");
  EXPECT_EQ(mixed_item_target(items[1]), "re:^model\\.layers\\.0\\.self_attn\\.o_proj$");
  for (const MixedItem& it : items)
    for (const std::string& mod : it.modules) EXPECT_NE(mod, "model.layers.1.mlp.down_proj");

  // Every choice: each Linear in exactly one group, with its item's scheme.
  const std::vector<std::string>& schemes = r.mixed_precision->schemes;
  for (int variant = 0; variant < 3; ++variant) {
    std::vector<int> choice(items.size());
    for (size_t i = 0; i < items.size(); ++i) choice[i] = static_cast<int>((i * 7 + static_cast<size_t>(variant)) % 3);
    ModifierSpec q = quantizer_of(r);
    q.groups = mixed_groups(items, schemes, r.mixed_precision->scheme_where, choice);
    EXPECT_NO_THROW(check_mixed_groups(m, q, items, schemes, choice));
    for (size_t i = 0; i < items.size(); ++i)
      for (const std::string& mod : items[i].modules) {
        const auto g = scheme_for(q, mod);
        EXPECT_EQ(g.has_value(), schemes[static_cast<size_t>(choice[i])] != "UNQUANTIZED") << mod;
      }
    EXPECT_FALSE(scheme_for(q, "model.layers.1.mlp.down_proj").has_value());
    // The plan takes the groups: the quantized Linears are exactly the chosen ones.
    Recipe rr = r;
    for (ModifierSpec& mm : rr.modifiers)
      if (!mm.is_transform()) mm.groups = q.groups;
    size_t quantized = 0;
    for (size_t i = 0; i < items.size(); ++i)
      if (schemes[static_cast<size_t>(choice[i])] != "UNQUANTIZED") quantized += items[i].modules.size();
    EXPECT_EQ(make_quantize_plan(rr, m).linears.size(), quantized);
  }
  // A group that also claims another item's module is caught.
  std::vector<int> choice(items.size(), 0);
  ModifierSpec q = quantizer_of(r);
  q.groups = mixed_groups(items, schemes, {}, choice);
  q.groups[0].targets.push_back("re:.*down_proj$");
  q.groups.push_back(preset_group("W8A16", {"re:.*down_proj$"}, "group_1", ""));
  EXPECT_QF_ERROR(check_mixed_groups(m, q, items, schemes, choice), ErrorKind::Internal, "down_proj");
}

TEST(MixedPrecision, AllExpertsOfALayerAreOneItem) {
  const auto m = rt::load_hf_model(source_dir() / "tests" / "data" / "fixture-mixtral");
  const Recipe r = mixed_recipe("{target_bits: 6, schemes: [W4A16, W8A16]}");
  const std::vector<MixedItem> items = mixed_items(*m, quantizer_of(r));
  ASSERT_EQ(items.size(), 9u);  // 3 layers x {qkv, o, experts}; routers are never quantized
  EXPECT_EQ(items[2].name, "model.layers.0.block_sparse_moe.experts");
  EXPECT_EQ(items[2].modules.size(), 24u);  // 8 experts x {w1, w3, w2}
  const std::vector<int> choice = {1, 0, 1, 0, 1, 0, 1, 0, 1};
  ModifierSpec q = quantizer_of(r);
  q.groups = mixed_groups(items, r.mixed_precision->schemes, {}, choice);
  EXPECT_NO_THROW(check_mixed_groups(*m, q, items, r.mixed_precision->schemes, choice));
  for (const std::string& mod : items[2].modules) EXPECT_EQ(scheme_for(q, mod)->weights.bits, 8) << mod;
  EXPECT_FALSE(scheme_for(q, "model.layers.0.block_sparse_moe.gate").has_value());
}

TEST(MixedPrecision, SearchMeetsTheBudgetAndIsOptimal) {
  const rt::Model& m = fixture_model();
  ThreadPool pool(2);
  const Recipe r = mixed_recipe("{target_bits: 6.0, schemes: [NVFP4A16, W8A16], probe_samples: 2}");
  const MixedPrecisionResult res = search_mixed_precision(m, quantizer_of(r), *r.mixed_precision, fixture_windows(), pool, {});
  ASSERT_EQ(res.items.size(), 16u);
  EXPECT_EQ(res.weights, 4u * (256 * 256 + 2 * 128 * 256 + 256 * 256 + 3 * 256 * 768));  // q, o 256x256; k, v 128x256
  EXPECT_EQ(res.budget, res.weights * 6 / 8);
  ASSERT_TRUE(res.exact.feasible);
  EXPECT_LE(res.exact.bytes, res.budget);
  // The bytes are the exporter's, summed over the chosen schemes.
  const auto bytes = mixed_item_bytes(m, res.items, res.schemes);
  uint64_t sum = 0;
  for (size_t i = 0; i < res.items.size(); ++i) sum += bytes[i][static_cast<size_t>(res.exact.choice[i])];
  EXPECT_EQ(sum, res.exact.bytes);
  // Both schemes are used at this budget, every item was probed, and the
  // probe scheme's cost is the measured KL.
  EXPECT_NE(std::count(res.exact.choice.begin(), res.exact.choice.end(), 0), 0);
  EXPECT_NE(std::count(res.exact.choice.begin(), res.exact.choice.end(), 1), 0);
  for (size_t i = 0; i < res.items.size(); ++i) {
    EXPECT_EQ(res.probe_scheme[i], 0);
    EXPECT_GT(res.probe_kl[i], 0);
    EXPECT_NEAR(res.options[i].options[0].cost, res.probe_kl[i], 1e-12 + 1e-9 * res.probe_kl[i]);
    EXPECT_LT(res.options[i].options[1].cost, res.options[i].options[0].cost);  // 8 bits predicted better than 4.5
  }
  // Brute force over the 2^16 choices: none that fits costs less.
  double best = 1e300;
  for (uint32_t mask = 0; mask < (1u << 16); ++mask) {
    uint64_t b = 0;
    double c = 0;
    for (size_t i = 0; i < 16; ++i) {
      const mixed::Option& o = res.options[i].options[(mask >> i) & 1];
      b += o.bytes, c += o.cost;
    }
    if (b <= res.budget) best = std::min(best, c);
  }
  EXPECT_NEAR(res.exact.cost, best, 1e-12 * best);
  EXPECT_GE(res.lagrangian.cost, res.exact.cost - 1e-12 * best);
  const nlohmann::ordered_json j = res.json(*r.mixed_precision);
  EXPECT_EQ(j["items"].size(), 16u);
  EXPECT_EQ(j["bytes"].get<uint64_t>(), res.exact.bytes);
  EXPECT_NE(res.table().find("predicted KL"), std::string::npos);
}

TEST(MixedPrecision, BudgetBelowTheSmallestScheme) {
  ThreadPool pool(2);
  const Recipe r = mixed_recipe("{target_bits: 4.0, schemes: [NVFP4A16, W8A16]}");
  EXPECT_QF_ERROR(search_mixed_precision(fixture_model(), quantizer_of(r), *r.mixed_precision, fixture_windows(), pool, {}),
                  ErrorKind::InvalidInput, "r.yaml:4:32: mixed_precision: the budget");
}

TEST(MixedPrecision, RecipeSection) {
  const Recipe r = mixed_recipe("{target_size: 1MiB, schemes: [nvfp4a16, W4A16, UNQUANTIZED], probe_items: 3}");
  ASSERT_TRUE(r.mixed_precision.has_value());
  EXPECT_EQ(r.mixed_precision->target_bytes, 1u << 20);
  EXPECT_EQ(r.mixed_precision->schemes, (std::vector<std::string>{"NVFP4A16", "W4A16", "UNQUANTIZED"}));
  EXPECT_EQ(r.mixed_precision->probe_items, 3);
  EXPECT_TRUE(quantizer_of(r).groups.empty());
  // A decimal size before a unit, rounded down to bytes; fractional bytes are not a size.
  EXPECT_EQ(mixed_recipe("{target_size: 4.2GiB, schemes: [W4A16]}").mixed_precision->target_bytes,
            static_cast<uint64_t>(4.2L * (1ull << 30)));
  EXPECT_EQ(mixed_recipe("{target_size: 1.5MB, schemes: [W4A16]}").mixed_precision->target_bytes, 1500000u);
  EXPECT_QF_ERROR(mixed_recipe("{target_size: 4.5, schemes: [W4A16]}"), ErrorKind::InvalidInput, "such as 4.2GiB");
  EXPECT_QF_ERROR(mixed_recipe("{target_size: 4.GiB, schemes: [W4A16]}"), ErrorKind::InvalidInput, "such as 4.2GiB");
  EXPECT_QF_ERROR(mixed_recipe("{target_size: 0.0GB, schemes: [W4A16]}"), ErrorKind::InvalidInput, "such as 4.2GiB");
  EXPECT_QF_ERROR(mixed_recipe("{target_bits: 5, schemes: [W4A16], probes: 3}"), ErrorKind::InvalidInput,
                  "r.yaml:4:53: mixed_precision: unknown key 'probes'");
  EXPECT_QF_ERROR(mixed_recipe("{target_bits: 5, schemes: [W4A61]}"), ErrorKind::InvalidInput,
                  "mixed_precision.schemes[0]: unknown preset scheme 'W4A61'");
  EXPECT_QF_ERROR(mixed_recipe("{target_bits: 5, schemes: [MXFP4]}"), ErrorKind::Unsupported, "not supported yet");
  EXPECT_QF_ERROR(mixed_recipe("{target_bits: 0, schemes: [W4A16]}"), ErrorKind::InvalidInput, "must be a number > 0");
  EXPECT_QF_ERROR(mixed_recipe("{schemes: [W4A16]}"), ErrorKind::InvalidInput, "exactly one of 'target_bits'");
  EXPECT_QF_ERROR(mixed_recipe("{target_bits: 5, target_size: 1GB, schemes: [W4A16]}"), ErrorKind::InvalidInput,
                  "exactly one of 'target_bits'");
  EXPECT_QF_ERROR(mixed_recipe("{target_bits: 5, schemes: [W4A16, w4a16]}"), ErrorKind::InvalidInput, "listed twice");
  EXPECT_QF_ERROR(mixed_recipe("{target_bits: 5, schemes: []}"), ErrorKind::InvalidInput, "non-empty list");
  EXPECT_QF_ERROR(mixed_recipe("{target_bits: 5, schemes: [W4A16]}", "QuantizationModifier: {scheme: W4A16}"),
                  ErrorKind::InvalidInput, "QuantizationModifier.scheme: the recipe has a mixed_precision section");
  EXPECT_QF_ERROR(mixed_recipe("{target_bits: 5, schemes: [NVFP4A16, W4A16]}", "GPTQModifier: {ignore: [lm_head]}"),
                  ErrorKind::Unsupported, "GPTQModifier quantizes integer weights");
  EXPECT_QF_ERROR(mixed_recipe("{target_bits: 5, schemes: [W4A16]}", "AWQModifier: {}"), ErrorKind::InvalidInput,
                  "mixed_precision needs a quantizer");
  // GPTQ with integer schemes, after AWQ: accepted.
  EXPECT_NO_THROW(mixed_recipe("{target_bits: 5, schemes: [W4A16, W8A16]}", "AWQModifier: {}\n    GPTQModifier: {ignore: [lm_head]}"));
}

}  // namespace
}  // namespace qf
