// make_bf16_linear (the bf16 calibration path's Linear) against a
// double-precision reference: within the bound of rounding both operands to
// bf16 and summing in f32, exactly the f32 products when the operands are
// bf16 numbers already, really rounded otherwise, the same floats on any
// thread count, and the wrapped Linear's rows, bias and shape.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "runtime/linear.h"
#include "test_util.h"

namespace qf::rt {
namespace {

using test::randn;

constexpr int64_t kIn = 301, kOut = 37, kTokens = 9;  // odd: VDPBF16PS pairs with a tail

std::vector<float> to_bf16_values(std::vector<float> v) {
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

struct Bf16Run {
  std::vector<float> y;
  double max_rel_to_bound = 0;  // max |y - exact| / bound
  double max_dev = 0;           // max |y - exact| / sum |x w|
};

// y = bf16 Linear of x; compared with the exact double product of the
// given (unrounded) x and w. Rounding x and w to bf16 changes each product
// by at most |x w| (2 u + u^2) with u = 2^-8; the f32 sums of `in` terms
// and the bias add at most (in + 1) 2^-24 of the magnitudes.
Bf16Run run(const std::vector<float>& w, const std::vector<float>& bias, const std::vector<float>& x, ThreadPool& pool) {
  const Tensor wt = Tensor::from_f32(w, {kOut, kIn}), bt = Tensor::from_f32(bias, {kOut});
  std::shared_ptr<const Linear> src = make_dense_linear(wt, &bt, "t");
  const std::shared_ptr<Linear> lin = make_bf16_linear(src);
  EXPECT_EQ(lin->in_features(), kIn);
  EXPECT_EQ(lin->out_features(), kOut);
  EXPECT_EQ(lin->bias_values(), bias);
  Bf16Run r;
  r.y.assign(static_cast<size_t>(kTokens * kOut), 0.f);
  lin->forward(x.data(), kTokens, r.y.data(), pool);
  const double u = 0x1p-8, f = 0x1p-24;
  for (int64_t t = 0; t < kTokens; ++t)
    for (int64_t o = 0; o < kOut; ++o) {
      double exact = bias[static_cast<size_t>(o)], mag = 0;
      for (int64_t i = 0; i < kIn; ++i) {
        const double p = static_cast<double>(x[static_cast<size_t>(t * kIn + i)]) * w[static_cast<size_t>(o * kIn + i)];
        exact += p, mag += std::fabs(p);
      }
      const double bound = mag * (2 * u + u * u) * (1 + (kIn + 1) * f) + (kIn + 1) * f * (mag + std::fabs(bias[static_cast<size_t>(o)]));
      const double err = std::fabs(r.y[static_cast<size_t>(t * kOut + o)] - exact);
      r.max_rel_to_bound = std::max(r.max_rel_to_bound, err / bound);
      r.max_dev = std::max(r.max_dev, err / mag);
    }
  return r;
}

TEST(Bf16Linear, WithinTheBf16RoundingBoundAndReallyRounded) {
  ThreadPool pool(2);
  const std::vector<float> w = randn(kOut * kIn, 1, 0.05f), b = randn(kOut, 2, 0.1f), x = randn(kTokens * kIn, 3, 1.f);
  const Bf16Run r = run(w, b, x, pool);
  EXPECT_LE(r.max_rel_to_bound, 1.0);
  // Not an f32 product in disguise: rounding to bf16 (8 bits) moves some
  // output by far more than f32 summation (2^-24 per term) could.
  EXPECT_GT(r.max_dev, 1e-4);
}

TEST(Bf16Linear, Bf16OperandsGiveTheF32SumsAndThreadsChangeNothing) {
  ThreadPool one(1), three(3);
  const std::vector<float> w = to_bf16_values(randn(kOut * kIn, 4, 0.05f)), b = randn(kOut, 5, 0.1f),
                           x = to_bf16_values(randn(kTokens * kIn, 6, 1.f));
  const Bf16Run a = run(w, b, x, one), c = run(w, b, x, three);
  // Products of bf16 numbers are exact in f32: only the sums round.
  EXPECT_LE(a.max_dev, (kIn + 1) * 0x1p-24);
  ASSERT_EQ(a.y.size(), c.y.size());
  EXPECT_EQ(std::memcmp(a.y.data(), c.y.data(), a.y.size() * sizeof(float)), 0);
}

TEST(Bf16Linear, RowsAreTheWrappedLinears) {
  const std::vector<float> w = randn(kOut * kIn, 7, 0.05f), b(kOut, 0.f);
  const Tensor wt = Tensor::from_f32(w, {kOut, kIn});
  std::shared_ptr<const Linear> src = make_dense_linear(wt, nullptr, "t");
  const std::shared_ptr<Linear> lin = make_bf16_linear(src);
  std::vector<float> row(kIn);
  lin->decode_row(5, row.data());
  for (int64_t i = 0; i < kIn; ++i) EXPECT_EQ(row[static_cast<size_t>(i)], w[static_cast<size_t>(5 * kIn + i)]);
  EXPECT_TRUE(lin->bias_values().empty());
}

}  // namespace
}  // namespace qf::rt
