// A Linear run in bf16 (runtime/linear.h, make_bf16_linear): the weight
// decoded once and rounded to bf16, each forward's input rounded to bf16,
// the products summed in f32 (cpu/bf16_gemm.h).
#include <algorithm>

#include "core/error.h"
#include "runtime/cpu/bf16_gemm.h"
#include "runtime/linear.h"

namespace qf::rt {
namespace {

class Bf16Linear final : public Linear {
 public:
  explicit Bf16Linear(std::shared_ptr<const Linear> src)
      : Linear(src->in_features(), src->out_features()), src_(std::move(src)), kp_(bf16_padded(in_)),
        bias_(src_->bias_values()) {
    w_.resize(static_cast<size_t>(out_ * kp_));
    std::vector<float> row(static_cast<size_t>(in_));
    for (int64_t r = 0; r < out_; ++r) {
      src_->decode_row(r, row.data());
      to_bf16_row(row.data(), in_, w_.data() + r * kp_, kp_);
    }
  }

  void forward(const float* x, int64_t n, float* y, ThreadPool& pool) const override {
    thread_local std::vector<uint16_t> xb;
    xb.resize(static_cast<size_t>(n * kp_));
    uint16_t* xp = xb.data();
    pool.parallel_for(n, 64, [&](const Chunk& c) {
      for (int64_t t = c.begin; t < c.end; ++t) to_bf16_row(x + t * in_, in_, xp + t * kp_, kp_);
    });
    forward_row_gemm(n, y, out_, bias_, pool, [&](int64_t r0, int64_t rows) {
      gemm_tile_bf16(xp, n, w_.data() + r0 * kp_, rows, kp_, y + r0, out_);
    });
  }

  void decode_row(int64_t r, float* out) const override { src_->decode_row(r, out); }
  uint64_t weight_bytes() const override { return w_.size() * sizeof(uint16_t); }
  std::string format() const override { return "bf16 compute (" + src_->format() + ")"; }
  std::vector<float> bias_values() const override { return bias_; }
  bool quantized() const override { return src_->quantized(); }

 private:
  std::shared_ptr<const Linear> src_;
  int64_t kp_;
  std::vector<float> bias_;
  std::vector<uint16_t> w_;
};

}  // namespace

std::shared_ptr<Linear> make_bf16_linear(std::shared_ptr<const Linear> src) {
  if (!src) throw Error(ErrorKind::Internal, "make_bf16_linear: no Linear");
  if (src->input_quantizer())
    throw Error(ErrorKind::Internal, "make_bf16_linear: a Linear that quantizes its input runs as it is");
  return std::make_shared<Bf16Linear>(std::move(src));
}

}  // namespace qf::rt
