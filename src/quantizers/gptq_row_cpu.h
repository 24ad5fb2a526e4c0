// The CPU's vector version of GPTQ's row loop (quantizers/gptq_row.h,
// hd::gptq_row_block) for several rows at once, per SIMD level
// (core/simd.h): the same doubles as the scalar loop, each product and
// difference rounded apart.
#pragma once

#include <cstdint>

#include "core/simd.h"

namespace qf {

// Eight rows of GPTQ's block [i1, i2) at once (AVX-512; four at AVX2), each
// row run exactly as hd::gptq_row_block runs it: the same codes, the
// same errors, the same updated weights. Row k < n: w[k] its working
// weight (column i at w[k][i]), q[k] its codes (column i's at q[k][perm[i]]),
// err[k] its block of errors (column i's at err[k][i - i1]). Quantizer of
// row k for column i: scale[k][g] and zero[k][g] with g = perm[i] / gs when
// `per_group`, else scale[k][0] and zero[k][0]. The caller adds the errors'
// squares to the loss in row order (err holds them).
struct GptqRows {
  int n = 0;
  double* w[8];
  uint8_t* q[8];
  double* err[8];
  const float* scale[8];
  const int32_t* zero[8];
  bool per_group = false;
};
void gptq_rows_block(const GptqRows& rows, const double* U, int64_t ldu, int64_t i1, int64_t i2, const int64_t* perm,
                     int64_t gs, int32_t qmax, SimdLevel level);

// How many rows gptq_rows_block takes at `level` (0: none, run rows one by one).
int gptq_rows_width(SimdLevel level);

}  // namespace qf
