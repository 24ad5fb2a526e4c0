#include "calibration/sequential.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <optional>
#include <tuple>

#include "calibration/activation_store.h"
#include "core/error.h"
#include "runtime/device_runtime.h"

namespace qf {
namespace {

// Accumulates, as asked, the Hessians and the value ranges of one layer's
// Linear inputs. K and V share Q's input and Up shares Gate's, so each
// distinct input is observed once.
class CaptureObserver final : public rt::LinearObserver {
 public:
  CaptureObserver(int64_t hidden, int64_t q_dim, int64_t ffn, ThreadPool& pool, bool hessians, bool ranges)
      : pool_(pool), ranges_(ranges) {
    if (hessians) h_[Q].emplace(hidden), h_[O].emplace(q_dim), h_[Gate].emplace(hidden), h_[Down].emplace(ffn);
  }
  void observe(int64_t, Slot slot, const float* x, int64_t n, int64_t in) override {
    if (slot == LmHead || input_of(slot) != slot) return;
    if (ranges_) {
      auto& r = range_[slot];
      for (int64_t i = 0; i < n * in; ++i) r.first = std::min(r.first, x[i]), r.second = std::max(r.second, x[i]);
    }
    if (h_[slot]) h_[slot]->add(x, n, in, pool_);
  }
  // Takes the Hessians and ranges a device layer pass measured instead.
  void adopt(const rt::DeviceLayerPass& dev) {
    for (const Slot slot : {Q, O, Gate, Down}) {
      const rt::LayerInput input = rt::layer_input_of(slot);
      if (h_[slot])
        h_[slot] = HessianAccumulator::from_matrix(h_[slot]->cols(), dev.captured_rows(input), dev.hessian(input));
      if (ranges_) range_[slot] = dev.range(input);
    }
  }
  // The input range of a Linear's slot (0, 0 when ranges are not observed).
  std::pair<float, float> range(Slot s) const { return range_[input_of(s)]; }
  // Once the layer's calibration pass is over: applies every Hessian's last
  // rows, so that the q/k/v (or gate/up) solves may read one at once.
  void finish() {
    for (auto& h : h_)
      if (h) h->finish(&pool_);
  }
  // The Hessian of a Linear's input, or nullptr without Hessians (finished).
  const HessianAccumulator* hessian(Slot s) const {
    const std::optional<HessianAccumulator>& h = h_[input_of(s)];
    return h ? &*h : nullptr;
  }

 private:
  // By the slot of the input (Q, O, Gate, Down; see input_of).
  std::optional<HessianAccumulator> h_[8];
  std::pair<float, float> range_[8] = {};
  ThreadPool& pool_;
  bool ranges_;
};

// Largest |K| and |V| of one layer.
class KvObserver final : public rt::LinearObserver {
 public:
  void observe(int64_t, Slot, const float*, int64_t, int64_t) override {}
  void observe_kv(int64_t, const float* k, const float* v, int64_t n, int64_t kv_dim) override {
    for (int64_t i = 0; i < n * kv_dim; ++i) k_amax = std::max(k_amax, std::fabs(k[i])), v_amax = std::max(v_amax, std::fabs(v[i]));
  }
  float k_amax = 0, v_amax = 0;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void run_layer(const rt::Model& model, int64_t li, const std::vector<std::vector<int32_t>>& samples,
               ActivationStore& hidden, ThreadPool& pool, rt::LinearObserver* obs, bool write_back) {
  for (size_t s = 0; s < samples.size(); ++s) {
    const int64_t n = static_cast<int64_t>(samples[s].size());
    rt::KvCache cache = model.make_cache(rt::KvDType::F16, n);
    rt::Batch b;
    const int32_t seq = cache.add_sequence();
    for (int64_t j = 0; j < n; ++j) b.add(samples[s][static_cast<size_t>(j)], seq, j, false);
    cache.reserve(seq, n);
    std::vector<float> x = hidden.load(s);
    model.forward_layer(li, b, x.data(), cache, pool, obs);
    if (write_back) hidden.store(s, x);
  }
}

// run_layer on the device: the layer pass has the layer loaded, and the
// hidden states are on the device (resident) or in `hidden`.
void run_layer_on(rt::DeviceLayerPass& dev, bool resident, const std::vector<std::vector<int32_t>>& samples,
                  ActivationStore& hidden, bool write_back) {
  for (size_t s = 0; s < samples.size(); ++s) {
    if (resident) {
      dev.run_resident(s, write_back);
      continue;
    }
    std::vector<float> x = hidden.load(s);
    dev.run(x.data(), static_cast<int64_t>(samples[s].size()), write_back);
    if (write_back) hidden.store(s, x);
  }
}

// The largest |w| over the Linears of each fused set of a layer, from their
// current float weights (NaN ignored); -1 for a set whose amax is not finite.
std::array<float, 2> fused_set_amax(const rt::LayerWeights& L) {
  std::array<float, 2> amax = {0.0f, 0.0f};
  for (const rt::LayerLinear& sl : rt::kLayerLinears) {
    const int set = fused_set_of(sl.slot);
    if (set < 0) continue;
    const rt::Linear& lin = *(L.*sl.member);
    std::vector<float> row(static_cast<size_t>(lin.in_features()));
    float a = amax[static_cast<size_t>(set)];
    for (int64_t r = 0; r < lin.out_features(); ++r) {
      lin.decode_row(r, row.data());
      for (float v : row) a = std::max(a, std::fabs(v));
    }
    amax[static_cast<size_t>(set)] = a;
  }
  for (float& a : amax)
    if (!std::isfinite(a)) a = -1.0f;
  return amax;
}

}  // namespace

bool hidden_states_on_device(const SequentialOptions& o, uint64_t bytes) {
  switch (o.device) {
    case device::Kind::Cpu: return false;
    case device::Kind::Host: return o.max_memory_bytes == 0 || bytes <= o.max_memory_bytes;
    case device::Kind::Cuda: {
      uint64_t free = 0, total = 0;
      return device::cuda_memory(&free, &total) && bytes + o.device_reserve_bytes <= free / 10 * 9;
    }
  }
  return false;
}

int fused_set_of(rt::LinearObserver::Slot slot) {
  switch (slot) {
    case rt::LinearObserver::Q:
    case rt::LinearObserver::K:
    case rt::LinearObserver::V: return 0;
    case rt::LinearObserver::Gate:
    case rt::LinearObserver::Up: return 1;
    default: return -1;
  }
}

void run_sequential(rt::Model& model, const std::vector<std::vector<int32_t>>& samples,
                    const QuantizeFn& quantize, ThreadPool& pool, const LayerDoneFn& layer_done,
                                            const SequentialOptions& opts) {
  const ModelConfig& c = model.config();
  if (samples.empty()) throw invalid_input("calibration", "no calibration samples");
  std::vector<size_t> sizes;
  for (const auto& sm : samples) sizes.push_back(sm.size() * static_cast<size_t>(c.hidden_size));
  ActivationStore hidden(sizes, opts.max_memory_bytes, opts.spill_beside);
  if (opts.resume_layers > 0 && !opts.restore)
    throw Error(ErrorKind::Internal, "run_sequential: resume_layers without restore");
  std::unique_ptr<rt::DeviceLayerPass> dev;
  bool resident = false;
  if (opts.device != device::Kind::Cpu) {
    int64_t longest = 1;
    std::vector<int64_t> lengths;
    uint64_t bytes = 0;
    for (const auto& sm : samples) {
      longest = std::max(longest, static_cast<int64_t>(sm.size()));
      lengths.push_back(static_cast<int64_t>(sm.size()));
      bytes += sm.size() * static_cast<uint64_t>(c.hidden_size) * sizeof(float);
    }
    dev = rt::make_device_layer_pass(opts.device, model, longest);
    resident = hidden_states_on_device(opts, bytes);
    if (resident) dev->make_resident(lengths);
  }
  for (size_t s = 0; s < samples.size(); ++s) {
    rt::Batch b;
    rt::KvCache cache = model.make_cache(rt::KvDType::F16, static_cast<int64_t>(samples[s].size()));
    const int32_t seq = cache.add_sequence();
    for (size_t j = 0; j < samples[s].size(); ++j) b.add(samples[s][j], seq, static_cast<int64_t>(j), false);
    model.check_batch(b, cache);
    std::vector<float> x(sizes[s]);
    model.embed(b, x.data());
    if (resident) dev->store_resident(s, x.data());
    else hidden.store(s, x);
  }
  const auto load_input = [&](size_t s) { return resident ? dev->load_resident(s) : hidden.load(s); };
  for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
    if (li < opts.resume_layers) {
      opts.restore(li);
      if (dev) dev->load(li), run_layer_on(*dev, resident, samples, hidden, true);
      else run_layer(model, li, samples, hidden, pool, nullptr, true);
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (opts.transform) opts.transform(li, samples, load_input);
    // Methods without calibration (RTN) need neither the Hessians nor the capture pass.
    std::unique_ptr<CaptureObserver> obs;
    if (opts.hessian_weighted_error || opts.observe_ranges) {
      obs = std::make_unique<CaptureObserver>(c.hidden_size, c.q_dim(), c.intermediate_size, pool,
                                              opts.hessian_weighted_error, opts.observe_ranges);
      if (dev) {
        dev->load(li);
        dev->begin_capture(rt::LayerCapture{opts.hessian_weighted_error, opts.observe_ranges, false});
        run_layer_on(*dev, resident, samples, hidden, false);
        dev->end_capture();
        obs->adopt(*dev);
        dev->begin_capture(rt::LayerCapture{});  // frees the device's Hessians before the solves
        dev->end_capture();
      } else {
        run_layer(model, li, samples, hidden, pool, obs.get(), false);
        obs->finish();
      }
    }
    rt::LayerWeights& L = model.mutable_layer(li);
    // Before any of the layer's Linears is replaced by its quantized form.
    const std::array<float, 2> set_amax =
        opts.fused_weight_amax ? fused_set_amax(L) : std::array<float, 2>{-1.0f, -1.0f};
    std::vector<QuantizedLinearResult> done;
    for (const rt::LayerLinear& sl : rt::kLayerLinears) {
      std::shared_ptr<rt::Linear>& slot = L.*sl.member;
      const rt::Linear& lin = *slot;
      const std::vector<float> w = lin.decode_all();
      const HessianAccumulator* h = obs ? obs->hessian(sl.slot) : nullptr;
      LinearToQuantize in{"model.layers." + std::to_string(li) + "." + sl.name, li, &w, lin.out_features(),
                          lin.in_features(), h};
      if (obs) std::tie(in.act_min, in.act_max) = obs->range(sl.slot);
      if (const int set = fused_set_of(sl.slot); set >= 0) in.fused_weight_amax = set_amax[static_cast<size_t>(set)];
      const auto tq = std::chrono::steady_clock::now();
      std::optional<QuantizedLinearResult> q = quantize(in);
      if (!q) continue;
      q->seconds = seconds_since(tq);
      // Output-error estimate weighted by the input energy of each column.
      static const std::vector<double> kNoHessian;
      const bool weighted = h != nullptr;
      const std::vector<double>& H = weighted ? h->matrix() : kNoHessian;
      const std::vector<float> wq = q->q.dequantize();
      double num = 0, den = 0;
      for (int64_t r = 0; r < in.rows; ++r)
        for (int64_t col = 0; col < in.cols; ++col) {
          const double d = weighted ? H[static_cast<size_t>(col * in.cols + col)] : 1.0;
          const size_t i = static_cast<size_t>(r * in.cols + col);
          num += (w[i] - wq[i]) * static_cast<double>(w[i] - wq[i]) * d;
          den += static_cast<double>(w[i]) * w[i] * d;
        }
      q->error = den > 0 ? num / den : 0;
      const std::optional<Tensor> bt = rt::bias_tensor(lin.bias_values());
      slot = rt::make_quantized_linear(q->q, q->act ? &*q->act : nullptr, bt ? &*bt : nullptr, in.name);
      done.push_back(std::move(*q));
    }
    if (dev) {
      dev->load(li);  // the quantized Linears, decoded
      dev->begin_capture(rt::LayerCapture{false, false, opts.kv_amax != nullptr});
      run_layer_on(*dev, resident, samples, hidden, true);
      dev->end_capture();
      if (opts.kv_amax) opts.kv_amax->push_back(dev->kv_amax());
    } else {
      KvObserver kv;
      run_layer(model, li, samples, hidden, pool, opts.kv_amax ? &kv : nullptr, true);
      if (opts.kv_amax) opts.kv_amax->emplace_back(kv.k_amax, kv.v_amax);
    }
    if (layer_done) layer_done(li, done, seconds_since(t0));
  }
}

}  // namespace qf
