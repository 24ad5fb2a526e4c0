// make_quantized_linear: any QuantizedTensor with an optional input quantizer.
// Reference path: the weight is decoded a tile of rows at a time
// (QuantizedTensor::dequantize_row) and the activations are fake-quantized
// before the f32 GEMM.
#include <algorithm>
#include <optional>

#include "core/error.h"
#include "runtime/linear.h"

namespace qf::rt {
namespace {

class QuantizedLinear final : public Linear {
 public:
  QuantizedLinear(QuantizedTensor q, std::optional<ActQuantParams> act, std::vector<float> bias)
      : Linear(q.cols, q.rows), q_(std::move(q)), act_(std::move(act)), bias_(std::move(bias)) {}

  void forward(const float* x, int64_t n, float* y, ThreadPool& pool) const override {
    const float* xin = x;
    std::vector<float> xq;
    if (act_) {
      xq.assign(x, x + n * in_);
      quantize_activations(*act_, xq.data(), n, in_);
      xin = xq.data();
    }
    forward_row_tiles(xin, n, y, in_, out_, bias_, pool, [&](int64_t r0, int64_t rows, float* buf) -> const float* {
      for (int64_t r = 0; r < rows; ++r) q_.dequantize_row(r0 + r, buf + r * in_);
      return buf;
    });
  }
  void decode_row(int64_t r, float* out) const override { q_.dequantize_row(r, out); }
  uint64_t weight_bytes() const override {
    return static_cast<uint64_t>(q_.rows * q_.cols * q_.scheme.bits / 8) + q_.scales.size() * 4 + q_.zeros.size() * 4;
  }
  std::vector<float> bias_values() const override { return bias_; }
  std::string format() const override { return q_.scheme.describe() + (act_ ? " / " + act_->scheme.describe() : ""); }

 private:
  QuantizedTensor q_;
  std::optional<ActQuantParams> act_;
  std::vector<float> bias_;
};

}  // namespace

std::unique_ptr<Linear> make_quantized_linear(const QuantizedTensor& q, const ActQuantParams* act, const Tensor* bias,
                                              const std::string& name) {
  q.validate(name);
  if (act) act->scheme.validate(name);
  if (!act && !q.scheme.is_float()) return make_packed_linear(q, bias, name);
  std::vector<float> b;
  if (bias) {
    if (bias->numel() != q.rows)
      throw invalid_input(name, "bias has " + std::to_string(bias->numel()) + " values for " + std::to_string(q.rows) + " rows");
    b = bias->to_f32_vector();
  }
  return std::make_unique<QuantizedLinear>(q, act ? std::optional<ActQuantParams>(*act) : std::nullopt, std::move(b));
}

}  // namespace qf::rt
