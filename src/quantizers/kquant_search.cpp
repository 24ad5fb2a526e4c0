// Scale searches and bit packing that several GGUF block types share.

#include "quantizers/kquant_impl.h"  // first: its pragma turns off FMA contraction for this file

#include <algorithm>
#include <cmath>
#include <cstring>


namespace qf::kquants::detail {

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

// Row-wide sigma^2 = mean x^2, the base of the legacy types' imatrix weights.
float row_sigma2(const float* x, int64_t n) {
  float s = 0;
  for (int64_t j = 0; j < n; ++j) s += x[j] * x[j];
  return s / n;
}

void block_weights(const float* x, const float* qw, float sigma2, int n, float* w) {
  for (int j = 0; j < n; ++j) w[j] = qw[j] * std::sqrt(sigma2 + x[j] * x[j]);
}

float sum_squares(const float* x, int n) {
  float s = 0;
  for (int l = 0; l < n; ++l) s += x[l] * x[l];
  return s;
}

}  // namespace qf::kquants::detail
