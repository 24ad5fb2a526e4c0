#include "quantizers/gemm_f64.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "simd_level_fixture.h"
#include "test_util.h"

namespace qf {
namespace {

std::vector<double> randn(size_t n, uint32_t seed) { return test::randn<double>(n, seed); }

struct Case {
  int64_t m, n, k;
  bool trans, sub, lower;
  int64_t diagonal;
  bool a_lower = false, b_lower = false;  // A (B) lower triangular: its other triangle zero, skipped
};

// Operands with leading dimensions wider than the rows (3 spare columns),
// so a kernel that assumed packed rows would read the wrong elements.
struct Operands {
  std::vector<double> a, b, c;
  GemmF64 g;
};

Operands make(const Case& cs, uint32_t seed) {
  Operands o;
  GemmF64& g = o.g;
  g.m = cs.m, g.n = cs.n, g.k = cs.k;
  g.lda = cs.k + 3, g.ldc = cs.n + 3;
  g.b_transposed = cs.trans;
  g.ldb = (cs.trans ? cs.k : cs.n) + 3;
  o.a = randn(static_cast<size_t>(cs.m * g.lda), seed);
  o.b = randn(static_cast<size_t>((cs.trans ? cs.n : cs.k) * g.ldb), seed + 1);
  o.c = randn(static_cast<size_t>(cs.m * g.ldc), seed + 2);
  g.a = o.a.data(), g.b = o.b.data(), g.c = o.c.data();
  g.subtract = cs.sub, g.lower = cs.lower, g.diagonal = cs.diagonal;
  g.a_lower = cs.a_lower, g.b_lower = cs.b_lower;
  if (cs.a_lower)
    for (int64_t i = 0; i < cs.m; ++i)
      for (int64_t p = i + 1; p < cs.k; ++p) o.a[static_cast<size_t>(i * g.lda + p)] = 0.0;
  if (cs.b_lower)  // B[p][j] == 0 for p < j (B as stored, not transposed)
    for (int64_t p = 0; p < cs.k; ++p)
      for (int64_t j = p + 1; j < cs.n; ++j) o.b[static_cast<size_t>(p * g.ldb + j)] = 0.0;
  return o;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {1, 1, 1, false, true, false, 0},     {5, 7, 3, false, false, false, 0},   {6, 32, 128, false, true, false, 0},
      {13, 45, 129, true, true, false, 0},  {49, 97, 300, false, true, false, 0}, {100, 100, 64, true, true, true, 0},
      {70, 90, 17, false, false, true, 5},  {37, 260, 40, true, true, true, -3}, {130, 30, 257, false, true, false, 0},
      {300, 200, 300, false, true, false, 0, true, false},  {150, 290, 290, false, false, false, 0, false, true},
      {260, 260, 260, false, true, false, 0, true, true},
  };
  return c;
}

class GemmF64Levels : public test::SimdVsScalarFixture {};

// Every level's tiles, on the pool and on one thread, against the element
// loop, bit for bit: sizes with every tail of the register blocks, B as
// stored and transposed, +=, -= and the lower triangle (elements above it
// are not compared: they are scratch).
TEST_P(GemmF64Levels, EqualsTheScalarReferenceBitForBit) {
  ThreadPool pool(3);
  for (const Case& cs : cases()) {
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      Operands want = make(cs, 7), got = make(cs, 7);
      gemm_f64_ref(want.g);
      gemm_f64(got.g, GetParam(), p);
      for (int64_t i = 0; i < cs.m; ++i)
        for (int64_t j = 0; j < want.g.ldc; ++j) {
          if (cs.lower && j < cs.n && j > i + cs.diagonal) continue;
          const size_t at = static_cast<size_t>(i * want.g.ldc + j);
          ASSERT_EQ(std::memcmp(&got.c[at], &want.c[at], sizeof(double)), 0)
              << cs.m << "x" << cs.n << "x" << cs.k << " trans " << cs.trans << " lower " << cs.lower << " a_lower "
              << cs.a_lower << " b_lower " << cs.b_lower << " at [" << i
              << ", " << j << "]: " << got.c[at] << " vs " << want.c[at];
        }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(GemmF64, GemmF64Levels, test::all_simd_levels(), test::simd_case_name);

// The reference against long double: a chain of k fused multiply-adds is
// within k * 2^-53 of the sum of the magnitudes it adds (plus |C|).
TEST(GemmF64, ReferenceIsWithinTheChainBound) {
  const Case cs{9, 11, 500, false, true, false, 0};
  Operands o = make(cs, 3);
  const std::vector<double> c0 = o.c;
  gemm_f64_ref(o.g);
  for (int64_t i = 0; i < cs.m; ++i)
    for (int64_t j = 0; j < cs.n; ++j) {
      long double exact = c0[static_cast<size_t>(i * o.g.ldc + j)], mag = std::fabs(exact);
      for (int64_t p = 0; p < cs.k; ++p) {
        const long double t = static_cast<long double>(o.a[static_cast<size_t>(i * o.g.lda + p)]) * o.b[static_cast<size_t>(p * o.g.ldb + j)];
        exact -= t;
        mag += std::fabs(t);
      }
      const long double err = std::fabs(static_cast<long double>(o.c[static_cast<size_t>(i * o.g.ldc + j)]) - exact);
      EXPECT_LE(err, mag * (cs.k + 1) * 0x1p-53L) << i << ", " << j;
    }
}

TEST(GemmF64, EmptyProductsLeaveCAndBadArgumentsThrow) {
  std::vector<double> c = {1.5, 2.5};
  GemmF64 g;
  g.m = 1, g.n = 2, g.k = 0, g.c = c.data(), g.ldc = 2;
  gemm_f64(g, simd_level(), nullptr);
  EXPECT_EQ(c[0], 1.5);
  EXPECT_EQ(c[1], 2.5);
  g.k = 3;
  std::vector<double> a(3), b(6);
  g.a = a.data(), g.b = b.data(), g.lda = 2, g.ldb = 2;  // lda below k
  EXPECT_THROW(gemm_f64(g, simd_level(), nullptr), Error);
  g.m = -1;
  EXPECT_THROW(gemm_f64_ref(g), Error);
}

}  // namespace
}  // namespace qf
