// The value half of attention over a packed KV cache: out_j += sum_p w_j[p]
// decode(V[p]) for the nq query heads sharing a KV head, each stored vector
// decoded once (into registers at the AVX2 level and up) for all of them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/kv_format.h"

namespace qf::rt {

// n vectors of type t (head_dim values each) stored `stride` bytes apart;
// weights w[j * w_stride + p]; outputs out[j * head_dim + d]. `param` as
// kv_decode's. AVX2 kernels for f16, NVFP4 and llama.cpp's block types, the same
// sums as decoding then axpy up to FMA rounding; other types decode each
// vector and use axpy.
void kv_value_sum(KvDType t, const uint8_t* v, size_t stride, int64_t n, int64_t head_dim, float param,
                  const float* w, int64_t w_stride, int nq, float* out);

// NVFP4 keys (head_dim a multiple of 32) against nq f32 queries q[j *
// head_dim ...]: out[j * out_stride + p] = q_j . decode(key p), each key
// decoded once into registers. False when the SIMD level has no kernel.
bool kv_nvfp4_scores(const uint8_t* keys, size_t stride, int64_t n, int64_t head_dim, float global_scale,
                     const float* q, int nq, float* out, int64_t out_stride);

}  // namespace qf::rt
