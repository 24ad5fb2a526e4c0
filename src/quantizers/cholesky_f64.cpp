#include "quantizers/cholesky_f64.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "quantizers/gemm_f64.h"

namespace qf {
namespace {

constexpr int64_t kSolveBlock = 16;  // columns a triangular solve takes by plain loops before handing the rest to gemm_f64

// The unblocked factor of the kb x kb diagonal block at a (already updated
// by the blocks left of it): left-looking, each sum a chain in p order.
bool factor_diagonal(double* a, int64_t kb, int64_t lda) {
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

// Rows x[r] (r < m, stride ldx) := x[r] L^-T for the kb x kb lower factor L
// at l: x[r][j] = (x[r][j] - sum_{p<j} x[r][p] L[j][p]) / L[j][j]. Columns
// in blocks of kSolveBlock: within a block by loops, the block's effect on
// the columns after it by gemm_f64.
void solve_rows_lt(double* x, int64_t m, int64_t ldx, const double* l, int64_t ldl, int64_t kb, SimdLevel level,
                   ThreadPool* pool) {
  for (int64_t c0 = 0; c0 < kb; c0 += kSolveBlock) {
    const int64_t cw = std::min(kSolveBlock, kb - c0);
    auto rows = [&](const Chunk& ch) {
      for (int64_t r = ch.begin; r < ch.end; ++r) {
        double* xr = x + r * ldx;
        for (int64_t j = c0; j < c0 + cw; ++j) {
          const double* lj = l + j * ldl;
          double v = xr[j];
          for (int64_t p = c0; p < j; ++p) v = std::fma(-xr[p], lj[p], v);
          xr[j] = v / lj[j];
        }
      }
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
    if (!factor_diagonal(akk, kb, lda)) return false;
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

void invert_lower_f64(const double* l, int64_t ldl, double* x, int64_t ldx, int64_t n, SimdLevel level,
                      ThreadPool* pool) {
  // Row block by row block: with R the rows [r0, r1) and X the inverse so
  // far (rows above r0), L X = I gives
  //   X[R, R]    =  D,  D = L[R, R]^-1
  //   X[R, 0:r0] = -D T,  T = L[R, 0:r0] X[0:r0, 0:r0]
  // D by forward substitution (a block of kCholeskyBlock rows: plain loops),
  // both products by gemm_f64 (X is lower triangular: b_lower skips its
  // zeros).
  for (int64_t i = 0; i < n; ++i) std::fill(x + i * ldx, x + i * ldx + n, 0.0);
  std::vector<double> d(static_cast<size_t>(kCholeskyBlock * kCholeskyBlock)), t;
  for (int64_t r0 = 0; r0 < n; r0 += kCholeskyBlock) {
    const int64_t rb = std::min(kCholeskyBlock, n - r0);
    const double* lrr = l + r0 * ldl + r0;
    // D = L[R, R]^-1, column by column (lower, rb x rb, leading dimension rb).
    std::fill(d.begin(), d.end(), 0.0);
    for (int64_t c = 0; c < rb; ++c)
      for (int64_t i = c; i < rb; ++i) {
        const double* li = lrr + i * ldl;
        double v = i == c ? 1.0 : 0.0;
        for (int64_t p = c; p < i; ++p) v = std::fma(-li[p], d[static_cast<size_t>(p * rb + c)], v);
        d[static_cast<size_t>(i * rb + c)] = v / li[i];
      }
    for (int64_t i = 0; i < rb; ++i) std::copy_n(d.data() + i * rb, i + 1, x + (r0 + i) * ldx + r0);
    if (r0 == 0) continue;
    // T = L[R, 0:r0] X[0:r0, 0:r0], then X[R, 0:r0] = 0 - D T.
    t.assign(static_cast<size_t>(rb * r0), 0.0);
    GemmF64 g;
    g.m = rb, g.n = r0, g.k = r0;
    g.a = l + r0 * ldl, g.lda = ldl;
    g.b = x, g.ldb = ldx, g.b_lower = true;
    g.c = t.data(), g.ldc = r0;
    g.subtract = false;
    gemm_f64(g, level, pool);
    GemmF64 h;
    h.m = rb, h.n = r0, h.k = rb;
    h.a = d.data(), h.lda = rb;
    h.b = t.data(), h.ldb = r0;
    h.c = x + r0 * ldx, h.ldc = ldx;
    gemm_f64(h, level, pool);
  }
}

}  // namespace qf
