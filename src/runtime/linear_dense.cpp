// Dense float Linear: rows are converted to f32 a tile at a time inside the
// kernel and every token of the batch is multiplied against the tile while it
// sits in cache.
#include <algorithm>

#include "core/error.h"
#include "runtime/cpu/kernels.h"
#include "runtime/linear.h"

namespace qf::rt {
namespace {

constexpr int64_t kTileRows = 16;

class DenseLinear final : public Linear {
 public:
  DenseLinear(const Tensor& w, std::vector<float> bias)
      : Linear(w.dim(1), w.dim(0)), w_(w), bias_(std::move(bias)), row_bytes_(in_ * dtype_size(w.dtype())) {}

  void forward(const float* x, int64_t n, float* y, ThreadPool& pool) const override {
    const int64_t tiles = (out_ + kTileRows - 1) / kTileRows;
    const char* base = static_cast<const char*>(w_.data());
    const int64_t grain = std::max<int64_t>(1, tiles / (4 * pool.size()));
    pool.parallel_for(tiles, grain, [&](const Chunk& c) {
      thread_local std::vector<float> buf;
      for (int64_t t = c.begin; t < c.end; ++t) {
        const int64_t r0 = t * kTileRows;
        const int64_t rows = std::min(kTileRows, out_ - r0);
        const float* w;
        if (w_.dtype() == DType::F32) {
          w = reinterpret_cast<const float*>(base + r0 * row_bytes_);
        } else {
          buf.resize(static_cast<size_t>(kTileRows * in_));
          row_to_f32(w_.dtype(), base + r0 * row_bytes_, buf.data(), rows * in_);
          w = buf.data();
        }
        float* yt = y + r0;
        gemm_tile_f32(x, n, in_, w, rows, in_, yt, out_);
        if (!bias_.empty())
          for (int64_t i = 0; i < n; ++i)
            for (int64_t r = 0; r < rows; ++r) yt[i * out_ + r] += bias_[static_cast<size_t>(r0 + r)];
      }
    });
  }

  void decode_row(int64_t r, float* out) const override {
    row_to_f32(w_.dtype(), static_cast<const char*>(w_.data()) + r * row_bytes_, out, in_);
  }

  uint64_t weight_bytes() const override { return static_cast<uint64_t>(w_.nbytes()); }
  std::vector<float> bias_values() const override { return bias_; }
  std::string format() const override { return dtype_name(w_.dtype()); }

 private:
  Tensor w_;
  std::vector<float> bias_;
  int64_t row_bytes_;
};

}  // namespace

std::unique_ptr<Linear> make_dense_linear(const Tensor& weight, const Tensor* bias, const std::string& name) {
  if (weight.ndim() != 2)
    throw invalid_input(name, "a Linear weight must be 2-D, got " + shape_str(weight.shape()));
  DType t = weight.dtype();
  if (t != DType::F32 && t != DType::F16 && t != DType::BF16)
    throw unsupported(name, std::string("dense weights must be f32, f16 or bf16, got ") + dtype_name(t));
  std::vector<float> b;
  if (bias) {
    std::string bias_name = name;
    if (bias_name.size() > 7 && bias_name.compare(bias_name.size() - 7, 7, ".weight") == 0)
      bias_name.replace(bias_name.size() - 7, 7, ".bias");
    if (bias->ndim() != 1 || bias->dim(0) != weight.dim(0))
      throw invalid_input(bias_name, "bias shape " + shape_str(bias->shape()) + " does not match weight " +
                                    shape_str(weight.shape()));
    b = bias->to_f32_vector();
  }
  return std::make_unique<DenseLinear>(weight, std::move(b));
}

}  // namespace qf::rt
