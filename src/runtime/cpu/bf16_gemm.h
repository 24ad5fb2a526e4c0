// bf16 products for the bf16 calibration path (calibration.precision: bf16):
// weights and activations rounded to bf16, products summed in f32, as a
// model runs in bf16 on a GPU. With AVX512-BF16 (core/simd.h,
// cpu_has_avx512_bf16) one VDPBF16PS adds 32 products, twice the f32 FMA
// rate; every other level computes the same floats with f32 multiply-adds.
//
// The sum of one output, the order every level follows: rows are padded
// with zeros to a multiple of 32 elements; 16 lanes, lane l taking elements
// 32c + 2l + 1 then 32c + 2l of each chunk c in turn, each product exact in
// f32 (8 + 8 significant bits) and each addition rounded once (what
// VDPBF16PS does); then the lanes summed as
//   t_i = a_i + a_{i+8},  u_i = t_i + t_{i+4},  (u_0 + u_2) + (u_1 + u_3).
// Rounding to bf16 flushes bf16 subnormals to zero (VDPBF16PS reads them as
// zero); the levels agree whenever no product or partial sum falls below
// f32's normal range (2^-126), where VDPBF16PS flushes to zero and the
// others keep the subnormal.
#pragma once

#include <cstdint>

namespace qf::rt {

constexpr int64_t kBf16Chunk = 32;

// k rounded up to a whole number of chunks.
inline int64_t bf16_padded(int64_t k) { return (k + kBf16Chunk - 1) / kBf16Chunk * kBf16Chunk; }

// dst[0, kp) = src[0, k) rounded to bf16 (nearest even, subnormals to zero),
// then zeros.
void to_bf16_row(const float* src, int64_t k, uint16_t* dst, int64_t kp);

// y[t * ys + r] = the sum above of x row t and w row r (both padded rows
// of kp elements, kp a multiple of 32, rows kp apart), t < tokens, r < rows,
// with the kernels of the current SIMD level.
void gemm_tile_bf16(const uint16_t* x, int64_t tokens, const uint16_t* w, int64_t rows, int64_t kp, float* y,
                    int64_t ys);

namespace ref {
void gemm_tile_bf16(const uint16_t* x, int64_t tokens, const uint16_t* w, int64_t rows, int64_t kp, float* y,
                    int64_t ys);
}  // namespace ref

}  // namespace qf::rt
