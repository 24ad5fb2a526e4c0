#include "quantizers/rtn.h"

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "core/error.h"
#include "quantizers/distortion.h"

namespace qf {
namespace {

// Platform-independent pseudo-Gaussian data (xorshift64*, sum of 4 uniforms),
// with an outlier of `outlier` sigmas every 61st element when outlier > 0.
std::vector<float> gaussian(int64_t n, uint64_t seed, float outlier = 0.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 7;
  auto uni = [&]() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return static_cast<float>((s * 0x2545F4914F6CDD1DULL) >> 40) * (1.0f / 16777216.0f);
  };
  for (int64_t i = 0; i < n; ++i) {
    float g = (uni() + uni() + uni() + uni() - 2.0f) * 1.7320508f;
    if (outlier > 0 && i % 61 == 13) g = (g >= 0 ? 1.0f : -1.0f) * outlier;
    v[static_cast<size_t>(i)] = g;
  }
  return v;
}

double err_norm(const std::vector<float>& w, const QuantizedTensor& q, double norm) {
  const std::vector<float> d = q.dequantize();
  double e = 0;
  for (size_t i = 0; i < w.size(); ++i) e += std::pow(std::fabs(static_cast<double>(d[i]) - w[i]), norm);
  return e;
}

TEST(Rtn, SymmetricInt4GroupHandComputed) {
  // Group 0: amax 7.5 -> scale 7.5 / 7.5 = 1 exactly; ties round half to even.
  // Group 1: amax 1.5 -> scale 0.2, f16(0.2) = 0.199951171875.
  const std::vector<float> w = {2.5f, -0.5f, 1.5f, 7.5f, /**/ 0.3f, -1.5f, 0.75f, 1.0f};
  const QuantizedTensor t = quantize_rtn(w.data(), 1, 8, QuantScheme::make(4, true, QuantStrategy::Group, 4));
  ASSERT_EQ(t.scales.size(), 2u);
  EXPECT_EQ(t.scales[0], 1.0f);
  EXPECT_EQ(t.scales[1], 0.199951171875f);
  EXPECT_EQ(t.zeros, (std::vector<int32_t>{8, 8}));
  // 2.5 -> 2 (even), -0.5 -> -0, 1.5 -> 2, 7.5 -> 8 clamped to 7;
  // 0.3/0.19995 = 1.5004 -> 2, -1.5/0.19995 = -7.502 -> -8, 3.75 -> 4, 5.001 -> 5.
  EXPECT_EQ(t.q, (std::vector<uint8_t>{10, 8, 10, 15, /**/ 10, 0, 12, 13}));
  EXPECT_TRUE(t.g_idx.empty());
  EXPECT_NO_THROW(t.validate("rtn"));

  // Second row with negative ties: -7.5 -> -8, 0.5 -> 0, 3.5 -> 4.
  const std::vector<float> w2 = {-7.5f, 0.5f, 3.5f, 0.0f};
  const QuantizedTensor t2 = quantize_rtn(w2.data(), 1, 4, QuantScheme::make(4, true, QuantStrategy::Group, 4));
  EXPECT_EQ(t2.q, (std::vector<uint8_t>{0, 8, 12, 8}));

  // int8 symmetric: amax / 127.5.
  const std::vector<float> w3 = {-127.5f, 1.0f, 0.5f, 1.5f};
  const QuantizedTensor t3 = quantize_rtn(w3.data(), 1, 4, QuantScheme::make(8, true, QuantStrategy::Channel, 0, DType::F32));
  EXPECT_EQ(t3.scales[0], 1.0f);
  EXPECT_EQ(t3.zeros[0], 128);
  EXPECT_EQ(t3.q, (std::vector<uint8_t>{0, 129, 128, 130}));  // -127.5 -> -128, 0.5 -> 0, 1.5 -> 2
}

TEST(Rtn, AsymmetricRangesIncludeZero) {
  const QuantScheme s = QuantScheme::make(4, false, QuantStrategy::Channel, 0);
  // All positive: lo = 0, hi = 4; scale = 4/15 -> f16 0.2666015625; zero 0.
  const std::vector<float> pos = {1, 2, 3, 4};
  const QuantizedTensor tp = quantize_rtn(pos.data(), 1, 4, s);
  EXPECT_EQ(tp.scales[0], f16_to_f32(f32_to_f16(4.0f / 15.0f)));
  EXPECT_EQ(tp.scales[0], 0.2666015625f);
  EXPECT_EQ(tp.zeros[0], 0);
  EXPECT_EQ(tp.q, (std::vector<uint8_t>{4, 8, 11, 15}));  // 3.75, 7.502, 11.25, 15.004
  // All negative: lo = -4, hi = 0; zero = round(4 / 0.2666) = 15.
  const std::vector<float> neg = {-1, -2, -3, -4};
  const QuantizedTensor tn = quantize_rtn(neg.data(), 1, 4, s);
  EXPECT_EQ(tn.zeros[0], 15);
  EXPECT_EQ(tn.q, (std::vector<uint8_t>{11, 7, 4, 0}));  // 15 - {3.75, 7.502, 11.25, 15.004}
  // Mixed: zero inside the range, 0 decodes exactly to 0.
  const std::vector<float> mix = {-1.0f, 0.0f, 2.0f, 0.5f};
  const QuantizedTensor tm = quantize_rtn(mix.data(), 1, 4, s);
  EXPECT_EQ(tm.scales[0], f16_to_f32(f32_to_f16(3.0f / 15.0f)));
  EXPECT_EQ(tm.zeros[0], 5);  // round(1 / 0.2)
  EXPECT_EQ(tm.dequantize()[1], 0.0f);
  EXPECT_NO_THROW(tm.validate("rtn"));
}

TEST(Rtn, ZeroRowsAndGroups) {
  std::vector<float> w(2 * 8, 0.0f);
  for (int i = 12; i < 16; ++i) w[static_cast<size_t>(i)] = 0.1f * static_cast<float>(i);
  for (bool sym : {true, false})
    for (DType dt : {DType::F16, DType::BF16, DType::F32}) {
      const QuantizedTensor t = quantize_rtn(w.data(), 2, 8, QuantScheme::make(4, sym, QuantStrategy::Group, 4, dt));
      ASSERT_EQ(t.scales.size(), 4u);
      for (int g = 0; g < 3; ++g) {
        EXPECT_EQ(t.scales[static_cast<size_t>(g)], scale_dtype_eps(dt));  // zero scale -> dtype eps
        EXPECT_EQ(t.zeros[static_cast<size_t>(g)], sym ? 8 : 0);
      }
      const std::vector<float> d = t.dequantize();
      for (int i = 0; i < 12; ++i) {
        EXPECT_EQ(t.q[static_cast<size_t>(i)], sym ? 8 : 0);
        EXPECT_EQ(d[static_cast<size_t>(i)], 0.0f);
      }
      for (float v : t.scales) EXPECT_TRUE(std::isfinite(v) && v > 0);
    }
  EXPECT_EQ(scale_dtype_eps(DType::F16), 0.0009765625f);
  EXPECT_EQ(scale_dtype_eps(DType::BF16), 0.0078125f);
  // Rounding edge cases of round_scale.
  EXPECT_EQ(round_scale(1e-9f, DType::F16), scale_dtype_eps(DType::F16));  // underflows f16
  EXPECT_EQ(round_scale(1e6f, DType::F16), 65504.0f);                      // saturates, never inf
  EXPECT_EQ(round_scale(NAN, DType::BF16), scale_dtype_eps(DType::BF16));
}

TEST(Rtn, ScalesRoundedBeforeCodes) {
  const int64_t rows = 64, cols = 256;
  const std::vector<float> w = gaussian(rows * cols, 3, 6.0f);
  for (DType dt : {DType::F16, DType::BF16}) {
    const QuantScheme s = QuantScheme::make(4, true, QuantStrategy::Group, 32, dt);
    const QuantizedTensor t = quantize_rtn(w.data(), rows, cols, s);
    int64_t differs = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < cols / 32; ++g) {
        const size_t pi = static_cast<size_t>(t.param_index(r, g));
        const float sc = t.scales[pi];
        const float back = dt == DType::F16 ? f16_to_f32(f32_to_f16(sc)) : bf16_to_f32(f32_to_bf16(sc));
        ASSERT_EQ(sc, back) << "scale not representable in " << dtype_name(dt);
        float amax = 0;
        for (int64_t c = g * 32; c < (g + 1) * 32; ++c) amax = std::max(amax, std::fabs(w[static_cast<size_t>(r * cols + c)]));
        const float unrounded = amax / 7.5f;
        for (int64_t c = g * 32; c < (g + 1) * 32; ++c) {
          const float x = w[static_cast<size_t>(r * cols + c)];
          const uint8_t q = t.q[static_cast<size_t>(r * cols + c)];
          ASSERT_EQ(q, quantize_value(x, GroupParams{sc, 8}, s));
          if (q != quantize_value(x, GroupParams{unrounded, 8}, s)) ++differs;
        }
      }
    // With bf16's 8-bit mantissa, codes from the unrounded scale differ somewhere:
    // the test would notice codes computed before rounding.
    if (dt == DType::BF16) {
      EXPECT_GT(differs, 0);
    }
  }
}

TEST(Rtn, MseObserverNotWorseThanMinMax) {
  const int64_t rows = 16, cols = 256;
  const std::vector<float> w = gaussian(rows * cols, 11, 8.0f);
  const std::vector<QuantScheme> schemes = {
      QuantScheme::make(4, true, QuantStrategy::Group, 64), QuantScheme::make(3, false, QuantStrategy::Group, 128),
      QuantScheme::make(4, true, QuantStrategy::Channel, 0), QuantScheme::make(4, false, QuantStrategy::Channel, 0),
      QuantScheme::make(4, true, QuantStrategy::Tensor, 0),  QuantScheme::make(8, true, QuantStrategy::Channel, 0)};
  // IST-DASLab gptq's wide search (down to 20% of the range, no early stop),
  // which must find the outlier-free ranges.
  const MseOptions wide{0.8, INT64_MAX, 100.0, 2.4, 1.0};
  for (const QuantScheme& s : schemes) {
    const QuantizedTensor a = quantize_rtn(w.data(), rows, cols, s, RangeObserver::MinMax);
    const QuantizedTensor b = quantize_rtn(w.data(), rows, cols, s, RangeObserver::Mse, wide);
    // llm-compressor's default search is never worse than min/max either.
    EXPECT_LE(err_norm(w, quantize_rtn(w.data(), rows, cols, s, RangeObserver::Mse), 2.4), err_norm(w, a, 2.4) * (1 + 1e-12))
        << s.describe();
    EXPECT_NO_THROW(b.validate("mse"));
    const double ea = err_norm(w, a, 2.4), eb = err_norm(w, b, 2.4);
    EXPECT_LE(eb, ea) << s.describe();
    // Outliers every 61 elements: shrinking the range must strictly help at <= 4 bits.
    if (s.bits <= 4) {
      EXPECT_LT(eb, ea * 0.98) << s.describe();
      EXPECT_LT(err_norm(w, b, 2.0), err_norm(w, a, 2.0)) << s.describe();
    }
    // The MSE ranges are shrunk versions of the min/max ones.
    for (size_t i = 0; i < a.scales.size(); ++i) EXPECT_LE(b.scales[i], a.scales[i]) << s.describe();
  }
  // Tensor strategy: one scale for everything.
  const QuantizedTensor t = quantize_rtn(w.data(), rows, cols, QuantScheme::make(4, true, QuantStrategy::Tensor, 0), RangeObserver::Mse);
  EXPECT_EQ(t.scales.size(), 1u);
  EXPECT_EQ(t.zeros.size(), 1u);
}

// llm-compressor's _grid_search_mse, written out plainly for the groups of
// one weight (rows x groups of `gs` columns, or one group for tensor): the
// reference the implementation must match bit for bit.
std::vector<float> reference_mse_scales(const std::vector<float>& w, int64_t rows, int64_t cols, const QuantScheme& s,
                                        const MseOptions& o) {
  const int64_t gs = s.strategy == QuantStrategy::Group ? s.group_size : s.strategy == QuantStrategy::Channel ? cols : rows * cols;
  const int64_t ng = rows * cols / gs;
  std::vector<float> lo(ng, 0), hi(ng, 0), best(ng);
  std::vector<double> best_err(ng, INFINITY);
  for (int64_t g = 0; g < ng; ++g) {
    for (int64_t k = 0; k < gs; ++k) lo[g] = std::min(lo[g], w[g * gs + k]), hi[g] = std::max(hi[g], w[g * gs + k]);
    lo[g] *= static_cast<float>(o.expand), hi[g] *= static_cast<float>(o.expand);
    best[g] = fit_group(std::vector<float>{lo[g], hi[g]}.data(), 2, 1, s, RangeObserver::MinMax).scale;
  }
  int64_t bad = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(o.maxshrink * o.grid); ++i) {
    const float p = static_cast<float>(1.0 - static_cast<double>(i) / o.grid);
    bool any = false;
    for (int64_t g = 0; g < ng; ++g) {
      const GroupParams gp = fit_group(std::vector<float>{p * lo[g], p * hi[g]}.data(), 2, 1, s, RangeObserver::MinMax);
      double e = 0;
      for (int64_t k = 0; k < gs; ++k) {
        const float x = w[g * gs + k];
        e += std::pow(std::fabs(static_cast<double>(dequantize_value(quantize_value(x, gp, s), gp) - x)), o.norm);
      }
      if (e < best_err[g]) best_err[g] = e, best[g] = gp.scale, any = true;
    }
    if (any) bad = 0;
    else if (++bad >= o.patience) break;
  }
  return best;
}

TEST(Rtn, MseObserverOptionsAreLlmCompressors) {
  const int64_t rows = 8, cols = 256;
  // Heavy-tailed data (4 * u^5, u uniform in [-1, 1]): most values small, so
  // shrinking the range pays, more so at 2 bits (best ranges near 65% of
  // min/max, past the default search) than at 4 (within it, where the early
  // stop decides).
  std::vector<float> w(static_cast<size_t>(rows * cols));
  uint64_t st = 12345;  // xorshift64*, uniform u in [-1, 1)
  for (float& x : w) {
    st ^= st >> 12, st ^= st << 25, st ^= st >> 27;
    const float u = static_cast<float>((st * 0x2545F4914F6CDD1DULL) >> 40) * (2.0f / 16777216.0f) - 1.0f;
    x = 4.0f * u * u * u * u * u;
  }
  const QuantScheme g2 = QuantScheme::make(2, true, QuantStrategy::Group, 64);
  const QuantScheme g4 = QuantScheme::make(4, true, QuantStrategy::Group, 64);
  const QuantScheme ch = QuantScheme::make(3, false, QuantStrategy::Channel, 0);
  const QuantScheme tn = QuantScheme::make(4, true, QuantStrategy::Tensor, 0);
  const MseOptions defaults;  // maxshrink 0.2, patience 5, grid 100, norm 2.4, expand 1
  EXPECT_EQ(defaults.maxshrink, 0.2);
  EXPECT_EQ(defaults.patience, 5);
  EXPECT_EQ(defaults.grid, 100.0);
  EXPECT_EQ(defaults.norm, 2.4);
  EXPECT_EQ(defaults.expand, 1.0);
  const std::vector<MseOptions> options = {defaults,
                                           {0.8, INT64_MAX, 100.0, 2.4, 1.0},  // IST-DASLab gptq's search
                                           {0.8, 1, 100.0, 2.4, 1.0},
                                           {0.5, 3, 40.0, 2.0, 1.0},
                                           {0.3, 5, 100.0, 2.4, 1.25}};
  std::vector<std::vector<float>> per_option(options.size());
  for (const QuantScheme& s : {g2, g4, ch, tn})
    for (size_t i = 0; i < options.size(); ++i) {
      const MseOptions& o = options[i];
      const QuantizedTensor q = quantize_rtn(w.data(), rows, cols, s, RangeObserver::Mse, o);
      EXPECT_EQ(q.scales, reference_mse_scales(w, rows, cols, s, o)) << s.describe() << " option " << i;
      if (s.strategy == QuantStrategy::Group) per_option[i].insert(per_option[i].end(), q.scales.begin(), q.scales.end());
    }
  // Each option changes the result on this data (so none can be ignored
  // unnoticed by the comparison above).
  for (size_t i = 0; i < per_option.size(); ++i)
    for (size_t j = i + 1; j < per_option.size(); ++j) EXPECT_NE(per_option[i], per_option[j]) << i << " vs " << j;
  // The default search never shrinks a range below 81% (20 candidates, p >= 0.81).
  const QuantizedTensor mm = quantize_rtn(w.data(), rows, cols, g2, RangeObserver::MinMax);
  const QuantizedTensor d = quantize_rtn(w.data(), rows, cols, g2, RangeObserver::Mse);
  for (size_t i = 0; i < d.scales.size(); ++i) EXPECT_GE(d.scales[i], 0.8f * mm.scales[i]);
  // fit_group (GPTQ's per-group fit) runs the same search on its one group.
  for (const MseOptions& o : options)
    for (int64_t r = 0; r < rows; ++r)
      EXPECT_EQ(fit_group(w.data() + r * cols, cols, 1, ch, RangeObserver::Mse, o).scale,
                reference_mse_scales(std::vector<float>(w.begin() + r * cols, w.begin() + (r + 1) * cols), 1, cols, ch, o)[0]);
}

TEST(Rtn, ChannelAndTensorStrategies) {
  const std::vector<float> w = {1.0f, -3.0f, 0.5f, /**/ 0.25f, 0.0f, -0.75f};
  const QuantizedTensor c = quantize_rtn(w.data(), 2, 3, QuantScheme::make(8, true, QuantStrategy::Channel, 0, DType::F32));
  ASSERT_EQ(c.scales.size(), 2u);
  EXPECT_EQ(c.scales[0], 3.0f / 127.5f);
  EXPECT_EQ(c.scales[1], 0.75f / 127.5f);
  const QuantizedTensor t = quantize_rtn(w.data(), 2, 3, QuantScheme::make(8, true, QuantStrategy::Tensor, 0, DType::F32));
  ASSERT_EQ(t.scales.size(), 1u);
  EXPECT_EQ(t.scales[0], 3.0f / 127.5f);
  const std::vector<float> dc = c.dequantize(), dt = t.dequantize();
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_NEAR(dc[i], w[i], c.scales[i / 3] / 2 + 1e-7);
    EXPECT_NEAR(dt[i], w[i], t.scales[0] / 2 + 1e-7);
  }
}

// Min-max round to nearest, measured by the shared distortion measure: every
// element within half a step of its group's scale (the positive end of a
// symmetric range is clipped by exactly half a step), and on Gaussian data a
// relative RMSE that falls by about 2x per bit (uniform rounding error of
// step / sqrt(12), step = 2 amax / (2^bits - 1)).
TEST(Rtn, IntegerErrorWithinHalfAStep) {
  const int64_t rows = 16, cols = 256;
  const std::vector<float> w = gaussian(rows * cols, 5);
  double previous = 1;
  for (int bits = 2; bits <= 8; ++bits)
    for (bool sym : {true, false})
      for (QuantStrategy st : {QuantStrategy::Group, QuantStrategy::Channel, QuantStrategy::Tensor}) {
        const QuantScheme s = QuantScheme::make(bits, sym, st, 64, DType::F32);
        const QuantizedTensor q = quantize_rtn(w.data(), rows, cols, s);
        const std::vector<float> dq = q.dequantize();
        Distortion d;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) {
            const size_t i = static_cast<size_t>(r * cols + c);
            const int64_t g = st == QuantStrategy::Tensor ? 0 : st == QuantStrategy::Channel ? r : r * (cols / 64) + c / 64;
            // Float rounding of the f32 scale and of (q - z) * scale adds at
            // most 2 * 2^bits * 2^-24 scales: 2^-15 of half a step at 8 bits.
            d.add(w[i], dq[i], q.scales[static_cast<size_t>(g)] / 2 * (1 + 0x1p-13));
          }
        SCOPED_TRACE(s.describe() + ": " + d.describe());
        EXPECT_LE(d.worst_bound_ratio(), 1.0);
        // Gaussian amax over 64..4096 values is 2.4..3.6 sigma: step / sqrt(12)
        // relative to sigma lies in [1.3, 2.1] / (2^bits - 1).
        const double levels = std::pow(2.0, bits) - 1;
        EXPECT_LT(d.relative_rmse(), 2.3 / levels);
        EXPECT_GT(d.relative_rmse(), 1.1 / levels);
        if (st == QuantStrategy::Group && sym) {
          EXPECT_LT(d.relative_rmse(), previous * 0.6);
          previous = d.relative_rmse();
        }
      }
}

TEST(Rtn, InvalidSchemes) {
  const std::vector<float> w(2 * 96, 1.0f);
  EXPECT_THROW(quantize_rtn(w.data(), 2, 96, QuantScheme::make(4, true, QuantStrategy::Group, 64)), Error);  // 64 does not divide 96
  EXPECT_THROW(quantize_rtn(w.data(), 2, 96, QuantScheme::make(9, true, QuantStrategy::Channel, 0)), Error);
  EXPECT_THROW(quantize_rtn(w.data(), 0, 96, QuantScheme::make(4, true, QuantStrategy::Channel, 0)), Error);
}

}  // namespace
}  // namespace qf
