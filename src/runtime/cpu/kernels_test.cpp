// Every kernel at every SIMD level, against double-precision results or its
// scalar reference, on lengths that exercise the vector bodies and the tails.
//
// Bounds (u = 2^-24, the f32 unit roundoff):
//  - a sum of n f32 terms (products), in any order, with or without fused
//    multiply-add, is within gamma(n) = n u / (1 - n u) of the exact sum times
//    sum |terms| (Higham, "Accuracy and Stability of Numerical Algorithms",
//    2nd ed., section 3.1);
//  - exp: the AVX2 polynomial is within 2e-7 + 1.5 u |x| relative (checked on
//    every float in [-87, 87] against long double: at most 1.06 u + 1.5 u |x|,
//    the last term being the rounding of x log2(e) that the range reduction
//    scales up); std::exp of a float within 1 ulp (2u); of a double, exact
//    enough;
//  - every other f32 operation: relative u.
#include "quantizers/kquants.h"
#include "runtime/cpu/kernels.h"
#include "simd_level_fixture.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace qf::rt {
namespace {

constexpr double kU = 1.0 / 16777216.0;
double gamma(int64_t n) { return static_cast<double>(n) * kU / (1.0 - static_cast<double>(n) * kU); }
// Relative error of the kernels' exp at x.
double exp_rel(double x) { return 2e-7 + 1.5 * kU * std::fabs(x); }

// Tests against double-precision results: meaningful at every level.
class SimdLevels : public test::SimdLevelFixture {};
// Tests against the scalar reference: skipped at the scalar level.
class SimdVsScalar : public test::SimdVsScalarFixture {};

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

const int64_t kLengths[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 100, 256, 1000};

// |dot - exact| <= gamma(n) sum |a_i b_i|, whatever the order of the sum.
TEST_P(SimdLevels, DotMatchesReference) {
  for (int64_t n : kLengths) {
    auto a = randn(static_cast<size_t>(n), 1), b = randn(static_cast<size_t>(n), 2);
    double exact = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) exact += static_cast<double>(a[i]) * b[i], mag += std::fabs(static_cast<double>(a[i]) * b[i]);
    EXPECT_NEAR(dot_f32(a.data(), b.data(), n), exact, gamma(n) * mag) << "n=" << n;
    EXPECT_NEAR(ref::dot_f32(a.data(), b.data(), n), exact, gamma(n) * mag) << "n=" << n;
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
        for (int64_t i = 0; i < n; ++i)
          exact += static_cast<double>(x[i]) * w[r * n + i], mag += std::fabs(static_cast<double>(x[i]) * w[r * n + i]);
        EXPECT_NEAR(y[r], exact, gamma(n) * mag) << "n=" << n << " row " << r;
      }
    }
}

// Both within gamma(k) sum |x w| of the exact product, so within twice that
// of each other; the rows past `rows` are left alone.
TEST_P(SimdVsScalar, GemmTileMatchesReference) {
  for (int64_t k : {5, 16, 33, 100, 256})
    for (int64_t tokens : {1, 2, 3, 4, 5, 6, 9, 13, 16})
      for (int64_t rows : {1, 3, 4, 7, 16}) {
        const int64_t xs = k + 3, ys = rows + 2;
        auto x = randn(static_cast<size_t>(tokens * xs), 10), w = randn(static_cast<size_t>(rows * k), 11);
        std::vector<float> y(static_cast<size_t>(tokens * ys), -7.f), want = y;
        gemm_tile_f32(x.data(), tokens, xs, w.data(), rows, k, y.data(), ys);
        ref::gemm_tile_f32(x.data(), tokens, xs, w.data(), rows, k, want.data(), ys);
        for (int64_t t = 0; t < tokens; ++t)
          for (int64_t r = 0; r < ys; ++r) {
            double mag = 0;
            for (int64_t i = 0; i < k && r < rows; ++i) mag += std::fabs(static_cast<double>(x[t * xs + i]) * w[r * k + i]);
            EXPECT_NEAR(y[t * ys + r], want[t * ys + r], 2 * gamma(k) * mag)
                << "k=" << k << " tokens=" << tokens << " rows=" << rows << " at " << t << "," << r;
          }
      }
}

// The AVX2 kernels' order for one sum, written out in scalars
// (gemm_blocks.h): chunk c of 8 elements into accumulator c % accs (lane
// i % 8, one fused multiply-add per element), the accumulators added in
// order, the horizontal sum of hsum256 (lanes l and l + 4, then 0 + 2 and
// 1 + 3, then those two), the elements past a multiple of 8 by fused
// multiply-adds.
float avx2_order_dot(const float* x, const float* w, int64_t k, int accs) {
  std::vector<std::array<float, 8>> acc(static_cast<size_t>(accs), std::array<float, 8>{});
  const int64_t whole = k / 8 * 8;
  for (int64_t i = 0; i < whole; ++i) {
    float& a = acc[static_cast<size_t>(i / 8 % accs)][static_cast<size_t>(i % 8)];
    a = std::fma(x[i], w[i], a);
  }
  std::array<float, 8> t = acc[0];
  for (size_t j = 1; j < acc.size(); ++j)
    for (size_t l = 0; l < 8; ++l) t[l] += acc[j][l];
  float h[4];
  for (size_t l = 0; l < 4; ++l) h[l] = t[l] + t[l + 4];
  float out = (h[0] + h[2]) + (h[1] + h[3]);
  for (int64_t i = whole; i < k; ++i) out = std::fma(x[i], w[i], out);
  return out;
}

// Every register block (6 or 4 tokens x 4 rows at AVX-512, 4 x 3 or 2 x 4
// at AVX2) and the per-token rows form each sum in one order, so a token's
// outputs do not depend on how many tokens share the call. f16 rows converted
// in registers (dot_rows_f16, gemm_tile_f16) give the floats of converting
// them first, except at AVX2, where they sum in two accumulators: there both
// kinds must match their orders written out in scalars (avx2_order_dot),
// which a block that read a chunk into the wrong accumulator, or a pass that
// skipped or repeated one, would miss.
TEST_P(SimdLevels, GemmTileTokensIndependentAndF16RowsExact) {
  const bool avx2 = simd_level() == SimdLevel::Avx2;
  // Tokens 6 x 3 + 4 + 1 at AVX-512, 4 x 5 + 2 + 1 at AVX2; rows 5, 6 and 7
  // (4 + 1, 4 + 2, 4 + 3 at AVX-512; at AVX2 3 + 2, 3 + 3, 3 + 3 + 1 for 4
  // tokens and 4 + 1, 4 + 2, 4 + 3 for 2): every block, every narrower block
  // for the rows past them, and the tokens past them. k = 1035: three pieces
  // of the AVX2 f16 passes, the last partial, and a tail; k = 1035 and 2100:
  // the AVX2 4-token blocks across the rows one span of 1024 at a time
  // (kTileKSpan), the last span partial (8 and 48 elements), and a tail.
  for (int64_t k : {5, 16, 24, 33, 100, 256, 1035, 2100})
    for (int64_t rows : {5, 6, 7}) {
      const int64_t tokens = 23;
      auto x = randn(static_cast<size_t>(tokens * k), 12), w = randn(static_cast<size_t>(rows * k), 13);
      std::vector<uint16_t> w16(w.size());
      for (size_t i = 0; i < w.size(); ++i) w16[i] = f32_to_f16(w[i]);
      std::vector<float> wf(w.size());
      row_to_f32(DType::F16, w16.data(), wf.data(), static_cast<int64_t>(wf.size()));
      std::vector<float> all(static_cast<size_t>(tokens * rows)), all16(all.size());
      gemm_tile_f32(x.data(), tokens, k, wf.data(), rows, k, all.data(), rows);
      gemm_tile_f16(x.data(), tokens, k, w16.data(), rows, k, all16.data(), rows);
      for (int64_t t = 0; t < tokens; ++t) {
        std::vector<float> one(static_cast<size_t>(rows)), one16(one.size()), f16(one.size());
        gemm_tile_f32(x.data() + t * k, 1, k, wf.data(), rows, k, one.data(), rows);
        gemm_tile_f16(x.data() + t * k, 1, k, w16.data(), rows, k, one16.data(), rows);
        dot_rows_f16(x.data() + t * k, w16.data(), k, rows, f16.data());
        for (int64_t r = 0; r < rows; ++r) {
          const size_t i = static_cast<size_t>(t * rows + r), ri = static_cast<size_t>(r);
          EXPECT_EQ(all[i], one[ri]) << "k=" << k << " rows=" << rows << " token " << t << " row " << r;
          EXPECT_EQ(all16[i], one16[ri]) << "k=" << k << " rows=" << rows << " f16, token " << t << " row " << r;
          EXPECT_EQ(f16[ri], one16[ri]) << "k=" << k << " rows=" << rows << " dot_rows_f16, token " << t << " row " << r;
          if (avx2) {
            const float* xt = x.data() + t * k;
            const float* wr = wf.data() + r * k;
            EXPECT_EQ(one[ri], avx2_order_dot(xt, wr, k, 1)) << "k=" << k << " rows=" << rows << " f32 order, token " << t << " row " << r;
            EXPECT_EQ(one16[ri], avx2_order_dot(xt, wr, k, 2)) << "k=" << k << " rows=" << rows << " f16 order, token " << t << " row " << r;
          } else {
            EXPECT_EQ(one16[ri], one[ri]) << "k=" << k << " rows=" << rows << " f16 as f32, token " << t << " row " << r;
          }
        }
      }
    }
}

// Block rows decoded in registers (the prefill GEMM's path for Q8_0
// weights) give exactly the floats of decoding them first with the
// quantizers' decoder: random code bytes (every code value), f16 scales over
// several binades.
struct BlockRowKind {
  const char* name;
  int64_t block_elems, block_bytes;
  std::vector<int64_t> f16_offsets;  // the f16 scales in a block
  void (*decode)(const uint8_t*, float*, int64_t);
  void (*dot_rows)(const float*, const uint8_t*, int64_t, int64_t, float*);
  void (*gemm)(const float*, int64_t, int64_t, const uint8_t*, int64_t, int64_t, float*, int64_t);
  uint32_t ggml;
};

// Equal floats, or both NaN (an infinite scale times a zero code).
bool same(float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); }

TEST_P(SimdLevels, BlockRowsInRegistersMatchDecodedRows) {
  const BlockRowKind kinds[] = {
      {"q8_0", 32, 34, {0}, decode_q8_0_row, dot_rows_q8_0, gemm_tile_q8_0, ggml_type::Q8_0},
  };
  std::mt19937 rng(21);
  for (const auto& kind : kinds)
    for (int64_t blocks : {1, 3, 8}) {
      const int64_t k = blocks * kind.block_elems;
      for (int64_t rows : {1, 3, 4, 7, 9}) {
        std::vector<uint8_t> w(static_cast<size_t>(rows * blocks * kind.block_bytes));
        for (auto& v : w) v = static_cast<uint8_t>(rng() & 0xff);
        // Mostly normal scales over several binades; every seventh block one
        // of the edge cases real files hold: zero, negative zero, subnormal,
        // the smallest normal, the largest finite, a negative scale, infinity.
        const uint16_t edges[] = {0x0000, 0x8000, 0x0001, 0x03ff, 0x0400, 0x7bff, 0xbc00, 0x7c00};
        for (int64_t b = 0; b < rows * blocks; ++b)
          for (int64_t off : kind.f16_offsets) {
            const float scale = std::ldexp(1.f + static_cast<float>(rng() % 1000) / 1000.f, static_cast<int>(rng() % 12) - 14);
            const uint16_t h = b % 7 == 3 ? edges[(b / 7) % 8] : f32_to_f16(scale);
            std::memcpy(w.data() + b * kind.block_bytes + off, &h, 2);
          }
        const int64_t row_bytes = blocks * kind.block_bytes;
        std::vector<float> wf(static_cast<size_t>(rows * k)), want_row(static_cast<size_t>(k));
        for (int64_t r = 0; r < rows; ++r) {
          kind.decode(w.data() + r * row_bytes, wf.data() + r * k, k);
          kquants::dequantize_row(kind.ggml, w.data() + r * row_bytes, want_row.data(), k);
          for (int64_t i = 0; i < k; ++i) ASSERT_TRUE(same(wf[r * k + i], want_row[i])) << kind.name << " decode at " << i;
        }
        const int64_t tokens = 23;  // every register block (see above)
        auto x = randn(static_cast<size_t>(tokens * k), 22);
        std::vector<float> want(static_cast<size_t>(tokens * rows)), got(want.size());
        gemm_tile_f32(x.data(), tokens, k, wf.data(), rows, k, want.data(), rows);
        kind.gemm(x.data(), tokens, k, w.data(), rows, k, got.data(), rows);
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_TRUE(same(got[i], want[i])) << kind.name << " k=" << k << " rows=" << rows << " at " << i << ": " << got[i] << " vs " << want[i];
        std::vector<float> one(static_cast<size_t>(rows)), one_want(one.size());
        kind.dot_rows(x.data(), w.data(), k, rows, one.data());
        dot_rows_f32(x.data(), wf.data(), k, rows, one_want.data());
        for (int64_t r = 0; r < rows; ++r)
          ASSERT_TRUE(same(one[r], one_want[r])) << kind.name << " k=" << k << " rows=" << rows << " row " << r;
      }
    }
}

// The Q8_0 kernels read whole blocks; a row length that is not a multiple
// of 32 is refused before any byte is read, at every level.
TEST_P(SimdLevels, Q8_0KernelsRefuseAPartialBlock) {
  std::vector<uint8_t> w(2 * 34);
  std::vector<float> x(48 * 2, 1.f), y(4, -7.f);
  EXPECT_QF_ERROR(gemm_tile_q8_0(x.data(), 2, 48, w.data(), 1, 48, y.data(), 1), ErrorKind::Internal,
                  "Q8_0 row length 48 is not a multiple of 32");
  EXPECT_QF_ERROR(dot_rows_q8_0(x.data(), w.data(), 48, 1, y.data()), ErrorKind::Internal,
                  "Q8_0 row length 48 is not a multiple of 32");
  EXPECT_QF_ERROR(decode_q8_0_row(w.data(), x.data(), 48), ErrorKind::InvalidInput, "row length 48");
  EXPECT_EQ(y[0], -7.f);  // nothing written
}

TEST_P(SimdVsScalar, RowConversionIsExact) {
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

// Data-dependent bounds, first order in u, with p_i = exp(a_i - lse):
//  - logsumexp = m + log(sum_i exp(a_i - m)): the sum's relative error is at
//    most sum_i p_i h_i + gamma(n) (positive terms), h_i = exp_rel(a_i - m) +
//    u |a_i - m| (exp and the subtraction), and the log turns it into an
//    absolute error; m + log(...) is formed in double;
//  - softmax: each s_i also carries its own h_i, the reciprocal and the
//    product 2u: |s_i - p_i| <= p_i (h_i + sum_j p_j h_j + gamma(n) + 2u);
//  - KL: sum_i P_i (lp_i - lq_i) with the differences formed in f32 from the
//    logits and log-sum-exps (at most 2u (|a_i| + |lse| + |b_i| + |lb|)),
//    P_i = exp(lp_i) of an f32 argument (exp_rel(lp_i) + u (|lp_i| + |lse|)
//    relative), and the f32 sum of n products gamma(n);
//    KL(P || P) is exactly 0 (every difference is exactly 0).
TEST_P(SimdLevels, SoftmaxLogsumexpAndKl) {
  for (int64_t n : kLengths) {
    auto a = randn(static_cast<size_t>(n), 6, 4.f), b = randn(static_cast<size_t>(n), 7, 4.f);
    double mx = a[0];
    for (float x : a) mx = std::max<double>(mx, x);
    double sum = 0;
    for (float x : a) sum += std::exp(x - mx);
    const double lse = mx + std::log(sum);
    std::vector<double> p(static_cast<size_t>(n)), h(p.size());
    double mean_h = 0;
    for (int64_t i = 0; i < n; ++i) {
      p[i] = std::exp(a[i] - lse);
      h[i] = exp_rel(a[i] - mx) + kU * std::fabs(a[i] - mx);
      mean_h += p[i] * h[i];
    }
    EXPECT_NEAR(logsumexp(a.data(), n), lse, mean_h + gamma(n)) << n;
    std::vector<float> s = a;
    softmax(s.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(s[i], p[i], p[i] * (h[i] + mean_h + gamma(n) + 2 * kU)) << n;

    const double lb = ref::logsumexp(b.data(), n);
    double kl = 0, kl_bound = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double lp = a[i] - lse, lq = b[i] - lb, d = lp - lq;
      kl += p[i] * d;
      const double d_err = 2 * kU * (std::fabs(a[i]) + std::fabs(lse) + std::fabs(b[i]) + std::fabs(lb));
      const double p_err = exp_rel(lp) + kU * (std::fabs(lp) + std::fabs(lse));  // exp of an f32 argument
      kl_bound += p[i] * (std::fabs(d) * p_err + d_err) + gamma(n) * p[i] * std::fabs(d);
    }
    EXPECT_NEAR(kl_divergence(a.data(), lse, b.data(), lb, n), kl, kl_bound) << n;
    EXPECT_EQ(kl_divergence(a.data(), lse, a.data(), lse, n), 0.0) << n;
  }
}

// SwiGLU: the exp error h moves g / (1 + e^-g) by at most h relative; 1 + e,
// the division and the product add 3u. axpy: 0.5 g is exact, so y + 0.5 g is
// rounded once, fused or not: bit-exact.
TEST_P(SimdLevels, SwigluAndAxpy) {
  for (int64_t n : kLengths) {
    auto g = randn(static_cast<size_t>(n), 8, 5.f), u = randn(static_cast<size_t>(n), 9);
    std::vector<float> out = g;
    swiglu(out.data(), u.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double want = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
      EXPECT_NEAR(out[i], want, std::fabs(want) * (exp_rel(g[i]) + 3 * kU)) << n;
    }
    std::vector<float> y = u;
    axpy(0.5f, g.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(y[i], u[i] + 0.5f * g[i]);
  }
}

// out = (x * scale) * w with the scale rounded to f32: three roundings, 3u
// relative (the sum of squares is taken in double).
TEST(Kernels, RmsNorm) {
  std::vector<float> x = {1, -2, 3, -4}, w = {1, 2, 0.5f, 1}, out(4);
  rms_norm(x.data(), w.data(), 0.f, 4, out.data());
  const double r = std::sqrt(30.0 / 4.0);
  for (int i = 0; i < 4; ++i) {
    const double want = x[i] / r * w[i];
    EXPECT_NEAR(out[i], want, 3 * kU * std::fabs(want)) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, SimdLevels, test::all_simd_levels(), test::simd_case_name);
INSTANTIATE_TEST_SUITE_P(Kernels, SimdVsScalar, test::all_simd_levels(), test::simd_case_name);

}  // namespace
}  // namespace qf::rt
