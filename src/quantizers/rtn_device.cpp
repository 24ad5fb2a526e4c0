// RTN on the device: one index per (row, group) fits the group's min-max
// range and writes its codes, with the QF_HD math of int_quant.h that the
// CPU reference (rtn.cpp) uses, so codes and scales are the same bits. The
// mse observer searches every group of the weight together, as rtn.cpp:
// each step is one index per group (quantizers/mse_search.h), and the early
// stop, which looks at all groups, is decided here between steps.
#include "core/error.h"
#include "device/exec.h"
#include "quantizers/device_quantizers.h"
#include "quantizers/mse_search.h"

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
  const GroupParams* searched;  // mse: the search's result per group, else null

  QF_HD void operator()(int64_t i) const {
    const int64_t r = i / ng, c0 = (i % ng) * gs, n = gs < cols - c0 ? gs : cols - c0;
    const float* x = w + r * cols + c0;
    GroupParams p = tensor_p;
    if (searched) {
      p = searched[i];
      scales[i] = p.scale;
      zeros[i] = p.zero;
    } else if (!tensor) {
      p = hd::minmax_fit(x, n, 1, symmetric, qmax, store);
      scales[i] = p.scale;
      zeros[i] = p.zero;
    }
    uint8_t* out = q + r * cols + c0;
    for (int64_t k = 0; k < n; ++k) out[k] = hd::quantize_int(x[k], p.scale, p.zero, qmax);
  }
};

// The mse search's state per group and its steps.
struct MseStart {
  const float* w;
  float* lo;
  float* hi;
  GroupParams* best;
  double* best_err;
  int64_t cols, gs, ng;
  hd::MseGrid grid;
  QF_HD void operator()(int64_t i) const {
    const int64_t c0 = (i % ng) * gs, n = gs < cols - c0 ? gs : cols - c0;
    hd::mse_range(w + (i / ng) * cols + c0, n, 1, grid.expand, lo + i, hi + i);
    best[i] = hd::params_for_range(lo[i], hi[i], grid.symmetric, grid.qmax, grid.store);
    best_err[i] = static_cast<double>(hd::float_of(0x7f800000u));  // +inf
  }
};

// One candidate for every group; improved[i] says whether group i's best moved.
struct MseStep {
  const float* w;
  const float* lo;
  const float* hi;
  GroupParams* best;
  double* best_err;
  char* improved;
  int64_t cols, gs, ng;
  hd::MseGrid grid;
  float shrink;
  QF_HD void operator()(int64_t i) const {
    const int64_t c0 = (i % ng) * gs, n = gs < cols - c0 ? gs : cols - c0;
    improved[i] = hd::mse_try(w + (i / ng) * cols + c0, n, 1, lo[i], hi[i], shrink, grid, best + i, best_err + i);
  }
};

struct IsSet {
  const char* flags;
  QF_HD bool operator()(int64_t i) const { return flags[i] != 0; }
};

}  // namespace

QuantizedTensor quantize_rtn(const float* w, int64_t rows, int64_t cols, const QuantScheme& scheme,
                             RangeObserver obs, const MseOptions& mse) {
  const std::string where = "rtn " + scheme.describe();
  scheme.validate(where, cols);
  if (rows <= 0 || cols <= 0)
    throw invalid_input(where, "empty weight [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  const bool tensor = scheme.strategy == QuantStrategy::Tensor;
  if (obs == RangeObserver::Mse && tensor)
    throw unsupported(where, "the mse observer with the tensor strategy has no device version (one search over the "
                             "whole weight); quantize it with --device cpu");
  QuantizedTensor t;
  t.scheme = scheme;
  t.rows = rows;
  t.cols = cols;
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
  dvec<GroupParams> searched;
  if (obs == RangeObserver::Mse) {
    const hd::MseGrid grid = mse_grid(scheme, mse);
    const int64_t groups = rows * ng;
    dvec<float> lo(static_cast<size_t>(groups)), hi(static_cast<size_t>(groups));
    dvec<double> best_err(static_cast<size_t>(groups));
    dvec<char> improved(static_cast<size_t>(groups));
    searched.resize(static_cast<size_t>(groups));
    for_each_index(groups, MseStart{raw(dw), raw(lo), raw(hi), raw(searched), raw(best_err), cols, gs, ng, grid});
    int64_t no_improve = 0;
    for (int64_t i = 0; i < grid.steps; ++i) {
      for_each_index(groups, MseStep{raw(dw), raw(lo), raw(hi), raw(searched), raw(best_err), raw(improved), cols, gs,
                                     ng, grid, hd::mse_shrink(grid, i)});
      if (count_if_index(groups, IsSet{raw(improved)}) > 0) no_improve = 0;
      else if (++no_improve >= grid.patience) break;
    }
  }
  for_each_index(rows * ng, RtnGroup{raw(dw), raw(dq), raw(dscales), raw(dzeros), cols, gs, ng, scheme.symmetric,
                                     tensor, scheme.qmax(), store, tensor_p,
                                     searched.empty() ? nullptr : raw(searched)});
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
