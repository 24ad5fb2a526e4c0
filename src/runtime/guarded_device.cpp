#include "runtime/guarded_device.h"

#include <string>
#include <utility>
#include <vector>

namespace qf::rt {

namespace {

class GuardedDecoder final : public DeviceDecoder {
 public:
  GuardedDecoder(device::Kind k, std::unique_ptr<DeviceDecoder> d) : k_(k), d_(std::move(d)) {}
  int64_t capacity() const override { return d_->capacity(); }
  int64_t position() const override { return d_->position(); }
  void reset() override { d_->reset(); }
  void forward(const int32_t* tokens, int64_t n, const uint8_t* want, std::vector<float>& logits) override {
    guarded_call(k_, [&] { d_->forward(tokens, n, want, logits); });
  }
  std::vector<float> cached_k(int64_t layer) const override { return guarded_call(k_, [&] { return d_->cached_k(layer); }); }
  std::vector<float> cached_v(int64_t layer) const override { return guarded_call(k_, [&] { return d_->cached_v(layer); }); }
  void collect_square_sums(bool lm_head) override { guarded_call(k_, [&] { d_->collect_square_sums(lm_head); }); }
  std::vector<double> square_sums(int64_t layer, LayerInput input) const override {
    return guarded_call(k_, [&] { return d_->square_sums(layer, input); });
  }
  int64_t square_sum_tokens(int64_t layer) const override { return d_->square_sum_tokens(layer); }
  uint64_t weight_bytes_per_token() const override { return d_->weight_bytes_per_token(); }
  uint64_t kv_bytes_per_token() const override { return d_->kv_bytes_per_token(); }

 private:
  device::Kind k_;
  std::unique_ptr<DeviceDecoder> d_;
};

class GuardedLayerPass final : public DeviceLayerPass {
 public:
  GuardedLayerPass(device::Kind k, std::unique_ptr<DeviceLayerPass> p) : k_(k), p_(std::move(p)) {}
  void load(int64_t layer) override { guarded_call(k_, [&] { p_->load(layer); }); }
  void begin_capture(const LayerCapture& what) override { guarded_call(k_, [&] { p_->begin_capture(what); }); }
  void end_capture() override { guarded_call(k_, [&] { p_->end_capture(); }); }
  void run(float* x, int64_t n, bool write_back) override { guarded_call(k_, [&] { p_->run(x, n, write_back); }); }
  void make_resident(const std::vector<int64_t>& lengths) override {
    guarded_call(k_, [&] { p_->make_resident(lengths); });
  }
  void store_resident(size_t s, const float* x) override { guarded_call(k_, [&] { p_->store_resident(s, x); }); }
  std::vector<float> load_resident(size_t s) const override { return guarded_call(k_, [&] { return p_->load_resident(s); }); }
  void run_resident(size_t s, bool write_back) override { guarded_call(k_, [&] { p_->run_resident(s, write_back); }); }
  int64_t captured_rows(LayerInput input) const override { return p_->captured_rows(input); }
  std::vector<double> hessian(LayerInput input) const override {
    return guarded_call(k_, [&] { return p_->hessian(input); });
  }
  std::pair<float, float> range(LayerInput input) const override { return guarded_call(k_, [&] { return p_->range(input); }); }
  std::pair<float, float> kv_amax() const override { return guarded_call(k_, [&] { return p_->kv_amax(); }); }
  MoeInputs take_moe_inputs() override { return guarded_call(k_, [&] { return p_->take_moe_inputs(); }); }
  void begin_expert(int64_t expert, const LayerCapture& what) override {
    guarded_call(k_, [&] { p_->begin_expert(expert, what); });
  }
  void run_expert(const float* x, int64_t n) override { guarded_call(k_, [&] { p_->run_expert(x, n); }); }

 private:
  device::Kind k_;
  std::unique_ptr<DeviceLayerPass> p_;
};

class GuardedSmoothingEval final : public DeviceSmoothingEval {
 public:
  GuardedSmoothingEval(device::Kind k, std::unique_ptr<DeviceSmoothingEval> e) : k_(k), e_(std::move(e)) {}
  void set_inputs(const std::vector<int64_t>& lengths, const float* x) override {
    guarded_call(k_, [&] { e_->set_inputs(lengths, x); });
  }
  void load(int64_t layer) override { guarded_call(k_, [&] { e_->load(layer); }); }
  void load_linear(int index) override { guarded_call(k_, [&] { e_->load_linear(index); }); }
  void run_reference() override { guarded_call(k_, [&] { e_->run_reference(); }); }
  std::vector<double> abs_sum(LayerInput input) const override { return guarded_call(k_, [&] { return e_->abs_sum(input); }); }
  std::vector<double> abs_max(LayerInput input) const override { return guarded_call(k_, [&] { return e_->abs_max(input); }); }
  int64_t tokens() const override { return e_->tokens(); }
  double loss(SmoothingBlock block) override { return guarded_call(k_, [&] { return e_->loss(block); }); }
  std::vector<double> clip_errors(LayerInput input, int64_t step, const float* d, int64_t rows, int64_t cols,
                                  int64_t group) override {
    return guarded_call(k_, [&] { return e_->clip_errors(input, step, d, rows, cols, group); });
  }

 private:
  device::Kind k_;
  std::unique_ptr<DeviceSmoothingEval> e_;
};

}  // namespace

std::unique_ptr<DeviceDecoder> guard_device(device::Kind kind, std::unique_ptr<DeviceDecoder> inner) {
  return std::make_unique<GuardedDecoder>(kind, std::move(inner));
}
std::unique_ptr<DeviceLayerPass> guard_device(device::Kind kind, std::unique_ptr<DeviceLayerPass> inner) {
  return std::make_unique<GuardedLayerPass>(kind, std::move(inner));
}
std::unique_ptr<DeviceSmoothingEval> guard_device(device::Kind kind, std::unique_ptr<DeviceSmoothingEval> inner) {
  return std::make_unique<GuardedSmoothingEval>(kind, std::move(inner));
}

}  // namespace qf::rt
