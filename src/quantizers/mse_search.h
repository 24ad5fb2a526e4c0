// The mse observer's grid search (rtn.h: llm-compressor's _grid_search_mse)
// as per-group steps that the CPU (rtn.cpp) and the device
// (rtn_device.cpp, gptq_device.cpp) share. Host and device (core/hd.h).
#pragma once

#include <cstdint>

#include "core/hd.h"
#include "quantizers/int_quant.h"

namespace qf::hd {

// The settings of one search (MseOptions, resolved).
struct MseGrid {
  int64_t steps;     // int(min(maxshrink * grid, 1e9)) candidates
  int64_t patience;  // consecutive candidates without improvement before stopping
  double grid, norm;
  float expand;
  bool symmetric;
  int32_t qmax;
  ScaleStore store;
};

// Candidate i's shrink factor: 1 - i / grid, in double, then f32.
QF_HD inline float mse_shrink(const MseGrid& g, int64_t i) {
  return static_cast<float>(1.0 - static_cast<double>(i) / g.grid);
}

// The group's starting range: group_range (int_quant.h) times expand.
template <class T>
QF_HD inline void mse_range(const T* x, int64_t n, int64_t stride, float expand, float* lo, float* hi) {
  group_range(x, n, stride, lo, hi);
  *lo *= expand;
  *hi *= expand;
}

// sum |dequant(q(v)) - v|^norm over the group, in double.
template <class T>
QF_HD inline double mse_error(const T* x, int64_t n, int64_t stride, GroupParams p, int32_t qmax, double norm) {
  double err = 0.0;
  for (int64_t k = 0; k < n; ++k) {
    const float v = static_cast<float>(x[k * stride]);
    const float d = dequantize_int(quantize_int(v, p.scale, p.zero, qmax), p.scale, p.zero) - v;
    err += pow_f64(static_cast<double>(abs_f32(d)), norm);
  }
  return err;
}

// One candidate for one group: true (and `best`, `best_err` updated) when
// it strictly improves on the best so far (the widest range wins ties).
template <class T>
QF_HD inline bool mse_try(const T* x, int64_t n, int64_t stride, float lo, float hi, float shrink, const MseGrid& g,
                          GroupParams* best, double* best_err) {
  const GroupParams p = params_for_range(shrink * lo, shrink * hi, g.symmetric, g.qmax, g.store);
  const double err = mse_error(x, n, stride, p, g.qmax, g.norm);
  if (!(err < *best_err)) return false;
  *best_err = err;
  *best = p;
  return true;
}

// The whole search for one group with its own early stop (fit_group).
template <class T>
QF_HD inline GroupParams mse_fit(const T* x, int64_t n, int64_t stride, const MseGrid& g) {
  float lo, hi;
  mse_range(x, n, stride, g.expand, &lo, &hi);
  GroupParams best = params_for_range(lo, hi, g.symmetric, g.qmax, g.store);
  double best_err = static_cast<double>(float_of(0x7f800000u));  // +inf: the first finite error improves
  int64_t no_improve = 0;
  for (int64_t i = 0; i < g.steps; ++i) {
    if (mse_try(x, n, stride, lo, hi, mse_shrink(g, i), g, &best, &best_err)) no_improve = 0;
    else if (++no_improve >= g.patience) break;
  }
  return best;
}

// A group's (scale, zero) under the min-max or the mse observer.
template <class T>
QF_HD inline GroupParams observed_fit(const T* x, int64_t n, int64_t stride, bool mse, const MseGrid& g) {
  return mse && n > 0 ? mse_fit(x, n, stride, g) : minmax_fit(x, n, stride, g.symmetric, g.qmax, g.store);
}

}  // namespace qf::hd
