// The values an evaluation gate's bounds may take, checked in one place for
// the CLI's flags and the Python module's keyword arguments: a NaN or an
// infinite bound would compare false against every measurement and so pass
// every model, which is never what the caller meant.
#pragma once

#include <string>

#include "eval/perplexity.h"

namespace qf::eval {

enum class GateBound { PplDelta, PplRatio, Kld };

// What a bound must be, as messages say it ("must be a finite number > 0"):
// max_ppl_delta any finite number, max_ppl_ratio finite and > 0, max_kld
// finite and >= 0.
std::string gate_bound_rule(GateBound b);
bool gate_bound_valid(GateBound b, double v);

// How the caller's user spells each bound in messages.
struct GateBoundNames {
  std::string max_ppl_delta, max_ppl_ratio, max_kld;
  static GateBoundNames keywords() { return {"max_ppl_delta", "max_ppl_ratio", "max_kld"}; }
  static GateBoundNames flags() { return {"--max-ppl-delta", "--max-ppl-ratio", "--max-kld"}; }
};

// Usage error "NAME: must be a finite number ..., got 'VALUE'" for the first
// bound of `g` that is set and invalid; returns when every bound is valid.
void check_gate_bounds(const Gate& g, const GateBoundNames& names = GateBoundNames::keywords());

}  // namespace qf::eval
