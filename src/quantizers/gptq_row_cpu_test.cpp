#include "quantizers/gptq_row_cpu.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "quantizers/gptq.h"
#include "quantizers/gptq_row.h"
#include "simd_level_fixture.h"

namespace qf {
namespace {

class GptqRowUpdateLevels : public test::SimdVsScalarFixture {};

// The vector update against the shared scalar loop of gptq_row.h, bit for
// bit, for lengths with every tail of 8 and 4.
TEST_P(GptqRowUpdateLevels, EqualsTheSharedScalarLoopBitForBit) {
  std::mt19937 rng(3);
  std::normal_distribution<double> g(0.0, 1.0);
  for (int64_t n = 0; n < 40; ++n) {
    std::vector<double> u(static_cast<size_t>(n)), w(static_cast<size_t>(n));
    for (double& v : u) v = g(rng);
    for (double& v : w) v = g(rng) * 3;
    const double c = g(rng);
    std::vector<double> want = w, got = w;
    hd::GptqRowUpdate{}(want.data(), 1, u.data(), c, n);
    gptq_row_update(got.data(), u.data(), c, n, GetParam());
    for (int64_t j = 0; j < n; ++j)
      ASSERT_EQ(std::memcmp(&got[static_cast<size_t>(j)], &want[static_cast<size_t>(j)], sizeof(double)), 0) << n << " " << j;
  }
}

// GPTQ as a whole at every level against the scalar level, bit for bit:
// rows taken 8 (4) at a time by the vector block, the factor and the lazy
// updates on the level's GEMM tiles, for every act-order mode, the group,
// channel and tensor strategies, symmetric and not, and a row count that
// leaves a partial group of rows.
TEST_P(GptqRowUpdateLevels, GptqEqualsTheScalarLevelBitForBit) {
  const int64_t rows = 45, cols = 192, n = 300;
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(rows * cols)), x(static_cast<size_t>(n * cols));
  for (float& v : w) v = g(rng) * 0.05f;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < cols; ++c) x[static_cast<size_t>(t * cols + c)] = g(rng) * (1.0f + static_cast<float>(c % 7));
  HessianAccumulator h(cols);
  h.add(x.data(), n, cols);
  h.finish();
  const QuantScheme schemes[] = {QuantScheme::make(4, true, QuantStrategy::Group, 64),
                                 QuantScheme::make(3, false, QuantStrategy::Group, 32),
                                 QuantScheme::make(8, true, QuantStrategy::Channel, 0),
                                 QuantScheme::make(4, false, QuantStrategy::Tensor, 0)};
  using AO = GptqOptions::ActOrder;
  for (const QuantScheme& s : schemes)
    for (AO ao : {AO::None, AO::Static, AO::Group, AO::Weight}) {
      GptqOptions o;
      o.actorder = ao;
      o.block_size = 48;
      GptqResult want;
      {
        test::ScopedSimdLevel scalar(SimdLevel::Scalar);
        want = gptq_quantize(w.data(), rows, cols, h, s, o, "w");
      }
      const GptqResult got = gptq_quantize(w.data(), rows, cols, h, s, o, "w");
      const std::string what = s.describe() + " " + actorder_name(ao);
      ASSERT_EQ(got.q.q, want.q.q) << what;
      ASSERT_EQ(got.q.scales, want.q.scales) << what;
      ASSERT_EQ(got.q.zeros, want.q.zeros) << what;
      ASSERT_EQ(got.q.g_idx, want.q.g_idx) << what;
      ASSERT_EQ(std::memcmp(&got.loss, &want.loss, sizeof(double)), 0) << what << ": " << got.loss << " vs " << want.loss;
    }
}

INSTANTIATE_TEST_SUITE_P(Gptq, GptqRowUpdateLevels, test::all_simd_levels(), test::simd_case_name);

}  // namespace
}  // namespace qf
