// The device attention against a plain double-precision loop written from
// the definition (scores q.k / sqrt(hd), causal or sliding-window softmax,
// weighted sum of v), for grouped-query shapes that are not multiples of
// anything. The cuda build runs the same cases where a GPU is usable.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "device/device.h"
#include "runtime/device_runtime.h"

namespace qf {
namespace {

// Queries are the last nq of nk positions: query row r is at position nk - nq + r.
std::vector<double> reference(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                              int64_t nq, int64_t nk, int64_t heads, int64_t kv_heads, int64_t hd, int64_t window) {
  std::vector<double> out(static_cast<size_t>(nq * heads * hd), 0.0);
  const int64_t group = heads / kv_heads;
  for (int64_t r = 0; r < nq; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t t = nk - nq + r;
      const int64_t g = h / group, lo = window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
      std::vector<double> s;
      for (int64_t i = lo; i <= t; ++i) {
        double dot = 0;
        for (int64_t d = 0; d < hd; ++d)
          dot += static_cast<double>(q[static_cast<size_t>((r * heads + h) * hd + d)]) *
                 k[static_cast<size_t>((i * kv_heads + g) * hd + d)];
        s.push_back(dot / std::sqrt(static_cast<double>(hd)));
      }
      const double m = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - m));
      for (int64_t i = lo; i <= t; ++i)
        for (int64_t d = 0; d < hd; ++d)
          out[static_cast<size_t>((r * heads + h) * hd + d)] +=
              s[static_cast<size_t>(i - lo)] / sum * v[static_cast<size_t>((i * kv_heads + g) * hd + d)];
    }
  return out;
}

struct Shape {
  int64_t nq, nk, heads, kv_heads, hd, window;
};

template <class F>
void expect_matches(F attention, const std::string& dev) {
  // Prefills (nq == nk), a decode step (nq == 1) and a continued prefill,
  // with and without a window.
  for (const Shape& sh : {Shape{37, 37, 6, 2, 16, 0}, Shape{53, 53, 5, 5, 24, 0}, Shape{41, 41, 4, 1, 32, 9},
                          Shape{1, 1, 3, 3, 8, 0}, Shape{1, 29, 6, 3, 16, 0}, Shape{1, 29, 6, 3, 16, 7},
                          Shape{13, 45, 4, 2, 8, 0}, Shape{13, 45, 4, 2, 8, 10}}) {
    std::mt19937 rng(static_cast<uint32_t>(sh.nk * 7 + sh.nq * 3 + sh.heads + sh.window));
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> q(static_cast<size_t>(sh.nq * sh.heads * sh.hd)), k(static_cast<size_t>(sh.nk * sh.kv_heads * sh.hd)),
        v(k.size());
    for (auto& x : q) x = g(rng);
    for (auto& x : k) x = g(rng);
    for (auto& x : v) x = g(rng);
    const std::vector<float> got = attention(q, k, v, sh);
    const std::vector<double> want = reference(q, k, v, sh.nq, sh.nk, sh.heads, sh.kv_heads, sh.hd, sh.window);
    ASSERT_EQ(got.size(), want.size());
    // Error bound: a score is an f32 sum of hd products, off by at most
    // hd u sum|q_d k_d| (u = 2^-24), here <= hd u |q||k| / sqrt(hd); the
    // softmax weights then move by at most 2 max|ds| + (window + 4) u in
    // relative terms (exp, the sum, the division), and the output, a
    // weighted mean of v, by that times max|v|, plus hd-free rounding of the
    // last sum (n u max|v|).
    double qmax = 0, kmax = 0, vmax = 0;
    for (float x : q) qmax = std::max(qmax, std::fabs(static_cast<double>(x)));
    for (float x : k) kmax = std::max(kmax, std::fabs(static_cast<double>(x)));
    for (float x : v) vmax = std::max(vmax, std::fabs(static_cast<double>(x)));
    const double u = std::ldexp(1.0, -24);
    const double ds = sh.hd * u * qmax * kmax * std::sqrt(static_cast<double>(sh.hd));
    const double tol = (2 * ds + 2.0 * (sh.nk + 4) * u) * vmax;
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], tol) << dev << " nq " << sh.nq << " nk " << sh.nk << " heads " << sh.heads << "/" << sh.kv_heads << " hd "
                                        << sh.hd << " window " << sh.window << " at " << i;
  }
}

TEST(DeviceAttention, HostBuildMatchesTheDefinition) {
  expect_matches([](const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                    const Shape& s) { return host::attention(q.data(), k.data(), v.data(), s.nq, s.nk, s.heads, s.kv_heads, s.hd, s.window); },
                 "host");
  EXPECT_THROW(host::attention(nullptr, nullptr, nullptr, 4, 4, 6, 4, 8, 0), Error);  // 6 heads cannot share 4 kv heads
  EXPECT_THROW(host::attention(nullptr, nullptr, nullptr, 5, 4, 4, 4, 8, 0), Error);  // more queries than positions
}

TEST(DeviceAttention, CudaBuildMatchesTheDefinition) {
  std::string why;
  if (!device::cuda_usable(&why)) GTEST_SKIP() << "no CUDA device: " << why;
#if QF_HAVE_CUDA
  expect_matches([](const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                    const Shape& s) { return cuda::attention(q.data(), k.data(), v.data(), s.nq, s.nk, s.heads, s.kv_heads, s.hd, s.window); },
                 "cuda");
#endif
}

}  // namespace
}  // namespace qf
