#include "runtime/cpu/bf16_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "simd_level_fixture.h"

namespace qf::rt {
namespace {

std::vector<uint16_t> bf16_rows(int64_t n, int64_t k, int64_t kp, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, scale);
  std::vector<float> f(static_cast<size_t>(k));
  std::vector<uint16_t> out(static_cast<size_t>(n * kp));
  for (int64_t r = 0; r < n; ++r) {
    for (float& v : f) v = g(rng);
    to_bf16_row(f.data(), k, out.data() + r * kp, kp);
  }
  return out;
}

class Bf16GemmLevels : public test::SimdVsScalarFixture {};

// Every level (VDPBF16PS where the CPU has it, f32 FMAs otherwise) against
// the lane-by-lane reference, bit for bit: token and row counts around the
// register blocks, rows of one and several chunks with zero padding.
TEST_P(Bf16GemmLevels, EqualsTheReferenceBitForBit) {
  for (const int64_t k : {1, 31, 32, 33, 100, 256, 770}) {
    const int64_t kp = bf16_padded(k);
    for (const auto& [tokens, rows] : {std::pair<int64_t, int64_t>{1, 1}, {7, 5}, {6, 4}, {13, 9}}) {
      const std::vector<uint16_t> x = bf16_rows(tokens, k, kp, static_cast<uint32_t>(k + tokens), 1.0f);
      const std::vector<uint16_t> w = bf16_rows(rows, k, kp, static_cast<uint32_t>(k * 3 + rows), 0.05f);
      std::vector<float> want(static_cast<size_t>(tokens * (rows + 2)), -1.f), got = want;
      ref::gemm_tile_bf16(x.data(), tokens, w.data(), rows, kp, want.data(), rows + 2);
      gemm_tile_bf16(x.data(), tokens, w.data(), rows, kp, got.data(), rows + 2);
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
            << "k " << k << " " << tokens << "x" << rows << " at " << i << ": " << got[i] << " vs " << want[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Bf16, Bf16GemmLevels, test::all_simd_levels(), test::simd_case_name);

// The reference against the exact sum of the bf16 products: a chain of k
// additions is within about k * 2^-24 of the sum of their magnitudes.
TEST(Bf16Gemm, ReferenceIsWithinTheSummationBound) {
  const int64_t k = 1000, kp = bf16_padded(k);
  const std::vector<uint16_t> x = bf16_rows(3, k, kp, 1, 2.0f), w = bf16_rows(4, k, kp, 2, 0.1f);
  std::vector<float> y(12);
  ref::gemm_tile_bf16(x.data(), 3, w.data(), 4, kp, y.data(), 4);
  for (int t = 0; t < 3; ++t)
    for (int r = 0; r < 4; ++r) {
      double exact = 0, mag = 0;
      for (int64_t i = 0; i < kp; ++i) {
        const double p = static_cast<double>(hd::bf16_to_f32(x[static_cast<size_t>(t * kp + i)])) *
                         hd::bf16_to_f32(w[static_cast<size_t>(r * kp + i)]);
        exact += p, mag += std::fabs(p);
      }
      EXPECT_LE(std::fabs(y[static_cast<size_t>(t * 4 + r)] - exact), mag * (kp / 16 * 2 + 8) * std::ldexp(1.0, -24));
    }
}

TEST(Bf16Gemm, RoundingToBf16IsNearestEvenAndFlushesSubnormals) {
  const float in[] = {1.0f, 1.00390625f /* 1 + 2^-8: a tie, to even (1.0) */, 1.01171875f /* 1 + 3 2^-8: up */,
                      -2.5f, 1e-39f /* f32 subnormal */, -5e-39f /* a negative subnormal */, 3.0e38f};
  uint16_t out[32];
  to_bf16_row(in, 7, out, 32);
  EXPECT_EQ(out[0], 0x3F80);
  EXPECT_EQ(out[1], 0x3F80);
  EXPECT_EQ(out[2], 0x3F82);
  EXPECT_EQ(out[3], 0xC020);
  EXPECT_EQ(out[4], 0x0000);
  EXPECT_EQ(out[5], 0x8000);
  EXPECT_EQ(out[6], 0x7F62);
  for (int i = 7; i < 32; ++i) EXPECT_EQ(out[i], 0);
}

}  // namespace
}  // namespace qf::rt
