// Refusing non-finite weights before work that would turn them into
// meaningless outputs (quantize, imatrix), and invalidating a measurement
// (eval): one NaN in a weight makes every later activation NaN, a NaN scale
// or statistic silently poisons a file, and a NaN router hides itself (top-k
// never picks a NaN score, so the logits stay finite).
#pragma once

#include <string>

#include "core/thread_pool.h"
#include "runtime/model.h"

namespace qf::rt {

// The first weight of `m` (embeddings, every Linear decoded row by row,
// MoE routers and every expert included, the norms, the biases) that is NaN
// or infinite, described as
// "model.layers.3.mlp.down_proj.weight [17, 5] is nan", or "" when all are
// finite. Quantized weights are decoded, so a NaN block scale is found too.
// `release`: each Linear's mapped pages are given back after it is checked
// (Linear::release_pages), so that checking a mapped model does not make
// all of it resident (quantize keeps one layer at a time).
std::string find_nonfinite_weight(const Model& m, ThreadPool& pool, bool release = false);

}  // namespace qf::rt
