// The shared integer quantizer (quantizers/int_quant.h) over every bit width,
// zero point and code: exact codes come back, midpoints between codes go to
// the even one, values outside the range clamp, NaN gives the zero point.
// Scales are powers of two so that x / scale and the midpoints are exact and
// the expected code is known without any rounding of our own.
#include "quantizers/int_quant.h"

#include <cmath>

#include <gtest/gtest.h>

#include "quantizers/rtn.h"

namespace qf {
namespace {

TEST(IntQuant, EveryCodeRoundTripsAndMidpointsGoToEven) {
  for (int bits = 2; bits <= 8; ++bits) {
    const int32_t qmax = (1 << bits) - 1;
    for (const float scale : {1.0f, 0.0078125f, 64.0f}) {
      for (int32_t zero = 0; zero <= qmax; ++zero) {
        for (int32_t q = 0; q <= qmax; ++q) {
          const float x = hd::dequantize_int(q, scale, zero);
          ASSERT_EQ(x, static_cast<float>(q - zero) * scale);
          ASSERT_EQ(hd::quantize_int(x, scale, zero, qmax), q) << bits << " " << zero << " " << q;
          // Half a step up lies between q and q + 1: the even one wins.
          const float mid = x + scale / 2;
          const int32_t even = (q - zero) % 2 == 0 ? q : q + 1;
          ASSERT_EQ(hd::quantize_int(mid, scale, zero, qmax), even > qmax ? qmax : even) << bits << " " << zero << " " << q;
          ASSERT_EQ(hd::quantize_int(std::nextafter(mid, -INFINITY), scale, zero, qmax), q);
        }
        ASSERT_EQ(hd::quantize_int(hd::dequantize_int(-1, scale, zero), scale, zero, qmax), 0);
        ASSERT_EQ(hd::quantize_int(hd::dequantize_int(qmax + 1, scale, zero), scale, zero, qmax), qmax);
        ASSERT_EQ(hd::quantize_int(INFINITY, scale, zero, qmax), qmax);
        ASSERT_EQ(hd::quantize_int(-INFINITY, scale, zero, qmax), 0);
        ASSERT_EQ(hd::quantize_int(NAN, scale, zero, qmax), zero);
      }
    }
  }
}

TEST(IntQuant, RtnUsesTheSharedFormula) {
  const QuantScheme s = QuantScheme::make(4, false, QuantStrategy::Channel);
  const GroupParams p{0.3f, 5};
  for (float x = -4.0f; x <= 4.0f; x += 0.01f) {
    ASSERT_EQ(quantize_value(x, p, s), hd::quantize_int(x, p.scale, p.zero, s.qmax())) << x;
    const uint8_t q = quantize_value(x, p, s);
    ASSERT_EQ(dequantize_value(q, p), hd::dequantize_int(q, p.scale, p.zero));
  }
}

TEST(IntQuant, Int8ActivationCodesRoundHalfEvenAndClamp) {
  for (const int32_t zero : {0, -37, 100}) {
    for (int32_t q = -128; q <= 127; ++q) {
      const float x = static_cast<float>(q - zero) * 0.25f;
      ASSERT_EQ(hd::quantize_int8(x, 0.25f, zero), q);
      if (q < 127) {
        const int32_t even = (q % 2 == 0) ? q : q + 1;
        ASSERT_EQ(hd::quantize_int8(x + 0.125f, 0.25f, zero), even) << zero << " " << q;
      }
    }
    EXPECT_EQ(hd::quantize_int8(1e30f, 0.25f, zero), 127);
    EXPECT_EQ(hd::quantize_int8(-1e30f, 0.25f, zero), -128);
    EXPECT_EQ(hd::quantize_int8(INFINITY, 0.25f, zero), 127);
  }
}

}  // namespace
}  // namespace qf
