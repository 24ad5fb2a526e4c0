#include "core/simd.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/error.h"
#include "simd_level_fixture.h"
#include "test_util.h"

namespace qf {
namespace {

TEST(Simd, ParsesExactlyTheFourLevelNames) {
  EXPECT_EQ(parse_simd_level("scalar"), SimdLevel::Scalar);
  EXPECT_EQ(parse_simd_level("avx2"), SimdLevel::Avx2);
  EXPECT_EQ(parse_simd_level("avx512"), SimdLevel::Avx512);
  EXPECT_EQ(parse_simd_level("amx"), SimdLevel::Amx);
  for (const char* bad : {"avx3", "AVX2", "avx2 ", " avx2", "avx", "sse", "avx512f", "none", "0", "auto", "AMX", "amx-bf16"}) {
    SCOPED_TRACE(bad);
    EXPECT_QF_ERROR(parse_simd_level(bad), ErrorKind::Usage, "(allowed: scalar|avx2|avx512|amx)");
    EXPECT_QF_ERROR(parse_simd_level(bad), ErrorKind::Usage, std::string("'") + bad + "'");
  }
  // One line whatever the value holds.
  try {
    parse_simd_level("avx2\nscalar");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
}

TEST(Simd, LevelNames) {
  for (SimdLevel l : {SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512, SimdLevel::Amx})
    EXPECT_EQ(parse_simd_level(simd_level_name(l)), l);
}

// QF_SIMD unset or empty: the CPU's best; a level above it: clamped (and
// said so: simd_level() prints one note); an unknown value: a usage error.
TEST(Simd, InitialLevelFromQfSimd) {
  const SimdLevel levels[] = {SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512, SimdLevel::Amx};
  for (SimdLevel best : levels) {
    bool clamped = true;
    EXPECT_EQ(initial_simd_level(nullptr, best, &clamped), best);
    EXPECT_FALSE(clamped);
    EXPECT_EQ(initial_simd_level("", best, &clamped), best);
    EXPECT_FALSE(clamped);
    for (SimdLevel want : levels) {
      EXPECT_EQ(initial_simd_level(simd_level_name(want), best, &clamped), std::min(want, best));
      EXPECT_EQ(clamped, want > best) << simd_level_name(want) << " on " << simd_level_name(best);
    }
    EXPECT_QF_ERROR(initial_simd_level("avx3", best), ErrorKind::Usage, "allowed: scalar|avx2|avx512|amx");
  }
}

// set_simd_level takes effect at once and never goes above the CPU.
TEST(Simd, SetLevelIsClampedToTheCpu) {
  test::ScopedSimdLevel restore(simd_level());
  for (SimdLevel l : {SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512, SimdLevel::Amx}) {
    set_simd_level(l);
    EXPECT_EQ(simd_level(), std::min(l, best_simd_level())) << simd_level_name(l);
  }
}

// The level a test run starts at is what QF_SIMD asks for (clamped to the
// CPU), or the CPU's best: the CI passes at QF_SIMD=avx2 and scalar rely on it.
// (Tests that change the level restore it.)
TEST(Simd, StartsAtTheLevelQfSimdNames) {
  const char* env = std::getenv("QF_SIMD");
  const SimdLevel want = initial_simd_level(env, best_simd_level());
  EXPECT_EQ(simd_level(), want) << "QF_SIMD=" << (env ? env : "(unset)");
  std::printf("SIMD level in use: %s (QF_SIMD=%s, best on this CPU: %s)\n", simd_level_name(simd_level()),
              env ? env : "unset", simd_level_name(best_simd_level()));
}

}  // namespace
}  // namespace qf
