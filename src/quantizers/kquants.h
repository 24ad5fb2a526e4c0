// GGUF block quantization: ggml's legacy (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), IQ4_NL and
// k-quant (Q2_K..Q6_K, Q8_K) formats, plus the trivial F32/F16/BF16 rows.
//
// Types are ggml type ids (qf::ggml_type::Q4_K, ...; block sizes and bytes per
// block come from ggml_type_info). Every row length must be a multiple of the
// type's block size (32 for the legacy types, 256 for the k-quants).
//
// quantize_rows without an importance matrix produces the same bytes as
// llama.cpp's ggml_quantize_chunk (its quantize_row_*_ref algorithms); with
// one, the same bytes as its weighted quantize_q*_K / quantize_q4_0 ... paths.
// docs/kquants.md has the block layouts and how byte identity was checked.
//
// Dot products for the runtime follow ggml: the activation row is quantized to
// the weight type's vec_dot_type (Q8_0, Q8_1 or Q8_K; F16/BF16/F32 for the
// float rows), then vec_dot multiplies one weight row by it. vec_dot runs an
// AVX-512 or AVX2 kernel or the scalar code as the library's one SIMD switch
// says (qf::simd_level(), core/simd.h: QF_SIMD or set_simd_level(); Q4_K,
// Q5_K and Q6_K have AVX-512 kernels, the other types use their AVX2 kernel
// at the avx512 level); SIMD and scalar results are bit-identical.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/simd.h"
#include "formats/gguf/gguf.h"
#include "quantizers/kquant_blocks.h"

namespace qf::kquants {

// True for the types this module quantizes, dequantizes and multiplies:
// F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K..Q6_K, Q8_K, IQ4_NL.
// (Q8_1 and Q8_K are activation types: quantize_activation and dequantize_row
// only.)
bool is_supported(uint32_t type);

// Bytes of one row of `n` elements. Throws qf::Error (unsupported type, or
// `n` not a multiple of the block size).
size_t row_size(uint32_t type, int64_t n);

// Quantizes `nrows` rows of `n_per_row` floats into consecutive rows of
// row_size(type, n_per_row) bytes. `imatrix` (nullable) holds n_per_row
// importance weights shared by every row (llama-imatrix's mean x^2 per
// column); it is ignored for Q8_0 and the float types, as in llama.cpp.
void quantize_rows(uint32_t type, const float* src, void* dst, int64_t nrows, int64_t n_per_row,
                   const float* imatrix);

// ggml's row converter for IQ4_NL (quantize_row_iq4_nl_ref, what fills a
// llama.cpp KV cache): no extra scales tried, so bytes differ from
// quantize_rows' (ggml_quantize_chunk's) for the same row.
void quantize_row_iq4_nl_ref(const float* src, void* dst, int64_t n);

// Decodes one row of `n` elements.
void dequantize_row(uint32_t type, const void* src, float* dst, int64_t n);

// The activation type vec_dot expects for a weight type: Q8_0 for Q4_0, Q5_0
// and Q8_0; Q8_1 for Q4_1 and Q5_1; Q8_K for the k-quants; the type itself for
// F32, F16 and BF16.
uint32_t vec_dot_type(uint32_t type);

// Quantizes an activation row of `n` floats to `vec_dot_type` (row_size bytes).
void quantize_activation(uint32_t vec_dot_type, const float* x, void* dst, int64_t n);

// Dot product of one weight row (`type`, n elements) with an activation row
// already quantized to vec_dot_type(type). vec_dot dispatches to SIMD;
// vec_dot_ref is the scalar definition (same result, bit for bit).
float vec_dot(uint32_t type, int64_t n, const void* weight_row, const void* activation_q);
float vec_dot_ref(uint32_t type, int64_t n, const void* weight_row, const void* activation_q);

// The function vec_dot(type, n, ...) calls at the current SIMD level, checked
// once (type and row length, as vec_dot does) for a caller that dots many
// rows of one matrix.
using DotKernel = float (*)(int64_t n, const void* weight_row, const void* activation_q);
DotKernel dot_kernel(uint32_t type, int64_t n);

// The block layouts (BlockQ4_0 ... BlockQ8_K) and the decoding of one block
// are in quantizers/kquant_blocks.h, shared with device code.

}  // namespace qf::kquants
