// FP8 and NVFP4 on the device: one index per (row, group) computes the
// group's absolute maximum, its scale and its codes with the QF_HD math the
// CPU reference (float_quant.cpp) uses, so codes and scales are the same bits.
#include "core/error.h"
#include "device/exec.h"
#include "quantizers/device_quantizers.h"

namespace qf::QF_DEV_NS {

namespace {

constexpr float kFp8Max = 448.0f;

QF_HD inline float group_amax(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t k = 0; k < n; ++k) {
    const float v = hd::abs_f32(x[k]);
    if (v > amax) amax = v;
  }
  return amax;
}

struct NotFinite {
  const float* w;
  QF_HD bool operator()(int64_t i) const { return !hd::is_finite(w[i]); }
};

struct AbsOf {
  QF_HD float operator()(float x) const { return hd::abs_f32(x); }
};
struct MaxOf {
  QF_HD float operator()(float a, float b) const { return b > a ? b : a; }
};

// The weight on the device; InvalidInput when a value is not finite.
dvec<float> upload_finite(const float* w, int64_t n, const std::string& where) {
  dvec<float> dw = upload(w, n);
  if (count_if_index(n, NotFinite{raw(dw)}) > 0) throw invalid_input(where, "weight value is not finite");
  return dw;
}

float abs_max(const dvec<float>& dw) {
  return transform_reduce_n(raw(dw), static_cast<int64_t>(dw.size()), AbsOf{}, 0.0f, MaxOf{});
}

QuantizedTensor empty_tensor(int64_t rows, int64_t cols, const QuantScheme& s, const std::string& where) {
  s.validate(where, cols);
  if (rows <= 0 || cols <= 0)
    throw invalid_input(where, "empty weight [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  QuantizedTensor t;
  t.scheme = s;
  t.rows = rows;
  t.cols = cols;
  return t;
}

struct Fp8Group {
  const float* w;
  uint8_t* q;
  float* scales;
  int64_t cols, gs, ng;
  bool tensor;
  float tensor_scale;
  hd::ScaleStore store;

  QF_HD void operator()(int64_t i) const {
    const int64_t r = i / ng, c0 = (i % ng) * gs, n = gs < cols - c0 ? gs : cols - c0;
    const float* x = w + r * cols + c0;
    float scale = tensor_scale;
    if (!tensor) {
      scale = hd::round_scale_to(group_amax(x, n) / kFp8Max, store);
      scales[i] = scale;
    }
    uint8_t* out = q + r * cols + c0;
    for (int64_t k = 0; k < n; ++k) out[k] = hd::f32_to_f8e4m3(x[k] / scale);
  }
};

struct Nvfp4Block {
  const float* w;
  uint8_t* q;
  float* scales;
  int64_t cols, gs, ng;
  float global_scale;

  QF_HD void operator()(int64_t i) const {
    const int64_t r = i / ng, c0 = (i % ng) * gs;
    const float* x = w + r * cols + c0;
    const float bs = hd::nvfp4_block_scale(group_amax(x, gs), global_scale);
    scales[i] = bs;
    uint8_t* out = q + r * cols + c0;
    for (int64_t k = 0; k < gs; ++k) out[k] = hd::nvfp4_code(x[k], bs, global_scale);
  }
};

}  // namespace

QuantizedTensor quantize_fp8(const float* w, int64_t rows, int64_t cols, const QuantScheme& s) {
  const std::string where = "fp8 " + s.describe();
  if (!s.is_fp8()) throw invalid_input(where, "quantize_fp8 needs an FP8 scheme, got " + s.describe());
  QuantizedTensor t = empty_tensor(rows, cols, s, where);
  const dvec<float> dw = upload_finite(w, rows * cols, where);
  const bool tensor = s.strategy == QuantStrategy::Tensor;
  const int64_t gs = s.strategy == QuantStrategy::Group ? s.group_size : cols, ng = (cols + gs - 1) / gs;
  const hd::ScaleStore store = scale_store(s.scale_dtype);
  const float tensor_scale = tensor ? hd::round_scale_to(abs_max(dw) / kFp8Max, store) : 0.0f;
  dvec<uint8_t> dq(static_cast<size_t>(rows * cols));
  dvec<float> dscales(static_cast<size_t>(tensor ? 1 : rows * ng));
  for_each_index(rows * ng, Fp8Group{raw(dw), raw(dq), raw(dscales), cols, gs, ng, tensor, tensor_scale, store});
  t.q = download(dq);
  t.scales = tensor ? std::vector<float>{tensor_scale} : download(dscales);
  return t;
}

QuantizedTensor quantize_nvfp4(const float* w, int64_t rows, int64_t cols, const QuantScheme& s, float global_amax) {
  const std::string where = "nvfp4";
  if (!s.is_nvfp4()) throw invalid_input(where, "quantize_nvfp4 needs the NVFP4 scheme, got " + s.describe());
  QuantizedTensor t = empty_tensor(rows, cols, s, where);
  const dvec<float> dw = upload_finite(w, rows * cols, where);
  const float amax = global_amax < 0 ? abs_max(dw) : global_amax;
  if (!hd::is_finite(amax)) throw invalid_input(where, "global amax is not finite");
  t.global_scale = nvfp4_global_scale(amax);
  const int64_t gs = s.group_size, ng = t.n_groups();
  dvec<uint8_t> dq(static_cast<size_t>(rows * cols));
  dvec<float> dscales(static_cast<size_t>(rows * ng));
  for_each_index(rows * ng, Nvfp4Block{raw(dw), raw(dq), raw(dscales), cols, gs, ng, t.global_scale});
  t.q = download(dq);
  t.scales = download(dscales);
  return t;
}

}  // namespace qf::QF_DEV_NS
