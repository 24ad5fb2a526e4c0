// The legacy GGUF types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q8_1: 32-element
// blocks with an f16 scale (and min).

#include "quantizers/kquant_impl.h"  // first: its pragma turns off FMA contraction for this file

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "quantizers/kquant_avx2.h"

namespace qf::kquants::detail {

// ---- quantization ---------------------------------------------------------------

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

// ---- scalar reference dot ---------------------------------------------------------

namespace {

// The legacy refs walk the 16 bytes of nibbles once, element j in the low and
// j+16 in the high nibble. (Selecting the nibble per element with
// `j < 16 ? ... : ...` is miscompiled by GCC 12.2 at -O3 -march=<AVX-512>.)
inline uint32_t load_qh(const uint8_t* qh4) {
  uint32_t qh;
  std::memcpy(&qh, qh4, 4);
  return qh;
}
inline int hbit(uint32_t qh, int j) { return static_cast<int>((qh >> j) & 1u) << 4; }

}  // namespace

float dot_q4_0_ref(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ4_0*>(vw);
  const auto* a = static_cast<const BlockQ8_0*>(va);
  float acc[8] = {};
  for (int64_t b = 0; b < n / QK; ++b) {
    int isum = 0;
    for (int j = 0; j < 16; ++j)
      isum += ((w[b].qs[j] & 0xF) - 8) * a[b].qs[j] + ((w[b].qs[j] >> 4) - 8) * a[b].qs[j + 16];
    acc[b % 8] += (h2f(w[b].d) * h2f(a[b].d)) * static_cast<float>(isum);
  }
  return reduce8(acc);
}

float dot_q4_1_ref(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ4_1*>(vw);
  const auto* a = static_cast<const BlockQ8_1*>(va);
  float acc[8] = {};
  for (int64_t b = 0; b < n / QK; ++b) {
    int isum = 0;
    for (int j = 0; j < 16; ++j) isum += (w[b].qs[j] & 0xF) * a[b].qs[j] + (w[b].qs[j] >> 4) * a[b].qs[j + 16];
    acc[b % 8] += (h2f(w[b].d) * h2f(a[b].d)) * static_cast<float>(isum) + h2f(w[b].m) * h2f(a[b].s);
  }
  return reduce8(acc);
}

float dot_q5_0_ref(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ5_0*>(vw);
  const auto* a = static_cast<const BlockQ8_0*>(va);
  float acc[8] = {};
  for (int64_t b = 0; b < n / QK; ++b) {
    int isum = 0;
    const uint32_t qh = load_qh(w[b].qh);
    for (int j = 0; j < 16; ++j)
      isum += (((w[b].qs[j] & 0xF) | hbit(qh, j)) - 16) * a[b].qs[j] +
              (((w[b].qs[j] >> 4) | hbit(qh, j + 16)) - 16) * a[b].qs[j + 16];
    acc[b % 8] += (h2f(w[b].d) * h2f(a[b].d)) * static_cast<float>(isum);
  }
  return reduce8(acc);
}

float dot_q5_1_ref(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ5_1*>(vw);
  const auto* a = static_cast<const BlockQ8_1*>(va);
  float acc[8] = {};
  for (int64_t b = 0; b < n / QK; ++b) {
    int isum = 0;
    const uint32_t qh = load_qh(w[b].qh);
    for (int j = 0; j < 16; ++j)
      isum += ((w[b].qs[j] & 0xF) | hbit(qh, j)) * a[b].qs[j] + ((w[b].qs[j] >> 4) | hbit(qh, j + 16)) * a[b].qs[j + 16];
    acc[b % 8] += (h2f(w[b].d) * h2f(a[b].d)) * static_cast<float>(isum) + h2f(w[b].m) * h2f(a[b].s);
  }
  return reduce8(acc);
}

float dot_q8_0_ref(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ8_0*>(vw);
  const auto* a = static_cast<const BlockQ8_0*>(va);
  float acc[8] = {};
  for (int64_t b = 0; b < n / QK; ++b) {
    int isum = 0;
    for (int j = 0; j < QK; ++j) isum += w[b].qs[j] * a[b].qs[j];
    acc[b % 8] += (h2f(w[b].d) * h2f(a[b].d)) * static_cast<float>(isum);
  }
  return reduce8(acc);
}

// ---- AVX2 dot ---------------------------------------------------------------------

namespace {

// Legacy types: 8 blocks per step. Kernel::run(w, a) gives one block's integer
// dot in 8 lanes; kHasMin adds the m*s term (Q4_1/Q5_1).
template <typename WB, typename AB, bool kHasMin, typename Kernel>
QF_AVX2_INLINE float dot_legacy_avx2(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const WB*>(vw);
  const auto* a = static_cast<const AB*>(va);
  const int64_t nb = n / QK;
  __m256 acc = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    __m256i v[8];
    for (int k = 0; k < 8; ++k) v[k] = Kernel::run(w[b + k], a[b + k]);
    const __m256 isum = _mm256_cvtepi32_ps(hsum8x8(v));
    const __m256 d = _mm256_mul_ps(load_h8(&w[b].d, sizeof(WB)), load_h8(&a[b].d, sizeof(AB)));
    __m256 t = _mm256_mul_ps(d, isum);
    if constexpr (kHasMin) t = _mm256_add_ps(t, _mm256_mul_ps(load_h8(&w[b].m, sizeof(WB)), load_h8(&a[b].s, sizeof(AB))));
    acc = _mm256_add_ps(acc, t);
  }
  alignas(32) float part[8];
  _mm256_store_ps(part, acc);
  for (; b < nb; ++b) {
    const int isum = hsum_i32(Kernel::run(w[b], a[b]));
    float t = (h2f(w[b].d) * h2f(a[b].d)) * static_cast<float>(isum);
    if constexpr (kHasMin) t = t + h2f(w[b].m) * h2f(a[b].s);
    part[b % 8] += t;
  }
  return reduce8(part);
}

struct Q4_0Kernel {
  QF_AVX2_INLINE static __m256i run(const BlockQ4_0& x, const BlockQ8_0& y) {
    return dot_s8s8(_mm256_sub_epi8(unpack_nibbles16(x.qs), _mm256_set1_epi8(8)), load32(y.qs));
  }
};
struct Q4_1Kernel {
  QF_AVX2_INLINE static __m256i run(const BlockQ4_1& x, const BlockQ8_1& y) {
    return dot_u8s8(unpack_nibbles16(x.qs), load32(y.qs));
  }
};
struct Q5_0Kernel {
  QF_AVX2_INLINE static __m256i run(const BlockQ5_0& x, const BlockQ8_0& y) {
    const __m256i code = _mm256_or_si256(unpack_nibbles16(x.qs), expand_bit5(x.qh));
    return dot_s8s8(_mm256_sub_epi8(code, _mm256_set1_epi8(16)), load32(y.qs));
  }
};
struct Q5_1Kernel {
  QF_AVX2_INLINE static __m256i run(const BlockQ5_1& x, const BlockQ8_1& y) {
    return dot_u8s8(_mm256_or_si256(unpack_nibbles16(x.qs), expand_bit5(x.qh)), load32(y.qs));
  }
};
struct Q8_0Kernel {
  QF_AVX2_INLINE static __m256i run(const BlockQ8_0& x, const BlockQ8_0& y) {
    return dot_s8s8(load32(x.qs), load32(y.qs));
  }
};

}  // namespace

QF_AVX2 float dot_q4_0_avx2(int64_t n, const void* w, const void* a) {
  return dot_legacy_avx2<BlockQ4_0, BlockQ8_0, false, Q4_0Kernel>(n, w, a);
}
QF_AVX2 float dot_q4_1_avx2(int64_t n, const void* w, const void* a) {
  return dot_legacy_avx2<BlockQ4_1, BlockQ8_1, true, Q4_1Kernel>(n, w, a);
}
QF_AVX2 float dot_q5_0_avx2(int64_t n, const void* w, const void* a) {
  return dot_legacy_avx2<BlockQ5_0, BlockQ8_0, false, Q5_0Kernel>(n, w, a);
}
QF_AVX2 float dot_q5_1_avx2(int64_t n, const void* w, const void* a) {
  return dot_legacy_avx2<BlockQ5_1, BlockQ8_1, true, Q5_1Kernel>(n, w, a);
}
QF_AVX2 float dot_q8_0_avx2(int64_t n, const void* w, const void* a) {
  return dot_legacy_avx2<BlockQ8_0, BlockQ8_0, false, Q8_0Kernel>(n, w, a);
}

}  // namespace qf::kquants::detail
