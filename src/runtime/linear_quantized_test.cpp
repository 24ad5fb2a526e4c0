// make_quantized_linear for every weight x activation combination against a
// double-precision reference built from QuantizedTensor::dequantize() and
// quantize_activations on a copy of x; results independent of the thread
// count (and, on the int8 GEMM path, of the SIMD level); honest byte counts
// and format strings.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "quantizers/act_quant.h"
#include "quantizers/float_quant.h"
#include "quantizers/rtn.h"
#include "runtime/cpu/kernels.h"
#include "runtime/linear.h"

namespace qf::rt {
namespace {

constexpr int64_t kIn = 96, kOut = 37, kTokens = 7;

std::vector<float> randn(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

enum class W { Int8Channel, Int8Tensor, Int4Group, Fp8Tensor, Fp8Channel, Nvfp4 };

QuantizedTensor make_weight(W kind, const std::vector<float>& w) {
  switch (kind) {
    case W::Int8Channel: return quantize_rtn(w.data(), kOut, kIn, QuantScheme::make(8, true, QuantStrategy::Channel, 0, DType::BF16));
    case W::Int8Tensor: return quantize_rtn(w.data(), kOut, kIn, QuantScheme::make(8, true, QuantStrategy::Tensor, 0, DType::F32));
    case W::Int4Group: return quantize_rtn(w.data(), kOut, kIn, QuantScheme::make(4, true, QuantStrategy::Group, 32));
    case W::Fp8Tensor: return quantize_fp8(w.data(), kOut, kIn, QuantScheme::fp8(QuantStrategy::Tensor));
    case W::Fp8Channel: return quantize_fp8(w.data(), kOut, kIn, QuantScheme::fp8(QuantStrategy::Channel, DType::BF16));
    case W::Nvfp4: return quantize_nvfp4(w.data(), kOut, kIn, QuantScheme::nvfp4());
  }
  return {};
}

struct Case {
  std::string name;
  W weight;
  std::optional<ActivationScheme> act;
  std::string format;
  bool int8_gemm = false;
};

ActivationScheme int8_static_asym() {
  ActivationScheme s = ActivationScheme::int8_tensor_static();
  s.symmetric = false;
  return s;
}

std::vector<Case> cases() {
  return {
      {"int8_token", W::Int8Channel, ActivationScheme::int8_token(), "int8 sym channel / int8 token dynamic", true},
      {"int8_static_sym", W::Int8Channel, ActivationScheme::int8_tensor_static(), "int8 sym channel / int8 tensor static", true},
      {"int8_static_asym", W::Int8Channel, int8_static_asym(), "int8 sym channel / int8 asym tensor static", true},
      {"int8_tensor_token", W::Int8Tensor, ActivationScheme::int8_token(), "int8 sym tensor / int8 token dynamic", true},
      {"int4_group_int8_token", W::Int4Group, ActivationScheme::int8_token(), "int4 sym g32 / int8 token dynamic"},
      {"fp8_tensor_fp8_token", W::Fp8Tensor, ActivationScheme::fp8_token(), "fp8 tensor / fp8 token dynamic"},
      {"fp8_channel_fp8_token", W::Fp8Channel, ActivationScheme::fp8_token(), "fp8 channel / fp8 token dynamic"},
      {"fp8_channel_fp8_static", W::Fp8Channel, ActivationScheme::fp8_tensor_static(), "fp8 channel / fp8 tensor static"},
      {"fp8_tensor_fp8_static", W::Fp8Tensor, ActivationScheme::fp8_tensor_static(), "fp8 tensor / fp8 tensor static"},
      {"nvfp4_nvfp4", W::Nvfp4, ActivationScheme::nvfp4(), "nvfp4 / nvfp4"},
      {"nvfp4_weight_only", W::Nvfp4, std::nullopt, "nvfp4"},
      {"fp8_weight_only", W::Fp8Channel, std::nullopt, "fp8 channel"},
  };
}

std::vector<float> run(const Linear& lin, const std::vector<float>& x, int threads) {
  ThreadPool pool(threads);
  std::vector<float> y(static_cast<size_t>(kTokens * kOut), -1.0f);
  lin.forward(x.data(), kTokens, y.data(), pool);
  return y;
}

TEST(QuantizedLinear, EveryCombinationMatchesTheDequantizedReference) {
  const std::vector<float> w = randn(static_cast<size_t>(kOut * kIn), 1, 0.05f);
  std::vector<float> x = randn(static_cast<size_t>(kTokens * kIn), 2, 1.0f);
  x[5] = 7.0f;  // an outlier column value
  Tensor bias = Tensor::zeros(DType::F32, {kOut});
  const std::vector<float> bv = randn(static_cast<size_t>(kOut), 3, 0.1f);
  std::copy(bv.begin(), bv.end(), bias.mutable_data_as<float>());
  const float xmin = *std::min_element(x.begin(), x.end()), xmax = *std::max_element(x.begin(), x.end());

  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const QuantizedTensor q = make_weight(c.weight, w);
    std::optional<ActQuantParams> p;
    // calibrate on a slightly narrower range, so static scales clip a little
    if (c.act) p = calibrate_activation(*c.act, 0.9f * xmin, 0.9f * xmax, c.name);
    const auto lin = make_quantized_linear(q, p ? &*p : nullptr, &bias, c.name);
    EXPECT_EQ(lin->format(), c.format);
    EXPECT_EQ(lin->in_features(), kIn);
    EXPECT_EQ(lin->out_features(), kOut);

    std::vector<float> xq = x;
    if (p) quantize_activations(*p, xq.data(), kTokens, kIn);
    const std::vector<float> wd = q.dequantize();
    // The runtime's y is the f32 sum of kIn products of these values (exact
    // integer sums for int8 x int8) scaled by a few f32 multiplies, plus the
    // bias: within gamma(kIn + 4) (sum |x w| + |b|) of the exact value, at
    // every SIMD level (u = 2^-24, gamma(n) = n u / (1 - n u)).
    const double u = 1.0 / 16777216.0, g = (kIn + 4) * u / (1 - (kIn + 4) * u);
    std::vector<double> ref(static_cast<size_t>(kTokens * kOut)), bound(ref.size());
    for (int64_t t = 0; t < kTokens; ++t)
      for (int64_t j = 0; j < kOut; ++j) {
        double s = bv[static_cast<size_t>(j)], mag = std::fabs(bv[static_cast<size_t>(j)]);
        for (int64_t i = 0; i < kIn; ++i) {
          const double p = static_cast<double>(xq[static_cast<size_t>(t * kIn + i)]) * wd[static_cast<size_t>(j * kIn + i)];
          s += p, mag += std::fabs(p);
        }
        ref[static_cast<size_t>(t * kOut + j)] = s;
        bound[static_cast<size_t>(t * kOut + j)] = g * mag;
      }
    const std::vector<float> y1 = run(*lin, x, 1), y2 = run(*lin, x, 2);
    EXPECT_EQ(y1, y2);
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(y1[i], ref[i], bound[i]) << "element " << i;

    // decode_row gives the dequantized weights exactly
    std::vector<float> row(static_cast<size_t>(kIn));
    for (int64_t r : {int64_t{0}, kOut - 1}) {
      lin->decode_row(r, row.data());
      for (int64_t i = 0; i < kIn; ++i) ASSERT_EQ(row[static_cast<size_t>(i)], wd[static_cast<size_t>(r * kIn + i)]);
    }

    const uint64_t elems = static_cast<uint64_t>(kOut * kIn);
    switch (c.weight) {
      case W::Int8Channel:
      case W::Int8Tensor:
        if (c.int8_gemm) {
          EXPECT_EQ(lin->weight_bytes(), elems + 8 * kOut);
        }
        break;
      case W::Int4Group: EXPECT_EQ(lin->weight_bytes(), elems / 2 + 2 * 4 * (kIn / 32) * kOut); break;  // packed + scales + zeros
      case W::Fp8Tensor: EXPECT_EQ(lin->weight_bytes(), elems + 4); break;
      case W::Fp8Channel: EXPECT_EQ(lin->weight_bytes(), elems + 4 * kOut); break;
      case W::Nvfp4: EXPECT_EQ(lin->weight_bytes(), elems / 2 + elems / 16 + 4); break;
    }
  }
}

TEST(QuantizedLinear, Int8GemmPathIsIdenticalAtEverySimdLevel) {
  if (best_simd_level() == SimdLevel::Scalar) GTEST_SKIP() << "this CPU has no SIMD level to compare with scalar";
  const std::vector<float> w = randn(static_cast<size_t>(kOut * kIn), 4, 0.05f);
  const std::vector<float> x = randn(static_cast<size_t>(kTokens * kIn), 5, 1.0f);
  const QuantizedTensor q = make_weight(W::Int8Channel, w);
  for (const ActivationScheme& s : {ActivationScheme::int8_token(), int8_static_asym()}) {
    const ActQuantParams p = calibrate_activation(s, -2.0f, 2.5f, "lvl");
    const auto lin = make_quantized_linear(q, &p, nullptr, "lvl");
    const SimdLevel saved = simd_level();
    set_simd_level(SimdLevel::Scalar);
    const std::vector<float> want = run(*lin, x, 1);
    for (SimdLevel l : {SimdLevel::Avx2, SimdLevel::Avx512}) {
      if (l > best_simd_level()) continue;
      set_simd_level(l);
      EXPECT_EQ(run(*lin, x, 2), want) << simd_level_name(l);
    }
    set_simd_level(saved);
  }
}

TEST(QuantizedLinear, RejectsNonE4m3Nvfp4BlockScales) {
  const std::vector<float> w = randn(static_cast<size_t>(kOut * kIn), 6, 0.05f);
  QuantizedTensor q = make_weight(W::Nvfp4, w);
  q.scales[3] = 0.3f;  // not an e4m3 value
  EXPECT_THROW(make_quantized_linear(q, nullptr, nullptr, "bad"), Error);
}

}  // namespace
}  // namespace qf::rt
