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

namespace {

// Rows per tile: kRowTile, or fewer (a multiple of 12, which the AVX2 blocks'
// 3 rows and the AVX-512 blocks' 4 divide) where kRowTile would leave a
// thread fewer than kTilesPerThread tiles, as the key and value projections
// of grouped-query attention would (4 tiles of 256 rows). Each tile is one
// claim on the pool, so a thread that runs slower (a busy sibling, a lower
// clock) takes fewer tiles instead of holding the others up at the end.
// Rows are independent, so the tiling never changes a result.
int64_t row_tile_height(int64_t out, int threads) {
  constexpr int64_t kTilesPerThread = 8, kStep = 12;
  if (threads <= 1 || out >= kRowTile * kTilesPerThread * threads) return kRowTile;
  const int64_t want = kTilesPerThread * threads;
  const int64_t rows = (out + want - 1) / want;
  return std::min(kRowTile, std::max(kStep, (rows + kStep - 1) / kStep * kStep));
}

}  // namespace

void forward_row_gemm(int64_t n, float* y, int64_t out, const std::vector<float>& bias, ThreadPool& pool,
                      const RowGemmFn& gemm) {
  const int64_t height = row_tile_height(out, pool.size());
  const int64_t tiles = (out + height - 1) / height;
  pool.parallel_for(tiles, 1, [&](const Chunk& c) {
    for (int64_t t = c.begin; t < c.end; ++t) {
      const int64_t r0 = t * height, rows = std::min(height, out - r0);
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
