#include "quantizers/float_quant.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "quantizers/rtn.h"

namespace qf {
namespace {

constexpr float kFp8Max = 448.0f;

// max(|min(x, 0)|, max(x, 0)) over n values; InvalidInput for non-finite values.
float abs_max(const float* x, int64_t n, const std::string& where) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) throw invalid_input(where, "weight value is not finite");
    amax = std::max(amax, std::fabs(x[i]));
  }
  return amax;
}

QuantizedTensor empty_tensor(int64_t rows, int64_t cols, const QuantScheme& s, const std::string& where) {
  s.validate(where, cols);
  if (rows <= 0 || cols <= 0) throw invalid_input(where, "empty weight [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  QuantizedTensor t;
  t.scheme = s;
  t.rows = rows;
  t.cols = cols;
  t.q.resize(static_cast<size_t>(rows * cols));
  t.scales.resize(static_cast<size_t>(t.n_params()));
  return t;
}

}  // namespace

float nvfp4_global_scale(float amax) {
  if (std::isnan(amax)) return 1.0f;
  const float g = kFp8Max * hd::kE2m1Max / std::max(amax, std::numeric_limits<float>::min());
  return std::isfinite(g) ? g : 1.0f;
}

QuantizedTensor quantize_fp8(const float* w, int64_t rows, int64_t cols, const QuantScheme& s) {
  const std::string where = "fp8 " + s.describe();
  if (!s.is_fp8()) throw invalid_input(where, "quantize_fp8 needs an FP8 scheme, got " + s.describe());
  QuantizedTensor t = empty_tensor(rows, cols, s, where);
  if (s.strategy == QuantStrategy::Tensor) t.scales[0] = round_scale(abs_max(w, rows * cols, where) / kFp8Max, s.scale_dtype);
  const int64_t gs = s.strategy == QuantStrategy::Group ? s.group_size : cols;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g * gs < cols; ++g) {
      const int64_t c0 = g * gs, n = std::min(gs, cols - c0);
      const float* x = w + r * cols + c0;
      const size_t pi = static_cast<size_t>(t.param_index(r, g));
      if (s.strategy != QuantStrategy::Tensor) t.scales[pi] = round_scale(abs_max(x, n, where) / kFp8Max, s.scale_dtype);
      const float scale = t.scales[pi];
      uint8_t* q = t.q.data() + r * cols + c0;
      for (int64_t i = 0; i < n; ++i) q[i] = f32_to_f8e4m3(x[i] / scale);
    }
  }
  return t;
}

QuantizedTensor quantize_nvfp4(const float* w, int64_t rows, int64_t cols, const QuantScheme& s, float global_amax) {
  const std::string where = "nvfp4";
  if (!s.is_nvfp4()) throw invalid_input(where, "quantize_nvfp4 needs the NVFP4 scheme, got " + s.describe());
  QuantizedTensor t = empty_tensor(rows, cols, s, where);
  const float amax = global_amax < 0 ? abs_max(w, rows * cols, where) : global_amax;
  if (!std::isfinite(amax)) throw invalid_input(where, "global amax is not finite");
  t.global_scale = nvfp4_global_scale(amax);
  const int64_t gs = s.group_size, ng = t.n_groups();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < ng; ++g) {
      const float* x = w + r * cols + g * gs;
      const float bs = nvfp4_block_scale(abs_max(x, gs, where), t.global_scale);
      t.scales[static_cast<size_t>(r * ng + g)] = bs;
      uint8_t* q = t.q.data() + r * cols + g * gs;
      for (int64_t i = 0; i < gs; ++i) q[i] = nvfp4_code(x[i], bs, t.global_scale);
    }
  }
  return t;
}

}  // namespace qf
