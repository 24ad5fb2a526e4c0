// bfloat16 <-> f32, bit-exact: bf16 is the top half of an f32, so decoding is
// a shift and encoding rounds the low half away (to nearest even); overflow
// becomes inf, NaNs stay NaN with their sign. Host and device (core/hd.h).
#pragma once

#include <cstdint>

#include "core/minifloat.h"

namespace qf::hd {

QF_HD inline float bf16_to_f32(uint16_t b) { return float_of(static_cast<uint32_t>(b) << 16); }

QF_HD inline uint16_t f32_to_bf16(float f) {
  const uint32_t u = bits_of(f), a = u & 0x7fffffffu;
  // Set the quiet bit rather than rounding: a payload only in the low 16 bits
  // would otherwise truncate to inf, and a carry could flip the sign.
  if (a > kF32Inf) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>(((u >> 16) & 0x8000u) | min_u32(round_magnitude(a, 7, 127), 0x7f80u));
}

}  // namespace qf::hd
