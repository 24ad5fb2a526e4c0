// Q4_K and Q5_K: 256-element super-blocks, 6-bit scales and mins per 32
// elements, 4-bit codes (Q5_K: a fifth bit in qh).

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

namespace {

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
  uint8_t ls[8], lm[8];
  float w[QK_K], mins[8], scales[8];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float av_x = std::sqrt(sum_squares(x + 32 * j, 32) / 32);
    for (int l = 0; l < 32; ++l) w[32 * j + l] = av_x + std::fabs(x[32 * j + l]);
  }
  search_asymmetric_x8(32, nmax, x, w, L, scales, mins, rmin, rdelta, nstep, false, false);
  for (int j = 0; j < 8; ++j) {
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
  uint8_t ls[8], lm[8];
  float w[QK_K], mins[8], scales[8], sw[8];
  const float sigma2 = 2 * sum_squares(x, QK_K) / QK_K;
  for (int j = 0; j < 8; ++j) {
    block_weights(x + 32 * j, qw + 32 * j, sigma2, 32, w + 32 * j);
    float sumw = 0;
    for (int l = 0; l < 32; ++l) sumw += w[32 * j + l];
    sw[j] = sumw;
  }
  search_asymmetric_x8(32, nmax, x, w, L, scales, mins, -0.9f, 0.05f, 36, false, true);
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

}  // namespace

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

namespace {

template <typename Block, bool kFive>
float dot_k4_ref(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const Block*>(vw);
  const auto* a = static_cast<const BlockQ8_K*>(va);
  float sum = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    int isum = 0, summ = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      unpack_scale_min_k4(j, w[b].scales, &sc, &m);
      const uint8_t* q = w[b].qs + 32 * (j / 2);
      int s = 0;
      for (int l = 0; l < 32; ++l) {
        int code = (q[l] >> (4 * (j % 2))) & 0xF;
        if constexpr (kFive) code |= ((w[b].qh[l] >> j) & 1) << 4;
        s += code * a[b].qs[32 * j + l];
      }
      isum += sc * s;
      summ += m * (a[b].bsums[2 * j] + a[b].bsums[2 * j + 1]);
    }
    sum += kterm(h2f(w[b].d), h2f(w[b].dmin), a[b].d, isum, summ);
  }
  return sum;
}

// The 8 6-bit scales (words 0 and 1) and 8 mins (words 2 and 3) of a Q4_K /
// Q5_K block's 12 scale bytes, one byte each, unpacked four at a time.
inline void unpack_scale_min_words(const uint8_t* scales, uint32_t out[4]) {
  uint32_t s3[3];
  std::memcpy(s3, scales, 12);
  out[0] = s3[0] & 0x3f3f3f3fu;
  out[1] = (s3[2] & 0x0f0f0f0fu) | ((s3[0] >> 2) & 0x30303030u);
  out[2] = s3[1] & 0x3f3f3f3fu;
  out[3] = ((s3[2] >> 4) & 0x0f0f0f0fu) | ((s3[1] >> 2) & 0x30303030u);
}

template <typename Block, bool kFive>
QF_AVX2_INLINE float dot_k4_avx2(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const Block*>(vw);
  const auto* a = static_cast<const BlockQ8_K*>(va);
  const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  float sum = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    uint32_t words[4];
    unpack_scale_min_words(w[b].scales, words);
    uint8_t sc[8];
    std::memcpy(sc, words, 8);
    // summ = sum_j m_j * (bsums[2j] + bsums[2j+1]).
    const __m128i mins8 = _mm_set_epi32(0, 0, static_cast<int>(words[3]), static_cast<int>(words[2]));
    const __m256i pair_sums = _mm256_madd_epi16(load32(a[b].bsums), _mm256_set1_epi16(1));
    const int summ = hsum_i32(_mm256_mullo_epi32(pair_sums, _mm256_cvtepu8_epi32(mins8)));
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFive) qh = load32(w[b].qh);
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i qv = load32(w[b].qs + 32 * c);
      __m256i lo = _mm256_and_si256(qv, m4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qv, 4), m4);
      if constexpr (kFive) {
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(qh, one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4));
        qh = _mm256_srli_epi16(qh, 2);
      }
      const __m256i p0 = _mm256_maddubs_epi16(lo, load32(a[b].qs + 64 * c));
      const __m256i p1 = _mm256_maddubs_epi16(hi, load32(a[b].qs + 64 * c + 32));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p0, _mm256_set1_epi16(sc[2 * c])));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * c + 1])));
    }
    sum += kterm(h2f_f16c(w[b].d), h2f_f16c(w[b].dmin), a[b].d, hsum_i32(acc), summ);
  }
  return sum;
}

// The AVX-512 kernel: sub-blocks 2c and 2c+1 (the low and high nibbles of
// the same 32 bytes) side by side in one register, against the 64
// activations they meet, which are contiguous.
template <typename Block, bool kFive>
QF_AVX512_INLINE float dot_k4_avx512(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const Block*>(vw);
  const auto* a = static_cast<const BlockQ8_K*>(va);
  const __m512i m4 = _mm512_set1_epi8(0x0F), one = _mm512_set1_epi8(1);
  float sum = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    uint32_t words[4];
    unpack_scale_min_words(w[b].scales, words);
    // Bytes 0..7: the 8 scales; bytes 8..15: the 8 mins.
    const __m128i scmn = _mm_loadu_si128(reinterpret_cast<const __m128i*>(words));
    // summ = sum_j m_j * (bsums[2j] + bsums[2j+1]): each min widened twice.
    const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scmn, scmn));
    const int summ = hsum_i32(_mm256_madd_epi16(load32(a[b].bsums), mins16));
    const __m512i scb = _mm512_broadcast_i32x4(scmn);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFive) qh = load32(w[b].qh);
    __m512i acc = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      __m512i q = _mm512_and_si512(with_shifted_half(load32(w[b].qs + 32 * c), 4), m4);
      if constexpr (kFive) {
        const __m512i hb = _mm512_and_si512(with_shifted_half(_mm256_srli_epi16(qh, 2 * c), 1), one);
        q = _mm512_or_si512(q, _mm512_slli_epi16(hb, 4));
      }
      const __m512i p = _mm512_maddubs_epi16(q, load64(a[b].qs + 64 * c));
      acc = _mm512_add_epi32(acc, _mm512_madd_epi16(p, lane_scales<false>(scb, 2 * c, 2 * c, 2 * c + 1, 2 * c + 1)));
    }
    sum += kterm(h2f_f16c(w[b].d), h2f_f16c(w[b].dmin), a[b].d, hsum_i32(fold16to8(acc)), summ);
  }
  return sum;
}

}  // namespace

float dot_q4_k_ref(int64_t n, const void* w, const void* a) { return dot_k4_ref<BlockQ4_K, false>(n, w, a); }
float dot_q5_k_ref(int64_t n, const void* w, const void* a) { return dot_k4_ref<BlockQ5_K, true>(n, w, a); }
QF_AVX2 float dot_q4_k_avx2(int64_t n, const void* w, const void* a) { return dot_k4_avx2<BlockQ4_K, false>(n, w, a); }
QF_AVX2 float dot_q5_k_avx2(int64_t n, const void* w, const void* a) { return dot_k4_avx2<BlockQ5_K, true>(n, w, a); }
QF_AVX512 float dot_q4_k_avx512(int64_t n, const void* w, const void* a) { return dot_k4_avx512<BlockQ4_K, false>(n, w, a); }
QF_AVX512 float dot_q5_k_avx512(int64_t n, const void* w, const void* a) { return dot_k4_avx512<BlockQ5_K, true>(n, w, a); }

}  // namespace qf::kquants::detail
