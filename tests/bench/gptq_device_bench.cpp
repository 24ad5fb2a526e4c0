// GPTQ of one Linear: the CPU reference against the device code (host build,
// and the cuda build when a CUDA device is usable), phase by phase, with how
// far the device's codes are from the reference's.
//   qf_gptq_device_bench [ROWS COLS TOKENS [DEVICES]]
// defaults 2048 2048 4096 "cpu,host,cuda"; a Llama-3-8B down_proj is
// 4096 14336 262144 (128 x 2048 calibration tokens).
//
// The weight and the inputs are synthetic (Gaussian, correlated columns):
// the time depends on the shapes only. The inputs are made before anything
// is timed, as batches of 2048 tokens; a long run cycles through a pool of
// distinct batches (at least 2 x COLS tokens, so the Hessian has full rank),
// so making them does not dominate the run.
//
// Each device runs four phases, timed on their own with the device
// synchronised before each clock is read (cudaDeviceSynchronize in the cuda
// build; the host build's work is synchronous):
//   upload    the input batches copied from (pageable) host memory to the
//             device, one batch at a time as the calibration pipeline does;
//   hessian   HessianSum::add_device per batch: widening to double, then
//             SYRK into the running sum;
//   download  HessianSum::matrix(): scaling, mirroring, copy to the host;
//   gptq      gptq_quantize_on() with the first device's Hessian (so the
//             codes compare): the upload of the weight and the Hessian, the
//             factor (potrf + trsm), the column loop with its lazy GEMMs,
//             the codes and scales back to the host.
// The cpu reference has the hessian and gptq phases only (FLOPs, no bytes).
//
// Next to each cuda phase: its work (FLOPs, device-memory bytes, bytes over
// the host link) and the time it would take at the GPU's peak rates,
// max(FLOPs / FP64 peak, bytes / memory bandwidth) + link bytes / link
// bandwidth (a lower bound: kernel launches and the column loop's
// dependencies are not in it). Every phase computes in double, on the FP64
// tensor cores where cuBLAS/cuSOLVER use them, so the FP64 tensor-core peak
// is the compute bound. Peaks come from NVIDIA's datasheets (dense, no
// sparsity) by the device's name, or from the environment:
// QF_PEAK_FLOPS (FP64 FLOP/s), QF_PEAK_BW (memory bytes/s), QF_PEAK_LINK_BW
// (host-link bytes/s, one direction); a value the table lacks and the
// environment does not give makes the estimate "n/a". The host build and
// the cpu reference print "n/a".
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#if QF_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "core/error.h"
#include "core/thread_pool.h"
#include "device/device.h"
#include "quantizers/device_quantizers.h"
#include "quantizers/gptq.h"

namespace {

using namespace qf;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

#if QF_HAVE_CUDA
void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw Error(ErrorKind::Io, std::string("device: ") + what + ": " + cudaGetErrorString(err));
}
#endif

// Waits for every queued device operation (the cuda build's algorithms run
// without synchronising, par_nosync; cuBLAS calls are asynchronous).
void sync(device::Kind k) {
#if QF_HAVE_CUDA
  if (k == device::Kind::Cuda) cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#else
  (void)k;
#endif
}

// One batch of inputs in device memory: host memory in the host build,
// cudaMalloc'd in the cuda build.
class Staging {
 public:
  Staging(device::Kind k, size_t floats) : kind_(k) {
#if QF_HAVE_CUDA
    if (k == device::Kind::Cuda) {
      void* p = nullptr;
      cuda_check(cudaMalloc(&p, floats * sizeof(float)), "cudaMalloc of the input batch");
      dev_ = static_cast<float*>(p);
      return;
    }
#endif
    host_.resize(floats);
  }
  ~Staging() {
#if QF_HAVE_CUDA
    if (dev_) cudaFree(dev_);
#endif
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  float* data() { return dev_ ? dev_ : host_.data(); }
  void upload(const float* x, size_t n) {
#if QF_HAVE_CUDA
    if (kind_ == device::Kind::Cuda) {
      cuda_check(cudaMemcpy(dev_, x, n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy of an input batch");
      return;
    }
#endif
    std::memcpy(host_.data(), x, n * sizeof(float));
  }

 private:
  device::Kind kind_;
  float* dev_ = nullptr;
  std::vector<float> host_;
};

// Peak rates of a GPU. 0: not known.
struct Peaks {
  std::string device;  // the CUDA device's name
  std::string source;  // where the numbers come from
  double fp64 = 0, fp32 = 0, bw = 0, link = 0;
};

// NVIDIA datasheets, dense rates: FP64 tensor core, FP32, memory bandwidth,
// host link (PCIe Gen5 x16: 64 GB/s a direction, Gen4: 32 GB/s). Matched
// against the device name in this order (" H100" is the SXM5 part,
// "NVIDIA H100 80GB HBM3"; the leading space keeps GH200 from matching H200).
struct PeakRow {
  const char* match;
  const char* label;
  double fp64, fp32, bw, link;
};
const PeakRow kPeakTable[] = {
    {" H200 NVL", "H200 NVL", 60e12, 60e12, 4.8e12, 64e9},
    {" H200", "H200 SXM", 67e12, 67e12, 4.8e12, 64e9},
    {" H100 NVL", "H100 NVL", 60e12, 60e12, 3.9e12, 64e9},
    {" H100 PCIe", "H100 PCIe", 51e12, 51e12, 2.0e12, 64e9},
    {" H100", "H100 SXM", 67e12, 67e12, 3.35e12, 64e9},
    {" A100-SXM4-80GB", "A100 SXM 80GB", 19.5e12, 19.5e12, 2.039e12, 32e9},
    {" A100 80GB PCIe", "A100 PCIe 80GB", 19.5e12, 19.5e12, 1.935e12, 32e9},
    {" A100", "A100 40GB", 19.5e12, 19.5e12, 1.555e12, 32e9},
};

double env_rate(const char* name, double fallback, bool* used) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  if (end == v || *end != '\0' || !(x > 0) || !std::isfinite(x))
    throw Error(ErrorKind::Usage, std::string(name) + ": '" + v + "' is not a positive number (e.g. 6.7e13)");
  *used = true;
  return x;
}

[[maybe_unused]] Peaks cuda_peaks() {
  Peaks p;
#if QF_HAVE_CUDA
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess) p.device = prop.name;
  else cudaGetLastError();
#endif
  const std::string name = " " + p.device;
  for (const PeakRow& row : kPeakTable)
    if (name.find(row.match) != std::string::npos) {
      p.fp64 = row.fp64;
      p.fp32 = row.fp32;
      p.bw = row.bw;
      p.link = row.link;
      p.source = std::string("table: ") + row.label;
      break;
    }
  bool env = false;
  p.fp64 = env_rate("QF_PEAK_FLOPS", p.fp64, &env);
  p.bw = env_rate("QF_PEAK_BW", p.bw, &env);
  p.link = env_rate("QF_PEAK_LINK_BW", p.link, &env);
  if (env) p.source += p.source.empty() ? "environment" : ", environment";
  if (p.source.empty()) p.source = "not in the table: set QF_PEAK_FLOPS, QF_PEAK_BW, QF_PEAK_LINK_BW";
  return p;
}

// A phase's measured time and its work.
struct Phase {
  const char* name;
  double seconds = 0;
  double flops = 0;       // double-precision floating-point operations
  double bytes = 0;       // device-memory traffic
  double link_bytes = 0;  // over the host link
};

std::string si(double x, const char* unit) {
  const char* prefix[] = {"", "k", "M", "G", "T", "P", "E"};
  int i = 0;
  while (std::fabs(x) >= 1000 && i < 6) {
    x /= 1000;
    ++i;
  }
  char b[48];
  std::snprintf(b, sizeof b, "%.3g %s%s", x, prefix[i], unit);
  return b;
}

// "at peak S s (P% of it reached)" or "n/a (...)".
std::string roofline(const Phase& ph, const Peaks* peaks, const char* why_not) {
  if (!peaks) return std::string("n/a (") + why_not + ")";
  if ((ph.flops > 0 && peaks->fp64 <= 0) || (ph.bytes > 0 && peaks->bw <= 0) ||
      (ph.link_bytes > 0 && peaks->link <= 0))
    return "n/a (peak rates not known for this device)";
  double t = 0;
  if (ph.flops > 0) t = ph.flops / peaks->fp64;
  if (ph.bytes > 0) t = std::max(t, ph.bytes / peaks->bw);
  if (ph.link_bytes > 0) t += ph.link_bytes / peaks->link;
  char b[96];
  std::snprintf(b, sizeof b, "at peak %.4f s (%.1f%% of it reached)", t, ph.seconds > 0 ? 100.0 * t / ph.seconds : 0.0);
  return b;
}

void print_phase(const std::string& dev, const Phase& ph, const Peaks* peaks, const char* why_not) {
  std::string work;
  if (ph.flops > 0) work += si(ph.flops, "FLOP");
  if (ph.bytes > 0) work += (work.empty() ? "" : ", ") + si(ph.bytes, "B memory");
  if (ph.link_bytes > 0) work += (work.empty() ? "" : ", ") + si(ph.link_bytes, "B over the link");
  std::printf("%-5s %-9s %9.3f s   %-52s %s\n", dev.c_str(), ph.name, ph.seconds, work.c_str(),
              roofline(ph, peaks, why_not).c_str());
}

// Work of HessianSum::add_device for n rows of `cols` columns: x widened
// (f32 read, f64 written), SYRK (n * cols * (cols + 1) FLOPs for the lower
// triangle; x read once, the triangle read and written).
void hessian_work(Phase& ph, double n, double cols) {
  ph.flops += n * cols * (cols + 1);
  ph.bytes += n * cols * (4 + 8 + 8) + 8 * cols * (cols + 1);
}

// Work of gptq_quantize on the device for [rows, cols] (gptq_device.cpp):
// H permuted, damped and reversed; potrf (cols^3 / 3) and trsm against the
// identity (cols^3); per block of B columns the in-block updates
// (rows * B * (B - 1)) and the lazy GEMM (2 * rows * B * (cols - i2)). Memory:
// the Hessian's buffers (about 8 passes over cols^2 doubles), the weight
// widened to double, and the lazy GEMMs' reads and writes of the columns
// after each block. Link: the weight (f32) and the Hessian (f64) up, one
// code byte per weight and the group parameters down.
void gptq_work(Phase& ph, double rows, double cols, int64_t block, int64_t group) {
  const double c3 = cols * cols * cols;
  ph.flops = c3 / 3 + c3;
  const auto ic = static_cast<int64_t>(cols);
  for (int64_t i1 = 0; i1 < ic; i1 += block) {
    const double count = static_cast<double>(std::min(block, ic - i1));
    const double after = cols - static_cast<double>(i1) - count;
    ph.flops += rows * count * (count - 1) + 2 * rows * count * after;
    ph.bytes += 16 * rows * after + 8 * count * after;
  }
  ph.bytes += 64 * cols * cols + rows * cols * (4 + 8 + 8 + 1);
  const double groups = std::ceil(cols / static_cast<double>(group));
  ph.link_bytes = 4 * rows * cols + 8 * cols * cols + rows * cols + rows * groups * (4 + 4);
}

double max_relative_difference(const std::vector<double>& a, const std::vector<double>& ref) {
  double scale = 0, diff = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    scale = std::max(scale, std::fabs(ref[i]));
    diff = std::max(diff, std::fabs(a[i] - ref[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

// The Hessian on a device build (host or cuda): upload, add_device and
// download timed apart.
template <class Sum>
std::vector<double> device_hessian(device::Kind k, const std::vector<std::vector<float>>& pool, int64_t tokens,
                                   int64_t batch, int64_t cols, Phase& up, Phase& acc, Phase& down) {
  Sum sum(cols);
  Staging staging(k, static_cast<size_t>(std::min(batch, tokens) * cols));
  int64_t b = 0;
  for (int64_t done = 0; done < tokens; done += batch, ++b) {
    const int64_t n = std::min(batch, tokens - done);
    const std::vector<float>& x = pool[static_cast<size_t>(b) % pool.size()];
    sync(k);
    auto t0 = Clock::now();
    staging.upload(x.data(), static_cast<size_t>(n * cols));
    sync(k);
    up.seconds += seconds_since(t0);
    up.link_bytes += 4.0 * static_cast<double>(n * cols);
    t0 = Clock::now();
    sum.add_device(staging.data(), n);
    sync(k);
    acc.seconds += seconds_since(t0);
    hessian_work(acc, static_cast<double>(n), static_cast<double>(cols));
  }
  sync(k);
  const auto t0 = Clock::now();
  std::vector<double> h = sum.matrix();
  sync(k);
  down.seconds = seconds_since(t0);
  const double c = static_cast<double>(cols);
  down.bytes = 16 * c * c;
  down.link_bytes = 8 * c * c;
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 2048;
  const int64_t cols = argc > 2 ? std::atoll(argv[2]) : 2048;
  const int64_t tokens = argc > 3 ? std::atoll(argv[3]) : 4096;
  const std::string devices = argc > 4 ? argv[4] : "cpu,host,cuda";
  if (argc > 5 || rows <= 0 || cols <= 0 || tokens <= 0 || cols % 128 != 0) {
    std::fprintf(stderr, "usage: qf_gptq_device_bench [ROWS COLS(multiple of 128) TOKENS [cpu,host,cuda]]\n");
    return 2;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (auto& v : w) v = 0.02f * g(rng);
  // Inputs in batches of 2048 tokens: x[t, c] = z[t, c] + 0.5 z[t, c-1].
  const int64_t batch = 2048;
  const int64_t batches = (tokens + batch - 1) / batch;
  const int64_t pool_size = std::min(batches, std::max<int64_t>(1, (2 * cols + batch - 1) / batch));
  std::vector<std::vector<float>> pool(static_cast<size_t>(pool_size));
  for (auto& x : pool) {
    x.resize(static_cast<size_t>(std::min(batch, tokens) * cols));
    float prev = 0.0f;
    for (size_t i = 0; i < x.size(); ++i) {
      const float z = g(rng);
      x[i] = z + (i % static_cast<size_t>(cols) ? 0.5f * prev : 0.0f);
      prev = z;
    }
  }
  const QuantScheme scheme = QuantScheme::make(4, true, QuantStrategy::Group, 128);
  GptqOptions opts;
  opts.actorder = GptqOptions::ActOrder::Weight;  // the W4A16 preset's "static"
  std::printf("GPTQ int4 g128 actorder static, weight [%lld, %lld], %lld calibration tokens in %lld batches "
              "(%lld distinct), %d threads\n",
              static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(tokens),
              static_cast<long long>(batches), static_cast<long long>(pool_size), ThreadPool::global().size());
  std::vector<double> h_ref;
  QuantizedTensor q_ref;
  std::stringstream list(devices);
  for (std::string word; std::getline(list, word, ',');) {
    try {
      const device::Kind k = word == "cpu" ? device::Kind::Cpu : device::resolve(word, "bench");
      Phase up{"upload"}, acc{"hessian"}, down{"download"}, solve{"gptq"};
      std::vector<double> h;
      Peaks peaks;
      const Peaks* pk = nullptr;
      const char* why_not = k == device::Kind::Cpu ? "cpu reference" : "host build";
      if (k == device::Kind::Cpu) {
        HessianAccumulator a(cols);
        int64_t b = 0;
        const auto t0 = Clock::now();
        for (int64_t done = 0; done < tokens; done += batch, ++b) {
          const int64_t n = std::min(batch, tokens - done);
          a.add(pool[static_cast<size_t>(b) % pool.size()].data(), n, cols, ThreadPool::global());
          hessian_work(acc, static_cast<double>(n), static_cast<double>(cols));
        }
        a.finish(&ThreadPool::global());
        acc.seconds = seconds_since(t0);
        h = a.matrix();
      } else if (k == device::Kind::Host) {
        h = device_hessian<host::HessianSum>(k, pool, tokens, batch, cols, up, acc, down);
      } else {
#if QF_HAVE_CUDA
        peaks = cuda_peaks();
        pk = &peaks;
        std::printf("cuda: %s; peaks: FP64 tensor core %s, FP32 %s, memory %s, host link %s a direction (%s)\n",
                    peaks.device.c_str(), peaks.fp64 > 0 ? si(peaks.fp64, "FLOP/s").c_str() : "?",
                    peaks.fp32 > 0 ? si(peaks.fp32, "FLOP/s").c_str() : "?",
                    peaks.bw > 0 ? si(peaks.bw, "B/s").c_str() : "?", peaks.link > 0 ? si(peaks.link, "B/s").c_str() : "?",
                    peaks.source.c_str());
        h = device_hessian<cuda::HessianSum>(k, pool, tokens, batch, cols, up, acc, down);
#endif
      }
      const std::vector<double>& h_used = h_ref.empty() ? h : h_ref;
      sync(k);
      const auto t0 = Clock::now();
      const GptqResult r = gptq_quantize_on(k, w.data(), rows, cols, h_used, scheme, opts, "bench");
      sync(k);
      solve.seconds = seconds_since(t0);
      gptq_work(solve, static_cast<double>(rows), static_cast<double>(cols), opts.block_size, scheme.group_size);
      if (k == device::Kind::Cpu) acc.bytes = solve.bytes = solve.link_bytes = 0;  // the device model's; FLOPs only
      if (k != device::Kind::Cpu) {
        print_phase(word, up, pk, why_not);
        print_phase(word, acc, pk, why_not);
        print_phase(word, down, pk, why_not);
      } else {
        print_phase(word, acc, pk, why_not);
      }
      print_phase(word, solve, pk, why_not);
      std::printf("%-5s %-9s %9.3f s   loss %.6e%s", word.c_str(), "total", up.seconds + acc.seconds + down.seconds + solve.seconds,
                  r.loss, r.fallback.empty() ? "" : "  (fallback)");
      if (!h_ref.empty()) std::printf("   Hessian vs the first: %.2e relative", max_relative_difference(h, h_ref));
      if (!q_ref.q.empty()) {
        double diff = 0;
        for (size_t i = 0; i < r.q.q.size(); ++i) diff += r.q.q[i] != q_ref.q[i];
        std::printf("   codes differing from the first: %.4f%%", 100.0 * diff / static_cast<double>(r.q.q.size()));
      }
      std::printf("\n");
      if (h_ref.empty()) {
        h_ref = std::move(h);
        q_ref = r.q;
      }
    } catch (const Error& e) {
      std::printf("%-5s skipped: %s\n", word.c_str(), e.what());
    }
  }
  return 0;
}
