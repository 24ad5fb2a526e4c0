// AVX-512 building blocks of the GGUF dot kernels that have an AVX-512
// version (Q4_K, Q5_K, Q6_K: the types of the k-quant presets' big tensors).
// Functions are compiled for AVX-512 F/BW/VL (and AVX2+F16C) whatever the
// library's -march; callers check the SIMD level first (kquants_dot.cpp).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace qf::kquants::detail {

#define QF_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))
#define QF_AVX512_INLINE __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c"), always_inline)) inline

QF_AVX512_INLINE __m512i load64(const void* p) { return _mm512_loadu_si512(p); }

// 32 bytes in the low half, the same bytes shifted right by `shift` bits (per
// 16-bit lane) in the high half.
QF_AVX512_INLINE __m512i with_shifted_half(__m256i v, int shift) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, shift), 1);
}

// Int16 scales for the four 128-bit lanes of a 512-bit register: lane k gets
// the byte at index pick[k] of the 16 bytes `bytes16` (held in every lane),
// sign-extended (kSigned) or zero-extended to 16 bits in all 8 words.
template <bool kSigned>
QF_AVX512_INLINE __m512i lane_scales(__m512i bytes16, int p0, int p1, int p2, int p3) {
  const __m512i pick = _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_set_m128i(_mm_set1_epi8(static_cast<char>(p1)), _mm_set1_epi8(static_cast<char>(p0)))),
      _mm256_set_m128i(_mm_set1_epi8(static_cast<char>(p3)), _mm_set1_epi8(static_cast<char>(p2))), 1);
  const __m512i both = _mm512_shuffle_epi8(bytes16, pick);  // bytes (s, s) -> 16-bit s after the shift
  return kSigned ? _mm512_srai_epi16(both, 8) : _mm512_srli_epi16(both, 8);
}

// The 16 int32 lanes of v folded to 8 (lane i + lane i + 8).
QF_AVX512_INLINE __m256i fold16to8(__m512i v) {
  return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

}  // namespace qf::kquants::detail
