// Mixture-of-experts layers on the device (runtime/moe_device.h) against the
// CPU runtime (Model::moe_block and the sequential pipeline's expert
// statistics), on the MoE fixtures: the three tiny random architectures of
// tests/data/moe-tiny (mixtral; qwen2_moe with a gated shared expert, no
// renormalisation and a dense layer 1; qwen3_moe with q/k norms) and the
// trained fixture-mixtral.
//
// Bounds, and why. The device sums in other orders than the CPU (GEMMs, the
// softmax's exponentials and sum, the Hessians' running sums), which moves
// values by about 1e-6 relative; where that nudges a K or V element across
// an f16 rounding boundary of the cache, the attention output moves by up to
// a few 1e-4 of its scale (the dense device tests' measurement). So:
//   - routing: the same experts for every token of every layer fed the same
//     input (a flip needs two router probabilities within ~1e-6 of each
//     other), the MLP input the router reads and the layer output within
//     1e-4 of their scales (measured up to 1.9e-5 and 2.7e-6, on qwen3_moe,
//     whose per-head q/k norms pass the f16 cache's rounding on);
//   - logits of the whole decoder (prefill, a token at a time, passes of 5
//     tokens) against the CPU runtime: 1e-3 of the logit scale (at least 1),
//     the bound moe_test.cpp gives the CPU against the training script's own
//     forward, ten times the f16-cache effect above and far below what a
//     wrong routing rule, gate or norm does (order 1);
//   - the calibration pipeline on the device against the CPU's: every
//     Linear's Hessian within the dense layer pass's bounds
//     (sequential_device_test.cpp: 2e-3 of sqrt(H_ii H_jj) per element, 5e-4
//     in Frobenius norm), the same sample counts and expert token counts,
//     ranges and K/V maxima within 2e-3 of their span; with
//     calibration.precision bf16 too, where the routers and the shared
//     expert's gate stay in f32 as on the CPU (in bf16 they move the
//     qwen2_moe Hessians past these bounds).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "calibration/calibration_data.h"
#include "calibration/sequential.h"
#include "core/error.h"
#include "device/device.h"
#include "formats/tokenizer/tokenizer.h"
#include "runtime/device_runtime.h"
#include "runtime/model.h"
#include "moe_cases.h"
#include "test_util.h"

namespace qf {
namespace {

std::filesystem::path data_dir(const std::string& name) { return test::source_dir() / "tests" / "data" / name; }

std::vector<int32_t> reference_tokens(const std::filesystem::path& dir) {
  std::ifstream f(dir / "reference_logits.json");
  return nlohmann::json::parse(f)["tokens"].get<std::vector<int32_t>>();
}

// Every row's logits of `tokens` on the CPU runtime, in one forward.
std::vector<float> cpu_logits(const rt::Model& m, const std::vector<int32_t>& tokens) {
  rt::KvCache cache = m.make_cache(rt::KvDType::F16, static_cast<int64_t>(tokens.size()));
  const int32_t seq = cache.add_sequence();
  rt::Batch b;
  for (size_t i = 0; i < tokens.size(); ++i) b.add(tokens[i], seq, static_cast<int64_t>(i), true);
  std::vector<float> logits;
  m.forward(b, cache, logits, ThreadPool::global());
  return logits;
}

double max_abs(const std::vector<float>& v) {
  double m = 1.0;
  for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d;
}

constexpr double kLogitBound = 1e-3;

class MoeDevice : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = data_dir(GetParam());
    if (!std::filesystem::exists(dir_ / "reference_logits.json")) GTEST_SKIP() << dir_ << " is absent";
    model_ = rt::load_hf_model(dir_);
    tokens_ = reference_tokens(dir_);
  }

  void decoder_matches_the_cpu(device::Kind kind) {
    const rt::Model& m = *model_;
    const int64_t n = static_cast<int64_t>(tokens_.size()), V = m.vocab_size();
    const std::vector<float> cpu = cpu_logits(m, tokens_);
    const double scale = max_abs(cpu);
    const std::vector<uint8_t> all(tokens_.size(), 1);

    std::unique_ptr<rt::DeviceDecoder> d = rt::make_device_decoder(kind, m, n);
    std::vector<float> prefill;
    d->forward(tokens_.data(), n, all.data(), prefill);
    const double dp = max_diff(prefill, cpu);
    EXPECT_LE(dp, kLogitBound * scale) << "prefill (logit scale " << scale << ")";

    d->reset();
    std::vector<float> steps, one;
    for (int64_t t = 0; t < n; ++t) {
      d->forward(tokens_.data() + t, 1, all.data(), one);
      steps.insert(steps.end(), one.begin(), one.end());
    }
    const double ds = max_diff(steps, cpu);
    EXPECT_LE(ds, kLogitBound * scale) << "a token at a time";

    std::unique_ptr<rt::DeviceDecoder> p = rt::make_device_decoder(kind, m, n, 5);
    std::vector<float> chunked;
    p->forward(tokens_.data(), n, all.data(), chunked);
    const double dc = max_diff(chunked, cpu);
    EXPECT_LE(dc, kLogitBound * scale) << "passes of 5 tokens";
    ASSERT_EQ(prefill.size(), static_cast<size_t>(n * V));

    // The bytes a decode step reads: the CPU's rule (k experts of average
    // size); the device also counts the biases and the embedding row in f32.
    EXPECT_NEAR(static_cast<double>(d->weight_bytes_per_token()), static_cast<double>(m.bytes_per_token()),
                0.01 * static_cast<double>(m.bytes_per_token()));
    std::printf("%s %s decoder vs cpu: max logit difference %.3g (prefill) %.3g (steps) %.3g (passes of 5), scale %.3g\n",
                device::kind_name(kind), GetParam(), dp, ds, dc, scale);
  }

  std::filesystem::path dir_;
  std::unique_ptr<rt::Model> model_;
  std::vector<int32_t> tokens_;
};

TEST_P(MoeDevice, HostDecoderMatchesTheCpuRuntime) { decoder_matches_the_cpu(device::Kind::Host); }

TEST_P(MoeDevice, CudaDecoderMatchesTheCpuRuntime) {
  std::string why;
  if (!device::cuda_usable(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  decoder_matches_the_cpu(device::Kind::Cuda);
}

// The CPU's routing and MLP input of one layer.
struct RoutingSeen : rt::LinearObserver {
  std::vector<int32_t> experts;
  std::vector<float> weights, xn;
  void observe(int64_t, Slot, const float*, int64_t, int64_t) override {}
  void observe_moe_input(int64_t, const float* x, int64_t n, int64_t h) override { xn.assign(x, x + n * h); }
  void observe_routing(int64_t, const int32_t* e, const float* w, int64_t n, int64_t k) override {
    experts.assign(e, e + n * k), weights.assign(w, w + n * k);
  }
};

// Each layer fed the CPU's input (the CPU's output of the layer before), in
// passes of 7 tokens: the device routes every token to the same experts,
// reads the same MLP input and gives the same layer output.
TEST_P(MoeDevice, HostLayerPassRoutesAsTheCpuDoes) {
  const rt::Model& m = *model_;
  const ModelConfig& c = m.config();
  const int64_t n = static_cast<int64_t>(tokens_.size()), h = c.hidden_size;
  rt::KvCache cache = m.make_cache(rt::KvDType::F16, n);
  const int32_t seq = cache.add_sequence();
  rt::Batch b;
  for (int64_t i = 0; i < n; ++i) b.add(tokens_[static_cast<size_t>(i)], seq, i, false);
  m.check_batch(b, cache);
  std::vector<float> x(static_cast<size_t>(n * h));
  m.embed(b, x.data());
  std::unique_ptr<rt::DeviceLayerPass> pass = rt::make_device_layer_pass(device::Kind::Host, m, n, 7);
  double worst_x = 0, worst_y = 0;
  int sparse = 0;
  for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
    SCOPED_TRACE("layer " + std::to_string(li));
    std::vector<float> dev = x;
    RoutingSeen seen;
    m.forward_layer(li, b, x.data(), cache, ThreadPool::global(), &seen);
    pass->load(li);
    rt::LayerCapture what;
    what.moe_inputs = true;
    pass->begin_capture(what);
    pass->run(dev.data(), n, true);
    pass->end_capture();
    const rt::MoeInputs kept = pass->take_moe_inputs();
    const double ys = max_abs(x), dy = max_diff(dev, x);
    EXPECT_LE(dy, 1e-4 * ys) << "layer output (scale " << ys << ")";
    worst_y = std::max(worst_y, dy / ys);
    if (!c.moe_layer(li)) {
      EXPECT_TRUE(kept.x.empty() && kept.experts.empty());
      continue;
    }
    ++sparse;
    EXPECT_EQ(kept.experts, seen.experts);
    const double xs = max_abs(seen.xn), dx = max_diff(kept.x, seen.xn);
    EXPECT_LE(dx, 1e-4 * xs) << "MLP input";
    worst_x = std::max(worst_x, dx / xs);
    // The routing weights show in the layer output, compared above.
  }
  EXPECT_GT(sparse, 0);
  std::printf("%s layer pass vs cpu: MLP input within %.3g, layer output within %.3g of their scales\n", GetParam(),
              worst_x, worst_y);
}

// What the calibration pipeline hands the quantizer for each Linear.
struct Seen {
  std::vector<double> h;
  int64_t samples = 0, tokens = -1;
  float lo = 0, hi = 0;
  std::string note;
  double damp = 1.0;
};
struct Calibrated {
  std::map<std::string, Seen> linears;
  std::vector<std::pair<float, float>> kv;
};

Calibrated calibrate(const std::filesystem::path& dir, device::Kind kind, const std::vector<std::vector<int32_t>>& samples,
                     uint64_t max_memory = 0, bool all_experts = false, bool bf16 = false) {
  std::unique_ptr<rt::Model> m = rt::load_hf_model(dir);
  Calibrated r;
  const QuantizeFn record = [&](const LinearToQuantize& in) -> std::optional<QuantizedLinearResult> {
    Seen& s = r.linears[in.name];
    if (in.hessian) s.h = in.hessian->matrix(), s.samples = in.hessian->samples();
    s.lo = in.act_min, s.hi = in.act_max, s.tokens = in.expert_tokens, s.note = in.note, s.damp = in.dampening_scale;
    return std::nullopt;  // the layers stay float: the next layer's inputs are the float model's
  };
  SequentialOptions o;
  o.device = kind;
  o.max_memory_bytes = max_memory;
  o.observe_ranges = true;
  o.kv_amax = &r.kv;
  o.moe_calibrate_all_experts = all_experts;
  o.bf16 = bf16;
  ThreadPool pool(2);
  run_sequential(*m, samples, record, pool, {}, o);
  return r;
}

// The bounds of sequential_device_test.cpp, and the experts' bookkeeping
// equal. The device's values differ from the CPU's by about 1e-6 of their
// row's scale, not of each value, and an expert may see very few tokens (one
// on the fixture): then a column whose energy is 1e-8 of the average (a
// tiny value, a cancellation in the gate/up product) has a large relative
// error of its own (measured: 5.5e-3 of sqrt(H_ii H_jj) on such a column). So
// the per-element bound is taken against sqrt(max(H_ii, f) max(H_jj, f)),
// f = 1e-4 of the mean diagonal: columns below that carry too little energy
// to matter to GPTQ, and the Frobenius bound covers the whole matrix.
void expect_same_statistics(const Calibrated& cpu, const Calibrated& dev, const char* what) {
  ASSERT_EQ(cpu.linears.size(), dev.linears.size());
  ASSERT_FALSE(cpu.linears.empty());
  double worst = 0, worst_frob = 0;
  int experts = 0;
  for (const auto& [name, c] : cpu.linears) {
    SCOPED_TRACE(name);
    const auto it = dev.linears.find(name);
    ASSERT_NE(it, dev.linears.end());
    const Seen& d = it->second;
    EXPECT_EQ(d.tokens, c.tokens);
    EXPECT_EQ(d.samples, c.samples);
    EXPECT_EQ(d.note, c.note);
    EXPECT_EQ(d.damp, c.damp);
    experts += c.tokens >= 0;
    ASSERT_EQ(d.h.size(), c.h.size());
    const size_t n = static_cast<size_t>(std::llround(std::sqrt(static_cast<double>(c.h.size()))));
    ASSERT_EQ(n * n, c.h.size());
    double num = 0, den = 0, floor = 0;
    for (size_t i = 0; i < n; ++i) floor += 1e-4 * c.h[i * n + i] / static_cast<double>(n);
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < n; ++j) {
        const double scale = std::sqrt(std::max(c.h[i * n + i], floor) * std::max(c.h[j * n + j], floor)) + 1e-30;
        const double e = std::fabs(d.h[i * n + j] - c.h[i * n + j]) / scale;
        worst = std::max(worst, e);
        ASSERT_LE(e, 2e-3) << "H[" << i << "," << j << "] device " << d.h[i * n + j] << " cpu " << c.h[i * n + j];
        num += (d.h[i * n + j] - c.h[i * n + j]) * (d.h[i * n + j] - c.h[i * n + j]), den += c.h[i * n + j] * c.h[i * n + j];
      }
    if (den > 0) {
      EXPECT_LE(std::sqrt(num / den), 5e-4) << "relative Frobenius difference";
      worst_frob = std::max(worst_frob, std::sqrt(num / den));
    }
    const double span = std::max(std::fabs(c.lo), std::fabs(c.hi));
    EXPECT_GT(span, 0.0);
    EXPECT_NEAR(d.lo, c.lo, 2e-3 * span);
    EXPECT_NEAR(d.hi, c.hi, 2e-3 * span);
  }
  EXPECT_GT(experts, 0);
  ASSERT_EQ(cpu.kv.size(), dev.kv.size());
  for (size_t l = 0; l < cpu.kv.size(); ++l) {
    EXPECT_NEAR(dev.kv[l].first, cpu.kv[l].first, 2e-3 * cpu.kv[l].first) << "layer " << l;
    EXPECT_NEAR(dev.kv[l].second, cpu.kv[l].second, 2e-3 * cpu.kv[l].second) << "layer " << l;
  }
  std::printf("%s: largest Hessian difference %.3g of sqrt(H_ii H_jj), %.3g in Frobenius norm\n", what, worst, worst_frob);
}

using test::random_samples;

void expect_calibration_matches(device::Kind kind) {
  // The trained fixture on real calibration text.
  const std::filesystem::path fx = data_dir("fixture-mixtral");
  if (!std::filesystem::exists(fx / "model.safetensors")) GTEST_SKIP() << fx << " is absent";
  std::unique_ptr<Tokenizer> tok = load_tokenizer(fx);
  CalibrationOptions co;
  co.num_samples = 6, co.seq_len = 96;
  const auto text = load_calibration(test::source_dir() / "tests/data/text/calibration.txt", *tok, co);
  ASSERT_EQ(text.size(), 6u);
  expect_same_statistics(calibrate(fx, device::Kind::Cpu, text), calibrate(fx, kind, text), "fixture-mixtral");
  // qwen2_moe: the shared expert, no renormalisation, a dense layer.
  const std::filesystem::path q = data_dir("moe-tiny/qwen2_moe");
  const auto rnd = random_samples(rt::load_hf_model(q)->config().vocab_size, 3, 40, 11);
  expect_same_statistics(calibrate(q, device::Kind::Cpu, rnd), calibrate(q, kind, rnd), "moe-tiny/qwen2_moe");
  // calibration.precision bf16: the experts (every quantizable Linear) in
  // bf16, the routers and the shared expert's gate in f32, as on the CPU.
  expect_same_statistics(calibrate(q, device::Kind::Cpu, rnd, 0, false, true), calibrate(q, kind, rnd, 0, false, true),
                         "moe-tiny/qwen2_moe, bf16");
}

TEST(MoeDeviceCalibration, HostLayerPassMeasuresWhatTheCpuDoes) { expect_calibration_matches(device::Kind::Host); }

TEST(MoeDeviceCalibration, CudaLayerPassMeasuresWhatTheCpuDoes) {
  std::string why;
  if (!device::cuda_usable(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  expect_calibration_matches(device::Kind::Cuda);
}

// Experts no token reaches (one token, k experts of each layer) get the CPU's
// notes and ranges over every token; with moe_calibrate_all_experts every
// expert sees every token; the hidden states (and the kept MLP inputs) in
// host memory, spilled, give the bits they give on the device.
TEST(MoeDeviceCalibration, FallbacksAllExpertsAndSpillingAsOnTheCpu) {
  const std::filesystem::path q = data_dir("moe-tiny/qwen3_moe");
  if (!std::filesystem::exists(q / "model.safetensors")) GTEST_SKIP() << q << " is absent";
  const int64_t vocab = rt::load_hf_model(q)->config().vocab_size;
  const auto one = random_samples(vocab, 1, 1, 3);
  const Calibrated cpu_one = calibrate(q, device::Kind::Cpu, one), dev_one = calibrate(q, device::Kind::Host, one);
  int unreached = 0;
  for (const auto& [name, s] : dev_one.linears) unreached += s.tokens == 0;
  EXPECT_GT(unreached, 0);
  expect_same_statistics(cpu_one, dev_one, "qwen3_moe, one token");
  const auto two = random_samples(vocab, 2, 64, 5);
  expect_same_statistics(calibrate(q, device::Kind::Cpu, two, 0, true), calibrate(q, device::Kind::Host, two, 0, true),
                         "qwen3_moe, every token to every expert");
  const Calibrated resident = calibrate(q, device::Kind::Host, two), spilled = calibrate(q, device::Kind::Host, two, 1);
  ASSERT_EQ(resident.linears.size(), spilled.linears.size());
  for (const auto& [name, r] : resident.linears) {
    const Seen& s = spilled.linears.at(name);
    EXPECT_EQ(r.h, s.h) << name;
    EXPECT_EQ(r.tokens, s.tokens) << name;
    EXPECT_EQ(r.lo, s.lo) << name;
    EXPECT_EQ(r.hi, s.hi) << name;
  }
  EXPECT_EQ(resident.kv, spilled.kv);
}

// The device memory estimates count every expert, and what the device does
// not do for MoE models is refused in one clear error.
TEST(MoeDeviceCalibration, MemoryEstimatesCountEveryExpertAndRefusalsAreClear) {
  const std::filesystem::path fx = data_dir("fixture-mixtral");
  if (!std::filesystem::exists(fx / "model.safetensors")) GTEST_SKIP() << fx << " is absent";
  std::unique_ptr<rt::Model> m = rt::load_hf_model(fx);
  const ModelConfig& c = m->config();
  uint64_t experts = 0, largest_layer = 0;  // f16 weights as stored; a layer's at 4 bytes a weight
  for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
    uint64_t layer = 0;
    for (const rt::LayerLinearId& id : rt::layer_linears(c, li)) {
      const rt::LinearShape sh = rt::layer_linear_shape(c, id);
      if (id.expert >= 0) experts += static_cast<uint64_t>(sh.out * sh.in) * 2;
      layer += static_cast<uint64_t>(sh.out * sh.in) * 4;
    }
    largest_layer = std::max(largest_layer, layer);
  }
  ASSERT_EQ(experts, 3u * 8 * 3 * 256 * 256 * 2);
  std::unique_ptr<rt::DeviceDecoder> d = rt::make_device_decoder(device::Kind::Host, *m, 64);
  EXPECT_GE(rt::device_decoder_bytes(*m, 64), experts + 64 * d->kv_bytes_per_token());
  // One layer's experts at 4 bytes a weight and one expert's two Hessians in double.
  EXPECT_GE(rt::device_layer_pass_bytes(*m, 64, true), largest_layer + 2 * 256 * 256 * 8);
  EXPECT_QF_ERROR(d->collect_square_sums(false), ErrorKind::Unsupported, "mixture-of-experts");
  EXPECT_QF_ERROR(rt::make_device_smoothing_eval(device::Kind::Host, *m, 64), ErrorKind::Unsupported,
                  "dense layers only");
}

INSTANTIATE_TEST_SUITE_P(Architectures, MoeDevice, test::kMoeCheckpoints, test::checkpoint_param_name);

}  // namespace
}  // namespace qf
