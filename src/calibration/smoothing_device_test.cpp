// AWQ and SmoothQuant with their evaluations on the device (host build)
// against the CPU versions, on the bundled fixture's first two layers with
// real calibration text: the same mappings searched, the same losses up to
// rounding, and weights that end up the same. The block outputs the losses
// compare differ from the CPU's by summation order and by K/V elements that
// round to the other f16 neighbour (about 1e-4 of an attention output, see
// sequential_device_test.cpp); a loss is a mean of squared differences
// between a quantized and the float block, so it moves by about 2e-4
// relative: 2e-3 is allowed. The |x| statistics of layer 0's first input
// are computed alike on both sides, so its scales are bit-identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "calibration/calibration_data.h"
#include "calibration/smoothing.h"
#include "formats/tokenizer/tokenizer.h"
#include "quantizers/quant_scheme.h"
#include "quantizers/rtn.h"
#include "runtime/model.h"
#include "test_util.h"

namespace qf {
namespace {

const std::filesystem::path& fixture() {
  static const std::filesystem::path p = test::source_dir() / "tests/data/fixture-llama";
  return p;
}

std::vector<std::vector<int32_t>> samples() {
  std::unique_ptr<Tokenizer> tok = load_tokenizer(fixture());
  CalibrationOptions co;
  co.num_samples = 4, co.seq_len = 80;
  return load_calibration(test::source_dir() / "tests/data/text/calibration.txt", *tok, co);
}

// The hidden states entering layer `li` of the float model, per sample.
std::vector<std::vector<float>> layer_inputs(const rt::Model& m, const std::vector<std::vector<int32_t>>& s, int64_t li) {
  ThreadPool pool(2);
  std::vector<std::vector<float>> out;
  for (const auto& toks : s) {
    rt::KvCache cache = m.make_cache(rt::KvDType::F16, static_cast<int64_t>(toks.size()));
    const int32_t seq = cache.add_sequence();
    rt::Batch b;
    for (size_t j = 0; j < toks.size(); ++j) b.add(toks[j], seq, static_cast<int64_t>(j), false);
    m.check_batch(b, cache);
    std::vector<float> x(toks.size() * static_cast<size_t>(m.config().hidden_size));
    m.embed(b, x.data());
    for (int64_t l = 0; l < li; ++l) m.forward_layer(l, b, x.data(), cache, pool);
    out.push_back(std::move(x));
  }
  return out;
}

// W4 g32 symmetric round-to-nearest, as the fake quantizer of every Linear.
std::vector<float> fake_w4(const std::string&, const float* w, int64_t rows, int64_t cols) {
  return quantize_rtn(w, rows, cols, QuantScheme::make(4, true, QuantStrategy::Group, 32)).dequantize();
}

struct Outcome {
  SmoothingReport report;
  std::vector<std::vector<float>> weights;  // the layer's seven Linears and two norms afterwards
};

template <class F>
Outcome run(device::Kind kind, int64_t li, F smooth) {
  std::unique_ptr<rt::Model> m = rt::load_hf_model(fixture());
  const auto s = samples();
  const auto in = layer_inputs(*m, s, li);
  LayerCalib calib{&s, [&](size_t i) { return in[i]; }};
  Outcome o;
  ThreadPool pool(2);
  o.report = smooth(*m, li, calib, kind, pool);
  const rt::LayerWeights& L = m->mutable_layer(li);
  for (const rt::LayerLinear& ll : rt::kLayerLinears) o.weights.push_back((L.*ll.member)->decode_all());
  o.weights.push_back(L.attn_norm), o.weights.push_back(L.ffn_norm);
  return o;
}

void expect_same(const Outcome& cpu, const Outcome& host, const std::string& what) {
  ASSERT_EQ(cpu.report.entries.size(), host.report.entries.size()) << what;
  ASSERT_FALSE(cpu.report.entries.empty()) << what;
  for (size_t i = 0; i < cpu.report.entries.size(); ++i) {
    const auto &c = cpu.report.entries[i], &h = host.report.entries[i];
    SCOPED_TRACE(what + ": " + c.what);
    EXPECT_EQ(h.what, c.what);
    EXPECT_GT(c.loss_before, 0.0);
    EXPECT_NEAR(h.loss_before, c.loss_before, 2e-3 * c.loss_before);
    EXPECT_NEAR(h.loss_after, c.loss_after, 2e-3 * c.loss_after);
  }
  EXPECT_EQ(host.report.lines.size(), cpu.report.lines.size()) << what;
  // Where both picked the same candidates, the weights agree to the
  // statistics' rounding, except where the clip search's discrete choice of
  // a group's max_val went the other way (measured: 11 weights of 196608 in
  // up_proj and down_proj of layer 0, 1 in layer 1): at most 0.1%.
  bool same_picks = true;
  for (size_t i = 0; i < cpu.report.entries.size(); ++i)
    same_picks = same_picks && cpu.report.entries[i].ratio == host.report.entries[i].ratio;
  if (!same_picks) return;
  ASSERT_EQ(cpu.weights.size(), host.weights.size());
  for (size_t k = 0; k < cpu.weights.size(); ++k) {
    ASSERT_EQ(cpu.weights[k].size(), host.weights[k].size());
    double amax = 0;
    for (float v : cpu.weights[k]) amax = std::max(amax, std::fabs(static_cast<double>(v)));
    size_t off = 0;
    for (size_t i = 0; i < cpu.weights[k].size(); ++i)
      off += std::fabs(static_cast<double>(cpu.weights[k][i]) - host.weights[k][i]) > 2e-3 * amax;
    EXPECT_LE(off, cpu.weights[k].size() / 1000) << what << ": tensor " << k << ", " << off << " weights differ";
  }
}

void expect_awq_matches_the_cpu(device::Kind kind) {
  for (int64_t li : {0, 1}) {
    const auto awq = [](rt::Model& m, int64_t l, const LayerCalib& c, device::Kind k, ThreadPool& p) {
      AwqOptions o;
      o.group_size = 32, o.device = k;
      o.loss = AwqLoss::Module;  // what the device scores, on both sides
      return awq_layer(m, l, c, fake_w4, o, p);
    };
    expect_same(run(device::Kind::Cpu, li, awq), run(kind, li, awq), "awq layer " + std::to_string(li));
  }
}

void expect_smoothquant_matches_the_cpu(device::Kind kind) {
  for (int64_t li : {0, 1}) {
    const auto sq = [](rt::Model& m, int64_t l, const LayerCalib& c, device::Kind k, ThreadPool& p) {
      SmoothQuantOptions o;
      o.search = true, o.device = k;
      const TrialLinearFn trial = [](const std::string& name, const float* w, int64_t rows, int64_t cols,
                                     const std::vector<float>& bias) -> std::shared_ptr<rt::Linear> {
        std::vector<float> q = fake_w4(name, w, rows, cols);
        Tensor t = Tensor::zeros(DType::F32, {rows, cols});
        std::copy(q.begin(), q.end(), t.mutable_data_as<float>());
        const std::optional<Tensor> b = rt::bias_tensor(bias);
        return rt::make_dense_linear(t, b ? &*b : nullptr, name);
      };
      return smoothquant_layer(m, l, c, o, trial, p);
    };
    expect_same(run(device::Kind::Cpu, li, sq), run(kind, li, sq), "smoothquant layer " + std::to_string(li));
  }
}

TEST(SmoothingDevice, AwqOnTheHostBuildMatchesTheCpu) { expect_awq_matches_the_cpu(device::Kind::Host); }

TEST(SmoothingDevice, SmoothQuantSearchOnTheHostBuildMatchesTheCpu) {
  expect_smoothquant_matches_the_cpu(device::Kind::Host);
}

TEST(SmoothingDevice, CudaBuildMatchesTheCpu) {
  std::string why;
  if (!device::cuda_usable(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  expect_awq_matches_the_cpu(device::Kind::Cuda);
  expect_smoothquant_matches_the_cpu(device::Kind::Cuda);
}

}  // namespace
}  // namespace qf
