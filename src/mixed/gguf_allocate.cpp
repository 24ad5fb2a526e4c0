#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "calibration/imatrix_collect.h"
#include "core/error.h"
#include "mixed/gguf_search_internal.h"
#include "quantizers/mix_knapsack.h"

namespace qf::mixed::detail {
namespace {

// Tensor data bytes of the tensors that are not searched.
uint64_t fixed_bytes(const GgufMixPlan& plan) {
  uint64_t fixed = plan.fixed_extra_bytes;
  for (const GgufMixTensor& t : plan.tensors)
    if (!t.searched) fixed += t.candidates.front().bytes;
  return fixed;
}

// The smallest and largest tensor data the candidates allow.
std::pair<uint64_t, uint64_t> size_range(const GgufMixPlan& plan) {
  uint64_t smallest = fixed_bytes(plan), largest = smallest;
  for (const GgufMixTensor& t : plan.tensors) {
    if (!t.searched) continue;
    uint64_t lo = ~0ull, hi = 0;
    for (const GgufCandidate& o : t.candidates) lo = std::min(lo, o.bytes), hi = std::max(hi, o.bytes);
    smallest += lo, largest += hi;
  }
  return {smallest, largest};
}

}  // namespace

uint64_t budget_of(const GgufMixPlan& plan, const GgufMixOptions& opts) {
  if (opts.target_bpw.has_value() == opts.target_bytes.has_value())
    throw Error(ErrorKind::Usage, "a size budget needs exactly one of --target-bpw and --target-size");
  if (opts.target_bpw && !(*opts.target_bpw > 0 && std::isfinite(*opts.target_bpw)))
    throw Error(ErrorKind::Usage, "--target-bpw must be a positive number of bits per weight");
  return opts.target_bytes ? *opts.target_bytes
                           : static_cast<uint64_t>(std::floor(*opts.target_bpw * static_cast<double>(plan.parameters) / 8.0));
}

void check_budget(const GgufMixPlan& plan, uint64_t budget) {
  const uint64_t smallest = size_range(plan).first;
  const auto bpw = [&](uint64_t b) { return 8.0 * static_cast<double>(b) / static_cast<double>(plan.parameters); };
  if (budget < smallest) {
    char msg[256];
    std::snprintf(msg, sizeof msg, "the budget of %llu bytes (%.3f bits per weight) is below the smallest file the types allow: %llu bytes (%.3f bits per weight)",
                  static_cast<unsigned long long>(budget), bpw(budget), static_cast<unsigned long long>(smallest), bpw(smallest));
    throw Error(ErrorKind::InvalidInput, msg);
  }
}

// The exact allocation at `budget`, the curve and the Lagrangian answer.
void allocate(GgufMixPlan& plan, uint64_t budget) {
  check_budget(plan, budget);
  const auto t0 = std::chrono::steady_clock::now();
  plan.budget_bytes = budget;
  const uint64_t fixed = fixed_bytes(plan);
  const auto [smallest, largest] = size_range(plan);
  std::vector<Item> items;
  std::vector<size_t> item_tensor;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    if (!plan.tensors[i].searched) continue;
    Item it{plan.tensors[i].name, {}};
    for (const GgufCandidate& cd : plan.tensors[i].candidates) it.options.push_back({cd.bytes, cd.predicted_kl});
    items.push_back(std::move(it));
    item_tensor.push_back(i);
  }
  const uint64_t data_budget = budget - fixed;
  std::vector<uint64_t> budgets = {data_budget};
  constexpr int kCurvePoints = 48;
  for (int k = 0; k <= kCurvePoints; ++k) budgets.push_back(smallest - fixed + (largest - smallest) * static_cast<uint64_t>(k) / kCurvePoints);
  for (const GgufMixPoint& p : plan.presets)
    if (p.bytes >= smallest) budgets.push_back(p.bytes - fixed);
  const std::vector<Allocation> sol = solve_exact_curve(items, budgets);
  const Allocation& best = sol.front();
  for (size_t k = 0; k < items.size(); ++k) plan.tensors[item_tensor[k]].chosen = best.choice[k];
  plan.bytes = best.bytes + fixed;
  plan.predicted_kl = best.cost;
  plan.exact = best.exact;
  plan.unit = best.unit;
  for (size_t b = 1; b < sol.size(); ++b)
    if (sol[b].feasible) plan.curve.push_back({"", sol[b].bytes + fixed, sol[b].cost});
  std::sort(plan.curve.begin(), plan.curve.end(), [](const auto& x, const auto& y) { return x.bytes < y.bytes; });
  const Allocation lag = solve_lagrangian(items, data_budget);
  for (size_t k = 0; k < items.size(); ++k) plan.tensors[item_tensor[k]].lagrangian = lag.choice[k];
  plan.lagrangian_bytes = lag.bytes + fixed;
  plan.lagrangian_kl = lag.cost;
  plan.seconds_solve = seconds_since(t0);
}

Imatrix read_or_compute_imatrix(const rt::Model& model, const Tokenizer& tok, const std::string& text,
                                const GgufMixOptions& opts, ThreadPool& pool) {
  if (!opts.imatrix.empty()) return read_imatrix(opts.imatrix);
  ImatrixOptions io;
  io.ctx = opts.ctx;
  io.max_chunks = opts.imatrix_chunks;
  io.dataset = opts.calib_text.string();
  return compute_imatrix(model, tok, text, io, pool, [&](int64_t d, int64_t n) {
    if (opts.progress) opts.progress("imatrix", d, n);
  });
}

}  // namespace qf::mixed::detail
