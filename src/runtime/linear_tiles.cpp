// The forward loop shared by every Linear: tiles of rows spread over the
// pool, each multiplied against the whole batch while it is in cache, either
// by a kernel reading the rows as stored (forward_row_gemm) or decoded once
// to f32 (forward_row_tiles).
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

void forward_row_gemm(int64_t n, float* y, int64_t out, const std::vector<float>& bias, ThreadPool& pool,
                      const RowGemmFn& gemm) {
  const int64_t tiles = (out + kRowTile - 1) / kRowTile;
  pool.parallel_for(tiles, std::max<int64_t>(1, tiles / (4 * pool.size())), [&](const Chunk& c) {
    for (int64_t t = c.begin; t < c.end; ++t) {
      const int64_t r0 = t * kRowTile, rows = std::min(kRowTile, out - r0);
      gemm(r0, rows);
      if (!bias.empty())
        for (int64_t i = 0; i < n; ++i)
          for (int64_t r = 0; r < rows; ++r) y[i * out + r0 + r] += bias[static_cast<size_t>(r0 + r)];
    }
  });
}

void forward_row_tiles(const float* x, int64_t n, float* y, int64_t in, int64_t out, const std::vector<float>& bias,
                       ThreadPool& pool, const RowTileFn& tile) {
  forward_row_gemm(n, y, out, bias, pool, [&](int64_t r0, int64_t rows) {
    thread_local std::vector<float> buf;
    buf.resize(static_cast<size_t>(kRowTile * in));
    gemm_tile_f32(x, n, in, tile(r0, rows, buf.data()), rows, in, y + r0, out);
  });
}

}  // namespace qf::rt
