// Every SIMD kernel against its scalar reference, on lengths that exercise
// the vector bodies and the tails.
#include "runtime/cpu/kernels.h"
#include "simd_level_fixture.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace qf::rt {
namespace {

class SimdLevels : public test::SimdLevelFixture {};

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

const int64_t kLengths[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 100, 256, 1000};

TEST_P(SimdLevels, DotMatchesReference) {
  for (int64_t n : kLengths) {
    auto a = randn(static_cast<size_t>(n), 1), b = randn(static_cast<size_t>(n), 2);
    double exact = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) exact += static_cast<double>(a[i]) * b[i], mag += std::fabs(a[i] * b[i]);
    EXPECT_NEAR(dot_f32(a.data(), b.data(), n), exact, 1e-5 * mag + 1e-6) << "n=" << n;
    EXPECT_NEAR(ref::dot_f32(a.data(), b.data(), n), exact, 1e-5 * mag + 1e-6) << "n=" << n;
  }
}

TEST_P(SimdLevels, DotRowsMatchesRowByRow) {
  for (int64_t n : kLengths)
    for (int64_t rows : {1, 3, 4, 5, 9}) {
      auto x = randn(static_cast<size_t>(n), 3), w = randn(static_cast<size_t>(n * rows), 4);
      std::vector<float> y(static_cast<size_t>(rows));
      dot_rows_f32(x.data(), w.data(), n, rows, y.data());
      for (int64_t r = 0; r < rows; ++r) {
        double exact = 0, mag = 0;
        for (int64_t i = 0; i < n; ++i) exact += static_cast<double>(x[i]) * w[r * n + i], mag += std::fabs(x[i] * w[r * n + i]);
        EXPECT_NEAR(y[r], exact, 1e-5 * mag + 1e-6) << "n=" << n << " row " << r;
      }
    }
}

TEST_P(SimdLevels, GemmTileMatchesDotProducts) {
  for (int64_t k : {5, 16, 33, 100, 256})
    for (int64_t tokens : {1, 2, 3, 4, 5, 9})
      for (int64_t rows : {1, 3, 4, 7, 16}) {
        const int64_t xs = k + 3, ys = rows + 2;
        auto x = randn(static_cast<size_t>(tokens * xs), 10), w = randn(static_cast<size_t>(rows * k), 11);
        std::vector<float> y(static_cast<size_t>(tokens * ys), -7.f), want = y;
        gemm_tile_f32(x.data(), tokens, xs, w.data(), rows, k, y.data(), ys);
        ref::gemm_tile_f32(x.data(), tokens, xs, w.data(), rows, k, want.data(), ys);
        for (int64_t t = 0; t < tokens; ++t)
          for (int64_t r = 0; r < ys; ++r) {
            double mag = 0;
            for (int64_t i = 0; i < k && r < rows; ++i) mag += std::fabs(x[t * xs + i] * w[r * k + i]);
            EXPECT_NEAR(y[t * ys + r], want[t * ys + r], 1e-5 * mag + 1e-6)
                << "k=" << k << " tokens=" << tokens << " rows=" << rows << " at " << t << "," << r;
          }
      }
}

TEST_P(SimdLevels, RowConversionIsExact) {
  for (int64_t n : kLengths) {
    auto v = randn(static_cast<size_t>(n), 5, 100.f);
    std::vector<uint16_t> h(v.size()), b(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_f16(v[i]), b[i] = f32_to_bf16(v[i]);
    std::vector<float> got(v.size()), want(v.size());
    for (DType t : {DType::F16, DType::BF16}) {
      const void* src = t == DType::F16 ? h.data() : b.data();
      row_to_f32(t, src, got.data(), n);
      ref::row_to_f32(t, src, want.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i]) << dtype_name(t) << " n=" << n << " i=" << i;
    }
  }
}

TEST_P(SimdLevels, SoftmaxLogsumexpAndKl) {
  for (int64_t n : kLengths) {
    auto a = randn(static_cast<size_t>(n), 6, 4.f), b = randn(static_cast<size_t>(n), 7, 4.f);
    double mx = a[0];
    for (float x : a) mx = std::max<double>(mx, x);
    double sum = 0;
    for (float x : a) sum += std::exp(x - mx);
    const double lse = mx + std::log(sum);
    EXPECT_NEAR(logsumexp(a.data(), n), lse, 1e-6 * std::max(1.0, std::fabs(lse))) << n;
    std::vector<float> s = a;
    softmax(s.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(s[i], std::exp(a[i] - lse), 1e-6) << n;
    const double lb = ref::logsumexp(b.data(), n);
    double kl = 0;
    for (int64_t i = 0; i < n; ++i) kl += std::exp(a[i] - lse) * ((a[i] - lse) - (b[i] - lb));
    EXPECT_NEAR(kl_divergence(a.data(), lse, b.data(), lb, n), kl, 1e-5 * std::max(1.0, kl)) << n;
    EXPECT_NEAR(kl_divergence(a.data(), lse, a.data(), lse, n), 0.0, 1e-6);
  }
}

TEST_P(SimdLevels, SwigluAndAxpy) {
  for (int64_t n : kLengths) {
    auto g = randn(static_cast<size_t>(n), 8, 5.f), u = randn(static_cast<size_t>(n), 9);
    std::vector<float> out = g;
    swiglu(out.data(), u.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double want = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
      EXPECT_NEAR(out[i], want, 1e-5 * std::max(1.0, std::fabs(want))) << n;
    }
    std::vector<float> y = u;
    axpy(0.5f, g.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(y[i], u[i] + 0.5f * g[i]);
  }
}

TEST(Kernels, RmsNorm) {
  std::vector<float> x = {1, -2, 3, -4}, w = {1, 2, 0.5f, 1}, out(4);
  rms_norm(x.data(), w.data(), 0.f, 4, out.data());
  const float r = std::sqrt(30.f / 4.f);
  EXPECT_NEAR(out[0], 1 / r, 1e-6);
  EXPECT_NEAR(out[1], -4 / r, 1e-6);
  EXPECT_NEAR(out[2], 1.5f / r, 1e-6);
  EXPECT_NEAR(out[3], -4 / r, 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Kernels, SimdLevels,
                         ::testing::Values(SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512),
                         [](const auto& info) { return std::string(simd_level_name(info.param)); });

}  // namespace
}  // namespace qf::rt
