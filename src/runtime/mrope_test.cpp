// Multimodal RoPE and input rows: a vision-language model's language model
// on text is its text model, and image rows enter where the batch says.
#include <gtest/gtest.h>

#include "core/thread_pool.h"
#include "runtime/model.h"
#include "test_util.h"
#include "tiny_llama.h"

namespace qf {
namespace {

using nlohmann::json;

// A tiny Qwen2 written twice: as itself and as the language model of a
// qwen2_vl config (sections 2 + 3 + 3 of head_dim / 2 = 8).
struct TwoConfigs {
  test::TempDir text, vlm;
  TwoConfigs() {
    test::tiny::Spec s;
    s.model_type = "qwen2";
    s.head_dim = 16;
    test::tiny::write_model(s, text.path());
    json c = test::tiny::config_json(s);
    c["model_type"] = "qwen2_vl";
    c["architectures"] = {"Qwen2VLForConditionalGeneration"};
    c["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", {2, 3, 3}}};
    c["image_token_id"] = 60;
    c["vision_config"] = {{"depth", 1}, {"embed_dim", 16}};
    test::tiny::write_model(s, vlm.path(), {}, {}, c);
  }
};

const std::vector<int32_t> kTokens = {1, 7, 3, 60, 60, 60, 60, 9, 12, 5};

std::vector<float> run(const rt::Model& m, const rt::Batch& b) {
  ThreadPool pool(1);
  rt::KvCache cache = m.make_cache(rt::KvDType::F16, static_cast<int64_t>(b.size()));
  cache.add_sequence();
  std::vector<float> logits;
  m.forward(b, cache, logits, pool);
  return logits;
}

rt::Batch text_batch(bool multimodal) {
  rt::Batch b;
  for (size_t i = 0; i < kTokens.size(); ++i) {
    const int64_t p = static_cast<int64_t>(i), rope[3] = {p, p, p};
    if (multimodal) b.add(kTokens[i], 0, p, true, rope, -1);
    else b.add(kTokens[i], 0, p, true);
  }
  return b;
}

TEST(MultimodalRope, TextPositionsAreOrdinaryRope) {
  TwoConfigs t;
  const auto text = rt::load_hf_model(t.text.path());
  const auto vlm = rt::load_hf_model(t.vlm.path());
  ASSERT_TRUE(vlm->config().vlm);
  EXPECT_EQ(vlm->rope_sections(), (std::vector<uint8_t>{0, 0, 1, 1, 1, 2, 2, 2}));
  const std::vector<float> ref = run(*text, text_batch(false));
  // Equal positions in every section: the rotation of ordinary RoPE, bit for bit.
  EXPECT_EQ(run(*vlm, text_batch(true)), ref);
  EXPECT_EQ(run(*vlm, text_batch(false)), ref);
}

TEST(MultimodalRope, SectionsTurnByTheirOwnPositions) {
  TwoConfigs t;
  const auto vlm = rt::load_hf_model(t.vlm.path());
  const std::vector<float> ref = run(*vlm, text_batch(false));
  // A 2 x 2 image at tokens 3..6: temporal position 3 for all, height and
  // width 3 + (row, column); text after it resumes at 3 + 2 = 5.
  for (int section = 0; section < 3; ++section) {
    rt::Batch b = text_batch(true);
    b.rope_pos[static_cast<size_t>(3 * 8 + section)] += 1;  // one section of token 8 moved
    const std::vector<float> got = run(*vlm, b);
    ASSERT_EQ(got.size(), ref.size());
    // Tokens before 8 are unchanged; token 8's row changes.
    const size_t v = ref.size() / kTokens.size();
    EXPECT_TRUE(std::equal(ref.begin(), ref.begin() + 8 * v, got.begin())) << "section " << section;
    EXPECT_FALSE(std::equal(ref.begin() + 8 * v, ref.begin() + 9 * v, got.begin() + 8 * v)) << "section " << section;
  }
}

TEST(MultimodalRope, InputRowsReplaceTokenEmbeddings) {
  TwoConfigs t;
  const auto vlm = rt::load_hf_model(t.vlm.path());
  const int64_t h = vlm->config().hidden_size;
  const std::vector<float> ref = run(*vlm, text_batch(false));
  // Rows that are the image token's own embedding: the same logits.
  auto rows = std::make_shared<std::vector<float>>(static_cast<size_t>(4 * h));
  for (int r = 0; r < 4; ++r) vlm->weights().embed->decode_row(60, rows->data() + r * h);
  rt::Batch b = text_batch(true);
  b.embeds = rows;
  for (int r = 0; r < 4; ++r) b.embed_row[static_cast<size_t>(3 + r)] = r;
  EXPECT_EQ(run(*vlm, b), ref);
  // Other rows: the image tokens' logits and those after them change, not those before.
  for (float& x : *rows) x *= 0.5f;
  const std::vector<float> got = run(*vlm, b);
  const size_t v = ref.size() / kTokens.size();
  EXPECT_TRUE(std::equal(ref.begin(), ref.begin() + 3 * v, got.begin()));
  EXPECT_FALSE(std::equal(ref.begin() + 3 * v, ref.end(), got.begin() + 3 * v));
  // A row beyond those given is an error, not a read past the end.
  b.embed_row[3] = 4;
  EXPECT_QF_ERROR(run(*vlm, b), ErrorKind::InvalidInput, "input row 4 beyond the 4 rows given");
}

}  // namespace
}  // namespace qf
