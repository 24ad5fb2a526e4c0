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

class GptqRowsLevels : public test::SimdVsScalarFixture {};

// GPTQ as a whole at every level against the scalar level, bit for bit:
// rows taken 8 (4) at a time by the vector block, the factor and the lazy
// updates on the level's GEMM tiles, for every act-order mode, the group,
// channel and tensor strategies, symmetric and not, and a row count that
// leaves a partial group of rows.
TEST_P(GptqRowsLevels, GptqEqualsTheScalarLevelBitForBit) {
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

INSTANTIATE_TEST_SUITE_P(Gptq, GptqRowsLevels, test::all_simd_levels(), test::simd_case_name);

}  // namespace
}  // namespace qf
