// The CPU's vector version of GPTQ's per-row update (quantizers/gptq_row.h,
// GptqRowUpdate) for contiguous rows, per SIMD level (core/simd.h): the same
// doubles as the scalar loop, each product and difference rounded apart.
#pragma once

#include <cstdint>

#include "core/simd.h"

namespace qf {

// w[j] += c * u[j] for j < n: the product rounded, then the sum.
void gptq_row_update(double* w, const double* u, double c, int64_t n, SimdLevel level);

}  // namespace qf
