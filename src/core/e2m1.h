// e2m1 (FP4, the element type of NVFP4 and MXFP4) <-> f32, bit-exact: one
// sign, two exponent and one mantissa bit in the low nibble; magnitudes 0,
// 0.5, 1, 1.5, 2, 3, 4, 6; no inf or NaN. Encoding rounds to nearest even and
// saturates to +-6; NaN gives 6 with its sign, as NVFP4 packers do. Host and
// device (core/hd.h).
#pragma once

#include <cstdint>

#include "core/minifloat.h"

namespace qf::hd {

QF_HD inline float e2m1_to_f32(uint8_t v) {
  return float_of((static_cast<uint32_t>(v & 0x8u) << 28) | expand_magnitude(v & 0x7u, 1, 1));
}

QF_HD inline uint8_t f32_to_e2m1(float f) { return encode_narrow(f, 1, 1, 3, 0x7u, 0x7u); }

}  // namespace qf::hd
