// Causal self-attention of one sequence on the device, for device sources
// (see device/exec.h): scores by strided batched GEMM, one batch per key/value
// head with the query heads that share it (the key matrix at stride 0), a
// causal (optionally sliding-window) softmax whose columns are spread over
// lanes (device/rows.h), and
// the values weighted by a second batched GEMM. The building block of the
// device decoder layer; runtime/device_runtime.h has the host-pointer form.
#pragma once

#include <cstdint>

#include "device/blas.h"
#include "device/exec.h"

namespace qf::QF_DEV_NS {

// k and v: [nk, kv_heads * hd], the keys and values of positions 0..nk-1;
// q: [nq, heads * hd], the queries of the last nq of them (query t at
// position p = nk - nq + t; nq == nk is a prefill, nq == 1 a decode step);
// out: [nq, heads * hd]. All row-major device arrays. Query head h reads
// key/value head h / (heads / kv_heads). window > 0: query p sees keys
// [p - window + 1, p], else [0, p]. `scores` grows to hold at least
// heads / kv_heads * nq * (nk + kLanes + 1) floats (the scores and the
// softmax's partial results).
void causal_attention(Blas& blas, const float* q, const float* k, const float* v, float* out, int64_t nq, int64_t nk,
                      int64_t heads, int64_t kv_heads, int64_t hd, int64_t window, dvec<float>& scores);

}  // namespace qf::QF_DEV_NS
