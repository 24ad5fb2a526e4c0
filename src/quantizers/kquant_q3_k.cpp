// Q3_K: 256-element super-blocks of 3-bit codes (2 bits in qs, the third in
// hmask), 6-bit scales per 16 elements.

#include "quantizers/kquant_impl.h"  // first: its pragma turns off FMA contraction for this file

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "quantizers/kquant_avx2.h"

namespace qf::kquants::detail {

namespace {

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

}  // namespace

void quant_q3_k(const float* x, BlockQ3_K* y, int64_t nb) {
  int8_t L[QK_K];
  float scales[16];
  int codes[16];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max_scale = 0, amax = 0;
    for (int h = 0; h < 2; ++h) search_q3_x8(16, 4, x + 128 * h, L + 128 * h, scales + 8 * h);
    for (int j = 0; j < 16; ++j) {
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
  float scales[16], w[QK_K], sw[16];
  int codes[16];
  for (int64_t i = 0; i < nb; ++i, x += QK_K, qw += QK_K) {
    const float sigma2 = 2 * sum_squares(x, QK_K) / QK_K;
    for (int j = 0; j < 16; ++j) {
      block_weights(x + 16 * j, qw + 16 * j, sigma2, 16, w + 16 * j);
      float sumw = 0;
      for (int l = 0; l < 16; ++l) sumw += w[16 * j + l];
      sw[j] = sumw;
    }
    for (int h = 0; h < 2; ++h) search_symmetric_x8(16, 4, x + 128 * h, L + 128 * h, scales + 8 * h, w + 128 * h);
    const float d_block = search_symmetric(16, 32, scales, Ls, sw);
    for (int j = 0; j < 16; ++j) codes[j] = Ls[j];
    pack_scales_q3(codes, y[i].scales);
    y[i].d = f2h(d_block);
    finish_q3_k(x, &y[i], L);
  }
}

float dot_q3_k_ref(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ3_K*>(vw);
  const auto* a = static_cast<const BlockQ8_K*>(va);
  float sum = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      int s = 0;
      for (int l = 0; l < 16; ++l) {
        const int e = 16 * j + l;
        const int hi = (w[b].hmask[e % 32] >> (e / 32)) & 1;
        s += (q2_field(w[b].qs, e) - (hi ? 0 : 4)) * a[b].qs[e];
      }
      isum += q3k_scale(j, w[b].scales) * s;
    }
    sum += kterm(h2f(w[b].d), 0.f, a[b].d, isum, 0);
  }
  return sum;
}

QF_AVX2 float dot_q3_k_avx2(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ3_K*>(vw);
  const auto* a = static_cast<const BlockQ8_K*>(va);
  const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  float sum = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    // 16 6-bit scales: low nibbles from bytes 0..7, top bits from bytes 8..11.
    uint32_t s3[3];
    std::memcpy(s3, w[b].scales, 12);
    const __m128i lo = _mm_set_epi32(static_cast<int>(s3[1] >> 4), static_cast<int>(s3[0] >> 4), static_cast<int>(s3[1]),
                                     static_cast<int>(s3[0]));
    const __m128i top = _mm_set_epi32(static_cast<int>(s3[2] >> 6), static_cast<int>(s3[2] >> 4),
                                      static_cast<int>(s3[2] >> 2), static_cast<int>(s3[2]));
    const __m128i codes = _mm_or_si128(_mm_and_si128(lo, _mm_set1_epi8(0x0F)),
                                       _mm_slli_epi16(_mm_and_si128(top, _mm_set1_epi8(3)), 4));
    const __m128i sc = _mm_sub_epi8(codes, _mm_set1_epi8(32));
    const __m256i scales8 = _mm256_broadcastsi128_si256(sc);
    // 4 * sum_j scale_j * bsums_j, taken off the lanes before the horizontal sum.
    const __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(_mm256_cvtepi8_epi16(sc), load32(a[b].bsums)), 2);
    __m256i hm = load32(w[b].hmask);
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 2; ++c) {
      __m256i qv = load32(w[b].qs + 32 * c);
      for (int s = 0; s < 4; ++s, qv = _mm256_srli_epi16(qv, 2), hm = _mm256_srli_epi16(hm, 1)) {
        // code + 4 in 0..7: the two low bits, plus 4 when the hmask bit is set.
        const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(hm, one), 2);
        const __m256i u = _mm256_or_si256(_mm256_and_si256(qv, m3), hi);
        const __m256i p = _mm256_maddubs_epi16(u, load32(a[b].qs + 128 * c + 32 * s));
        const int j = 8 * c + 2 * s;
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale_pair8(scales8, j)));
      }
    }
    sum += kterm(h2f_f16c(w[b].d), 0.f, a[b].d, hsum_i32(_mm256_sub_epi32(acc, corr)), 0);
  }
  return sum;
}

}  // namespace qf::kquants::detail
