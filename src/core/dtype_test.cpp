// Exhaustive checks of the scalar conversions against references written
// independently of float_codec.h: decoding from the bit fields with ldexp, and
// encoding by brute force over every code (nearest value, ties to the even code).
#include "core/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"

namespace qf {
namespace {

struct Fmt {
  const char* name;
  int e, m, bias;
  bool ieee_special;  // top exponent is inf/NaN (e5m2, f16)
  int codes() const { return 1 << (1 + e + m); }
};
constexpr Fmt kE4M3{"e4m3", 4, 3, 7, false};
constexpr Fmt kE5M2{"e5m2", 5, 2, 15, true};
constexpr Fmt kE2M1{"e2m1", 2, 1, 1, false};
constexpr Fmt kF16{"f16", 5, 10, 15, true};

bool ref_is_nan(const Fmt& f, uint32_t c) {
  uint32_t mag = c & ((1u << (f.e + f.m)) - 1);
  if (f.ieee_special) return (mag >> f.m) == (1u << f.e) - 1 && (mag & ((1u << f.m) - 1)) != 0;
  return f.e == 4 && mag == 0x7f;  // e4m3fn: S.1111.111 only; e2m1 has none
}

double ref_decode(const Fmt& f, uint32_t c) {
  uint32_t sign = (c >> (f.e + f.m)) & 1, exp = (c >> f.m) & ((1u << f.e) - 1), man = c & ((1u << f.m) - 1);
  double v;
  if (ref_is_nan(f, c)) return NAN;
  if (f.ieee_special && exp == (1u << f.e) - 1) v = INFINITY;
  else if (exp == 0) v = std::ldexp(man, 1 - f.bias - f.m);
  else v = std::ldexp((1 << f.m) + man, static_cast<int>(exp) - f.bias - f.m);
  return sign ? -v : v;
}

// Brute force: the finite code nearest to x (ties: even mantissa code), then
// the format's overflow rule.
uint32_t ref_encode(const Fmt& f, float x, bool saturate, double overflow_at) {
  uint32_t sign_bit = 1u << (f.e + f.m);
  if (std::isnan(x)) return 0xffffffffu;  // checked separately
  double a = std::fabs(static_cast<double>(x));
  uint32_t sign = std::signbit(x) ? sign_bit : 0;
  if (std::isinf(x) || a >= overflow_at) {
    if (!saturate) return sign | ((((1u << f.e) - 1)) << f.m);  // inf
  }
  if (saturate) {  // clamp to the largest finite value first
    double max_finite = 0;
    for (uint32_t c = 0; c < sign_bit; ++c)
      if (!ref_is_nan(f, c)) max_finite = std::max(max_finite, ref_decode(f, c));
    a = std::min(a, max_finite);
  }
  uint32_t best = 0;
  double best_d = INFINITY;
  for (uint32_t c = 0; c < sign_bit; ++c) {
    if (ref_is_nan(f, c) || (f.ieee_special && (c >> f.m) == (1u << f.e) - 1)) continue;
    double d = std::fabs(ref_decode(f, c) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return sign | best;
}

// Every representable value and every midpoint (and its f32 neighbours) of a format.
std::vector<float> probe_values(const Fmt& f) {
  std::vector<double> vals;
  for (uint32_t c = 0; c < (1u << (f.e + f.m)); ++c)
    if (!ref_is_nan(f, c) && !(f.ieee_special && (c >> f.m) == (1u << f.e) - 1)) vals.push_back(ref_decode(f, c));
  std::vector<float> out;
  for (size_t i = 0; i < vals.size(); ++i) {
    double mids[2] = {vals[i], i + 1 < vals.size() ? (vals[i] + vals[i + 1]) / 2 : vals[i] * 1.0625};
    for (double v : mids) {
      float fv = static_cast<float>(v);
      for (float p : {fv, std::nextafter(fv, 0.0f), std::nextafter(fv, INFINITY)}) {
        out.push_back(p);
        out.push_back(-p);
      }
    }
  }
  for (float big : {1e4f, 1e6f, 1e30f, INFINITY, 3e-41f, 1e-45f}) {
    out.push_back(big);
    out.push_back(-big);
  }
  return out;
}

TEST(DType, E4M3DecodesEveryCode) {
  for (uint32_t c = 0; c < 256; ++c) {
    float got = f8e4m3_to_f32(static_cast<uint8_t>(c));
    double want = ref_decode(kE4M3, c);
    if (std::isnan(want)) EXPECT_TRUE(std::isnan(got)) << c;
    else EXPECT_EQ(got, want) << c;
  }
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0xff)));
  EXPECT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
}

TEST(DType, E5M2DecodesEveryCode) {
  for (uint32_t c = 0; c < 256; ++c) {
    float got = f8e5m2_to_f32(static_cast<uint8_t>(c));
    double want = ref_decode(kE5M2, c);
    if (std::isnan(want)) EXPECT_TRUE(std::isnan(got)) << c;
    else EXPECT_EQ(got, want) << c;
  }
  EXPECT_EQ(f8e5m2_to_f32(0x7b), 57344.0f);
  EXPECT_EQ(f8e5m2_to_f32(0x7c), INFINITY);
}

TEST(DType, E2M1DecodesEveryCode) {
  const float want[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (uint32_t c = 0; c < 16; ++c) {
    EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(c)), (c & 8 ? -1 : 1) * want[c & 7]) << c;
    EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(c)), ref_decode(kE2M1, c));
    EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(c | 0xf0)), e2m1_to_f32(static_cast<uint8_t>(c))) << "high nibble ignored";
  }
}

TEST(DType, F16DecodesEveryCode) {
  for (uint32_t c = 0; c < 65536; ++c) {
    float got = f16_to_f32(static_cast<uint16_t>(c));
    double want = ref_decode(kF16, c);
    if (std::isnan(want)) ASSERT_TRUE(std::isnan(got)) << c;
    else ASSERT_EQ(got, want) << c;
  }
}

TEST(DType, BF16DecodesEveryCode) {
  for (uint32_t c = 0; c < 65536; ++c) {
    float got = bf16_to_f32(static_cast<uint16_t>(c));
    uint32_t sign = c >> 15, exp = (c >> 7) & 0xff, man = c & 0x7f;
    double want = exp == 255 ? (man ? NAN : INFINITY)
                  : exp == 0 ? std::ldexp(man, -133)
                             : std::ldexp(128 + man, static_cast<int>(exp) - 134);
    if (sign) want = -want;
    if (std::isnan(want)) ASSERT_TRUE(std::isnan(got)) << c;
    else ASSERT_EQ(got, want) << c;
  }
}

// encode(decode(c)) == c for every non-NaN code, and the NaN codes stay NaN.
TEST(DType, EveryCodeRoundTrips) {
  for (uint32_t c = 0; c < 256; ++c) {
    float v = f8e4m3_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(v)) EXPECT_EQ(f32_to_f8e4m3(v) & 0x7f, 0x7f);
    else EXPECT_EQ(f32_to_f8e4m3(v), c) << c;
    float w = f8e5m2_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(w)) EXPECT_TRUE(std::isnan(f8e5m2_to_f32(f32_to_f8e5m2(w))));
    else EXPECT_EQ(f32_to_f8e5m2(w), c) << c;
  }
  for (uint32_t c = 0; c < 16; ++c) EXPECT_EQ(f32_to_e2m1(e2m1_to_f32(static_cast<uint8_t>(c))), c);
  for (uint32_t c = 0; c < 65536; ++c) {
    float h = f16_to_f32(static_cast<uint16_t>(c));
    if (std::isnan(h)) ASSERT_TRUE(std::isnan(f16_to_f32(f32_to_f16(h))));
    else ASSERT_EQ(f32_to_f16(h), c) << c;
    float b = bf16_to_f32(static_cast<uint16_t>(c));
    if (std::isnan(b)) ASSERT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(b))));
    else ASSERT_EQ(f32_to_bf16(b), c) << c;
  }
}

// Rounding at every representable value, midpoint and neighbour, against brute force.
TEST(DType, SmallFloatEncodingMatchesBruteForce) {
  for (float x : probe_values(kE4M3)) ASSERT_EQ(f32_to_f8e4m3(x), ref_encode(kE4M3, x, true, INFINITY)) << x;
  // e5m2: values at or past the midpoint between 57344 and 65536 become inf
  for (float x : probe_values(kE5M2)) ASSERT_EQ(f32_to_f8e5m2(x), ref_encode(kE5M2, x, false, 61440.0)) << x;
  for (float x : probe_values(kE2M1)) ASSERT_EQ(f32_to_e2m1(x), ref_encode(kE2M1, x, true, INFINITY)) << x;
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-30, 20);
  for (int i = 0; i < 200000; ++i) {
    float x = std::ldexp(mant(rng), ex(rng));
    ASSERT_EQ(f32_to_f8e4m3(x), ref_encode(kE4M3, x, true, INFINITY)) << x;
    ASSERT_EQ(f32_to_f8e5m2(x), ref_encode(kE5M2, x, false, 61440.0)) << x;
  }
}

TEST(DType, SaturationAndSpecials) {
  EXPECT_EQ(f32_to_f8e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(464.0f), 0x7e);  // tie between 448 and (absent) 480 saturates
  EXPECT_EQ(f32_to_f8e4m3(1e9f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(f32_to_f8e4m3(NAN), 0x7f);
  EXPECT_EQ(f32_to_f8e4m3(-NAN), 0xff);
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: tie to zero
  EXPECT_EQ(f32_to_f8e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(f32_to_f8e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_f8e5m2(61439.0f), 0x7b);
  EXPECT_EQ(f32_to_f8e5m2(61440.0f), 0x7c);
  EXPECT_EQ(f32_to_f8e5m2(INFINITY), 0x7c);
  EXPECT_EQ(f32_to_f8e5m2(-INFINITY), 0xfc);
  EXPECT_TRUE(std::isnan(f8e5m2_to_f32(f32_to_f8e5m2(NAN))));
  // e2m1 ties go to the even mantissa
  const std::pair<float, float> ties[] = {{0.25f, 0}, {0.75f, 1}, {1.25f, 1}, {1.75f, 2}, {2.5f, 2}, {3.5f, 4}, {5.0f, 4}, {7.0f, 6}, {1e9f, 6}};
  for (auto [x, want] : ties) {
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(x)), want) << x;
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(-x)), -want) << x;
  }
  EXPECT_EQ(f32_to_e2m1(NAN), 0x7);
  EXPECT_EQ(f32_to_e2m1(INFINITY), 0x7);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.996f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(NAN) & 0x7fc0, 0x7fc0);
}

// f32 -> f16 and bf16 against round-to-nearest-even done by comparing the two
// neighbouring candidates exactly, over dense samples of every exponent.
TEST(DType, F16AndBF16RoundingDense) {
  for (uint32_t hi = 0; hi < 512; ++hi) {  // sign + exponent
    for (uint32_t lo : {0u, 1u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu, 0x2000u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu,
                        0x12345u, 0x3ff000u, 0x7fe000u, 0x7ff000u, 0x7fffffu, 0x400000u, 0x401000u}) {
      uint32_t bits = (hi << 23) | lo;
      float x;
      std::memcpy(&x, &bits, 4);
      if (std::isnan(x)) continue;
      // bf16: truncate, then compare the two candidates
      uint16_t t = static_cast<uint16_t>(bits >> 16);
      // the candidate above the largest finite value is 2^128 (IEEE overflow threshold), not inf
      double above_t = (t & 0x7fff) == 0x7f7f ? std::ldexp(1.0, 128) * ((t & 0x8000) ? -1 : 1) : double(bf16_to_f32(t + 1));
      double d0 = std::fabs(double(bf16_to_f32(t)) - x), d1 = std::fabs(above_t - x);
      uint16_t want = (d1 < d0 || (d1 == d0 && (t & 1))) ? t + 1 : t;
      if (std::isinf(x)) want = t;
      ASSERT_EQ(f32_to_bf16(x), want) << std::hex << bits;
      // f16: brute force nearest among neighbours of the truncation by value
      uint16_t h = f32_to_f16(x);
      double ax = std::fabs(double(x));
      if (ax >= 65520.0) {
        ASSERT_EQ(h & 0x7fff, 0x7c00) << x;
        continue;
      }
      double got = std::fabs(double(f16_to_f32(h)));
      uint16_t mag = h & 0x7fff;
      double below = mag ? std::fabs(double(f16_to_f32(mag - 1))) : -1, above = std::fabs(double(f16_to_f32(mag + 1)));
      ASSERT_LE(std::fabs(got - ax), std::fabs(below - ax)) << x;
      ASSERT_LE(std::fabs(got - ax), std::fabs(above - ax)) << x;
      if (std::fabs(got - ax) == std::fabs(below - ax) || std::fabs(got - ax) == std::fabs(above - ax)) {
        ASSERT_EQ(mag & 1, 0) << "tie to even " << x;
      }
    }
  }
}

TEST(DType, IntegersRoundHalfEvenAndSaturate) {
  EXPECT_EQ(f32_to_i8(2.5f), 2);
  EXPECT_EQ(f32_to_i8(3.5f), 4);
  EXPECT_EQ(f32_to_i8(-2.5f), -2);
  EXPECT_EQ(f32_to_i8(1000.0f), 127);
  EXPECT_EQ(f32_to_i8(-1000.0f), -128);
  EXPECT_EQ(f32_to_i8(NAN), 0);
  EXPECT_EQ(f32_to_u8(-3.0f), 0);
  EXPECT_EQ(f32_to_u8(255.5f), 255);
  EXPECT_EQ(f32_to_u8(254.5f), 254);
  EXPECT_EQ(f32_to_i32(3e9f), std::numeric_limits<int32_t>::max());
  EXPECT_EQ(f32_to_i32(-3e9f), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(f32_to_i32(16777217.0f), 16777216);
}

TEST(DType, BulkConvertAndNames) {
  std::vector<float> x = {1.0f, -2.0f, 448.0f, 1000.0f};
  std::vector<uint8_t> f8(4);
  convert(x.data(), DType::F32, f8.data(), DType::F8_E4M3, 4);
  EXPECT_EQ(f8, (std::vector<uint8_t>{0x38, 0xc0, 0x7e, 0x7e}));
  std::vector<uint16_t> h(4);
  convert(f8.data(), DType::F8_E4M3, h.data(), DType::F16, 4);
  EXPECT_EQ(f16_to_f32(h[3]), 448.0f);
  std::vector<int32_t> i32 = {-300, 5, 300};
  std::vector<int8_t> i8(3);
  convert(i32.data(), DType::I32, i8.data(), DType::I8, 3);
  EXPECT_EQ(i8, (std::vector<int8_t>{-128, 5, 127}));
  EXPECT_THROW(convert(x.data(), DType::F32, h.data(), DType::I64, 1), Error);
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F8_E4M3, DType::F8_E5M2, DType::I8, DType::U8, DType::I32, DType::I64})
    EXPECT_EQ(dtype_from_safetensors(safetensors_dtype_name(t)), t);
  EXPECT_FALSE(dtype_from_safetensors("Q7"));
  EXPECT_EQ(std::string(dtype_name(DType::F8_E4M3)), "f8_e4m3");
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
}

}  // namespace
}  // namespace qf
