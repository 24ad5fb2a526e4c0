// One chunk of GPTQ's Hessian accumulation, H = keep * H + scale * X^T X, as
// a symmetric rank-m update of one triangle (half the work of a full GEMM),
// with kernels per SIMD level (core/simd.h) that give the scalar reference's
// doubles bit for bit.
//
// X holds calibration activations (f32) widened to double, so each product
// x_ri * x_rj is exact (24 + 24 significant bits fit in 53); each element of
// H sums its m products in row order r = 0, 1, ..., m-1 with one rounding per
// addition, the same at every level (vectors run across j, never across r,
// and no multiply-add is fused: this file's kernels are built with FMA
// contraction off). The result therefore does not depend on the SIMD level,
// the thread count or how rows are split into tasks.
#pragma once

#include <cstdint>

#include "core/simd.h"

namespace qf {

// Rows [i0, i1) of the upper triangle (columns j >= i) of the row-major n x n
// matrix H: H[i][j] = keep * H[i][j] + scale * sum_r X[r][i] * X[r][j], X
// row-major m x n. Elements left of the diagonal in those rows may be
// written too (with the value of their mirror image); mirror_upper() makes H
// exactly symmetric afterwards.
void hessian_update_rows(double* H, const double* X, int64_t m, int64_t n, double keep, double scale, int64_t i0,
                         int64_t i1, SimdLevel level);

// The scalar reference of hessian_update_rows.
void hessian_update_rows_ref(double* H, const double* X, int64_t m, int64_t n, double keep, double scale, int64_t i0,
                             int64_t i1);

// Copies the upper triangle onto the lower one: H[j][i] = H[i][j] for j > i.
void mirror_upper(double* H, int64_t n);

}  // namespace qf
