// Generic encode/decode of small IEEE-style binary floats (sign, E exponent bits,
// M mantissa bits), shared by the CPU conversions (dtype.cpp) and the CUDA
// kernels (cuda/convert.cu) so that both follow one definition of rounding.
//
// Encoding rounds to nearest, ties to even, exactly: a float scaled by a power
// of two is exact in double, and nearbyint() under the default rounding mode
// is round-half-even.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define QF_HD __host__ __device__
#else
#define QF_HD
#endif

namespace qf::codec {

struct SmallFloat {
  int exp_bits, man_bits, bias;
  double max_finite;
  // Overflow (after rounding) and infinities: true -> clamp to max_finite,
  // false -> the infinity code.
  bool saturate;
  uint32_t inf_code;  // magnitude bits of +inf (unused when saturate)
  uint32_t nan_code;  // magnitude bits written for NaN
};

// OCP / PyTorch float8_e4m3fn: no inf, 0x7f NaN, max 448; saturating conversion.
QF_HD constexpr SmallFloat e4m3() { return {4, 3, 7, 448.0, true, 0, 0x7f}; }
// float8_e5m2: IEEE-like, inf 0x7c, NaN 0x7f; overflow goes to inf.
QF_HD constexpr SmallFloat e5m2() { return {5, 2, 15, 57344.0, false, 0x7c, 0x7f}; }
// FP4 e2m1: no inf/NaN, max 6; saturating; NaN written as 6.
QF_HD constexpr SmallFloat e2m1() { return {2, 1, 1, 6.0, true, 0, 0x7}; }
// IEEE half.
QF_HD constexpr SmallFloat f16() { return {5, 10, 15, 65504.0, false, 0x7c00, 0x7e00}; }

QF_HD inline uint32_t encode(float f, SmallFloat t) {
  const uint32_t sign = std::signbit(f) ? (1u << (t.exp_bits + t.man_bits)) : 0u;
  if (std::isnan(f)) return sign | t.nan_code;
  double a = std::fabs(static_cast<double>(f));
  if (std::isinf(a)) return sign | (t.saturate ? encode(static_cast<float>(t.max_finite), t) : t.inf_code);
  if (a == 0.0) return sign;
  const int min_normal_exp = 1 - t.bias;
  int e;
  std::frexp(a, &e);
  e -= 1;  // a in [2^e, 2^(e+1))
  if (e < min_normal_exp) e = min_normal_exp;  // subnormal spacing
  double q = std::ldexp(1.0, e - t.man_bits);   // value of one mantissa step
  double v = std::nearbyint(a / q) * q;
  if (v > t.max_finite) {
    if (!t.saturate) return sign | t.inf_code;
    v = t.max_finite;
  }
  if (v == 0.0) return sign;
  std::frexp(v, &e);
  e -= 1;
  uint32_t exp_field, man;
  if (e < min_normal_exp) {
    exp_field = 0;
    man = static_cast<uint32_t>(v / std::ldexp(1.0, min_normal_exp - t.man_bits));
  } else {
    exp_field = static_cast<uint32_t>(e + t.bias);
    man = static_cast<uint32_t>((v / std::ldexp(1.0, e) - 1.0) * std::ldexp(1.0, t.man_bits));
  }
  return sign | (exp_field << t.man_bits) | man;
}

QF_HD inline float decode(uint32_t code, SmallFloat t) {
  const uint32_t man_mask = (1u << t.man_bits) - 1;
  const uint32_t exp_max = (1u << t.exp_bits) - 1;
  const bool neg = (code >> (t.exp_bits + t.man_bits)) & 1u;
  const uint32_t mag = code & ((1u << (t.exp_bits + t.man_bits)) - 1);
  const uint32_t exp_field = mag >> t.man_bits, man = mag & man_mask;
  double v;
  if (!t.saturate && exp_field == exp_max) {
    v = man ? NAN : INFINITY;  // IEEE-like formats (e5m2, f16)
  } else if (t.saturate && t.nan_code == mag && t.exp_bits == 4) {
    v = NAN;  // e4m3fn: only S.1111.111 is NaN
  } else if (exp_field == 0) {
    v = std::ldexp(static_cast<double>(man), 1 - t.bias - t.man_bits);
  } else {
    v = std::ldexp(1.0 + static_cast<double>(man) / (1u << t.man_bits), static_cast<int>(exp_field) - t.bias);
  }
  return static_cast<float>(neg ? -v : v);
}

}  // namespace qf::codec
