// One chunk of GPTQ's Hessian accumulation, H = keep * H + scale * X^T X, as
// a symmetric rank-m update of one triangle (half the work of a full GEMM),
// with kernels per SIMD level (core/simd.h) that give the scalar reference's
// doubles bit for bit.
//
// X holds one chunk of calibration activations (m <= 256 rows of f32, as the
// runtime produced them). Each element's chunk sum is formed in f32 by a
// chain of fused multiply-adds in row order r = 0, 1, ..., m-1 (vectors run
// across j, registers across i, never across r), then widened to double and
// added to H in double: h = keep * h + scale * s, the two products and the
// sum rounded separately (this file is built with FMA contraction off). The
// result does not depend on the SIMD level, the thread count or how rows
// are split into tasks. Why f32 inside a chunk and double across chunks, and
// what that costs in accuracy: docs/calibration.md, "The Hessian".
#pragma once

#include <cstdint>

#include "core/simd.h"

namespace qf {

// Rows [i0, i1) of the upper triangle (columns j >= i) of the row-major n x n
// matrix H: H[i][j] = keep * H[i][j] + scale * S[i][j], S[i][j] the f32 chain
// over r of X[r][i] * X[r][j], X row-major m x n (row stride ldx >= n).
// Elements left of the diagonal in those rows may be written too (with
// values of no meaning); mirror_upper() makes H exactly symmetric afterwards.
void hessian_update_rows(double* H, const float* X, int64_t m, int64_t n, int64_t ldx, double keep, double scale,
                         int64_t i0, int64_t i1, SimdLevel level);

// The scalar reference of hessian_update_rows.
void hessian_update_rows_ref(double* H, const float* X, int64_t m, int64_t n, int64_t ldx, double keep, double scale,
                             int64_t i0, int64_t i1);

// Copies the upper triangle onto the lower one: H[j][i] = H[i][j] for j > i.
void mirror_upper(double* H, int64_t n);

}  // namespace qf
