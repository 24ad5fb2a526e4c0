#include "calibration/sequential.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <functional>
#include <optional>
#include <tuple>

#include "calibration/activation_store.h"
#include "core/error.h"
#include "core/io.h"
#include "runtime/cpu/kernels.h"
#include "runtime/device_runtime.h"

namespace qf {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A Hessian update, its time and useful flops (the upper triangle, 2 a
// product) added to `t` when given.
void add_timed(HessianAccumulator& h, const float* x, int64_t n, int64_t in, ThreadPool& pool, PhaseCount* t) {
  const auto t0 = std::chrono::steady_clock::now();
  h.add(x, n, in, pool);
  if (t) t->add(seconds_since(t0), static_cast<double>(n) * static_cast<double>(in) * static_cast<double>(in + 1));
}

void finish_timed(HessianAccumulator& h, ThreadPool& pool, PhaseCount* t) {
  const auto t0 = std::chrono::steady_clock::now();
  h.finish(&pool);
  if (t) t->add(seconds_since(t0), 0.0);
}

// Accumulates, as asked, the Hessians and the value ranges of one layer's
// Linear inputs. K and V share Q's input and Up shares Gate's, so each
// distinct input is observed once.
class CaptureObserver final : public rt::LinearObserver {
 public:
  CaptureObserver(int64_t hidden, int64_t q_dim, int64_t ffn, ThreadPool& pool, bool hessians, bool ranges,
                  PhaseCount* hessian_time)
      : pool_(pool), ranges_(ranges), hessian_time_(hessian_time) {
    if (hessians) h_[Q].emplace(hidden), h_[O].emplace(q_dim);
    if (hessians && ffn > 0) h_[Gate].emplace(hidden), h_[Down].emplace(ffn);  // ffn 0: a sparse layer
  }
  void observe(int64_t, Slot slot, const float* x, int64_t n, int64_t in) override {
    if (slot == LmHead || input_of(slot) != slot) return;
    if (ranges_) {
      auto& r = range_[slot];
      for (int64_t i = 0; i < n * in; ++i) r.first = std::min(r.first, x[i]), r.second = std::max(r.second, x[i]);
    }
    if (h_[slot]) add_timed(*h_[slot], x, n, in, pool_, hessian_time_);
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
      if (h) finish_timed(*h, pool_, hessian_time_);
  }
  // Frees the Hessian of a Linear's input (after its last reader).
  void release(Slot s) { h_[input_of(s)].reset(); }
  // The Hessian of a Linear's input, or nullptr without Hessians (finished).
  const HessianAccumulator* hessian(Slot s) const {
    const std::optional<HessianAccumulator>& h = h_[input_of(s)];
    return h ? &*h : nullptr;
  }
  // Sparse layers: keeps each sample's MLP input (in `moe_in`, one sample per
  // forward_layer call, in order) and its routing; the experts' statistics
  // are computed from them one expert at a time afterwards.
  void keep_moe_inputs(ActivationStore* moe_in, std::vector<std::vector<int32_t>>* routing) {
    moe_in_ = moe_in, routing_ = routing;
  }
  void observe_moe_input(int64_t, const float* xn, int64_t n, int64_t hidden) override {
    if (!moe_in_) return;
    moe_in_->store(moe_sample_, std::vector<float>(xn, xn + n * hidden));
  }
  void observe_routing(int64_t, const int32_t* e, const float*, int64_t n, int64_t k) override {
    if (!routing_) return;
    (*routing_)[moe_sample_++].assign(e, e + n * k);
  }

 private:
  ActivationStore* moe_in_ = nullptr;
  std::vector<std::vector<int32_t>>* routing_ = nullptr;
  size_t moe_sample_ = 0;
  // By the slot of the input (Q, O, Gate, Down; see input_of).
  std::optional<HessianAccumulator> h_[8];
  std::pair<float, float> range_[8] = {};
  ThreadPool& pool_;
  bool ranges_;
  PhaseCount* hessian_time_;
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

// After layer li has been handed on: its quantized Linears become stand-ins
// that keep the shape and the bias (the export reads only those), and the
// mapped pages of its other weights are given back (read again only when
// the export copies them).
void release_layer(rt::Model& model, int64_t li) {
  const ModelConfig& c = model.config();
  rt::LayerWeights& L = model.mutable_layer(li);
  for (const rt::LayerLinearId& id : rt::layer_linears(c, li)) {
    std::shared_ptr<rt::Linear>& slot = rt::layer_linear(L, id);
    if (!slot->quantized()) {
      slot->release_pages();
      continue;
    }
    slot = rt::make_released_linear(slot->in_features(), slot->out_features(), slot->bias_values(), slot->format(),
                                    "model.layers." + std::to_string(li) + "." + id.name);
  }
  if (L.sparse()) {
    L.moe.router->release_pages();
    if (L.moe.shared_gate) L.moe.shared_gate->release_pages();
  }
  release_free_heap();  // the layer's temporaries, freed by now, leave the resident memory too
}

// While alive, layer li's Linears (but those that quantize their input) run
// in bf16 (SequentialOptions::bf16); the originals come back after.
class Bf16Layer {
 public:
  Bf16Layer(rt::Model& model, int64_t li, bool on) : L_(model.mutable_layer(li)) {
    if (!on) return;
    for (const rt::LayerLinearId& id : rt::layer_linears(model.config(), li)) {
      std::shared_ptr<rt::Linear>& slot = rt::layer_linear(L_, id);
      if (slot->input_quantizer()) continue;
      saved_.emplace_back(id, slot);
      slot = rt::make_bf16_linear(slot);
    }
  }
  ~Bf16Layer() {
    for (auto& [id, lin] : saved_) rt::layer_linear(L_, id) = std::move(lin);
  }
  Bf16Layer(const Bf16Layer&) = delete;
  Bf16Layer& operator=(const Bf16Layer&) = delete;

 private:
  rt::LayerWeights& L_;
  std::vector<std::pair<rt::LayerLinearId, std::shared_ptr<rt::Linear>>> saved_;
};

// The layer's forward flops over every sample.
double layer_flops(const rt::Model& model, int64_t li, const std::vector<std::vector<int32_t>>& samples) {
  double f = 0;
  for (const auto& s : samples) f += layer_forward_flops(model.config(), li, static_cast<int64_t>(s.size()), model.window(li));
  return f;
}

// Layer li over every sample, one sample at a time, through one cache whose
// blocks each sample reuses; its Linears in bf16 while it runs when `bf16`.
void run_layer(rt::Model& model, int64_t li, const std::vector<std::vector<int32_t>>& samples, ActivationStore& hidden,
               ThreadPool& pool, rt::LinearObserver* obs, bool write_back, bool bf16,
               const std::vector<rt::MultimodalInputs>* mm) {
  const Bf16Layer in_bf16(model, li, bf16);
  int64_t longest = 1;
  for (const auto& sm : samples) longest = std::max(longest, static_cast<int64_t>(sm.size()));
  rt::KvCache cache = model.make_cache(rt::KvDType::F16, longest);
  for (size_t s = 0; s < samples.size(); ++s) {
    const int64_t n = static_cast<int64_t>(samples[s].size());
    rt::Batch b;
    const int32_t seq = cache.add_sequence();
    rt::add_sequence(b, samples[s], seq, mm ? &(*mm)[s] : nullptr);
    cache.reserve(seq, n);
    std::vector<float> x = hidden.load(s);
    model.forward_layer(li, b, x.data(), cache, pool, obs);
    cache.free_sequence(seq);
    if (write_back) hidden.store(s, x);
  }
}

// run_layer on the device: the layer pass has the layer loaded, and the
// hidden states are on the device (resident) or in `hidden`. `after(s)`, if
// given, runs after sample s.
void run_layer_on(rt::DeviceLayerPass& dev, bool resident, const std::vector<std::vector<int32_t>>& samples,
                  ActivationStore& hidden, bool write_back, const std::function<void(size_t)>& after = {}) {
  for (size_t s = 0; s < samples.size(); ++s) {
    if (resident) {
      dev.run_resident(s, write_back);
    } else {
      std::vector<float> x = hidden.load(s);
      dev.run(x.data(), static_cast<int64_t>(samples[s].size()), write_back);
      if (write_back) hidden.store(s, x);
    }
    if (after) after(s);
  }
}

// max(a, the largest |w| of the Linear's current float weights), NaN ignored.
float weight_amax(const rt::Linear& lin, float a) {
  std::vector<float> row(static_cast<size_t>(lin.in_features()));
  for (int64_t r = 0; r < lin.out_features(); ++r) {
    lin.decode_row(r, row.data());
    for (float v : row) a = std::max(a, std::fabs(v));
  }
  return a;
}

// The largest |w| over the Linears of each fused set of a layer, from their
// current float weights (NaN ignored); -1 for a set whose amax is not finite.
std::array<float, 2> fused_set_amax(const rt::LayerWeights& L) {
  std::array<float, 2> amax = {0.0f, 0.0f};
  for (const rt::LayerLinear& sl : rt::kLayerLinears) {
    const int set = fused_set_of(sl.slot);
    if (set < 0 || !(L.*sl.member)) continue;  // a sparse layer has no dense gate/up
    amax[static_cast<size_t>(set)] = weight_amax(*(L.*sl.member), amax[static_cast<size_t>(set)]);
  }
  for (float& a : amax)
    if (!std::isfinite(a)) a = -1.0f;
  return amax;
}

// An expert's gate and up, which vLLM's fused MoE holds as one w13 with one
// NVFP4 global scale per expert: their largest |w|, -1 when not finite.
float expert_gate_up_amax(const rt::LayerWeights& L, int64_t e) {
  const rt::ExpertWeights& ex = e == rt::kSharedExpert ? L.moe.shared : L.moe.experts[static_cast<size_t>(e)];
  const float a = weight_amax(*ex.up, weight_amax(*ex.gate, 0.0f));
  return std::isfinite(a) ? a : -1.0f;
}

// One expert's calibration statistics: the Hessians (and ranges) of its
// gate/up input and of its down projection's input.
struct ExpertStats {
  std::optional<HessianAccumulator> in, down_in;
  std::pair<float, float> in_range{0.0f, 0.0f}, down_range{0.0f, 0.0f};
  int64_t tokens = 0;
};

void widen(std::pair<float, float>& r, const std::vector<float>& x) {
  for (float v : x) r.first = std::min(r.first, v), r.second = std::max(r.second, v);
}

// x := the rows of one sample's MLP input xn [n, h] routed to expert e
// (routing [n, k]; the shared expert, or `all`: every row), in token order.
void expert_rows(const std::vector<float>& xn, const std::vector<int32_t>& r, int64_t h, int64_t k, int64_t e, bool all,
                 std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(xn.size()) / h;
  x.clear();
  for (int64_t t = 0; t < n; ++t) {
    bool routed = all || e == rt::kSharedExpert;
    for (int64_t j = 0; j < k && !routed; ++j) routed = r[static_cast<size_t>(t * k + j)] == e;
    if (routed) x.insert(x.end(), xn.begin() + t * h, xn.begin() + (t + 1) * h);
  }
}

// Runs expert `e` of layer `li` (kSharedExpert: the shared one, which sees
// every token; `all`: every token too) over the rows routed to it in each
// sample, with its weights as they are now (before it is quantized).
ExpertStats expert_stats(const rt::Model& model, int64_t li, int64_t e, const ActivationStore& moe_in,
                         const std::vector<std::vector<int32_t>>& routing, bool all, bool hessians, bool ranges,
                         ThreadPool& pool, PipelineTimes* times, bool bf16) {
  const ModelConfig& c = model.config();
  const rt::MoeWeights& m = model.weights().layers[static_cast<size_t>(li)].moe;
  const rt::ExpertWeights& ex = e == rt::kSharedExpert ? m.shared : m.experts[static_cast<size_t>(e)];
  const int64_t h = c.hidden_size, ff = ex.gate->out_features(), k = c.num_experts_per_tok;
  const bool wrap = bf16 && !ex.gate->input_quantizer() && !ex.up->input_quantizer();
  const std::shared_ptr<const rt::Linear> gate = wrap ? rt::make_bf16_linear(ex.gate) : ex.gate;
  const std::shared_ptr<const rt::Linear> up = wrap ? rt::make_bf16_linear(ex.up) : ex.up;
  ExpertStats st;
  if (hessians) st.in.emplace(h), st.down_in.emplace(ff);
  std::vector<float> x, g, u;
  for (size_t s = 0; s < moe_in.size(); ++s) {
    expert_rows(moe_in.load(s), routing[s], h, k, e, all, x);
    const int64_t rows = static_cast<int64_t>(x.size()) / h;
    if (rows == 0) continue;
    st.tokens += rows;
    g.resize(static_cast<size_t>(rows * ff)), u.resize(g.size());
    gate->forward(x.data(), rows, g.data(), pool);
    up->forward(x.data(), rows, u.data(), pool);
    for (int64_t t = 0; t < rows; ++t) rt::swiglu(g.data() + t * ff, u.data() + t * ff, ff);
    PhaseCount* ht = times ? &times->hessian : nullptr;
    if (hessians) add_timed(*st.in, x.data(), rows, h, pool, ht), add_timed(*st.down_in, g.data(), rows, ff, pool, ht);
    if (ranges) widen(st.in_range, x), widen(st.down_range, g);
  }
  if (hessians) {
    PhaseCount* ht = times ? &times->hessian : nullptr;
    finish_timed(*st.in, pool, ht), finish_timed(*st.down_in, pool, ht);
  }
  return st;
}

// expert_stats on the device layer pass, which holds layer li as it was
// before any of its Linears was quantized (the CPU reads each expert's
// weights before quantizing it: the same values). The rows are gathered on
// the host from the MLP inputs and routing the device kept; the expert's
// gate/up run and its Hessians accumulate on the device.
ExpertStats expert_stats_on(rt::DeviceLayerPass& dev, const ModelConfig& c, int64_t e, const ActivationStore& moe_in,
                            const std::vector<std::vector<int32_t>>& routing, bool all, bool hessians, bool ranges) {
  const int64_t h = c.hidden_size, k = c.num_experts_per_tok;
  const int64_t ff = rt::layer_linear_shape(c, rt::LayerLinearId{rt::LinearObserver::Gate, e, {}}).out;
  ExpertStats st;
  dev.begin_expert(e, rt::LayerCapture{hessians, ranges});
  std::vector<float> x;
  for (size_t s = 0; s < moe_in.size(); ++s) {
    expert_rows(moe_in.load(s), routing[s], h, k, e, all, x);
    const int64_t rows = static_cast<int64_t>(x.size()) / h;
    if (rows == 0) continue;
    st.tokens += rows;
    dev.run_expert(x.data(), rows);
  }
  if (hessians && st.tokens > 0) {
    st.in = HessianAccumulator::from_matrix(h, dev.captured_rows(rt::LayerInput::Mlp), dev.hessian(rt::LayerInput::Mlp));
    st.down_in = HessianAccumulator::from_matrix(ff, dev.captured_rows(rt::LayerInput::Down), dev.hessian(rt::LayerInput::Down));
  } else if (hessians) {  // no rows: empty, as the CPU's (never read)
    st.in.emplace(h), st.down_in.emplace(ff);
    st.in->finish(), st.down_in->finish();
  }
  if (ranges) st.in_range = dev.range(rt::LayerInput::Mlp), st.down_range = dev.range(rt::LayerInput::Down);
  dev.begin_capture(rt::LayerCapture{});  // frees the device's Hessians before the solves
  dev.end_capture();
  return st;
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
  if (opts.multimodal && opts.multimodal->size() != samples.size())
    throw Error(ErrorKind::Internal, "run_sequential: multimodal inputs for " + std::to_string(opts.multimodal->size()) +
                                         " of " + std::to_string(samples.size()) + " samples");
  if (opts.multimodal && opts.device != device::Kind::Cpu)
    throw unsupported("calibration", "image calibration samples run on the CPU only (--device cpu)");
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
    dev = rt::make_device_layer_pass(opts.device, model, longest, rt::kDevicePassTokens, opts.bf16);
    resident = hidden_states_on_device(opts, bytes);
    if (resident) dev->make_resident(lengths);
  }
  for (size_t s = 0; s < samples.size(); ++s) {
    rt::Batch b;
    rt::KvCache cache = model.make_cache(rt::KvDType::F16, static_cast<int64_t>(samples[s].size()));
    const int32_t seq = cache.add_sequence();
    rt::add_sequence(b, samples[s], seq, opts.multimodal ? &(*opts.multimodal)[s] : nullptr);
    model.check_batch(b, cache);
    std::vector<float> x(sizes[s]);
    model.embed(b, x.data());
    if (resident) dev->store_resident(s, x.data());
    else hidden.store(s, x);
  }
  if (opts.release_done_layers) model.weights().embed->release_pages();  // the rows read: not needed again
  const auto load_input = [&](size_t s) { return resident ? dev->load_resident(s) : hidden.load(s); };
  PipelineTimes* times = opts.times;
  PhaseCount* hessian_time = times ? &times->hessian : nullptr;
  for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
    const double fwd_flops = layer_flops(model, li, samples);
    if (li < opts.resume_layers) {
      opts.restore(li);
      const auto tr = std::chrono::steady_clock::now();
      if (dev) dev->load(li), run_layer_on(*dev, resident, samples, hidden, true);
      else run_layer(model, li, samples, hidden, pool, nullptr, true, opts.bf16, opts.multimodal);
      if (times) times->restore.add(seconds_since(tr), fwd_flops);
      if (opts.release_done_layers) release_layer(model, li);
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (opts.transform) {
      opts.transform(li, samples, load_input);
      if (times) times->search.add(seconds_since(t0), 0.0);
    }
    // Methods without calibration (RTN) need neither the Hessians nor the capture pass.
    std::unique_ptr<CaptureObserver> obs;
    std::unique_ptr<ActivationStore> moe_in;  // sparse layers: each sample's MLP input
    std::vector<std::vector<int32_t>> routing(samples.size());
    if (opts.hessian_weighted_error || opts.observe_ranges) {
      obs = std::make_unique<CaptureObserver>(c.hidden_size, c.q_dim(), c.moe_layer(li) ? 0 : c.intermediate_size, pool,
                                              opts.hessian_weighted_error, opts.observe_ranges, hessian_time);
      if (c.moe_layer(li)) {
        moe_in = std::make_unique<ActivationStore>(sizes, opts.max_memory_bytes, opts.spill_beside);
        obs->keep_moe_inputs(moe_in.get(), &routing);
      }
      const auto tc = std::chrono::steady_clock::now();
      const double h0 = times ? times->hessian.seconds : 0.0;
      if (dev) {
        dev->load(li);
        rt::LayerCapture what{opts.hessian_weighted_error, opts.observe_ranges, false};
        what.moe_inputs = moe_in != nullptr;
        dev->begin_capture(what);
        run_layer_on(*dev, resident, samples, hidden, false, [&](size_t s) {
          if (!moe_in) return;
          rt::MoeInputs kept = dev->take_moe_inputs();
          moe_in->store(s, std::move(kept.x));
          routing[s] = std::move(kept.experts);
        });
        dev->end_capture();
        obs->adopt(*dev);
        dev->begin_capture(rt::LayerCapture{});  // frees the device's Hessians before the solves
        dev->end_capture();
      } else {
        run_layer(model, li, samples, hidden, pool, obs.get(), false, opts.bf16, opts.multimodal);
        obs->finish();
      }
      if (times) times->forward.add(seconds_since(tc) - (times->hessian.seconds - h0), fwd_flops);
    }
    rt::LayerWeights& L = model.mutable_layer(li);
    // Before any of the layer's Linears is replaced by its quantized form.
    const std::array<float, 2> set_amax =
        opts.fused_weight_amax ? fused_set_amax(L) : std::array<float, 2>{-1.0f, -1.0f};
    std::vector<QuantizedLinearResult> done;
    std::optional<ExpertStats> ex;  // the statistics of the expert being quantized
    int64_t ex_of = rt::kNoExpert;
    float ex_amax = -1.0f;
    std::string token_line;  // sparse layers: tokens per expert, for the log
    const std::vector<rt::LayerLinearId> linears = rt::layer_linears(c, li);
    for (size_t k = 0; k < linears.size(); ++k) {
      const rt::LayerLinearId& sl = linears[k];
      // The last Linear reading this input: after it, the input's Hessian
      // (and the factor GPTQ kept with it) is freed.
      bool last_reader = sl.expert == rt::kNoExpert;
      for (size_t j = k + 1; j < linears.size() && last_reader; ++j)
        last_reader = !(linears[j].expert == rt::kNoExpert &&
                        rt::LinearObserver::input_of(linears[j].slot) == rt::LinearObserver::input_of(sl.slot));
      std::shared_ptr<rt::Linear>& slot = rt::layer_linear(L, sl);
      const rt::Linear& lin = *slot;
      const std::vector<float> w = lin.decode_all();
      LinearToQuantize in;
      in.name = "model.layers." + std::to_string(li) + "." + sl.name;
      in.layer = li, in.weight = &w, in.rows = lin.out_features(), in.cols = lin.in_features();
      if (sl.expert == rt::kNoExpert) {
        in.hessian = obs ? obs->hessian(sl.slot) : nullptr;
        if (obs) std::tie(in.act_min, in.act_max) = obs->range(sl.slot);
        if (const int set = fused_set_of(sl.slot); set >= 0) in.fused_weight_amax = set_amax[static_cast<size_t>(set)];
      } else {
        if (sl.expert != ex_of) {  // the expert's first Linear (gate): its statistics, one expert at a time
          ex.reset();
          ex_of = sl.expert;
          if (obs) {
            const auto te = std::chrono::steady_clock::now();
            const double h0 = times ? times->hessian.seconds : 0.0;
            ex = dev ? expert_stats_on(*dev, c, sl.expert, *moe_in, routing, opts.moe_calibrate_all_experts,
                                       opts.hessian_weighted_error, opts.observe_ranges)
                     : expert_stats(model, li, sl.expert, *moe_in, routing, opts.moe_calibrate_all_experts,
                                    opts.hessian_weighted_error, opts.observe_ranges, pool, times, opts.bf16);
            // The expert's gate and up over its rows again (the capture pass ran them once).
            const rt::LinearShape gs = rt::layer_linear_shape(c, sl);
            if (times)
              times->forward.add(seconds_since(te) - (times->hessian.seconds - h0),
                                 4.0 * static_cast<double>(ex->tokens) * static_cast<double>(gs.out) * static_cast<double>(gs.in));
            // Built with append(): GCC 12's -Wrestrict misfires on a chain of string +.
            if (!token_line.empty()) token_line.push_back(' ');
            token_line.append(sl.expert == rt::kSharedExpert ? std::string("shared") : std::to_string(sl.expert));
            token_line.append(":").append(std::to_string(ex->tokens));
            if (ex->tokens == 0 && opts.observe_ranges) {
              // Input ranges from every token instead, so that a static activation scale still covers what the expert would see.
              const ExpertStats all =
                  dev ? expert_stats_on(*dev, c, sl.expert, *moe_in, routing, true, false, true)
                      : expert_stats(model, li, sl.expert, *moe_in, routing, true, false, true, pool, nullptr, opts.bf16);
              ex->in_range = all.in_range, ex->down_range = all.down_range;
            }
          }
          ex_amax = opts.fused_weight_amax ? expert_gate_up_amax(L, sl.expert) : -1.0f;
        }
        const bool down = sl.slot == rt::LinearObserver::Down;
        if (ex) {
          in.expert_tokens = ex->tokens;
          std::tie(in.act_min, in.act_max) = down ? ex->down_range : ex->in_range;
          if (ex->tokens > 0 && opts.hessian_weighted_error) in.hessian = down ? &*ex->down_in : &*ex->in;
          if (ex->tokens == 0)
            in.note = in.name + ": no calibration token reached this expert" +
                      std::string(opts.observe_ranges ? " (its input ranges are taken over every calibration token)" : "");
          else if (ex->tokens < in.cols)
            in.dampening_scale = 10.0,
            in.note = in.name + ": only " + std::to_string(ex->tokens) + " calibration tokens reached this expert (fewer than its " +
                      std::to_string(in.cols) + " input columns): GPTQ dampening raised tenfold";
        }
        if (!down) in.fused_weight_amax = ex_amax;
      }
      const HessianAccumulator* h = in.hessian;
      const auto tq = std::chrono::steady_clock::now();
      std::optional<QuantizedLinearResult> q = quantize(in);
      if (!q) {
        if (last_reader && obs) obs->release(sl.slot);
        continue;
      }
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
      if (opts.release_done_layers) lin.release_pages();  // the float weight is not read again
      slot = rt::make_quantized_linear(q->q, q->act ? &*q->act : nullptr, bt ? &*bt : nullptr, in.name);
      if (last_reader && obs) obs->release(sl.slot);
      if (times) times->solve.add(seconds_since(tq), q->flops);
      done.push_back(std::move(*q));
    }
    if (!token_line.empty() && opts.log)
      opts.log("layer " + std::to_string(li + 1) + "/" + std::to_string(c.num_hidden_layers) + ": calibration tokens per expert" +
               (opts.moe_calibrate_all_experts ? " (every token to every expert)" : "") + ": " + token_line);
    const auto tp = std::chrono::steady_clock::now();
    if (dev) {
      dev->load(li);  // the quantized Linears, decoded
      dev->begin_capture(rt::LayerCapture{false, false, opts.kv_amax != nullptr});
      run_layer_on(*dev, resident, samples, hidden, true);
      dev->end_capture();
      if (opts.kv_amax) opts.kv_amax->push_back(dev->kv_amax());
    } else {
      KvObserver kv;
      run_layer(model, li, samples, hidden, pool, opts.kv_amax ? &kv : nullptr, true, opts.bf16, opts.multimodal);
      if (opts.kv_amax) opts.kv_amax->emplace_back(kv.k_amax, kv.v_amax);
    }
    if (times) times->propagate.add(seconds_since(tp), fwd_flops);
    const auto te = std::chrono::steady_clock::now();
    if (layer_done) layer_done(li, done, seconds_since(t0));
    if (opts.release_done_layers) release_layer(model, li);
    if (times) times->export_seconds += seconds_since(te);
  }
}

}  // namespace qf
