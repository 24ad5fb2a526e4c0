// NVFP4's per-element math: the E4M3 scale of a 16-value block under the
// tensor's global scale, the e2m1 code of one value, and its decoded value.
// The conventions (compressed-tensors' multiplier global scale, 448 * 6 /
// amax; the 0.125 substitute for a zero block scale; the effective scale
// computed before the division) are documented in quantizers/float_quant.h.
// Host and device (core/hd.h); quantizers/nvfp4_test.cpp checks them.
#pragma once

#include <cstdint>

#include "core/e2m1.h"
#include "core/f8_e4m3.h"
#include "core/hd.h"

namespace qf::hd {

constexpr float kE2m1Max = 6.0f;
constexpr float kE4m3Eps = 0.125f;  // torch.finfo(float8_e4m3fn).eps

// The decoded e4m3 block scale for a block's amax: e4m3(global * (amax / 6)),
// 0.125 when that is (or rounds to) zero.
QF_HD inline float nvfp4_block_scale(float block_amax, float global_scale) {
  const float s = f8e4m3_to_f32(f32_to_f8e4m3(global_scale * (block_amax / kE2m1Max)));
  return s == 0.0f ? kE4m3Eps : s;
}

// The e2m1 code of x: e2m1(x / (block_scale / global_scale)), code 0 for an
// exact zero quotient (so -0.0 packs as +0), a negative value that rounds to
// zero keeps its sign (code 8).
QF_HD inline uint8_t nvfp4_code(float x, float block_scale, float global_scale) {
  const float v = x / (block_scale / global_scale);
  return v == 0.0f ? uint8_t{0} : f32_to_e2m1(v);
}

// The value a code stands for: e2m1(q) * (block_scale / global_scale).
QF_HD inline float nvfp4_value(uint8_t code, float block_scale, float global_scale) {
  return e2m1_to_f32(code) * (block_scale / global_scale);
}

}  // namespace qf::hd
