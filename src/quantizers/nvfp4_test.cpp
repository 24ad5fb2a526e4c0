// NVFP4's shared element math (quantizers/nvfp4.h): every e2m1 code under
// every positive e4m3 block scale, the rounding ties between codes, and the
// block scale's rounding, saturation and zero substitute.
#include "quantizers/nvfp4.h"

#include <cmath>
#include <type_traits>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "quantizers/float_quant.h"

namespace qf {
namespace {

// The eight e2m1 magnitudes in code order.
constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

TEST(Nvfp4, EveryCodeUnderEveryBlockScaleRoundTrips) {
  for (const float global : {1.0f, 2688.0f, 0.375f}) {
    for (uint32_t sc = 1; sc < 0x7f; ++sc) {  // every positive finite e4m3 scale
      const float bs = f8e4m3_to_f32(static_cast<uint8_t>(sc));
      for (uint8_t c = 0; c < 16; ++c) {
        const float v = hd::nvfp4_value(c, bs, global);
        ASSERT_EQ(v, e2m1_to_f32(c) * (bs / global));
        // -0 (code 8) comes back as +0: an exact zero quotient packs as 0.
        ASSERT_EQ(hd::nvfp4_code(v, bs, global), c == 8 ? 0 : c) << global << " " << bs << " " << int(c);
      }
    }
  }
}

TEST(Nvfp4, TiesBetweenCodesGoToTheEvenMantissa) {
  // Midpoints 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 and the code each rounds to.
  const uint8_t want[7] = {0, 2, 2, 4, 4, 6, 6};
  for (int i = 0; i < 7; ++i) {
    const float mid = (kE2m1[i] + kE2m1[i + 1]) / 2;
    EXPECT_EQ(hd::nvfp4_code(mid, 1.0f, 1.0f), want[i]) << mid;
    EXPECT_EQ(hd::nvfp4_code(-mid, 1.0f, 1.0f), want[i] | 8) << -mid;
    EXPECT_EQ(hd::nvfp4_code(std::nextafter(mid, 0.0f), 1.0f, 1.0f), i) << mid;
    EXPECT_EQ(hd::nvfp4_code(std::nextafter(mid, 10.0f), 1.0f, 1.0f), i + 1) << mid;
  }
  EXPECT_EQ(hd::nvfp4_code(100.0f, 1.0f, 1.0f), 7);      // saturates to 6
  EXPECT_EQ(hd::nvfp4_code(-0.1f, 1.0f, 1.0f), 8);       // rounds to -0, keeps the sign
  EXPECT_EQ(hd::nvfp4_code(-0.0f, 1.0f, 1.0f), 0);       // exact zero quotient
}

TEST(Nvfp4, BlockScaleRoundsToE4m3SaturatesAndReplacesZero) {
  for (uint32_t sc = 1; sc < 0x7f; ++sc) {
    const float v = f8e4m3_to_f32(static_cast<uint8_t>(sc));
    // amax 6 * v against global 1 asks for exactly v (6v and 6v / 6 are exact in f32).
    ASSERT_EQ(hd::nvfp4_block_scale(6.0f * v, 1.0f), v) << v;
    ASSERT_EQ(hd::nvfp4_block_scale(3.0f * v, 2.0f), v) << v;
  }
  EXPECT_EQ(hd::nvfp4_block_scale(0.0f, 2688.0f), 0.125f);
  EXPECT_EQ(hd::nvfp4_block_scale(1e-30f, 1.0f), 0.125f);  // rounds to zero
  EXPECT_EQ(hd::nvfp4_block_scale(1e30f, 1.0f), 448.0f);    // saturates
  // The weight quantizer's names are the shared functions.
  static_assert(std::is_same_v<std::integral_constant<decltype(&qf::nvfp4_block_scale), &qf::nvfp4_block_scale>,
                               std::integral_constant<decltype(&hd::nvfp4_block_scale), &hd::nvfp4_block_scale>>);
}

}  // namespace
}  // namespace qf
