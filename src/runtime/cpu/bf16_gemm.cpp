#include "runtime/cpu/bf16_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "core/bf16.h"
#include "core/error.h"
#include "core/simd.h"

namespace qf::rt {
namespace {

// The lanes' fixed sum (the header's order).
float lane_sum(const float* a) {
  float t[8], u[4];
  for (int i = 0; i < 8; ++i) t[i] = a[i] + a[i + 8];
  for (int i = 0; i < 4; ++i) u[i] = t[i] + t[i + 4];
  return (u[0] + u[2]) + (u[1] + u[3]);
}

float bf(uint16_t v) { return hd::bf16_to_f32(v); }

// ---- AVX2: the same lanes in two 8-lane halves, products by f32 FMAs -------

// The odd (high) and even (low) bf16 of each 32-bit pair as f32.
__attribute__((target("avx2,fma"))) inline __m256 odd_of(__m256i v) {
  return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
__attribute__((target("avx2,fma"))) inline __m256 even_of(__m256i v) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

template <int T, int R>
__attribute__((target("avx2,fma"))) void tile_avx2(const uint16_t* x, const uint16_t* w, int64_t kp, float* y,
                                                   int64_t ys) {
  __m256 acc[T][R][2];
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) acc[t][r][0] = acc[t][r][1] = _mm256_setzero_ps();
  for (int64_t i = 0; i < kp; i += kBf16Chunk) {
    for (int h = 0; h < 2; ++h) {  // lanes 0..7 (elements 0..15), then lanes 8..15
      __m256 wo[R], we[R];
      for (int r = 0; r < R; ++r) {
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * kp + i + 16 * h));
        wo[r] = odd_of(wv), we[r] = even_of(wv);
      }
      for (int t = 0; t < T; ++t) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + t * kp + i + 16 * h));
        const __m256 xo = odd_of(xv), xe = even_of(xv);
        for (int r = 0; r < R; ++r) {
          acc[t][r][h] = _mm256_fmadd_ps(xo, wo[r], acc[t][r][h]);
          acc[t][r][h] = _mm256_fmadd_ps(xe, we[r], acc[t][r][h]);
        }
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) {
      alignas(32) float lanes[16];
      _mm256_store_ps(lanes, acc[t][r][0]);
      _mm256_store_ps(lanes + 8, acc[t][r][1]);
      y[t * ys + r] = lane_sum(lanes);
    }
}

// ---- AVX512-BF16: VDPBF16PS ----------------------------------------------------

template <int T, int R>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma"))) void tile_bf16(const uint16_t* x,
                                                                                      const uint16_t* w, int64_t kp,
                                                                                      float* y, int64_t ys) {
  __m512 acc[T][R];
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = _mm512_setzero_ps();
  for (int64_t i = 0; i < kp; i += kBf16Chunk) {
    __m512bh wv[R];
    for (int r = 0; r < R; ++r) wv[r] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + r * kp + i));
    for (int t = 0; t < T; ++t) {
      const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + t * kp + i));
      for (int r = 0; r < R; ++r) acc[t][r] = _mm512_dpbf16_ps(acc[t][r], xv, wv[r]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) {
      // The lanes' fixed sum in registers (lane_sum's order): halves, then
      // quarters, then (u0 + u2) + (u1 + u3). The maskz extract: GCC 12
      // warns about the plain form's undefined operand.
      const __m256 h = _mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xFF, acc[t][r], 0),
                                     _mm512_maskz_extractf32x8_ps(0xFF, acc[t][r], 1));
      __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
      q = _mm_add_ps(q, _mm_movehl_ps(q, q));
      q = _mm_add_ss(q, _mm_movehdup_ps(q));
      y[t * ys + r] = _mm_cvtss_f32(q);
    }
}

using TileFn = void (*)(const uint16_t*, const uint16_t*, int64_t, float*, int64_t);

// Tokens in blocks of T (then singles), rows in blocks of R (then singles).
template <int T, int R, TileFn Full, TileFn TokenTail, TileFn RowTail, TileFn One>
void tiled(const uint16_t* x, int64_t tokens, const uint16_t* w, int64_t rows, int64_t kp, float* y, int64_t ys) {
  int64_t r = 0;
  for (; r + R <= rows; r += R) {
    int64_t t = 0;
    for (; t + T <= tokens; t += T) Full(x + t * kp, w + r * kp, kp, y + t * ys + r, ys);
    for (; t < tokens; ++t) TokenTail(x + t * kp, w + r * kp, kp, y + t * ys + r, ys);
  }
  for (; r < rows; ++r) {
    int64_t t = 0;
    for (; t + T <= tokens; t += T) RowTail(x + t * kp, w + r * kp, kp, y + t * ys + r, ys);
    for (; t < tokens; ++t) One(x + t * kp, w + r * kp, kp, y + t * ys + r, ys);
  }
}

}  // namespace

void to_bf16_row(const float* src, int64_t k, uint16_t* dst, int64_t kp) {
  for (int64_t i = 0; i < k; ++i) {
    uint16_t b = hd::f32_to_bf16(src[i]);
    if ((b & 0x7F80u) == 0) b &= 0x8000u;  // a subnormal (or zero): signed zero
    dst[i] = b;
  }
  std::fill(dst + k, dst + kp, uint16_t{0});
}

namespace ref {

void gemm_tile_bf16(const uint16_t* x, int64_t tokens, const uint16_t* w, int64_t rows, int64_t kp, float* y,
                    int64_t ys) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      const uint16_t* xt = x + t * kp;
      const uint16_t* wr = w + r * kp;
      float a[16] = {};
      for (int64_t c = 0; c < kp; c += kBf16Chunk)
        for (int l = 0; l < 16; ++l) {
          const int64_t o = c + 2 * l + 1, e = c + 2 * l;
          a[l] = std::fma(bf(xt[o]), bf(wr[o]), a[l]);  // exact product, one rounding
          a[l] = std::fma(bf(xt[e]), bf(wr[e]), a[l]);
        }
      y[t * ys + r] = lane_sum(a);
    }
}

}  // namespace ref

void gemm_tile_bf16(const uint16_t* x, int64_t tokens, const uint16_t* w, int64_t rows, int64_t kp, float* y,
                    int64_t ys) {
  if (kp % kBf16Chunk != 0) throw Error(ErrorKind::Internal, "gemm_tile_bf16: rows must be padded to 32 elements");
  const SimdLevel level = simd_level();
  if (level >= SimdLevel::Avx512 && cpu_has_avx512_bf16())
    return tiled<6, 4, tile_bf16<6, 4>, tile_bf16<1, 4>, tile_bf16<6, 1>, tile_bf16<1, 1>>(x, tokens, w, rows, kp, y, ys);
  if (level >= SimdLevel::Avx2)
    return tiled<2, 2, tile_avx2<2, 2>, tile_avx2<1, 2>, tile_avx2<2, 1>, tile_avx2<1, 1>>(x, tokens, w, rows, kp, y, ys);
  ref::gemm_tile_bf16(x, tokens, w, rows, kp, y, ys);
}

}  // namespace qf::rt
