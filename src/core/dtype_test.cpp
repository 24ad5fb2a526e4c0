// The scalar conversions against references built a different way from
// dtype.cpp: values come from the bit fields through ldexp in double, and
// encoding picks the nearest entry of a sorted table of every representable
// value (ties to the even code), then applies the format's overflow rule.
#include "core/dtype.h"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"

namespace qf {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

enum class Special { Ieee, E4M3, None };  // top exponent is inf/NaN | only S.1111.111 is NaN | no specials

struct Fmt {
  const char* name;
  int exp_bits, man_bits, bias;
  Special special;
  bool saturate;  // overflow clamps to the largest finite value, else becomes inf
  float (*decode)(uint32_t);
  uint32_t (*encode)(float);

  uint32_t sign_bit() const { return 1u << (exp_bits + man_bits); }
  uint32_t codes() const { return sign_bit() << 1; }
  uint32_t inf_code() const { return ((1u << exp_bits) - 1) << man_bits; }
};

const Fmt kF16{"f16", 5, 10, 15, Special::Ieee, false,
               [](uint32_t c) { return f16_to_f32(static_cast<uint16_t>(c)); },
               [](float x) -> uint32_t { return f32_to_f16(x); }};
const Fmt kBF16{"bf16", 8, 7, 127, Special::Ieee, false,
                [](uint32_t c) { return bf16_to_f32(static_cast<uint16_t>(c)); },
                [](float x) -> uint32_t { return f32_to_bf16(x); }};
const Fmt kE4M3{"e4m3", 4, 3, 7, Special::E4M3, true,
                [](uint32_t c) { return f8e4m3_to_f32(static_cast<uint8_t>(c)); },
                [](float x) -> uint32_t { return f32_to_f8e4m3(x); }};
const Fmt kE5M2{"e5m2", 5, 2, 15, Special::Ieee, false,
                [](uint32_t c) { return f8e5m2_to_f32(static_cast<uint8_t>(c)); },
                [](float x) -> uint32_t { return f32_to_f8e5m2(x); }};
const Fmt kE2M1{"e2m1", 2, 1, 1, Special::None, true,
                [](uint32_t c) { return e2m1_to_f32(static_cast<uint8_t>(c)); },
                [](float x) -> uint32_t { return f32_to_e2m1(x); }};
const Fmt* const kAll[] = {&kF16, &kBF16, &kE4M3, &kE5M2, &kE2M1};

bool ref_is_nan(const Fmt& f, uint32_t c) {
  const uint32_t exp_max = (1u << f.exp_bits) - 1, man_mask = (1u << f.man_bits) - 1;
  const uint32_t exp = (c >> f.man_bits) & exp_max, man = c & man_mask;
  if (f.special == Special::Ieee) return exp == exp_max && man != 0;
  if (f.special == Special::E4M3) return exp == exp_max && man == man_mask;
  return false;
}

double ref_decode(const Fmt& f, uint32_t c) {
  const uint32_t exp_max = (1u << f.exp_bits) - 1;
  const uint32_t exp = (c >> f.man_bits) & exp_max, man = c & ((1u << f.man_bits) - 1);
  const double sign = (c & f.sign_bit()) ? -1.0 : 1.0;
  if (ref_is_nan(f, c)) return std::copysign(NAN, sign);
  if (f.special == Special::Ieee && exp == exp_max) return sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(static_cast<double>(man), 1 - f.bias - f.man_bits);
  return sign * std::ldexp(1.0 + std::ldexp(static_cast<double>(man), -f.man_bits), static_cast<int>(exp) - f.bias);
}

// Every non-negative finite value in ascending order, plus one virtual value
// past the largest (the next step up), whose code is max_code + 1.
struct Table {
  std::vector<double> vals;
  std::vector<uint32_t> codes;
  uint32_t max_code = 0;
};

Table make_table(const Fmt& f) {
  Table t;
  for (uint32_t c = 0; c < f.sign_bit(); ++c) {
    const double v = ref_decode(f, c);
    if (std::isnan(v) || std::isinf(v)) continue;
    EXPECT_TRUE(t.vals.empty() || v > t.vals.back()) << f.name << " codes not monotonic at " << c;
    t.vals.push_back(v);
    t.codes.push_back(c);
  }
  t.max_code = t.codes.back();
  const size_t k = t.vals.size();
  t.vals.push_back(2 * t.vals[k - 1] - t.vals[k - 2]);
  t.codes.push_back(t.max_code + 1);
  return t;
}

const Table& table(const Fmt& f) {
  static const Table f16 = make_table(kF16), bf16 = make_table(kBF16), e4m3 = make_table(kE4M3),
                     e5m2 = make_table(kE5M2), e2m1 = make_table(kE2M1);
  return &f == &kF16 ? f16 : &f == &kBF16 ? bf16 : &f == &kE4M3 ? e4m3 : &f == &kE5M2 ? e5m2 : e2m1;
}

uint32_t resolve_overflow(const Fmt& f, uint32_t mag) {
  const uint32_t max_code = table(f).max_code;
  if (mag <= max_code) return mag;
  return f.saturate ? max_code : f.inf_code();
}

// Correctly rounded encoding of a non-NaN value (double, so integers wider
// than f32 can be checked too).
uint32_t ref_encode(const Fmt& f, double x) {
  const uint32_t sign = std::signbit(x) ? f.sign_bit() : 0;
  const double a = std::fabs(x);
  const Table& t = table(f);
  if (a >= t.vals.back()) return sign | resolve_overflow(f, t.max_code + 1);
  const size_t hi = static_cast<size_t>(std::lower_bound(t.vals.begin(), t.vals.end(), a) - t.vals.begin());
  uint32_t mag;
  if (t.vals[hi] == a) {
    mag = t.codes[hi];
  } else {
    const double d_lo = a - t.vals[hi - 1], d_hi = t.vals[hi] - a;
    const bool up = d_hi < d_lo || (d_hi == d_lo && (t.codes[hi] & 1) == 0);
    mag = t.codes[up ? hi : hi - 1];
  }
  return sign | resolve_overflow(f, mag);
}

// The code a NaN code comes back as after decode and re-encode.
uint32_t canonical_nan(const Fmt& f, uint32_t c) {
  if (&f == &kF16) return c | 0x200;   // quiet bit set, payload kept
  if (&f == &kBF16) return c | 0x40;
  return (c & f.sign_bit()) | 0x7f;    // e4m3, e5m2
}

// ---- decoding ---------------------------------------------------------------

TEST(DTypeDecode, EveryCodeMatchesFieldFormula) {
  for (const Fmt* f : kAll) {
    for (uint32_t c = 0; c < f->codes(); ++c) {
      const float got = f->decode(c);
      const double want = ref_decode(*f, c);
      const bool neg = (c & f->sign_bit()) != 0;
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got)) << f->name << " code " << c;
      } else {
        ASSERT_EQ(static_cast<double>(got), want) << f->name << " code " << c;
      }
      ASSERT_EQ(std::signbit(got), neg) << f->name << " sign of code " << c;
    }
  }
}

TEST(DTypeDecode, KnownValues) {
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(f8e4m3_to_f32(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(f8e4m3_to_f32(0x38), 1.0f);
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0xff)));
  EXPECT_FALSE(std::isnan(f8e4m3_to_f32(0x78)));  // e4m3fn: exponent 15 is ordinary (256)
  EXPECT_EQ(f8e4m3_to_f32(0x78), 256.0f);
  EXPECT_EQ(f8e5m2_to_f32(0x7b), 57344.0f);
  EXPECT_EQ(f8e5m2_to_f32(0x7c), INFINITY);
  EXPECT_EQ(f8e5m2_to_f32(0xfc), -INFINITY);
  EXPECT_EQ(f8e5m2_to_f32(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0x0001), std::ldexp(1.0f, -133));
  const float e2m1_values[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (uint32_t c = 0; c < 16; ++c) {
    EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(c)), (c & 8 ? -1 : 1) * e2m1_values[c & 7]) << c;
    EXPECT_EQ(bits(e2m1_to_f32(static_cast<uint8_t>(c | 0xf0))), bits(e2m1_to_f32(static_cast<uint8_t>(c))))
        << "high nibble must be ignored, code " << c;
  }
}

TEST(DTypeDecode, F16NaNsComeBackQuietWithPayloadAndSign) {
  EXPECT_EQ(bits(f16_to_f32(0x7c01)), 0x7fc02000u);
  EXPECT_EQ(bits(f16_to_f32(0xfe00)), 0xffc00000u);
  EXPECT_EQ(bits(f16_to_f32(0x7fff)), 0x7fffe000u);
  EXPECT_EQ(bits(f8e4m3_to_f32(0xff)) & 0xffc00000u, 0xffc00000u);
  EXPECT_EQ(bits(f8e5m2_to_f32(0x7d)) & 0xffc00000u, 0x7fc00000u);
}

// ---- encode(decode(c)) --------------------------------------------------------

TEST(DTypeEncode, EveryCodeRoundTrips) {
  for (const Fmt* f : kAll) {
    for (uint32_t c = 0; c < f->codes(); ++c) {
      const uint32_t want = ref_is_nan(*f, c) ? canonical_nan(*f, c) : c;
      ASSERT_EQ(f->encode(f->decode(c)), want) << f->name << " code " << c;
    }
  }
}

// ---- rounding at every midpoint -----------------------------------------------

// For each pair of adjacent representable magnitudes (and the virtual step past
// the largest): the midpoint goes to the even code, one f32 ulp either side to
// the nearer one, with the overflow rule applied to the virtual code.
TEST(DTypeEncode, EveryMidpointRoundsToEvenAndNeighboursToNearer) {
  for (const Fmt* f : kAll) {
    const Table& t = table(*f);
    for (size_t i = 0; i + 1 < t.vals.size(); ++i) {
      const double lo = t.vals[i], hi = t.vals[i + 1], mid = (lo + hi) / 2;
      const uint32_t c_lo = t.codes[i], c_hi = t.codes[i + 1];
      const float m = static_cast<float>(mid);
      ASSERT_EQ(static_cast<double>(m), mid) << f->name << ": midpoint not exact in f32";
      const uint32_t even = resolve_overflow(*f, (c_lo & 1) == 0 ? c_lo : c_hi);
      const uint32_t below = resolve_overflow(*f, c_lo), above = resolve_overflow(*f, c_hi);
      for (uint32_t sign : {0u, f->sign_bit()}) {
        const float s = sign ? -1.0f : 1.0f;
        ASSERT_EQ(f->encode(s * m), sign | even) << f->name << " midpoint " << s * m;
        ASSERT_EQ(f->encode(s * std::nextafter(m, 0.0f)), sign | below) << f->name << " below " << s * m;
        ASSERT_EQ(f->encode(s * std::nextafter(m, INFINITY)), sign | above) << f->name << " above " << s * m;
        if (c_lo <= t.max_code) {
          ASSERT_EQ(f->encode(s * static_cast<float>(lo)), sign | c_lo) << f->name << " " << lo;
        }
      }
    }
  }
}

// ---- f32 -> every format against the table reference, densely ------------------

void expect_matches_reference(const Fmt& f, float x) {
  if (std::isnan(x)) return;
  ASSERT_EQ(f.encode(x), ref_encode(f, x)) << f.name << " of f32 bits 0x" << std::hex << bits(x);
}

// Every sign and exponent, every combination of the kept mantissa bits, and the
// dropped bits at zero, one, just below/at/above half, and all ones.
TEST(DTypeEncode, F16DenseAgainstReference) {
  const uint32_t low[] = {0x0, 0x1, 0x800, 0xfff, 0x1000, 0x1001, 0x1800, 0x1fff};
  for (uint32_t se = 0; se < 512; ++se)
    for (uint32_t kept = 0; kept < 1024; ++kept)
      for (uint32_t l : low) expect_matches_reference(kF16, from_bits((se << 23) | (kept << 13) | l));
}

TEST(DTypeEncode, BF16DenseAgainstReference) {
  const uint32_t low[] = {0x0, 0x1, 0x4000, 0x7fff, 0x8000, 0x8001, 0xc000, 0xffff};
  for (uint32_t se = 0; se < 512; ++se)
    for (uint32_t kept = 0; kept < 128; ++kept)
      for (uint32_t l : low) expect_matches_reference(kBF16, from_bits((se << 23) | (kept << 16) | l));
}

TEST(DTypeEncode, Float8AndFp4DenseAgainstReference) {
  for (const Fmt* f : {&kE4M3, &kE5M2, &kE2M1}) {
    const int drop = 23 - f->man_bits;
    const uint32_t half = 1u << (drop - 1), all = (1u << drop) - 1;
    const uint32_t low[] = {0, 1, half / 2, half - 1, half, half + 1, half + half / 2, all};
    for (uint32_t se = 0; se < 512; ++se)
      for (uint32_t kept = 0; kept < (1u << f->man_bits); ++kept)
        for (uint32_t l : low) expect_matches_reference(*f, from_bits((se << 23) | (kept << drop) | l));
  }
}

TEST(DTypeEncode, RandomBitPatternsAgainstReference) {
  std::mt19937 rng(1234);
  for (int i = 0; i < 300000; ++i) {
    const float x = from_bits(static_cast<uint32_t>(rng()));
    for (const Fmt* f : kAll) expect_matches_reference(*f, x);
  }
  // Concentrated where the small formats live.
  std::uniform_real_distribution<float> mant(-2.0f, 2.0f);
  std::uniform_int_distribution<int> ex(-30, 20);
  for (int i = 0; i < 300000; ++i) {
    const float x = std::ldexp(mant(rng), ex(rng));
    for (const Fmt* f : kAll) expect_matches_reference(*f, x);
  }
}

// ---- specials, saturation, overflow, subnormals -----------------------------------

TEST(DTypeEncode, E4M3SaturatesAndKeepsNaN) {
  EXPECT_EQ(f32_to_f8e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(464.0f), 0x7e);  // tie between 448 and the absent 480
  EXPECT_EQ(f32_to_f8e4m3(std::nextafter(464.0f, INFINITY)), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(480.0f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(1e9f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(std::numeric_limits<float>::max()), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(INFINITY), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(f32_to_f8e4m3(-1e9f), 0xfe);
  EXPECT_EQ(f32_to_f8e4m3(NAN), 0x7f);
  EXPECT_EQ(f32_to_f8e4m3(-NAN), 0xff);
  EXPECT_EQ(f32_to_f8e4m3(from_bits(0x7f800001)), 0x7f);  // signalling NaN is not inf
  EXPECT_EQ(f32_to_f8e4m3(432.0f), 0x7e);                 // tie 416/448 -> even 448
  EXPECT_EQ(f32_to_f8e4m3(std::nextafter(432.0f, 0.0f)), 0x7d);
}

TEST(DTypeEncode, E4M3Subnormals) {
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(1.0f, -9)), 0x01);
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: tie to zero
  EXPECT_EQ(f32_to_f8e4m3(-std::ldexp(1.0f, -10)), 0x80);
  EXPECT_EQ(f32_to_f8e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(3.0f, -10)), 0x02);  // tie 1/2 steps -> even
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(5.0f, -10)), 0x02);  // tie 2/3 steps -> even
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(15.0f, -10)), 0x08);  // tie 7 steps / 2^-6 -> even (min normal)
  EXPECT_EQ(f32_to_f8e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(f32_to_f8e4m3(-std::numeric_limits<float>::min()), 0x80);
  EXPECT_EQ(f32_to_f8e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_f8e4m3(0.0f), 0x00);
}

TEST(DTypeEncode, E5M2OverflowsToInf) {
  EXPECT_EQ(f32_to_f8e5m2(57344.0f), 0x7b);
  EXPECT_EQ(f32_to_f8e5m2(std::nextafter(61440.0f, 0.0f)), 0x7b);
  EXPECT_EQ(f32_to_f8e5m2(61440.0f), 0x7c);
  EXPECT_EQ(f32_to_f8e5m2(-61440.0f), 0xfc);
  EXPECT_EQ(f32_to_f8e5m2(1e9f), 0x7c);
  EXPECT_EQ(f32_to_f8e5m2(INFINITY), 0x7c);
  EXPECT_EQ(f32_to_f8e5m2(-INFINITY), 0xfc);
  EXPECT_EQ(f32_to_f8e5m2(NAN), 0x7f);
  EXPECT_EQ(f32_to_f8e5m2(-NAN), 0xff);
  EXPECT_EQ(f32_to_f8e5m2(from_bits(0x7f800001)), 0x7f);
  EXPECT_EQ(f32_to_f8e5m2(std::ldexp(1.0f, -16)), 0x01);
  EXPECT_EQ(f32_to_f8e5m2(std::ldexp(1.0f, -17)), 0x00);
  EXPECT_EQ(f32_to_f8e5m2(std::nextafter(std::ldexp(1.0f, -17), 1.0f)), 0x01);
}

TEST(DTypeEncode, E2M1TiesSaturationAndNaN) {
  const std::pair<float, float> cases[] = {{0.25f, 0}, {0.75f, 1}, {1.25f, 1}, {1.75f, 2}, {2.5f, 2}, {3.5f, 4},
                                           {5.0f, 4},  {7.0f, 6},  {1e9f, 6},  {0.26f, 0.5f}, {5.01f, 6}};
  for (auto [x, want] : cases) {
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(x)), want) << x;
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(-x)), -want) << -x;
  }
  EXPECT_EQ(f32_to_e2m1(INFINITY), 0x7);
  EXPECT_EQ(f32_to_e2m1(-INFINITY), 0xf);
  EXPECT_EQ(f32_to_e2m1(NAN), 0x7);
  EXPECT_EQ(f32_to_e2m1(-NAN), 0xf);
  EXPECT_EQ(f32_to_e2m1(-0.0f), 0x8);
  EXPECT_EQ(f32_to_e2m1(0.1f), 0x0);
  for (float x : {0.3f, 100.0f, -4.4f, NAN}) EXPECT_EQ(f32_to_e2m1(x) & 0xf0, 0) << "high nibble must stay clear";
}

TEST(DTypeEncode, F16OverflowSubnormalsAndNaN) {
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-65520.0f), 0xfc00);
  EXPECT_EQ(f32_to_f16(INFINITY), 0x7c00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(f32_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.5f, -24)), 0x0400);  // tie at the top subnormal -> min normal
  EXPECT_EQ(f32_to_f16(NAN), 0x7e00);
  EXPECT_EQ(f32_to_f16(-NAN), 0xfe00);
  EXPECT_EQ(f32_to_f16(from_bits(0x7f800001)), 0x7e00);  // payload below f16 precision: still NaN
  EXPECT_EQ(f32_to_f16(from_bits(0x7fa00000)), 0x7f00);  // top payload bits kept
}

TEST(DTypeEncode, BF16RoundingAndNaN) {
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7f7fff)), 0x7f7f);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7f8000)), 0x7f80);  // tie at the top, odd -> rounds into inf
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000)), 0x3f80);  // tie, even stays
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000)), 0x3f82);  // tie, odd goes up
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008000)), 0x0000);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000)), 0x0002);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f800001)), 0x7fc0);  // NaN never truncates or rounds into inf
  EXPECT_EQ(f32_to_bf16(from_bits(0xff800001)), 0xffc0);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7fffffff)), 0x7fff);  // rounding would carry into the sign
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xff80);
}

// ---- integers -------------------------------------------------------------------

TEST(DTypeInt, HalfEvenSaturationAndNaN) {
  EXPECT_EQ(f32_to_i8(2.5f), 2);
  EXPECT_EQ(f32_to_i8(3.5f), 4);
  EXPECT_EQ(f32_to_i8(-2.5f), -2);
  EXPECT_EQ(f32_to_i8(-3.5f), -4);
  EXPECT_EQ(f32_to_i8(0.5f), 0);
  EXPECT_EQ(f32_to_i8(-0.5f), 0);
  EXPECT_EQ(f32_to_i8(std::nextafter(2.5f, 3.0f)), 3);
  EXPECT_EQ(f32_to_i8(std::nextafter(2.5f, 0.0f)), 2);
  EXPECT_EQ(f32_to_i8(126.5f), 126);
  EXPECT_EQ(f32_to_i8(127.5f), 127);
  EXPECT_EQ(f32_to_i8(-128.5f), -128);
  EXPECT_EQ(f32_to_i8(1000.0f), 127);
  EXPECT_EQ(f32_to_i8(-1000.0f), -128);
  EXPECT_EQ(f32_to_i8(INFINITY), 127);
  EXPECT_EQ(f32_to_i8(-INFINITY), -128);
  EXPECT_EQ(f32_to_i8(NAN), 0);
  EXPECT_EQ(f32_to_u8(-3.0f), 0);
  EXPECT_EQ(f32_to_u8(-0.5f), 0);
  EXPECT_EQ(f32_to_u8(1.5f), 2);
  EXPECT_EQ(f32_to_u8(254.5f), 254);
  EXPECT_EQ(f32_to_u8(255.5f), 255);
  EXPECT_EQ(f32_to_u8(300.0f), 255);
  EXPECT_EQ(f32_to_u8(INFINITY), 255);
  EXPECT_EQ(f32_to_u8(NAN), 0);
  EXPECT_EQ(f32_to_i32(3e9f), std::numeric_limits<int32_t>::max());
  EXPECT_EQ(f32_to_i32(2147483648.0f), std::numeric_limits<int32_t>::max());
  EXPECT_EQ(f32_to_i32(-2147483648.0f), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(f32_to_i32(-3e9f), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(f32_to_i32(2147483520.0f), 2147483520);
  EXPECT_EQ(f32_to_i32(4194304.5f), 4194304);
  EXPECT_EQ(f32_to_i32(4194305.5f), 4194306);
  EXPECT_EQ(f32_to_i32(-4194305.5f), -4194306);
  EXPECT_EQ(f32_to_i32(NAN), 0);
  EXPECT_EQ(f32_to_i32(-INFINITY), std::numeric_limits<int32_t>::min());
}

TEST(DTypeInt, EveryHalfIntegerInRange) {
  for (int k = -300; k <= 300; ++k) {
    const float x = static_cast<float>(k) + 0.5f;
    const int even = (k % 2 == 0) ? k : k + 1;  // k or k+1, whichever is even
    EXPECT_EQ(f32_to_i8(x), std::clamp(even, -128, 127)) << x;
    EXPECT_EQ(f32_to_u8(x), std::clamp(even, 0, 255)) << x;
    EXPECT_EQ(f32_to_i32(x), even) << x;
    EXPECT_EQ(f32_to_i32(static_cast<float>(k) + 0.25f), k) << x;
    EXPECT_EQ(f32_to_i32(static_cast<float>(k) + 0.75f), k + 1) << x;
  }
}

TEST(DTypeInt, IgnoresTheFloatingPointRoundingMode) {
  const int saved = std::fegetround();
  std::fesetround(FE_UPWARD);
  const int8_t a = f32_to_i8(2.5f), b = f32_to_i8(-3.5f);
  const int32_t c = f32_to_i32(0.25f);
  std::fesetround(saved);
  EXPECT_EQ(a, 2);
  EXPECT_EQ(b, -4);
  EXPECT_EQ(c, 0);
}

// ---- bulk convert -----------------------------------------------------------------

constexpr DType kConvertible[] = {DType::F32, DType::F16, DType::BF16, DType::F8_E4M3, DType::F8_E5M2,
                                  DType::E2M1, DType::I8,  DType::U8,   DType::I32};

// Source elements of type t, as raw bytes, built from probe values.
std::vector<uint8_t> make_source(DType t, const std::vector<float>& probes) {
  std::vector<uint8_t> out(probes.size() * dtype_size(t));
  for (size_t i = 0; i < probes.size(); ++i) {
    const float x = probes[i];
    uint8_t* p = out.data() + i * dtype_size(t);
    auto put = [p](auto v) { std::memcpy(p, &v, sizeof(v)); };
    switch (t) {
      case DType::F32: put(x); break;
      case DType::F16: put(f32_to_f16(x)); break;
      case DType::BF16: put(f32_to_bf16(x)); break;
      case DType::F8_E4M3: put(f32_to_f8e4m3(x)); break;
      case DType::F8_E5M2: put(f32_to_f8e5m2(x)); break;
      case DType::E2M1: put(f32_to_e2m1(x)); break;
      // Integers take patterns of their own, so negatives and big values appear.
      case DType::I8: put(static_cast<int8_t>(static_cast<int>(i * 37 + 3))); break;
      case DType::U8: put(static_cast<uint8_t>(i * 53 + 7)); break;
      case DType::I32: put(static_cast<int32_t>(static_cast<uint32_t>(i) * 2654435761u)); break;
      default: ADD_FAILURE() << "unexpected type";
    }
  }
  return out;
}

// Element i of a source, exactly, as double (integers exactly too).
double source_value(const std::vector<uint8_t>& src, DType t, size_t i) {
  const uint8_t* p = src.data() + i * dtype_size(t);
  auto get = [p](auto v) {
    std::memcpy(&v, p, sizeof(v));
    return v;
  };
  switch (t) {
    case DType::F32: return get(float{});
    case DType::F16: return ref_decode(kF16, get(uint16_t{}));
    case DType::BF16: return ref_decode(kBF16, get(uint16_t{}));
    case DType::F8_E4M3: return ref_decode(kE4M3, get(uint8_t{}));
    case DType::F8_E5M2: return ref_decode(kE5M2, get(uint8_t{}));
    case DType::E2M1: return ref_decode(kE2M1, get(uint8_t{}));
    case DType::I8: return get(int8_t{});
    case DType::U8: return get(uint8_t{});
    case DType::I32: return get(int32_t{});
    default: return NAN;
  }
}

// The expected destination bytes of one element, from the exact source value.
std::vector<uint8_t> expected_element(double v, DType dst) {
  std::vector<uint8_t> out(dtype_size(dst));
  auto put = [&out](auto x) { std::memcpy(out.data(), &x, sizeof(x)); };
  // NaN sources here carry no payload, so every target gets its default quiet NaN.
  auto fmt_code = [v](const Fmt& f, uint32_t nan_mag) {
    if (!std::isnan(v)) return ref_encode(f, v);
    return (std::signbit(v) ? f.sign_bit() : 0u) | nan_mag;
  };
  auto to_int = [v](double lo, double hi) {
    if (std::isnan(v)) return 0.0;
    const double r = std::nearbyint(v);  // default mode: half even
    return std::clamp(r, lo, hi);
  };
  switch (dst) {
    case DType::F32: put(static_cast<float>(v)); break;
    case DType::F16: put(static_cast<uint16_t>(fmt_code(kF16, 0x7e00))); break;
    case DType::BF16: put(static_cast<uint16_t>(fmt_code(kBF16, 0x7fc0))); break;
    case DType::F8_E4M3: put(static_cast<uint8_t>(fmt_code(kE4M3, 0x7f))); break;
    case DType::F8_E5M2: put(static_cast<uint8_t>(fmt_code(kE5M2, 0x7f))); break;
    case DType::E2M1: put(static_cast<uint8_t>(fmt_code(kE2M1, 0x7))); break;
    case DType::I8: put(static_cast<int8_t>(to_int(-128, 127))); break;
    case DType::U8: put(static_cast<uint8_t>(to_int(0, 255))); break;
    case DType::I32: put(static_cast<int32_t>(to_int(-2147483648.0, 2147483647.0))); break;
    default: ADD_FAILURE() << "unexpected type";
  }
  return out;
}

TEST(DTypeConvert, EverySupportedPairMatchesReference) {
  std::vector<float> probes;
  const float seeds[] = {0.0f, -0.0f, 1.0f, -2.0f, 0.3f, 2.5f, -3.5f, 448.0f, 464.0f, 1000.0f, -1e9f, 65520.0f,
                         61440.0f, 5.0f, 1.75f, 1e-7f, -1e-30f, 300.5f, 127.5f, INFINITY, -INFINITY, NAN, -NAN};
  // More than one internal chunk, so chunk boundaries are crossed.
  for (int rep = 0; rep < 60; ++rep)
    for (float s : seeds) probes.push_back(rep % 2 ? s * (1.0f + static_cast<float>(rep) / 64) : s);
  for (DType st : kConvertible) {
    const auto src = make_source(st, probes);
    for (DType dt : kConvertible) {
      std::vector<uint8_t> dst(probes.size() * dtype_size(dt), 0xcd);
      convert(src.data(), st, dst.data(), dt, probes.size());
      for (size_t i = 0; i < probes.size(); ++i) {
        const double v = source_value(src, st, i);
        std::vector<uint8_t> want = expected_element(v, dt);
        if (st == dt) want.assign(src.begin() + i * dtype_size(st), src.begin() + (i + 1) * dtype_size(st));
        const std::vector<uint8_t> got(dst.begin() + i * dtype_size(dt), dst.begin() + (i + 1) * dtype_size(dt));
        ASSERT_EQ(got, want) << dtype_name(st) << " -> " << dtype_name(dt) << " element " << i << " value " << v;
      }
    }
  }
}

TEST(DTypeConvert, I32ToBF16RoundsOnceNotTwice) {
  // 2^24 + 2^16 + 1 lies just above the bf16 midpoint 2^24 + 2^16; a plain cast
  // to f32 lands exactly on that midpoint and then ties down to 2^24.
  const int32_t in[] = {(1 << 24) + (1 << 16) + 1, -((1 << 24) + (1 << 16) + 1), (1 << 24) + (1 << 16),
                        std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min()};
  uint16_t out[5];
  convert(in, DType::I32, out, DType::BF16, 5);
  EXPECT_EQ(out[0], 0x4b81);
  EXPECT_EQ(out[1], 0xcb81);
  EXPECT_EQ(out[2], 0x4b80);
  EXPECT_EQ(out[3], 0x4f00);  // 2^31 - 1 rounds to 2^31
  EXPECT_EQ(out[4], 0xcf00);
  float f[1];
  convert(in, DType::I32, f, DType::F32, 1);
  EXPECT_EQ(f[0], 16842752.0f);  // to f32 itself: the ordinary RNE cast
}

TEST(DTypeConvert, IntegersClampWithoutFloatDetour) {
  const int32_t big[] = {16777217, -300, 300, std::numeric_limits<int32_t>::min()};
  int32_t same[4];
  convert(big, DType::I32, same, DType::I32, 4);
  EXPECT_EQ(same[0], 16777217);
  int8_t i8[4];
  convert(big, DType::I32, i8, DType::I8, 4);
  EXPECT_EQ(std::vector<int8_t>(i8, i8 + 4), (std::vector<int8_t>{127, -128, 127, -128}));
  uint8_t u8[4];
  convert(big, DType::I32, u8, DType::U8, 4);
  EXPECT_EQ(std::vector<uint8_t>(u8, u8 + 4), (std::vector<uint8_t>{255, 0, 255, 0}));
  const uint8_t u[] = {200, 5};
  int8_t s[2];
  convert(u, DType::U8, s, DType::I8, 2);
  EXPECT_EQ(s[0], 127);
  EXPECT_EQ(s[1], 5);
}

TEST(DTypeConvert, UnalignedBuffersAndNaNPayloadCopy) {
  alignas(8) uint8_t raw[1 + 3 * 4];
  const float in[3] = {1.5f, -2.0f, 448.0f};
  std::memcpy(raw + 1, in, sizeof(in));
  alignas(8) uint8_t out_raw[1 + 3 * 2];
  convert(raw + 1, DType::F32, out_raw + 1, DType::F16, 3);
  uint16_t h[3];
  std::memcpy(h, out_raw + 1, sizeof(h));
  EXPECT_EQ(h[0], 0x3e00);
  EXPECT_EQ(h[1], 0xc000);
  EXPECT_EQ(h[2], 0x5f00);
  const float snan = from_bits(0x7f800001);
  float copy = 0;
  convert(&snan, DType::F32, &copy, DType::F32, 1);
  EXPECT_EQ(bits(copy), 0x7f800001u);
}

TEST(DTypeConvert, SameTypeIsAByteExactCopy) {
  // Including signalling NaNs, which a trip through f32 would quieten.
  std::vector<uint16_t> h(65536), out(65536);
  for (uint32_t c = 0; c < 65536; ++c) h[c] = static_cast<uint16_t>(c);
  for (DType t : {DType::F16, DType::BF16}) {
    convert(h.data(), t, out.data(), t, h.size());
    EXPECT_EQ(out, h) << dtype_name(t);
  }
}

TEST(DTypeConvert, UnsupportedPairsThrow) {
  float f = 1;
  uint64_t big = 0;
  for (auto [s, d] : {std::pair{DType::F32, DType::I64}, {DType::I64, DType::F32}, {DType::F64, DType::F16},
                      {DType::BOOL, DType::U8}, {DType::F16, DType::U16}, {DType::U32, DType::I32}}) {
    try {
      convert(&big, s, &f, d, 0);  // n == 0 still validates the pair
      ADD_FAILURE() << dtype_name(s) << " -> " << dtype_name(d) << " did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
      EXPECT_NE(std::string(e.what()).find(dtype_name(s)), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(dtype_name(d)), std::string::npos) << e.what();
    }
  }
}

// ---- names ----------------------------------------------------------------------------

TEST(DTypeNames, EveryEnumValue) {
  struct Row {
    DType t;
    size_t size;
    const char* name;
    const char* st;
    bool is_float;
  };
  const Row rows[] = {
      {DType::F32, 4, "f32", "F32", true},         {DType::F16, 2, "f16", "F16", true},
      {DType::BF16, 2, "bf16", "BF16", true},      {DType::F8_E4M3, 1, "f8_e4m3", "F8_E4M3", true},
      {DType::F8_E5M2, 1, "f8_e5m2", "F8_E5M2", true}, {DType::E2M1, 1, "e2m1", "F4", true},
      {DType::I8, 1, "i8", "I8", false},           {DType::U8, 1, "u8", "U8", false},
      {DType::I32, 4, "i32", "I32", false},        {DType::I64, 8, "i64", "I64", false},
      {DType::F64, 8, "f64", "F64", true},         {DType::BOOL, 1, "bool", "BOOL", false},
      {DType::I16, 2, "i16", "I16", false},        {DType::U16, 2, "u16", "U16", false},
      {DType::U32, 4, "u32", "U32", false},        {DType::U64, 8, "u64", "U64", false},
  };
  ASSERT_EQ(std::size(rows), static_cast<size_t>(DType::U64) + 1);
  for (const Row& r : rows) {
    EXPECT_EQ(dtype_size(r.t), r.size) << r.name;
    EXPECT_STREQ(dtype_name(r.t), r.name);
    EXPECT_STREQ(safetensors_dtype_name(r.t), r.st);
    EXPECT_EQ(dtype_is_float(r.t), r.is_float) << r.name;
    if (r.t == DType::E2M1) {
      EXPECT_EQ(dtype_from_safetensors(r.st), std::nullopt);  // packed fp4 is not one code per byte
    } else {
      EXPECT_EQ(dtype_from_safetensors(r.st), r.t) << r.st;
    }
  }
  for (const char* bad : {"", "f32", "F8_E4M3FN", "Q4", "F32 "}) EXPECT_EQ(dtype_from_safetensors(bad), std::nullopt) << bad;
  EXPECT_THROW(dtype_name(static_cast<DType>(99)), Error);
}

}  // namespace
}  // namespace qf
