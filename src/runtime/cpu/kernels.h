// Float kernels of the CPU runtime: dot products against f32/f16/bf16 rows,
// row conversion, RMSNorm, SwiGLU, softmax.
//
// Each kernel has a plain scalar reference (namespace `ref`) and SIMD
// versions (AVX2+FMA+F16C, AVX-512) chosen at each call by the one SIMD switch
// of core/simd.h: the best level the CPU supports, QF_SIMD=scalar|avx2|avx512
// in the environment, or set_simd_level(). Tests run every kernel at every
// level against its reference.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/simd.h"

namespace qf::rt {

// The switch itself lives in core (the GGUF block dot products of
// quantizers/kquants obey it too); the runtime spells it rt::.
using qf::best_simd_level;
using qf::set_simd_level;
using qf::simd_level;
using qf::simd_level_name;
using qf::SimdLevel;

// sum_i a[i] * b[i]
float dot_f32(const float* a, const float* b, int64_t n);

// Converts n elements of a weight row (F32, F16 or BF16) to f32.
void row_to_f32(DType dtype, const void* src, float* dst, int64_t n);

// y[r] = dot(x, w_r) for `rows` consecutive f32 rows w of length n, one row
// after the other (one stream through memory), each sum in the order of
// gemm_tile_f32's blocks.
void dot_rows_f32(const float* x, const float* w, int64_t n, int64_t rows, float* y);

// dot_rows_f32 on f16 rows, converted in registers (at the scalar level,
// converted first): the same floats as row_to_f32 followed by dot_rows_f32,
// except at AVX2, where a sum over f16 rows uses two accumulators
// (gemm_blocks.h) and so rounds differently.
void dot_rows_f16(const float* x, const uint16_t* w, int64_t n, int64_t rows, float* y);

// y[t * y_stride + r] = dot(x + t * x_stride, w + r * k, k) for t < tokens and
// r < rows: a block of tokens against a tile of f32 rows, register-blocked
// (6 then 4 tokens x 4 rows with AVX-512, 4 x 3 then 2 x 4 with AVX2) so each load feeds
// several multiply-adds.
void gemm_tile_f32(const float* x, int64_t tokens, int64_t x_stride, const float* w, int64_t rows, int64_t k,
                   float* y, int64_t y_stride);

// gemm_tile_f32 on f16 rows converted in registers, with half the weight
// bytes read per block: the floats of dot_rows_f16 for every token (the same
// floats as converting the rows first, except at AVX2).
void gemm_tile_f16(const float* x, int64_t tokens, int64_t x_stride, const uint16_t* w, int64_t rows, int64_t k,
                   float* y, int64_t y_stride);

// Q8_0 rows (k a multiple of 32; rows of k / 32 blocks of 34 bytes, an f16
// scale and 32 int8 codes): decode_q8_0_row is kquants::dequantize_row for
// Q8_0; dot_rows_q8_0 and gemm_tile_q8_0 give the floats of dot_rows_f32 and
// gemm_tile_f32 on decoded rows, converting in registers (another k is an
// Internal error).
void decode_q8_0_row(const uint8_t* w, float* out, int64_t k);
void dot_rows_q8_0(const float* x, const uint8_t* w, int64_t k, int64_t rows, float* y);
void gemm_tile_q8_0(const float* x, int64_t tokens, int64_t x_stride, const uint8_t* w, int64_t rows, int64_t k,
                    float* y, int64_t y_stride);

// out = x / rms(x) * weight  (weight may equal nullptr: no scaling)
void rms_norm(const float* x, const float* weight, float eps, int64_t n, float* out);

// gate[i] = silu(gate[i]) * up[i]
void swiglu(float* gate, const float* up, int64_t n);

// In place: x = softmax(x); returns nothing. n >= 1.
void softmax(float* x, int64_t n);

// log(sum_i exp(x[i])), accumulated in double.
double logsumexp(const float* x, int64_t n);

// KL(P || Q) for P = softmax(p_logits), Q = softmax(q_logits), given their
// logsumexp values: sum_i P_i (log P_i - log Q_i).
double kl_divergence(const float* p_logits, double p_lse, const float* q_logits, double q_lse, int64_t n);

// y += a * x
void axpy(float a, const float* x, float* y, int64_t n);

namespace ref {
float dot_f32(const float* a, const float* b, int64_t n);
void softmax(float* x, int64_t n);
void row_to_f32(DType dtype, const void* src, float* dst, int64_t n);
double logsumexp(const float* x, int64_t n);
double kl_divergence(const float* p_logits, double p_lse, const float* q_logits, double q_lse, int64_t n);
void gemm_tile_f32(const float* x, int64_t tokens, int64_t x_stride, const float* w, int64_t rows, int64_t k,
                   float* y, int64_t y_stride);
}  // namespace ref

}  // namespace qf::rt
