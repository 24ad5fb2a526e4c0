#include "eval/gate_bounds.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "core/error.h"

namespace qf::eval {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// The Usage message check_gate_bounds gives for g, or "" when it accepts g.
std::string problem(const Gate& g, const GateBoundNames& names = GateBoundNames::keywords()) {
  try {
    check_gate_bounds(g, names);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    return e.what();
  }
  return "";
}

TEST(GateBounds, NonFiniteBoundsAreRefusedNotTreatedAsNoBound) {
  for (double v : {kNan, kInf, -kInf}) {
    EXPECT_NE(problem(Gate{v, std::nullopt, std::nullopt}), "") << v;
    EXPECT_NE(problem(Gate{std::nullopt, v, std::nullopt}), "") << v;
    EXPECT_NE(problem(Gate{std::nullopt, std::nullopt, v}), "") << v;
  }
}

TEST(GateBounds, EachBoundHasItsRange) {
  EXPECT_EQ(problem(Gate{-3.5, 1.0, 0.0}), "");  // a negative delta demands an improvement
  EXPECT_EQ(problem(Gate{0.0, 1e-9, 1e-12}), "");
  EXPECT_EQ(problem(Gate{}), "");
  EXPECT_EQ(problem(Gate{std::nullopt, 0.0, std::nullopt}), "max_ppl_ratio: must be a finite number > 0, got '0'");
  EXPECT_EQ(problem(Gate{std::nullopt, -1.0, std::nullopt}), "max_ppl_ratio: must be a finite number > 0, got '-1'");
  EXPECT_EQ(problem(Gate{std::nullopt, std::nullopt, -0.5}), "max_kld: must be a finite number >= 0, got '-0.5'");
  EXPECT_EQ(problem(Gate{kNan, std::nullopt, std::nullopt}), "max_ppl_delta: must be a finite number, got 'nan'");
  EXPECT_EQ(problem(Gate{std::nullopt, std::nullopt, kInf}), "max_kld: must be a finite number >= 0, got 'inf'");
}

TEST(GateBounds, MessagesUseTheCallersNames) {
  EXPECT_EQ(problem(Gate{std::nullopt, std::nullopt, kNan}, GateBoundNames::flags()),
            "--max-kld: must be a finite number >= 0, got 'nan'");
}

TEST(GateBounds, RuleAndPredicateAgree) {
  EXPECT_TRUE(gate_bound_valid(GateBound::PplDelta, -1));
  EXPECT_FALSE(gate_bound_valid(GateBound::PplRatio, 0));
  EXPECT_TRUE(gate_bound_valid(GateBound::Kld, 0));
  EXPECT_FALSE(gate_bound_valid(GateBound::Kld, std::nextafter(0.0, -1.0)));
  EXPECT_EQ(gate_bound_rule(GateBound::PplRatio), "must be a finite number > 0");
}

}  // namespace
}  // namespace qf::eval
