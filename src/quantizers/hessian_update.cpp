// No FMA contraction anywhere in this file (see hessian_update.h): the f32
// chains are explicit fused multiply-adds, and the double update
// keep * h + scale * s must round its two products and its sum as the scalar
// loop does.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

#include "quantizers/hessian_update.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#define QF_HESS_AVX2 __attribute__((target("avx2,fma")))
#define QF_HESS_AVX512 __attribute__((target("avx512f,avx2,fma")))

namespace qf {

namespace {

// H's element += the chunk: the double update every level rounds the same way.
inline double updated(double h, double keep, double scale, float s) {
  const double a = keep * h;
  const double b = scale * static_cast<double>(s);
  return a + b;
}

// One element: the f32 chain every kernel's lane forms.
inline void update_element(double* H, const float* X, int64_t m, int64_t n, int64_t ldx, double keep, double scale,
                           int64_t i, int64_t j) {
  float acc = 0.0f;
  for (int64_t r = 0; r < m; ++r) acc = std::fmaf(X[r * ldx + i], X[r * ldx + j], acc);
  H[i * n + j] = updated(H[i * n + j], keep, scale, acc);
}

// R rows (i .. i+R-1) by V vectors of 8 columns from j (4 x 3: 12 accumulators,
// three row vectors and a broadcast fill the 16 registers); `cols` < 8 V:
// only the first `cols` columns exist (masked loads and stores).
template <int R, int V>
QF_HESS_AVX2 void tile_avx2(double* H, const float* X, int64_t m, int64_t n, int64_t ldx, double keep, double scale,
                            int64_t i, int64_t j, int cols) {
  __m256i lmask[V];
  __m256i dmask[V][2];
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) {
    alignas(32) int32_t l[8];
    alignas(32) int64_t d[8];
    for (int e = 0; e < 8; ++e) l[e] = 8 * v + e < cols ? -1 : 0, d[e] = 8 * v + e < cols ? -1 : 0;
    lmask[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(l));
    dmask[v][0] = _mm256_load_si256(reinterpret_cast<const __m256i*>(d));
    dmask[v][1] = _mm256_load_si256(reinterpret_cast<const __m256i*>(d + 4));
  }
  const bool full = cols >= 8 * V;
  __m256 acc[R][V];
#pragma GCC unroll 8
  for (int a = 0; a < R; ++a)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[a][v] = _mm256_setzero_ps();
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = X + r * ldx;
    __m256 b[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) b[v] = full ? _mm256_loadu_ps(xr + j + 8 * v) : _mm256_maskload_ps(xr + j + 8 * v, lmask[v]);
#pragma GCC unroll 8
    for (int a = 0; a < R; ++a) {
      const __m256 x = _mm256_broadcast_ss(xr + i + a);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[a][v] = _mm256_fmadd_ps(x, b[v], acc[a][v]);
    }
  }
  const __m256d k = _mm256_set1_pd(keep), s = _mm256_set1_pd(scale);
#pragma GCC unroll 8
  for (int a = 0; a < R; ++a)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      double* h = H + (i + a) * n + j + 8 * v;
      const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(acc[a][v]));
      const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(acc[a][v], 1));
      if (full) {
        _mm256_storeu_pd(h, _mm256_add_pd(_mm256_mul_pd(k, _mm256_loadu_pd(h)), _mm256_mul_pd(s, lo)));
        _mm256_storeu_pd(h + 4, _mm256_add_pd(_mm256_mul_pd(k, _mm256_loadu_pd(h + 4)), _mm256_mul_pd(s, hi)));
      } else {
        const __m256d h0 = _mm256_maskload_pd(h, dmask[v][0]), h1 = _mm256_maskload_pd(h + 4, dmask[v][1]);
        _mm256_maskstore_pd(h, dmask[v][0], _mm256_add_pd(_mm256_mul_pd(k, h0), _mm256_mul_pd(s, lo)));
        _mm256_maskstore_pd(h + 4, dmask[v][1], _mm256_add_pd(_mm256_mul_pd(k, h1), _mm256_mul_pd(s, hi)));
      }
    }
}

// R rows by V vectors of 16 columns from j (6 x 4: 24 accumulators of 32
// registers); `cols` < 16 V: only the first `cols` columns exist (masked).
template <int R, int V>
QF_HESS_AVX512 void tile_avx512(double* H, const float* X, int64_t m, int64_t n, int64_t ldx, double keep,
                                double scale, int64_t i, int64_t j, int cols) {
  __mmask16 lmask[V];
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) {
    const int valid = cols - 16 * v < 0 ? 0 : cols - 16 * v > 16 ? 16 : cols - 16 * v;
    lmask[v] = static_cast<__mmask16>((1u << valid) - 1u);
  }
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (int a = 0; a < R; ++a)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[a][v] = _mm512_setzero_ps();
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = X + r * ldx;
    __m512 b[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) b[v] = _mm512_maskz_loadu_ps(lmask[v], xr + j + 16 * v);
#pragma GCC unroll 8
    for (int a = 0; a < R; ++a) {
      const __m512 x = _mm512_set1_ps(xr[i + a]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[a][v] = _mm512_fmadd_ps(x, b[v], acc[a][v]);
    }
  }
  const __m512d k = _mm512_set1_pd(keep), s = _mm512_set1_pd(scale);
#pragma GCC unroll 8
  for (int a = 0; a < R; ++a)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      double* h = H + (i + a) * n + j + 16 * v;
      // The halves go through memory: GCC 12's intrinsics for the register
      // forms warn of an uninitialized operand (its bug 105593).
      alignas(64) float sums[16];
      _mm512_store_ps(sums, acc[a][v]);
      const __m512d lo = _mm512_maskz_cvtps_pd(0xFF, _mm256_load_ps(sums));
      const __m512d hi = _mm512_maskz_cvtps_pd(0xFF, _mm256_load_ps(sums + 8));
      const __mmask8 m0 = static_cast<__mmask8>(lmask[v] & 0xFF), m1 = static_cast<__mmask8>(lmask[v] >> 8);
      _mm512_mask_storeu_pd(h, m0, _mm512_add_pd(_mm512_mul_pd(k, _mm512_maskz_loadu_pd(m0, h)), _mm512_mul_pd(s, lo)));
      _mm512_mask_storeu_pd(h + 8, m1,
                            _mm512_add_pd(_mm512_mul_pd(k, _mm512_maskz_loadu_pd(m1, h + 8)), _mm512_mul_pd(s, hi)));
    }
}

using TileFn = void (*)(double*, const float*, int64_t, int64_t, int64_t, double, double, int64_t, int64_t, int);

// Rows i .. i+R-1 from the multiple of Lanes at or below i to n: wide tiles
// of WideV vectors, then single vectors, the last one masked. Columns left
// of a row's diagonal in the first tile are written too (allowed: see the
// header), so no element is left to a scalar loop.
template <int R, int Lanes, int WideV, TileFn Wide, TileFn Narrow>
void row_block(double* H, const float* X, int64_t m, int64_t n, int64_t ldx, double keep, double scale, int64_t i) {
  int64_t j = i / Lanes * Lanes;
  for (; j + WideV * Lanes <= n; j += WideV * Lanes) Wide(H, X, m, n, ldx, keep, scale, i, j, WideV * Lanes);
  for (; j < n; j += Lanes) Narrow(H, X, m, n, ldx, keep, scale, i, j, static_cast<int>(std::min<int64_t>(Lanes, n - j)));
}

template <int R>
void row_block_avx2(double* H, const float* X, int64_t m, int64_t n, int64_t ldx, double keep, double scale, int64_t i) {
  row_block<R, 8, 3, tile_avx2<R, 3>, tile_avx2<R, 1>>(H, X, m, n, ldx, keep, scale, i);
}

template <int R>
void row_block_avx512(double* H, const float* X, int64_t m, int64_t n, int64_t ldx, double keep, double scale,
                      int64_t i) {
  row_block<R, 16, 4, tile_avx512<R, 4>, tile_avx512<R, 1>>(H, X, m, n, ldx, keep, scale, i);
}

}  // namespace

void hessian_update_rows_ref(double* H, const float* X, int64_t m, int64_t n, int64_t ldx, double keep, double scale,
                             int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t j = i; j < n; ++j) update_element(H, X, m, n, ldx, keep, scale, i, j);
}

void hessian_update_rows(double* H, const float* X, int64_t m, int64_t n, int64_t ldx, double keep, double scale,
                         int64_t i0, int64_t i1, SimdLevel level) {
  if (level == SimdLevel::Scalar) return hessian_update_rows_ref(H, X, m, n, ldx, keep, scale, i0, i1);
  int64_t i = i0;
  if (level >= SimdLevel::Avx512) {
    for (; i + 6 <= i1; i += 6) row_block_avx512<6>(H, X, m, n, ldx, keep, scale, i);
    for (; i < i1; ++i) row_block_avx512<1>(H, X, m, n, ldx, keep, scale, i);
    return;
  }
  for (; i + 4 <= i1; i += 4) row_block_avx2<4>(H, X, m, n, ldx, keep, scale, i);
  for (; i < i1; ++i) row_block_avx2<1>(H, X, m, n, ldx, keep, scale, i);
}

void mirror_upper(double* H, int64_t n) {
  // In square blocks, so that the transposed reads stay in cache.
  constexpr int64_t kB = 32;
  for (int64_t i0 = 0; i0 < n; i0 += kB)
    for (int64_t j0 = i0; j0 < n; j0 += kB)
      for (int64_t i = i0; i < std::min(n, i0 + kB); ++i)
        for (int64_t j = std::max(j0, i + 1); j < std::min(n, j0 + kB); ++j) H[j * n + i] = H[i * n + j];
}

}  // namespace qf
