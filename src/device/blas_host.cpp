// The host build of blas.h: Eigen under cuBLAS's conventions. Each routine
// maps exactly the memory cuBLAS reads (column-major, leading dimensions)
// and splits its output into fixed chunks of kChunk columns (rows for
// trsm's right side) run by OpenMP, so the result never depends on the
// thread count.
#include "device/blas.h"

#include "core/bf16.h"
#include "core/f16.h"

#include <memory>
#include <vector>

#include <Eigen/Cholesky>
#include <Eigen/Core>

namespace qf::host {

namespace {

constexpr int64_t kChunk = 64;

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
template <class T>
using CMap = Eigen::Map<const Mat<T>, 0, Eigen::OuterStride<>>;
template <class T>
using MMap = Eigen::Map<Mat<T>, 0, Eigen::OuterStride<>>;

int64_t chunks_of(int64_t n) { return (n + kChunk - 1) / kChunk; }

template <class T>
void gemm_impl(Op ta, Op tb, int64_t m, int64_t n, int64_t k, T alpha, const T* A, int64_t lda, const T* B,
               int64_t ldb, T beta, T* C, int64_t ldc) {
  check_gemm_args(ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  const CMap<T> a(A, ta == Op::N ? m : k, ta == Op::N ? k : m, Eigen::OuterStride<>(lda));
  const CMap<T> b(B, tb == Op::N ? k : n, tb == Op::N ? n : k, Eigen::OuterStride<>(ldb));
  const int64_t nc = chunks_of(n);
#pragma omp parallel for schedule(dynamic)
  for (int64_t c = 0; c < nc; ++c) {
    const int64_t c0 = c * kChunk, w = (c0 + kChunk < n ? kChunk : n - c0);
    MMap<T> out(C + c0 * ldc, m, w, Eigen::OuterStride<>(ldc));
    if (beta == T(0)) out.setZero();
    else if (beta != T(1)) out *= beta;
    if (alpha == T(0) || k == 0) continue;
    if (ta == Op::N && tb == Op::N) out.noalias() += alpha * (a * b.middleCols(c0, w));
    else if (ta == Op::N) out.noalias() += alpha * (a * b.middleRows(c0, w).transpose());
    else if (tb == Op::N) out.noalias() += alpha * (a.transpose() * b.middleCols(c0, w));
    else out.noalias() += alpha * (a.transpose() * b.middleRows(c0, w).transpose());
  }
}

}  // namespace

// The host build has no library handles; its context stands where the cuda
// build's does, made and counted the same way.
struct Blas::Context {};

Blas::Context& Blas::context() {
  thread_local std::unique_ptr<Context> mine;
  if (!mine) {
    mine = std::make_unique<Context>();
    device::count_blas_context();
  }
  return *mine;
}

Blas::Blas() : ctx_(&context()) {}
Blas::~Blas() = default;

void Blas::gemm(Op ta, Op tb, int64_t m, int64_t n, int64_t k, double alpha, const double* A, int64_t lda,
                const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  blas_fault_point("Dgemm");
  gemm_impl(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

void Blas::gemm(Op ta, Op tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  blas_fault_point("Sgemm");
  gemm_impl(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

namespace {

// The m x n matrix at p (leading dimension ld) widened to f32, the padding
// rows left zero: what a 16-bit operand contributes to an f32 product.
std::vector<float> widened(Half type, const uint16_t* p, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> out(static_cast<size_t>(ld * cols), 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) {
      const uint16_t v = p[r + c * ld];
      out[static_cast<size_t>(r + c * ld)] = type == Half::F16 ? hd::f16_to_f32(v) : hd::bf16_to_f32(v);
    }
  return out;
}

}  // namespace

void Blas::gemm_16(Half type, Op ta, Op tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* A,
                   int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  blas_fault_point("GemmEx");
  check_gemm_args(ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  const std::vector<float> a = widened(type, A, ta == Op::N ? m : k, ta == Op::N ? k : m, lda);
  const std::vector<float> b = widened(type, B, tb == Op::N ? k : n, tb == Op::N ? n : k, ldb);
  gemm_impl(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, C, ldc);
}

void Blas::gemm_strided_batched(Op ta, Op tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A,
                                int64_t lda, int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b,
                                float beta, float* C, int64_t ldc, int64_t stride_c, int64_t batch) {
  blas_fault_point("SgemmStridedBatched");
  check_gemm_args(ta, tb, m, n, k, lda, ldb, ldc);
  check_batch_args(batch, stride_c, ldc, m, n);
  // Each product is one gemm of its own (the same chunks as a single call).
  for (int64_t b = 0; b < batch; ++b)
    gemm_impl(ta, tb, m, n, k, alpha, A + b * stride_a, lda, B + b * stride_b, ldb, beta, C + b * stride_c, ldc);
}

void Blas::syrk(Uplo uplo, Op trans, int64_t n, int64_t k, double alpha, const double* A, int64_t lda, double beta,
                double* C, int64_t ldc) {
  blas_fault_point("Dsyrk");
  check_syrk_args(trans, n, k, lda, ldc);
  if (n == 0) return;
  const CMap<double> a(A, trans == Op::N ? n : k, trans == Op::N ? k : n, Eigen::OuterStride<>(lda));
  const int64_t nc = chunks_of(n);
#pragma omp parallel for schedule(dynamic)
  for (int64_t c = 0; c < nc; ++c) {
    const int64_t c0 = c * kChunk, w = (c0 + kChunk < n ? kChunk : n - c0);
    // Column chunk [c0, c0 + w) of C: its diagonal block (one triangle) and
    // the rectangle beyond it in the stored triangle.
    const int64_t r0 = uplo == Uplo::Lower ? c0 + w : 0, rn = uplo == Uplo::Lower ? n - c0 - w : c0;
    MMap<double> diag(C + c0 * ldc + c0, w, w, Eigen::OuterStride<>(ldc));
    MMap<double> rect(C + c0 * ldc + r0, rn, w, Eigen::OuterStride<>(ldc));
    // op(A) rows: rows of A (N) or columns of A (T).
    auto rows_of = [&](int64_t r, int64_t cnt) -> Mat<double> {
      return trans == Op::N ? Mat<double>(a.middleRows(r, cnt)) : Mat<double>(a.middleCols(r, cnt).transpose());
    };
    const Mat<double> mine = rows_of(c0, w);
    if (uplo == Uplo::Lower) {
      if (beta == 0.0) diag.triangularView<Eigen::Lower>().setZero();
      else diag.triangularView<Eigen::Lower>() *= beta;
      if (alpha != 0.0 && k > 0) diag.selfadjointView<Eigen::Lower>().rankUpdate(mine, alpha);
    } else {
      if (beta == 0.0) diag.triangularView<Eigen::Upper>().setZero();
      else diag.triangularView<Eigen::Upper>() *= beta;
      if (alpha != 0.0 && k > 0) diag.selfadjointView<Eigen::Upper>().rankUpdate(mine, alpha);
    }
    if (rn == 0) continue;
    if (beta == 0.0) rect.setZero();
    else if (beta != 1.0) rect *= beta;
    if (alpha != 0.0 && k > 0) rect.noalias() += alpha * (rows_of(r0, rn) * mine.transpose());
  }
}

int Blas::potrf(Uplo uplo, int64_t n, double* A, int64_t lda) {
  blas_fault_point("Dpotrf");
  check_potrf_args(n, lda);
  if (n == 0) return 0;
  MMap<double> a(A, n, n, Eigen::OuterStride<>(lda));
  const Eigen::Index bad = uplo == Uplo::Lower ? Eigen::internal::llt_inplace<double, Eigen::Lower>::blocked(a)
                                               : Eigen::internal::llt_inplace<double, Eigen::Upper>::blocked(a);
  return bad < 0 ? 0 : static_cast<int>(bad + 1);
}

namespace {

// X := op(T)^-1 X (left) or X op(T)^-1 (right) for one chunk, T the
// triangle of A that Mode names (Lower/Upper, optionally unit diagonal).
// uplo names A's stored triangle: op(A) = A^T holds it in the other
// triangle, which is the one Eigen's view of a.transpose() must name.
template <int Mode, int TransposedMode, class Blk>
void solve_chunk(const CMap<double>& a, bool transposed, Side side, Blk&& x) {
  if (side == Side::Left) {
    if (transposed) a.transpose().template triangularView<TransposedMode>().solveInPlace(x);
    else a.template triangularView<Mode>().solveInPlace(x);
  } else {
    if (transposed) a.transpose().template triangularView<TransposedMode>().template solveInPlace<Eigen::OnTheRight>(x);
    else a.template triangularView<Mode>().template solveInPlace<Eigen::OnTheRight>(x);
  }
}

}  // namespace

void Blas::trsm(Side side, Uplo uplo, Op ta, Diag diag, int64_t m, int64_t n, double alpha, const double* A,
                int64_t lda, double* B, int64_t ldb) {
  blas_fault_point("Dtrsm");
  check_trsm_args(side, m, n, lda, ldb);
  if (m == 0 || n == 0) return;
  const int64_t na = side == Side::Left ? m : n;
  const CMap<double> a(A, na, na, Eigen::OuterStride<>(lda));
  // Left: columns of X are independent; right: rows are.
  const int64_t span = side == Side::Left ? n : m, nc = chunks_of(span);
  const bool t = ta == Op::T, unit = diag == Diag::Unit, lower = uplo == Uplo::Lower;
#pragma omp parallel for schedule(dynamic)
  for (int64_t c = 0; c < nc; ++c) {
    const int64_t c0 = c * kChunk, w = (c0 + kChunk < span ? kChunk : span - c0);
    MMap<double> x(side == Side::Left ? B + c0 * ldb : B + c0, side == Side::Left ? m : w,
                   side == Side::Left ? w : n, Eigen::OuterStride<>(ldb));
    if (alpha == 0.0) {  // cuBLAS: X = 0, A not read
      x.setZero();
      continue;
    }
    if (alpha != 1.0) x *= alpha;
    if (lower && unit) solve_chunk<Eigen::UnitLower, Eigen::UnitUpper>(a, t, side, x);
    else if (lower) solve_chunk<Eigen::Lower, Eigen::Upper>(a, t, side, x);
    else if (unit) solve_chunk<Eigen::UnitUpper, Eigen::UnitLower>(a, t, side, x);
    else solve_chunk<Eigen::Upper, Eigen::Lower>(a, t, side, x);
  }
}

}  // namespace qf::host
