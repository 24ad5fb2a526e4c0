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

Calibrated calibrate(device::Kind kind, const std::vector<std::vector<int32_t>>& samples) {
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
  o.observe_ranges = true;
  o.kv_amax = &r.kv;
  ThreadPool pool(2);
  run_sequential(*m, samples, record, pool, {}, o);
  return r;
}

TEST(SequentialDevice, HostLayerPassMeasuresWhatTheCpuDoes) {
  const auto fixture = test::source_dir() / "tests/data/fixture-llama";
  std::unique_ptr<Tokenizer> tok = load_tokenizer(fixture);
  CalibrationOptions co;
  co.num_samples = 6, co.seq_len = 96;
  const std::vector<std::vector<int32_t>> samples =
      load_calibration(test::source_dir() / "tests/data/text/calibration.txt", *tok, co);
  ASSERT_EQ(samples.size(), 6u);
  const Calibrated cpu = calibrate(device::Kind::Cpu, samples), host = calibrate(device::Kind::Host, samples);
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
  std::printf("device layer pass vs cpu: largest Hessian difference %.3g of sqrt(H_ii H_jj), %.3g in Frobenius norm\n",
              worst, worst_frob);
}

}  // namespace
}  // namespace qf
