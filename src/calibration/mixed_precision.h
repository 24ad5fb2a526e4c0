// Mixed precision to a size budget for the compressed-tensors export (a
// recipe's `mixed_precision:` section; docs/mixed-precision.md): every
// Linear the quantizer targets takes one of the section's schemes, chosen so
// that the predicted KL divergence of the whole model is least while the
// stored bytes fit the budget.
//
// Items: the sets of Linears vLLM loads as one (fused) module must share a
// scheme, so they are chosen together: per layer {q, k, v} (qkv_proj),
// {o}, {gate, up} (gate_up_proj), {down}; in a sparse layer every routed
// expert's gate, up and down (one FusedMoE, whose compressed-tensors method
// vLLM picks once for the layer), and the shared expert's {gate, up} and
// {down}. Only targeted, not ignored Linears are members.
//
// Model: the KL divergence of a mix is the sum of its items' terms (HIGGS's
// linearity), each term proportional to the item's input-weighted squared
// weight error:
//   proxy(item, s) = sum over members, rows i, columns j of E[x_j^2] (w_ij - q_s(w)_ij)^2
// with E[x_j^2] the member's input second moment over the probe windows and
// q_s round-to-nearest in scheme s. The factor of each item is measured:
// the runtime's KL divergence (eval::evaluate against the unquantized model,
// on the probe windows) with only that item quantized in the probe scheme
// (the candidate with the fewest bytes), over its proxy. Predicted
// KL(item, s) = factor * proxy(item, s).
//
// Allocation: the multiple-choice knapsack over exact stored bytes
// (compressed_tensors_linear_bytes: what the export writes), solved exactly
// (quantizers/mix_knapsack.h); the Lagrangian answer is reported beside it.
// The chosen schemes become the quantizer's groups, one per scheme, whose
// targets are anchored regexes of exactly their modules' names.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/thread_pool.h"
#include "quantizers/mix_knapsack.h"
#include "recipe/recipe.h"
#include "runtime/model.h"

namespace qf {

// One set of Linears that takes one scheme.
struct MixedItem {
  std::string name;                  // "model.layers.0.self_attn.qkv_proj", ".mlp.gate_up_proj", ".mlp.experts", ...
  int64_t layer = 0;
  std::vector<rt::LayerLinearId> ids;
  std::vector<std::string> modules;  // full module names, in forward order
  uint64_t weights = 0;              // rows * cols over the members
};

// The fused sets of the Linears `quantizer` targets and does not ignore, in
// forward order (layer by layer).
std::vector<MixedItem> mixed_items(const rt::Model& model, const ModifierSpec& quantizer);

// The Linears' stored bytes in each preset (the model's scale dtype where
// the preset names none): per item, per scheme.
std::vector<std::vector<uint64_t>> mixed_item_bytes(const rt::Model& model, const std::vector<MixedItem>& items,
                                                    const std::vector<std::string>& schemes);

// The anchored "re:" target that matches exactly the item's modules:
// "re:^model\.layers\.0\.self_attn\.(q|k|v)_proj$".
std::string mixed_item_target(const MixedItem& item);

// The quantizer's groups for a choice (scheme index per item): one per
// scheme chosen at least once, in `schemes` order, named group_0, ...;
// an UNQUANTIZED group claims its modules without weights (left in full
// precision, and listed in the export's ignore).
std::vector<ModifierSpec::Group> mixed_groups(const std::vector<MixedItem>& items, const std::vector<std::string>& schemes,
                                              const std::vector<std::string>& scheme_where, const std::vector<int>& choice);

// Checks the rewritten quantizer against the items: every member is matched
// by the targets of exactly one group, scheme_for gives it the scheme its
// item chose, and no other decoder Linear is quantized. Internal error
// naming the module otherwise.
void check_mixed_groups(const rt::Model& model, const ModifierSpec& quantizer, const std::vector<MixedItem>& items,
                        const std::vector<std::string>& schemes, const std::vector<int>& choice);

struct MixedPrecisionResult {
  std::vector<std::string> schemes;
  std::vector<MixedItem> items;
  std::vector<mixed::Item> options;      // per item: bytes and predicted KL of each scheme
  std::vector<std::vector<double>> proxy;  // per item, per scheme
  // The probes: per item, the scheme probed (-1: not probed, the median
  // factor was used), the KL divergence measured with only it quantized,
  // and the factor KL / proxy.
  std::vector<int> probe_scheme;
  std::vector<double> probe_kl, factor;
  int64_t probe_windows = 0, probe_tokens = 0;
  uint64_t weights = 0;  // targeted weights
  uint64_t budget = 0;   // bytes
  mixed::Allocation exact, lagrangian;
  std::vector<ModifierSpec::Group> groups;  // the quantizer's new groups
  double seconds = 0;

  // quantization_report.json's "mixed_precision".
  nlohmann::ordered_json json(const MixedPrecisionSpec& spec) const;
  // The allocation as --dry-run prints it: item, scheme, bytes, predicted KL
  // and its share, then the totals.
  std::string table() const;
};

// The search. `windows`: calibration token windows (the first
// spec.probe_samples are used). InvalidInput at the budget's position when
// even the smallest schemes exceed it, or naming the recipe when the
// quantizer targets no Linear.
MixedPrecisionResult search_mixed_precision(const rt::Model& model, const ModifierSpec& quantizer,
                                            const MixedPrecisionSpec& spec, const std::vector<std::vector<int32_t>>& windows,
                                            ThreadPool& pool, const std::function<void(const std::string&)>& log);

}  // namespace qf
