// One head vector of the KV cache (head_dim values) <-> its stored bytes, for
// every per-vector element type of kv_format.h (KIVI's keys, grouped over 32
// tokens, are the cache's: kv_cache.cpp), and the two products attention needs, computed
// from the stored bytes: a key's dot product with a query and a value's
// weighted accumulation into an output.
//
// Layouts (bytes per vector; docs/kv-cache.md has the sources):
//   f16      head_dim x IEEE half
//   f8       head_dim x e4m3 of x / scale, scale per (layer, head) held by
//            the cache (`param`)
//   int8     f32 absmax/127, then head_dim x int8
//   q8_0 .. iq4_nl  head_dim / 32 ggml blocks, bytes of ggml's row converter
//   nvfp4    head_dim / 2 bytes of e2m1 codes (element 2i in the low nibble),
//            then head_dim / 16 e4m3 block scales; global scale `param`
//   kivi2/4  head_dim x b bits (element i at bit b*i, little-endian), then
//            (values) per 32 channels an f16 scale and an f16 minimum, or
//            (keys, per channel over 32 tokens) the pairs of head_dim / 32
//            channels: position r of a group holds channels [r, r + 1) * hd/32
//   tq_k8    head_dim x e4m3 of x itself (vLLM's FP8 keys carry no scale)
//   tq_k4_nc/tq_k3_nc  Lloyd-Max indices of the Hadamard-rotated unit vector
//            (4 bits: two per byte, low nibble first; 3 bits: 8 per 3 bytes,
//            little-endian), then the f16 norm
//   tq_v4/v3 uniform codes (packed as the keys'), then f16 scale and f16 min
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/kv_format.h"

namespace qf::rt {

// Bytes one head vector takes (KIVI keys: the per-token share of a 32-token
// group: codes plus 1/32 of the group's per-channel scale and minimum).
size_t kv_vector_bytes(KvDType t, int64_t head_dim);

// Encodes x[head_dim] (in the cache's basis: rotated where the type rotates,
// see kv_rotate_in) into dst[kv_vector_bytes]; `param` is f8's scale or
// nvfp4's global scale (1 otherwise).
void kv_encode(KvDType t, const float* x, int64_t head_dim, float param, uint8_t* dst);
// Decodes into out[head_dim], in the cache's basis.
void kv_decode(KvDType t, const uint8_t* src, int64_t head_dim, float param, float* out);

// Whether a type stores vectors rotated by the orthonormal Hadamard
// transform H (TurboQuant's MSE keys always; the others when the format asks).
bool kv_type_rotates(KvDType t);
// x <- H x (H/sqrt(n), Sylvester order; H is symmetric and its own inverse).
void hadamard_inplace(float* x, int64_t n);

// nq queries (q[j * head_dim ...]) prepared once for many keys of one type:
// dot(j, key) = q_j . decode(key). llama.cpp's block types take the query in
// the block type's activation type (Q8_0 or Q8_1) and integer dots, as its
// attention does; TurboQuant's keys the rotated query against the centroids.
class KvKeyDot {
 public:
  KvKeyDot(KvDType t, const float* q, int nq, int64_t head_dim, float param);
  // Scores of n keys stored `stride` bytes apart: out[j * out_stride + p].
  void scores(const uint8_t* keys, int64_t n, size_t stride, float* out, int64_t out_stride) const;

 private:
  KvDType t_;
  int nq_;
  int64_t hd_;
  float param_;
  const float* q_;
  std::vector<uint8_t> qa_;  // the queries in the block type's activation type
  size_t qa_row_ = 0;
  std::vector<float> qf_;    // the rotated queries (TurboQuant keys)
  uint32_t ggml_ = 0;
};

// Decodes one vector (as kv_decode), by a function chosen once per type.
using KvDecodeFn = void (*)(const uint8_t* src, int64_t head_dim, float param, float* out);
KvDecodeFn kv_decoder(KvDType t);

// KIVI's quantizer over n f16 values x[i * stride] (KIVI computes in f16):
// minimum and scale (max - min) / (2^bits - 1), each rounded to f16 as
// computed, codes round-half-even(clamp((x - min) / scale)), all 0 for a
// constant group (where KIVI's division by zero would give NaN).
void kivi_quantize(const float* x, int64_t stride, int64_t n, int bits, uint8_t* codes, uint16_t* scale, uint16_t* min);
// bits-wide codes packed little-endian (element i at bit bits * i), and all
// of them back.
void pack_kv_codes(const uint8_t* q, int64_t n, int bits, uint8_t* dst);
void unpack_kv_codes(const uint8_t* src, int64_t n, int bits, uint8_t* q);

// The TurboQuant Lloyd-Max centroids for N(0, 1/d) at `bits` (vLLM's solver:
// 200 iterations at most, tolerance 1e-10, trapezoid integrals of 200 steps),
// ascending, as f32; and the midpoints the encoder compares against.
const std::vector<float>& turboquant_centroids(int64_t d, int bits);
const std::vector<float>& turboquant_midpoints(int64_t d, int bits);

}  // namespace qf::rt
