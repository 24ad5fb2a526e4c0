// The dense factorizations GPTQ needs, in double, blocked on gemm_f64
// (quantizers/gemm_f64.h) so that the O(n^3) work runs on the SIMD kernels
// and the thread pool: the lower Cholesky factor of a symmetric positive
// definite matrix, and the inverse of a lower triangular matrix.
//
// Both are fixed algorithms: blocks of kCholeskyBlock columns, every sum a
// chain of fused multiply-adds in a fixed order (the small diagonal blocks
// and triangular solves by the scalar loops here, the rest by gemm_f64), so
// the result is the same doubles at every SIMD level and thread count.
#pragma once

#include <cstdint>

#include "core/simd.h"

namespace qf {

class ThreadPool;

inline constexpr int64_t kCholeskyBlock = 128;

// A (n x n, row-major, leading dimension lda; only the lower triangle is
// read) := its lower Cholesky factor L (A = L L^T) in the lower triangle.
// The strict upper triangle is used as scratch. Returns false, with A
// partly overwritten, when a pivot is not positive and finite (A is not
// numerically positive definite).
bool cholesky_lower_f64(double* a, int64_t n, int64_t lda, SimdLevel level, ThreadPool* pool);

// a (n x n, leading dimension lda) := L^-1 for the lower triangular L in
// its lower triangle (diagonal nonzero), written over L; the strict upper
// triangle is set to zero. Needs one (n/2)^2 scratch buffer, not a second
// n x n matrix.
void invert_lower_f64(double* a, int64_t lda, int64_t n, SimdLevel level, ThreadPool* pool);

}  // namespace qf
