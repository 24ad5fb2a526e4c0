// No FMA contraction in this file: the vector products and sums must round
// apart, as the scalar loop of gptq_row.h does.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

#include "quantizers/gptq_row_cpu.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "quantizers/int_quant.h"

namespace qf {
namespace {

// The block of W (count columns x lanes rows, column-major: tile[j * L + k])
// for rows' columns [i1, i2).
template <int L>
void gather(const GptqRows& rows, int64_t i1, int64_t i2, double* tile) {
  for (int64_t j = i1; j < i2; ++j)
    for (int k = 0; k < L; ++k) tile[(j - i1) * L + k] = k < rows.n ? rows.w[k][j] : 0.0;
}
template <int L>
void scatter(const GptqRows& rows, int64_t i1, int64_t i2, const double* tile) {
  for (int64_t j = i1; j < i2; ++j)
    for (int k = 0; k < rows.n; ++k) rows.w[k][j] = tile[(j - i1) * L + k];
}

// The lanes' quantizer of column i (rows past n: a scale of 1, zero 0).
template <int L>
void params(const GptqRows& rows, int64_t g, float* scale, int32_t* zero) {
  for (int k = 0; k < L; ++k) {
    scale[k] = k < rows.n ? rows.scale[k][g] : 1.0f;
    zero[k] = k < rows.n ? rows.zero[k][g] : 0;
  }
}

__attribute__((target("avx512f,avx512vl,avx512dq,avx2,fma"))) void rows_avx512(const GptqRows& rows, const double* U,
                                                                               int64_t ldu, int64_t i1, int64_t i2,
                                                                               const int64_t* perm, int64_t gs,
                                                                               int32_t qmax) {
  constexpr int L = 8;
  const int64_t count = i2 - i1;
  thread_local std::vector<double> tile_buf;
  tile_buf.resize(static_cast<size_t>(count * L));
  double* tile = tile_buf.data();
  gather<L>(rows, i1, i2, tile);
  alignas(32) float sc[L];
  alignas(32) int32_t zr[L];
  if (!rows.per_group) params<L>(rows, 0, sc, zr);
  const __m256 hi = _mm256_set1_ps(static_cast<float>(qmax)), fzero = _mm256_setzero_ps();
  for (int64_t i = i1; i < i2; ++i) {
    if (rows.per_group) params<L>(rows, perm[i] / gs, sc, zr);
    const __m256 s = _mm256_load_ps(sc);
    const __m256i z = _mm256_load_si256(reinterpret_cast<const __m256i*>(zr));
    const __m512d x = _mm512_loadu_pd(tile + (i - i1) * L);
    // quantize_int: round_half_even(float(x) / scale) + zero, NaN -> zero, clamped to [0, qmax]. (The maskz
    // conversions: GCC 12 warns about the plain forms' undefined operand.)
    __m256 t = _mm256_add_ps(_mm256_round_ps(_mm256_div_ps(_mm512_maskz_cvtpd_ps(0xFF, x), s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                             _mm256_cvtepi32_ps(z));
    const __m256 nan = _mm256_cmp_ps(t, t, _CMP_UNORD_Q);
    t = _mm256_blendv_ps(_mm256_min_ps(_mm256_max_ps(t, fzero), hi), _mm256_cvtepi32_ps(z), nan);
    const __m256i code = _mm256_cvttps_epi32(t);
    // dequantize_int: float(code - zero) * scale, widened.
    const __m512d qd = _mm512_maskz_cvtps_pd(0xFF, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(code, z)), s));
    const double* urow = U + i * ldu;
    const __m512d e = _mm512_div_pd(_mm512_sub_pd(x, qd), _mm512_set1_pd(urow[i]));
    alignas(64) double ev[L];
    alignas(32) int32_t cv[L];
    _mm512_store_pd(ev, e);
    _mm256_store_si256(reinterpret_cast<__m256i*>(cv), code);
    for (int k = 0; k < rows.n; ++k) {
      rows.q[k][perm[i]] = static_cast<uint8_t>(cv[k]);
      rows.err[k][i - i1] = ev[k];
    }
    // w - e u for the block's later columns: the product, then the sum (as mul_add_unfused(-e, u, w)).
    const __m512d ne = _mm512_sub_pd(_mm512_setzero_pd(), e);
    for (int64_t j = i + 1; j < i2; ++j) {
      double* col = tile + (j - i1) * L;
      _mm512_storeu_pd(col, _mm512_add_pd(_mm512_mul_pd(ne, _mm512_set1_pd(urow[j])), _mm512_loadu_pd(col)));
    }
  }
  scatter<L>(rows, i1, i2, tile);
}

__attribute__((target("avx2,fma"))) void rows_avx2(const GptqRows& rows, const double* U, int64_t ldu, int64_t i1,
                                                   int64_t i2, const int64_t* perm, int64_t gs, int32_t qmax) {
  constexpr int L = 4;
  const int64_t count = i2 - i1;
  thread_local std::vector<double> tile_buf;
  tile_buf.resize(static_cast<size_t>(count * L));
  double* tile = tile_buf.data();
  gather<L>(rows, i1, i2, tile);
  alignas(16) float sc[L];
  alignas(16) int32_t zr[L];
  if (!rows.per_group) params<L>(rows, 0, sc, zr);
  const __m128 hi = _mm_set1_ps(static_cast<float>(qmax)), fzero = _mm_setzero_ps();
  for (int64_t i = i1; i < i2; ++i) {
    if (rows.per_group) params<L>(rows, perm[i] / gs, sc, zr);
    const __m128 s = _mm_load_ps(sc);
    const __m128i z = _mm_load_si128(reinterpret_cast<const __m128i*>(zr));
    const __m256d x = _mm256_loadu_pd(tile + (i - i1) * L);
    __m128 t = _mm_add_ps(_mm_round_ps(_mm_div_ps(_mm256_cvtpd_ps(x), s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                          _mm_cvtepi32_ps(z));
    const __m128 nan = _mm_cmpunord_ps(t, t);
    t = _mm_blendv_ps(_mm_min_ps(_mm_max_ps(t, fzero), hi), _mm_cvtepi32_ps(z), nan);
    const __m128i code = _mm_cvttps_epi32(t);
    const __m256d qd = _mm256_cvtps_pd(_mm_mul_ps(_mm_cvtepi32_ps(_mm_sub_epi32(code, z)), s));
    const double* urow = U + i * ldu;
    const __m256d e = _mm256_div_pd(_mm256_sub_pd(x, qd), _mm256_set1_pd(urow[i]));
    alignas(32) double ev[L];
    alignas(16) int32_t cv[L];
    _mm256_store_pd(ev, e);
    _mm_store_si128(reinterpret_cast<__m128i*>(cv), code);
    for (int k = 0; k < rows.n; ++k) {
      rows.q[k][perm[i]] = static_cast<uint8_t>(cv[k]);
      rows.err[k][i - i1] = ev[k];
    }
    const __m256d ne = _mm256_sub_pd(_mm256_setzero_pd(), e);
    for (int64_t j = i + 1; j < i2; ++j) {
      double* col = tile + (j - i1) * L;
      _mm256_storeu_pd(col, _mm256_add_pd(_mm256_mul_pd(ne, _mm256_set1_pd(urow[j])), _mm256_loadu_pd(col)));
    }
  }
  scatter<L>(rows, i1, i2, tile);
}

}  // namespace

int gptq_rows_width(SimdLevel level) {
  if (level >= SimdLevel::Avx512) return 8;
  if (level == SimdLevel::Avx2) return 4;
  return 0;
}

void gptq_rows_block(const GptqRows& rows, const double* U, int64_t ldu, int64_t i1, int64_t i2, const int64_t* perm,
                     int64_t gs, int32_t qmax, SimdLevel level) {
  if (level >= SimdLevel::Avx512) return rows_avx512(rows, U, ldu, i1, i2, perm, gs, qmax);
  if (level == SimdLevel::Avx2) return rows_avx2(rows, U, ldu, i1, i2, perm, gs, qmax);
  throw Error(ErrorKind::Internal, "gptq_rows_block: no vector rows at the scalar level");
}

}  // namespace qf
