// IQ4_NL: 32-element blocks of 4-bit indices into a fixed non-linear table of
// int8 levels, with one f16 scale (x = d * kIq4nlValues[code]).
//
// The search is ggml's: the scale starts at max / -127 (the value of largest
// magnitude on the table's largest level), each value takes its nearest
// level, and the scale becomes the least-squares one for those levels, with
// weights x^2 (or, with an importance matrix, qw * sqrt(sigma^2 + x^2)). With
// ntry > 0, scales (ntry' - 127) / max for ntry' in [-ntry, ntry] are tried
// too and the best kept, then the levels are chosen again for the final
// scale. ggml_quantize_chunk uses ntry = 7; the row converter that fills a KV
// cache (quantize_row_iq4_nl_ref) uses ntry = -1, no extra scale tried.
#include "quantizers/kquant_impl.h"  // first: its pragma turns off FMA contraction for this file

#include <cmath>
#include <cstring>

namespace qf::kquants::detail {

namespace {

constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

int best_level(const int8_t* val, float x) {
  if (x <= val[0]) return 0;
  if (x >= val[15]) return 15;
  int lo = 0, hi = 15;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (x < val[mid]) hi = mid;
    else lo = mid;
  }
  return x - val[hi - 1] < val[hi] - x ? hi - 1 : hi;
}

}  // namespace

void quant_iq4_nl(const float* x, BlockIQ4_NL* y, int64_t nb, const float* qw, int ntry) {
  const int8_t* values = kIq4nlValues;
  // As in ggml, the level buffer lives across the row's blocks: an all-zero
  // block (scale 0) with ntry <= 0 packs the levels its predecessor left.
  uint8_t L[QK] = {};
  for (int64_t ib = 0; ib < nb; ++ib, x += QK) {
    const float* bw = qw ? qw + ib * QK : nullptr;
    float sigma2 = 0;
    for (int j = 0; j < QK; ++j) sigma2 += x[j] * x[j];
    sigma2 *= 2.f / QK;
    float weight[QK];
    for (int j = 0; j < QK; ++j) weight[j] = bw ? bw[j] * std::sqrt(sigma2 + x[j] * x[j]) : x[j] * x[j];
    float amax = 0, max = 0;
    for (int j = 0; j < QK; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) amax = ax, max = x[j];
    }
    float d = 0.f;
    if (amax >= kGroupMaxEps) {
      d = ntry > 0 ? -max / values[0] : max / values[0];
      float id = 1 / d;
      float sumqx = 0, sumq2 = 0;
      for (int j = 0; j < QK; ++j) {
        const int l = best_level(values, id * x[j]);
        L[j] = static_cast<uint8_t>(l);
        const float q = values[l], w = weight[j];
        sumqx += w * q * x[j];
        sumq2 += w * q * q;
      }
      d = sumqx / sumq2;
      float best = d * sumqx;
      for (int itry = -ntry; itry <= ntry; ++itry) {
        id = (itry + values[0]) / max;
        sumqx = sumq2 = 0;
        for (int j = 0; j < QK; ++j) {
          const float q = values[best_level(values, id * x[j])], w = weight[j];
          sumqx += w * q * x[j];
          sumq2 += w * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) d = sumqx / sumq2, best = d * sumqx;
      }
    }
    y[ib].d = f2h(d);
    if (ntry > 0) {
      const float id = d ? 1 / d : 0;
      for (int j = 0; j < QK; ++j) L[j] = static_cast<uint8_t>(best_level(values, id * x[j]));
    }
    for (int j = 0; j < 16; ++j) y[ib].qs[j] = static_cast<uint8_t>(L[j] | (L[j + 16] << 4));
  }
}

// Against a Q8_0 activation row; the same accumulation order as the other
// legacy dots (one partial sum per block index modulo 8).
float dot_iq4_nl_ref(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockIQ4_NL*>(vw);
  const auto* a = static_cast<const BlockQ8_0*>(va);
  float acc[8] = {};
  for (int64_t b = 0; b < n / QK; ++b) {
    int isum = 0;
    for (int j = 0; j < 16; ++j)
      isum += kIq4nlValues[w[b].qs[j] & 0xF] * a[b].qs[j] + kIq4nlValues[w[b].qs[j] >> 4] * a[b].qs[j + 16];
    acc[b % 8] += (h2f(w[b].d) * h2f(a[b].d)) * static_cast<float>(isum);
  }
  return reduce8(acc);
}

}  // namespace qf::kquants::detail
