// The CUDA conversions against the CPU reference, over every input code.
#ifdef QF_HAVE_CUDA

#include "core/cuda/convert.h"

#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"

namespace qf {
namespace {

std::vector<uint16_t> all_codes() {
  std::vector<uint16_t> v(65536);
  for (uint32_t i = 0; i < 65536; ++i) v[i] = static_cast<uint16_t>(i);
  return v;
}

TEST(CudaConvert, F16ToE4M3MatchesCpuOnEveryCode) {
  std::string why;
  if (!cuda::device_available(&why)) GTEST_SKIP() << "no CUDA device visible: " << why;
  auto in = all_codes();
  std::vector<uint8_t> gpu(in.size());
  cuda::f16_to_f8e4m3(in.data(), gpu.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(gpu[i], f32_to_f8e4m3(f16_to_f32(in[i]))) << "f16 code " << i;
}

TEST(CudaConvert, BF16ToE4M3MatchesCpuOnEveryCode) {
  std::string why;
  if (!cuda::device_available(&why)) GTEST_SKIP() << "no CUDA device visible: " << why;
  auto in = all_codes();
  std::vector<uint8_t> gpu(in.size());
  cuda::bf16_to_f8e4m3(in.data(), gpu.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(gpu[i], f32_to_f8e4m3(bf16_to_f32(in[i]))) << "bf16 code " << i;
}

}  // namespace
}  // namespace qf

#endif  // QF_HAVE_CUDA
