// No FMA contraction in this file: the vector products and sums must round
// apart, as the scalar loop of gptq_row.h does.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

#include "quantizers/gptq_row_cpu.h"

#include <immintrin.h>

namespace qf {
namespace {

__attribute__((target("avx2"))) void update_avx2(double* w, const double* u, double c, int64_t n) {
  const __m256d cv = _mm256_set1_pd(c);
  int64_t j = 0;
  for (; j + 4 <= n; j += 4)
    _mm256_storeu_pd(w + j, _mm256_add_pd(_mm256_mul_pd(cv, _mm256_loadu_pd(u + j)), _mm256_loadu_pd(w + j)));
  for (; j < n; ++j) w[j] = c * u[j] + w[j];
}

__attribute__((target("avx512f"))) void update_avx512(double* w, const double* u, double c, int64_t n) {
  const __m512d cv = _mm512_set1_pd(c);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm512_storeu_pd(w + j, _mm512_add_pd(_mm512_mul_pd(cv, _mm512_loadu_pd(u + j)), _mm512_loadu_pd(w + j)));
  if (j < n) {
    const __mmask8 m = static_cast<__mmask8>((1u << (n - j)) - 1u);
    _mm512_mask_storeu_pd(w + j, m, _mm512_add_pd(_mm512_mul_pd(cv, _mm512_maskz_loadu_pd(m, u + j)),
                                                  _mm512_maskz_loadu_pd(m, w + j)));
  }
}

}  // namespace

void gptq_row_update(double* w, const double* u, double c, int64_t n, SimdLevel level) {
  if (level >= SimdLevel::Avx512) return update_avx512(w, u, c, n);
  if (level == SimdLevel::Avx2) return update_avx2(w, u, c, n);
  for (int64_t j = 0; j < n; ++j) w[j] = c * u[j] + w[j];
}

}  // namespace qf
