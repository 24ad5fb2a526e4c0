// linear_forward: y = x W^T + b as fixed tiles of tokens x output rows, each
// one call of the runtime's register-blocked gemm_tile_f32 (cpu/kernels.h),
// spread over the pool. A vision tower runs thousands of patches through
// each Linear at once, so tiling the tokens too keeps a tile's inputs and
// weights in cache instead of streaming every patch once per row tile.
#include <algorithm>
#include <vector>

#include "runtime/cpu/kernels.h"
#include "runtime/vision/vision_ops.h"

namespace qf::rt::vision {

void linear_forward(const DenseLinear& l, const float* x, int64_t n, float* y, ThreadPool& pool) {
  std::vector<float> xq;
  if (l.act) {  // the input as the quantized Linear sees it
    xq.assign(x, x + n * l.in);
    quantize_activations(*l.act, xq.data(), n, l.in);
    x = xq.data();
  }
  constexpr int64_t kTokens = 96, kRows = 64;  // 96 = 16 blocks of 6 (AVX-512), 24 of 4 (AVX2)
  const int64_t token_tiles = (n + kTokens - 1) / kTokens, row_tiles = (l.out + kRows - 1) / kRows;
  pool.parallel_for(token_tiles * row_tiles, 1, [&](const Chunk& c) {
    for (int64_t t = c.begin; t < c.end; ++t) {
      const int64_t t0 = (t / row_tiles) * kTokens, r0 = (t % row_tiles) * kRows;
      const int64_t tokens = std::min(kTokens, n - t0), rows = std::min(kRows, l.out - r0);
      float* yt = y + t0 * l.out + r0;
      gemm_tile_f32(x + t0 * l.in, tokens, l.in, l.w.data() + r0 * l.in, rows, l.in, yt, l.out);
      if (!l.b.empty())
        for (int64_t i = 0; i < tokens; ++i)
          for (int64_t r = 0; r < rows; ++r) yt[i * l.out + r] += l.b[static_cast<size_t>(r0 + r)];
    }
  });
}

}  // namespace qf::rt::vision
