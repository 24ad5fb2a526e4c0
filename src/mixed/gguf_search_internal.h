// What the GGUF search's files share (not part of the interface).
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>
#include <string>

#include "formats/gguf/imatrix.h"
#include "formats/tokenizer/tokenizer.h"
#include "mixed/gguf_search.h"
#include "runtime/model.h"

namespace qf::mixed::detail {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A tensor's elements from its ne.
inline uint64_t elements(const std::vector<int64_t>& ne) {
  uint64_t n = 1;
  for (int64_t x : ne) n *= static_cast<uint64_t>(x);
  return n;
}

// plan.imatrix for an imatrix computed from a text: this, then the text's path.
inline const std::string kComputedFrom = "computed from ";

// opts.imatrix read, or an imatrix computed over `text` (opts.ctx, opts.imatrix_chunks).
Imatrix read_or_compute_imatrix(const rt::Model& model, const Tokenizer& tok, const std::string& text,
                                const GgufMixOptions& opts, ThreadPool& pool);

// The tensor data bytes a target allows (Usage errors for a bad target).
uint64_t budget_of(const GgufMixPlan& plan, const GgufMixOptions& opts);
// InvalidInput when even the smallest candidates exceed the budget.
void check_budget(const GgufMixPlan& plan, uint64_t budget);
// The exact allocation at `budget` (tensors' `chosen`, totals), the curve over
// the size range and the presets' sizes, and the Lagrangian answer.
void allocate(GgufMixPlan& plan, uint64_t budget);

}  // namespace qf::mixed::detail
