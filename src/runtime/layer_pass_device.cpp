// The calibration layer pass (runtime/device_runtime.h): one decoder layer
// on the device, run on one calibration sequence at a time, measuring its
// Linear inputs (Hessians, ranges) and K/V when asked; in a sparse layer it
// keeps the MLP input and routing, and measures one expert at a time
// (moe_device.h).
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/layer_engine_device.h"

namespace qf::QF_DEV_NS {

namespace {

using namespace layer_engine;

class LayerPass final : public rt::DeviceLayerPass {
 public:
  LayerPass(const rt::Model& m, int64_t capacity, int64_t pass_tokens, bool bf16)
      : m_(m), c_(m.config()), capacity_(capacity), pass_tokens_(pass_tokens),
        engine_((check_capacity(c_, capacity, pass_tokens), m), capacity, bf16) {}

  void load(int64_t layer) override {
    if (layer < 0 || layer >= c_.num_hidden_layers) throw invalid_input("device layer pass", "no layer " + std::to_string(layer));
    loaded_ = false;
    upload_layer(m_, layer, capacity_, layer_);
    for (const DeviceLinear& l : layer_.lin) engine_.reserve_widened(l);
    attach_moe(engine_, layer_, moe_scratch_);
    loaded_ = true;
  }

  void begin_capture(const rt::LayerCapture& what) override {
    cap_ = Capture{};
    cap_.what = what;
    // A sparse layer's MLP inputs are measured per expert (begin_expert).
    const int inputs = layer_.moe ? 2 : 4;
    if (what.hessians)
      for (int i = 0; i < inputs; ++i) cap_.h[i] = std::make_unique<HessianSum>(input_cols(c_, static_cast<rt::LayerInput>(i)));
    moe_scratch_->kept_x.clear(), moe_scratch_->kept_choice.clear();
    capturing_ = true;
  }
  void end_capture() override { capturing_ = false; }

  rt::MoeInputs take_moe_inputs() override {
    rt::MoeInputs r;
    r.x.swap(moe_scratch_->kept_x), r.experts.swap(moe_scratch_->kept_choice);
    return r;
  }

  void begin_expert(int64_t expert, const rt::LayerCapture& what) override {
    if (!loaded_ || !layer_.moe) throw Error(ErrorKind::Internal, "device layer pass: begin_expert without a sparse layer loaded");
    const DeviceExpert& ex = layer_.moe->expert(expert);
    cap_ = Capture{};
    cap_.what = rt::LayerCapture{what.hessians, what.ranges};
    if (what.hessians) {
      cap_.h[static_cast<int>(rt::LayerInput::Mlp)] = std::make_unique<HessianSum>(ex.gate.in);
      cap_.h[static_cast<int>(rt::LayerInput::Down)] = std::make_unique<HessianSum>(ex.gate.out);
    }
    expert_ = expert;
    capturing_ = false;
  }
  void run_expert(const float* x, int64_t n) override {
    if (!loaded_ || !layer_.moe || expert_ == rt::kNoExpert)
      throw Error(ErrorKind::Internal, "device layer pass: run_expert before begin_expert");
    if (n <= 0) return;
    assign(expert_x_, x, n * c_.hidden_size);
    expert_inputs(engine_, *layer_.moe, expert_, raw(expert_x_), n, pass_tokens_, cap_);
  }

  void run(float* x, int64_t n, bool write_back) override {
    if (!loaded_) throw Error(ErrorKind::Internal, "device layer pass: run before load");
    if (n <= 0 || n > capacity_)
      throw invalid_input("device layer pass", std::to_string(n) + " tokens for a capacity of " + std::to_string(capacity_));
    const int64_t h = c_.hidden_size;
    route_only(write_back);
    for (int64_t t0 = 0; t0 < n; t0 += pass_tokens_) {
      const int64_t m = std::min(pass_tokens_, n - t0);
      engine_.set_x(x + t0 * h, m);
      engine_.layer(layer_, m, t0, capturing_ ? &cap_ : nullptr);
      if (write_back) engine_.get_x(x + t0 * h, m);
    }
  }

  void make_resident(const std::vector<int64_t>& lengths) override {
    offsets_.clear();
    int64_t n = 0;
    for (int64_t len : lengths) {
      if (len <= 0 || len > capacity_)
        throw invalid_input("device layer pass", "a sequence of " + std::to_string(len) + " tokens for a capacity of " +
                                                     std::to_string(capacity_));
      offsets_.push_back(n);
      n += len;
    }
    lengths_ = lengths;
    hidden_.resize(static_cast<size_t>(n * c_.hidden_size));
  }
  void store_resident(size_t s, const float* x) override {
    const int64_t h = c_.hidden_size;
    thrust::copy(x, x + resident_length(s) * h, hidden_.begin() + static_cast<std::ptrdiff_t>(offsets_[s] * h));
  }
  std::vector<float> load_resident(size_t s) const override {
    const int64_t h = c_.hidden_size;
    std::vector<float> x(static_cast<size_t>(resident_length(s) * h));
    const auto from = hidden_.begin() + static_cast<std::ptrdiff_t>(offsets_[s] * h);
    thrust::copy(from, from + static_cast<std::ptrdiff_t>(x.size()), x.begin());
    return x;
  }
  void run_resident(size_t s, bool write_back) override {
    if (!loaded_) throw Error(ErrorKind::Internal, "device layer pass: run before load");
    const int64_t h = c_.hidden_size, n = resident_length(s);
    float* x = raw(hidden_) + offsets_[s] * h;
    route_only(write_back);
    for (int64_t t0 = 0; t0 < n; t0 += pass_tokens_) {
      const int64_t m = std::min(pass_tokens_, n - t0);
      engine_.set_x_device(x + t0 * h, m);
      engine_.layer(layer_, m, t0, capturing_ ? &cap_ : nullptr);
      if (write_back)
        thrust::copy(thrust::device_pointer_cast(engine_.x()), thrust::device_pointer_cast(engine_.x()) + m * h,
                     thrust::device_pointer_cast(x + t0 * h));
    }
  }

  int64_t captured_rows(rt::LayerInput i) const override {
    const auto& h = cap_.h[static_cast<int>(i)];
    return h ? h->samples() : 0;
  }
  std::vector<double> hessian(rt::LayerInput i) const override {
    const auto& h = cap_.h[static_cast<int>(i)];
    if (!h) throw Error(ErrorKind::Internal, "device layer pass: no Hessians were captured");
    return h->matrix();
  }
  std::pair<float, float> range(rt::LayerInput i) const override {
    const Range r = cap_.range[static_cast<int>(i)];
    return {r.lo, r.hi};
  }
  std::pair<float, float> kv_amax() const override { return {cap_.k_amax, cap_.v_amax}; }

 private:
  const rt::Model& m_;
  const ModelConfig& c_;
  int64_t capacity_, pass_tokens_;
  LayerEngine engine_;
  DeviceLayer layer_;
  bool loaded_ = false, capturing_ = false;
  Capture cap_;
  std::vector<int64_t> lengths_, offsets_;  // the resident sequences
  dvec<float> hidden_;
  std::shared_ptr<MoeScratch> moe_scratch_ = std::make_shared<MoeScratch>();
  int64_t expert_ = rt::kNoExpert;  // the expert begin_expert chose
  dvec<float> expert_x_;            // its rows

  // A run that only keeps a sparse layer's MLP inputs and routing needs no
  // expert: its output is not kept.
  void route_only(bool write_back) {
    moe_scratch_->route_only = capturing_ && cap_.what.moe_inputs && !write_back;
    expert_ = rt::kNoExpert;
  }

  int64_t resident_length(size_t s) const {
    if (s >= lengths_.size()) throw Error(ErrorKind::Internal, "device layer pass: no resident sequence " + std::to_string(s));
    return lengths_[s];
  }
};

}  // namespace

std::unique_ptr<rt::DeviceLayerPass> make_layer_pass(const rt::Model& model, int64_t capacity, int64_t pass_tokens,
                                                     bool bf16) {
  return std::make_unique<LayerPass>(model, capacity, pass_tokens, bf16);
}

}  // namespace qf::QF_DEV_NS
