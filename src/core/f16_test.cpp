// The shared f16 conversions (core/f16.h) against the compiler's own _Float16
// conversions (libgcc's soft-float routines on x86-64 without F16C), an
// implementation written independently of ours: every one of the 65536 codes
// decoded, and every code, every midpoint between neighbours and the f32
// values just either side of each midpoint encoded. dtype_test.cpp checks
// all five formats (f16.h, bf16.h, f8_e4m3.h, f8_e5m2.h, e2m1.h) through
// dtype.h's names, which are these same functions.
#include "core/f16.h"

#include <cmath>
#include <cstring>
#include <type_traits>

#include <gtest/gtest.h>

#include "core/bf16.h"
#include "core/dtype.h"
#include "core/e2m1.h"
#include "core/f8_e4m3.h"
#include "core/f8_e5m2.h"

namespace qf {
namespace {

// dtype.h re-exports the shared functions rather than wrapping a second copy:
// the same function is the same template argument.
template <auto F, auto G>
constexpr bool kSameFunction = std::is_same_v<std::integral_constant<decltype(F), F>, std::integral_constant<decltype(G), G>>;
static_assert(kSameFunction<&qf::f16_to_f32, &hd::f16_to_f32> && kSameFunction<&qf::f32_to_f16, &hd::f32_to_f16>);
static_assert(kSameFunction<&qf::bf16_to_f32, &hd::bf16_to_f32> && kSameFunction<&qf::f32_to_bf16, &hd::f32_to_bf16>);
static_assert(kSameFunction<&qf::f8e4m3_to_f32, &hd::f8e4m3_to_f32> && kSameFunction<&qf::f32_to_f8e4m3, &hd::f32_to_f8e4m3>);
static_assert(kSameFunction<&qf::f8e5m2_to_f32, &hd::f8e5m2_to_f32> && kSameFunction<&qf::f32_to_f8e5m2, &hd::f32_to_f8e5m2>);
static_assert(kSameFunction<&qf::e2m1_to_f32, &hd::e2m1_to_f32> && kSameFunction<&qf::f32_to_e2m1, &hd::f32_to_e2m1>);

_Float16 half_of(uint16_t c) {
  _Float16 h;
  std::memcpy(&h, &c, 2);
  return h;
}

uint16_t code_of(_Float16 h) {
  uint16_t c;
  std::memcpy(&c, &h, 2);
  return c;
}

bool is_nan_code(uint16_t c) { return (c & 0x7c00u) == 0x7c00u && (c & 0x3ffu) != 0; }

TEST(F16, EveryCodeDecodesAsTheCompilerDoes) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const auto code = static_cast<uint16_t>(c);
    const float want = static_cast<float>(half_of(code)), got = hd::f16_to_f32(code);
    if (is_nan_code(code)) {
      ASSERT_TRUE(std::isnan(got)) << c;
      ASSERT_EQ(std::signbit(got), std::signbit(want)) << c;
      // Quiet, with the 10-bit payload in the top mantissa bits.
      ASSERT_EQ(hd::bits_of(got) & 0x7fffffffu, 0x7fc00000u | ((c & 0x3ffu) << 13)) << c;
    } else {
      ASSERT_EQ(hd::bits_of(got), hd::bits_of(want)) << "code 0x" << std::hex << c;
    }
  }
}

void expect_encodes_as_compiler(float x) {
  const uint16_t got = hd::f32_to_f16(x), want = code_of(static_cast<_Float16>(x));
  ASSERT_EQ(got, want) << "f32 bits 0x" << std::hex << hd::bits_of(x);
}

TEST(F16, EveryCodeMidpointAndNeighbourEncodesAsTheCompilerDoes) {
  for (uint32_t c = 0; c < 0x7c00u; ++c) {  // every finite non-negative code
    for (const float sign : {1.0f, -1.0f}) {
      const float lo = hd::f16_to_f32(static_cast<uint16_t>(c));
      // The next value up: the next code, or for the largest finite code the
      // virtual step 65536 where rounding overflows to inf.
      const float hi = c + 1 < 0x7c00u ? hd::f16_to_f32(static_cast<uint16_t>(c + 1)) : 65536.0f;
      const float mid = lo + (hi - lo) / 2;  // exact: f16 values have 11 significant bits
      expect_encodes_as_compiler(sign * lo);
      expect_encodes_as_compiler(sign * mid);
      expect_encodes_as_compiler(sign * std::nextafter(mid, 0.0f));
      expect_encodes_as_compiler(sign * std::nextafter(mid, INFINITY));
    }
  }
  expect_encodes_as_compiler(INFINITY);
  expect_encodes_as_compiler(-INFINITY);
  expect_encodes_as_compiler(1e-30f);   // far below the smallest subnormal: +0
  expect_encodes_as_compiler(-1e-30f);  // -0
}

TEST(F16, NaNsEncodeQuietKeepingSignAndTopPayload) {
  for (const uint32_t payload : {0x1u, 0x2000u, 0x3fffffu, 0x400000u, 0x7fffffu}) {
    for (const uint32_t sign : {0u, 0x80000000u}) {
      const uint16_t c = hd::f32_to_f16(hd::float_of(sign | 0x7f800000u | payload));
      EXPECT_TRUE(is_nan_code(c)) << payload;
      EXPECT_EQ(c & 0x8000u, sign >> 16);
      EXPECT_EQ(c & 0x3ffu, 0x200u | ((payload >> 13) & 0x3ffu));
    }
  }
}

}  // namespace
}  // namespace qf
