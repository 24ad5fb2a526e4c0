// The int8 GEMM of the W8A8 Linear: int8 activations against int8 weight
// rows, exact int32 accumulation.
//
// Kernels (chosen by simd_level() like the float kernels of kernels.h):
//   - scalar reference;
//   - AVX2: both operands sign-extended to int16 and multiplied with
//     _mm256_madd_epi16 (exact: a pair sum is at most 2 * 128 * 128). The
//     unsigned x signed _mm256_maddubs_epi16 is not used: with the +128 bias
//     its int16 pair sums saturate (255 * -128 * 2 < -32768), so it is not exact
//     for full-range int8 operands;
//   - AVX-512 VNNI (Avx512 level on CPUs with avx512vnni, else the AVX2
//     kernel): _mm512_dpbusd_epi32 on (x + 128) as u8 against w as s8, which
//     sums four products into int32 without saturation; the bias is removed
//     with the weight row sums: sum (x + 128) w = sum x w + 128 sum w.
// Every kernel returns the exact integer dot products, so all levels agree bit
// for bit whenever k <= kInt8GemmMaxK (then no result can leave int32).
#pragma once

#include <cstdint>
#include <vector>

namespace qf::rt {

constexpr int64_t kInt8GemmMaxK = 131071;

// y[t * y_stride + j] = sum_{i < k} x[t * x_stride + i] * w[j * k + i] for
// t < tokens, j < rows. w_rowsum: sum_i w[j * k + i] for each of the rows (the
// VNNI kernel's bias correction), or nullptr to have it computed here.
void gemm_s8s8_s32(const int8_t* x, int64_t tokens, int64_t x_stride, const int8_t* w, int64_t rows, int64_t k,
                   const int32_t* w_rowsum, int32_t* y, int64_t y_stride);

// Row sums of `rows` int8 rows of length k.
std::vector<int32_t> int8_row_sums(const int8_t* w, int64_t rows, int64_t k);

// The kernel gemm_s8s8_s32 uses at the current level: "avx512-vnni", "avx2", "scalar".
const char* int8_gemm_kernel_name();

namespace ref {
void gemm_s8s8_s32(const int8_t* x, int64_t tokens, int64_t x_stride, const int8_t* w, int64_t rows, int64_t k,
                   int32_t* y, int64_t y_stride);
}  // namespace ref

}  // namespace qf::rt
