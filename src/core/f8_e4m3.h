// f8_e4m3fn <-> f32, bit-exact (OCP 8-bit float, as PyTorch implements it):
// bias 7, no infinities, S.1111.111 is NaN, largest finite 448. Encoding
// rounds to nearest even and saturates: anything that rounds past 448, inf
// included, gives +-448 (NVIDIA's cvt.satfinite); NaN stays NaN (0x7f, sign
// kept). Host and device (core/hd.h).
#pragma once

#include <cstdint>

#include "core/minifloat.h"

namespace qf::hd {

QF_HD inline float f8e4m3_to_f32(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24, mag = v & 0x7fu;
  return float_of(sign | (mag == 0x7fu ? kF32QuietNan : expand_magnitude(mag, 3, 7)));
}

// 0x7f would be 480 (it is NaN), so the clamp is to 0x7e (448).
QF_HD inline uint8_t f32_to_f8e4m3(float f) { return encode_narrow(f, 3, 7, 7, 0x7fu, 0x7eu); }

}  // namespace qf::hd
