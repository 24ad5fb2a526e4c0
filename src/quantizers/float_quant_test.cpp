// FP8 and NVFP4 weight quantization: hand-computed cases of compressed-tensors'
// conventions (scale formulas, eps substitution, e2m1 ties, saturation, the
// order of operations of the codes), an error bound and dequantize round trips.
#include "quantizers/float_quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "quantizers/distortion.h"
#include "quantizers/rtn.h"

namespace qf {
namespace {

// e2m1 codes: magnitude index 0..7 for {0, .5, 1, 1.5, 2, 3, 4, 6}, sign in bit 3.
constexpr uint8_t kNeg = 8;

std::vector<float> uniform(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(Nvfp4, GlobalScaleIs2688OverAmaxAndOneForZero) {
  EXPECT_EQ(nvfp4_global_scale(2688.0f), 1.0f);
  EXPECT_EQ(nvfp4_global_scale(1.0f), 2688.0f);
  EXPECT_EQ(nvfp4_global_scale(3.0f), 2688.0f / 3.0f);
  EXPECT_EQ(nvfp4_global_scale(0.0f), 1.0f);  // 2688 / FLT_MIN overflows: nan_to_num gives 1
  EXPECT_EQ(nvfp4_global_scale(1e-37f), 1.0f);
  EXPECT_EQ(nvfp4_global_scale(std::numeric_limits<float>::quiet_NaN()), 1.0f);
}

TEST(Nvfp4, RoundingTiesGoToEvenMantissa) {
  // global amax 2688 gives global scale 1; a block amax of 6 gives block scale 1,
  // so the codes are e2m1 of the values themselves.
  const std::vector<float> w = {6, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, -0.25f, -0.75f, -2.5f, -5, 0, -6, 0.3f, 2.6f};
  const QuantizedTensor q = quantize_nvfp4(w.data(), 1, 16, QuantScheme::nvfp4(), 2688.0f);
  EXPECT_EQ(q.global_scale, 1.0f);
  ASSERT_EQ(q.scales.size(), 1u);
  EXPECT_EQ(q.scales[0], 1.0f);
  const std::vector<uint8_t> want = {7, 0, 2, 2, 4, 4, 6, 6, kNeg | 0, kNeg | 2, kNeg | 4, kNeg | 6, 0, kNeg | 7, 1, 5};
  EXPECT_EQ(q.q, want);
  const std::vector<float> dq = q.dequantize();
  const std::vector<float> want_dq = {6, 0, 1, 1, 2, 2, 4, 4, 0, -1, -2, -4, 0, -6, 0.5f, 3};
  EXPECT_EQ(dq, want_dq);
}

TEST(Nvfp4, BlockScaleIsE4m3OfGlobalTimesAmaxOverSix) {
  // Own amax 12: global 224; block 0 amax 12 -> e4m3(448) = 448; block 1 amax 1
  // -> e4m3(224 / 6 = 37.33) = 36 (e4m3 step 4 in [32, 64)); block 2 all zero -> 0.125.
  std::vector<float> w(48, 0.0f);
  w[0] = 12;
  w[1] = -3;
  w[16] = 1;
  w[17] = 0.3f;
  const QuantizedTensor q = quantize_nvfp4(w.data(), 1, 48, QuantScheme::nvfp4());
  EXPECT_EQ(q.global_scale, 224.0f);
  EXPECT_EQ(q.scales, (std::vector<float>{448.0f, 36.0f, 0.125f}));
  EXPECT_EQ(q.q[0], 7);
  EXPECT_EQ(q.q[1], kNeg | 3);  // -3 / (448 / 224) = -1.5
  // 1 / (36 / 224) = 6.22 saturates to 6; 0.3 / (36/224) = 1.8667 -> 2
  EXPECT_EQ(q.q[16], 7);
  EXPECT_EQ(q.q[17], 4);
  for (int i = 32; i < 48; ++i) EXPECT_EQ(q.q[static_cast<size_t>(i)], 0);
}

TEST(Nvfp4, SaturatesBlockScaleAndCodes) {
  // A global amax far below the tensor's: global scale 2688, every block scale
  // saturates to 448 (eff 1/6) and the codes to +-6.
  const std::vector<float> w = {6, -6, 1, -1, 0.5f, 0.1f, 0.05f, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  const QuantizedTensor q = quantize_nvfp4(w.data(), 1, 16, QuantScheme::nvfp4(), 1.0f);
  EXPECT_EQ(q.global_scale, 2688.0f);
  EXPECT_EQ(q.scales[0], 448.0f);
  EXPECT_EQ(q.q[0], 7);
  EXPECT_EQ(q.q[1], kNeg | 7);
  EXPECT_EQ(q.q[2], 7);
  EXPECT_EQ(q.q[3], kNeg | 7);
  EXPECT_EQ(q.q[4], 5);  // 0.5 * 6 = 3
  EXPECT_EQ(q.q[5], 1);  // 0.6 -> 0.5
  EXPECT_EQ(q.q[6], 1);  // 0.3 -> 0.5
}

TEST(Nvfp4, AllZeroTensor) {
  const std::vector<float> w(32, 0.0f);
  const QuantizedTensor q = quantize_nvfp4(w.data(), 2, 16, QuantScheme::nvfp4());
  EXPECT_EQ(q.global_scale, 1.0f);
  EXPECT_EQ(q.scales, (std::vector<float>{0.125f, 0.125f}));
  for (uint8_t c : q.q) EXPECT_EQ(c, 0);
  EXPECT_NO_THROW(q.validate("zero"));
}

TEST(Nvfp4, CodesDivideByTheEffectiveScale) {
  // The code is e2m1(x / (s / g)), not e2m1(x * (g / s)): find inputs where the
  // two differ and check the first is used.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> ug(1.0f, 3000.0f);
  int found = 0;
  for (int it = 0; it < 200000 && found < 20; ++it) {
    const float g = ug(rng);
    const float s = f8e4m3_to_f32(static_cast<uint8_t>(0x30 + rng() % 0x40));
    const float eff = s / g;
    for (float tie : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f}) {
      float x = tie * eff;
      for (int k = 0; k < 4; ++k, x = std::nextafter(x, 1e30f)) {
        const uint8_t a = f32_to_e2m1(x / eff), b = f32_to_e2m1(x * (g / s));
        if (a == b) continue;
        ++found;
        EXPECT_EQ(nvfp4_code(x, s, g), a);
      }
    }
  }
  EXPECT_GT(found, 0);
}

TEST(Nvfp4, NegativeZeroCodes) {
  EXPECT_EQ(nvfp4_code(0.0f, 1, 1), 0);
  EXPECT_EQ(nvfp4_code(-0.0f, 1, 1), 0);
  EXPECT_EQ(nvfp4_code(-0.1f, 1, 1), kNeg);  // rounds to -0: the sign bit stays, as the packer's signbit
  EXPECT_EQ(nvfp4_code(0.1f, 1, 1), 0);
}

double half_step(double v) {  // half the e2m1 spacing around |v|
  v = std::fabs(v);
  return v <= 2 ? 0.25 : v <= 4 ? 0.5 : 1.0;
}

TEST(Nvfp4, ErrorWithinHalfAStepOfTheBlockScale) {
  const int64_t rows = 24, cols = 128;
  std::vector<float> w = uniform(static_cast<size_t>(rows * cols), 3, -1, 1);
  // vary the block magnitudes by up to 100x
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> mag(0.01f, 1.0f);
  for (int64_t b = 0; b < rows * cols / 16; ++b) {
    const float m = mag(rng);
    for (int64_t i = 0; i < 16; ++i) w[static_cast<size_t>(b * 16 + i)] *= m;
  }
  const QuantizedTensor q = quantize_nvfp4(w.data(), rows, cols, QuantScheme::nvfp4());
  ASSERT_NO_THROW(q.validate("nvfp4"));
  const std::vector<float> dq = q.dequantize();
  Distortion d;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      const double eff = static_cast<double>(q.scales[static_cast<size_t>(r * (cols / 16) + c / 16)]) / q.global_scale;
      const double v = w[i] / eff;
      d.add(w[i], dq[i], (std::fabs(v) > 6 ? std::fabs(v) - 6 + 1e-6 : half_step(v)) * eff * (1 + 1e-6));
      // a block scale rounded to e4m3 can undershoot by at most one e4m3 step (1/16 relative)
      ASSERT_LE(std::fabs(v), 6.0 * 17 / 16 + 1e-3);
    }
  EXPECT_LE(d.worst_bound_ratio(), 1.0) << d.describe();
  // Uniform data in each block: the e2m1 grid's mean squared error is about
  // (step^2 / 12) averaged over the grid (steps .5, 1 and 2 of a block scale
  // that maps the block's amax to 6), a relative RMSE near 0.09.
  EXPECT_LT(d.relative_rmse(), 0.12) << d.describe();
  EXPECT_GT(d.relative_rmse(), 0.05) << d.describe();
}

TEST(Nvfp4, DequantizeRoundTrip) {
  const int64_t rows = 8, cols = 64;
  const std::vector<float> w = uniform(static_cast<size_t>(rows * cols), 5, -3, 2);
  const QuantizedTensor q = quantize_nvfp4(w.data(), rows, cols, QuantScheme::nvfp4());
  const std::vector<float> dq = q.dequantize();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      const float bs = q.scales[static_cast<size_t>(r * (cols / 16) + c / 16)];
      EXPECT_EQ(dq[i], e2m1_to_f32(q.q[i]) * (bs / q.global_scale));
      // re-quantizing the decoded value under the same scales gives the same value
      EXPECT_EQ(e2m1_to_f32(nvfp4_code(dq[i], bs, q.global_scale)), e2m1_to_f32(q.q[i]));
    }
  // the global amax argument: a tensor quantized against a shared amax
  const QuantizedTensor q2 = quantize_nvfp4(w.data(), rows, cols, QuantScheme::nvfp4(), 10.0f);
  EXPECT_EQ(q2.global_scale, 268.8f);
}

// Linears vLLM fuses share one global scale: each is quantized against the
// set's amax, its block scales chosen against that global scale.
TEST(Nvfp4, SharedGlobalAmaxSetsTheGlobalScaleAndTheBlocks) {
  const std::vector<float> a = uniform(4 * 32, 7, -2.0f, 2.0f), b = uniform(4 * 32, 8, -8.0f, 8.0f);
  float amax_b = 0;
  for (float x : b) amax_b = std::max(amax_b, std::fabs(x));
  const QuantizedTensor own = quantize_nvfp4(a.data(), 4, 32, QuantScheme::nvfp4());
  const QuantizedTensor qa = quantize_nvfp4(a.data(), 4, 32, QuantScheme::nvfp4(), amax_b);
  const QuantizedTensor qb = quantize_nvfp4(b.data(), 4, 32, QuantScheme::nvfp4(), amax_b);
  EXPECT_EQ(qa.global_scale, nvfp4_global_scale(amax_b));
  EXPECT_EQ(qa.global_scale, qb.global_scale);
  EXPECT_EQ(qb.global_scale, quantize_nvfp4(b.data(), 4, 32, QuantScheme::nvfp4()).global_scale);
  EXPECT_NE(own.global_scale, qa.global_scale);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t g = 0; g < 2; ++g) {
      float m = 0;
      for (int64_t i = 0; i < 16; ++i) m = std::max(m, std::fabs(a[static_cast<size_t>(r * 32 + g * 16 + i)]));
      EXPECT_EQ(qa.scales[static_cast<size_t>(r * 2 + g)], nvfp4_block_scale(m, qa.global_scale));
    }
  // Still within one unit of each block's effective scale (half the widest
  // e2m1 gap, 4 to 6; the e4m3 rounding of the block scale can push a value
  // past 6 by 1/16 at most, clamped at a smaller error).
  const std::vector<float> d = qa.dequantize();
  for (size_t i = 0; i < a.size(); ++i) {
    const float unit = qa.scales[i / 16] / qa.global_scale;
    EXPECT_LE(std::fabs(d[i] - a[i]), unit * (1 + 1e-6f)) << i;
  }
  EXPECT_THROW(quantize_nvfp4(a.data(), 4, 32, QuantScheme::nvfp4(), std::numeric_limits<float>::infinity()), Error);
}

TEST(Nvfp4, RejectsBadInput) {
  std::vector<float> w(20, 1.0f);
  EXPECT_THROW(quantize_nvfp4(w.data(), 1, 20, QuantScheme::nvfp4()), Error);  // 20 % 16
  EXPECT_THROW(quantize_nvfp4(w.data(), 1, 16, QuantScheme::fp8(QuantStrategy::Channel)), Error);
  w[3] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(quantize_nvfp4(w.data(), 1, 16, QuantScheme::nvfp4()), Error);
}

TEST(Fp8, ChannelScaleIsAmaxOver448) {
  const std::vector<float> w = {448, -224, 1, 0.3f, /* row 1 */ 0.5f, -0.25f, 0.1f, 0};
  const QuantizedTensor q = quantize_fp8(w.data(), 2, 4, QuantScheme::fp8(QuantStrategy::Channel));
  ASSERT_EQ(q.scales.size(), 2u);
  EXPECT_EQ(q.scales[0], 1.0f);
  EXPECT_EQ(q.scales[1], 0.5f / 448.0f);
  EXPECT_EQ(q.q[0], 0x7e);  // 448
  EXPECT_EQ(q.q[1], 0xf6);  // -224 = -1.75 * 2^7
  EXPECT_EQ(q.q[2], 0x38);  // 1
  EXPECT_EQ(q.q[3], f32_to_f8e4m3(0.3f));
  EXPECT_EQ(q.q[4], 0x7e);  // the row's amax maps to 448
  for (int i = 0; i < 8; ++i) EXPECT_EQ(q.q[static_cast<size_t>(i)], f32_to_f8e4m3(w[static_cast<size_t>(i)] / q.scales[static_cast<size_t>(i / 4)]));
  EXPECT_TRUE(q.zeros.empty());
  EXPECT_NO_THROW(q.validate("fp8"));
}

TEST(Fp8, ScaleRoundedToScaleDtypeBeforeCodes) {
  const int64_t rows = 6, cols = 32;
  const std::vector<float> w = uniform(static_cast<size_t>(rows * cols), 9, -2.7f, 3.1f);
  for (DType dt : {DType::F16, DType::BF16, DType::F32})
    for (QuantStrategy st : {QuantStrategy::Tensor, QuantStrategy::Channel, QuantStrategy::Group}) {
      const QuantScheme s = QuantScheme::fp8(st, dt, 8);
      const QuantizedTensor q = quantize_fp8(w.data(), rows, cols, s);
      ASSERT_NO_THROW(q.validate("fp8"));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t g = st == QuantStrategy::Group ? c / 8 : 0;
          // amax of the scale's span
          float amax = 0;
          for (int64_t rr = 0; rr < rows; ++rr)
            for (int64_t cc = 0; cc < cols; ++cc) {
              const bool in = st == QuantStrategy::Tensor || (rr == r && (st == QuantStrategy::Channel || cc / 8 == g));
              if (in) amax = std::max(amax, std::fabs(w[static_cast<size_t>(rr * cols + cc)]));
            }
          const float scale = round_scale(amax / 448.0f, dt);
          ASSERT_EQ(q.scales[static_cast<size_t>(q.param_index(r, g))], scale);
          ASSERT_EQ(q.q[static_cast<size_t>(r * cols + c)], f32_to_f8e4m3(w[static_cast<size_t>(r * cols + c)] / scale));
        }
    }
}

TEST(Fp8, SaturatesWhenTheRoundedScaleUndershoots) {
  // bf16 rounds 449 / 448 = 1.00223 down to 1: 449 / 1 saturates to 448, never NaN.
  const std::vector<float> w = {449, -449, 1, 0};
  const QuantizedTensor q = quantize_fp8(w.data(), 1, 4, QuantScheme::fp8(QuantStrategy::Tensor, DType::BF16));
  EXPECT_EQ(q.scales[0], 1.0f);
  EXPECT_EQ(q.q[0], 0x7e);
  EXPECT_EQ(q.q[1], 0xfe);
}

TEST(Fp8, ZeroRowsGetTheDtypeEps) {
  const std::vector<float> w = {0, 0, 0, 0, 1, 2, 3, 4};
  const QuantizedTensor q16 = quantize_fp8(w.data(), 2, 4, QuantScheme::fp8(QuantStrategy::Channel, DType::F16));
  EXPECT_EQ(q16.scales[0], 0.0009765625f);
  const QuantizedTensor q32 = quantize_fp8(w.data(), 2, 4, QuantScheme::fp8(QuantStrategy::Channel, DType::F32));
  EXPECT_EQ(q32.scales[0], std::numeric_limits<float>::epsilon());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(q32.q[static_cast<size_t>(i)], 0);
}

TEST(Fp8, DequantizeRoundTripAndErrorBound) {
  const int64_t rows = 5, cols = 64;
  const std::vector<float> w = uniform(static_cast<size_t>(rows * cols), 11, -5, 5);
  const QuantizedTensor q = quantize_fp8(w.data(), rows, cols, QuantScheme::fp8(QuantStrategy::Channel));
  const std::vector<float> dq = q.dequantize();
  Distortion d;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      const float s = q.scales[static_cast<size_t>(r)];
      EXPECT_EQ(dq[i], f8e4m3_to_f32(q.q[i]) * s);
      EXPECT_EQ(f32_to_f8e4m3(dq[i] / s), q.q[i]);
      // e4m3 has 3 mantissa bits: relative error <= 2^-4 for normals, absolute 2^-10 * s for subnormals
      d.add(w[i], dq[i], std::max(std::fabs(w[i]) / 16.0f, s / 1024.0f) * 1.0001f);
    }
  EXPECT_LE(d.worst_bound_ratio(), 1.0) << d.describe();
  // Half a relative step of 2^-3 at most, about 2^-3 / sqrt(12) on average
  // over a binade: a relative RMSE near 0.036 (data near 0 adds a little).
  EXPECT_LT(d.relative_rmse(), 0.05) << d.describe();
  EXPECT_GT(d.relative_rmse(), 0.01) << d.describe();
  EXPECT_THROW(quantize_fp8(w.data(), rows, cols, QuantScheme::nvfp4()), Error);
}

}  // namespace
}  // namespace qf
