// GPTQ of one Linear: the CPU reference against the device code (host build,
// and the cuda build when a CUDA device is usable), with the time of each
// step and how far the device's codes are from the reference's.
//   qf_gptq_device_bench [ROWS COLS TOKENS [DEVICES]]
// defaults 2048 2048 4096 "cpu,host,cuda"; a Llama-3-8B down_proj is
// 4096 14336 262144 (128 x 2048 calibration tokens).
// The weight and the inputs are synthetic (Gaussian, correlated columns):
// the timing does not depend on the values, only on the shapes.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "device/device.h"
#include "quantizers/device_quantizers.h"
#include "quantizers/gptq.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace qf;
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 2048;
  const int64_t cols = argc > 2 ? std::atoll(argv[2]) : 2048;
  const int64_t tokens = argc > 3 ? std::atoll(argv[3]) : 4096;
  const std::string devices = argc > 4 ? argv[4] : "cpu,host,cuda";
  if (rows <= 0 || cols <= 0 || tokens <= 0 || cols % 128 != 0) {
    std::fprintf(stderr, "usage: qf_gptq_device_bench [ROWS COLS(multiple of 128) TOKENS [cpu,host,cuda]]\n");
    return 2;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (auto& v : w) v = 0.02f * g(rng);
  // Inputs in batches of 2048 tokens: x[t, c] = z[t, c] + 0.5 z[t, c-1].
  const int64_t batch = 2048;
  auto fill_batch = [&](std::vector<float>& x, int64_t n) {
    x.resize(static_cast<size_t>(n * cols));
    float prev = 0.0f;
    for (int64_t i = 0; i < n * cols; ++i) {
      const float z = g(rng);
      x[static_cast<size_t>(i)] = z + (i % cols ? 0.5f * prev : 0.0f);
      prev = z;
    }
  };
  const QuantScheme scheme = QuantScheme::make(4, true, QuantStrategy::Group, 128);
  GptqOptions opts;
  opts.actorder = GptqOptions::ActOrder::Weight;  // the W4A16 preset's "static"
  std::printf("GPTQ int4 g128 actorder static, weight [%lld, %lld], %lld calibration tokens, %d threads\n",
              static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(tokens),
              ThreadPool::global().size());
  std::vector<double> h_ref;
  QuantizedTensor q_ref;
  std::stringstream list(devices);
  for (std::string word; std::getline(list, word, ',');) {
    try {
      const device::Kind k = word == "cpu" ? device::Kind::Cpu : device::resolve(word, "bench");
      auto t0 = std::chrono::steady_clock::now();
      std::vector<double> h;
      std::mt19937 saved = rng;
      std::vector<float> x;
      if (k == device::Kind::Cpu) {
        HessianAccumulator acc(cols);
        for (int64_t done = 0; done < tokens; done += batch) {
          fill_batch(x, std::min(batch, tokens - done));
          acc.add(x.data(), static_cast<int64_t>(x.size()) / cols, cols, ThreadPool::global());
        }
        acc.finish(&ThreadPool::global());
        h = acc.matrix();
      } else {
        std::unique_ptr<host::HessianSum> hh;
#if QF_HAVE_CUDA
        std::unique_ptr<cuda::HessianSum> hc;
#endif
        if (k == device::Kind::Host) hh = std::make_unique<host::HessianSum>(cols);
#if QF_HAVE_CUDA
        else hc = std::make_unique<cuda::HessianSum>(cols);
#endif
        for (int64_t done = 0; done < tokens; done += batch) {
          fill_batch(x, std::min(batch, tokens - done));
          if (hh) hh->add(x.data(), static_cast<int64_t>(x.size()) / cols);
#if QF_HAVE_CUDA
          else hc->add(x.data(), static_cast<int64_t>(x.size()) / cols);
#endif
        }
        h = hh ? hh->matrix() : std::vector<double>();
#if QF_HAVE_CUDA
        if (!hh) h = hc->matrix();
#endif
      }
      rng = saved;  // every device sees the same inputs
      const double t_h = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      const GptqResult r = gptq_quantize_on(k, w.data(), rows, cols, h_ref.empty() ? h : h_ref, scheme, opts, "bench");
      const double t_q = seconds_since(t0);
      double diff = 0;
      if (!q_ref.q.empty())
        for (size_t i = 0; i < r.q.q.size(); ++i) diff += r.q.q[i] != q_ref.q[i];
      std::printf("%-5s hessian %8.2f s   gptq %8.2f s   loss %.6e%s", word.c_str(), t_h, t_q, r.loss,
                  r.fallback.empty() ? "" : "  (fallback)");
      if (!q_ref.q.empty()) std::printf("   codes differing from cpu: %.4f%%", 100.0 * diff / static_cast<double>(r.q.q.size()));
      std::printf("\n");
      if (h_ref.empty()) {
        h_ref = h;
        q_ref = r.q;
      }
    } catch (const Error& e) {
      std::printf("%-5s skipped: %s\n", word.c_str(), e.what());
    }
  }
  return 0;
}
