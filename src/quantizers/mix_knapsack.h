// The allocation problem of a size budget: every item (a tensor, or a set of
// Linears that must share one format) takes exactly one of its options, each
// with a size in bytes and a cost (the predicted KL divergence it adds); the
// sum of the chosen sizes must not exceed the budget and the sum of the costs
// is to be as small as possible. This is the multiple-choice knapsack problem.
//
// solve_exact finds the optimum by dynamic programming over bytes: sizes are
// first reduced to each item's smallest option (subtracted from the budget)
// and expressed in units of the greatest common divisor of the remaining
// differences, so the answer is exact. When the table would exceed
// `max_cells`, the unit is coarsened and every size rounded *up* to it: the
// answer then still fits the budget (never over it) and `exact` is false;
// `unit` says how coarse it was.
//
// solve_lagrangian is the usual shortcut (llama.cpp's proposed --target-bpw,
// Model Optimizer's search): for a multiplier lambda every item takes the
// option minimising cost + lambda * bytes, and lambda is bisected to the
// smallest value whose choice fits. It only reaches points on the lower
// convex hull of each item's options, so it can leave budget unused; its
// answer is reported next to the exact one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qf::mixed {

struct Option {
  uint64_t bytes = 0;
  double cost = 0;  // finite, >= 0
};

struct Item {
  std::string name;
  std::vector<Option> options;  // at least one
};

struct Allocation {
  bool feasible = false;     // false: even the smallest options exceed the budget
  std::vector<int> choice;   // option index per item
  uint64_t bytes = 0;        // sum of the chosen sizes (exact, not rounded)
  double cost = 0;           // sum of the chosen costs
  bool exact = true;         // solve_exact: the unit was the exact gcd
  uint64_t unit = 1;         // solve_exact: bytes per table column
  double lambda = 0;         // solve_lagrangian: the multiplier found
};

// Sizes that fit `budget` bytes at least cost. InvalidInput for an item with
// no option or a negative / non-finite cost (naming the item).
Allocation solve_exact(const std::vector<Item>& items, uint64_t budget, uint64_t max_cells = uint64_t{1} << 27);

Allocation solve_lagrangian(const std::vector<Item>& items, uint64_t budget);

// The least total cost at each of `budgets` (one DP pass serves them all):
// the searched mixes' size-versus-cost curve. Entries for infeasible budgets
// have feasible = false.
std::vector<Allocation> solve_exact_curve(const std::vector<Item>& items, const std::vector<uint64_t>& budgets,
                                          uint64_t max_cells = uint64_t{1} << 27);

// Spearman's rank correlation of two equally long samples (average ranks for
// ties); NaN when either has fewer than 2 values or no spread.
double rank_correlation(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace qf::mixed
