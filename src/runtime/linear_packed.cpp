// Linear over integer weight groups (W4A16, W8A16, ...): codes packed densely,
// LSB first, along each row (compressed-tensors' pack-quantized layout), with
// per-group scales and zero points. A tile of rows is decoded to f32 inside
// the kernel and multiplied against the batch; activations stay in f32.
#include <algorithm>

#include "core/error.h"
#include "checkpoint/pack.h"
#include "runtime/cpu/kernels.h"
#include "runtime/linear.h"

namespace qf::rt {
namespace {

class PackedLinear final : public Linear {
 public:
  PackedLinear(const QuantizedTensor& q, std::vector<float> bias)
      : Linear(q.cols, q.rows), bits_(q.scheme.bits), strategy_(q.scheme.strategy), group_size_(q.scheme.group_size),
        groups_(q.n_groups()), words_(static_cast<int64_t>((q.cols * q.scheme.bits + 31) / 32)), scales_(q.scales),
        zeros_(q.zeros), g_idx_(q.g_idx), bias_(std::move(bias)), format_(q.scheme.describe()) {
    // compressed-tensors' weight_packed layout, as the exporter writes it.
    const std::vector<int32_t> words = pack_int32_rows(q.q.data(), q.rows, q.cols, q.scheme.bits);
    packed_.assign(words.begin(), words.end());
  }

  void forward(const float* x, int64_t n, float* y, ThreadPool& pool) const override {
    forward_row_tiles(x, n, y, in_, out_, bias_, pool, [&](int64_t r0, int64_t rows, float* buf) -> const float* {
      for (int64_t r = 0; r < rows; ++r) decode_row(r0 + r, buf + r * in_);
      return buf;
    });
  }

  void decode_row(int64_t r, float* out) const override {
    const uint32_t* w = packed_.data() + r * words_;
    const int64_t pbase = strategy_ == QuantStrategy::Tensor ? 0 : r * groups_;
    if (bits_ == 4 && g_idx_.empty() && strategy_ == QuantStrategy::Group && group_size_ % 8 == 0) {
      for (int64_t g = 0; g < groups_; ++g) {
        const float s = scales_[static_cast<size_t>(pbase + g)];
        const float z = static_cast<float>(zeros_[static_cast<size_t>(pbase + g)]);
        for (int64_t c = g * group_size_; c < (g + 1) * group_size_; c += 8) {
          const uint32_t word = w[c / 8];
          for (int j = 0; j < 8; ++j) out[c + j] = (static_cast<float>((word >> (4 * j)) & 15u) - z) * s;
        }
      }
      return;
    }
    const uint32_t mask = (1u << bits_) - 1u;
    for (int64_t c = 0; c < in_; ++c) {
      const uint64_t bit = static_cast<uint64_t>(c) * static_cast<uint64_t>(bits_);
      uint32_t v = w[bit / 32] >> (bit % 32);
      if (bit % 32 + static_cast<uint64_t>(bits_) > 32) v |= w[bit / 32 + 1] << (32 - bit % 32);
      v &= mask;
      const int64_t g = strategy_ != QuantStrategy::Group ? 0 : g_idx_.empty() ? c / group_size_ : g_idx_[static_cast<size_t>(c)];
      const size_t p = static_cast<size_t>(pbase + g);
      out[c] = static_cast<float>(static_cast<int32_t>(v) - zeros_[p]) * scales_[p];
    }
  }

  uint64_t weight_bytes() const override {
    // What the kernel reads: packed codes, f32 scales, int32 zero points, g_idx.
    return (packed_.size() + scales_.size() + zeros_.size() + g_idx_.size()) * 4;
  }
  std::vector<float> bias_values() const override { return bias_; }
  std::string format() const override { return format_; }
  bool quantized() const override { return true; }
  DeviceWeightForm device_form() const override {
    DeviceWeightForm f;
    f.kind = DeviceWeightForm::Kind::PackedInt;
    f.bits = bits_, f.strategy = strategy_, f.group_size = group_size_, f.groups = groups_, f.words_per_row = words_;
    f.packed = packed_.data(), f.scales = scales_.data(), f.zeros = zeros_.data();
    f.g_idx = g_idx_.empty() ? nullptr : g_idx_.data();
    f.n_scales = scales_.size();
    return f;
  }

 private:
  int bits_;
  QuantStrategy strategy_;
  int64_t group_size_, groups_, words_;
  std::vector<uint32_t> packed_;
  std::vector<float> scales_;
  std::vector<int32_t> zeros_;
  std::vector<int32_t> g_idx_;
  std::vector<float> bias_;
  std::string format_;
};

}  // namespace

std::unique_ptr<Linear> make_packed_linear(const QuantizedTensor& q, const Tensor* bias, const std::string& name) {
  q.validate(name);
  std::vector<float> b;
  if (bias) {
    if (bias->numel() != q.rows)
      throw invalid_input(name, "bias has " + std::to_string(bias->numel()) + " values for " + std::to_string(q.rows) + " rows");
    b = bias->to_f32_vector();
  }
  return std::make_unique<PackedLinear>(q, std::move(b));
}

}  // namespace qf::rt
