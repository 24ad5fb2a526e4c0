#include "quantizers/hessian_update.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "simd_level_fixture.h"

namespace qf {
namespace {

// Activations as the accumulator sees them: f32 values widened to double.
std::vector<double> activations(int64_t m, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<double> x(static_cast<size_t>(m * n));
  for (double& v : x) v = static_cast<double>(g(rng) * (1.0f + 4.0f * static_cast<float>(rng() % 3)));
  return x;
}

std::vector<double> symmetric_start(int64_t n, uint32_t seed) {
  const std::vector<double> a = activations(3, n, seed);
  std::vector<double> h(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) h[static_cast<size_t>(i * n + j)] = a[static_cast<size_t>(i)] * a[static_cast<size_t>(j)];
  return h;
}

class HessianUpdateLevels : public test::SimdVsScalarFixture {};

// Every kernel against the scalar loop, bit for bit: shapes with every tail
// (columns not a multiple of 16, 8 or 4; row ranges not a multiple of 4),
// ranges that start inside the matrix, one row of activations.
TEST_P(HessianUpdateLevels, EqualsTheScalarReferenceBitForBit) {
  for (const int64_t n : {1, 3, 4, 5, 8, 13, 16, 17, 31, 40, 67}) {
    for (const int64_t m : {1, 7, 64}) {
      const std::vector<double> X = activations(m, n, static_cast<uint32_t>(n * 100 + m));
      for (const auto& [i0, i1] : {std::pair<int64_t, int64_t>{0, n}, {n / 3, n}, {0, (n + 1) / 2}, {n / 2, n / 2 + 1}}) {
        if (i1 > n || i0 >= i1) continue;
        std::vector<double> want = symmetric_start(n, static_cast<uint32_t>(n)), got = want;
        hessian_update_rows_ref(want.data(), X.data(), m, n, 0.75, 2.0 / 96.0, i0, i1);
        hessian_update_rows(got.data(), X.data(), m, n, 0.75, 2.0 / 96.0, i0, i1, GetParam());
        // The upper triangle of rows [i0, i1) is the result; other rows untouched.
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < n; ++j) {
            if (i >= i0 && i < i1 && j < i) continue;  // left of the diagonal: unspecified until mirror_upper
            ASSERT_EQ(std::memcmp(&got[static_cast<size_t>(i * n + j)], &want[static_cast<size_t>(i * n + j)], sizeof(double)), 0)
                << "n " << n << " m " << m << " rows " << i0 << ".." << i1 << " at [" << i << ", " << j << "]: "
                << got[static_cast<size_t>(i * n + j)] << " vs " << want[static_cast<size_t>(i * n + j)];
          }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Hessian, HessianUpdateLevels, test::all_simd_levels(), test::simd_case_name);

// The reference itself against long double: each product of two f32 values
// is exact in double, so the only error is the m additions' rounding, at
// most m * 2^-53 of the sum of the products' magnitudes (plus the final
// scale and add), and the mirror makes H exactly symmetric.
TEST(HessianUpdate, ReferenceIsWithinTheSummationBoundAndSymmetric) {
  const int64_t n = 37, m = 300;
  const std::vector<double> X = activations(m, n, 9);
  std::vector<double> h(static_cast<size_t>(n * n), 0.0);
  hessian_update_rows(h.data(), X.data(), m, n, 0.0, 2.0 / m, 0, n, simd_level());
  mirror_upper(h.data(), n);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      long double exact = 0, magnitude = 0;
      for (int64_t r = 0; r < m; ++r) {
        const long double p = static_cast<long double>(X[static_cast<size_t>(r * n + i)]) * X[static_cast<size_t>(r * n + j)];
        exact += p;
        magnitude += std::fabs(p);
      }
      exact *= 2.0L / m;
      magnitude *= 2.0L / m;
      const long double bound = (static_cast<long double>(m) + 2) * std::ldexp(1.0L, -53) * magnitude;
      EXPECT_LE(std::fabs(static_cast<long double>(h[static_cast<size_t>(i * n + j)]) - exact), bound) << i << ", " << j;
      EXPECT_EQ(h[static_cast<size_t>(i * n + j)], h[static_cast<size_t>(j * n + i)]);
    }
}

}  // namespace
}  // namespace qf
