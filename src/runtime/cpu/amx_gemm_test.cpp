// The AMX tile GEMM (cpu/amx_gemm.h) against the decoders of
// quantizers/kquant_blocks.h and a double-precision product. Skipped, with a
// message, on a CPU without the AMX level.
#include "runtime/cpu/amx_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/hd.h"
#include "formats/gguf/gguf.h"
#include "quantizers/kquants.h"
#include "simd_level_fixture.h"

namespace qf::rt {
namespace {

namespace gt = ggml_type;

class AmxGemm : public ::testing::TestWithParam<uint32_t> {
 protected:
  void SetUp() override {
    if (best_simd_level() < SimdLevel::Amx)
      GTEST_SKIP() << "this CPU has no AMX level (best: " << simd_level_name(best_simd_level()) << ")";
  }
  test::ScopedSimdLevel level_{SimdLevel::Amx};
};

std::string type_name(const ::testing::TestParamInfo<uint32_t>& info) { return ggml_type_info(info.param)->name; }

// Rows of weights quantized to `type`; a few rows carry an outlier, one row
// is all zeros.
std::vector<uint8_t> quantized_rows(uint32_t type, int64_t rows, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(rows * k));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < k; ++i) w[static_cast<size_t>(r * k + i)] = r == 3 ? 0.0f : g(rng) * (1.0f + 0.1f * (r % 7));
  for (int64_t r = 0; r < rows; r += 5) w[static_cast<size_t>(r * k + (r * 37) % k)] = 9.0f;
  std::vector<uint8_t> q(kquants::row_size(type, k) * static_cast<size_t>(rows));
  kquants::quantize_rows(type, w.data(), q.data(), rows, k, nullptr);
  return q;
}

std::vector<float> activations(int64_t tokens, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(tokens * k));
  for (auto& v : x) v = g(rng);
  // Magnitudes far apart, so the bf16 split is exercised beyond unit values.
  for (int64_t t = 0; t < tokens; ++t) x[static_cast<size_t>(t * k + t % k)] = 3.0e4f;
  for (int64_t t = 0; t < tokens; ++t) x[static_cast<size_t>(t * k + (t + 7) % k)] = 1.0e-5f;
  return x;
}

float code_value(const AmxWeightTile& tile, int64_t r, int64_t i, int64_t k, int sub) {
  const uint16_t bits = tile.codes[static_cast<size_t>((r / 16) * 16 * k + (i / sub) * 16 * sub + (r % 16) * sub + i % sub)];
  return hd::float_of(static_cast<uint32_t>(bits) << 16);
}

// Every decoded weight is scale * code - min of its sub-block, formed as the
// block decoder forms it (bit for bit), and every code is an integer that
// fits in 8 bits.
TEST_P(AmxGemm, TileDecodeGivesTheDequantizedWeights) {
  const uint32_t type = GetParam();
  const int sub = amx_sub_block(type);
  std::mt19937 rng(7);
  for (int64_t rows : {1, 12, 16, 37, 64}) {
    const int64_t k = 512;
    const std::vector<uint8_t> q = quantized_rows(type, rows, k, rng);
    const size_t row_bytes = kquants::row_size(type, k);
    AmxWeightTile tile;
    amx_decode_tile(type, q.data(), row_bytes, rows, k, tile);
    ASSERT_EQ(tile.rows, rows);
    std::vector<float> deq(static_cast<size_t>(k));
    int mismatches = 0;
    for (int64_t r = 0; r < rows; ++r) {
      kquants::dequantize_row(type, q.data() + static_cast<size_t>(r) * row_bytes, deq.data(), k);
      for (int64_t i = 0; i < k; ++i) {
        const float c = code_value(tile, r, i, k, sub);
        const float s = tile.scale[static_cast<size_t>((i / sub) * 64 + r)];
        const float m = tile.has_min ? tile.min[static_cast<size_t>((i / sub) * 64 + r)] : 0.0f;
        const float v = tile.has_min ? hd::mul_sub_unfused(s, c, m) : c * s;
        if (c != std::nearbyint(c) || std::fabs(c) > 128.0f || v != deq[static_cast<size_t>(i)]) {
          if (++mismatches <= 5)
            ADD_FAILURE() << "rows " << rows << " row " << r << " element " << i << ": code " << c << " scale " << s
                          << " min " << m << " gives " << v << ", dequantize_row " << deq[static_cast<size_t>(i)];
        }
      }
    }
    EXPECT_EQ(mismatches, 0) << "rows " << rows;
    // Padding rows hold zero codes, scales and mins.
    for (int64_t r = rows; r < (rows + 15) / 16 * 16; ++r)
      for (int64_t i = 0; i < k; i += 7) EXPECT_EQ(code_value(tile, r, i, k, sub), 0.0f);
  }
}

// y = sum_j scale_j * sum (hi + mid) code - min_j * sum a, against the same
// sum in double with the exact activations. The bound: each activation is
// carried to within 2^-16 of its magnitude by its two bf16 pieces (each
// rounding to 8 significant bits leaves at most 2^-8 of what it rounds), the tiles add 2 * sub exact products of a
// sub-block in f32 and the sub-block sums add sub floats (gamma(2 sub)), and
// the accumulator takes two fused multiply-adds per sub-block
// (gamma(2 subs)); all relative to B = sum_j |scale_j| sum |a code| +
// |min_j| sum |a|.
TEST_P(AmxGemm, MatchesTheDoublePrecisionProductWithinTheBound) {
  const uint32_t type = GetParam();
  const int sub = amx_sub_block(type);
  std::mt19937 rng(11);
  const double u = std::ldexp(1.0, -24);
  auto gamma = [&](double n) { return n * u / (1 - n * u); };
  for (int64_t k : {256, 768}) {
    const int64_t subs = k / sub;
    const double rel = std::ldexp(1.0, -16) + gamma(2.0 * sub + 1) + gamma(2.0 * subs + 1);
    for (int64_t rows : {5, 24, 64}) {
      const std::vector<uint8_t> q = quantized_rows(type, rows, k, rng);
      const size_t row_bytes = kquants::row_size(type, k);
      AmxWeightTile tile;
      amx_decode_tile(type, q.data(), row_bytes, rows, k, tile);
      for (int64_t tokens : {1, 16, 21, 40}) {
        const std::vector<float> x = activations(tokens, k, rng);
        AmxActivations act;
        amx_activations_reserve(act, tokens, k, sub, amx_has_min(type));
        amx_prepare_activations(x.data(), k, act, 0, act.blocks);
        const int64_t y_stride = rows + 3;
        std::vector<float> y(static_cast<size_t>(tokens * y_stride), -7.0f);
        amx_gemm_tile(act, tile, y.data(), y_stride);
        int failures = 0;
        for (int64_t t = 0; t < tokens; ++t) {
          for (int64_t r = 0; r < rows; ++r) {
            double exact = 0, bound = 0;
            for (int64_t j = 0; j < subs; ++j) {
              const double s = tile.scale[static_cast<size_t>(j * 64 + r)];
              const double m = tile.has_min ? tile.min[static_cast<size_t>(j * 64 + r)] : 0.0;
              double dot = 0, abs_dot = 0, sum = 0, abs_sum = 0;
              for (int64_t i = j * sub; i < (j + 1) * sub; ++i) {
                const double a = x[static_cast<size_t>(t * k + i)], c = code_value(tile, r, i, k, sub);
                dot += a * c, abs_dot += std::fabs(a * c), sum += a, abs_sum += std::fabs(a);
              }
              exact += s * dot - m * sum;
              bound += std::fabs(s) * abs_dot + std::fabs(m) * abs_sum;
            }
            const double got = y[static_cast<size_t>(t * y_stride + r)];
            if (!(std::fabs(got - exact) <= rel * bound) && ++failures <= 5)
              ADD_FAILURE() << "k " << k << " rows " << rows << " tokens " << tokens << " (" << t << ", " << r
                            << "): " << got << " against " << exact << ", bound " << rel * bound;
          }
          // Nothing past the tile's rows is written.
          for (int64_t r = rows; r < y_stride; ++r) EXPECT_EQ(y[static_cast<size_t>(t * y_stride + r)], -7.0f);
        }
        EXPECT_EQ(failures, 0) << "k " << k << " rows " << rows << " tokens " << tokens;
      }
    }
  }
}

// A token's outputs are the same floats whatever batch it is in and
// wherever in the batch it sits.
TEST_P(AmxGemm, ATokensOutputsDoNotDependOnTheBatch) {
  const uint32_t type = GetParam();
  const int sub = amx_sub_block(type);
  std::mt19937 rng(3);
  const int64_t k = 512, rows = 40, tokens = 37;
  const std::vector<uint8_t> q = quantized_rows(type, rows, k, rng);
  AmxWeightTile tile;
  amx_decode_tile(type, q.data(), kquants::row_size(type, k), rows, k, tile);
  const std::vector<float> x = activations(tokens, k, rng);
  auto run = [&](const float* xs, int64_t n) {
    AmxActivations act;
    amx_activations_reserve(act, n, k, sub, amx_has_min(type));
    amx_prepare_activations(xs, k, act, 0, act.blocks);
    std::vector<float> y(static_cast<size_t>(n * rows));
    amx_gemm_tile(act, tile, y.data(), rows);
    return y;
  };
  const std::vector<float> all = run(x.data(), tokens);
  for (int64_t t : {0, 15, 16, 36}) {
    const std::vector<float> one = run(x.data() + t * k, 1);
    for (int64_t r = 0; r < rows; ++r)
      ASSERT_EQ(one[static_cast<size_t>(r)], all[static_cast<size_t>(t * rows + r)]) << "token " << t << " row " << r;
  }
}

TEST_P(AmxGemm, RefusesWhatItCannotMultiply) {
  const uint32_t type = GetParam();
  std::mt19937 rng(5);
  const std::vector<uint8_t> q = quantized_rows(type, 70, 256, rng);
  AmxWeightTile tile;
  EXPECT_THROW(amx_decode_tile(type, q.data(), kquants::row_size(type, 256), 65, 256, tile), Error);
  EXPECT_THROW(amx_decode_tile(type, q.data(), kquants::row_size(type, 256), 0, 256, tile), Error);
  EXPECT_THROW(amx_decode_tile(gt::Q3_K, q.data(), kquants::row_size(gt::Q3_K, 256), 4, 256, tile), Error);
  test::ScopedSimdLevel lower(SimdLevel::Avx512);
  EXPECT_THROW(amx_decode_tile(type, q.data(), kquants::row_size(type, 256), 4, 256, tile), Error);
}

INSTANTIATE_TEST_SUITE_P(Types, AmxGemm, ::testing::Values(gt::Q8_0, gt::Q4_K, gt::Q5_K, gt::Q6_K), type_name);

TEST(AmxGemmTypes, TheTableOfTheHeader) {
  for (uint32_t t : {gt::Q8_0, gt::Q4_K, gt::Q5_K, gt::Q6_K}) EXPECT_TRUE(amx_gemm_supports(t));
  for (uint32_t t : {gt::F32, gt::F16, gt::Q4_0, gt::Q4_1, gt::Q5_0, gt::Q5_1, gt::Q2_K, gt::Q3_K, gt::Q8_K})
    EXPECT_FALSE(amx_gemm_supports(t));
  EXPECT_EQ(amx_sub_block(gt::Q6_K), 16);
  EXPECT_EQ(amx_sub_block(gt::Q4_K), 32);
}

}  // namespace
}  // namespace qf::rt
