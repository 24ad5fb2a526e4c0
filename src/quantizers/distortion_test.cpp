#include "quantizers/distortion.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "core/error.h"

namespace qf {
namespace {

TEST(Distortion, HandComputed) {
  Distortion d;
  d.add({3.0f, -4.0f}, {3.0f, -3.0f});  // errors 0 and 1; originals 9 + 16
  EXPECT_EQ(d.count(), 2u);
  EXPECT_DOUBLE_EQ(d.max_abs_error(), 1.0);
  EXPECT_DOUBLE_EQ(d.max_abs_original(), 4.0);
  EXPECT_DOUBLE_EQ(d.rmse(), std::sqrt(0.5));
  EXPECT_DOUBLE_EQ(d.relative_rmse(), 1.0 / 5.0);
  EXPECT_DOUBLE_EQ(d.snr_db(), 10 * std::log10(25.0));
  EXPECT_EQ(d.worst_bound_ratio(), 0.0);
  d.add(1.0, 1.25, 0.5);
  EXPECT_DOUBLE_EQ(d.worst_bound_ratio(), 0.5);
  EXPECT_NE(d.describe().find("n 3"), std::string::npos);
}

TEST(Distortion, ExactIsInfiniteSnrAndZeroError) {
  Distortion d;
  d.add({1.0f, 2.0f}, {1.0f, 2.0f});
  EXPECT_EQ(d.relative_rmse(), 0.0);
  EXPECT_TRUE(std::isinf(d.snr_db()));
}

// A measure that cannot be taken is NaN, so any bound check on it fails.
TEST(Distortion, FailsClosed) {
  Distortion none;
  EXPECT_FALSE(none.valid());
  EXPECT_TRUE(std::isnan(none.relative_rmse()));
  EXPECT_TRUE(std::isnan(none.max_abs_error()));
  EXPECT_FALSE(none.relative_rmse() < 1.0);

  Distortion bad;
  bad.add(1.0, std::numeric_limits<double>::quiet_NaN());
  bad.add(2.0, 2.0);
  EXPECT_EQ(bad.nonfinite(), 1u);
  EXPECT_FALSE(bad.valid());
  EXPECT_TRUE(std::isnan(bad.rmse()));
  EXPECT_TRUE(std::isnan(bad.worst_bound_ratio()));
  EXPECT_NE(bad.describe().find("non-finite"), std::string::npos);

  Distortion zeros;  // all-zero originals: no scale to be relative to
  zeros.add(0.0, 0.1);
  EXPECT_TRUE(std::isnan(zeros.relative_rmse()));
  EXPECT_DOUBLE_EQ(zeros.max_abs_error(), 0.1);

  Distortion d;
  EXPECT_THROW(d.add(std::vector<float>{1.0f}, std::vector<float>{}), Error);
}

}  // namespace
}  // namespace qf
