// Dense float Linear: f16 rows go to the GEMM as they are (converted in
// registers), bf16 rows are converted to f32 a tile at a time
// (forward_row_tiles), f32 weights are used in place.
#include <algorithm>

#include "core/error.h"
#include "core/io.h"
#include "runtime/cpu/kernels.h"
#include "runtime/linear.h"

namespace qf::rt {
namespace {

class DenseLinear final : public Linear {
 public:
  DenseLinear(const Tensor& w, std::vector<float> bias)
      : Linear(w.dim(1), w.dim(0)), w_(w), bias_(std::move(bias)), row_bytes_(in_ * dtype_size(w.dtype())) {}

  void forward(const float* x, int64_t n, float* y, ThreadPool& pool) const override {
    const char* base = static_cast<const char*>(w_.data());
    if (w_.dtype() == DType::F16) {
      // f16 rows are converted in registers by the GEMM blocks (and by the
      // per-token dots of decode), with half the bytes read: the floats of
      // converting them first, except at AVX2 (two accumulators per sum).
      const auto* w16 = reinterpret_cast<const uint16_t*>(base);
      forward_row_gemm(n, y, out_, bias_, pool, [&](int64_t r0, int64_t rows) {
        gemm_tile_f16(x, n, in_, w16 + r0 * in_, rows, in_, y + r0, out_);
      });
      return;
    }
    forward_row_tiles(x, n, y, in_, out_, bias_, pool, [&](int64_t r0, int64_t rows, float* buf) -> const float* {
      if (w_.dtype() == DType::F32) return reinterpret_cast<const float*>(base + r0 * row_bytes_);
      row_to_f32(w_.dtype(), base + r0 * row_bytes_, buf, rows * in_);
      return buf;
    });
  }

  void decode_row(int64_t r, float* out) const override {
    row_to_f32(w_.dtype(), static_cast<const char*>(w_.data()) + r * row_bytes_, out, in_);
  }

  uint64_t weight_bytes() const override { return static_cast<uint64_t>(w_.nbytes()); }
  void release_pages() const override { release_mapped_pages(w_.data(), static_cast<size_t>(w_.nbytes())); }
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
