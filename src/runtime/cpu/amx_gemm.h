// The GEMM of GGUF block rows on AMX tiles (SimdLevel::Amx): prefill and
// perplexity multiply every token against the weights' integer codes with
// the tiles' bf16 dot products, then apply each sub-block's scale and min in
// f32.
//
// A weight of a supported type is scale * code - min of its sub-block (the
// codes are small integers, |code| <= 128, so every code is a bf16 exactly):
//
//   type   sub-block  code                scale          min
//   Q8_0   32         q (int8)            d              0
//   Q4_K   32         q (0..15)           d * sc         dmin * m
//   Q5_K   32         q (0..31)           d * sc         dmin * m
//   Q6_K   16         q - 32 (-32..31)    d * sc         0
//
// Each f32 activation is split into two bf16 pieces, hi = bf16(a) and
// mid = bf16(a - hi) (rounded to nearest even), whose sum is the float to
// within 2^-16 of its magnitude (16 significant bits where f32 has 24; a third
// piece would make it exact, and cost a third more tile products for a
// difference far below the f32 GEMM's own rounding). Every product the tiles
// form is exact; the other rounding is the tiles' f32 accumulation over a
// sub-block and the f32 sums after it:
//
//   y[t, r] = sum_j scale[r, j] * C[t, r, j] - min[r, j] * S[t, j]
//   C[t, r, j] = sum over the sub-block of (hi + mid)[t, i] * code[r, i]
//   S[t, j]    = sum over the sub-block of a[t, i]  (f32, a fixed order;
//                only for the types with a min)
//
// in sub-block order, each term added as fma(scale, C, acc) then
// fma(-min, S, acc). The result depends on no other token or row of the
// batch, so a token's outputs do not depend on the batch it is in (among
// batches that take this path). It is not the float order of the f32 GEMM
// blocks, which multiply the decoded weights; tests bound both against a
// double-precision product.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace qf::rt {

// True for the ggml types the tile GEMM multiplies (the table above).
bool amx_gemm_supports(uint32_t ggml_type);

// Elements per sub-block of a supported type (32 or 16), and whether its
// sub-blocks have a min (Q4_K, Q5_K).
int amx_sub_block(uint32_t ggml_type);
bool amx_has_min(uint32_t ggml_type);

// The activations of one forward, prepared for the tiles: for each block of
// 16 tokens (the last padded with zero tokens) and each of the two pieces,
// the bf16 values in the tiles' pair-interleaved layout ([k / 2][16 tokens][2]),
// and, when asked for, the f32 sum of each token's sub-blocks
// ([k / sub][16 tokens]; empty otherwise).
struct AmxActivations {
  int64_t tokens = 0, k = 0, sub = 0, blocks = 0;
  std::vector<uint16_t> pieces;  // [blocks][2][k / 2][16][2]
  std::vector<float> sums;       // [blocks][k / sub][16]
};

// Fills `out` for x[tokens, k] (row stride x_stride) and sub-blocks of `sub`
// elements (16 or 32; k a multiple of 32), with the sub-block sums when
// `sums`. Token blocks [b0, b1) only, so threads can share the work; call
// amx_activations_reserve first.
void amx_activations_reserve(AmxActivations& out, int64_t tokens, int64_t k, int sub, bool sums);
void amx_prepare_activations(const float* x, int64_t x_stride, AmxActivations& out, int64_t b0, int64_t b1);

// One tile of at most 64 weight rows, decoded for the tiles: the codes as
// bf16 in blocks of 16 rows x one sub-block ([rows / 16][k / sub][16][sub],
// each block contiguous, as one tile load reads it; rows padded to a
// multiple of 16 with zero codes), and scale/min as [k / sub][64] (min
// empty for the types without one).
struct AmxWeightTile {
  std::vector<uint16_t> codes;
  std::vector<float> scale, min;
  int64_t rows = 0;
  bool has_min = false;
};

// Decodes `rows` (<= 64) consecutive rows of ggml type `type` (row_bytes
// bytes each, k elements) starting at `w`.
void amx_decode_tile(uint32_t type, const uint8_t* w, size_t row_bytes, int64_t rows, int64_t k, AmxWeightTile& out);

// y[t * y_stride + r] = the sum above, for t < act.tokens and r < tile.rows.
// Needs SimdLevel::Amx (an Internal error otherwise).
void amx_gemm_tile(const AmxActivations& act, const AmxWeightTile& tile, float* y, int64_t y_stride);

}  // namespace qf::rt
