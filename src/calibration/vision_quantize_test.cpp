// The recipe's `vision:` section on the vision-language fixtures: which
// Linears it plans (with the per-channel fallback where the group size does
// not divide), what the output's config says, and that the runtime's vision
// side reads the quantized Linears back exactly as they were rounded.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "calibration/quantize_model.h"
#include "calibration/vision_plan.h"
#include "checkpoint/checkpoint_format.h"
#include "core/io.h"
#include "formats/hf/model_config.h"
#include "formats/hf/model_tensors.h"
#include "formats/image/image_file.h"
#include "formats/safetensors.h"
#include "quantized_fixture.h"
#include "runtime/vision/vision_model.h"
#include "test_util.h"

namespace qf {
namespace {

using namespace qf::test;

std::filesystem::path vlm(const std::string& name) { return source_dir() / "tests" / "data" / "vlm" / name; }
std::filesystem::path image() { return vlm("images") / "img3_two_shapes.png"; }

// Round to nearest W4A16 for the language model, `vision` appended.
std::string recipe_text(const std::string& vision, const std::string& format = "compressed-tensors") {
  return "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      targets: [Linear]\n      ignore: [lm_head]\n"
         "      scheme: W4A16\nexport:\n  format: " +
         format + "\n" + vision;
}

class VisionQuantize : public ::testing::Test {
 protected:
  static TempDir& dir() {
    static TempDir d;
    return d;
  }
  static std::filesystem::path write_recipe(const std::string& name, const std::string& text) {
    const auto p = dir().path() / (name + ".yaml");
    std::ofstream(p) << text;
    return p;
  }
  // The fixture `model` quantized with `vision` (cached per name).
  static std::filesystem::path run(const std::string& model, const std::string& name, const std::string& vision,
                                   std::vector<std::string>* log = nullptr) {
    const auto out = dir().path() / (model + "-" + name);
    if (!std::filesystem::exists(out)) {
      const auto r = write_recipe(model + "-" + name, recipe_text(vision));
      quantize_model(quantize_job(vlm(model).string(), r, out, {}), ThreadPool::global(),
                     [&](const std::string& line) {
                       if (log) log->push_back(line);
                     });
    }
    return out;
  }
  static rt::ImageEmbedding embed(const std::filesystem::path& model_dir) {
    const ModelConfig cfg = load_model_config(model_dir);
    Checkpoint ck = Checkpoint::open(model_dir);
    apply_hf_tensor_naming(cfg, ck);
    return rt::VisionModel::load(cfg, ck, model_dir).embed(read_image(image()));
  }
  // The vision side of `model` with every planned Linear's weight replaced
  // by its dequantized value in f32 (so nothing is rounded again).
  static std::filesystem::path dense_twin(const std::string& model, const std::vector<VisionLinear>& plan,
                                          const std::string& name) {
    const ModelConfig cfg = load_model_config(vlm(model));
    Checkpoint ck = Checkpoint::open(vlm(model));
    apply_hf_tensor_naming(cfg, ck);
    const auto twin = dir().path() / (model + "-dense-" + name);
    std::filesystem::create_directories(twin);
    SafetensorsWriter w(twin);
    std::set<std::string> replaced;
    for (const VisionLinear& v : plan) {
      const std::vector<float> wf = ck.tensor(v.module + ".weight").to_f32_vector();
      w.add(v.module + ".weight",
            Tensor::from_f32(round_to_nearest(wf.data(), v.rows, v.cols, v.plan).dequantize(), {v.rows, v.cols}));
      replaced.insert(v.module + ".weight");
    }
    for (const std::string& n : ck.names())
      if (is_vision_tensor(n) && !replaced.count(n)) w.add(n, ck.tensor(n));
    w.finish();
    std::filesystem::copy_file(vlm(model) / "config.json", twin / "config.json");
    std::filesystem::copy_file(vlm(model) / "preprocessor_config.json", twin / "preprocessor_config.json");
    return twin;
  }
  static std::vector<VisionLinear> plan_of(const std::string& model, const std::string& vision) {
    const ModelConfig cfg = load_model_config(vlm(model));
    Checkpoint ck = Checkpoint::open(vlm(model));
    apply_hf_tensor_naming(cfg, ck);
    return plan_vision_linears(parse_recipe_text(recipe_text(vision), "r.yaml"), cfg, ck, checkpoint_format("", ""),
                               [](const std::string&) {});
  }
  // ||a - b|| / ||b||
  static double relative_rms(const rt::ImageEmbedding& a, const rt::ImageEmbedding& b) {
    EXPECT_EQ(a.rows.size(), b.rows.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < a.rows.size() && i < b.rows.size(); ++i) {
      num += (a.rows[i] - b.rows[i]) * static_cast<double>(a.rows[i] - b.rows[i]);
      den += static_cast<double>(b.rows[i]) * b.rows[i];
    }
    return std::sqrt(num / den);
  }
};

TEST_F(VisionQuantize, PlanFallsBackPerChannelWhereTheGroupSizeDoesNotDivide) {
  const ModelConfig cfg = load_model_config(vlm("llava"));
  Checkpoint ck = Checkpoint::open(vlm("llava"));
  apply_hf_tensor_naming(cfg, ck);
  const Recipe r = parse_recipe_text(recipe_text("vision:\n  tower: w8a16\n  projector: W8A16\n"), "r.yaml");
  std::vector<std::string> log;
  const std::vector<VisionLinear> v = plan_vision_linears(r, cfg, ck, checkpoint_format("", ""), [&](const std::string& l) {
    log.push_back(l);
  });
  // 3 CLIP layers x (q, k, v, out, fc1, fc2) + the projector's two Linears.
  ASSERT_EQ(v.size(), 20u);
  int channel = 0, group = 0;
  for (const VisionLinear& l : v) {
    EXPECT_TRUE(l.plan.weights.is_int() && l.plan.weights.bits == 8 && !l.plan.act) << l.module;
    if (l.cols % 128 == 0) {
      EXPECT_EQ(l.plan.weights.strategy, QuantStrategy::Group) << l.module;
      EXPECT_TRUE(l.note.empty()) << l.module;
      ++group;
    } else {
      EXPECT_EQ(l.plan.weights.strategy, QuantStrategy::Channel) << l.module;
      EXPECT_NE(l.note.find("not a multiple of the group size 128"), std::string::npos) << l.note;
      ++channel;
    }
  }
  EXPECT_EQ(group, 4);     // fc2 (256 columns) x 3, linear_2
  EXPECT_EQ(channel, 16);  // everything reading the 64-wide stream
  // One line per part and column count.
  ASSERT_EQ(log.size(), 2u);
  EXPECT_NE(log[0].find("vision projector: 1 Linear with 64 input columns (multi_modal_projector.linear_1)"),
            std::string::npos)
      << log[0];
  EXPECT_NE(log[1].find("vision tower: 15 Linears with 64 input columns"), std::string::npos) << log[1];

  // Only the tower: the projector is not planned.
  const Recipe tower_only = parse_recipe_text(recipe_text("vision:\n  tower: FP8_DYNAMIC\n  projector: keep\n"), "r.yaml");
  const auto t = plan_vision_linears(tower_only, cfg, ck, checkpoint_format("", ""), [](const std::string&) {});
  EXPECT_EQ(t.size(), 18u);
  for (const VisionLinear& l : t) EXPECT_EQ(l.part, "tower") << l.module;
}

TEST_F(VisionQuantize, RefusesTextModelsAndFormatsWithoutPerModuleSchemes) {
  const std::string v = "vision:\n  tower: W8A16\n";
  {
    const ModelConfig cfg = load_model_config(fixture_model());
    Checkpoint ck = Checkpoint::open(fixture_model());
    const Recipe r = parse_recipe_text(recipe_text(v), "r.yaml");
    EXPECT_QF_ERROR(plan_vision_linears(r, cfg, ck, checkpoint_format("", ""), [](const std::string&) {}),
                    ErrorKind::InvalidInput, "r.yaml:9:1: vision: model_type 'llama' has no vision tower");
  }
  const ModelConfig cfg = load_model_config(vlm("qwen2-vl"));
  Checkpoint ck = Checkpoint::open(vlm("qwen2-vl"));
  apply_hf_tensor_naming(cfg, ck);
  const Recipe r = parse_recipe_text(recipe_text(v, "gptq"), "r.yaml");
  EXPECT_QF_ERROR(plan_vision_linears(r, cfg, ck, checkpoint_format("gptq", ""), [](const std::string&) {}),
                  ErrorKind::Unsupported, "export format 'gptq' holds one scheme");
  // And through quantize: nothing is written.
  const auto out = dir().path() / "refused";
  EXPECT_QF_ERROR(quantize_model(quantize_job(vlm("qwen2-vl").string(), write_recipe("gptqfmt", recipe_text(v, "gptq")),
                                              out, {}),
                                 ThreadPool::global(), [](const std::string&) {}),
                  ErrorKind::Unsupported, "vision:");
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST_F(VisionQuantize, RecipeSectionIsChecked) {
  const std::string base = recipe_text("");
  EXPECT_QF_ERROR(parse_recipe_text(base + "vision:\n  tower: W4A16\n", "r.yaml"), ErrorKind::Unsupported,
                  "r.yaml:10:10: vision.tower: 'W4A16' is not offered for the vision side (keep, W8A16 or FP8_DYNAMIC)");
  EXPECT_QF_ERROR(parse_recipe_text(base + "vision:\n  tower: FP8\n", "r.yaml"), ErrorKind::Unsupported,
                  "not offered for the vision side");
  EXPECT_QF_ERROR(parse_recipe_text(base + "vision:\n  tower: W9A16\n", "r.yaml"), ErrorKind::InvalidInput,
                  "vision.tower: unknown preset scheme");
  EXPECT_QF_ERROR(parse_recipe_text(base + "vision:\n  towers: W8A16\n", "r.yaml"), ErrorKind::InvalidInput, "towers");
  EXPECT_QF_ERROR(parse_recipe_text(base + "vision:\n  tower:\n", "r.yaml"), ErrorKind::InvalidInput,
                  "vision.tower: expected a value");
  const Recipe keep = parse_recipe_text(base + "vision:\n  tower: keep\n  projector: Fp8_Dynamic\n", "r.yaml");
  ASSERT_TRUE(keep.vision);
  EXPECT_FALSE(keep.vision->tower);
  ASSERT_TRUE(keep.vision->projector);
  EXPECT_TRUE(keep.vision->projector->weights.is_fp8());
  EXPECT_TRUE(keep.vision->projector->input_activations.has_value());
}

// W8A16 is weight-only: the quantized output's vision side must compute
// exactly what the same tower computes with each Linear's weight replaced by
// its dequantized value (written in f32, so nothing is rounded again).
class VisionQuantizeModels : public VisionQuantize, public ::testing::WithParamInterface<const char*> {};

TEST_P(VisionQuantizeModels, W8A16ReadsBackAsItsDequantizedWeights) {
  const std::string model = GetParam();
  std::vector<std::string> log;
  const auto out = run(model, "w8a16", "vision:\n  tower: W8A16\n  projector: W8A16\n", &log);

  // The config: vision Linears in their own exact-name groups, out of ignore.
  const nlohmann::json qc = nlohmann::json::parse(read_text_file(out / "config.json"))["quantization_config"];
  const std::string lm_head = model == "llava" ? "language_model.lm_head" : "lm_head";
  EXPECT_EQ(qc["ignore"], nlohmann::json::array({lm_head}));
  const std::vector<VisionLinear> plan = plan_of(model, "vision:\n  tower: W8A16\n  projector: W8A16\n");
  std::set<std::string> targets;
  for (const auto& [name, g] : qc["config_groups"].items())
    for (const auto& t : g["targets"])
      if (t != "Linear") targets.insert(t.get<std::string>());
  std::set<std::string> planned;
  for (const VisionLinear& v : plan) planned.insert(v.module);
  EXPECT_EQ(targets, planned);
  const nlohmann::json report = nlohmann::json::parse(read_text_file(out / "quantization_report.json"));
  ASSERT_TRUE(report["vision"].is_array());
  EXPECT_EQ(report["vision"].size(), plan.size());

  const auto twin = dense_twin(model, plan, "w8a16");
  const rt::ImageEmbedding q = embed(out), dense = embed(twin), f16 = embed(vlm(model));
  ASSERT_EQ(q.rows.size(), dense.rows.size());
  EXPECT_TRUE(q.rows == dense.rows) << "max |diff| " << relative_rms(q, dense);
  // And it is not the float tower: int8 moved the rows, by little.
  const double e = relative_rms(q, f16);
  std::printf("%s W8A16 vision: relative rms change of the image rows %.3g\n", model.c_str(), e);
  EXPECT_GT(e, 0.0);
  // Per channel or per 128 columns, int8 rounds each weight by at most half
  // a step, amax / 255: a relative weight error of at most ~1% (rms ~0.3%)
  // per Linear; through the tower's 3-4 Linear levels it compounds to a few
  // per cent at worst.
  EXPECT_LT(e, 0.05);
}

// FP8_DYNAMIC quantizes each Linear's input per token as well: the rows move
// more than with W8A16's weights alone, still within FP8's rounding.
TEST_P(VisionQuantizeModels, Fp8DynamicQuantizesWeightsAndInputs) {
  const std::string model = GetParam();
  const std::string vision = "vision:\n  tower: FP8_DYNAMIC\n  projector: FP8_DYNAMIC\n";
  const auto out = run(model, "fp8", vision);
  const rt::ImageEmbedding q = embed(out), f16 = embed(vlm(model));
  // The FP8 weights alone (no input quantizer) give other rows: the
  // inputs were quantized too.
  const rt::ImageEmbedding weights_only = embed(dense_twin(model, plan_of(model, vision), "fp8"));
  EXPECT_FALSE(q.rows == weights_only.rows);
  EXPECT_LT(relative_rms(q, weights_only), 0.15);
  const double e = relative_rms(q, f16);
  std::printf("%s FP8_DYNAMIC vision: relative rms change of the image rows %.3g\n", model.c_str(), e);
  EXPECT_GT(e, 0.0);
  // e4m3 keeps 3 mantissa bits: a value's rounding error is at most 2^-4
  // of it (rms about 2^-4 / sqrt(12) * 2 ~ 3.6% relative), on the weights
  // and again on the inputs of each Linear; summed over a few Linear levels
  // in quadrature that stays under ~15%.
  EXPECT_LT(e, 0.15);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, VisionQuantizeModels, ::testing::Values("llava", "qwen2-vl"),
                         [](const auto& i) { return std::string(i.param) == "llava" ? "Llava" : "Qwen2VL"; });

}  // namespace
}  // namespace qf
