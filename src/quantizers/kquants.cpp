// Scalar quantization and dequantization of the GGUF block types.
//
// The algorithms are ggml's (ggml/src/ggml-quants.c): the same searches, the
// same constants and, because byte identity with llama.cpp depends on it, the
// same order of float operations in every expression. Do not "simplify" an
// expression here (a*b*c to a*(b*c), a fused multiply-add, a reordered sum)
// without re-running the byte-identity check in docs/kquants.md. The pragma
// keeps GCC from fusing a*b+c into an FMA when the library is built with an
// -march that has FMA (its default -ffp-contract=fast would do that).
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

#include "quantizers/kquants.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace qf::kquants {
namespace {

constexpr int QK = 32;    // legacy block
constexpr int QK_K = 256;  // k-quant super-block
constexpr float kGroupMaxEps = 1e-15f;

inline float h2f(uint16_t h) { return f16_to_f32(h); }
inline uint16_t f2h(float f) { return f32_to_f16(f); }

// Round to nearest, ties to even, for |v| < 2^22 (ggml's magic-number trick).
inline int nearest_int(float v) {
  const float shifted = v + 12582912.f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  return (bits & 0x007fffff) - 0x00400000;
}

inline int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// ---- scale searches ------------------------------------------------------------

// Symmetric: L[i] = l + nmax with l in [-nmax, nmax-1] and x ~ scale * l.
// rmse_type 1 weighs by qw (or x^2 when qw is null); tries 18 scales around
// -nmax/max and keeps the best weighted least-squares fit.
float search_symmetric(int n, int nmax, const float* x, int8_t* L, const float* qw) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.f;
  }
  auto weight = [&](int i) { return qw ? qw[i] : x[i] * x[i]; };
  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = weight(i);
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      const float w = weight(i);
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i)
        L[i] = static_cast<int8_t>(nmax + clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Q3_K's symmetric search (x^2 weights): start from -nmax/max, then move single
// elements to a better level while the weighted fit improves (5 passes max).
// L[i] = l + nmax.
float search_q3(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.f;
  }
  const float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int pass = 0; pass < 5; ++pass) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * L[i];
      if (slx > 0) {
        float sl2 = suml2 - w * L[i] * L[i];
        const int nl = clampi(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
        if (nl != L[i]) {
          slx += w * x[i] * nl;
          sl2 += w * nl * nl;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<int8_t>(nl);
            sumlx = slx;
            suml2 = sl2;
            ++changed;
          }
        }
      }
    }
    if (!changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Asymmetric: x ~ scale * L + min with L in [0, nmax] and min <= 0. Tries
// iscale = (rmin + rdelta*is + nmax)/(max - min) for is = 0..nstep, solving the
// weighted 2x2 least-squares problem for (scale, min) each time, and keeps the
// candidate with the lowest weighted error (|diff| when use_mad, else diff^2).
// Returns scale; *neg_min = -min. `weights` null means x^2 (ggml's qkx3);
// `x3` selects qkx3's "max <= min" test and x^2 default (qkx2 otherwise).
float search_asymmetric(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* neg_min,
                        uint8_t* Laux, float rmin, float rdelta, int nstep, bool use_mad, bool x3) {
  auto weight = [&](int i) { return weights ? weights[i] : x[i] * x[i]; };
  float min = x[0], max = x[0];
  float sum_w = weight(0);
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weight(i);
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (x3 ? (max <= min) : (max == min)) {
    std::memset(L, 0, static_cast<size_t>(n));
    *neg_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(clampi(nearest_int(iscale * (x[i] - min)), 0, nmax));
    float diff = scale * L[i] + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weight(i) * diff;
  }
  if (nstep < 1) {
    *neg_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weight(i);
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float err = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * Laux[i] + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        err += weight(i) * diff;
      }
      if (err < best_error) {
        std::memcpy(L, Laux, static_cast<size_t>(n));
        best_error = err;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *neg_min = -min;
  return scale;
}

// Quantizes non-negative values (sub-block scales or mins) to [0, nmax] with a
// shared scale, weighted by `w`: a 9-point scale scan, then single-element
// refinement (5 passes max). Returns the scale.
float search_positive(int n, int nmax, const float* x, uint8_t* L, const float* w) {
  float max = 0;
  for (int i = 0; i < n; ++i) max = std::max(max, x[i]);
  if (max < kGroupMaxEps) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.f;
  }
  float iscale = nmax / max;
  for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(nearest_int(iscale * x[i]));
  const float scale = 1 / iscale;
  float best_mse = 0;
  for (int i = 0; i < n; ++i) {
    const float diff = x[i] - scale * L[i];
    best_mse += w[i] * diff * diff;
  }
  for (int is = -4; is <= 4; ++is) {
    if (is == 0) continue;
    const float iscale_is = (0.1f * is + nmax) / max;
    const float scale_is = 1 / iscale_is;
    float mse = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::min(nmax, nearest_int(iscale_is * x[i]));
      const float diff = x[i] - scale_is * l;
      mse += w[i] * diff * diff;
    }
    if (mse < best_mse) {
      best_mse = mse;
      iscale = iscale_is;
    }
  }
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::min(nmax, nearest_int(iscale * x[i]));
    L[i] = static_cast<uint8_t>(l);
    sumlx += w[i] * x[i] * l;
    suml2 += w[i] * l * l;
  }
  for (int pass = 0; pass < 5; ++pass) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      float slx = sumlx - w[i] * x[i] * L[i];
      float sl2 = suml2 - w[i] * L[i] * L[i];
      if (slx > 0 && sl2 > 0) {
        const int nl = std::min(nmax, nearest_int(x[i] * sl2 / slx));
        if (nl != L[i]) {
          slx += w[i] * x[i] * nl;
          sl2 += w[i] * nl * nl;
          if (slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<uint8_t>(nl);
            sumlx = slx;
            suml2 = sl2;
            ++changed;
          }
        }
      }
    }
    if (!changed) break;
  }
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// ---- bit packing shared by several types ----------------------------------------

// 32 codes of 5 bits: low nibbles of j and j+16 share qs[j]; bit 4 goes to qh bit j.
void pack_q5(const uint8_t* L, uint8_t* qs, uint8_t* qh_bytes) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const uint8_t a = L[j], b = L[j + 16];
    qs[j] = static_cast<uint8_t>((a & 0x0F) | ((b & 0x0F) << 4));
    qh |= ((a & 0x10u) >> 4) << j;
    qh |= ((b & 0x10u) >> 4) << (j + 16);
  }
  std::memcpy(qh_bytes, &qh, 4);
}

// 256 2-bit codes: byte 32c + l holds elements 128c + l + 32k at bits 2k.
void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int c = 0; c < QK_K; c += 128)
    for (int l = 0; l < 32; ++l)
      qs[c / 4 + l] = static_cast<uint8_t>(L[c + l] | (L[c + l + 32] << 2) | (L[c + l + 64] << 4) | (L[c + l + 96] << 6));
}

// Q4_K/Q5_K 6-bit scales and mins for 8 sub-blocks into 12 bytes.
void pack_scales_k4(const uint8_t* ls, const uint8_t* lm, uint8_t* s) {
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      s[j] = ls[j];
      s[j + 4] = lm[j];
    } else {
      s[j + 4] = static_cast<uint8_t>((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
      s[j - 4] |= static_cast<uint8_t>((ls[j] >> 4) << 6);
      s[j] |= static_cast<uint8_t>((lm[j] >> 4) << 6);
    }
  }
}

// Q3_K: 16 6-bit codes (0..63) into 12 bytes.
void pack_scales_q3(const int* codes, uint8_t* s) {
  std::memset(s, 0, 12);
  for (int j = 0; j < 16; ++j) {
    const int l = codes[j];
    if (j < 8)
      s[j] = static_cast<uint8_t>(l & 0xF);
    else
      s[j - 8] |= static_cast<uint8_t>((l & 0xF) << 4);
    s[j % 4 + 8] |= static_cast<uint8_t>((l >> 4) << (2 * (j / 4)));
  }
}

// ---- legacy types ------------------------------------------------------------

void quant_q4_0(const float* x, BlockQ4_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    float amax = 0, max = 0;
    for (int j = 0; j < QK; ++j)
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    const float d = max / -8;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = f2h(d);
    for (int j = 0; j < 16; ++j) {
      const uint8_t a = static_cast<uint8_t>(std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f))));
      const uint8_t b = static_cast<uint8_t>(std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f))));
      y[i].qs[j] = static_cast<uint8_t>(a | (b << 4));
    }
  }
}

void quant_q4_1(const float* x, BlockQ4_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    float min = 3.402823466e+38f, max = -3.402823466e+38f;
    for (int j = 0; j < QK; ++j) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / 15;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = f2h(d);
    y[i].m = f2h(min);
    for (int j = 0; j < 16; ++j) {
      const uint8_t a = static_cast<uint8_t>(std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - min) * id + 0.5f))));
      const uint8_t b = static_cast<uint8_t>(std::min(15, static_cast<int>(static_cast<int8_t>((x[j + 16] - min) * id + 0.5f))));
      y[i].qs[j] = static_cast<uint8_t>(a | (b << 4));
    }
  }
}

void quant_q5_0(const float* x, BlockQ5_0* y, int64_t nb) {
  uint8_t L[QK];
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    float amax = 0, max = 0;
    for (int j = 0; j < QK; ++j)
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    const float d = max / -16;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = f2h(d);
    for (int j = 0; j < QK; ++j)
      L[j] = static_cast<uint8_t>(std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f))));
    pack_q5(L, y[i].qs, y[i].qh);
  }
}

void quant_q5_1(const float* x, BlockQ5_1* y, int64_t nb) {
  uint8_t L[QK];
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    float min = 3.402823466e+38f, max = -3.402823466e+38f;
    for (int j = 0; j < QK; ++j) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / 31;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = f2h(d);
    y[i].m = f2h(min);
    for (int j = 0; j < QK; ++j) L[j] = static_cast<uint8_t>((x[j] - min) * id + 0.5f);
    pack_q5(L, y[i].qs, y[i].qh);
  }
}

void quant_q8_0(const float* x, BlockQ8_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    float amax = 0;
    for (int j = 0; j < QK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = f2h(d);
    for (int j = 0; j < QK; ++j) y[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

void quant_q8_1(const float* x, BlockQ8_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    float amax = 0;
    for (int j = 0; j < QK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = f2h(d);
    int sum = 0;
    for (int j = 0; j < QK; ++j) {
      y[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
      sum += y[i].qs[j];
    }
    y[i].s = f2h(sum * d);
  }
}

// Row-wide sigma^2 = mean x^2, the base of the legacy types' imatrix weights.
float row_sigma2(const float* x, int64_t n) {
  float s = 0;
  for (int64_t j = 0; j < n; ++j) s += x[j] * x[j];
  return s / n;
}

void block_weights(const float* x, const float* qw, float sigma2, int n, float* w) {
  for (int j = 0; j < n; ++j) w[j] = qw[j] * std::sqrt(sigma2 + x[j] * x[j]);
}

void quant_q4_0_w(const float* x, BlockQ4_0* y, int64_t n, const float* qw) {
  const float sigma2 = row_sigma2(x, n);
  float w[QK];
  int8_t L[QK];
  for (int64_t ib = 0; ib < n / QK; ++ib) {
    block_weights(x + QK * ib, qw + QK * ib, sigma2, QK, w);
    y[ib].d = f2h(search_symmetric(QK, 8, x + QK * ib, L, w));
    for (int j = 0; j < 16; ++j) y[ib].qs[j] = static_cast<uint8_t>(L[j] | (L[j + 16] << 4));
  }
}

void quant_q4_1_w(const float* x, BlockQ4_1* y, int64_t n, const float* qw) {
  const float sigma2 = row_sigma2(x, n);
  float w[QK], neg_min;
  uint8_t L[QK], Laux[QK];
  for (int64_t ib = 0; ib < n / QK; ++ib) {
    block_weights(x + QK * ib, qw + QK * ib, sigma2, QK, w);
    const float d = search_asymmetric(QK, 15, x + QK * ib, w, L, &neg_min, Laux, -0.9f, 0.05f, 36, false, true);
    y[ib].d = f2h(d);
    y[ib].m = f2h(-neg_min);
    for (int j = 0; j < 16; ++j) y[ib].qs[j] = static_cast<uint8_t>(L[j] | (L[j + 16] << 4));
  }
}

void quant_q5_0_w(const float* x, BlockQ5_0* y, int64_t n, const float* qw) {
  const float sigma2 = row_sigma2(x, n);
  float w[QK];
  int8_t L[QK];
  for (int64_t ib = 0; ib < n / QK; ++ib) {
    block_weights(x + QK * ib, qw + QK * ib, sigma2, QK, w);
    y[ib].d = f2h(search_symmetric(QK, 16, x + QK * ib, L, w));
    pack_q5(reinterpret_cast<const uint8_t*>(L), y[ib].qs, y[ib].qh);
  }
}

void quant_q5_1_w(const float* x, BlockQ5_1* y, int64_t n, const float* qw) {
  const float sigma2 = row_sigma2(x, n);
  float w[QK], neg_min;
  uint8_t L[QK], Laux[QK];
  for (int64_t ib = 0; ib < n / QK; ++ib) {
    block_weights(x + QK * ib, qw + QK * ib, sigma2, QK, w);
    const float d = search_asymmetric(QK, 31, x + QK * ib, w, L, &neg_min, Laux, -0.9f, 0.05f, 36, false, true);
    y[ib].d = f2h(d);
    y[ib].m = f2h(-neg_min);
    pack_q5(L, y[ib].qs, y[ib].qh);
  }
}

// ---- k-quants ------------------------------------------------------------------

float sum_squares(const float* x, int n) {
  float s = 0;
  for (int l = 0; l < n; ++l) s += x[l] * x[l];
  return s;
}

// Q2_K, no imatrix: |x|-weighted asymmetric fits on 16-element sub-blocks, then
// 4-bit scales and mins relative to their maxima.
void quant_q2_k(const float* x, BlockQ2_K* y, int64_t nb) {
  uint8_t L[QK_K], Laux[16];
  float w[16], mins[16], scales[16];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) w[l] = std::fabs(x[16 * j + l]);
      scales[j] = search_asymmetric(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true, false);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0) {
      const float iscale = 15.f / max_scale;
      for (int j = 0; j < 16; ++j) y[i].scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
      y[i].d = f2h(max_scale / 15.f);
    } else {
      std::memset(y[i].scales, 0, 16);
      y[i].d = f2h(0.f);
    }
    if (max_min > 0) {
      const float iscale = 15.f / max_min;
      for (int j = 0; j < 16; ++j) y[i].scales[j] |= static_cast<uint8_t>(nearest_int(iscale * mins[j]) << 4);
      y[i].dmin = f2h(max_min / 15.f);
    } else {
      y[i].dmin = f2h(0.f);
    }
    for (int j = 0; j < 16; ++j) {
      const float d = h2f(y[i].d) * (y[i].scales[j] & 0xF);
      if (!d) continue;
      const float dm = h2f(y[i].dmin) * (y[i].scales[j] >> 4);
      for (int l = 0; l < 16; ++l) L[16 * j + l] = static_cast<uint8_t>(clampi(nearest_int((x[16 * j + l] + dm) / d), 0, 3));
    }
    pack_2bit(L, y[i].qs);
  }
}

void quant_q2_k_w(const float* x, BlockQ2_K* y, int64_t nb, const float* qw) {
  uint8_t L[QK_K], Laux[16], Ls[16], Lm[16];
  float w[16], mins[16], scales[16], sw[16];
  for (int64_t i = 0; i < nb; ++i, x += QK_K, qw += QK_K) {
    const float sigma2 = sum_squares(x, QK_K) / QK_K;
    for (int j = 0; j < 16; ++j) {
      block_weights(x + 16 * j, qw + 16 * j, sigma2, 16, w);
      sw[j] = 0;
      for (int l = 0; l < 16; ++l) sw[j] += w[l];
      scales[j] = search_asymmetric(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], Laux, -0.9f, 0.05f, 36, false, true);
    }
    y[i].d = f2h(search_positive(16, 15, scales, Ls, sw));
    y[i].dmin = f2h(search_positive(16, 15, mins, Lm, sw));
    const float dm = h2f(y[i].d), mm = h2f(y[i].dmin);
    for (int j = 0; j < 16; ++j) y[i].scales[j] = static_cast<uint8_t>(Ls[j] | (Lm[j] << 4));
    for (int j = 0; j < 16; ++j) {
      const float d = dm * (y[i].scales[j] & 0xF);
      if (!d) continue;
      const float m = mm * (y[i].scales[j] >> 4);
      for (int l = 0; l < 16; ++l) L[16 * j + l] = static_cast<uint8_t>(clampi(nearest_int((x[16 * j + l] + m) / d), 0, 3));
    }
    pack_2bit(L, y[i].qs);
  }
}

// Final Q3_K step shared by both paths: requantize against the stored scales,
// split the third bit into hmask (element e -> byte e%32, bit e/32).
void finish_q3_k(const float* x, BlockQ3_K* y, int8_t* L) {
  const float d_all = h2f(y->d);
  for (int j = 0; j < 16; ++j) {
    const float d = d_all * static_cast<int8_t>(q3k_scale(j, y->scales));
    if (!d) continue;
    for (int l = 0; l < 16; ++l) L[16 * j + l] = static_cast<int8_t>(clampi(nearest_int(x[16 * j + l] / d), -4, 3) + 4);
  }
  std::memset(y->hmask, 0, 32);
  for (int e = 0; e < QK_K; ++e) {
    if (L[e] > 3) {
      y->hmask[e % 32] |= static_cast<uint8_t>(1u << (e / 32));
      L[e] = static_cast<int8_t>(L[e] - 4);
    }
  }
  pack_2bit(reinterpret_cast<const uint8_t*>(L), y->qs);
}

void quant_q3_k(const float* x, BlockQ3_K* y, int64_t nb) {
  int8_t L[QK_K];
  float scales[16];
  int codes[16];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max_scale = 0, amax = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = search_q3(16, 4, x + 16 * j, L + 16 * j);
      const float a = std::fabs(scales[j]);
      if (a > amax) {
        amax = a;
        max_scale = scales[j];
      }
    }
    if (max_scale) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < 16; ++j) {
        const int8_t l = static_cast<int8_t>(nearest_int(iscale * scales[j]));
        codes[j] = clampi(l, -32, 31) + 32;
      }
      pack_scales_q3(codes, y[i].scales);
      y[i].d = f2h(1 / iscale);
    } else {
      std::memset(y[i].scales, 0, 12);
      y[i].d = f2h(0.f);
    }
    finish_q3_k(x, &y[i], L);
  }
}

void quant_q3_k_w(const float* x, BlockQ3_K* y, int64_t nb, const float* qw) {
  int8_t L[QK_K], Ls[16];
  float scales[16], w[16], sw[16];
  int codes[16];
  for (int64_t i = 0; i < nb; ++i, x += QK_K, qw += QK_K) {
    const float sigma2 = 2 * sum_squares(x, QK_K) / QK_K;
    for (int j = 0; j < 16; ++j) {
      block_weights(x + 16 * j, qw + 16 * j, sigma2, 16, w);
      float sumw = 0;
      for (int l = 0; l < 16; ++l) sumw += w[l];
      sw[j] = sumw;
      scales[j] = search_symmetric(16, 4, x + 16 * j, L + 16 * j, w);
    }
    const float d_block = search_symmetric(16, 32, scales, Ls, sw);
    for (int j = 0; j < 16; ++j) codes[j] = Ls[j];
    pack_scales_q3(codes, y[i].scales);
    y[i].d = f2h(d_block);
    finish_q3_k(x, &y[i], L);
  }
}

// Final Q4_K/Q5_K step: requantize every sub-block against the stored 6-bit
// scale and min (levels 0..nmax).
template <typename Block>
void requant_k4(const float* x, const Block* y, uint8_t* L, int nmax) {
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    unpack_scale_min_k4(j, y->scales, &sc, &m);
    const float d = h2f(y->d) * sc;
    if (!d) continue;
    const float dm = h2f(y->dmin) * m;
    for (int l = 0; l < 32; ++l) L[32 * j + l] = static_cast<uint8_t>(clampi(nearest_int((x[32 * j + l] + dm) / d), 0, nmax));
  }
}

// Q4_K/Q5_K scale fitting without an imatrix: (av_x + |x|)-weighted
// asymmetric fits on 32-element sub-blocks, 6-bit scales/mins over the maxima.
template <typename Block>
void fit_k4(const float* x, Block* y, uint8_t* L, int nmax, float rmin, float rdelta, int nstep) {
  uint8_t Laux[32], ls[8], lm[8];
  float w[32], mins[8], scales[8];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float av_x = std::sqrt(sum_squares(x + 32 * j, 32) / 32);
    for (int l = 0; l < 32; ++l) w[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = search_asymmetric(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], Laux, rmin, rdelta, nstep, false, false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  for (int j = 0; j < 8; ++j) {
    ls[j] = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
    lm[j] = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
  }
  std::memset(y->scales, 0, 12);
  pack_scales_k4(ls, lm, y->scales);
  y->d = f2h(max_scale / 63.f);
  y->dmin = f2h(max_min / 63.f);
}

// The same with an imatrix: sigma-weighted qkx3 fits and weighted 6-bit
// quantization of the scales and mins.
template <typename Block>
void fit_k4_w(const float* x, Block* y, uint8_t* L, int nmax, const float* qw) {
  uint8_t Laux[32], ls[8], lm[8];
  float w[32], mins[8], scales[8], sw[8];
  const float sigma2 = 2 * sum_squares(x, QK_K) / QK_K;
  for (int j = 0; j < 8; ++j) {
    block_weights(x + 32 * j, qw + 32 * j, sigma2, 32, w);
    float sumw = 0;
    for (int l = 0; l < 32; ++l) sumw += w[l];
    sw[j] = sumw;
    scales[j] = search_asymmetric(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], Laux, -0.9f, 0.05f, 36, false, true);
  }
  const float d_block = search_positive(8, 63, scales, ls, sw);
  const float m_block = search_positive(8, 63, mins, lm, sw);
  std::memset(y->scales, 0, 12);
  pack_scales_k4(ls, lm, y->scales);
  y->d = f2h(d_block);
  y->dmin = f2h(m_block);
}

void pack_q4_k(const uint8_t* L, BlockQ4_K* y) {
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) y->qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | (L[64 * c + l + 32] << 4));
}

void pack_q5_k(const uint8_t* L, BlockQ5_K* y) {
  std::memset(y->qh, 0, 32);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      int a = L[64 * c + l], b = L[64 * c + l + 32];
      if (a > 15) {
        a -= 16;
        y->qh[l] |= static_cast<uint8_t>(1u << (2 * c));
      }
      if (b > 15) {
        b -= 16;
        y->qh[l] |= static_cast<uint8_t>(2u << (2 * c));
      }
      y->qs[32 * c + l] = static_cast<uint8_t>(a | (b << 4));
    }
  }
}

void quant_q4_k(const float* x, BlockQ4_K* y, int64_t nb, const float* qw) {
  uint8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    if (qw)
      fit_k4_w(x, &y[i], L, 15, qw + QK_K * i);
    else
      fit_k4(x, &y[i], L, 15, -1.f, 0.1f, 20);
    requant_k4(x, &y[i], L, 15);
    pack_q4_k(L, &y[i]);
  }
}

void quant_q5_k(const float* x, BlockQ5_K* y, int64_t nb, const float* qw) {
  uint8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    if (qw)
      fit_k4_w(x, &y[i], L, 31, qw + QK_K * i);
    else
      fit_k4(x, &y[i], L, 31, -0.5f, 0.1f, 15);
    requant_k4(x, &y[i], L, 31);
    pack_q5_k(L, &y[i]);
  }
}

// Q6_K: symmetric x^2-weighted (or imatrix-weighted) fits on 16-element
// sub-blocks, int8 scales relative to the largest |scale|.
void quant_q6_k(const float* x, BlockQ6_K* y, int64_t nb, const float* qw) {
  int8_t L[QK_K];
  float scales[16];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max_scale = 0, max_abs = 0;
    for (int ib = 0; ib < 16; ++ib) {
      scales[ib] = search_symmetric(16, 32, x + 16 * ib, L + 16 * ib, qw ? qw + QK_K * i + 16 * ib : nullptr);
      const float a = std::fabs(scales[ib]);
      if (a > max_abs) {
        max_abs = a;
        max_scale = scales[ib];
      }
    }
    if (max_abs < kGroupMaxEps) {
      std::memset(&y[i], 0, sizeof(BlockQ6_K));
      continue;
    }
    const float iscale = -128.f / max_scale;
    y[i].d = f2h(1 / iscale);
    for (int ib = 0; ib < 16; ++ib) y[i].scales[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
    for (int j = 0; j < 16; ++j) {
      const float d = h2f(y[i].d) * y[i].scales[j];
      if (!d) continue;
      for (int l = 0; l < 16; ++l) L[16 * j + l] = static_cast<int8_t>(clampi(nearest_int(x[16 * j + l] / d), -32, 31) + 32);
    }
    // Element 128h + 32t + l: low nibble in ql[64h + l + 32(t&1)] (high nibble
    // when t >= 2), top 2 bits in qh[32h + l] at bits 2t.
    for (int h = 0; h < 2; ++h) {
      const int8_t* Lh = L + 128 * h;
      uint8_t* ql = y[i].ql + 64 * h;
      uint8_t* qh = y[i].qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) | ((Lh[l + 96] >> 4) << 6));
      }
    }
  }
}

void quant_q8_k(const float* x, BlockQ8_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max = 0, amax = 0;
    for (int j = 0; j < QK_K; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (!amax) {
      std::memset(&y[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < QK_K; ++j) y[i].qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += y[i].qs[16 * j + l];
      y[i].bsums[j] = static_cast<int16_t>(sum);
    }
    y[i].d = 1 / iscale;
  }
}

// ---- dequantization ------------------------------------------------------------

// One call of the shared block decoder (kquant_blocks.h) per block.
template <class Block>
void dequantize_blocks(const void* src, float* y, int64_t nb, int block_size) {
  const auto* b = static_cast<const Block*>(src);
  for (int64_t i = 0; i < nb; ++i, y += block_size) dequantize_block(b[i], y);
}

// ---- checks ------------------------------------------------------------------

const GgmlTypeInfo& checked_info(uint32_t type, const char* where) {
  const GgmlTypeInfo* info = ggml_type_info(type);
  if (!info || !is_supported(type))
    throw unsupported(where, std::string("ggml type ") + (info ? info->name : std::to_string(type)) +
                                 " is not supported (supported: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, "
                                 "q8_1, q2_K, q3_K, q4_K, q5_K, q6_K, q8_K)");
  return *info;
}

int64_t checked_blocks(uint32_t type, int64_t n, const char* where) {
  const GgmlTypeInfo& info = checked_info(type, where);
  if (n < 0 || n % info.block_size != 0)
    throw invalid_input(where, std::string(info.name) + " row length " + std::to_string(n) +
                                   " is not a multiple of the block size " + std::to_string(info.block_size));
  return n / info.block_size;
}

}  // namespace

bool is_supported(uint32_t type) {
  namespace t = ggml_type;
  switch (type) {
    case t::F32: case t::F16: case t::BF16: case t::Q4_0: case t::Q4_1: case t::Q5_0: case t::Q5_1:
    case t::Q8_0: case t::Q8_1: case t::Q2_K: case t::Q3_K: case t::Q4_K: case t::Q5_K: case t::Q6_K:
    case t::Q8_K:
      return true;
    default:
      return false;
  }
}

size_t row_size(uint32_t type, int64_t n) {
  const int64_t nb = checked_blocks(type, n, "row_size");
  return static_cast<size_t>(nb) * ggml_type_info(type)->type_size;
}

void quantize_rows(uint32_t type, const float* src, void* dst, int64_t nrows, int64_t n_per_row, const float* imatrix) {
  namespace t = ggml_type;
  const int64_t nb = checked_blocks(type, n_per_row, "quantize_rows");
  if (type == t::Q8_1 || type == t::Q8_K)
    throw unsupported("quantize_rows", std::string(ggml_type_info(type)->name) +
                                           " is an activation type (use quantize_activation)");
  if (nrows < 0) throw invalid_input("quantize_rows", "negative row count " + std::to_string(nrows));
  const size_t rs = static_cast<size_t>(nb) * ggml_type_info(type)->type_size;
  for (int64_t r = 0; r < nrows; ++r) {
    const float* x = src + r * n_per_row;
    void* y = static_cast<uint8_t*>(dst) + static_cast<size_t>(r) * rs;
    const float* qw = imatrix;
    switch (type) {
      case t::F32: std::memcpy(y, x, static_cast<size_t>(n_per_row) * 4); break;
      case t::F16: {
        auto* o = static_cast<uint16_t*>(y);
        for (int64_t j = 0; j < n_per_row; ++j) o[j] = f32_to_f16(x[j]);
        break;
      }
      case t::BF16: {
        auto* o = static_cast<uint16_t*>(y);
        for (int64_t j = 0; j < n_per_row; ++j) o[j] = f32_to_bf16(x[j]);
        break;
      }
      case t::Q4_0: qw ? quant_q4_0_w(x, static_cast<BlockQ4_0*>(y), n_per_row, qw) : quant_q4_0(x, static_cast<BlockQ4_0*>(y), nb); break;
      case t::Q4_1: qw ? quant_q4_1_w(x, static_cast<BlockQ4_1*>(y), n_per_row, qw) : quant_q4_1(x, static_cast<BlockQ4_1*>(y), nb); break;
      case t::Q5_0: qw ? quant_q5_0_w(x, static_cast<BlockQ5_0*>(y), n_per_row, qw) : quant_q5_0(x, static_cast<BlockQ5_0*>(y), nb); break;
      case t::Q5_1: qw ? quant_q5_1_w(x, static_cast<BlockQ5_1*>(y), n_per_row, qw) : quant_q5_1(x, static_cast<BlockQ5_1*>(y), nb); break;
      case t::Q8_0: quant_q8_0(x, static_cast<BlockQ8_0*>(y), nb); break;
      case t::Q2_K: qw ? quant_q2_k_w(x, static_cast<BlockQ2_K*>(y), nb, qw) : quant_q2_k(x, static_cast<BlockQ2_K*>(y), nb); break;
      case t::Q3_K: qw ? quant_q3_k_w(x, static_cast<BlockQ3_K*>(y), nb, qw) : quant_q3_k(x, static_cast<BlockQ3_K*>(y), nb); break;
      case t::Q4_K: quant_q4_k(x, static_cast<BlockQ4_K*>(y), nb, qw); break;
      case t::Q5_K: quant_q5_k(x, static_cast<BlockQ5_K*>(y), nb, qw); break;
      case t::Q6_K: quant_q6_k(x, static_cast<BlockQ6_K*>(y), nb, qw); break;
      default: throw Error(ErrorKind::Internal, "quantize_rows: unhandled type");
    }
  }
}

void dequantize_row(uint32_t type, const void* src, float* y, int64_t n) {
  namespace t = ggml_type;
  const int64_t nb = checked_blocks(type, n, "dequantize_row");
  switch (type) {
    case t::F32: std::memcpy(y, src, static_cast<size_t>(n) * 4); break;
    case t::F16: for (int64_t j = 0; j < n; ++j) y[j] = f16_to_f32(static_cast<const uint16_t*>(src)[j]); break;
    case t::BF16: for (int64_t j = 0; j < n; ++j) y[j] = bf16_to_f32(static_cast<const uint16_t*>(src)[j]); break;
    case t::Q4_0: dequantize_blocks<BlockQ4_0>(src, y, nb, QK); break;
    case t::Q4_1: dequantize_blocks<BlockQ4_1>(src, y, nb, QK); break;
    case t::Q5_0: dequantize_blocks<BlockQ5_0>(src, y, nb, QK); break;
    case t::Q5_1: dequantize_blocks<BlockQ5_1>(src, y, nb, QK); break;
    case t::Q8_0: dequantize_blocks<BlockQ8_0>(src, y, nb, QK); break;
    case t::Q8_1: dequantize_blocks<BlockQ8_1>(src, y, nb, QK); break;
    case t::Q2_K: dequantize_blocks<BlockQ2_K>(src, y, nb, QK_K); break;
    case t::Q3_K: dequantize_blocks<BlockQ3_K>(src, y, nb, QK_K); break;
    case t::Q4_K: dequantize_blocks<BlockQ4_K>(src, y, nb, QK_K); break;
    case t::Q5_K: dequantize_blocks<BlockQ5_K>(src, y, nb, QK_K); break;
    case t::Q6_K: dequantize_blocks<BlockQ6_K>(src, y, nb, QK_K); break;
    case t::Q8_K: dequantize_blocks<BlockQ8_K>(src, y, nb, QK_K); break;
    default: throw Error(ErrorKind::Internal, "dequantize_row: unhandled type");
  }
}

uint32_t vec_dot_type(uint32_t type) {
  namespace t = ggml_type;
  checked_info(type, "vec_dot_type");
  switch (type) {
    case t::Q4_0: case t::Q5_0: case t::Q8_0: return t::Q8_0;
    case t::Q4_1: case t::Q5_1: return t::Q8_1;
    case t::Q2_K: case t::Q3_K: case t::Q4_K: case t::Q5_K: case t::Q6_K: return t::Q8_K;
    case t::F32: case t::F16: case t::BF16: return type;
    default:
      throw unsupported("vec_dot_type", std::string(ggml_type_info(type)->name) + " is an activation type, not a weight type");
  }
}

void quantize_activation(uint32_t type, const float* x, void* dst, int64_t n) {
  namespace t = ggml_type;
  const int64_t nb = checked_blocks(type, n, "quantize_activation");
  switch (type) {
    case t::Q8_0: quant_q8_0(x, static_cast<BlockQ8_0*>(dst), nb); break;
    case t::Q8_1: quant_q8_1(x, static_cast<BlockQ8_1*>(dst), nb); break;
    case t::Q8_K: quant_q8_k(x, static_cast<BlockQ8_K*>(dst), nb); break;
    case t::F32: case t::F16: case t::BF16: quantize_rows(type, x, dst, 1, n, nullptr); break;
    default:
      throw unsupported("quantize_activation", std::string(ggml_type_info(type)->name) +
                                                   " is not an activation type (use q8_0, q8_1, q8_K, f32, f16 or bf16)");
  }
}

}  // namespace qf::kquants
