// Q8_K: the k-quants' activation type, 256 int8 codes with an f32 scale and
// the sums of each 16 codes (no dot of its own: it is what the others multiply).

#include "quantizers/kquant_impl.h"  // first: its pragma turns off FMA contraction for this file

#include <algorithm>
#include <cmath>
#include <cstring>


namespace qf::kquants::detail {

void quant_q8_k(const float* x, BlockQ8_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max = 0, amax = 0;
    for (int j = 0; j < QK_K; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (!amax) {
      std::memset(&y[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < QK_K; ++j) y[i].qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += y[i].qs[16 * j + l];
      y[i].bsums[j] = static_cast<int16_t>(sum);
    }
    y[i].d = 1 / iscale;
  }
}

}  // namespace qf::kquants::detail
