// Device faults (QF_DEVICE_FAULT) end a device call as one qf::Error(Io)
// naming the device, in the host build always and in the cuda build where
// a GPU is; the algebra's per-thread context is made once per device and
// thread, however many Blas objects and device calls the thread makes.
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "device/fault.h"
#include "quantizers/device_quantizers.h"

namespace qf {
namespace {

std::vector<device::Kind> device_kinds() {
  std::vector<device::Kind> k{device::Kind::Host};
  if (device::cuda_usable(nullptr)) k.push_back(device::Kind::Cuda);
  return k;
}

// Restores "no fault" whatever the test does.
struct FaultPlan {
  explicit FaultPlan(const std::string& p) { device::set_fault_plan(p); }
  ~FaultPlan() { device::set_fault_plan(""); }
};

std::vector<float> weights(int64_t rows, int64_t cols) {
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.0f, 0.05f);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (float& x : w) x = g(rng);
  return w;
}

std::vector<double> identity_hessian(int64_t cols) {
  std::vector<double> h(static_cast<size_t>(cols * cols), 0.0);
  for (int64_t i = 0; i < cols; ++i) h[static_cast<size_t>(i * cols + i)] = 1.0 + 0.01 * static_cast<double>(i);
  return h;
}

GptqResult run_gptq(device::Kind k) {
  const int64_t rows = 16, cols = 64;
  const std::vector<float> w = weights(rows, cols);
  return gptq_quantize_on(k, w.data(), rows, cols, identity_hessian(cols),
                          QuantScheme::make(4, true, QuantStrategy::Group, 32), GptqOptions{}, "layer");
}

// The error a faulted call must end with.
void expect_device_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::Io) << m;
    EXPECT_NE(m.find("device"), std::string::npos) << m;
    EXPECT_NE(m.find(part), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

TEST(DeviceFault, PlanIsParsedStrictly) {
  for (const char* bad : {"alloc", "alloc:", "alloc:0", "alloc:-1", "alloc:2x", "disk:1", ":3"}) {
    try {
      device::set_fault_plan(bad);
      FAIL() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage) << bad;
      EXPECT_NE(std::string(e.what()).find("QF_DEVICE_FAULT"), std::string::npos) << e.what();
    }
  }
  FaultPlan p("alloc:3");
  EXPECT_FALSE(device::inject_fault(device::FaultSite::Blas));
  EXPECT_FALSE(device::inject_fault(device::FaultSite::Alloc));
  EXPECT_FALSE(device::inject_fault(device::FaultSite::Alloc));
  EXPECT_TRUE(device::inject_fault(device::FaultSite::Alloc));
  EXPECT_FALSE(device::inject_fault(device::FaultSite::Alloc));
}

TEST(DeviceFault, FailedAllocationIsOneIoError) {
  for (device::Kind k : device_kinds()) {
    const std::vector<float> w = weights(8, 64);
    for (int n : {1, 2, 4}) {
      FaultPlan p("alloc:" + std::to_string(n));
      expect_device_error([&] { run_gptq(k); }, "out of memory");
    }
    // The same work runs once the plan is spent.
    FaultPlan none("");
    EXPECT_NO_THROW(run_gptq(k)) << device::kind_name(k);
  }
}

TEST(DeviceFault, FailedBlasCallIsOneIoError) {
  for (device::Kind k : device_kinds())
    for (int n : {1, 2}) {
      FaultPlan p("blas:" + std::to_string(n));
      expect_device_error([&] { run_gptq(k); }, "cuBLAS");
    }
}

TEST(DeviceHandles, OneContextPerDeviceAndThread) {
  for (device::Kind k : device_kinds()) {
    // A fresh thread: its first device call makes the context, later ones reuse it.
    auto thread_contexts = [k] {
      uint64_t made = 0;
      std::thread t([&] {
        const uint64_t before = device::blas_contexts_created();
        for (int i = 0; i < 3; ++i) run_gptq(k);
        made = device::blas_contexts_created() - before;
      });
      t.join();
      return made;
    };
    EXPECT_EQ(thread_contexts(), 1u) << device::kind_name(k);
    EXPECT_EQ(thread_contexts(), 1u) << device::kind_name(k);
    // This thread: at most one ever, however many calls.
    run_gptq(k);
    const uint64_t before = device::blas_contexts_created();
    for (int i = 0; i < 3; ++i) run_gptq(k);
    EXPECT_EQ(device::blas_contexts_created(), before) << device::kind_name(k);
  }
}

}  // namespace
}  // namespace qf
