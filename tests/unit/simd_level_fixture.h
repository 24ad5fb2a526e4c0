// A parameterised test fixture that runs each test at one SIMD level
// (skipped when the CPU lacks it) and restores the previous level after.
#pragma once

#include <gtest/gtest.h>

#include "runtime/cpu/kernels.h"

namespace qf::test {

class SimdLevelFixture : public ::testing::TestWithParam<rt::SimdLevel> {
 protected:
  void SetUp() override {
    if (GetParam() > rt::best_simd_level()) GTEST_SKIP() << rt::simd_level_name(GetParam()) << " is not available on this CPU";
    saved_ = rt::simd_level();
    rt::set_simd_level(GetParam());
  }
  void TearDown() override { rt::set_simd_level(saved_); }
  rt::SimdLevel saved_ = rt::SimdLevel::Scalar;
};

}  // namespace qf::test
