// Q8_0 weights in groups of 16 rows, interleaved for the AVX-512 VNNI dot
// product: decode multiplies each weight byte once per token, and from the
// row layout that costs a horizontal sum per 32-element block; interleaved,
// one VPDPBUSD adds 4 products into each of the 16 rows' lanes and nothing
// is summed across lanes until the row ends.
//
// A group of 16 rows of `blocks` Q8_0 blocks each (16 * blocks * 34 bytes,
// the rows' own size, so a tensor is regrouped in place) holds
//
//   codes   [blocks][8][16][4] uint8   code + 128 of row r, elements 4j..4j+3
//                                      of the block, at [b][j][r]
//   scales  [blocks][16]       f16     the d of row r's block b
//
// Rows past the last whole group stay in the row layout.
//
// The product of a group with a Q8_0 activation row is, for each row, the
// float sum of dot_q8_0_ref bit for bit: block b's term (d_w * d_a) * isum
// (isum exact in int32) is added to partial b % 8, and the 8 partials are
// reduced as reduce8 does. The unsigned codes make VPDPBUSD's sum
// sum((q + 128) * a) = isum + 128 * sum(a); the second term depends on the
// token only, so it is computed once per token (Q8_0GroupActivation) and
// subtracted, exactly, before the conversion to float.
#pragma once

#include <cstdint>
#include <vector>

namespace qf::rt {

constexpr int kQ8_0GroupRows = 16;

// Rewrites 16 consecutive Q8_0 rows (`blocks` blocks each, contiguous) as one
// group, in place. `scratch` is resized to the group's size.
void q8_0_group_pack(uint8_t* rows, int64_t blocks, std::vector<uint8_t>& scratch);

// Row r (0..15) of a group, back in the row layout (`blocks` Q8_0 blocks,
// byte for byte the row before packing).
void q8_0_group_unpack_row(const uint8_t* group, int64_t blocks, int r, uint8_t* row);

// One token's Q8_0 activation row (kquants::quantize_activation), with each
// block's scale as f32 and 128 * the sum of its codes.
struct Q8_0GroupActivation {
  const uint8_t* row = nullptr;  // `blocks` BlockQ8_0
  std::vector<float> d;
  std::vector<int32_t> offset;
};
void q8_0_group_activation(const uint8_t* row, int64_t blocks, Q8_0GroupActivation& out);

// out[16 g + r] = the dot product of row r of group g with the activation,
// for `count` consecutive groups. The AVX-512 VNNI kernel where the CPU has it
// and the SIMD level is avx512 or above (q8_0_groups_fast()); the scalar
// reference otherwise. Both give the floats of dot_q8_0_ref on the row.
void q8_0_groups_dot(const uint8_t* groups, int64_t count, int64_t blocks, const Q8_0GroupActivation& a, float* out);
void q8_0_group_dot_ref(const uint8_t* group, int64_t blocks, const Q8_0GroupActivation& a, float* out);

// Whether q8_0_groups_dot has its VNNI kernel at the current SIMD level (the
// groups are only worth their packing where it has).
bool q8_0_groups_fast();

}  // namespace qf::rt
