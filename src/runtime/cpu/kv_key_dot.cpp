#include "runtime/cpu/kv_key_dot.h"

#include <immintrin.h>

#include "core/dtype.h"
#include "core/simd.h"
#include "quantizers/kquants.h"

namespace qf::rt {

namespace {

using namespace qf::kquants;

// 32 codes of a block as bytes in element order (unsigned for q4_1).
template <class B>
__attribute__((target("avx2"))) inline __m256i codes(const B& b);

template <>
__attribute__((target("avx2"))) inline __m256i codes(const BlockQ8_0& b) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
}

__attribute__((target("avx2"))) inline __m256i nibbles(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)), m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

template <>
__attribute__((target("avx2"))) inline __m256i codes(const BlockQ4_0& b) {
  return _mm256_sub_epi8(nibbles(b.qs), _mm256_set1_epi8(8));
}

template <>
__attribute__((target("avx2"))) inline __m256i codes(const BlockQ4_1& b) {
  return nibbles(b.qs);
}

template <>
__attribute__((target("avx2"))) inline __m256i codes(const BlockIQ4_NL& b) {
  const __m256i table = _mm256_broadcastsi128_si256(
      _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113));
  return _mm256_shuffle_epi8(table, nibbles(b.qs));
}

__attribute__((target("avx2"))) inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// sum_i x_i y_i of 32 signed (or, for unsigned x, non-negative) bytes.
template <bool kUnsigned>
__attribute__((target("avx2"))) inline int dot32(__m256i x, __m256i y) {
  __m256i p;
  if (kUnsigned) {
    p = _mm256_maddubs_epi16(x, y);
  } else {
    p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
  }
  return hsum_i32(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

__attribute__((target("avx2,f16c"))) inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

// One block's integer products of 4 keys with one query at once: the four
// 8-lane partial sums reduced together.
template <bool kUnsigned>
__attribute__((target("avx2"))) inline __m128i dot32x4(const __m256i* x, __m256i y) {
  __m256i v[4];
  for (int i = 0; i < 4; ++i) {
    const __m256i p = kUnsigned ? _mm256_maddubs_epi16(x[i], y)
                                : _mm256_maddubs_epi16(_mm256_sign_epi8(x[i], x[i]), _mm256_sign_epi8(y, x[i]));
    v[i] = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
  }
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));  // keys 0..3
}

// Per block: (d_k d_q) * isum (+ m_k s_q for q4_1), summed over the blocks
// in order: for one block, the float kquants::vec_dot returns.
template <class B, class A>
__attribute__((target("avx2,f16c"))) void scores(const uint8_t* keys, size_t stride, int64_t n, int64_t hd,
                                                 const uint8_t* qa, size_t qa_row, int nq, float* out, int64_t os) {
  constexpr bool kMin = sizeof(B) == sizeof(BlockQ4_1);
  const int64_t nb = hd / 32;
  auto key = [&](int64_t p) { return reinterpret_cast<const B*>(keys + static_cast<size_t>(p) * stride); };
  auto query = [&](int j) { return reinterpret_cast<const A*>(qa + qa_row * static_cast<size_t>(j)); };
  int64_t p = 0;
  if (nb == 1) {  // a 32-wide head: four keys at a time
    for (; p + 4 <= n; p += 4) {
      __m256i x[4];
      float dk[4], mk[4] = {};
      for (int i = 0; i < 4; ++i) {
        x[i] = codes(*key(p + i));
        dk[i] = h2f(key(p + i)->d);
        if constexpr (kMin) mk[i] = h2f(key(p + i)->m);
      }
      for (int j = 0; j < nq; ++j) {
        const A& a = *query(j);
        alignas(16) int isum[4];
        _mm_store_si128(reinterpret_cast<__m128i*>(isum),
                        dot32x4<kMin>(x, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs))));
        const float da = h2f(a.d);
        for (int i = 0; i < 4; ++i) {
          float v = (dk[i] * da) * static_cast<float>(isum[i]);
          if constexpr (kMin) v += mk[i] * h2f(a.s);
          out[j * os + p + i] = v;
        }
      }
    }
  }
  for (; p < n; ++p) {
    const B* k = key(p);
    for (int j = 0; j < nq; ++j) {
      const A* a = query(j);
      float acc[8] = {};
      for (int64_t b = 0; b < nb; ++b) {
        const int isum = dot32<kMin>(codes(k[b]), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs)));
        if constexpr (kMin) {
          acc[b % 8] += (h2f(k[b].d) * h2f(a[b].d)) * static_cast<float>(isum) + h2f(k[b].m) * h2f(a[b].s);
        } else {
          acc[b % 8] += (h2f(k[b].d) * h2f(a[b].d)) * static_cast<float>(isum);
        }
      }
      out[j * os + p] = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    }
  }
}

}  // namespace

bool kv_key_scores_simd(KvDType t, const uint8_t* keys, size_t stride, int64_t n, int64_t hd, const uint8_t* qa,
                        size_t qa_row, int nq, float* out, int64_t os) {
  if (simd_level() == SimdLevel::Scalar || hd % 32 != 0) return false;
  switch (t) {
    case KvDType::Q8_0: scores<BlockQ8_0, BlockQ8_0>(keys, stride, n, hd, qa, qa_row, nq, out, os); return true;
    case KvDType::Q4_0: scores<BlockQ4_0, BlockQ8_0>(keys, stride, n, hd, qa, qa_row, nq, out, os); return true;
    case KvDType::Q4_1: scores<BlockQ4_1, BlockQ8_1>(keys, stride, n, hd, qa, qa_row, nq, out, os); return true;
    case KvDType::IQ4_NL: scores<BlockIQ4_NL, BlockQ8_0>(keys, stride, n, hd, qa, qa_row, nq, out, os); return true;
    default: return false;
  }
}

}  // namespace qf::rt
