// Q2_K: 256-element super-blocks of 2-bit codes, 4-bit scales and mins per
// 16 elements.

#include "quantizers/kquant_impl.h"  // first: its pragma turns off FMA contraction for this file

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "quantizers/kquant_avx2.h"

namespace qf::kquants::detail {

// Q2_K, no imatrix: |x|-weighted asymmetric fits on 16-element sub-blocks, then
// 4-bit scales and mins relative to their maxima.
void quant_q2_k(const float* x, BlockQ2_K* y, int64_t nb) {
  uint8_t L[QK_K];
  float w[QK_K], mins[16], scales[16];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max_scale = 0, max_min = 0;
    for (int l = 0; l < QK_K; ++l) w[l] = std::fabs(x[l]);
    for (int h = 0; h < 2; ++h)
      search_asymmetric_x8(16, 3, x + 128 * h, w + 128 * h, L + 128 * h, scales + 8 * h, mins + 8 * h, -0.5f, 0.1f, 15,
                           true, false);
    for (int j = 0; j < 16; ++j) {
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
  uint8_t L[QK_K], Ls[16], Lm[16];
  float w[QK_K], mins[16], scales[16], sw[16];
  for (int64_t i = 0; i < nb; ++i, x += QK_K, qw += QK_K) {
    const float sigma2 = sum_squares(x, QK_K) / QK_K;
    for (int j = 0; j < 16; ++j) {
      block_weights(x + 16 * j, qw + 16 * j, sigma2, 16, w + 16 * j);
      sw[j] = 0;
      for (int l = 0; l < 16; ++l) sw[j] += w[16 * j + l];
    }
    for (int h = 0; h < 2; ++h)
      search_asymmetric_x8(16, 3, x + 128 * h, w + 128 * h, L + 128 * h, scales + 8 * h, mins + 8 * h, -0.9f, 0.05f, 36,
                           false, true);
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

float dot_q2_k_ref(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ2_K*>(vw);
  const auto* a = static_cast<const BlockQ8_K*>(va);
  float sum = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    int isum = 0, summ = 0;
    for (int j = 0; j < 16; ++j) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += q2_field(w[b].qs, 16 * j + l) * a[b].qs[16 * j + l];
      isum += (w[b].scales[j] & 0xF) * s;
      summ += (w[b].scales[j] >> 4) * a[b].bsums[j];
    }
    sum += kterm(h2f(w[b].d), h2f(w[b].dmin), a[b].d, isum, summ);
  }
  return sum;
}

QF_AVX2 float dot_q2_k_avx2(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ2_K*>(vw);
  const auto* a = static_cast<const BlockQ8_K*>(va);
  const __m256i m3 = _mm256_set1_epi8(3);
  float sum = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const __m128i sc_raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].scales));
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m256i scales8 = _mm256_broadcastsi128_si256(_mm_and_si128(sc_raw, m4));
    const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc_raw, 4), m4));
    const int summ = hsum_i32(_mm256_madd_epi16(mins16, load32(a[b].bsums)));
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 2; ++c) {
      __m256i qv = load32(w[b].qs + 32 * c);
      for (int s = 0; s < 4; ++s, qv = _mm256_srli_epi16(qv, 2)) {
        const __m256i q = _mm256_and_si256(qv, m3);
        const __m256i p = _mm256_maddubs_epi16(q, load32(a[b].qs + 128 * c + 32 * s));
        const int j = 8 * c + 2 * s;
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale_pair8(scales8, j)));
      }
    }
    sum += kterm(h2f_f16c(w[b].d), h2f_f16c(w[b].dmin), a[b].d, hsum_i32(acc), summ);
  }
  return sum;
}

}  // namespace qf::kquants::detail
