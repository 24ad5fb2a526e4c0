// Test helpers for QuantizedTensor: a random tensor and a field-by-field
// comparison, shared by the exporter tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "core/dtype.h"
#include "quantizers/quant_scheme.h"

namespace qf {

// Random codes, scales in [1e-3, 5e-2) rounded to the scheme's scale dtype,
// zero points 2^(bits-1) when symmetric, else in [min_zero, qmax]; with
// perm_g_idx a shuffled g_idx. Deterministic for a seed.
inline QuantizedTensor random_qt(const QuantScheme& s, int64_t rows, int64_t cols, bool perm_g_idx, uint32_t seed,
                                 int32_t min_zero = 0) {
  std::mt19937 rng(seed);
  QuantizedTensor q;
  q.scheme = s;
  q.rows = rows;
  q.cols = cols;
  q.q.resize(static_cast<size_t>(rows * cols));
  for (auto& v : q.q) v = static_cast<uint8_t>(rng() % (s.qmax() + 1));
  if (perm_g_idx) {
    for (int64_t c = 0; c < cols; ++c) q.g_idx.push_back(static_cast<int32_t>(c / s.group_size));
    std::shuffle(q.g_idx.begin(), q.g_idx.end(), rng);
  }
  std::uniform_real_distribution<float> ud(1e-3f, 5e-2f);
  const int64_t np = q.n_params();
  for (int64_t i = 0; i < np; ++i) {
    float scale = ud(rng);
    if (s.scale_dtype == DType::F16) scale = f16_to_f32(f32_to_f16(scale));
    if (s.scale_dtype == DType::BF16) scale = bf16_to_f32(f32_to_bf16(scale));
    q.scales.push_back(scale);
    q.zeros.push_back(s.symmetric ? s.sym_zero()
                                  : min_zero + static_cast<int32_t>(rng() % static_cast<uint32_t>(s.qmax() + 1 - min_zero)));
  }
  return q;
}

// A random FP8 (bits 8) or NVFP4 (bits 4) tensor: FP8 codes avoid the NaN bytes,
// NVFP4 codes are any nibble, NVFP4 block scales are positive e4m3 values and
// the global scale is in [100, 2000). FP8 scales are rounded to the scheme's dtype.
inline QuantizedTensor random_float_qt(const QuantScheme& s, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  QuantizedTensor q;
  q.scheme = s;
  q.rows = rows;
  q.cols = cols;
  q.q.resize(static_cast<size_t>(rows * cols));
  for (auto& v : q.q) {
    v = static_cast<uint8_t>(rng() % (s.qmax() + 1));
    if (s.is_fp8() && (v & 0x7f) == 0x7f) v ^= 1;
  }
  const int64_t np = q.n_params();
  std::uniform_real_distribution<float> ud(1e-3f, 5e-2f);
  for (int64_t i = 0; i < np; ++i) {
    if (s.is_nvfp4()) {
      q.scales.push_back(f8e4m3_to_f32(static_cast<uint8_t>(0x08 + rng() % 0x70)));  // positive, finite
    } else {
      float scale = ud(rng);
      if (s.scale_dtype == DType::F16) scale = f16_to_f32(f32_to_f16(scale));
      if (s.scale_dtype == DType::BF16) scale = bf16_to_f32(f32_to_bf16(scale));
      q.scales.push_back(scale);
    }
  }
  if (s.is_nvfp4()) q.global_scale = std::uniform_real_distribution<float>(100.f, 2000.f)(rng);
  return q;
}

inline void expect_same(const QuantizedTensor& a, const QuantizedTensor& b, const std::string& what) {
  EXPECT_EQ(a.scheme.bits, b.scheme.bits) << what;
  EXPECT_EQ(a.scheme.symmetric, b.scheme.symmetric) << what;
  EXPECT_EQ(a.scheme.strategy, b.scheme.strategy) << what;
  if (a.scheme.strategy == QuantStrategy::Group) {
    EXPECT_EQ(a.scheme.group_size, b.scheme.group_size) << what;
  }
  EXPECT_EQ(a.scheme.scale_dtype, b.scheme.scale_dtype) << what;
  EXPECT_EQ(a.rows, b.rows) << what;
  EXPECT_EQ(a.cols, b.cols) << what;
  EXPECT_EQ(a.q, b.q) << what;
  EXPECT_EQ(a.scales, b.scales) << what;
  EXPECT_EQ(a.zeros, b.zeros) << what;
  EXPECT_EQ(a.g_idx, b.g_idx) << what;
  EXPECT_EQ(a.scheme.type, b.scheme.type) << what;
  EXPECT_EQ(a.global_scale, b.global_scale) << what;
}

}  // namespace qf
