// Test helpers for the SIMD switch (core/simd.h).
//
// SimdLevelFixture: a parameterised fixture that runs each test at one SIMD
// level and restores the previous level after. A level the CPU lacks is
// skipped with a message (set_simd_level would clamp it, and the case would
// silently test a lower level).
//
// SimdVsScalarFixture: the same, for tests that compare a kernel with its
// scalar reference. At the scalar level both sides are the same code, so
// that case is skipped with a message instead of passing without testing
// anything.
//
// ScopedSimdLevel: sets a level for a scope and restores the previous one.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "core/simd.h"

namespace qf::test {

class ScopedSimdLevel {
 public:
  explicit ScopedSimdLevel(SimdLevel level) : saved_(simd_level()) { set_simd_level(level); }
  ~ScopedSimdLevel() { set_simd_level(saved_); }
  ScopedSimdLevel(const ScopedSimdLevel&) = delete;
  ScopedSimdLevel& operator=(const ScopedSimdLevel&) = delete;

 private:
  SimdLevel saved_;
};

class SimdLevelFixture : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override {
    if (GetParam() > best_simd_level())
      GTEST_SKIP() << simd_level_name(GetParam()) << " is not available on this CPU (best: "
                   << simd_level_name(best_simd_level()) << ")";
    saved_ = simd_level();
    set_simd_level(GetParam());
    active_ = true;
  }
  void TearDown() override {
    if (active_) set_simd_level(saved_);
  }

 private:
  SimdLevel saved_ = SimdLevel::Scalar;
  bool active_ = false;
};

class SimdVsScalarFixture : public SimdLevelFixture {
 protected:
  void SetUp() override {
    SimdLevelFixture::SetUp();
    if (IsSkipped()) return;
    if (GetParam() == SimdLevel::Scalar)
      GTEST_SKIP() << "compares SIMD kernels with the scalar reference: at the scalar level both are the scalar code";
  }
};

// Every level, for INSTANTIATE_TEST_SUITE_P; cases are named after the level.
inline auto all_simd_levels() {
  return ::testing::Values(SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512, SimdLevel::Amx);
}
inline std::string simd_case_name(const ::testing::TestParamInfo<SimdLevel>& info) {
  return simd_level_name(info.param);
}

}  // namespace qf::test
