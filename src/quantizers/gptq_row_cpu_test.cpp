#include "quantizers/gptq_row_cpu.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

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

INSTANTIATE_TEST_SUITE_P(Gptq, GptqRowUpdateLevels, test::all_simd_levels(), test::simd_case_name);

}  // namespace
}  // namespace qf
