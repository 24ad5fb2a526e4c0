// measure_peak_flops: one entry per kind at every level the CPU has, each a
// positive finite rate, and the vector levels above the scalar one (an
// 8-wide FMA does at least 4 times the work of the scalar multiply and add
// per instruction; a factor of 2 leaves room for a busy machine).
#include "core/peak_flops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "core/simd.h"
#include "core/thread_pool.h"

namespace qf {
namespace {

TEST(PeakFlops, EveryKindAtEveryLevelTheCpuHasAndVectorsAboveScalar) {
  ThreadPool pool(1);
  const std::vector<PeakFlops> peaks = measure_peak_flops(pool);
  std::map<std::string, double> got;
  for (const PeakFlops& p : peaks) {
    EXPECT_TRUE(std::isfinite(p.gflops) && p.gflops > 0) << simd_level_name(p.level) << " " << p.kind;
    got[std::string(simd_level_name(p.level)) + " " + p.kind] = p.gflops;
  }
  const SimdLevel best = best_simd_level();
  std::vector<std::string> want = {"scalar f64"};
  if (best >= SimdLevel::Avx2) want.insert(want.end(), {"avx2 f32", "avx2 f64"});
  if (best >= SimdLevel::Avx512) want.insert(want.end(), {"avx512 f32", "avx512 f64"});
  if (best >= SimdLevel::Avx512 && cpu_has_avx512_bf16()) want.push_back("avx512 bf16");
  EXPECT_EQ(got.size(), want.size());
  for (const std::string& k : want) EXPECT_EQ(got.count(k), 1u) << k;
  if (best >= SimdLevel::Avx2) {
    EXPECT_GT(got["avx2 f64"], 2 * got["scalar f64"]);
  }
}

}  // namespace
}  // namespace qf
