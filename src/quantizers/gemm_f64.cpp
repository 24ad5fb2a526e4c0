// The tiles of gemm_f64: B is packed a panel at a time into tiles of NR
// columns ([p][NR], zero beyond the last column), and a register block of MR
// rows x NR columns runs one fused multiply-add per element and step p,
// loading C before a panel and storing it after (the chain goes on where it
// stopped, so panels change no rounding).
#include "quantizers/gemm_f64.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

#define QF_GEMM_AVX2 __attribute__((target("avx2,fma")))
#define QF_GEMM_AVX512 __attribute__((target("avx512f,avx2,fma")))

namespace qf {
namespace {

constexpr int64_t kPanelRows = 96;  // rows of C per task (a multiple of every level's MR)
constexpr int64_t kKc = 128;        // steps p per packed panel

// One level's register block: MR rows, NR columns.
struct Shape {
  int mr, nr;
};
Shape shape_of(SimdLevel level) {
  if (level >= SimdLevel::Avx512) return {6, 32};
  if (level == SimdLevel::Avx2) return {4, 12};
  return {4, 8};
}

// B[p0 + p][j0 + c] for p < kc, c < nr, 0 past column n.
void pack_tile(const GemmF64& g, int64_t p0, int64_t kc, int64_t j0, int nr, double* out) {
  const int cols = static_cast<int>(std::min<int64_t>(nr, g.n - j0));
  if (cols < nr) std::fill(out, out + kc * nr, 0.0);
  if (g.b_transposed) {
    for (int c = 0; c < cols; ++c) {
      const double* src = g.b + (j0 + c) * g.ldb + p0;
      for (int64_t p = 0; p < kc; ++p) out[p * nr + c] = src[p];
    }
    return;
  }
  for (int64_t p = 0; p < kc; ++p) std::copy_n(g.b + (p0 + p) * g.ldb + j0, cols, out + p * nr);
}

// ---- scalar -------------------------------------------------------------------

void tile_scalar(const double* a, int64_t lda, const double* bp, int64_t kc, int nr, double* c, int64_t ldc, int rows,
                 int cols, bool sub) {
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < cols; ++j) {
      double acc = c[r * ldc + j];
      for (int64_t p = 0; p < kc; ++p) {
        const double x = a[r * lda + p];
        acc = std::fma(sub ? -x : x, bp[p * nr + j], acc);
      }
      c[r * ldc + j] = acc;
    }
}

// ---- AVX2: 4 rows x 3 vectors of 4 ---------------------------------------------

template <int MR, bool SUB>
QF_GEMM_AVX2 void tile_avx2(const double* a, int64_t lda, const double* bp, int64_t kc, double* c, int64_t ldc,
                            const __m256i* mask) {
  __m256d acc[MR][3];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 3; ++v) acc[r][v] = _mm256_maskload_pd(c + r * ldc + 4 * v, mask[v]);
  for (int64_t p = 0; p < kc; ++p) {
    const double* bq = bp + p * 12;
    const __m256d b0 = _mm256_loadu_pd(bq), b1 = _mm256_loadu_pd(bq + 4), b2 = _mm256_loadu_pd(bq + 8);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      // fnmadd: -(x b) + c rounded once, the reference's fma(-x, b, c).
      const __m256d x = _mm256_broadcast_sd(a + r * lda + p);
      if (SUB) {
        acc[r][0] = _mm256_fnmadd_pd(x, b0, acc[r][0]);
        acc[r][1] = _mm256_fnmadd_pd(x, b1, acc[r][1]);
        acc[r][2] = _mm256_fnmadd_pd(x, b2, acc[r][2]);
      } else {
        acc[r][0] = _mm256_fmadd_pd(x, b0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_pd(x, b1, acc[r][1]);
        acc[r][2] = _mm256_fmadd_pd(x, b2, acc[r][2]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 3; ++v) _mm256_maskstore_pd(c + r * ldc + 4 * v, mask[v], acc[r][v]);
}

template <bool SUB>
QF_GEMM_AVX2 void rows_avx2(const double* a, int64_t lda, const double* bp, int64_t kc, double* c, int64_t ldc,
                            int rows, int cols) {
  __m256i mask[3];
  for (int v = 0; v < 3; ++v) {
    alignas(32) int64_t m[4];
    for (int l = 0; l < 4; ++l) m[l] = 4 * v + l < cols ? -1 : 0;
    mask[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(m));
  }
  switch (rows) {
    case 4: return tile_avx2<4, SUB>(a, lda, bp, kc, c, ldc, mask);
    case 3: return tile_avx2<3, SUB>(a, lda, bp, kc, c, ldc, mask);
    case 2: return tile_avx2<2, SUB>(a, lda, bp, kc, c, ldc, mask);
    default: return tile_avx2<1, SUB>(a, lda, bp, kc, c, ldc, mask);
  }
}

// ---- AVX-512: 6 rows x 4 vectors of 8 ------------------------------------------

template <int MR, bool SUB>
QF_GEMM_AVX512 void tile_avx512(const double* a, int64_t lda, const double* bp, int64_t kc, double* c, int64_t ldc,
                                const __mmask8* mask) {
  __m512d acc[MR][4];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_maskz_loadu_pd(mask[v], c + r * ldc + 8 * v);
  for (int64_t p = 0; p < kc; ++p) {
    const double* bq = bp + p * 32;
    const __m512d b0 = _mm512_loadu_pd(bq), b1 = _mm512_loadu_pd(bq + 8), b2 = _mm512_loadu_pd(bq + 16),
                  b3 = _mm512_loadu_pd(bq + 24);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512d x = _mm512_set1_pd(a[r * lda + p]);
      if (SUB) {
        acc[r][0] = _mm512_fnmadd_pd(x, b0, acc[r][0]);
        acc[r][1] = _mm512_fnmadd_pd(x, b1, acc[r][1]);
        acc[r][2] = _mm512_fnmadd_pd(x, b2, acc[r][2]);
        acc[r][3] = _mm512_fnmadd_pd(x, b3, acc[r][3]);
      } else {
        acc[r][0] = _mm512_fmadd_pd(x, b0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_pd(x, b1, acc[r][1]);
        acc[r][2] = _mm512_fmadd_pd(x, b2, acc[r][2]);
        acc[r][3] = _mm512_fmadd_pd(x, b3, acc[r][3]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) _mm512_mask_storeu_pd(c + r * ldc + 8 * v, mask[v], acc[r][v]);
}

template <bool SUB>
QF_GEMM_AVX512 void rows_avx512(const double* a, int64_t lda, const double* bp, int64_t kc, double* c, int64_t ldc,
                                int rows, int cols) {
  __mmask8 mask[4];
  for (int v = 0; v < 4; ++v) {
    const int valid = std::clamp(cols - 8 * v, 0, 8);
    mask[v] = static_cast<__mmask8>((1u << valid) - 1u);
  }
  switch (rows) {
    case 6: return tile_avx512<6, SUB>(a, lda, bp, kc, c, ldc, mask);
    case 5: return tile_avx512<5, SUB>(a, lda, bp, kc, c, ldc, mask);
    case 4: return tile_avx512<4, SUB>(a, lda, bp, kc, c, ldc, mask);
    case 3: return tile_avx512<3, SUB>(a, lda, bp, kc, c, ldc, mask);
    case 2: return tile_avx512<2, SUB>(a, lda, bp, kc, c, ldc, mask);
    default: return tile_avx512<1, SUB>(a, lda, bp, kc, c, ldc, mask);
  }
}

// One register block: `rows` <= MR rows and `cols` <= NR columns of C.
void block(SimdLevel level, const double* a, int64_t lda, const double* bp, int64_t kc, int nr, double* c,
           int64_t ldc, int rows, int cols, bool sub) {
  if (level >= SimdLevel::Avx512)
    return sub ? rows_avx512<true>(a, lda, bp, kc, c, ldc, rows, cols)
               : rows_avx512<false>(a, lda, bp, kc, c, ldc, rows, cols);
  if (level == SimdLevel::Avx2)
    return sub ? rows_avx2<true>(a, lda, bp, kc, c, ldc, rows, cols) : rows_avx2<false>(a, lda, bp, kc, c, ldc, rows, cols);
  tile_scalar(a, lda, bp, kc, nr, c, ldc, rows, cols, sub);
}

void check(const GemmF64& g) {
  if (g.m < 0 || g.n < 0 || g.k < 0)
    throw Error(ErrorKind::Internal, "gemm_f64: negative size " + std::to_string(g.m) + " x " + std::to_string(g.n) +
                                         " x " + std::to_string(g.k));
  if (g.m == 0 || g.n == 0 || g.k == 0) return;
  if (!g.a || !g.b || !g.c || g.lda < g.k || g.ldc < g.n || g.ldb < (g.b_transposed ? g.k : g.n))
    throw Error(ErrorKind::Internal, "gemm_f64: null operand or leading dimension below its row length");
}

}  // namespace

void gemm_f64_ref(const GemmF64& g) {
  check(g);
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t j = 0; j < g.n; ++j) {
      if (g.lower && j > i + g.diagonal) continue;
      double acc = g.c[i * g.ldc + j];
      for (int64_t p = 0; p < g.k; ++p) {
        const double x = g.a[i * g.lda + p];
        const double y = g.b_transposed ? g.b[j * g.ldb + p] : g.b[p * g.ldb + j];
        acc = std::fma(g.subtract ? -x : x, y, acc);
      }
      g.c[i * g.ldc + j] = acc;
    }
}

void gemm_f64(const GemmF64& g, SimdLevel level, ThreadPool* pool) {
  check(g);
  if (g.m == 0 || g.n == 0 || g.k == 0) return;
  const Shape sh = shape_of(level);
  const int64_t panel_cols = 8 * static_cast<int64_t>(sh.nr);
  const int64_t tiles = (g.n + sh.nr - 1) / sh.nr;
  const int64_t row_tasks = (g.m + kPanelRows - 1) / kPanelRows, col_tasks = (g.n + panel_cols - 1) / panel_cols;
  const int64_t tasks = row_tasks * col_tasks;
  const bool parallel = pool && tasks > 1;
  // B is packed one chunk of kKc steps at a time, all its tiles, once for
  // every task (in parallel by tiles); then each task runs its tile of C over
  // the chunk. A chain goes on in the next chunk where it stopped.
  std::vector<double> packed(static_cast<size_t>(tiles * kKc * sh.nr));
  for (int64_t p0 = 0; p0 < g.k; p0 += kKc) {
    const int64_t kc = std::min(kKc, g.k - p0);
    // With b_lower, B's rows p < j are zero in column j: tiles from column
    // p0 + kc on have nothing in this chunk.
    const int64_t last_tile = g.b_lower ? std::min(tiles, (p0 + kc + sh.nr - 1) / sh.nr) : tiles;
    auto pack = [&](const Chunk& ch) {
      for (int64_t tt = ch.begin; tt < ch.end; ++tt) pack_tile(g, p0, kc, tt * sh.nr, sh.nr, packed.data() + tt * kKc * sh.nr);
    };
    if (parallel && last_tile > 8) pool->parallel_for(last_tile, 8, pack);
    else pack(Chunk{0, 0, last_tile});
    auto task = [&](const Chunk& ch) {
      for (int64_t t = ch.begin; t < ch.end; ++t) {
        const int64_t i0 = (t / col_tasks) * kPanelRows, i1 = std::min(g.m, i0 + kPanelRows);
        const int64_t j0 = (t % col_tasks) * panel_cols, j1 = std::min(g.n, j0 + panel_cols);
        if (g.lower && j0 > i1 - 1 + g.diagonal) continue;  // wholly above the diagonal
        // A tile of B (kc x NR) stays in L1 while the row blocks pass over it.
        for (int64_t j = j0; j < j1; j += sh.nr) {
          const int64_t tt = j / sh.nr;
          if (tt >= last_tile) break;
          const int cols = static_cast<int>(std::min<int64_t>(sh.nr, j1 - j));
          for (int64_t i = i0; i < i1; i += sh.mr) {
            const int rows = static_cast<int>(std::min<int64_t>(sh.mr, i1 - i));
            if (g.lower && j > i + rows - 1 + g.diagonal) continue;  // wholly above the diagonal
            // With a_lower, the block's rows need steps p <= i + rows - 1 only.
            const int64_t steps = g.a_lower ? std::min(kc, i + rows - p0) : kc;
            if (steps <= 0) continue;
            block(level, g.a + i * g.lda + p0, g.lda, packed.data() + tt * kKc * sh.nr, steps, sh.nr,
                  g.c + i * g.ldc + j, g.ldc, rows, cols, g.subtract);
          }
        }
      }
    };
    if (parallel) pool->parallel_for(tasks, 1, task);
    else task(Chunk{0, 0, tasks});
  }
}

}  // namespace qf
