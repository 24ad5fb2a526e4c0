#include "quantizers/mix_knapsack.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "core/error.h"

namespace qf::mixed {
namespace {

// Every combination, for small instances: the optimum the DP must find.
Allocation brute_force(const std::vector<Item>& items, uint64_t budget) {
  Allocation best;
  best.cost = std::numeric_limits<double>::infinity();
  std::vector<int> c(items.size(), 0);
  while (true) {
    uint64_t bytes = 0;
    double cost = 0;
    for (size_t i = 0; i < items.size(); ++i) bytes += items[i].options[c[i]].bytes, cost += items[i].options[c[i]].cost;
    if (bytes <= budget && cost < best.cost) best.cost = cost, best.bytes = bytes, best.choice = c, best.feasible = true;
    size_t i = 0;
    while (i < items.size() && ++c[i] == static_cast<int>(items[i].options.size())) c[i++] = 0;
    if (i == items.size()) break;
  }
  return best;
}

std::vector<Item> random_items(std::mt19937& rng, int n, int k) {
  std::uniform_int_distribution<int> size(1, 40);
  std::uniform_real_distribution<double> cost(0, 1);
  std::vector<Item> items(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    for (int o = 0; o < k; ++o) items[static_cast<size_t>(i)].options.push_back({static_cast<uint64_t>(6 * size(rng)), cost(rng)});
  return items;
}

TEST(MixKnapsack, ExactEqualsBruteForceAndLagrangianNeverBeatsIt) {
  std::mt19937 rng(7);
  int lagrangian_worse = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const std::vector<Item> items = random_items(rng, 5, 4);
    uint64_t lo = 0, hi = 0;
    for (const Item& it : items) {
      uint64_t mn = ~0ull, mx = 0;
      for (const Option& o : it.options) mn = std::min(mn, o.bytes), mx = std::max(mx, o.bytes);
      lo += mn, hi += mx;
    }
    const uint64_t budget = lo + (hi - lo) * static_cast<uint64_t>(trial % 10) / 10;
    const Allocation want = brute_force(items, budget);
    const Allocation got = solve_exact(items, budget);
    ASSERT_TRUE(got.feasible);
    EXPECT_TRUE(got.exact);
    EXPECT_LE(got.bytes, budget);
    EXPECT_NEAR(got.cost, want.cost, 1e-12) << "trial " << trial;
    const Allocation lag = solve_lagrangian(items, budget);
    ASSERT_TRUE(lag.feasible);
    EXPECT_LE(lag.bytes, budget);
    EXPECT_GE(lag.cost, want.cost - 1e-12);
    lagrangian_worse += lag.cost > want.cost + 1e-12;
  }
  // The hull-only shortcut misses some optima (otherwise this test proves nothing about it).
  EXPECT_GT(lagrangian_worse, 0);
}

TEST(MixKnapsack, CurveMatchesOneSolvePerBudget) {
  std::mt19937 rng(11);
  const std::vector<Item> items = random_items(rng, 8, 5);
  std::vector<uint64_t> budgets;
  for (uint64_t b = 0; b < 2000; b += 37) budgets.push_back(b);
  const std::vector<Allocation> curve = solve_exact_curve(items, budgets);
  for (size_t i = 0; i < budgets.size(); ++i) {
    const Allocation one = solve_exact(items, budgets[i]);
    EXPECT_EQ(curve[i].feasible, one.feasible);
    if (one.feasible) EXPECT_DOUBLE_EQ(curve[i].cost, one.cost);
    if (i > 0 && curve[i - 1].feasible) EXPECT_LE(curve[i].cost, curve[i - 1].cost);
  }
}

TEST(MixKnapsack, CoarseTableStillFitsTheBudget) {
  std::mt19937 rng(3);
  const std::vector<Item> items = random_items(rng, 6, 4);
  int coarsened = 0;
  for (uint64_t budget = 100; budget < 1400; budget += 53) {
    const Allocation fine = solve_exact(items, budget);
    const Allocation coarse = solve_exact(items, budget, 6 * 8);  // 8 columns
    if (!fine.feasible) continue;
    EXPECT_EQ(coarse.exact, coarse.unit == 6u);
    coarsened += !coarse.exact;
    if (coarse.feasible) {
      EXPECT_LE(coarse.bytes, budget);
      EXPECT_GE(coarse.cost, fine.cost - 1e-12);
    }
  }
  EXPECT_GT(coarsened, 5);
}

TEST(MixKnapsack, InfeasibleBudgetAndBadItems) {
  const std::vector<Item> items = {{"a", {{10, 1.0}, {20, 0.5}}}, {"b", {{30, 2.0}}}};
  EXPECT_FALSE(solve_exact(items, 39).feasible);
  EXPECT_FALSE(solve_lagrangian(items, 39).feasible);
  const Allocation a = solve_exact(items, 40);
  EXPECT_TRUE(a.feasible);
  EXPECT_EQ(a.choice, (std::vector<int>{0, 0}));
  EXPECT_EQ(solve_exact(items, 50).choice, (std::vector<int>{1, 0}));
  EXPECT_THROW(solve_exact({{"x", {}}}, 10), Error);
  EXPECT_THROW(solve_exact({{"x", {{1, std::nan("")}}}}, 10), Error);
  EXPECT_THROW(solve_lagrangian({{"x", {{1, -1.0}}}}, 10), Error);
}

TEST(MixKnapsack, RankCorrelation) {
  EXPECT_DOUBLE_EQ(rank_correlation({1, 2, 3, 4}, {10, 20, 30, 40}), 1.0);
  EXPECT_DOUBLE_EQ(rank_correlation({1, 2, 3, 4}, {4, 3, 2, 1}), -1.0);
  EXPECT_NEAR(rank_correlation({1, 2, 3, 4, 5}, {2, 1, 4, 3, 5}), 0.8, 1e-12);
  EXPECT_TRUE(std::isnan(rank_correlation({1, 1, 1}, {1, 2, 3})));
  EXPECT_TRUE(std::isnan(rank_correlation({1}, {1})));
}

}  // namespace
}  // namespace qf::mixed
