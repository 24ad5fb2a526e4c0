// The device decoder (runtime/device_runtime.h): a Model's layers on the
// device for one sequence, the same computation as Model::forward (the CPU
// runtime is the reference it is tested against), then the final norm and
// lm_head for the rows that want logits.
#include <algorithm>
#include <string>
#include <vector>

#include "core/read_rate.h"
#include "runtime/layer_engine_device.h"

namespace qf::QF_DEV_NS {

namespace {

using namespace layer_engine;

class Decoder final : public rt::DeviceDecoder {
 public:
  Decoder(const rt::Model& m, int64_t capacity, int64_t pass_tokens)
      : m_(m), c_(m.config()), capacity_(capacity), pass_tokens_(pass_tokens), engine_((check_capacity(c_, capacity, pass_tokens), m), capacity) {
    layers_.resize(static_cast<size_t>(c_.num_hidden_layers));
    for (int64_t li = 0; li < c_.num_hidden_layers; ++li) {
      DeviceLayer& d = layers_[static_cast<size_t>(li)];
      upload_layer(m, li, capacity, d);
      for (const DeviceLinear& l : d.lin) engine_.reserve_widened(l);
      attach_moe(engine_, d, moe_scratch_);
    }
    final_norm_ = upload_vec(m.weights().final_norm);
    lm_head_ = upload_linear(*m.weights().lm_head, "lm_head");
    engine_.reserve_widened(lm_head_);
  }

  int64_t capacity() const override { return capacity_; }
  int64_t position() const override { return pos_; }
  void reset() override { pos_ = 0; }

  void forward(const int32_t* tokens, int64_t n, const uint8_t* want, std::vector<float>& logits) override {
    if (n < 0 || n > capacity_ - pos_)
      throw invalid_input("device decoder", std::to_string(n) + " tokens at position " + std::to_string(pos_) +
                                                " exceed the capacity of " + std::to_string(capacity_) + " positions");
    check_tokens(c_, tokens, n);
    logits.clear();
    for (int64_t t0 = 0; t0 < n; t0 += pass_tokens_) {
      const int64_t m = std::min(pass_tokens_, n - t0);
      pass(tokens + t0, m, want + t0, logits);
    }
  }

  void collect_square_sums(bool lm_head) override {
    if (c_.is_moe())
      throw unsupported("device decoder", "the square sums of a mixture-of-experts model's experts are collected on the CPU only");
    sums_.clear();
    sums_.resize(layers_.size());
    for (Capture& c : sums_) c.what.square_sums = true;
    lm_head_sums_ = lm_head;
    lm_sq_.clear();
    lm_sq_rows_ = 0;
  }
  std::vector<double> square_sums(int64_t layer, rt::LayerInput input) const override {
    if (layer == -1) return lm_head_sums_ ? sums_of(lm_sq_, c_.hidden_size) : std::vector<double>{};
    if (layer < 0 || layer >= c_.num_hidden_layers || sums_.empty())
      throw invalid_input("device decoder", "no square sums of layer " + std::to_string(layer));
    return sums_of(sums_[static_cast<size_t>(layer)].sq[static_cast<int>(input)], input_cols(c_, input));
  }
  int64_t square_sum_tokens(int64_t layer) const override {
    if (layer == -1) return lm_sq_rows_;
    return sums_.empty() ? 0 : sums_.at(static_cast<size_t>(layer)).sq_rows;
  }

  std::vector<float> cached_k(int64_t layer) const override { return cached(layer, true); }
  std::vector<float> cached_v(int64_t layer) const override { return cached(layer, false); }

  uint64_t weight_bytes_per_token() const override {
    uint64_t b = lm_head_.bytes() + static_cast<uint64_t>(c_.hidden_size) * 4;  // + one embedding row
    for (const DeviceLayer& d : layers_) {
      for (const DeviceLinear& l : d.lin) b += l.bytes();
      if (d.moe) b += d.moe->bytes_per_token();  // the router, the shared expert, k experts of average size
    }
    return b + static_cast<uint64_t>(c_.hidden_size) * 4 * (2 * layers_.size() + 1);
  }
  uint64_t kv_bytes_per_token() const override {
    return static_cast<uint64_t>(c_.num_hidden_layers * c_.kv_dim()) * 2 * 4;
  }

 private:
  // Zeros before the first token.
  static std::vector<double> sums_of(const dvec<double>& v, int64_t cols) {
    return v.empty() ? std::vector<double>(static_cast<size_t>(cols), 0.0) : download(v);
  }

  std::vector<float> cached(int64_t layer, bool k) const {
    if (layer < 0 || layer >= c_.num_hidden_layers) throw invalid_input("device decoder", "no layer " + std::to_string(layer));
    const dvec<float>& c = k ? layers_[static_cast<size_t>(layer)].k_cache : layers_[static_cast<size_t>(layer)].v_cache;
    std::vector<float> out(static_cast<size_t>(pos_ * c_.kv_dim()));
    thrust::copy(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(out.size()), out.begin());
    return out;
  }

  void pass(const int32_t* tokens, int64_t n, const uint8_t* want, std::vector<float>& logits) {
    const int64_t h = c_.hidden_size;
    const float eps = static_cast<float>(c_.rms_norm_eps);
    std::vector<float> hx(static_cast<size_t>(n * h));
    for (int64_t t = 0; t < n; ++t) m_.weights().embed->decode_row(tokens[t], hx.data() + t * h);
    engine_.set_x(hx.data(), n);
    for (size_t li = 0; li < layers_.size(); ++li) engine_.layer(layers_[li], n, pos_, sums_.empty() ? nullptr : &sums_[li]);
    pos_ += n;
    // The rows that want logits: gathered, normed, then lm_head.
    std::vector<int64_t> rows;
    for (int64_t t = 0; t < n; ++t)
      if (want[t]) rows.push_back(t);
    if (rows.empty()) return;
    const int64_t m = static_cast<int64_t>(rows.size()), V = c_.vocab_size;
    const dvec<int64_t> drows = upload(rows.data(), m);
    for_each_index(m * h, GatherRows{engine_.x(), raw(drows), engine_.xn(), h});
    rms_norm(m, RmsNormRows{engine_.xn(), raw(final_norm_), engine_.xn(), h, eps}, engine_.norm_scratch());
    if (lm_head_sums_) {
      if (lm_sq_.empty()) lm_sq_.assign(static_cast<size_t>(h), 0.0);
      for_each_index(h, ColumnSquareSums{engine_.xn(), raw(lm_sq_), m, h});
      lm_sq_rows_ += m;
    }
    dvec<float> out(static_cast<size_t>(m * V));
    engine_.linear(lm_head_, engine_.xn(), m, raw(out));
    const size_t at = logits.size();
    logits.resize(at + static_cast<size_t>(m * V));
    thrust::copy(out.begin(), out.end(), logits.begin() + static_cast<std::ptrdiff_t>(at));
  }

  const rt::Model& m_;
  const ModelConfig& c_;
  int64_t capacity_, pass_tokens_, pos_ = 0;
  LayerEngine engine_;
  std::vector<DeviceLayer> layers_;
  std::shared_ptr<MoeScratch> moe_scratch_ = std::make_shared<MoeScratch>();  // the sparse layers' buffers
  dvec<float> final_norm_;
  DeviceLinear lm_head_;
  std::vector<Capture> sums_;  // per layer, while collecting square sums
  bool lm_head_sums_ = false;
  dvec<double> lm_sq_;
  int64_t lm_sq_rows_ = 0;
};

}  // namespace

std::unique_ptr<rt::DeviceDecoder> make_decoder(const rt::Model& model, int64_t capacity, int64_t pass_tokens) {
  return std::make_unique<Decoder>(model, capacity, pass_tokens);
}

namespace {
struct Itself {
  QF_HD float operator()(float x) const { return x; }
};
}  // namespace

double read_bandwidth(uint64_t bytes) {
  bytes = probe_bytes(bytes);
  const int64_t n = static_cast<int64_t>(bytes / 4);
  dvec<float> buf(static_cast<size_t>(n), 1.0f);
  float check = 0.0f;
  const double best =
      best_read_rate(bytes, [&] { check += transform_reduce_n(raw(buf), n, Itself{}, 0.0f, SumOf{}); });
  // The sums are used (and checked), so no pass can be dropped.
  if (!(check > 0.0f)) throw Error(ErrorKind::Internal, "device read bandwidth: the buffer's sum is wrong");
  return best;
}

}  // namespace qf::QF_DEV_NS
