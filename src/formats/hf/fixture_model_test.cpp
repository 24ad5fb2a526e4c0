// The bundled fixture model (tests/data/fixture-llama): its layout, shapes and report.
#include <cmath>

#include <gtest/gtest.h>

#include "core/io.h"
#include "inspect/hf_inspect.h"
#include "formats/hf/model_config.h"
#include "formats/safetensors.h"
#include "test_util.h"

namespace qf {
namespace {

std::filesystem::path fixture() { return test::source_dir() / "tests" / "data" / "fixture-llama"; }

TEST(FixtureModel, ConfigIsTheDocumentedLlama) {
  ModelConfig c = load_model_config(fixture());
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.intermediate_size, 768);
  EXPECT_EQ(c.num_attention_heads, 8);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.vocab_size, 4096);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_GE(c.num_hidden_layers, 4);
  EXPECT_LE(c.num_hidden_layers, 6);
}

// Every matrix takes groups of 128, NVFP4 blocks of 16 and k-quant super-blocks of 256
// along its input dimension (the axis all of them group). Output dimensions are
// multiples of 128: k/v_proj have 4 KV heads x 32 = 128 rows.
TEST(FixtureModel, EveryMatrixIsQuantizerFriendly) {
  Checkpoint ck = Checkpoint::open(fixture());
  ModelConfig c = load_model_config(fixture());
  int matrices = 0;
  for (const auto& name : ck.names()) {
    const TensorInfo& t = ck.info(name);
    EXPECT_EQ(t.dtype, DType::F16) << name;
    if (t.shape.size() != 2) continue;
    ++matrices;
    EXPECT_EQ(t.shape[0] % 128, 0) << name;
    EXPECT_EQ(t.shape[1] % 256, 0) << name;
  }
  // 7 per layer + embedding + untied lm_head
  EXPECT_EQ(matrices, 7 * c.num_hidden_layers + 2);
  EXPECT_TRUE(ck.contains("lm_head.weight"));
  // the weights are finite and not all zero
  auto w = ck.tensor("model.layers.0.mlp.down_proj.weight").to_f32_vector();
  double sq = 0;
  for (float v : w) {
    ASSERT_TRUE(std::isfinite(v));
    sq += double(v) * v;
  }
  EXPECT_GT(sq, 0.0);
}

TEST(FixtureModel, InspectFindsTokenizerAndNoQuantization) {
  auto info = inspect_model(fixture().string());
  std::vector<std::string> tok = info["tokenizer_files"];
  for (const char* f : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"})
    EXPECT_NE(std::find(tok.begin(), tok.end(), f), tok.end()) << f;
  EXPECT_TRUE(info["quantization_config"].is_null());
}

// The training report states the claims docs/fixtures.md makes; check they hold together.
TEST(FixtureModel, ReportShowsALearnedQuantizationSensitiveModel) {
  auto r = nlohmann::json::parse(read_text_file(fixture() / "training_report.json"));
  double ppl = r["eval"]["evaluation.txt"]["ppl"];
  double valid_ppl = r["eval"]["valid.txt"]["ppl"];
  double unigram = r["unigram_valid_ppl"];
  EXPECT_LT(valid_ppl * 4, unigram) << "far below a unigram model";
  double w3 = r["rtn_sensitivity"]["rtn_w3_g128_asym"]["evaluation_ppl"];
  double w4 = r["rtn_sensitivity"]["rtn_w4_g128_asym"]["evaluation_ppl"];
  EXPECT_GT(w3, ppl * 1.02) << "3-bit RTN must move perplexity measurably";
  EXPECT_GT(w3, w4);
  EXPECT_GE(w4, ppl * 0.999);
  Checkpoint ck = Checkpoint::open(fixture());
  int64_t params = 0;
  for (const auto& name : ck.names()) params += shape_numel(ck.info(name).shape);
  EXPECT_EQ(r["parameters"].get<int64_t>(), params) << "the report describes the bundled weights";
}

// A layer index beyond int64 (std::stoll threw std::out_of_range) is listed
// with the tensors outside the layers.
TEST(Inspect, HugeLayerIndexIsNotALayer) {
  test::TempDir d;
  std::filesystem::copy_file(fixture() / "config.json", d / "config.json");
  {
    SafetensorsWriter w(d.path(), "model");
    w.add("model.layers.99999999999999999999999.mlp.up_proj.weight", Tensor::from_f32({1, 2}, {2}));
    w.add("model.layers.1.mlp.up_proj.weight", Tensor::from_f32({1, 2}, {2}));
    w.finish();
  }
  const nlohmann::json info = inspect_model(d.path().string());
  ASSERT_EQ(info["layers"].size(), 1u);
  EXPECT_EQ(info["layers"][0]["index"], 1);
  ASSERT_EQ(info["other_tensors"].size(), 1u);
  EXPECT_EQ(info["other_tensors"][0]["name"], "model.layers.99999999999999999999999.mlp.up_proj.weight");
}

}  // namespace
}  // namespace qf
