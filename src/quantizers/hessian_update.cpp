// No FMA contraction anywhere in this file (see hessian_update.h): the SIMD
// kernels must round every product and every sum as the scalar loop does.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

#include "quantizers/hessian_update.h"

#include <immintrin.h>

#include <algorithm>

#define QF_HESS_AVX2 __attribute__((target("avx2")))
#define QF_HESS_AVX512 __attribute__((target("avx512f,avx2")))

namespace qf {

namespace {

// One element: the same sum in the same order as every kernel's lanes.
inline void update_element(double* H, const double* X, int64_t m, int64_t n, double keep, double scale, int64_t i,
                           int64_t j) {
  double acc = 0;
  for (int64_t r = 0; r < m; ++r) acc += X[r * n + i] * X[r * n + j];
  H[i * n + j] = keep * H[i * n + j] + scale * acc;
}

// R rows (i .. i+R-1) by V vectors of 4 columns from j.
template <int R, int V>
QF_HESS_AVX2 void tile_avx2(double* H, const double* X, int64_t m, int64_t n, double keep, double scale, int64_t i,
                            int64_t j) {
  __m256d acc[R][V];
  for (int a = 0; a < R; ++a)
    for (int v = 0; v < V; ++v) acc[a][v] = _mm256_setzero_pd();
  for (int64_t r = 0; r < m; ++r) {
    const double* xr = X + r * n;
    __m256d b[V];
    for (int v = 0; v < V; ++v) b[v] = _mm256_loadu_pd(xr + j + 4 * v);
    for (int a = 0; a < R; ++a) {
      const __m256d x = _mm256_set1_pd(xr[i + a]);
      for (int v = 0; v < V; ++v) acc[a][v] = _mm256_add_pd(acc[a][v], _mm256_mul_pd(x, b[v]));
    }
  }
  const __m256d k = _mm256_set1_pd(keep), s = _mm256_set1_pd(scale);
  for (int a = 0; a < R; ++a)
    for (int v = 0; v < V; ++v) {
      double* h = H + (i + a) * n + j + 4 * v;
      _mm256_storeu_pd(h, _mm256_add_pd(_mm256_mul_pd(k, _mm256_loadu_pd(h)), _mm256_mul_pd(s, acc[a][v])));
    }
}

template <int R, int V>
QF_HESS_AVX512 void tile_avx512(double* H, const double* X, int64_t m, int64_t n, double keep, double scale, int64_t i,
                                int64_t j) {
  __m512d acc[R][V];
  for (int a = 0; a < R; ++a)
    for (int v = 0; v < V; ++v) acc[a][v] = _mm512_setzero_pd();
  for (int64_t r = 0; r < m; ++r) {
    const double* xr = X + r * n;
    __m512d b[V];
    for (int v = 0; v < V; ++v) b[v] = _mm512_loadu_pd(xr + j + 8 * v);
    for (int a = 0; a < R; ++a) {
      const __m512d x = _mm512_set1_pd(xr[i + a]);
      for (int v = 0; v < V; ++v) acc[a][v] = _mm512_add_pd(acc[a][v], _mm512_mul_pd(x, b[v]));
    }
  }
  const __m512d k = _mm512_set1_pd(keep), s = _mm512_set1_pd(scale);
  for (int a = 0; a < R; ++a)
    for (int v = 0; v < V; ++v) {
      double* h = H + (i + a) * n + j + 8 * v;
      _mm512_storeu_pd(h, _mm512_add_pd(_mm512_mul_pd(k, _mm512_loadu_pd(h)), _mm512_mul_pd(s, acc[a][v])));
    }
}

// Rows i .. i+R-1 from column i to n: wide tiles of `lanes` columns, one
// narrower tile of lanes / 2, the last columns one element at a time.
template <int R, int Lanes, void (*Wide)(double*, const double*, int64_t, int64_t, double, double, int64_t, int64_t),
          void (*Narrow)(double*, const double*, int64_t, int64_t, double, double, int64_t, int64_t)>
void row_block(double* H, const double* X, int64_t m, int64_t n, double keep, double scale, int64_t i) {
  int64_t j = i;
  for (; j + 2 * Lanes <= n; j += 2 * Lanes) Wide(H, X, m, n, keep, scale, i, j);
  if (j + Lanes <= n) {
    Narrow(H, X, m, n, keep, scale, i, j);
    j += Lanes;
  }
  for (int a = 0; a < R; ++a)
    for (int64_t c = j; c < n; ++c) update_element(H, X, m, n, keep, scale, i + a, c);
}

template <int R>
void row_block_avx2(double* H, const double* X, int64_t m, int64_t n, double keep, double scale, int64_t i) {
  row_block<R, 4, tile_avx2<R, 2>, tile_avx2<R, 1>>(H, X, m, n, keep, scale, i);
}

template <int R>
void row_block_avx512(double* H, const double* X, int64_t m, int64_t n, double keep, double scale, int64_t i) {
  row_block<R, 8, tile_avx512<R, 2>, tile_avx512<R, 1>>(H, X, m, n, keep, scale, i);
}

}  // namespace

void hessian_update_rows_ref(double* H, const double* X, int64_t m, int64_t n, double keep, double scale, int64_t i0,
                             int64_t i1) {
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t j = i; j < n; ++j) update_element(H, X, m, n, keep, scale, i, j);
}

void hessian_update_rows(double* H, const double* X, int64_t m, int64_t n, double keep, double scale, int64_t i0,
                         int64_t i1, SimdLevel level) {
  if (level == SimdLevel::Scalar) return hessian_update_rows_ref(H, X, m, n, keep, scale, i0, i1);
  const bool wide = level >= SimdLevel::Avx512;
  int64_t i = i0;
  for (; i + 4 <= i1; i += 4)
    wide ? row_block_avx512<4>(H, X, m, n, keep, scale, i) : row_block_avx2<4>(H, X, m, n, keep, scale, i);
  for (; i < i1; ++i)
    wide ? row_block_avx512<1>(H, X, m, n, keep, scale, i) : row_block_avx2<1>(H, X, m, n, keep, scale, i);
}

void mirror_upper(double* H, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j) H[j * n + i] = H[i * n + j];
}

}  // namespace qf
