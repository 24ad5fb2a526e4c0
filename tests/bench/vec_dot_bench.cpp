// Nanoseconds per row of kquants::vec_dot at every SIMD level this CPU has:
// 256 different weight rows of 4096 elements (quantized from Gaussian
// values) against one quantized activation row, best of 40 passes (3 for the
// scalar reference). The rows fit in L2, so this is the kernels' compute
// speed, not memory bandwidth. Every level's sum over the rows is printed too,
// and the program fails (exit 1) where one differs from the scalar
// reference's: the kernels are bit-identical to it.
//
//   scripts/build.sh --target qf_vec_dot_bench && build/bin/qf_vec_dot_bench
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/simd.h"
#include "quantizers/kquants.h"

int main() {
  using namespace qf;
  constexpr int64_t kN = 4096, kRows = 256;
  std::mt19937 rng(1);
  std::normal_distribution<float> gauss;
  std::vector<float> x(static_cast<size_t>(kN * kRows)), act(static_cast<size_t>(kN));
  for (auto& v : x) v = gauss(rng);
  for (auto& v : act) v = gauss(rng);
  std::printf("| type | level | ns per row | sum over rows |\n|---|---|---|---|\n");
  for (uint32_t t : {ggml_type::F16, ggml_type::Q8_0, ggml_type::Q2_K, ggml_type::Q3_K, ggml_type::Q4_K,
                     ggml_type::Q5_K, ggml_type::Q6_K}) {
    const size_t rb = kquants::row_size(t, kN);
    std::vector<uint8_t> w(rb * kRows);
    if (t == ggml_type::F16) {
      auto* h = reinterpret_cast<uint16_t*>(w.data());
      for (size_t i = 0; i < x.size(); ++i) h[i] = f32_to_f16(x[i]);
    } else {
      kquants::quantize_rows(t, x.data(), w.data(), kRows, kN, nullptr);
    }
    const uint32_t at = kquants::vec_dot_type(t);
    std::vector<uint8_t> a(kquants::row_size(at, kN));
    kquants::quantize_activation(at, act.data(), a.data(), kN);
    float ref_sum = 0;
    for (SimdLevel level : {SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512}) {
      if (level > best_simd_level()) continue;
      set_simd_level(level);
      const kquants::DotKernel dot = kquants::dot_kernel(t, kN);
      double best = 1e300;
      float sum = 0;
      for (int pass = 0; pass < (level == SimdLevel::Scalar ? 3 : 40); ++pass) {
        sum = 0;
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t r = 0; r < kRows; ++r) sum += dot(kN, w.data() + static_cast<size_t>(r) * rb, a.data());
        const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
        best = std::min(best, ns / kRows);
      }
      std::printf("| %s | %s | %.0f | %.6g |\n", ggml_type_info(t)->name, simd_level_name(level), best, sum);
      if (level == SimdLevel::Scalar) {
        ref_sum = sum;
      } else if (sum != ref_sum) {
        std::fprintf(stderr, "qf_vec_dot_bench: %s at %s sums to %.9g, the scalar reference to %.9g\n",
                     ggml_type_info(t)->name, simd_level_name(level), sum, ref_sum);
        return 1;
      }
    }
  }
  return 0;
}
