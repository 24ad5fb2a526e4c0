// IEEE binary16 (f16) <-> f32, bit-exact, round to nearest even. Overflow
// becomes inf; NaNs keep sign and payload (the payload's top bits, quieted).
// Host and device (core/hd.h).
#pragma once

#include <cstdint>

#include "core/minifloat.h"

namespace qf::hd {

QF_HD inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, mag = h & 0x7fffu;
  if (mag >= 0x7c00u) {  // NaNs come back quiet, payload kept
    return float_of(sign | (mag == 0x7c00u ? kF32Inf : kF32QuietNan | ((mag & 0x3ffu) << 13)));
  }
  return float_of(sign | expand_magnitude(mag, 10, 15));
}

QF_HD inline uint16_t f32_to_f16(float f) {
  const uint32_t u = bits_of(f), a = u & 0x7fffffffu;
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  if (a > kF32Inf) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  return static_cast<uint16_t>(sign | min_u32(round_magnitude(a, 10, 15), 0x7c00u));
}

}  // namespace qf::hd
