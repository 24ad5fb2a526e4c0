// Dense algebra for device sources, with exactly cuBLAS's and cuSOLVER's
// calling conventions: column-major matrices, op(A) = A or A^T, leading
// dimensions, the triangle a routine reads (uplo). Pointers are device
// pointers (raw() of a dvec).
//
// The cuda build (cuda/blas.cu) calls cuBLAS and cuSOLVER; the host build
// (blas_host.cpp) implements the same contract with Eigen, reading only
// what cuBLAS would read (the uplo triangle, the first rows of each
// leading-dimension column), so a wrong leading dimension, transpose or
// triangle gives a wrong answer on the CPU too. Both check the arguments
// the way cuBLAS does (CUBLAS_STATUS_INVALID_VALUE) and throw
// qf::Error(Internal) naming the routine and the argument.
//
// The host build splits work into fixed column chunks, so its results do
// not depend on the thread count.
//
// A Blas is cheap: the cuBLAS and cuSOLVER handles (and the factorization's
// workspace) belong to a context made once per device and thread, on the
// first Blas of that thread, and kept until the thread ends
// (device::blas_contexts_created counts them). A routine that fails on the
// device (cuBLAS's execution, allocation, internal or mapping errors, or
// QF_DEVICE_FAULT=blas:N) throws qf::Error(Io) "device: cuBLAS <routine>
// failed: <status>"; a library that cannot run here, Unsupported.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"
#include "device/exec.h"
#include "device/fault.h"

namespace qf::QF_DEV_NS {

enum class Op { N, T };
enum class Uplo { Lower, Upper };
enum class Side { Left, Right };
enum class Diag { NonUnit, Unit };
enum class Half { F16, Bf16 };  // the 16-bit float formats gemm_16 takes

class Blas {
 public:
  Blas();
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // C = alpha op(A) op(B) + beta C. op(A) is m x k, op(B) k x n, C m x n.
  // beta == 0: C is not read (NaN in C does not propagate).
  void gemm(Op ta, Op tb, int64_t m, int64_t n, int64_t k, double alpha, const double* A, int64_t lda,
            const double* B, int64_t ldb, double beta, double* C, int64_t ldc);
  void gemm(Op ta, Op tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda,
            const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

  // C = alpha op(A) op(B) + beta C with A and B in one 16-bit format (raw
  // f16 or bf16 bits) and C in f32, the products summed in f32: cuBLAS's
  // GemmEx with CUBLAS_COMPUTE_32F (tensor cores). The products of two
  // 16-bit values are exact in f32, so the host build widens both to f32
  // and runs the f32 gemm: the same value up to summation order.
  void gemm_16(Half type, Op ta, Op tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);

  // `batch` independent gemms: matrix b of A, B and C starts stride_a * b,
  // stride_b * b, stride_c * b elements after the first (a stride of 0
  // reuses one matrix for every product, as in grouped-query attention,
  // where query heads share a key head). cuBLAS's gemmStridedBatched.
  void gemm_strided_batched(Op ta, Op tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda,
                            int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b, float beta, float* C,
                            int64_t ldc, int64_t stride_c, int64_t batch);

  // The `uplo` triangle of the n x n C := alpha op(A) op(A)^T + beta C, with
  // op(A) n x k (trans N: A is n x k; T: A is k x n, C = alpha A^T A + beta C).
  // The other triangle is neither read nor written.
  void syrk(Uplo uplo, Op trans, int64_t n, int64_t k, double alpha, const double* A, int64_t lda, double beta,
            double* C, int64_t ldc);

  // Cholesky factorization in place of the `uplo` triangle of the n x n A:
  // Lower: A = L L^T, L written to the lower triangle; Upper: A = U^T U.
  // The other triangle is neither read nor written. Returns cuSOLVER's
  // info: 0 on success, i > 0 when the leading minor of order i is not
  // positive definite (the factor is then incomplete).
  int potrf(Uplo uplo, int64_t n, double* A, int64_t lda);

  // Solves op(A) X = alpha B (Left) or X op(A) = alpha B (Right) for the
  // m x n X, which overwrites B. A is triangular (its `uplo` triangle is
  // read; Unit: its diagonal is taken as ones and not read), m x m (Left) or
  // n x n (Right).
  void trsm(Side side, Uplo uplo, Op ta, Diag diag, int64_t m, int64_t n, double alpha, const double* A,
            int64_t lda, double* B, int64_t ldb);

 private:
  struct Context;  // this thread's on the current device
  static Context& context();
  Context* ctx_;
};

#if defined(__CUDACC__)
// Loads cuBLAS and cuSOLVER and resolves every entry point Blas uses
// (Unsupported naming the library or symbol otherwise); a Blas does it too.
void load_blas_libraries();
#endif

// Where QF_DEVICE_FAULT=blas:N strikes: the start of each routine, in both builds.
inline void blas_fault_point(const char* routine) {
  if (device::inject_fault(device::FaultSite::Blas))
    throw Error(ErrorKind::Io, std::string("device: cuBLAS ") + routine +
                                   " failed: CUBLAS_STATUS_EXECUTION_FAILED (injected by QF_DEVICE_FAULT)");
}

// cuBLAS's argument checks, shared by both builds: qf::Error(Internal)
// "<routine>: <argument> = <value> ..." for a negative size or a leading
// dimension below max(1, rows of the stored matrix).
inline void check_blas_arg(const char* routine, const char* arg, int64_t value, int64_t least) {
  if (value >= least) return;
  throw Error(ErrorKind::Internal, std::string(routine) + ": " + arg + " = " + std::to_string(value) +
                                       ", cuBLAS needs at least " + std::to_string(least));
}
inline int64_t at_least_1(int64_t v) { return v > 1 ? v : 1; }

inline void check_gemm_args(Op ta, Op tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc) {
  check_blas_arg("gemm", "m", m, 0);
  check_blas_arg("gemm", "n", n, 0);
  check_blas_arg("gemm", "k", k, 0);
  check_blas_arg("gemm", "lda", lda, at_least_1(ta == Op::N ? m : k));
  check_blas_arg("gemm", "ldb", ldb, at_least_1(tb == Op::N ? k : n));
  check_blas_arg("gemm", "ldc", ldc, at_least_1(m));
}
// Products must not write over each other (cuBLAS leaves that undefined):
// C matrices one after another (stride_c >= ldc * n), or side by side within
// the same columns (stride_c >= m and the last one ends by row ldc, as the
// heads of a token row do).
inline void check_batch_args(int64_t batch, int64_t stride_c, int64_t ldc, int64_t m, int64_t n) {
  check_blas_arg("gemm_strided_batched", "batch", batch, 0);
  if (batch <= 1 || stride_c >= ldc * n || (stride_c >= m && (batch - 1) * stride_c + m <= ldc)) return;
  throw Error(ErrorKind::Internal, "gemm_strided_batched: stride_c = " + std::to_string(stride_c) +
                                       " makes the " + std::to_string(batch) + " products overlap");
}
inline void check_syrk_args(Op trans, int64_t n, int64_t k, int64_t lda, int64_t ldc) {
  check_blas_arg("syrk", "n", n, 0);
  check_blas_arg("syrk", "k", k, 0);
  check_blas_arg("syrk", "lda", lda, at_least_1(trans == Op::N ? n : k));
  check_blas_arg("syrk", "ldc", ldc, at_least_1(n));
}
inline void check_potrf_args(int64_t n, int64_t lda) {
  check_blas_arg("potrf", "n", n, 0);
  check_blas_arg("potrf", "lda", lda, at_least_1(n));
}
inline void check_trsm_args(Side side, int64_t m, int64_t n, int64_t lda, int64_t ldb) {
  check_blas_arg("trsm", "m", m, 0);
  check_blas_arg("trsm", "n", n, 0);
  check_blas_arg("trsm", "lda", lda, at_least_1(side == Side::Left ? m : n));
  check_blas_arg("trsm", "ldb", ldb, at_least_1(m));
}

}  // namespace qf::QF_DEV_NS
