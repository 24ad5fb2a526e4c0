// GPTQ's inner loop for one weight row over one block of columns: the CPU
// reference's (gptq.cpp: rows contiguous). The device version
// (gptq_device.cpp: QuantColumn, UpdateBlock) runs the same arithmetic
// column by column, spread over rows x columns. The products are never
// fused, so both form the same doubles.
#pragma once

#include <cstdint>

#include "core/hd.h"
#include "quantizers/int_quant.h"

namespace qf::hd {

// Where column i's quantizer comes from: `fixed` (channel, tensor, or the
// current dynamic group), or, when `scales` is set, static groups: this
// row's scales/zeros of group perm[i] / gs.
struct GptqRowQuantizer {
  GroupParams fixed;
  const float* scales;
  const int32_t* zeros;
  const int64_t* perm;
  int64_t gs;
  int32_t qmax;
};

// Columns [i1, i2) of one row, in processing order: w[i * ws] the working
// weight (updated in place), U + i * ldu row i of Hinv (the upper Cholesky
// factor of H^-1), err[(i - i1) * es] receives (w - q) / Hinv[i, i], codes
// go to q[perm[i]] (the original column), *loss += err^2.
QF_HD inline void gptq_row_block(double* w, int64_t ws, uint8_t* q, const double* U, int64_t ldu, double* err,
                                 int64_t es, int64_t i1, int64_t i2, const GptqRowQuantizer& rq, double* loss) {
  for (int64_t i = i1; i < i2; ++i) {
    GroupParams p = rq.fixed;
    if (rq.scales) {
      const int64_t g = rq.perm[i] / rq.gs;
      p = GroupParams{rq.scales[g], rq.zeros[g]};
    }
    const double x = w[i * ws];
    const uint8_t code = quantize_int(static_cast<float>(x), p.scale, p.zero, rq.qmax);
    q[rq.perm[i]] = code;
    const double qd = dequantize_int(code, p.scale, p.zero);
    const double* urow = U + i * ldu;
    const double e = (x - qd) / urow[i];
    *loss = mul_add_unfused(e, e, *loss);
    err[(i - i1) * es] = e;
    for (int64_t j = i + 1; j < i2; ++j) w[j * ws] = mul_add_unfused(-e, urow[j], w[j * ws]);  // w - e u, exactly
  }
}

}  // namespace qf::hd
