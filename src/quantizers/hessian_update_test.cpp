#include "quantizers/hessian_update.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "simd_level_fixture.h"

namespace qf {
namespace {

// Activations of mixed scales, as the runtime hands them to the accumulator.
std::vector<float> activations(int64_t m, int64_t ld, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * ld));
  for (float& v : x) v = g(rng) * (1.0f + 4.0f * static_cast<float>(rng() % 3));
  return x;
}

std::vector<double> symmetric_start(int64_t n, uint32_t seed) {
  const std::vector<float> a = activations(3, n, seed);
  std::vector<double> h(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) h[static_cast<size_t>(i * n + j)] = static_cast<double>(a[static_cast<size_t>(i)]) * a[static_cast<size_t>(j)];
  return h;
}

class HessianUpdateLevels : public test::SimdVsScalarFixture {};

// Every kernel against the scalar loop, bit for bit: shapes with every tail
// (columns not a multiple of 64, 24, 16 or 8; row ranges not a multiple of
// 6 or 4), ranges that start inside the matrix, one row of activations, a
// row stride wider than the rows.
TEST_P(HessianUpdateLevels, EqualsTheScalarReferenceBitForBit) {
  for (const int64_t n : {1, 3, 4, 5, 8, 13, 16, 17, 31, 40, 67, 100}) {
    for (const int64_t m : {1, 7, 64}) {
      const int64_t ldx = n + (n % 3);
      const std::vector<float> X = activations(m, ldx, static_cast<uint32_t>(n * 100 + m));
      for (const auto& [i0, i1] : {std::pair<int64_t, int64_t>{0, n}, {n / 3, n}, {0, (n + 1) / 2}, {n / 2, n / 2 + 1}}) {
        if (i1 > n || i0 >= i1) continue;
        std::vector<double> want = symmetric_start(n, static_cast<uint32_t>(n)), got = want;
        hessian_update_rows_ref(want.data(), X.data(), m, n, ldx, 0.75, 2.0 / 96.0, i0, i1);
        hessian_update_rows(got.data(), X.data(), m, n, ldx, 0.75, 2.0 / 96.0, i0, i1, GetParam());
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

// The reference against long double: a chain of m f32 fused multiply-adds
// is within m * 2^-24 of the sum of the products' magnitudes (each step
// rounds once, to at most half an f32 ulp of the running sum, which is
// bounded by that sum), and the double update adds a few 2^-53; the
// mirror makes H exactly symmetric.
TEST(HessianUpdate, ReferenceIsWithinTheChainBoundAndSymmetric) {
  const int64_t n = 37, m = 256;
  const std::vector<float> X = activations(m, n, 9);
  std::vector<double> h(static_cast<size_t>(n * n), 0.0);
  hessian_update_rows(h.data(), X.data(), m, n, n, 0.0, 2.0 / m, 0, n, simd_level());
  mirror_upper(h.data(), n);
  double worst = 0;
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
      const long double err = std::fabs(static_cast<long double>(h[static_cast<size_t>(i * n + j)]) - exact);
      EXPECT_LE(err, (static_cast<long double>(m) * std::ldexp(1.0L, -24) + 4 * std::ldexp(1.0L, -53)) * magnitude)
          << i << ", " << j;
      worst = std::max(worst, static_cast<double>(err / magnitude));
      EXPECT_EQ(h[static_cast<size_t>(i * n + j)], h[static_cast<size_t>(j * n + i)]);
    }
  // Random signs make the typical error far smaller than the worst case:
  // about sqrt(m) half-ulps, not m. A chain that lost its f32 precision (or a
  // kernel summing in another type) would not show this.
  EXPECT_LT(worst, 16.0 * std::sqrt(static_cast<double>(m)) * std::ldexp(1.0, -24));
}

}  // namespace
}  // namespace qf
