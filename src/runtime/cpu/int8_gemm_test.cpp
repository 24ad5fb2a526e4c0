// The int8 GEMM at every SIMD level against the scalar reference, bit for bit
// (skipped at the scalar level, where both are the reference),
// on random shapes (odd k, row and token counts off the register blocks) and
// on the extreme operands -128 x -128 that break saturating kernels.
#include "runtime/cpu/int8_gemm.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "runtime/cpu/kernels.h"
#include "simd_level_fixture.h"

namespace qf::rt {
namespace {

class Int8GemmLevels : public test::SimdVsScalarFixture {};
class Int8GemmAllLevels : public test::SimdLevelFixture {};

std::vector<int8_t> random_i8(size_t n, std::mt19937& rng) {
  std::vector<int8_t> v(n);
  for (auto& x : v) x = static_cast<int8_t>(static_cast<int>(rng() % 256) - 128);
  return v;
}

void check(const std::vector<int8_t>& x, int64_t tokens, int64_t xs, const std::vector<int8_t>& w, int64_t rows,
           int64_t k, bool pass_rowsum, const std::string& what) {
  const int64_t ys = rows + 3;
  std::vector<int32_t> want(static_cast<size_t>(tokens * ys), 7), got(static_cast<size_t>(tokens * ys), 7);
  ref::gemm_s8s8_s32(x.data(), tokens, xs, w.data(), rows, k, want.data(), ys);
  const std::vector<int32_t> rs = int8_row_sums(w.data(), rows, k);
  gemm_s8s8_s32(x.data(), tokens, xs, w.data(), rows, k, pass_rowsum ? rs.data() : nullptr, got.data(), ys);
  ASSERT_EQ(got, want) << what << " kernel " << int8_gemm_kernel_name();
}

TEST_P(Int8GemmLevels, MatchesReferenceOnRandomShapes) {
  std::mt19937 rng(42);
  const int64_t ks[] = {1, 3, 15, 16, 17, 63, 64, 65, 127, 129, 200, 1001};
  for (int64_t k : ks)
    for (int64_t tokens : {1, 2, 3, 4, 5, 9})
      for (int64_t rows : {1, 3, 4, 5, 8, 13}) {
        const int64_t xs = k + static_cast<int64_t>(rng() % 3);
        const std::vector<int8_t> x = random_i8(static_cast<size_t>(tokens * xs), rng);
        const std::vector<int8_t> w = random_i8(static_cast<size_t>(rows * k), rng);
        check(x, tokens, xs, w, rows, k, (k + tokens) % 2 == 0,
              "k=" + std::to_string(k) + " tokens=" + std::to_string(tokens) + " rows=" + std::to_string(rows));
      }
}

// Against the exact product: meaningful at every level.
TEST_P(Int8GemmAllLevels, ExtremeOperandsAreExact) {
  const int64_t k = 4099, tokens = 5, rows = 6;
  for (int8_t xv : {int8_t{-128}, int8_t{127}})
    for (int8_t wv : {int8_t{-128}, int8_t{127}}) {
      const std::vector<int8_t> x(static_cast<size_t>(tokens * k), xv), w(static_cast<size_t>(rows * k), wv);
      std::vector<int32_t> y(static_cast<size_t>(tokens * rows));
      gemm_s8s8_s32(x.data(), tokens, k, w.data(), rows, k, nullptr, y.data(), rows);
      for (int32_t v : y) ASSERT_EQ(v, static_cast<int32_t>(xv) * wv * k) << int8_gemm_kernel_name();
    }
}

INSTANTIATE_TEST_SUITE_P(AllLevels, Int8GemmLevels, test::all_simd_levels(), test::simd_case_name);
INSTANTIATE_TEST_SUITE_P(AllLevels, Int8GemmAllLevels, test::all_simd_levels(), test::simd_case_name);

}  // namespace
}  // namespace qf::rt
