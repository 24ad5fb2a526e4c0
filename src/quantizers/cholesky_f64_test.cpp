#include "quantizers/cholesky_f64.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "simd_level_fixture.h"

namespace qf {
namespace {

// A symmetric positive definite n x n matrix X^T X / m + damp I (row-major,
// leading dimension ld), with columns of very different scales, as GPTQ's
// Hessians have.
std::vector<double> spd(int64_t n, int64_t ld, uint32_t seed, double damp = 0.01) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> g(0.0, 1.0);
  const int64_t m = n + 7;
  std::vector<double> x(static_cast<size_t>(m * n));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) x[static_cast<size_t>(r * n + c)] = g(rng) * (1.0 + static_cast<double>(c % 5));
  std::vector<double> a(static_cast<size_t>(n * ld), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t r = 0; r < m; ++r) s += x[static_cast<size_t>(r * n + i)] * x[static_cast<size_t>(r * n + j)];
      a[static_cast<size_t>(i * ld + j)] = s / static_cast<double>(m) + (i == j ? damp : 0.0);
    }
  return a;
}

class CholeskyLevels : public test::SimdVsScalarFixture {};

// Every level, on the pool and alone, gives the scalar level's doubles:
// sizes below, at and across the block size (tails of every kernel; 600:
// two levels of the inverse's recursion). The inverse, written over L,
// leaves zeros above the diagonal.
TEST_P(CholeskyLevels, FactorAndInverseEqualTheScalarLevelBitForBit) {
  ThreadPool pool(2);
  for (const int64_t n : {1, 5, 17, 128, 131, 300, 600}) {
    const int64_t ld = n + 2;
    std::vector<double> want = spd(n, ld, static_cast<uint32_t>(n));
    ASSERT_TRUE(cholesky_lower_f64(want.data(), n, ld, SimdLevel::Scalar, nullptr));
    std::vector<double> want_inv = want;
    invert_lower_f64(want_inv.data(), ld, n, SimdLevel::Scalar, nullptr);
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      std::vector<double> got = spd(n, ld, static_cast<uint32_t>(n));
      ASSERT_TRUE(cholesky_lower_f64(got.data(), n, ld, GetParam(), p));
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j <= i; ++j) {
          const size_t at = static_cast<size_t>(i * ld + j);
          ASSERT_EQ(std::memcmp(&got[at], &want[at], sizeof(double)), 0) << "L, n " << n << " [" << i << ", " << j << "]";
        }
      for (int64_t i = 0; i < n; ++i)  // scratch above the diagonal, which the inverse must clear
        for (int64_t j = i + 1; j < n; ++j) got[static_cast<size_t>(i * ld + j)] = 7.0;
      invert_lower_f64(got.data(), ld, n, GetParam(), p);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j) {
          const size_t at = static_cast<size_t>(i * ld + j);
          if (j > i) {
            ASSERT_EQ(got[at], 0.0) << "L^-1, upper [" << i << ", " << j << "]";
            continue;
          }
          ASSERT_EQ(std::memcmp(&got[at], &want_inv[at], sizeof(double)), 0) << "L^-1, n " << n << " [" << i << ", " << j << "]";
        }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cholesky, CholeskyLevels, test::all_simd_levels(), test::simd_case_name);

// L L^T reproduces A and L^-1 L is the identity, within a backward-error
// bound of the order of n eps (|L| |L^T| and |L^-1| |L| scaled), on a matrix
// crossing two blocks.
TEST(Cholesky, FactorReproducesTheMatrixAndTheInverseIsOne) {
  const int64_t n = 260, ld = n;
  const std::vector<double> a = spd(n, ld, 11);
  std::vector<double> l = a;
  ASSERT_TRUE(cholesky_lower_f64(l.data(), n, ld, simd_level(), nullptr));
  std::vector<double> x = l;
  invert_lower_f64(x.data(), n, n, simd_level(), nullptr);
  const double eps = 0x1p-53;
  auto L = [&](int64_t i, int64_t j) { return j <= i ? l[static_cast<size_t>(i * ld + j)] : 0.0; };
  auto X = [&](int64_t i, int64_t j) { return x[static_cast<size_t>(i * n + j)]; };
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      long double s = 0, mag = 0, e = 0, emag = 0;
      for (int64_t p = 0; p < n; ++p) {
        s += static_cast<long double>(L(i, p)) * L(j, p), mag += std::fabs(L(i, p) * L(j, p));
        e += static_cast<long double>(X(i, p)) * L(p, j), emag += std::fabs(X(i, p) * L(p, j));
      }
      ASSERT_LE(std::fabs(s - a[static_cast<size_t>(i * ld + j)]), 4 * n * eps * mag) << "L L^T at " << i << ", " << j;
      ASSERT_LE(std::fabs(e - (i == j ? 1.0L : 0.0L)), 4 * n * eps * emag) << "L^-1 L at " << i << ", " << j;
      if (j > i) {
        ASSERT_EQ(X(i, j), 0.0);
      }
    }
}

TEST(Cholesky, NotPositiveDefiniteIsReported) {
  const int64_t n = 150;
  std::vector<double> a = spd(n, n, 5);
  a[static_cast<size_t>(140 * n + 140)] = -1.0;  // a negative pivot in the second block
  EXPECT_FALSE(cholesky_lower_f64(a.data(), n, n, simd_level(), nullptr));
  std::vector<double> b = spd(n, n, 5);
  b[static_cast<size_t>(3 * n + 3)] = std::nan("");
  EXPECT_FALSE(cholesky_lower_f64(b.data(), n, n, simd_level(), nullptr));
}

}  // namespace
}  // namespace qf
