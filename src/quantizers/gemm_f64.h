// Double-precision matrix products for GPTQ's solves (the Cholesky factor,
// its triangular inverse and the lazy column updates), with kernels per SIMD
// level (core/simd.h) that give the scalar reference's doubles bit for bit.
//
// Every element of C is one chain of fused multiply-adds in the order of the
// inner index, p = 0, 1, ..., k-1, starting from C's value:
//   c = fma(+-A[i][p], B[p][j], c)
// with one rounding per step. Vectors run across j (and registers across i),
// never across p, and the chain of an element never depends on the tiling,
// the thread count or the level, so neither does the result. Products are
// not exact here (the factor's entries are general doubles); what is
// guaranteed is that every level rounds the same way.
#pragma once

#include <cstdint>

#include "core/simd.h"

namespace qf {

class ThreadPool;

struct GemmF64 {
  int64_t m = 0, n = 0, k = 0;
  const double* a = nullptr;  // A[i][p] = a[i * lda + p]
  int64_t lda = 0;
  const double* b = nullptr;  // B[p][j] = b[p * ldb + j], or b[j * ldb + p] when b_transposed
  int64_t ldb = 0;
  bool b_transposed = false;
  double* c = nullptr;        // C[i][j] = c[i * ldc + j]
  int64_t ldc = 0;
  bool subtract = true;       // C -= A B; false: C += A B
  // B lower triangular (B[p][j] == 0 for p < j): a tile of columns from j0
  // starts its chains at p = j0, skipping products with B's zeros. An fma
  // with a zero product leaves the sum as it is (a +0 sum stays +0), so the
  // doubles are those of the full chain.
  bool b_lower = false;
  // A lower triangular (A[i][p] == 0 for p > i): a block of rows up to i1
  // ends its chains at p = i1, skipping products with A's zeros (the same
  // doubles, as for b_lower).
  bool a_lower = false;
  // Lower triangle only: elements with j > i + diagonal need not be computed
  // (tiles wholly above that line are skipped; the ones crossing it may
  // write above it, so C's other triangle must be scratch there).
  bool lower = false;
  int64_t diagonal = 0;
};

// C -= A B (or +=) as described above, split into fixed tiles on `pool`
// (nullptr: the calling thread), with the kernels of `level`.
void gemm_f64(const GemmF64& g, SimdLevel level, ThreadPool* pool);

// The scalar reference: the same chains, element by element (only the lower
// triangle when `lower`).
void gemm_f64_ref(const GemmF64& g);

}  // namespace qf
