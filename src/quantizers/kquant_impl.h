// Internals of the GGUF block types (kquants.h is the interface). Each type,
// or family of types that share their code, has one file that holds its
// quantization (plain and importance-weighted), its scalar reference dot
// product and its AVX2 dot product, so the three can be read together:
//   kquant_legacy.cpp   Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 (32-element blocks)
//   kquant_q2_k.cpp     Q2_K
//   kquant_q3_k.cpp     Q3_K
//   kquant_q4_k_q5_k.cpp Q4_K and Q5_K (one code path, 4 or 5 bits)
//   kquant_q6_k.cpp     Q6_K
//   kquant_q8_k.cpp     Q8_K (the k-quants' activation type)
//   kquant_search_x8.cpp the scale searches on 8 groups at once (AVX2)
//   kquant_float_dot.cpp F32, F16, BF16 rows
// Their dequantization is the per-block decoder in kquant_blocks.h (shared
// with CUDA code); the scale searches and bit packing that several types use
// are in kquant_search.cpp; kquants.cpp and kquants_dot.cpp dispatch by type.
//
// Quantization:
// The algorithms are ggml's (ggml/src/ggml-quants.c): the same searches, the
// same constants and, because byte identity with llama.cpp depends on it, the
// same order of float operations in every expression. Do not "simplify" an
// expression here (a*b*c to a*(b*c), a fused multiply-add, a reordered sum)
// without re-running the byte-identity check in docs/kquants.md. The pragma
// below keeps GCC from fusing a*b+c into an FMA when the library is built with an
// -march that has FMA (its default -ffp-contract=fast would do that).
//
// Dot products:
// Every type has a scalar definition (the *_ref functions) and an AVX2 kernel
// (Q4_K, Q5_K and Q6_K also an AVX-512 one, kquant_avx512.h) that returns the
// same float, bit for bit. That works because all the
// products of quantized codes are summed exactly in integers, and the float
// steps that follow are done in one fixed order by both versions:
//  - legacy 32-element blocks: block b's term t_b = (dw*da) * isum_b [+ m*s]
//    goes into partial sum b % 8 (the AVX2 kernel keeps those 8 partials as
//    the lanes of one register and handles 8 blocks per step);
//  - k-quant 256-element super-blocks: t_b = dw*da*isum_b - dmin*da*summ_b,
//    summed in block order (the kernel finishes each super-block in scalar);
//  - f32/f16/bf16 rows: element i goes into partial sum i % 32 (four 8-lane
//    registers).
// The 8 (or 32) partials are then reduced by reduce8 below. No fused
// multiply-add anywhere: the kernels use separate mul/add intrinsics, and the
// pragma below (every kquant_*.cpp includes this header first) stops the compiler from contracting
// a*b+c whatever -march the library is built with.
#pragma once

// Included first by every kquant_*.cpp: no FMA contraction (a*b+c fused)
// in the functions those files define, whatever -march the library is built
// with, since byte identity with llama.cpp depends on separate roundings.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "quantizers/kquants.h"

namespace qf::kquants::detail {

constexpr int QK = 32;    // legacy block
constexpr int QK_K = 256;  // k-quant super-block
constexpr float kGroupMaxEps = 1e-15f;

inline float h2f(uint16_t h) { return f16_to_f32(h); }
inline uint16_t f2h(float f) { return f32_to_f16(f); }

// Round to nearest, ties to even, for |v| < 2^22 (ggml's magic-number trick).
inline int nearest_int(float v) {
  const float shifted = v + 12582912.f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  return (bits & 0x007fffff) - 0x00400000;
}

inline int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// The fixed reduction of 8 partial sums (the order of the AVX2 horizontal add).
inline float reduce8(const float* a) { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

// 32 partials -> 8 (lane-wise, as the four registers are added) -> reduce8.
inline float reduce32(const float* a) {
  float v[8];
  for (int j = 0; j < 8; ++j) v[j] = (a[j] + a[8 + j]) + (a[16 + j] + a[24 + j]);
  return reduce8(v);
}

// The float step of one k-quant super-block, shared by both versions.
inline float kterm(float wd, float wdmin, float ad, int isum, int summ) {
  return (wd * ad) * static_cast<float>(isum) - (wdmin * ad) * static_cast<float>(summ);
}

// The 2-bit field of element e of a Q2_K / Q3_K super-block's qs.
inline int q2_field(const uint8_t* qs, int e) { return (qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3; }

// ---- shared by several types (kquant_search.cpp) ----------------------------------

float search_symmetric(int n, int nmax, const float* x, int8_t* L, const float* qw);
float search_q3(int n, int nmax, const float* x, int8_t* L);
float search_asymmetric(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* neg_min,
                        uint8_t* Laux, float rmin, float rdelta, int nstep, bool use_mad, bool legacy);
float search_positive(int n, int nmax, const float* x, uint8_t* L, const float* w);
// The same searches on 8 consecutive n-element groups (x + g*n, weights + g*n,
// L + g*n; group g's scale in scales[g]), bit for bit 8 calls of the scalar
// function, run as one AVX2 pass where the SIMD level allows (n <= 32).
void search_asymmetric_x8(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* scales,
                          float* neg_mins, float rmin, float rdelta, int nstep, bool use_mad, bool x3);
void search_symmetric_x8(int n, int nmax, const float* x, int8_t* L, float* scales, const float* qw);
void search_q3_x8(int n, int nmax, const float* x, int8_t* L, float* scales);
void pack_q5(const uint8_t* L, uint8_t* qs, uint8_t* qh_bytes);
void pack_2bit(const uint8_t* L, uint8_t* qs);
void pack_scales_k4(const uint8_t* ls, const uint8_t* lm, uint8_t* s);
void pack_scales_q3(const int* codes, uint8_t* s);
float row_sigma2(const float* x, int64_t n);
void block_weights(const float* x, const float* qw, float sigma2, int n, float* w);
float sum_squares(const float* x, int n);

// ---- per type: quantize (nb blocks; *_w with importance weights qw), dot ----------

void quant_q4_0(const float* x, BlockQ4_0* y, int64_t nb);
void quant_q4_1(const float* x, BlockQ4_1* y, int64_t nb);
void quant_q5_0(const float* x, BlockQ5_0* y, int64_t nb);
void quant_q5_1(const float* x, BlockQ5_1* y, int64_t nb);
void quant_q8_0(const float* x, BlockQ8_0* y, int64_t nb);
void quant_q8_1(const float* x, BlockQ8_1* y, int64_t nb);
// The legacy weighted paths take the row length n (their weights use the row's sigma^2).
void quant_q4_0_w(const float* x, BlockQ4_0* y, int64_t n, const float* qw);
void quant_q4_1_w(const float* x, BlockQ4_1* y, int64_t n, const float* qw);
void quant_q5_0_w(const float* x, BlockQ5_0* y, int64_t n, const float* qw);
void quant_q5_1_w(const float* x, BlockQ5_1* y, int64_t n, const float* qw);
void quant_q2_k(const float* x, BlockQ2_K* y, int64_t nb);
void quant_q2_k_w(const float* x, BlockQ2_K* y, int64_t nb, const float* qw);
void quant_q3_k(const float* x, BlockQ3_K* y, int64_t nb);
void quant_q3_k_w(const float* x, BlockQ3_K* y, int64_t nb, const float* qw);
void quant_q4_k(const float* x, BlockQ4_K* y, int64_t nb, const float* qw);  // qw may be null
void quant_q5_k(const float* x, BlockQ5_K* y, int64_t nb, const float* qw);
void quant_q6_k(const float* x, BlockQ6_K* y, int64_t nb, const float* qw);
void quant_q8_k(const float* x, BlockQ8_K* y, int64_t nb);
// IQ4_NL (kquant_iq4_nl.cpp): qw may be null; ntry 7 as ggml_quantize_chunk, -1 as its row converter.
void quant_iq4_nl(const float* x, BlockIQ4_NL* y, int64_t nb, const float* qw, int ntry);
float dot_iq4_nl_ref(int64_t n, const void* w, const void* a);

// Dot of n weights with n activations of the type's vec_dot_type: the scalar
// reference and the AVX2 kernel, which return the same float bit for bit.
#define QF_KQUANT_DOTS(name)                                    \
  float dot_##name##_ref(int64_t n, const void* w, const void* a); \
  float dot_##name##_avx2(int64_t n, const void* w, const void* a);
QF_KQUANT_DOTS(q4_0)
QF_KQUANT_DOTS(q4_1)
QF_KQUANT_DOTS(q5_0)
QF_KQUANT_DOTS(q5_1)
QF_KQUANT_DOTS(q8_0)
QF_KQUANT_DOTS(q2_k)
QF_KQUANT_DOTS(q3_k)
QF_KQUANT_DOTS(q4_k)
QF_KQUANT_DOTS(q5_k)
QF_KQUANT_DOTS(q6_k)
QF_KQUANT_DOTS(f32)
QF_KQUANT_DOTS(f16)
QF_KQUANT_DOTS(bf16)
#undef QF_KQUANT_DOTS
// AVX-512 kernels (F/BW/VL), the same float as the reference, for the types
// that have one; the others use their AVX2 kernel at that level.
float dot_q4_k_avx512(int64_t n, const void* w, const void* a);
float dot_q5_k_avx512(int64_t n, const void* w, const void* a);
float dot_q6_k_avx512(int64_t n, const void* w, const void* a);

}  // namespace qf::kquants::detail
