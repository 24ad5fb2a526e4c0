// f8_e5m2 <-> f32, bit-exact: bias 15, IEEE-like with inf (0x7c) and NaN.
// Encoding rounds to nearest even and does not saturate: values that round
// past 57344 become inf, like a narrowing IEEE cast; NaN encodes as 0x7f with
// its sign. Host and device (core/hd.h).
#pragma once

#include <cstdint>

#include "core/minifloat.h"

namespace qf::hd {

QF_HD inline float f8e5m2_to_f32(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24, mag = v & 0x7fu;
  if (mag >= 0x7cu) return float_of(sign | (mag == 0x7cu ? kF32Inf : kF32QuietNan));
  return float_of(sign | expand_magnitude(mag, 2, 15));
}

QF_HD inline uint8_t f32_to_f8e5m2(float f) { return encode_narrow(f, 2, 15, 7, 0x7fu, 0x7cu); }

}  // namespace qf::hd
