// The rounding machinery every narrow binary float shares (f16, bf16, the
// 8-bit floats, e2m1): an f32 magnitude rounded to a format with `man`
// mantissa bits and exponent bias `bias`, and a format's magnitude code
// expanded back to f32 bits. Each format's header adds its own sign, NaN,
// infinity and overflow rules. Host and device (core/hd.h).
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace qf::hd {

constexpr uint32_t kF32Inf = 0x7f800000u;
constexpr uint32_t kF32QuietNan = 0x7fc00000u;

// x / 2^s rounded to nearest, ties to even; 1 <= s <= 31.
QF_HD inline uint32_t shift_rne(uint32_t x, int s) {
  const uint32_t q = x >> s, rem = x & ((1u << s) - 1), half = 1u << (s - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

// Rounds a finite f32 magnitude (bit pattern, sign clear) to its magnitude
// code. In the normal range the f32 bit pattern is the target code shifted
// left, so rebiasing and one RNE shift do it, and a mantissa carry bumps the
// exponent exactly as it should. The result may lie past the format's largest
// finite code; callers apply their overflow rule (saturate or inf) to it.
QF_HD inline uint32_t round_magnitude(uint32_t a, int man, int bias) {
  const int ef = static_cast<int>(a >> 23);
  if (ef >= 128 - bias) return shift_rne(a - (static_cast<uint32_t>(127 - bias) << 23), 23 - man);
  // Subnormal in the target: count steps of 2^(1 - bias - man).
  const uint32_t sig = (a & 0x7fffffu) | (ef ? 0x800000u : 0u);
  const int s = 151 - bias - man - max_int(ef, 1);
  return s > 25 ? 0u : shift_rne(sig, s);  // sig < 2^24, so s > 24 is below half a step
}

// f32 bits of a finite magnitude code. Only for formats whose subnormals are
// f32 normals (f16 and the 8/4-bit floats; not bf16).
QF_HD inline uint32_t expand_magnitude(uint32_t mag, int man, int bias) {
  const uint32_t e = mag >> man, m = mag & ((1u << man) - 1);
  if (e != 0) return ((e + 127 - bias) << 23) | (m << (23 - man));
  if (m == 0) return 0;
  const int p = top_bit(m);  // the leading one becomes the implicit bit
  return (static_cast<uint32_t>(p + 128 - bias - man) << 23) | ((m ^ (1u << p)) << (23 - p));
}

// Sign, NaN and overflow handling of the 8- and 4-bit encoders: the rounded
// magnitude is clamped to `max_code` (the largest finite code for the
// saturating formats, the infinity code for e5m2) and NaN becomes `nan_code`,
// each with the sign moved to bit `sign_bit`.
QF_HD inline uint8_t encode_narrow(float f, int man, int bias, int sign_bit, uint32_t nan_code, uint32_t max_code) {
  const uint32_t u = bits_of(f), a = u & 0x7fffffffu;
  const auto sign = static_cast<uint8_t>((u >> 31) << sign_bit);
  if (a > kF32Inf) return static_cast<uint8_t>(sign | nan_code);
  return static_cast<uint8_t>(sign | min_u32(round_magnitude(a, man, bias), max_code));
}

}  // namespace qf::hd
