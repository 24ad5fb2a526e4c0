// The register blocks of the dot and GEMM kernels, over any row kind of
// row_kinds.h: 1 row against 1 token (dot1_*), T tokens x 4 rows
// (gemm_tx4_avx512), T tokens x R rows (gemm_txr_avx2), and the loops that tile a block of tokens
// and rows with them (gemm_tile, dot_rows_kind). Every block forms each sum
// in one order per level and row kind, so the number of tokens never changes
// a result: at AVX-512 one 16-lane accumulator per row and token (element i in
// lane i % 16), then a fixed horizontal sum; at AVX2 Row::kAvx2Accs 8-lane
// accumulators (element i of the row's whole chunks of 8 in accumulator
// (i / 8) % kAvx2Accs, lane i % 8), added in order, then the same horizontal
// sum, then the elements past the last whole chunk by fused multiply-adds. A kind with one AVX2
// accumulator gives the floats of the f32 kind on its decoded rows; f16 rows
// take two (decode reads them at the speed of one dependent chain of
// multiply-adds per sum otherwise), which the AVX2 GEMM blocks follow by
// running one pass per accumulator over each span of a row.
//
// Internal to the runtime's CPU kernels (kernels.cpp instantiates them).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/simd.h"
#include "runtime/cpu/kernels.h"

namespace qf::rt::blocks {

// No FMA inside: target "avx2" lets it inline into the AVX-512 functions too.
__attribute__((target("avx2"))) inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

__attribute__((target("avx512f"))) inline float hsum512(__m512 v) {
  __m256 lo = _mm512_castps512_ps256(v);
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return hsum256(_mm256_add_ps(lo, hi));
}

// The AVX2 accumulators of one sum added in order (a0 + a1 + ...), then the
// fixed horizontal sum.
template <int A>
__attribute__((target("avx2"))) inline float hsum_accs256(const __m256* a) {
  __m256 s = a[0];
  for (int j = 1; j < A; ++j) s = _mm256_add_ps(s, a[j]);
  return hsum256(s);
}

// How far ahead the one-row dots of 16-bit rows (decode) prefetch the
// weights: one 64-byte line per 32 elements, 4 KiB ahead.
constexpr int64_t kPrefetchAheadBytes = 4096;

// One row against one token, in the order every block uses: chunk c of 8
// elements into accumulator c % Row::kAvx2Accs, the accumulators summed
// (hsum_accs256), then the elements past a multiple of 8 by explicit fused
// multiply-adds. kPrefetch (16-bit rows) prefetches the row ahead, which
// changes no float.
template <typename Row, bool kPrefetch = false>
__attribute__((target("avx2,fma,f16c"))) float dot1_avx2(const float* x, const typename Row::T* w, int64_t n) {
  constexpr int A = Row::kAvx2Accs;
  static_assert(!kPrefetch || sizeof(typename Row::T) == 2, "one 64-byte line per 32 elements");
  static_assert(32 % (8 * A) == 0, "32 elements hold whole rounds of the accumulators");
  __m256 s[A];
  for (auto& a : s) a = _mm256_setzero_ps();
  int64_t i = 0;
  if constexpr (kPrefetch) {
    for (; i + 32 <= n; i += 32) {
      _mm_prefetch(reinterpret_cast<const char*>(w + i) + kPrefetchAheadBytes, _MM_HINT_T0);
      for (int64_t u = i; u < i + 32; u += 8 * A)
        for (int j = 0; j < A; ++j)
          s[j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + u + 8 * j), Row::load8(w, u + 8 * j), s[j]);
    }
  }
  for (; i + 8 * A <= n; i += 8 * A)
    for (int j = 0; j < A; ++j) s[j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * j), Row::load8(w, i + 8 * j), s[j]);
  for (int j = 0; i + 8 <= n; i += 8, ++j) s[j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), Row::load8(w, i), s[j]);
  float out = hsum_accs256<A>(s);
  for (; i < n; ++i) out = std::fma(x[i], Row::at(w, i), out);
  return out;
}

// The same with 16 lanes and a masked last step.
template <typename Row, bool kPrefetch = false>
__attribute__((target("avx512f,avx512bw,avx512vl"))) float dot1_avx512(const float* x, const typename Row::T* w,
                                                                      int64_t n) {
  static_assert(!kPrefetch || sizeof(typename Row::T) == 2, "one 64-byte line per 32 elements");
  __m512 s = _mm512_setzero_ps();
  int64_t i = 0;
  if constexpr (kPrefetch) {
    for (; i + 32 <= n; i += 32) {
      _mm_prefetch(reinterpret_cast<const char*>(w + i) + kPrefetchAheadBytes, _MM_HINT_T0);
      s = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), Row::load16(w, i), s);
      s = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), Row::load16(w, i + 16), s);
    }
  }
  for (; i + 16 <= n; i += 16) s = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), Row::load16(w, i), s);
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), Row::load16(m, w, i), s);
  }
  return hsum512(s);
}

// T tokens x 4 rows (T = 6: 24 accumulators, 10 loads per 24 multiply-adds;
// T = 4: 16 and 8 per 16), each sum as dot1_avx512 forms it.
template <int T, typename Row>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void gemm_tx4_avx512(const float* x, int64_t xs,
                                                                         const typename Row::T* w, int64_t k,
                                                                         float* y, int64_t ys) {
  const typename Row::T* wr[4] = {w, w + Row::stride(k), w + 2 * Row::stride(k), w + 3 * Row::stride(k)};
  __m512 acc[T][4];
  for (auto& r : acc)
    for (auto& a : r) a = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    __m512 wv[4];
    for (int r = 0; r < 4; ++r) wv[r] = Row::load16(wr[r], i);
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_loadu_ps(x + t * xs + i);
      for (int r = 0; r < 4; ++r) acc[t][r] = _mm512_fmadd_ps(xv, wv[r], acc[t][r]);
    }
  }
  if (i < k) {
    const __mmask16 m = static_cast<__mmask16>((1u << (k - i)) - 1);
    __m512 wv[4];
    for (int r = 0; r < 4; ++r) wv[r] = Row::load16(m, wr[r], i);
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + t * xs + i);
      for (int r = 0; r < 4; ++r) acc[t][r] = _mm512_fmadd_ps(xv, wv[r], acc[t][r]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < 4; ++r) y[t * ys + r] = hsum512(acc[t][r]);
}

// T tokens x R rows at AVX2 (4 x 3: 12 accumulators, 3 row registers and one
// token register, all 16 ymm registers, 7 loads per 12 multiply-adds; 2 x 4
// for the tokens past a multiple of 4), each sum as dot1_avx2 forms it, in
// two steps: gemm_txr_avx2_span adds the whole chunks of 8 elements in
// [s0, s1) (s0 a multiple of 8 A, s1 of 8) to accumulators kept in memory
// (acc[j][t][r], kAvx2Accs A of them per sum), and gemm_txr_avx2_finish
// sums them and adds the tail past the last whole chunk. With A > 1 the
// registers hold one accumulator per sum at a time: each piece of kSpan
// elements (a multiple of 8 A, small enough that the block's rows and tokens
// over it stay in L1) is read in A passes, pass j over the chunks c with
// c % A == j. Every chunk goes to the same accumulator in the same order
// however [0, k) is split into spans, so the floats never depend on it.
template <int T, int R, typename Row>
__attribute__((target("avx2,fma,f16c"))) void gemm_txr_avx2_span(const float* x, int64_t xs,
                                                                 const typename Row::T* w, int64_t stride,
                                                                 int64_t s0, int64_t s1, __m256* acc) {
  constexpr int A = Row::kAvx2Accs;
  constexpr int64_t kSpan = 512;
  static_assert(kSpan % (8 * A) == 0, "a span holds whole rounds of the accumulators");
  const typename Row::T* wr[R];
  for (int r = 0; r < R; ++r) wr[r] = w + r * stride;
  for (int64_t p0 = s0; p0 < s1; p0 += kSpan) {
    const int64_t p1 = std::min(s1, p0 + kSpan);
    for (int j = 0; j < A; ++j) {
      __m256* aj = acc + j * T * R;
      __m256 a[T][R];
      for (int t = 0; t < T; ++t)
        for (int r = 0; r < R; ++r) a[t][r] = aj[t * R + r];
      for (int64_t i = p0 + 8 * j; i < p1; i += 8 * A) {
        __m256 wv[R];
        for (int r = 0; r < R; ++r) wv[r] = Row::load8(wr[r], i);
        for (int t = 0; t < T; ++t) {
          const __m256 xv = _mm256_loadu_ps(x + t * xs + i);
          for (int r = 0; r < R; ++r) a[t][r] = _mm256_fmadd_ps(xv, wv[r], a[t][r]);
        }
      }
      for (int t = 0; t < T; ++t)
        for (int r = 0; r < R; ++r) aj[t * R + r] = a[t][r];
    }
  }
}

template <int T, int R, typename Row>
__attribute__((target("avx2,fma,f16c"))) void gemm_txr_avx2_finish(const float* x, int64_t xs,
                                                                   const typename Row::T* w, int64_t k,
                                                                   const __m256* acc, float* y, int64_t ys) {
  constexpr int A = Row::kAvx2Accs;
  const int64_t whole = k / 8 * 8;
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) {
      __m256 sums[A];
      for (int j = 0; j < A; ++j) sums[j] = acc[(j * T + t) * R + r];
      float s = hsum_accs256<A>(sums);
      const typename Row::T* wr = w + r * Row::stride(k);
      for (int64_t i = whole; i < k; ++i) s = std::fma(x[t * xs + i], Row::at(wr, i), s);  // as dot1_avx2's tail
      y[t * ys + r] = s;
    }
}

// The whole row at once: one span over [0, k).
template <int T, int R, typename Row>
__attribute__((target("avx2,fma,f16c"))) void gemm_txr_avx2(const float* x, int64_t xs, const typename Row::T* w,
                                                            int64_t k, float* y, int64_t ys) {
  __m256 acc[Row::kAvx2Accs * T * R];
  for (auto& a : acc) a = _mm256_setzero_ps();
  gemm_txr_avx2_span<T, R, Row>(x, xs, w, Row::stride(k), 0, k / 8 * 8, acc);
  gemm_txr_avx2_finish<T, R, Row>(x, xs, w, k, acc, y, ys);
}

// `rows` rows one after the other (one stream through memory, which decode
// reads faster than several rows interleaved), each in the blocks' order;
// 16-bit rows (f16) prefetched ahead.
template <typename Row>
__attribute__((target("avx2,fma,f16c"))) void dot_rows_avx2(const float* x, const typename Row::T* w, int64_t n,
                                                            int64_t rows, float* y) {
  constexpr bool kPrefetch = sizeof(typename Row::T) == 2;
  for (int64_t r = 0; r < rows; ++r) y[r] = dot1_avx2<Row, kPrefetch>(x, w + r * Row::stride(n), n);
}

template <typename Row>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void dot_rows_avx512(const float* x, const typename Row::T* w,
                                                                         int64_t n, int64_t rows, float* y) {
  constexpr bool kPrefetch = sizeof(typename Row::T) == 2;
  for (int64_t r = 0; r < rows; ++r) y[r] = dot1_avx512<Row, kPrefetch>(x, w + r * Row::stride(n), n);
}

// dot_rows over a row kind at the current level; at the scalar level each
// row decoded to f32 by `decode` (f32 rows used in place) and dotted by
// dot_f32.
template <typename Row>
void dot_rows_kind(const float* x, const typename Row::T* w, int64_t n, int64_t rows, float* y,
                   void (*decode)(const typename Row::T*, float*, int64_t)) {
  const SimdLevel level = simd_level();
  if (level >= SimdLevel::Avx512) return dot_rows_avx512<Row>(x, w, n, rows, y);
  if (level == SimdLevel::Avx2) return dot_rows_avx2<Row>(x, w, n, rows, y);
  if constexpr (std::is_same_v<typename Row::T, float>) {
    for (int64_t r = 0; r < rows; ++r) y[r] = dot_f32(x, w + r * n, n);
  } else {
    thread_local std::vector<float> row;
    row.resize(static_cast<size_t>(n));
    for (int64_t r = 0; r < rows; ++r) {
      decode(w + r * Row::stride(n), row.data(), n);
      y[r] = dot_f32(x, row.data(), n);
    }
  }
}

// At AVX2, rows longer than kTileKSpan elements: each block of 4 tokens runs
// across all the tile's 3-row blocks (and the 1- or 2-row block past them)
// one span of kTileKSpan elements at a time, each block's accumulators kept
// in memory between spans, so the 4 tokens' span (16 KB of f32) stays in L1
// while the rows stream past it, next to the blocks' accumulators (17 KB for
// a 64-row f16 tile: 22 blocks x 24 x 32 bytes); over whole rows the 4
// tokens (32 KB for 2048 elements, 88 KB for 5632) are read from L2 again
// for every block.
// Returns the tokens done (the multiple of 4); the sums are the blocks'.
constexpr int64_t kTileKSpan = 1024;

template <typename Row>
__attribute__((target("avx2,fma,f16c"))) int64_t gemm_tile_avx2_spans(const float* x, int64_t tokens, int64_t xs,
                                                                      const typename Row::T* w, int64_t rows,
                                                                      int64_t k, float* y, int64_t ys) {
  using W = typename Row::T;
  using Span = void (*)(const float*, int64_t, const W*, int64_t, int64_t, int64_t, __m256*);
  using Finish = void (*)(const float*, int64_t, const W*, int64_t, const __m256*, float*, int64_t);
  static constexpr Span spans[] = {nullptr, gemm_txr_avx2_span<4, 1, Row>, gemm_txr_avx2_span<4, 2, Row>,
                                   gemm_txr_avx2_span<4, 3, Row>};
  static constexpr Finish finishes[] = {nullptr, gemm_txr_avx2_finish<4, 1, Row>, gemm_txr_avx2_finish<4, 2, Row>,
                                        gemm_txr_avx2_finish<4, 3, Row>};
  static_assert(kTileKSpan % (8 * Row::kAvx2Accs) == 0, "every span must start at a chunk of accumulator 0");
  constexpr int64_t kPerBlock = Row::kAvx2Accs * 4 * 3;
  const int64_t stride = Row::stride(k), whole = k / 8 * 8, blocks = (rows + 2) / 3;
  thread_local std::vector<float> accs;  // 8 floats per accumulator, from a 32-byte boundary
  accs.resize(static_cast<size_t>(blocks * kPerBlock * 8 + 8));
  const auto at = reinterpret_cast<uintptr_t>(accs.data());
  __m256* acc = reinterpret_cast<__m256*>((at + 31) & ~static_cast<uintptr_t>(31));
  int64_t t = 0;
  for (; t + 4 <= tokens; t += 4) {
    for (int64_t i = 0; i < blocks * kPerBlock; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t s0 = 0; s0 < whole; s0 += kTileKSpan) {
      const int64_t s1 = std::min(whole, s0 + kTileKSpan);
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t r = 3 * b;
        spans[std::min<int64_t>(3, rows - r)](x + t * xs, xs, w + r * stride, stride, s0, s1,
                                              acc + b * kPerBlock);
      }
    }
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t r = 3 * b;
      finishes[std::min<int64_t>(3, rows - r)](x + t * xs, xs, w + r * stride, k, acc + b * kPerBlock,
                                               y + t * ys + r, ys);
    }
  }
  return t;
}

// Blocks of 6 then 4 tokens x 4 rows (AVX-512), or 4 tokens x 3 rows then 2
// tokens x 4 rows (AVX2), while they fit; the rows past the blocks' multiple
// through a block as many rows wide at AVX2 and through dot_rows
// (dot_rows_kind) at AVX-512, and the tokens past the blocks through
// dot_rows, all forming their sums in the same orders. At the
// scalar level rows that are not f32 are decoded once (`decode`) into an f32
// tile and every token is dotted against it: the floats of dot_rows, without
// decoding each row once per token.
template <typename Row>
void gemm_tile(const float* x, int64_t tokens, int64_t xs, const typename Row::T* w, int64_t rows, int64_t k,
               float* y, int64_t ys, void (*dot_rows)(const float*, const typename Row::T*, int64_t, int64_t, float*),
               void (*decode)(const typename Row::T*, float*, int64_t)) {
  using W = typename Row::T;
  using Block = void (*)(const float*, int64_t, const W*, int64_t, float*, int64_t);
  const int64_t stride = Row::stride(k);
  const SimdLevel level = simd_level();
  if constexpr (!std::is_same_v<W, float>) {
    if (level == SimdLevel::Scalar && tokens > 1) {
      thread_local std::vector<float> tile;
      tile.resize(static_cast<size_t>(rows * k));
      for (int64_t r = 0; r < rows; ++r) decode(w + r * stride, tile.data() + r * k, k);
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t r = 0; r < rows; ++r) y[t * ys + r] = dot_f32(x + t * xs, tile.data() + r * k, k);
      return;
    }
  }
  int64_t t = 0;
  // Blocks of tb tokens x rb rows; the rows past a multiple of rb through
  // `rest` (a block of tb tokens x rows % rb rows, or null: per-token rows).
  auto run = [&](int64_t tb, int64_t rb, Block kernel, const Block* rest) {
    for (; t + tb <= tokens; t += tb) {
      int64_t r = 0;
      for (; r + rb <= rows; r += rb) kernel(x + t * xs, xs, w + r * stride, k, y + t * ys + r, ys);
      if (r == rows) continue;
      if (rest)
        rest[rows - r](x + t * xs, xs, w + r * stride, k, y + t * ys + r, ys);
      else
        for (int64_t u = t; u < t + tb; ++u) dot_rows(x + u * xs, w + r * stride, k, rows - r, y + u * ys + r);
    }
  };
  if (level >= SimdLevel::Avx512) {
    run(6, 4, gemm_tx4_avx512<6, Row>, nullptr);
    run(4, 4, gemm_tx4_avx512<4, Row>, nullptr);
  } else if (level == SimdLevel::Avx2) {
    // At AVX2 the rows past the blocks (the 64th row of a 64-row tile) take
    // a narrower block too: per token they would be one chain of dependent
    // multiply-adds (two for f16) each.
    static constexpr Block rest4[] = {nullptr, gemm_txr_avx2<4, 1, Row>, gemm_txr_avx2<4, 2, Row>};
    static constexpr Block rest2[] = {nullptr, gemm_txr_avx2<2, 1, Row>, gemm_txr_avx2<2, 2, Row>,
                                      gemm_txr_avx2<2, 3, Row>};
    if (k / 8 * 8 > kTileKSpan) t = gemm_tile_avx2_spans<Row>(x, tokens, xs, w, rows, k, y, ys);
    run(4, 3, gemm_txr_avx2<4, 3, Row>, rest4);
    run(2, 4, gemm_txr_avx2<2, 4, Row>, rest2);
  }
  for (; t < tokens; ++t) dot_rows(x + t * xs, w, k, rows, y + t * ys);
}

}  // namespace qf::rt::blocks
