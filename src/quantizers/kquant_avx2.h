// AVX2 building blocks of the GGUF dot kernels (kquant_*.cpp). Functions are
// compiled for AVX2+F16C whatever the library's -march; callers check the
// SIMD level first (kquants_dot.cpp).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace qf::kquants::detail {

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
// An fp16 field as a float with F16C's conversion (exact, like h2f, and
// without its bit manipulation on the per-block path).
QF_AVX2_INLINE float h2f_f16c(uint16_t h) { return _cvtsh_ss(h); }
QF_AVX2_INLINE __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// fp16 fields of 8 consecutive blocks (byte stride `stride`) as 8 floats.
QF_AVX2_INLINE __m256 load_h8(const void* first, size_t stride) {
  const auto* p = static_cast<const uint8_t*>(first);
  uint16_t h[8];
  for (int k = 0; k < 8; ++k) std::memcpy(&h[k], p + k * stride, 2);
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
}

// Two 16-element sub-blocks in one register: int16 scale j for bytes 0..15,
// j+1 for bytes 16..31, from 16 signed 8-bit scales held in both 128-bit
// lanes (j even).
QF_AVX2_INLINE __m256i scale_pair8(__m256i scales8, int j) {
  const __m256i pick = _mm256_set_m128i(_mm_set1_epi8(static_cast<char>(j + 1)), _mm_set1_epi8(static_cast<char>(j)));
  return _mm256_srai_epi16(_mm256_shuffle_epi8(scales8, pick), 8);  // bytes (s, s) -> int16 s
}

}  // namespace qf::kquants::detail
