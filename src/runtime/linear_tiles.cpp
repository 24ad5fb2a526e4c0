// The forward loop shared by every Linear that decodes its weights to f32:
// tiles of rows spread over the pool, each tile decoded once and multiplied
// against the whole batch while it is in cache.
#include <algorithm>

#include "runtime/cpu/kernels.h"
#include "runtime/linear.h"

namespace qf::rt {

std::optional<Tensor> bias_tensor(const std::vector<float>& bias) {
  if (bias.empty()) return std::nullopt;
  return Tensor::from_f32(bias, {static_cast<int64_t>(bias.size())});
}

std::vector<float> Linear::decode_all() const {
  std::vector<float> w(static_cast<size_t>(out_ * in_));
  for (int64_t r = 0; r < out_; ++r) decode_row(r, w.data() + r * in_);
  return w;
}

void forward_row_tiles(const float* x, int64_t n, float* y, int64_t in, int64_t out, const std::vector<float>& bias,
                       ThreadPool& pool, const RowTileFn& tile) {
  const int64_t tiles = (out + kRowTile - 1) / kRowTile;
  pool.parallel_for(tiles, std::max<int64_t>(1, tiles / (4 * pool.size())), [&](const Chunk& c) {
    thread_local std::vector<float> buf;
    buf.resize(static_cast<size_t>(kRowTile * in));
    for (int64_t t = c.begin; t < c.end; ++t) {
      const int64_t r0 = t * kRowTile, rows = std::min(kRowTile, out - r0);
      const float* w = tile(r0, rows, buf.data());
      float* yt = y + r0;
      gemm_tile_f32(x, n, in, w, rows, in, yt, out);
      if (!bias.empty())
        for (int64_t i = 0; i < n; ++i)
          for (int64_t r = 0; r < rows; ++r) yt[i * out + r] += bias[static_cast<size_t>(r0 + r)];
    }
  });
}

}  // namespace qf::rt
