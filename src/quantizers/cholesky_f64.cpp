#include "quantizers/cholesky_f64.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "quantizers/gemm_f64.h"

namespace qf {
namespace {

constexpr int64_t kSolveBlock = 16;  // columns a triangular solve takes by plain loops before handing the rest to gemm_f64

// The scalar loops below are written once (always inlined) and compiled
// twice: at the baseline, where std::fma is a library call, and with the FMA
// instruction for AVX2 and up. A fused multiply-add is exactly rounded
// either way, so both give the same doubles; the instruction is many times
// faster than the call.
#define QF_CHOL_INLINE __attribute__((always_inline)) inline
#define QF_CHOL_FMA __attribute__((target("avx2,fma")))

// The unblocked factor of the kb x kb diagonal block at a (already updated
// by the blocks left of it): left-looking, each sum a chain in p order.
QF_CHOL_INLINE bool factor_diagonal_body(double* a, int64_t kb, int64_t lda) {
  for (int64_t j = 0; j < kb; ++j) {
    double* rj = a + j * lda;
    double d = rj[j];
    for (int64_t p = 0; p < j; ++p) d = std::fma(-rj[p], rj[p], d);
    if (!(d > 0.0) || !std::isfinite(d)) return false;
    const double s = std::sqrt(d);
    rj[j] = s;
    for (int64_t i = j + 1; i < kb; ++i) {
      double* ri = a + i * lda;
      double v = ri[j];
      for (int64_t p = 0; p < j; ++p) v = std::fma(-ri[p], rj[p], v);
      ri[j] = v / s;
    }
  }
  return true;
}
bool factor_diagonal_base(double* a, int64_t kb, int64_t lda) { return factor_diagonal_body(a, kb, lda); }
QF_CHOL_FMA bool factor_diagonal_fma(double* a, int64_t kb, int64_t lda) { return factor_diagonal_body(a, kb, lda); }
bool factor_diagonal(double* a, int64_t kb, int64_t lda, SimdLevel level) {
  return level >= SimdLevel::Avx2 ? factor_diagonal_fma(a, kb, lda) : factor_diagonal_base(a, kb, lda);
}

// Rows [begin, end) of x (stride ldx) := x L^-T over the columns [c0, c0 + cw)
// of the lower factor l, by loops (the in-block part of solve_rows_lt).
QF_CHOL_INLINE void solve_block_body(double* x, int64_t begin, int64_t end, int64_t ldx, const double* l, int64_t ldl,
                                     int64_t c0, int64_t cw) {
  for (int64_t r = begin; r < end; ++r) {
    double* xr = x + r * ldx;
    for (int64_t j = c0; j < c0 + cw; ++j) {
      const double* lj = l + j * ldl;
      double v = xr[j];
      for (int64_t p = c0; p < j; ++p) v = std::fma(-xr[p], lj[p], v);
      xr[j] = v / lj[j];
    }
  }
}
void solve_block_base(double* x, int64_t b, int64_t e, int64_t ldx, const double* l, int64_t ldl, int64_t c0, int64_t cw) {
  solve_block_body(x, b, e, ldx, l, ldl, c0, cw);
}
QF_CHOL_FMA void solve_block_fma(double* x, int64_t b, int64_t e, int64_t ldx, const double* l, int64_t ldl, int64_t c0,
                                 int64_t cw) {
  solve_block_body(x, b, e, ldx, l, ldl, c0, cw);
}

// Rows x[r] (r < m, stride ldx) := x[r] L^-T for the kb x kb lower factor L
// at l: x[r][j] = (x[r][j] - sum_{p<j} x[r][p] L[j][p]) / L[j][j]. Columns
// in blocks of kSolveBlock: within a block by loops, the block's effect on
// the columns after it by gemm_f64.
void solve_rows_lt(double* x, int64_t m, int64_t ldx, const double* l, int64_t ldl, int64_t kb, SimdLevel level,
                   ThreadPool* pool) {
  for (int64_t c0 = 0; c0 < kb; c0 += kSolveBlock) {
    const int64_t cw = std::min(kSolveBlock, kb - c0);
    auto rows = [&](const Chunk& ch) {
      if (level >= SimdLevel::Avx2) solve_block_fma(x, ch.begin, ch.end, ldx, l, ldl, c0, cw);
      else solve_block_base(x, ch.begin, ch.end, ldx, l, ldl, c0, cw);
    };
    if (pool && m > 64) pool->parallel_for(m, 64, rows);
    else rows(Chunk{0, 0, m});
    if (c0 + cw < kb) {
      // x[:, c0+cw:kb] -= x[:, c0:c0+cw] L[c0+cw:kb, c0:c0+cw]^T
      GemmF64 g;
      g.m = m, g.n = kb - c0 - cw, g.k = cw;
      g.a = x + c0, g.lda = ldx;
      g.b = l + (c0 + cw) * ldl + c0, g.ldb = ldl, g.b_transposed = true;
      g.c = x + c0 + cw, g.ldc = ldx;
      gemm_f64(g, level, pool);
    }
  }
}

}  // namespace

bool cholesky_lower_f64(double* a, int64_t n, int64_t lda, SimdLevel level, ThreadPool* pool) {
  for (int64_t k0 = 0; k0 < n; k0 += kCholeskyBlock) {
    const int64_t kb = std::min(kCholeskyBlock, n - k0);
    double* akk = a + k0 * lda + k0;
    if (!factor_diagonal(akk, kb, lda, level)) return false;
    const int64_t rest = n - k0 - kb;
    if (rest == 0) break;
    double* panel = a + (k0 + kb) * lda + k0;  // rows below the diagonal block, its columns
    solve_rows_lt(panel, rest, lda, akk, lda, kb, level, pool);
    // Trailing matrix (lower triangle): A22 -= P P^T.
    GemmF64 g;
    g.m = rest, g.n = rest, g.k = kb;
    g.a = panel, g.lda = lda;
    g.b = panel, g.ldb = lda, g.b_transposed = true;
    g.c = a + (k0 + kb) * lda + k0 + kb, g.ldc = lda;
    g.lower = true;
    gemm_f64(g, level, pool);
  }
  return true;
}

namespace {

// L^-1 over the n x n lower L at a, n <= kCholeskyBlock, by forward
// substitution column by column from a copy of L (the strict upper
// triangle set to zero).
QF_CHOL_INLINE void invert_small_body(double* a, int64_t lda, int64_t n) {
  double l[kCholeskyBlock * kCholeskyBlock];
  for (int64_t i = 0; i < n; ++i) std::copy_n(a + i * lda, i + 1, l + i * n);
  for (int64_t i = 0; i < n; ++i) std::fill(a + i * lda, a + i * lda + n, 0.0);
  for (int64_t c = 0; c < n; ++c)
    for (int64_t i = c; i < n; ++i) {
      const double* li = l + i * n;
      double v = i == c ? 1.0 : 0.0;
      for (int64_t p = c; p < i; ++p) v = std::fma(-li[p], a[p * lda + c], v);
      a[i * lda + c] = v / li[i];
    }
}
void invert_small_base(double* a, int64_t lda, int64_t n) { invert_small_body(a, lda, n); }
QF_CHOL_FMA void invert_small_fma(double* a, int64_t lda, int64_t n) { invert_small_body(a, lda, n); }

// Recursively, with L = [L11 0; L21 L22] split at n1 (a multiple of
// kCholeskyBlock near n / 2):
//   X11 = L11^-1, X22 = L22^-1, X21 = -X22 (L21 X11), X12 = 0,
// each block of X written over its block of L once that is read (L21 is
// read into T before X21 takes its place). Both products are large (n / 2
// rows), so B is packed once for many rows; X11 and X22 are lower
// triangular, so b_lower and a_lower skip their zeros.
void invert_rec(double* a, int64_t lda, int64_t n, SimdLevel level, ThreadPool* pool) {
  if (n <= kCholeskyBlock)
    return level >= SimdLevel::Avx2 ? invert_small_fma(a, lda, n) : invert_small_base(a, lda, n);
  const int64_t n1 = (n / 2 + kCholeskyBlock - 1) / kCholeskyBlock * kCholeskyBlock, n2 = n - n1;
  double* a22 = a + n1 * lda + n1;
  double* a21 = a + n1 * lda;
  invert_rec(a, lda, n1, level, pool);
  invert_rec(a22, lda, n2, level, pool);
  for (int64_t i = 0; i < n1; ++i) std::fill(a + i * lda + n1, a + i * lda + n, 0.0);
  std::vector<double> t(static_cast<size_t>(n2 * n1), 0.0);
  GemmF64 g;  // T = L21 X11
  g.m = n2, g.n = n1, g.k = n1;
  g.a = a21, g.lda = lda;
  g.b = a, g.ldb = lda, g.b_lower = true;
  g.c = t.data(), g.ldc = n1;
  g.subtract = false;
  gemm_f64(g, level, pool);
  for (int64_t i = 0; i < n2; ++i) std::fill(a21 + i * lda, a21 + i * lda + n1, 0.0);
  GemmF64 h;  // X21 = 0 - X22 T
  h.m = n2, h.n = n1, h.k = n2;
  h.a = a22, h.lda = lda, h.a_lower = true;
  h.b = t.data(), h.ldb = n1;
  h.c = a21, h.ldc = lda;
  gemm_f64(h, level, pool);
}

}  // namespace

void invert_lower_f64(double* a, int64_t lda, int64_t n, SimdLevel level, ThreadPool* pool) {
  invert_rec(a, lda, n, level, pool);
}

}  // namespace qf
