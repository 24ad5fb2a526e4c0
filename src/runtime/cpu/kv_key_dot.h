// The key half of attention over llama.cpp's block types at the AVX2 level:
// each key's blocks unpacked once to signed bytes and multiplied with the nq
// queries, already quantized to Q8_0 (Q8_1 for q4_1), as integer dot
// products. The same floats as kquants::vec_dot for a head of 32 (one block;
// for more blocks the per-block terms are summed in order).
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/kv_format.h"

namespace qf::rt {

// out[j * out_stride + p] for n keys stored `stride` bytes apart; the
// queries' activation rows qa + j * qa_row. False (nothing written) when the
// type or the SIMD level has no such kernel.
bool kv_key_scores_simd(KvDType t, const uint8_t* keys, size_t stride, int64_t n, int64_t head_dim, const uint8_t* qa,
                        size_t qa_row, int nq, float* out, int64_t out_stride);

}  // namespace qf::rt
