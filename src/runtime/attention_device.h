// Causal self-attention of one sequence on the device, for device sources
// (see device/exec.h): scores by strided batched GEMM, one batch per key/value
// head with the query heads that share it (the key matrix at stride 0), a
// causal (optionally sliding-window) softmax functor per (head, query), and
// the values weighted by a second batched GEMM. The building block of the
// device decoder layer; runtime/device_runtime.h has the host-pointer form.
#pragma once

#include <cstdint>

#include "device/blas.h"
#include "device/exec.h"

namespace qf::QF_DEV_NS {

// q: [n, heads * hd], k and v: [n, kv_heads * hd], out: [n, heads * hd],
// all row-major device arrays; token t at position t. Query head h reads
// key/value head h / (heads / kv_heads). window > 0: query t sees keys
// [t - window + 1, t], else [0, t]. `scores` is resized to
// heads / kv_heads * n * n floats.
void attention_prefill(Blas& blas, const float* q, const float* k, const float* v, float* out, int64_t n, int64_t heads,
                       int64_t kv_heads, int64_t hd, int64_t window, dvec<float>& scores);

}  // namespace qf::QF_DEV_NS
