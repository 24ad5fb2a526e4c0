#include "quantizers/rtn.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "quantizers/mse_search.h"

namespace qf {

namespace {

// (scale, zero) for the range [lo, hi] (lo <= 0 <= hi), scale rounded first.
GroupParams params_for_range(float lo, float hi, const QuantScheme& s) {
  return hd::params_for_range(lo, hi, s.symmetric, s.qmax(), scale_store(s.scale_dtype));
}

// One group of values: x[0], x[stride], ..., x[(n-1)*stride].
template <class T>
struct GroupView {
  const T* x;
  int64_t n, stride;
};

}  // namespace

hd::MseGrid mse_grid(const QuantScheme& s, const MseOptions& o) {
  const double total = o.maxshrink * o.grid;
  return hd::MseGrid{total > 0 ? static_cast<int64_t>(std::min(total, 1e9)) : 0,
                     o.patience,
                     o.grid,
                     o.norm,
                     static_cast<float>(o.expand),
                     s.symmetric,
                     s.qmax(),
                     scale_store(s.scale_dtype)};
}

namespace {

// llm-compressor's MSE grid search (see rtn.h) over a set of groups observed
// together: each group keeps its own best candidate, the early stop looks at
// all of them (the steps of quantizers/mse_search.h).
template <class T>
std::vector<GroupParams> mse_search(const std::vector<GroupView<T>>& groups, const QuantScheme& s, const MseOptions& o) {
  const hd::MseGrid grid = mse_grid(s, o);
  const size_t n = groups.size();
  std::vector<float> lo(n), hi(n);
  std::vector<GroupParams> best(n);
  std::vector<double> best_err(n, std::numeric_limits<double>::infinity());
  for (size_t g = 0; g < n; ++g) {
    hd::mse_range(groups[g].x, groups[g].n, groups[g].stride, grid.expand, &lo[g], &hi[g]);
    best[g] = params_for_range(lo[g], hi[g], s);
  }
  int64_t no_improve = 0;
  for (int64_t i = 0; i < grid.steps; ++i) {
    const float pf = hd::mse_shrink(grid, i);
    bool improved = false;
    for (size_t g = 0; g < n; ++g)
      improved |= hd::mse_try(groups[g].x, groups[g].n, groups[g].stride, lo[g], hi[g], pf, grid, &best[g], &best_err[g]);
    if (improved) no_improve = 0;
    else if (++no_improve >= o.patience) break;
  }
  return best;
}

template <class T>
GroupParams fit_group_impl(const T* x, int64_t n, int64_t stride, const QuantScheme& s, RangeObserver obs,
                           const MseOptions& mse) {
  return hd::observed_fit(x, n, stride, obs == RangeObserver::Mse, mse_grid(s, mse));
}

}  // namespace

const char* observer_name(RangeObserver o) { return o == RangeObserver::Mse ? "mse" : "minmax"; }

hd::ScaleStore scale_store(DType dt) {
  return dt == DType::F16 ? hd::ScaleStore::F16 : (dt == DType::BF16 ? hd::ScaleStore::BF16 : hd::ScaleStore::F32);
}

float scale_dtype_eps(DType dt) { return hd::scale_store_eps(scale_store(dt)); }

float round_scale(float s, DType dt) { return hd::round_scale_to(s, scale_store(dt)); }

uint8_t quantize_value(float x, GroupParams p, const QuantScheme& s) {
  return hd::quantize_int(x, p.scale, p.zero, s.qmax());
}

GroupParams fit_group(const float* x, int64_t n, int64_t stride, const QuantScheme& s, RangeObserver obs,
                      const MseOptions& mse) {
  return fit_group_impl(x, n, stride, s, obs, mse);
}

GroupParams fit_group(const double* x, int64_t n, int64_t stride, const QuantScheme& s, RangeObserver obs,
                      const MseOptions& mse) {
  return fit_group_impl(x, n, stride, s, obs, mse);
}

QuantizedTensor quantize_rtn(const float* w, int64_t rows, int64_t cols, const QuantScheme& scheme, RangeObserver obs,
                             const MseOptions& mse) {
  const std::string where = "rtn " + scheme.describe();
  scheme.validate(where, cols);
  if (rows <= 0 || cols <= 0) throw invalid_input(where, "empty weight [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");

  QuantizedTensor t;
  t.scheme = scheme;
  t.rows = rows;
  t.cols = cols;
  t.q.resize(static_cast<size_t>(rows * cols));
  const size_t np = static_cast<size_t>(t.n_params());
  t.scales.resize(np);
  t.zeros.resize(np);

  GroupParams tensor_p{};
  if (scheme.strategy == QuantStrategy::Tensor) {
    tensor_p = fit_group(w, rows * cols, 1, scheme, obs, mse);
    t.scales[0] = tensor_p.scale;
    t.zeros[0] = tensor_p.zero;
  }
  const int64_t gs = scheme.strategy == QuantStrategy::Group ? scheme.group_size : cols;
  // MSE: every group of the weight searched together (one early stop).
  std::vector<GroupParams> searched;
  if (obs == RangeObserver::Mse && scheme.strategy != QuantStrategy::Tensor) {
    std::vector<GroupView<float>> groups;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c0 = 0; c0 < cols; c0 += gs) groups.push_back({w + r * cols + c0, std::min(gs, cols - c0), 1});
    searched = mse_search(groups, scheme, mse);
  }
  size_t gi = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* wr = w + r * cols;
    uint8_t* qr = t.q.data() + r * cols;
    for (int64_t g = 0; g * gs < cols; ++g) {
      const int64_t c0 = g * gs, n = std::min(gs, cols - c0);
      GroupParams p = tensor_p;
      if (scheme.strategy != QuantStrategy::Tensor) {
        p = searched.empty() ? fit_group(wr + c0, n, 1, scheme, obs) : searched[gi++];
        const size_t pi = static_cast<size_t>(t.param_index(r, g));
        t.scales[pi] = p.scale;
        t.zeros[pi] = p.zero;
      }
      for (int64_t c = c0; c < c0 + n; ++c) qr[c] = quantize_value(wr[c], p, scheme);
    }
  }
  return t;
}

}  // namespace qf
