#include "formats/llama2c/llama2c_model.h"

#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <vector>

#include "formats/safetensors.h"
#include "test_util.h"

namespace qf {
namespace {

using namespace qf::test;

std::filesystem::path stories() { return shared_dir() / "models" / "stories260K"; }

// A valid tiny llama2.c checkpoint: dim 8, hidden 12, 1 layer, 2 heads, 1 KV
// head, vocab V (shared classifier), seq_len 4; float i at flat index i.
std::string tiny_checkpoint(int32_t vocab = 300, bool truncate = false) {
  const int32_t h[7] = {8, 12, 1, 2, 1, vocab, 4};
  const int64_t floats = vocab * 8 + (8 + 64 + 2 * 4 * 8 + 64) + (8 + 3 * 12 * 8) + 8 + 4 * 4;
  std::string s(reinterpret_cast<const char*>(h), sizeof h);
  for (int64_t i = 0; i < floats; ++i) {
    float f = static_cast<float>(i);
    s.append(reinterpret_cast<const char*>(&f), 4);
  }
  if (truncate) s.resize(s.size() - 4);
  return s;
}

TEST(Llama2c, HeaderIsValidatedAgainstTheFileSize) {
  TempDir t;
  write_file(t.path() / "ok.bin", tiny_checkpoint());
  const Llama2cHeader h = read_llama2c_header(t.path() / "ok.bin");
  EXPECT_EQ(h.dim, 8);
  EXPECT_EQ(h.n_kv_heads, 1);
  EXPECT_TRUE(h.shared_classifier);
  write_file(t.path() / "short.bin", tiny_checkpoint(300, true));
  EXPECT_QF_ERROR(read_llama2c_header(t.path() / "short.bin"), ErrorKind::InvalidInput, "but the header implies");
  std::string bad = tiny_checkpoint();
  const int32_t heads = 3;  // 8 is not a multiple of 3
  std::memcpy(&bad[12], &heads, 4);
  write_file(t.path() / "heads.bin", bad);
  EXPECT_QF_ERROR(read_llama2c_header(t.path() / "heads.bin"), ErrorKind::InvalidInput, "n_heads x an even head size");
  write_file(t.path() / "tiny.bin", "abc");
  EXPECT_QF_ERROR(read_llama2c_header(t.path() / "tiny.bin"), ErrorKind::InvalidInput, "too short");
  // Found by fuzz_llama2c: a vocabulary of INT32_MIN was negated (undefined behaviour) before the range check.
  std::string min_vocab = tiny_checkpoint();
  const int32_t vmin = INT32_MIN;
  std::memcpy(&min_vocab[20], &vmin, 4);
  write_file(t.path() / "vmin.bin", min_vocab);
  EXPECT_QF_ERROR(read_llama2c_header(t.path() / "vmin.bin"), ErrorKind::InvalidInput,
                  "header values must be non-zero and below 2^20 (header: dim 8, hidden_dim 12, n_layers 1, n_heads 2, "
                  "n_kv_heads 1, vocab -2147483648");
}

TEST(Llama2c, QueryAndKeyRowsArePermutedToRotateHalf) {
  if (!std::filesystem::exists(stories() / "tok512.bin")) GTEST_SKIP() << "../shared/models/stories260K is absent";
  TempDir t;
  // vocab 512 so that tok512.bin fits; wq of layer 0 starts after the
  // embedding (512 x 8) and rms_att (8).
  write_file(t.path() / "m.bin", tiny_checkpoint(512));
  convert_llama2c_to_hf(t.path() / "m.bin", stories() / "tok512.bin", t.path() / "hf");
  Checkpoint ck = Checkpoint::open(t.path() / "hf");
  const auto q = ck.tensor("model.layers.0.self_attn.q_proj.weight").to_f32_vector();
  const float wq0 = 512 * 8 + 8;
  // head_dim 4: HF rows (0, 1, 2, 3) of a head take llama2.c rows (0, 2, 1, 3).
  const int src_row[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  for (int r = 0; r < 8; ++r) EXPECT_EQ(q[static_cast<size_t>(r * 8)], wq0 + static_cast<float>(src_row[r] * 8)) << r;
  const auto v = ck.tensor("model.layers.0.self_attn.v_proj.weight").to_f32_vector();
  EXPECT_EQ(v[1 * 8], wq0 + 64 + 32 + 8);  // v is copied as is: row 1 of wv
  EXPECT_FALSE(ck.contains("lm_head.weight"));
  EXPECT_TRUE(std::filesystem::exists(t.path() / "hf" / "tokenizer.json"));
}

TEST(Llama2c, FailedConversionLeavesNoOutput) {
  if (!std::filesystem::exists(stories() / "tok512.bin")) GTEST_SKIP() << "../shared/models/stories260K is absent";
  TempDir t;
  write_file(t.path() / "m.bin", tiny_checkpoint(300));
  EXPECT_QF_ERROR(convert_llama2c_to_hf(t.path() / "m.bin", stories() / "tok512.bin", t.path() / "hf"),
                  ErrorKind::InvalidInput, "has 512 tokens but");
  EXPECT_FALSE(std::filesystem::exists(t.path() / "hf"));
  size_t entries = 0;
  for (auto& e : std::filesystem::directory_iterator(t.path())) entries += e.path().filename() != "m.bin";
  EXPECT_EQ(entries, 0u);  // no temporary folder left behind
  write_file(t.path() / "m512.bin", tiny_checkpoint(512));
  std::filesystem::create_directories(t.path() / "taken");
  write_file(t.path() / "taken" / "x", "x");
  EXPECT_QF_ERROR(convert_llama2c_to_hf(t.path() / "m512.bin", stories() / "tok512.bin", t.path() / "taken"),
                  ErrorKind::Io, "already exists");
}

}  // namespace
}  // namespace qf
