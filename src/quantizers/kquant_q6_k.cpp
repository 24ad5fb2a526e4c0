// Q6_K: 256-element super-blocks of 6-bit codes (4 in ql, 2 in qh), int8
// scales per 16 elements.

#include "quantizers/kquant_impl.h"  // first: its pragma turns off FMA contraction for this file

// GCC 12 warns inside its own AVX-512 headers (_mm512_undefined_* operands).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "quantizers/kquant_avx2.h"
#include "quantizers/kquant_avx512.h"

namespace qf::kquants::detail {

// Q6_K: symmetric x^2-weighted (or imatrix-weighted) fits on 16-element
// sub-blocks, int8 scales relative to the largest |scale|.
void quant_q6_k(const float* x, BlockQ6_K* y, int64_t nb, const float* qw) {
  int8_t L[QK_K];
  float scales[16];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max_scale = 0, max_abs = 0;
    for (int h = 0; h < 2; ++h)
      search_symmetric_x8(16, 32, x + 128 * h, L + 128 * h, scales + 8 * h, qw ? qw + QK_K * i + 128 * h : nullptr);
    for (int ib = 0; ib < 16; ++ib) {
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

float dot_q6_k_ref(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ6_K*>(vw);
  const auto* a = static_cast<const BlockQ8_K*>(va);
  float sum = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      int s = 0;
      for (int l = 0; l < 16; ++l) {
        const int e = 16 * j + l, h = e / 128, t = (e % 128) / 32, k = e % 32;
        const uint8_t lo = w[b].ql[64 * h + k + 32 * (t & 1)];
        const int q = ((t < 2 ? lo & 0xF : lo >> 4) | (((w[b].qh[32 * h + k] >> (2 * t)) & 3) << 4)) - 32;
        s += q * a[b].qs[e];
      }
      isum += w[b].scales[j] * s;
    }
    sum += kterm(h2f(w[b].d), 0.f, a[b].d, isum, 0);
  }
  return sum;
}

QF_AVX2 float dot_q6_k_avx2(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ6_K*>(vw);
  const auto* a = static_cast<const BlockQ8_K*>(va);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
  float sum = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].scales));
    const __m256i scales8 = _mm256_broadcastsi128_si256(sc);
    // 32 * sum_j scale_j * bsums_j, taken off the lanes before the horizontal sum.
    const __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(_mm256_cvtepi8_epi16(sc), load32(a[b].bsums)), 5);
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load32(w[b].ql + 64 * h), ql1 = load32(w[b].ql + 64 * h + 32);
      __m256i qh = load32(w[b].qh + 32 * h);
      // Quarter t: low nibble of ql0/ql1 (t = 0, 1) or high nibble (t = 2, 3),
      // top two bits from qh >> 2t; codes 0..63 (value + 32).
      const __m256i lows[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
                               _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                               _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
      for (int t = 0; t < 4; ++t, qh = _mm256_srli_epi16(qh, 2)) {
        const __m256i top = _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4);
        const __m256i q = _mm256_or_si256(lows[t], top);
        const __m256i p = _mm256_maddubs_epi16(q, load32(a[b].qs + 128 * h + 32 * t));
        const int j = 8 * h + 2 * t;
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale_pair8(scales8, j)));
      }
    }
    sum += kterm(h2f_f16c(w[b].d), 0.f, a[b].d, hsum_i32(_mm256_sub_epi32(acc, corr)), 0);
  }
  return sum;
}

// The AVX-512 kernel: quarters t and t+1 of each half side by side (the
// low 64 bytes of ql with the qh bits 0-1 and 2-3, then their high nibbles
// with bits 4-5 and 6-7), against 64 contiguous activations each.
QF_AVX512 float dot_q6_k_avx512(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ6_K*>(vw);
  const auto* a = static_cast<const BlockQ8_K*>(va);
  const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(3);
  float sum = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].scales));
    const __m512i scb = _mm512_broadcast_i32x4(sc);
    // 32 * sum_j scale_j * bsums_j, taken off the lanes before the horizontal sum.
    const __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(_mm256_cvtepi8_epi16(sc), load32(a[b].bsums)), 5);
    __m512i acc = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = load64(w[b].ql + 64 * h);
      const __m512i qh = with_shifted_half(load32(w[b].qh + 32 * h), 2);
      const __m512i q01 = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_slli_epi16(_mm512_and_si512(qh, m3), 4));
      const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                          _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 4), m3), 4));
      const __m512i p01 = _mm512_maddubs_epi16(q01, load64(a[b].qs + 128 * h));
      const __m512i p23 = _mm512_maddubs_epi16(q23, load64(a[b].qs + 128 * h + 64));
      const int j = 8 * h;
      acc = _mm512_add_epi32(acc, _mm512_madd_epi16(p01, lane_scales<true>(scb, j, j + 1, j + 2, j + 3)));
      acc = _mm512_add_epi32(acc, _mm512_madd_epi16(p23, lane_scales<true>(scb, j + 4, j + 5, j + 6, j + 7)));
    }
    sum += kterm(h2f_f16c(w[b].d), 0.f, a[b].d, hsum_i32(_mm256_sub_epi32(fold16to8(acc), corr)), 0);
  }
  return sum;
}

}  // namespace qf::kquants::detail
