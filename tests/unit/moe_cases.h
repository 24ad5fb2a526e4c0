// What the mixture-of-experts tests share: the checkpoints they run over and
// the random token samples they calibrate on.
#pragma once

#include <cctype>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace qf::test {

// The three small random checkpoints and the trained fixture, under tests/data.
inline const auto kMoeCheckpoints =
    ::testing::Values("moe-tiny/mixtral", "moe-tiny/qwen2_moe", "moe-tiny/qwen3_moe", "fixture-mixtral");

// A gtest parameter name for a checkpoint path ("moe-tiny/mixtral" -> "moe_tiny_mixtral").
inline std::string checkpoint_param_name(const ::testing::TestParamInfo<const char*>& info) {
  std::string s = info.param;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

// n seeded sequences of len token ids from 3 to vocab - 1 (no special tokens).
inline std::vector<std::vector<int32_t>> random_samples(int64_t vocab, int n, int len, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(vocab - 1));
  std::vector<std::vector<int32_t>> s(static_cast<size_t>(n));
  for (auto& v : s)
    for (int i = 0; i < len; ++i) v.push_back(tok(gen));
  return s;
}

}  // namespace qf::test
