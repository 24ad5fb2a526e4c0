// The device quantizers against the CPU reference, on shapes that are not
// multiples of anything the code blocks by. The host build always runs; the
// cuda build runs the same cases when a CUDA device is usable and skips,
// saying why, when it is not.
#include "quantizers/device_quantizers.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"

namespace qf {
namespace {

using AO = GptqOptions::ActOrder;

std::vector<float> weights(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 0.05f);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (auto& x : w) x = g(rng);
  // an outlier column, an all-zero row and a zero group: the edge cases of the ranges
  for (int64_t r = 0; r < rows; ++r) w[static_cast<size_t>(r * cols + 3)] *= 20.0f;
  std::fill(w.begin() + cols, w.begin() + 2 * cols, 0.0f);
  return w;
}

void expect_same(const QuantizedTensor& a, const QuantizedTensor& b, const std::string& what) {
  ASSERT_EQ(a.q.size(), b.q.size()) << what;
  int64_t diff = 0;
  for (size_t i = 0; i < a.q.size(); ++i) diff += a.q[i] != b.q[i];
  EXPECT_EQ(diff, 0) << what << ": codes differ";
  ASSERT_EQ(a.scales.size(), b.scales.size()) << what;
  EXPECT_EQ(0, std::memcmp(a.scales.data(), b.scales.data(), a.scales.size() * sizeof(float))) << what << ": scales";
  EXPECT_EQ(a.zeros, b.zeros) << what << ": zeros";
  EXPECT_EQ(a.g_idx, b.g_idx) << what << ": g_idx";
  EXPECT_EQ(hd::bits_of(a.global_scale), hd::bits_of(b.global_scale)) << what << ": global scale";
}

std::vector<device::Kind> device_kinds() {
  std::vector<device::Kind> k{device::Kind::Host};
  if (device::cuda_usable(nullptr)) k.push_back(device::Kind::Cuda);
  return k;
}

TEST(DeviceQuantizers, CudaBuildRunsWhereAGpuIs) {
  std::string why;
  if (!device::cuda_usable(&why)) GTEST_SKIP() << "no CUDA device, the cuda build's cases are skipped: " << why;
  SUCCEED();
}

TEST(DeviceQuantizers, CudaLibrariesLoadWithEveryEntryPoint) {
#if QF_HAVE_CUDA
  std::string why;
  EXPECT_TRUE(device::cuda_libraries_load(&why)) << why;
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(DeviceQuantizers, RtnIsBitIdentical) {
  struct Case {
    int64_t rows, cols;
    QuantScheme s;
  };
  const std::vector<Case> cases = {
      {37, 1000, QuantScheme::make(4, true, QuantStrategy::Group, 40)},
      {37, 1000, QuantScheme::make(4, false, QuantStrategy::Group, 125, DType::BF16)},
      {29, 689, QuantScheme::make(8, true, QuantStrategy::Channel, 128, DType::F32)},
      {29, 689, QuantScheme::make(3, false, QuantStrategy::Channel)},
      {13, 688, QuantScheme::make(8, false, QuantStrategy::Tensor)},
  };
  for (device::Kind k : device_kinds())
    for (const Case& c : cases) {
      std::vector<float> w = weights(c.rows, c.cols, 11);
      w[17] = std::numeric_limits<float>::quiet_NaN();  // NaN gets the zero point on both
      const std::string what = std::string(device::kind_name(k)) + " " + c.s.describe();
      expect_same(quantize_rtn(w.data(), c.rows, c.cols, c.s),
                  quantize_rtn_on(k, w.data(), c.rows, c.cols, c.s), what);
    }
}

TEST(DeviceQuantizers, Fp8AndNvfp4AreBitIdentical) {
  for (device::Kind k : device_kinds()) {
    const std::string dev = device::kind_name(k);
    const std::vector<float> w = weights(31, 1008, 12);
    for (const QuantScheme& s : {QuantScheme::fp8(QuantStrategy::Tensor), QuantScheme::fp8(QuantStrategy::Channel, DType::BF16),
                                 QuantScheme::fp8(QuantStrategy::Group, DType::F16, 48)})
      expect_same(quantize_fp8(w.data(), 31, 1008, s), quantize_fp8_on(k, w.data(), 31, 1008, s), dev + " " + s.describe());
    expect_same(quantize_nvfp4(w.data(), 31, 1008, QuantScheme::nvfp4()),
                quantize_nvfp4_on(k, w.data(), 31, 1008, QuantScheme::nvfp4()), dev + " nvfp4");
    expect_same(quantize_nvfp4(w.data(), 31, 1008, QuantScheme::nvfp4(), 3.5f),
                quantize_nvfp4_on(k, w.data(), 31, 1008, QuantScheme::nvfp4(), 3.5f), dev + " nvfp4 shared amax");
    std::vector<float> bad = w;
    bad[500] = std::numeric_limits<float>::infinity();
    for (bool nv : {false, true}) {
      try {
        if (nv) quantize_nvfp4_on(k, bad.data(), 31, 1008, QuantScheme::nvfp4());
        else quantize_fp8_on(k, bad.data(), 31, 1008, QuantScheme::fp8(QuantStrategy::Channel));
        ADD_FAILURE() << dev << ": a non-finite weight was accepted";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
        EXPECT_NE(std::string(e.what()).find("not finite"), std::string::npos) << e.what();
      }
    }
  }
}

// A Hessian from correlated inputs (random mixing, a few loud columns, one
// dead column), as calibration gives.
std::vector<double> hessian(int64_t cols, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> g(0.0, 1.0);
  std::vector<double> z(static_cast<size_t>(n * cols)), x(static_cast<size_t>(n * cols), 0.0);
  for (auto& v : z) v = g(rng);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < cols; ++c) {
      double s = z[static_cast<size_t>(t * cols + c)];
      if (c > 0) s += 0.7 * z[static_cast<size_t>(t * cols + c - 1)];
      if (c % 23 == 0) s *= 6.0;
      x[static_cast<size_t>(t * cols + c)] = c == 5 ? 0.0 : s;
    }
  std::vector<double> h(static_cast<size_t>(cols * cols), 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < cols; ++i)
      for (int64_t j = 0; j < cols; ++j)
        h[static_cast<size_t>(i * cols + j)] += 2.0 / n * x[static_cast<size_t>(t * cols + i)] * x[static_cast<size_t>(t * cols + j)];
  return h;
}

// Share of codes that differ between two results of the same shape.
double disagreement(const QuantizedTensor& a, const QuantizedTensor& b) {
  int64_t diff = 0;
  for (size_t i = 0; i < a.q.size(); ++i) diff += a.q[i] != b.q[i];
  return static_cast<double>(diff) / static_cast<double>(a.q.size());
}

struct GptqCase {
  QuantScheme s;
  AO order;
  int64_t block;
};

std::vector<GptqCase> gptq_cases() {
  return {
      {QuantScheme::make(4, true, QuantStrategy::Group, 50), AO::None, 64},    // block not a multiple of the group
      {QuantScheme::make(4, true, QuantStrategy::Group, 50), AO::Static, 32},
      {QuantScheme::make(4, false, QuantStrategy::Group, 25, DType::BF16), AO::Group, 40},
      {QuantScheme::make(4, true, QuantStrategy::Group, 50), AO::Weight, 128},
      {QuantScheme::make(8, true, QuantStrategy::Channel), AO::Group, 37},
      {QuantScheme::make(3, false, QuantStrategy::Tensor, 128, DType::F32), AO::None, 128},
  };
}

// The host build runs the same doubles in the same order as the CPU
// reference: its codes and scales are identical (the shared gptq_row_block
// per row; Eigen's GEMM gives the lazy updates the same sums for all rows at
// once as for the reference's 16-row chunks). The cuda build's cuBLAS GEMM
// sums in another order, and a code flips where a value sits within rounding
// of a decision boundary (then later refits may move too): at most 0.2% of
// the codes, with the loss within 1e-6.
void expect_gptq_agrees(device::Kind k, int64_t rows, int64_t cols, const GptqCase& c, uint32_t seed) {
  const std::vector<float> w = weights(rows, cols, seed);
  const std::vector<double> h = hessian(cols, 400, seed + 1);
  GptqOptions o;
  o.actorder = c.order;
  o.block_size = c.block;
  const std::string what = std::string(device::kind_name(k)) + " [" + std::to_string(rows) + ", " +
                           std::to_string(cols) + "] " + c.s.describe() + " actorder " + actorder_name(c.order) +
                           " block " + std::to_string(c.block);
  const GptqResult cpu = gptq_quantize(w.data(), rows, cols, h, c.s, o, "layer");
  const GptqResult dev = gptq_quantize_on(k, w.data(), rows, cols, h, c.s, o, "layer");
  ASSERT_TRUE(cpu.fallback.empty()) << what << ": " << cpu.fallback;
  EXPECT_TRUE(dev.fallback.empty()) << what << ": " << dev.fallback;
  EXPECT_EQ(dev.damp_used, cpu.damp_used) << what;
  ASSERT_GT(cpu.loss, 0.0) << what;
  if (k == device::Kind::Host) {
    expect_same(cpu.q, dev.q, what);
    EXPECT_NEAR(dev.loss, cpu.loss, 1e-12 * cpu.loss) << what << " (the same terms summed by row)";
  } else {
    EXPECT_EQ(dev.q.g_idx, cpu.q.g_idx) << what;
    EXPECT_LE(disagreement(cpu.q, dev.q), 0.002) << what;
    EXPECT_NEAR(dev.loss, cpu.loss, 1e-6 * cpu.loss) << what;
  }
}

TEST(DeviceQuantizers, GptqAgreesWithTheCpuReference) {
  for (device::Kind k : device_kinds())
    for (const GptqCase& c : gptq_cases()) expect_gptq_agrees(k, 67, 250, c, 13);
}

TEST(DeviceQuantizers, GptqAgreesOnAWiderLayer) {
  const GptqCase c{QuantScheme::make(4, true, QuantStrategy::Group, 125), AO::Group, 128};
  for (device::Kind k : device_kinds()) expect_gptq_agrees(k, 97, 1000, c, 23);
}

TEST(DeviceQuantizers, GptqHostBuildIsDeterministicAcrossThreadCounts) {
  const int64_t rows = 70, cols = 200;
  const std::vector<float> w = weights(rows, cols, 15);
  const std::vector<double> h = hessian(cols, 300, 16);
  GptqOptions o;
  o.actorder = AO::Group;
  o.block_size = 64;
  const QuantScheme s = QuantScheme::make(4, true, QuantStrategy::Group, 40);
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const GptqResult one = host::gptq_quantize(w.data(), rows, cols, h, s, o, "layer");
  omp_set_num_threads(3);
  const GptqResult three = host::gptq_quantize(w.data(), rows, cols, h, s, o, "layer");
  omp_set_num_threads(before);
  expect_same(one.q, three.q, "1 vs 3 threads");
  EXPECT_EQ(one.loss, three.loss);
}

TEST(DeviceQuantizers, GptqFallbacksMatchTheCpu) {
  const int64_t rows = 20, cols = 64;
  const std::vector<float> w = weights(rows, cols, 17);
  const QuantScheme s = QuantScheme::make(4, true, QuantStrategy::Group, 32);
  GptqOptions o;
  // Non-finite Hessian: RTN with the same message and codes.
  std::vector<double> h = hessian(cols, 100, 18);
  h[70] = std::numeric_limits<double>::infinity();
  // Indefinite and undamped: the schedule's diagonal floors, then success.
  std::vector<double> indef = hessian(cols, 100, 19);
  for (int64_t i = 0; i < cols; ++i) indef[static_cast<size_t>(i * cols + i)] *= (i == 9 ? -3.0 : 1.0);
  GptqOptions undamped;
  undamped.dampening_frac = 0.0;
  for (device::Kind k : device_kinds()) {
    const std::string dev = device::kind_name(k);
    const GptqResult a = gptq_quantize(w.data(), rows, cols, h, s, o, "layer");
    const GptqResult b = gptq_quantize_on(k, w.data(), rows, cols, h, s, o, "layer");
    ASSERT_FALSE(a.fallback.empty());
    EXPECT_EQ(a.fallback, b.fallback) << dev;
    expect_same(a.q, b.q, dev + " RTN fallback");
    const GptqResult c = gptq_quantize(w.data(), rows, cols, indef, s, undamped, "layer");
    const GptqResult d = gptq_quantize_on(k, w.data(), rows, cols, indef, s, undamped, "layer");
    EXPECT_EQ(c.fallback, d.fallback) << dev;
    EXPECT_EQ(c.damp_used, d.damp_used) << dev;
  }
}

// The device Hessian against the CPU accumulator, rows added in uneven batches.
template <class Sum>
void expect_hessian_matches(Sum& dev, const std::string& what) {
  const int64_t cols = 77, n = 700;
  std::mt19937 rng(31);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (auto& v : x) v = g(rng);
  for (int64_t t = 0; t < n; ++t) x[static_cast<size_t>(t * cols + 4)] *= 30.0f;  // a loud channel
  HessianAccumulator cpu(cols);
  cpu.add(x.data(), n, cols);
  cpu.finish();
  int64_t done = 0;
  for (int64_t batch : {100, 1, 313, 286}) {
    dev.add(x.data() + done * cols, batch);
    done += batch;
  }
  ASSERT_EQ(done, n);
  EXPECT_EQ(dev.samples(), n);
  const std::vector<double> a = cpu.matrix(), b = dev.matrix();
  ASSERT_EQ(a.size(), b.size());
  for (int64_t i = 0; i < cols; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const size_t k = static_cast<size_t>(i * cols + j);
      // Each entry is a sum of n products, bounded by the diagonal entries
      // (Cauchy-Schwarz). The device sums in double; the CPU sums each
      // chunk of kChunk rows in f32 (hessian_update.h), within
      // kChunk * 2^-24 of that bound.
      const double bound = std::sqrt(a[static_cast<size_t>(i * cols + i)] * a[static_cast<size_t>(j * cols + j)]);
      ASSERT_NEAR(b[k], a[k], (HessianAccumulator::kChunk * std::ldexp(1.0, -24) + 1e-12) * bound)
          << what << " H[" << i << "," << j << "]";
      ASSERT_EQ(b[k], b[static_cast<size_t>(j * cols + i)]) << what << ": not symmetric";
    }
}

TEST(DeviceQuantizers, HessianMatchesTheCpuAccumulator) {
  host::HessianSum h(77);
  EXPECT_THROW(h.matrix(), Error);  // no samples: an error, never a zero matrix
  expect_hessian_matches(h, "host");
}

TEST(DeviceQuantizers, HessianOnCudaMatchesTheCpuAccumulator) {
  std::string why;
  if (!device::cuda_usable(&why)) GTEST_SKIP() << "no CUDA device: " << why;
#if QF_HAVE_CUDA
  cuda::HessianSum c(77);
  expect_hessian_matches(c, "cuda");
#endif
}

// The mse observer: the same search steps (quantizers/mse_search.h), so the
// host build's scales are the CPU's bit for bit; the cuda build's pow is
// within 2 ulp of the host's, so a group whose two best candidates tie to
// within that may pick the other: at most 1% of the groups.
TEST(DeviceQuantizers, MseObserverMatches) {
  // Short patience matters on heavy-tailed data (4 u^5) in small groups:
  // the error along the grid is bumpy, so a group can improve again after
  // a few candidates without, and the early stop then changes the result.
  const std::vector<MseOptions> options = {MseOptions{}, MseOptions{0.8, INT64_MAX, 100.0, 2.4, 1.0},
                                           MseOptions{0.8, 1, 100.0, 2.4, 1.0}, MseOptions{0.5, 2, 50.0, 2.0, 1.25}};
  std::vector<float> w = weights(23, 600, 24);
  std::mt19937 rng(27);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& x : w) {
    const float v = u(rng);
    x = 4.0f * v * v * v * v * v;
  }
  for (device::Kind k : device_kinds())
    for (const QuantScheme& s : {QuantScheme::make(2, true, QuantStrategy::Group, 8),
                                 QuantScheme::make(4, true, QuantStrategy::Group, 40),
                                 QuantScheme::make(3, false, QuantStrategy::Channel, 128, DType::BF16)})
      for (size_t i = 0; i < options.size(); ++i) {
        const std::string what = std::string(device::kind_name(k)) + " " + s.describe() + " options " + std::to_string(i);
        const QuantizedTensor a = quantize_rtn(w.data(), 23, 600, s, RangeObserver::Mse, options[i]);
        const QuantizedTensor b = quantize_rtn_on(k, w.data(), 23, 600, s, RangeObserver::Mse, options[i]);
        if (k == device::Kind::Host) {
          expect_same(a, b, what);
        } else {
          int64_t moved = 0;
          for (size_t g = 0; g < a.scales.size(); ++g) moved += a.scales[g] != b.scales[g];
          EXPECT_LE(moved, static_cast<int64_t>(a.scales.size() / 100)) << what;
        }
      }
  // Few groups (8 x 256 in groups of 64: 32; rtn_test's heavy-tailed data),
  // so that whole steps pass with no group improving and the shared early
  // stop decides: patience 1 and 2 give other scales on the CPU.
  std::vector<float> few(8 * 256);
  uint64_t st = 12345;  // xorshift64*, u uniform in [-1, 1), x = 4 u^5
  for (float& x : few) {
    st ^= st >> 12, st ^= st << 25, st ^= st >> 27;
    const float v = static_cast<float>((st * 0x2545F4914F6CDD1DULL) >> 40) * (2.0f / 16777216.0f) - 1.0f;
    x = 4.0f * v * v * v * v * v;
  }
  std::vector<std::vector<float>> by_patience;
  for (int bits : {2, 4})
    for (int64_t patience : {int64_t{1}, int64_t{2}, INT64_MAX}) {
      const QuantScheme g = QuantScheme::make(bits, true, QuantStrategy::Group, 64);
      const MseOptions o{0.8, patience, 100.0, 2.4, 1.0};
      const QuantizedTensor a = quantize_rtn(few.data(), 8, 256, g, RangeObserver::Mse, o);
      if (bits == 4) by_patience.push_back(a.scales);
      expect_same(a, quantize_rtn_on(device::Kind::Host, few.data(), 8, 256, g, RangeObserver::Mse, o),
                  "host int" + std::to_string(bits) + " patience " + std::to_string(patience));
    }
  EXPECT_NE(by_patience[0], by_patience[1]);
  // GPTQ with the mse observer: every way it fits groups (dynamic, static, channel).
  for (device::Kind k : device_kinds())
    for (const GptqCase& c : {GptqCase{QuantScheme::make(4, true, QuantStrategy::Group, 50), AO::Group, 64},
                              GptqCase{QuantScheme::make(4, false, QuantStrategy::Group, 50), AO::Weight, 128},
                              GptqCase{QuantScheme::make(8, true, QuantStrategy::Channel), AO::None, 128}}) {
      const std::vector<float> gw = weights(41, 250, 25);
      const std::vector<double> h = hessian(250, 300, 26);
      GptqOptions o;
      o.actorder = c.order;
      o.block_size = c.block;
      o.observer = RangeObserver::Mse;
      const GptqResult a = gptq_quantize(gw.data(), 41, 250, h, c.s, o, "layer");
      const GptqResult b = gptq_quantize_on(k, gw.data(), 41, 250, h, c.s, o, "layer");
      const std::string what = std::string(device::kind_name(k)) + " gptq mse " + c.s.describe();
      if (k == device::Kind::Host) expect_same(a.q, b.q, what);
      else EXPECT_LE(disagreement(a.q, b.q), 0.01) << what;
    }
}

TEST(DeviceQuantizers, MseOverAWholeTensorIsRefusedNotApproximated) {
  const std::vector<float> w = weights(4, 64, 20);
  const QuantScheme s = QuantScheme::make(4, true, QuantStrategy::Tensor);
  try {
    quantize_rtn_on(device::Kind::Host, w.data(), 4, 64, s, RangeObserver::Mse);
    FAIL() << "mse over a whole tensor accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
  }
  GptqOptions o;
  o.observer = RangeObserver::Mse;
  EXPECT_THROW(gptq_quantize_on(device::Kind::Host, w.data(), 4, 64, hessian(64, 80, 21), s, o, "layer"), Error);
}

TEST(DeviceQuantizers, MemoryEstimateCountsEveryBuffer) {
  // 256 x 768, block 128: 256*768*13 + 3*768^2*8 + 256*128*8 + 256*768*8 + 256*16 + 768*32
  EXPECT_EQ(gptq_device_bytes(256, 768, 128), 2555904u + 14155776u + 262144u + 1572864u + 4096u + 24576u);
  EXPECT_EQ(gptq_device_bytes(10, 64, 128), gptq_device_bytes(10, 64, 64));  // a block is at most cols wide
  EXPECT_NO_THROW(device::require_device_memory(device::Kind::Host, UINT64_MAX, "x"));  // host memory: not checked
  std::string why;
  if (device::cuda_usable(&why)) {
    EXPECT_THROW(device::require_device_memory(device::Kind::Cuda, UINT64_MAX, "x"), Error);
  } else {
    try {
      device::require_device_memory(device::Kind::Cuda, 1, "layer");
      ADD_FAILURE() << "a GPU's memory was checked without a GPU";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Io);
    }
  }
}

TEST(DeviceQuantizers, CudaWithoutADeviceIsOneClearError) {
  std::string why;
  if (device::cuda_usable(&why)) GTEST_SKIP() << "a CUDA device is usable here";
  const std::vector<float> w = weights(4, 64, 22);
  try {
    quantize_rtn_on(device::Kind::Cuda, w.data(), 4, 64, QuantScheme::make(4, true, QuantStrategy::Group, 32));
    FAIL() << "ran on a CUDA device that is not there";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported) << e.what();
  }
  try {
    device::resolve("cuda", "--device");
    FAIL() << "resolve accepted cuda";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
  EXPECT_EQ(device::resolve("auto", "--device"), device::Kind::Cpu);
  EXPECT_THROW(device::resolve("gpu", "--device"), Error);
}

}  // namespace
}  // namespace qf
