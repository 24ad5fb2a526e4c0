// F32, F16 and BF16 rows: element i goes into partial sum i % 32 (four 8-lane
// registers), then reduce32, in both versions.

#include "quantizers/kquant_impl.h"  // first: its pragma turns off FMA contraction for this file

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "quantizers/kquant_avx2.h"

namespace qf::kquants::detail {

namespace {

template <typename Conv>
float dot_float_ref(int64_t n, const void* vw, const void* va, Conv conv) {
  float acc[32] = {};
  for (int64_t i = 0; i < n; ++i) acc[i % 32] += conv(vw, i) * conv(va, i);
  return reduce32(acc);
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

}  // namespace

float dot_f32_ref(int64_t n, const void* w, const void* a) {
  return dot_float_ref(n, w, a, [](const void* p, int64_t i) { return static_cast<const float*>(p)[i]; });
}
float dot_f16_ref(int64_t n, const void* w, const void* a) {
  return dot_float_ref(n, w, a, [](const void* p, int64_t i) { return f16_to_f32(static_cast<const uint16_t*>(p)[i]); });
}
float dot_bf16_ref(int64_t n, const void* w, const void* a) {
  return dot_float_ref(n, w, a, [](const void* p, int64_t i) { return bf16_to_f32(static_cast<const uint16_t*>(p)[i]); });
}
QF_AVX2 float dot_f32_avx2(int64_t n, const void* w, const void* a) { return dot_float_avx2<F32Row>(n, w, a); }
QF_AVX2 float dot_f16_avx2(int64_t n, const void* w, const void* a) { return dot_float_avx2<F16Row>(n, w, a); }
QF_AVX2 float dot_bf16_avx2(int64_t n, const void* w, const void* a) { return dot_float_avx2<BF16Row>(n, w, a); }

}  // namespace qf::kquants::detail
