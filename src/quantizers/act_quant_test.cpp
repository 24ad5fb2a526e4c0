// Activation quantizers against compressed-tensors' conventions: int8 per-token
// amax / 127.5 with x / scale (not x * (1 / scale)), the static asymmetric zero
// point added before rounding, FP8 amax / 448, NVFP4 "local" block scales
// against the static global scale, zero rows.
#include "quantizers/act_quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "quantizers/distortion.h"
#include "quantizers/float_quant.h"

namespace qf {
namespace {

struct Int8Out {
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<int32_t> zero;
};

Int8Out q8(const ActQuantParams& p, const std::vector<float>& x, int64_t n) {
  const int64_t in = static_cast<int64_t>(x.size()) / n;
  Int8Out o{std::vector<int8_t>(x.size()), std::vector<float>(static_cast<size_t>(n)), std::vector<int32_t>(static_cast<size_t>(n))};
  quantize_activations_int8(p, x.data(), n, in, o.q.data(), o.scale.data(), o.zero.data());
  return o;
}

TEST(ActQuant, Int8TokenScaleIsAmaxOver127_5) {
  ActQuantParams p = calibrate_activation(ActivationScheme::int8_token(), 0, 0, "t");
  const std::vector<float> x = {127.5f, -127.5f, 2.5f, -0.5f, /* row 1 */ 2.0f, -0.25f, 1.0f, 0.01f};
  const Int8Out o = q8(p, x, 2);
  EXPECT_EQ(o.scale[0], 1.0f);  // 127.5 / 127.5
  EXPECT_EQ(o.scale[1], 2.0f / 127.5f);
  // 127.5 clamps to 127; -127.5 rounds half to even to -128; 2.5 -> 2; -0.5 -> 0
  EXPECT_EQ(o.q[0], 127);
  EXPECT_EQ(o.q[1], -128);
  EXPECT_EQ(o.q[2], 2);
  EXPECT_EQ(o.q[3], 0);
  EXPECT_EQ(o.q[4], 127);
  EXPECT_EQ(o.q[5], -16);  // -15.9375
  EXPECT_EQ(o.q[6], 64);   // 63.75
  EXPECT_EQ(o.zero[0], 0);
  // the fake-quantized values are (q - z) * scale
  std::vector<float> y = x;
  quantize_activations(p, y.data(), 2, 4);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], static_cast<float>(o.q[i]) * o.scale[i / 4]);
}

TEST(ActQuant, Int8DividesByTheScale) {
  // Rows whose codes differ between round(x / s) and round(x * (1 / s)).
  int found = 0;
  for (float amax : {1.0f, 1.3f, 0.7f, 2.9f, 5.3f, 0.37f}) {
    const float s = amax / 127.5f, inv = 1.0f / s;
    for (int k = -127; k < 127 && found < 20; ++k) {
      float x = (static_cast<float>(k) + 0.5f) * s;
      x = std::nextafter(std::nextafter(x, -1e30f), -1e30f);
      for (int j = 0; j < 5; ++j, x = std::nextafter(x, 1e30f)) {
        const float a = std::nearbyint(x / s), b = std::nearbyint(x * inv);
        if (a == b) continue;
        ++found;
        const std::vector<float> row = {amax, x};
        const Int8Out o = q8(calibrate_activation(ActivationScheme::int8_token(), 0, 0, "t"), row, 1);
        ASSERT_EQ(o.scale[0], s);
        EXPECT_EQ(o.q[1], static_cast<int8_t>(a)) << x;
      }
    }
  }
  EXPECT_GT(found, 0);
}

TEST(ActQuant, Int8StaticSymmetricAndAsymmetric) {
  const ActQuantParams sym = calibrate_activation(ActivationScheme::int8_tensor_static(), -2.0f, 1.0f, "t");
  EXPECT_EQ(sym.scale, 2.0f / 127.5f);
  EXPECT_EQ(sym.zero_point, 0);
  ActivationScheme as = ActivationScheme::int8_tensor_static();
  as.symmetric = false;
  // scale (3 - (-1)) / 255, zero round(-128 - (-1) / scale) = round(-64.25) = -64
  const ActQuantParams asym = calibrate_activation(as, -1.0f, 3.0f, "t");
  EXPECT_EQ(asym.scale, 4.0f / 255.0f);
  EXPECT_EQ(asym.zero_point, -64);
  // ranges include zero: [0.5, 3] is treated as [0, 3], zero point -128
  EXPECT_EQ(calibrate_activation(as, 0.5f, 3.0f, "t").zero_point, -128);

  const std::vector<float> x = {-1.0f, 3.0f, 0.0f, 10.0f, -5.0f};
  const Int8Out o = q8(asym, x, 1);
  EXPECT_EQ(o.scale[0], asym.scale);
  EXPECT_EQ(o.zero[0], -64);
  EXPECT_EQ(o.q[0], -128);  // -63.75 - 64 = -127.75
  EXPECT_EQ(o.q[1], 127);   // 191.25 - 64 = 127.25
  EXPECT_EQ(o.q[2], -64);
  EXPECT_EQ(o.q[3], 127);
  EXPECT_EQ(o.q[4], -128);
}

TEST(ActQuant, Int8ZeroPointIsAddedBeforeRounding) {
  // compressed-tensors rounds x / scale + zero (in f32), which differs from
  // round(x / scale) + zero when the sum itself rounds to a tie.
  ActivationScheme as = ActivationScheme::int8_tensor_static();
  as.symmetric = false;
  const ActQuantParams p = calibrate_activation(as, -1.0f, 3.0f, "t");
  int found = 0;
  for (int k = -60; k < 180 && found < 10; ++k) {
    float x = (static_cast<float>(k) + 0.5f) * p.scale;
    for (int j = 0; j < 40; ++j, x = std::nextafter(x, 1e30f)) {
      const float t = x / p.scale;
      const float a = std::nearbyint(std::clamp(t + static_cast<float>(p.zero_point), -128.0f, 127.0f));
      const float b = std::clamp(std::nearbyint(t) + static_cast<float>(p.zero_point), -128.0f, 127.0f);
      if (a == b) continue;
      ++found;
      const Int8Out o = q8(p, {x}, 1);
      EXPECT_EQ(o.q[0], static_cast<int8_t>(a)) << x;
    }
  }
  EXPECT_GT(found, 0);
}

TEST(ActQuant, Fp8TokenAndStatic) {
  std::vector<float> x = {896.0f, 3.0f, -1.0f, 0.1f, /* zero row */ 0, 0, 0, 0};
  quantize_activations(calibrate_activation(ActivationScheme::fp8_token(), 0, 0, "t"), x.data(), 2, 4);
  // scale 896 / 448 = 2: 896 -> 448 * 2, 3 -> 1.5 * 2, -1 -> -0.5 * 2, 0.1 -> e4m3(0.05) * 2
  EXPECT_EQ(x[0], 896.0f);
  EXPECT_EQ(x[1], 3.0f);
  EXPECT_EQ(x[2], -1.0f);
  EXPECT_EQ(x[3], f8e4m3_to_f32(f32_to_f8e4m3(0.1f / 2.0f)) * 2.0f);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(x[static_cast<size_t>(i)], 0.0f);

  const ActQuantParams st = calibrate_activation(ActivationScheme::fp8_tensor_static(), -4.48f, 2.0f, "t");
  EXPECT_EQ(st.scale, 4.48f / 448.0f);
  std::vector<float> y = {100.0f, -1.0f};
  quantize_activations(st, y.data(), 1, 2);
  EXPECT_EQ(y[0], 448.0f * st.scale);  // saturates
  EXPECT_EQ(y[1], f8e4m3_to_f32(f32_to_f8e4m3(-1.0f / st.scale)) * st.scale);
}

// Per-token activation quantization, measured by the shared distortion
// measure: int8 within half a step (amax / 127.5 / 2) of every value, FP8
// within half a relative step of 2^-3 (or half a subnormal step, 2^-10 of the
// scale), on Gaussian rows with a different magnitude each.
TEST(ActQuant, PerTokenRoundTripDistortion) {
  const int64_t n = 32, in = 128;
  std::mt19937 rng(17);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * in));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < in; ++c) x[static_cast<size_t>(r * in + c)] = g(rng) * std::pow(2.0f, static_cast<float>(r % 9) - 4);
  for (const ActivationScheme& s : {ActivationScheme::int8_token(), ActivationScheme::fp8_token()}) {
    std::vector<float> y = x;
    quantize_activations(calibrate_activation(s, 0, 0, "t"), y.data(), n, in);
    Distortion d;
    for (int64_t r = 0; r < n; ++r) {
      float amax = 0;
      for (int64_t c = 0; c < in; ++c) amax = std::max(amax, std::fabs(x[static_cast<size_t>(r * in + c)]));
      for (int64_t c = 0; c < in; ++c) {
        const size_t i = static_cast<size_t>(r * in + c);
        const double bound = s.type == QuantType::Int ? amax / 127.5 / 2
                                                      : std::max(std::fabs(x[i]) / 16.0, amax / 448.0 / 1024.0);
        // + float rounding of the scale and of the product: < 2^-15 of the bound
        d.add(x[i], y[i], bound * (1 + 0x1p-13));
      }
    }
    SCOPED_TRACE(s.describe() + ": " + d.describe());
    EXPECT_LE(d.worst_bound_ratio(), 1.0);
    // int8: step / sqrt(12) with step = amax / 127.5 and amax about 2.9 sigma
    // for 128 values: 0.0066; FP8: about 2^-3 / sqrt(12) = 0.036 relative.
    EXPECT_LT(d.relative_rmse(), s.type == QuantType::Int ? 0.01 : 0.045);
    EXPECT_GT(d.relative_rmse(), s.type == QuantType::Int ? 0.004 : 0.02);
  }
}

TEST(ActQuant, ZeroRangesUseTheF32Eps) {
  const float eps = std::numeric_limits<float>::epsilon();
  EXPECT_EQ(calibrate_activation(ActivationScheme::int8_tensor_static(), 0, 0, "t").scale, eps);
  EXPECT_EQ(calibrate_activation(ActivationScheme::fp8_tensor_static(), 0, 0, "t").scale, eps);
  const Int8Out o = q8(calibrate_activation(ActivationScheme::int8_token(), 0, 0, "t"), {0, 0, 0}, 1);
  EXPECT_EQ(o.scale[0], eps);
  for (int8_t v : o.q) EXPECT_EQ(v, 0);
}

TEST(ActQuant, Nvfp4LocalBlocksAgainstTheStaticGlobalScale) {
  const ActQuantParams p = calibrate_activation(ActivationScheme::nvfp4(), -2688.0f, 100.0f, "t");
  EXPECT_EQ(p.global_scale, 1.0f);
  EXPECT_EQ(calibrate_activation(ActivationScheme::nvfp4(), 0, 0, "t").global_scale, 1.0f);
  EXPECT_EQ(calibrate_activation(ActivationScheme::nvfp4(), -1, 3, "t").global_scale, 896.0f);

  // Global scale 1: a block with amax 6 has scale 1 and codes the values themselves.
  std::vector<float> x(32, 0.0f);
  const float vals[] = {6, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, -0.3f, -2.6f};
  for (size_t i = 0; i < 10; ++i) x[i] = vals[i];
  quantize_activations(p, x.data(), 1, 32);
  const float want[] = {6, 0, 1, 1, 2, 2, 4, 4, -0.5f, -3};
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(x[i], want[i]) << i;
  for (size_t i = 16; i < 32; ++i) EXPECT_EQ(x[i], 0.0f);  // a zero block stays zero

  // The same values as the weight quantizer gives with the same global amax.
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = 3, in = 64;
  std::vector<float> a(static_cast<size_t>(n * in));
  for (auto& v : a) v = nd(rng);
  const ActQuantParams pc = calibrate_activation(ActivationScheme::nvfp4(), -3.0f, 2.5f, "t");
  const QuantizedTensor w = quantize_nvfp4(a.data(), n, in, QuantScheme::nvfp4(), 3.0f);
  EXPECT_EQ(w.global_scale, pc.global_scale);
  std::vector<float> b = a;
  quantize_activations(pc, b.data(), n, in);
  EXPECT_EQ(b, w.dequantize());
}

TEST(ActQuant, Validation) {
  ActivationScheme s = ActivationScheme::int8_token();
  s.dynamic = false;
  EXPECT_THROW(calibrate_activation(s, -1, 1, "t"), Error);
  EXPECT_THROW(calibrate_activation(ActivationScheme::int8_tensor_static(), -1, std::nanf(""), "t"), Error);
  EXPECT_EQ(ActivationScheme::int8_token().describe(), "int8 token dynamic");
  EXPECT_EQ(ActivationScheme::fp8_tensor_static().describe(), "fp8 tensor static");
  EXPECT_EQ(ActivationScheme::nvfp4().describe(), "nvfp4");
}

}  // namespace
}  // namespace qf
