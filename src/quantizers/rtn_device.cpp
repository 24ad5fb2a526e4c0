// RTN on the device: one index per (row, group) fits the group's min-max
// range and writes its codes, with the QF_HD math of int_quant.h that the
// CPU reference (rtn.cpp) uses, so codes and scales are the same bits.
#include "core/error.h"
#include "device/exec.h"
#include "quantizers/device_quantizers.h"

namespace qf::QF_DEV_NS {

namespace {

struct RtnGroup {
  const float* w;
  uint8_t* q;
  float* scales;
  int32_t* zeros;
  int64_t cols, gs, ng;
  bool symmetric, tensor;
  int32_t qmax;
  hd::ScaleStore store;
  GroupParams tensor_p;

  QF_HD void operator()(int64_t i) const {
    const int64_t r = i / ng, c0 = (i % ng) * gs, n = gs < cols - c0 ? gs : cols - c0;
    const float* x = w + r * cols + c0;
    GroupParams p = tensor_p;
    if (!tensor) {
      float lo = 0.0f, hi = 0.0f;
      for (int64_t k = 0; k < n; ++k) {
        if (x[k] < lo) lo = x[k];
        if (x[k] > hi) hi = x[k];
      }
      p = hd::params_for_range(lo, hi, symmetric, qmax, store);
      scales[i] = p.scale;
      zeros[i] = p.zero;
    }
    uint8_t* out = q + r * cols + c0;
    for (int64_t k = 0; k < n; ++k) out[k] = hd::quantize_int(x[k], p.scale, p.zero, qmax);
  }
};

}  // namespace

QuantizedTensor quantize_rtn(const float* w, int64_t rows, int64_t cols, const QuantScheme& scheme,
                             RangeObserver obs, const MseOptions&) {
  const std::string where = "rtn " + scheme.describe();
  scheme.validate(where, cols);
  if (rows <= 0 || cols <= 0)
    throw invalid_input(where, "empty weight [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  if (obs != RangeObserver::MinMax)
    throw unsupported(where, "the mse observer has no device version yet (run it with --device cpu)");
  QuantizedTensor t;
  t.scheme = scheme;
  t.rows = rows;
  t.cols = cols;
  const bool tensor = scheme.strategy == QuantStrategy::Tensor;
  const int64_t gs = scheme.strategy == QuantStrategy::Group ? scheme.group_size : cols;
  const int64_t ng = (cols + gs - 1) / gs;
  const hd::ScaleStore store = scale_store(scheme.scale_dtype);

  const dvec<float> dw = upload(w, rows * cols);
  dvec<uint8_t> dq(static_cast<size_t>(rows * cols));
  dvec<float> dscales(static_cast<size_t>(rows * ng));
  dvec<int32_t> dzeros(static_cast<size_t>(rows * ng));
  GroupParams tensor_p{};
  if (tensor) {
    const Range rg = range_of(raw(dw), rows * cols);
    tensor_p = hd::params_for_range(rg.lo, rg.hi, scheme.symmetric, scheme.qmax(), store);
  }
  for_each_index(rows * ng, RtnGroup{raw(dw), raw(dq), raw(dscales), raw(dzeros), cols, gs, ng, scheme.symmetric,
                                     tensor, scheme.qmax(), store, tensor_p});
  t.q = download(dq);
  if (tensor) {
    t.scales = {tensor_p.scale};
    t.zeros = {tensor_p.zero};
  } else {
    t.scales = download(dscales);
    t.zeros = download(dzeros);
  }
  return t;
}

}  // namespace qf::QF_DEV_NS
