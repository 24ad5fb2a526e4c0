// The GPU conversions against the CPU ones, over every input code.
#ifdef QF_HAVE_CUDA

#include "core/cuda/convert.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"

namespace qf {
namespace {

// Every code, repeated past 4096 blocks x 256 threads so the kernel's
// grid-stride loop runs more than once, with a tail that fills no whole block.
std::vector<uint16_t> all_codes_repeated() {
  std::vector<uint16_t> v(65536 * 17 + 77);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint16_t>(i * 40503u);  // odd multiplier: a permutation per 65536
  return v;
}

void expect_matches_cpu(void (*gpu)(const uint16_t*, uint8_t*, size_t), float (*decode)(uint16_t), const char* what) {
  const auto in = all_codes_repeated();
  std::vector<uint8_t> out(in.size(), 0xaa);
  gpu(in.data(), out.data(), in.size());
  std::vector<bool> seen(65536);
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(out[i], f32_to_f8e4m3(decode(in[i]))) << what << " code 0x" << std::hex << in[i] << " at " << std::dec << i;
    seen[in[i]] = true;
  }
  for (size_t c = 0; c < seen.size(); ++c) ASSERT_TRUE(seen[c]) << "input missed code " << c;
}

TEST(CudaConvert, F16ToE4M3MatchesCpuOnEveryCode) {
  std::string why;
  if (!cuda::device_available(&why)) GTEST_SKIP() << "no CUDA device visible: " << why;
  expect_matches_cpu(cuda::f16_to_f8e4m3, f16_to_f32, "f16");
}

TEST(CudaConvert, BF16ToE4M3MatchesCpuOnEveryCode) {
  std::string why;
  if (!cuda::device_available(&why)) GTEST_SKIP() << "no CUDA device visible: " << why;
  expect_matches_cpu(cuda::bf16_to_f8e4m3, bf16_to_f32, "bf16");
}

TEST(CudaConvert, EmptyInputTouchesNothing) {
  std::string why;
  if (!cuda::device_available(&why)) GTEST_SKIP() << "no CUDA device visible: " << why;
  uint8_t out = 0x5a;
  cuda::f16_to_f8e4m3(nullptr, &out, 0);
  cuda::bf16_to_f8e4m3(nullptr, &out, 0);
  EXPECT_EQ(out, 0x5a);
}

}  // namespace
}  // namespace qf

#endif  // QF_HAVE_CUDA
