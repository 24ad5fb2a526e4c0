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

void for_each_row_tile(int64_t out, ThreadPool& pool, const std::function<void(int64_t r0, int64_t rows)>& fn) {
  const int64_t tiles = (out + kRowTile - 1) / kRowTile;
  pool.parallel_for(tiles, std::max<int64_t>(1, tiles / (4 * pool.size())), [&](const Chunk& c) {
    for (int64_t t = c.begin; t < c.end; ++t) fn(t * kRowTile, std::min(kRowTile, out - t * kRowTile));
  });
}

void add_tile_bias(float* y, int64_t n, int64_t out, int64_t r0, int64_t rows, const std::vector<float>& bias) {
  if (bias.empty()) return;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < rows; ++r) y[i * out + r0 + r] += bias[static_cast<size_t>(r0 + r)];
}

void forward_row_tiles(const float* x, int64_t n, float* y, int64_t in, int64_t out, const std::vector<float>& bias,
                       ThreadPool& pool, const RowTileFn& tile) {
  for_each_row_tile(out, pool, [&](int64_t r0, int64_t rows) {
    thread_local std::vector<float> buf;
    buf.resize(static_cast<size_t>(kRowTile * in));
    gemm_tile_f32(x, n, in, tile(r0, rows, buf.data()), rows, in, y + r0, out);
    add_tile_bias(y, n, out, r0, rows, bias);
  });
}

}  // namespace qf::rt
