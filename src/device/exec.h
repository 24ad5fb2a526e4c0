// What a device source (…_device.cpp) includes: the build it is part of, the
// Thrust it runs on, device vectors and the one way work is launched.
//
// A device source is compiled twice. The host compiler builds it into its
// layer's library with Thrust's OpenMP system (namespace qf::host); nvcc
// builds it through the layer's cuda/*.cu with Thrust's CUDA system
// (namespace qf::cuda). The build system wraps Thrust in a namespace of each
// build (THRUST_CUB_WRAPPED_NAMESPACE), so both can live in one program.
//
// Work is a functor with a QF_HD operator()(int64_t i), run by for_each_index
// over [0, n): one index per row, group or element, never a loop that
// depends on the thread count, so results do not depend on it either.
// Functors hold raw device pointers (raw()), never containers.
#pragma once

#include <cstdint>
#include <vector>

#include <thrust/copy.h>
#include <thrust/count.h>
#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/reduce.h>
#include <thrust/sort.h>
#include <thrust/transform_reduce.h>

#include "core/hd.h"

#if defined(__CUDACC__)
#define QF_DEV_NS cuda
#else
#define QF_DEV_NS host
#endif

namespace qf::QF_DEV_NS {

namespace thrust = THRUST_NS_QUALIFIER;

template <class T>
using dvec = thrust::device_vector<T>;

template <class T>
T* raw(dvec<T>& v) {
  return thrust::raw_pointer_cast(v.data());
}
template <class T>
const T* raw(const dvec<T>& v) {
  return thrust::raw_pointer_cast(v.data());
}

// Host -> device and device -> host copies.
template <class T>
dvec<T> upload(const T* p, int64_t n) {
  return dvec<T>(p, p + n);
}
template <class T>
std::vector<T> download(const dvec<T>& v) {
  std::vector<T> out(v.size());
  thrust::copy(v.begin(), v.end(), out.begin());
  return out;
}

template <class F>
void for_each_index(int64_t n, F f) {
  if (n <= 0) return;
  thrust::for_each(thrust::device, thrust::counting_iterator<int64_t>(0), thrust::counting_iterator<int64_t>(n), f);
}

// Number of indices in [0, n) for which f(i) is true (f: QF_HD bool(int64_t)).
template <class F>
int64_t count_if_index(int64_t n, F f) {
  if (n <= 0) return 0;
  return thrust::count_if(thrust::device, thrust::counting_iterator<int64_t>(0), thrust::counting_iterator<int64_t>(n), f);
}

// The range [min(x, 0), max(x, 0)] of n device floats, NaN ignored: the
// quantizers' ranges always contain 0. Exact whatever the reduction order.
struct Range {
  float lo, hi;
};
struct RangeOfValue {
  QF_HD Range operator()(float x) const { return Range{x < 0.0f ? x : 0.0f, x > 0.0f ? x : 0.0f}; }
};
struct RangeJoin {
  QF_HD Range operator()(Range a, Range b) const {
    return Range{b.lo < a.lo ? b.lo : a.lo, b.hi > a.hi ? b.hi : a.hi};
  }
};
inline Range range_of(const float* x, int64_t n) {
  return thrust::transform_reduce(thrust::device, x, x + n, RangeOfValue{}, Range{0.0f, 0.0f}, RangeJoin{});
}

}  // namespace qf::QF_DEV_NS
