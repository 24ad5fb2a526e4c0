// The sequential pipeline's calibration forward on the device (the layer
// pass of runtime/device_runtime.h, host build) against the CPU runtime's,
// on the bundled fixture with real calibration text: every Linear gets the
// same Hessian, input range and sample count, and every layer the same K/V
// maxima, up to rounding. The two differ in summation order (the GEMMs, the
// Hessian's running sum), which alone moves the hidden states by about 1e-6
// relative; where that nudges a K or V element across an f16 rounding
// boundary, the cached element moves by one f16 step (2^-11 relative) and
// the attention output feeding o_proj by up to a few 1e-4 of its scale
// (measured on the fixture: 2.3e-4 at worst and 4.2e-5 in Frobenius norm
// against the AVX-512 and AVX2 kernels, 1.0e-4 and 1.0e-5 against the
// scalar ones). How many elements flip is a matter of chance, so the bounds
// leave about ten times that: each Hessian element may move by 2e-3 of
// sqrt(H_ii H_jj), the whole matrix by 5e-4 in Frobenius norm. A wrong
// input, a missing row or a lost 2/N factor moves it by order 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "calibration/calibration_data.h"
#include "calibration/sequential.h"
#include "formats/tokenizer/tokenizer.h"
#include "runtime/model.h"
#include "test_util.h"

namespace qf {
namespace {

struct Seen {
  std::vector<double> h;
  int64_t samples = 0;
  float lo = 0, hi = 0;
};

struct Calibrated {
  std::map<std::string, Seen> linears;
  std::vector<std::pair<float, float>> kv;
};

Calibrated calibrate(device::Kind kind, const std::vector<std::vector<int32_t>>& samples, uint64_t max_memory = 0) {
  std::unique_ptr<rt::Model> m = rt::load_hf_model(test::source_dir() / "tests/data/fixture-llama");
  Calibrated r;
  const QuantizeFn record = [&](const LinearToQuantize& in) -> std::optional<QuantizedLinearResult> {
    Seen& s = r.linears[in.name];
    s.h = in.hessian->matrix();
    s.samples = in.hessian->samples();
    s.lo = in.act_min, s.hi = in.act_max;
    return std::nullopt;  // the layer stays float: the next layer's inputs are the float model's
  };
  SequentialOptions o;
  o.device = kind;
  o.max_memory_bytes = max_memory;
  o.observe_ranges = true;
  o.kv_amax = &r.kv;
  ThreadPool pool(2);
  run_sequential(*m, samples, record, pool, {}, o);
  return r;
}

// `n` calibration samples of `len` tokens from the real calibration text.
std::vector<std::vector<int32_t>> fixture_samples(int64_t n, int64_t len) {
  std::unique_ptr<Tokenizer> tok = load_tokenizer(test::source_dir() / "tests/data/fixture-llama");
  CalibrationOptions co;
  co.num_samples = n, co.seq_len = len;
  return load_calibration(test::source_dir() / "tests/data/text/calibration.txt", *tok, co);
}

void expect_measures_what_the_cpu_does(device::Kind kind) {
  const std::vector<std::vector<int32_t>> samples = fixture_samples(6, 96);
  ASSERT_EQ(samples.size(), 6u);
  const Calibrated cpu = calibrate(device::Kind::Cpu, samples), host = calibrate(kind, samples);
  ASSERT_EQ(cpu.linears.size(), host.linears.size());
  ASSERT_FALSE(cpu.linears.empty());
  double worst = 0, worst_frob = 0;
  for (const auto& [name, c] : cpu.linears) {
    SCOPED_TRACE(name);
    const auto it = host.linears.find(name);
    ASSERT_NE(it, host.linears.end());
    const Seen& h = it->second;
    EXPECT_EQ(h.samples, c.samples);
    ASSERT_EQ(h.h.size(), c.h.size());
    const size_t n = static_cast<size_t>(std::llround(std::sqrt(static_cast<double>(c.h.size()))));
    ASSERT_EQ(n * n, c.h.size());
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < n; ++j) {
        const double scale = std::sqrt(c.h[i * n + i] * c.h[j * n + j]) + 1e-30;
        const double d = std::fabs(h.h[i * n + j] - c.h[i * n + j]) / scale;
        worst = std::max(worst, d);
        ASSERT_LE(d, 2e-3) << "H[" << i << "," << j << "] host " << h.h[i * n + j] << " cpu " << c.h[i * n + j];
      }
    double num = 0, den = 0;
    for (size_t i = 0; i < c.h.size(); ++i) num += (h.h[i] - c.h[i]) * (h.h[i] - c.h[i]), den += c.h[i] * c.h[i];
    EXPECT_LE(std::sqrt(num / den), 5e-4) << "relative Frobenius difference";
    worst_frob = std::max(worst_frob, std::sqrt(num / den));
    const double span = std::max(std::fabs(c.lo), std::fabs(c.hi));
    EXPECT_GT(span, 0.0);
    EXPECT_NEAR(h.lo, c.lo, 2e-3 * span);
    EXPECT_NEAR(h.hi, c.hi, 2e-3 * span);
  }
  ASSERT_EQ(cpu.kv.size(), host.kv.size());
  for (size_t l = 0; l < cpu.kv.size(); ++l) {
    EXPECT_GT(cpu.kv[l].first, 0.0f);
    EXPECT_NEAR(host.kv[l].first, cpu.kv[l].first, 2e-3 * cpu.kv[l].first) << "layer " << l;
    EXPECT_NEAR(host.kv[l].second, cpu.kv[l].second, 2e-3 * cpu.kv[l].second) << "layer " << l;
  }
  std::printf("%s layer pass vs cpu: largest Hessian difference %.3g of sqrt(H_ii H_jj), %.3g in Frobenius norm\n",
              device::kind_name(kind), worst, worst_frob);
}

TEST(SequentialDevice, HostLayerPassMeasuresWhatTheCpuDoes) { expect_measures_what_the_cpu_does(device::Kind::Host); }

TEST(SequentialDevice, CudaLayerPassMeasuresWhatTheCpuDoes) {
  std::string why;
  if (!device::cuda_usable(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  expect_measures_what_the_cpu_does(device::Kind::Cuda);
}

// With the hidden states in host memory (spilled to disk here: a 1-byte
// budget) the device computes exactly what it computes with them resident.
TEST(SequentialDevice, HiddenStatesOnTheDeviceOrInHostMemoryGiveTheSameResult) {
  const std::vector<std::vector<int32_t>> samples = fixture_samples(3, 64);
  SequentialOptions o;
  o.device = device::Kind::Host;
  EXPECT_TRUE(hidden_states_on_device(o, 1 << 20));
  o.max_memory_bytes = 1;
  EXPECT_FALSE(hidden_states_on_device(o, 1 << 20));
  o.device = device::Kind::Cpu;
  o.max_memory_bytes = 0;
  EXPECT_FALSE(hidden_states_on_device(o, 1));
  const Calibrated resident = calibrate(device::Kind::Host, samples), spilled = calibrate(device::Kind::Host, samples, 1);
  ASSERT_EQ(resident.linears.size(), spilled.linears.size());
  for (const auto& [name, r] : resident.linears) {
    const Seen& s = spilled.linears.at(name);
    EXPECT_EQ(r.h, s.h) << name;
    EXPECT_EQ(r.samples, s.samples) << name;
    EXPECT_EQ(r.lo, s.lo) << name;
    EXPECT_EQ(r.hi, s.hi) << name;
  }
  EXPECT_EQ(resident.kv, spilled.kv);
}

}  // namespace
}  // namespace qf
