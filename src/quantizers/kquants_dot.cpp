// Dot products of a quantized weight row with a quantized activation row.
//
// Every type has a scalar definition (the *_ref functions) and an AVX2 kernel
// that returns the same float, bit for bit. That works because all the
// products of quantized codes are summed exactly in integers, and the float
// steps that follow are done in one fixed order by both versions:
//  - legacy 32-element blocks: block b's term t_b = (dw*da) * isum_b [+ m*s]
//    goes into partial sum b % 8 (the AVX2 kernel keeps those 8 partials as
//    the lanes of one register and handles 8 blocks per step);
//  - k-quant 256-element super-blocks: t_b = dw*da*isum_b - dmin*da*summ_b,
//    summed in block order (the kernel finishes each super-block in scalar);
//  - f32/f16/bf16 rows: element i goes into partial sum i % 32 (four 8-lane
//    registers).
// The 8 (or 32) partials are then reduced by reduce8 below. No fused
// multiply-add anywhere: the kernels use separate mul/add intrinsics, and the
// pragma below stops the compiler from contracting a*b+c whatever -march the
// library is built with.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "quantizers/kquants.h"

namespace qf::kquants {
namespace {

constexpr int QK = 32;
constexpr int QK_K = 256;

inline float h2f(uint16_t h) { return f16_to_f32(h); }

// The fixed reduction of 8 partial sums (the order of the AVX2 horizontal add).
inline float reduce8(const float* a) { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

// 32 partials -> 8 (lane-wise, as the four registers are added) -> reduce8.
inline float reduce32(const float* a) {
  float v[8];
  for (int j = 0; j < 8; ++j) v[j] = (a[j] + a[8 + j]) + (a[16 + j] + a[24 + j]);
  return reduce8(v);
}

// ---- scalar reference ------------------------------------------------------------

// The legacy refs walk the 16 bytes of nibbles once, element j in the low and
// j+16 in the high nibble. (Selecting the nibble per element with
// `j < 16 ? ... : ...` is miscompiled by GCC 12.2 at -O3 -march=<AVX-512>.)
inline uint32_t load_qh(const uint8_t* qh4) {
  uint32_t qh;
  std::memcpy(&qh, qh4, 4);
  return qh;
}
inline int hbit(uint32_t qh, int j) { return static_cast<int>((qh >> j) & 1u) << 4; }

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

// The float step of one k-quant super-block, shared by both versions.
inline float kterm(float wd, float wdmin, float ad, int isum, int summ) {
  return (wd * ad) * static_cast<float>(isum) - (wdmin * ad) * static_cast<float>(summ);
}

inline int q2_field(const uint8_t* qs, int e) { return (qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3; }

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

template <typename Conv>
float dot_float_ref(int64_t n, const void* vw, const void* va, Conv conv) {
  float acc[32] = {};
  for (int64_t i = 0; i < n; ++i) acc[i % 32] += conv(vw, i) * conv(va, i);
  return reduce32(acc);
}
float dot_f32_ref(int64_t n, const void* w, const void* a) {
  return dot_float_ref(n, w, a, [](const void* p, int64_t i) { return static_cast<const float*>(p)[i]; });
}
float dot_f16_ref(int64_t n, const void* w, const void* a) {
  return dot_float_ref(n, w, a, [](const void* p, int64_t i) { return f16_to_f32(static_cast<const uint16_t*>(p)[i]); });
}
float dot_bf16_ref(int64_t n, const void* w, const void* a) {
  return dot_float_ref(n, w, a, [](const void* p, int64_t i) { return bf16_to_f32(static_cast<const uint16_t*>(p)[i]); });
}

// ---- AVX2 ----------------------------------------------------------------------

#define QF_AVX2 __attribute__((target("avx2,f16c")))
#define QF_AVX2_INLINE __attribute__((target("avx2,f16c"), always_inline)) inline

// Sum of u8 x s8 products in 8 int32 lanes (each lane: 4 adjacent bytes).
// maddubs saturates at +-32767: fine for |u| <= 128 and |s| <= 127.
QF_AVX2_INLINE __m256i dot_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
QF_AVX2_INLINE __m256i dot_s8s8(__m256i x, __m256i y) {
  return dot_u8s8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}
QF_AVX2_INLINE int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}
// Lane k of the result = sum of the 8 lanes of v[k].
QF_AVX2_INLINE __m256i hsum8x8(const __m256i* v) {
  const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20), _mm256_permute2x128_si256(h0, h1, 0x31));
}
// 16 nibbles -> 32 bytes: low nibbles first (elements 0..15), then high (16..31).
QF_AVX2_INLINE __m256i unpack_nibbles16(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}
// Bit j of the 32-bit qh -> 0x10 in byte j.
QF_AVX2_INLINE __m256i expand_bit5(const uint8_t* qh4) {
  uint32_t qh;
  std::memcpy(&qh, qh4, 4);
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), shuf);
  const __m256i bitsel = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bitsel), bitsel);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}
QF_AVX2_INLINE __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// fp16 fields of 8 consecutive blocks (byte stride `stride`) as 8 floats.
QF_AVX2_INLINE __m256 load_h8(const void* first, size_t stride) {
  const auto* p = static_cast<const uint8_t*>(first);
  uint16_t h[8];
  for (int k = 0; k < 8; ++k) std::memcpy(&h[k], p + k * stride, 2);
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
}

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

// Two 16-element sub-blocks in one register: int16 scale j for bytes 0..15,
// j+1 for bytes 16..31, from 16 signed 8-bit scales held in both 128-bit
// lanes (j even).
QF_AVX2_INLINE __m256i scale_pair8(__m256i scales8, int j) {
  const __m256i pick = _mm256_set_m128i(_mm_set1_epi8(static_cast<char>(j + 1)), _mm_set1_epi8(static_cast<char>(j)));
  return _mm256_srai_epi16(_mm256_shuffle_epi8(scales8, pick), 8);  // bytes (s, s) -> int16 s
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
    sum += kterm(h2f(w[b].d), h2f(w[b].dmin), a[b].d, hsum_i32(acc), summ);
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
    sum += kterm(h2f(w[b].d), 0.f, a[b].d, hsum_i32(_mm256_sub_epi32(acc, corr)), 0);
  }
  return sum;
}

template <typename Block, bool kFive>
QF_AVX2_INLINE float dot_k4_avx2(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const Block*>(vw);
  const auto* a = static_cast<const BlockQ8_K*>(va);
  const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  float sum = 0;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    // The 8 scales and 8 mins, unpacked four at a time from the three words.
    uint32_t s3[3];
    std::memcpy(s3, w[b].scales, 12);
    const uint32_t sc_words[2] = {s3[0] & 0x3f3f3f3fu, (s3[2] & 0x0f0f0f0fu) | ((s3[0] >> 2) & 0x30303030u)};
    const uint32_t mn_words[2] = {s3[1] & 0x3f3f3f3fu, ((s3[2] >> 4) & 0x0f0f0f0fu) | ((s3[1] >> 2) & 0x30303030u)};
    uint8_t sc[8];
    std::memcpy(sc, sc_words, 8);
    // summ = sum_j m_j * (bsums[2j] + bsums[2j+1]).
    const __m128i mins8 = _mm_set_epi32(0, 0, static_cast<int>(mn_words[1]), static_cast<int>(mn_words[0]));
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
    sum += kterm(h2f(w[b].d), h2f(w[b].dmin), a[b].d, hsum_i32(acc), summ);
  }
  return sum;
}
QF_AVX2 float dot_q4_k_avx2(int64_t n, const void* w, const void* a) { return dot_k4_avx2<BlockQ4_K, false>(n, w, a); }
QF_AVX2 float dot_q5_k_avx2(int64_t n, const void* w, const void* a) { return dot_k4_avx2<BlockQ5_K, true>(n, w, a); }

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
    sum += kterm(h2f(w[b].d), 0.f, a[b].d, hsum_i32(_mm256_sub_epi32(acc, corr)), 0);
  }
  return sum;
}

// Float rows: 32 elements per step into four 8-lane partial sums. Row::load8
// converts 8 elements to floats, Row::one a single element.
template <typename Row>
QF_AVX2_INLINE float dot_float_avx2(int64_t n, const void* w, const void* a) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(Row::load8(w, i + 8 * k), Row::load8(a, i + 8 * k)));
  alignas(32) float part[32];
  for (int k = 0; k < 4; ++k) _mm256_store_ps(part + 8 * k, acc[k]);
  for (; i < n; ++i) part[i % 32] += Row::one(w, i) * Row::one(a, i);
  return reduce32(part);
}
struct F32Row {
  QF_AVX2_INLINE static __m256 load8(const void* p, int64_t i) { return _mm256_loadu_ps(static_cast<const float*>(p) + i); }
  static float one(const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }
};
struct F16Row {
  QF_AVX2_INLINE static __m256 load8(const void* p, int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i)));
  }
  static float one(const void* p, int64_t i) { return f16_to_f32(static_cast<const uint16_t*>(p)[i]); }
};
struct BF16Row {
  QF_AVX2_INLINE static __m256 load8(const void* p, int64_t i) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static float one(const void* p, int64_t i) { return bf16_to_f32(static_cast<const uint16_t*>(p)[i]); }
};
QF_AVX2 float dot_f32_avx2(int64_t n, const void* w, const void* a) { return dot_float_avx2<F32Row>(n, w, a); }
QF_AVX2 float dot_f16_avx2(int64_t n, const void* w, const void* a) { return dot_float_avx2<F16Row>(n, w, a); }
QF_AVX2 float dot_bf16_avx2(int64_t n, const void* w, const void* a) { return dot_float_avx2<BF16Row>(n, w, a); }

// ---- dispatch ----------------------------------------------------------------

using DotFn = float (*)(int64_t, const void*, const void*);
constexpr uint32_t kMaxType = 32;

// The scalar references and the AVX2 kernels, per type.
struct Table {
  DotFn ref[kMaxType] = {};
  DotFn avx2[kMaxType] = {};
  uint32_t block[kMaxType] = {};
};

Table make_table() {
  namespace t = ggml_type;
  Table tb;
  auto set = [&](uint32_t type, DotFn r, DotFn f) {
    tb.ref[type] = r;
    tb.avx2[type] = f;
    tb.block[type] = ggml_type_info(type)->block_size;
  };
  set(t::F32, dot_f32_ref, dot_f32_avx2);
  set(t::F16, dot_f16_ref, dot_f16_avx2);
  set(t::BF16, dot_bf16_ref, dot_bf16_avx2);
  set(t::Q4_0, dot_q4_0_ref, dot_q4_0_avx2);
  set(t::Q4_1, dot_q4_1_ref, dot_q4_1_avx2);
  set(t::Q5_0, dot_q5_0_ref, dot_q5_0_avx2);
  set(t::Q5_1, dot_q5_1_ref, dot_q5_1_avx2);
  set(t::Q8_0, dot_q8_0_ref, dot_q8_0_avx2);
  set(t::Q2_K, dot_q2_k_ref, dot_q2_k_avx2);
  set(t::Q3_K, dot_q3_k_ref, dot_q3_k_avx2);
  set(t::Q4_K, dot_k4_ref<BlockQ4_K, false>, dot_q4_k_avx2);
  set(t::Q5_K, dot_k4_ref<BlockQ5_K, true>, dot_q5_k_avx2);
  set(t::Q6_K, dot_q6_k_ref, dot_q6_k_avx2);
  return tb;
}

const Table& table() {
  static const Table tb = make_table();
  return tb;
}

DotFn lookup(const DotFn* fns, uint32_t type, int64_t n) {
  const Table& tb = table();
  if (type >= kMaxType || !fns[type]) {
    const GgmlTypeInfo* info = ggml_type_info(type);
    throw unsupported("vec_dot", std::string("no dot product for ggml type ") +
                                     (info ? info->name : std::to_string(type)));
  }
  if (n < 0 || n % tb.block[type] != 0)
    throw invalid_input("vec_dot", std::string(ggml_type_info(type)->name) + " row length " + std::to_string(n) +
                                       " is not a multiple of the block size " + std::to_string(tb.block[type]));
  return fns[type];
}

}  // namespace

float vec_dot(uint32_t type, int64_t n, const void* w, const void* a) {
  const Table& tb = table();
  return lookup(simd_level() == SimdLevel::Avx2 ? tb.avx2 : tb.ref, type, n)(n, w, a);
}

float vec_dot_ref(uint32_t type, int64_t n, const void* w, const void* a) {
  return lookup(table().ref, type, n)(n, w, a);
}

// The AVX2 kernels need AVX2 and F16C, which every level above scalar has.
SimdLevel simd_level() { return std::min(qf::simd_level(), SimdLevel::Avx2); }

}  // namespace qf::kquants
