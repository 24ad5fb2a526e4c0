// The whole vision-language model against the torch reference of the
// fixtures (reference_vision.safetensors' lm.* record): the image-and-text
// sequence this runtime lays out (tokens, Qwen2-VL's M-RoPE positions), the
// vision side's rows in place of the image tokens, and the language model's
// logits over the whole sequence. LLaVA-NeXT: llava's language model with
// the llava-next-vision fixture's vision side.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/thread_pool.h"
#include "formats/hf/model_tensors.h"
#include "formats/image/image_file.h"
#include "formats/safetensors.h"
#include "formats/tokenizer/tokenizer.h"
#include "runtime/model.h"
#include "runtime/vision/anyres.h"
#include "runtime/vision/multimodal_prompt.h"
#include "test_util.h"

namespace qf {
namespace {

std::vector<float> f32(const SafetensorsFile& f, const std::string& name) {
  const Tensor t = f.tensor(name);
  return std::vector<float>(t.data_as<float>(), t.data_as<float>() + t.numel());
}

// The logits of every position of the sequence, with an f16 KV cache.
std::vector<float> all_logits(const rt::Model& model, const rt::MultimodalSequence& s) {
  const int64_t n = static_cast<int64_t>(s.tokens.size());
  ThreadPool pool(2);
  rt::KvCache cache = model.make_cache(rt::KvDType::F16, n);
  rt::Batch b;
  rt::add_sequence(b, s.tokens, cache.add_sequence(), &s.inputs, 0, n);
  std::vector<float> logits;
  model.forward(b, cache, logits, pool);
  return logits;
}

void check_record(const std::string& fixture) {
  SCOPED_TRACE(fixture);
  const auto dir = test::source_dir() / "tests" / "data" / "vlm" / fixture;
  const SafetensorsFile ref = SafetensorsFile::open(dir / "reference_vision.safetensors");
  const auto model = rt::load_hf_model(dir);
  const auto tok = load_tokenizer(dir);
  const rt::ImageSequencer seq = rt::make_image_sequencer(*model, dir, tok->bos_id());
  const rt::MultimodalSequence s =
      seq(dir.parent_path() / ref.metadata().at("lm.image"), tok->encode(ref.metadata().at("lm.text"), false));

  // The layout: the reference's token ids and (Qwen2-VL) rotary positions, exactly.
  const std::vector<float> ids = f32(ref, "lm.input_ids");
  ASSERT_EQ(s.tokens.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(s.tokens[i], static_cast<int32_t>(ids[i])) << "token " << i;
  const size_t n = ids.size();
  if (ref.find("lm.position_ids")) {
    const std::vector<float> pos = f32(ref, "lm.position_ids");  // [3, n]
    ASSERT_EQ(s.inputs.rope_pos.size(), 3 * n);
    for (size_t i = 0; i < n; ++i)
      for (size_t k = 0; k < 3; ++k)
        EXPECT_EQ(s.inputs.rope_pos[3 * i + k], static_cast<int64_t>(pos[k * n + i])) << "token " << i << " section " << k;
  } else {
    EXPECT_TRUE(s.inputs.rope_pos.empty());
  }

  // The logits of every position.
  const std::vector<float> logits = all_logits(*model, s);
  const std::vector<float> want = f32(ref, "lm.logits");
  ASSERT_EQ(logits.size(), want.size());
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(logits[i] - want[i])));
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(want[i])));
  }
  // Bound: both sides compute in f32 from the same f16 weights, apart from
  // the cache, which holds K and V in f16 here and f32 in the reference.
  // Rounding K/V to f16 moves each by at most 2^-11 relatively; through the
  // softmax and the value sum of 4 layers that is a relative change of order
  // 4 * 2^-11 ~ 2e-3 of the logit scale at most, far above the f32
  // summation-order differences (~1e-6). A wrong position of one section or
  // a misplaced image row moves logits by percents (the fixture report's
  // sensitivity: 23% for sequential positions).
  EXPECT_LT(max_diff, 2e-3 * max_abs) << "max |logit| " << max_abs;
  std::cout << fixture << ": max |diff| " << max_diff << " of max |logit| " << max_abs << "\n";
}

TEST(MultimodalGolden, Qwen2VlImageTextRecord) { check_record("qwen2-vl"); }
TEST(MultimodalGolden, LlavaImageTextRecord) { check_record("llava"); }

// llava-next-vision holds the vision side only; with llava's language model
// (the same text_config) it is a whole LLaVA-NeXT model, which the
// reference's lm.* record was computed with: llava's caption after <s> and
// as many <image> tokens as LlavaNextProcessor expands the image into.
TEST(MultimodalGolden, LlavaNextImageTextRecord) {
  const auto vlm = test::source_dir() / "tests" / "data" / "vlm";
  const auto next = vlm / "llava-next-vision", llava = vlm / "llava";
  test::TempDir dir;
  for (const char* f : {"config.json", "preprocessor_config.json"}) std::filesystem::copy_file(next / f, dir / f);
  for (const char* f : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                        "generation_config.json"})
    std::filesystem::copy_file(llava / f, dir / f);
  {
    SafetensorsWriter w(dir.path());
    const Checkpoint lm = Checkpoint::open(llava), vision = Checkpoint::open(next);
    for (const std::string& n : lm.names())
      if (!is_vision_tensor(n)) w.add(n, lm.tensor(n));
    for (const std::string& n : vision.names()) w.add(n, vision.tensor(n));
    w.finish();
  }
  const SafetensorsFile ref = SafetensorsFile::open(next / "reference_vision.safetensors");
  const auto model = rt::load_hf_model(dir.path());
  const ModelConfig& cfg = model->config();
  std::vector<int32_t> text;
  for (float t : f32(ref, "lm.text_ids")) text.push_back(static_cast<int32_t>(t));
  const auto image = vlm / ref.metadata().at("lm.image");
  const rt::MultimodalSequence s = rt::make_image_sequencer(*model, dir.path(), 1)(image, text);

  const std::vector<float> ids = f32(ref, "lm.input_ids");
  ASSERT_EQ(s.tokens.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(s.tokens[i], static_cast<int32_t>(ids[i])) << "token " << i;
  const ImageU8 img = read_image(image);
  const rt::GridPinpoints pins = rt::parse_grid_pinpoints(cfg.raw["image_grid_pinpoints"], "config.json", "pinpoints");
  const int64_t rows = rt::llava_next_feature_count(img.height, img.width, pins, 56, 14);
  EXPECT_EQ(std::count(s.tokens.begin(), s.tokens.end(), static_cast<int32_t>(cfg.vlm->image_token_id)), rows);
  EXPECT_EQ(s.first_text, 1 + rows);

  const size_t n = ids.size();
  const std::vector<float> logits = all_logits(*model, s);
  const std::vector<float> want = f32(ref, "lm.logits");  // the last positions only
  ASSERT_EQ(logits.size() % n, 0u);
  const size_t vocab = logits.size() / n;
  ASSERT_EQ(want.size() % vocab, 0u);
  const size_t tail = logits.size() - want.size();
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(logits[tail + i] - want[i])));
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(want[i])));
  }
  EXPECT_LT(max_diff, 2e-3 * max_abs) << "max |logit| " << max_abs;  // check_record's bound
  std::cout << "llava-next: " << rows << " image rows, last " << want.size() / vocab << " positions: max |diff| "
            << max_diff << " of max |logit| " << max_abs << "\n";
}

}  // namespace
}  // namespace qf
