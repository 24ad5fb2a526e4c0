// The importance matrix from the device decoder (host build) against the CPU
// runtime's on the bundled fixture and real text: the same entries and
// token counts, and the same per-column sums of x^2 up to rounding. Layer
// 0's q/k/v input is the normed embedding, computed in the same order on
// both sides, so its sums are identical; deeper inputs move by f32
// summation order and by the K/V elements that round to the other f16
// neighbour (see sequential_device_test.cpp): 2e-3 relative per column.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "calibration/imatrix_collect.h"
#include "core/io.h"
#include "core/thread_pool.h"
#include "device/device.h"
#include "runtime/model.h"
#include "test_util.h"

namespace qf {
namespace {

void expect_sums_what_the_cpu_sums(device::Kind kind) {
  const auto fixture = test::source_dir() / "tests/data/fixture-llama";
  std::unique_ptr<rt::Model> m = rt::load_hf_model(fixture);
  std::unique_ptr<Tokenizer> tok = load_tokenizer(fixture);
  const std::string text = read_text_file(test::source_dir() / "tests/data/text/calibration.txt");
  ImatrixOptions o;
  o.ctx = 128, o.max_chunks = 3, o.process_output = true;
  ThreadPool pool(2);
  const Imatrix cpu = compute_imatrix(*m, *tok, text, o, pool);
  o.device = kind;
  const Imatrix host = compute_imatrix(*m, *tok, text, o, pool);
  EXPECT_EQ(host.chunk_count, cpu.chunk_count);
  EXPECT_EQ(host.chunk_size, cpu.chunk_size);
  ASSERT_EQ(host.entries.size(), cpu.entries.size());
  ASSERT_EQ(cpu.entries.size(), static_cast<size_t>(7 * m->config().num_hidden_layers + 1));
  double worst = 0;
  for (const auto& [name, c] : cpu.entries) {
    SCOPED_TRACE(name);
    const auto it = host.entries.find(name);
    ASSERT_NE(it, host.entries.end());
    const ImatrixEntry& h = it->second;
    EXPECT_EQ(h.count, c.count);
    ASSERT_EQ(h.in_sum2.size(), c.in_sum2.size());
    for (size_t j = 0; j < c.in_sum2.size(); ++j) {
      ASSERT_GT(c.in_sum2[j], 0.0f) << "column " << j;
      const double d = std::fabs(static_cast<double>(h.in_sum2[j]) - c.in_sum2[j]) / c.in_sum2[j];
      worst = std::max(worst, d);
      ASSERT_LE(d, 2e-3) << "column " << j << ": host " << h.in_sum2[j] << " cpu " << c.in_sum2[j];
    }
    if (name == "blk.0.attn_q.weight") {
      EXPECT_EQ(h.in_sum2, c.in_sum2) << "the first layer's input is computed alike";
    }
  }
  std::printf("imatrix on %s vs cpu: largest relative column difference %.3g\n", device::kind_name(kind), worst);
}

TEST(ImatrixDevice, HostDecoderSumsWhatTheCpuSums) { expect_sums_what_the_cpu_sums(device::Kind::Host); }

TEST(ImatrixDevice, CudaDecoderSumsWhatTheCpuSums) {
  std::string why;
  if (!device::cuda_usable(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  expect_sums_what_the_cpu_sums(device::Kind::Cuda);
}

}  // namespace
}  // namespace qf
