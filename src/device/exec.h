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
//
// Device memory comes from device_malloc (cudaMalloc; aligned host memory in
// the host build) through DeviceAlloc, whose release never throws: after a
// sticky device error, unwinding through device vectors frees what it can
// and the error reaches the caller as qf::Error(Io) "device: ..." instead of
// ending the process. The cuda build's algorithms take their temporary
// storage from the same place and do not synchronise after each call
// (par_nosync); a download (or a result returned to the host) waits for the
// work before it. Every Thrust call made here goes through guarded(), which
// turns what Thrust or the CUDA runtime throws into that one error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <new>
#include <string>
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

#include "core/error.h"
#include "core/hd.h"

#if defined(__CUDACC__)
#define QF_DEV_NS cuda
#else
#define QF_DEV_NS host
#endif

namespace qf::QF_DEV_NS {

namespace thrust = THRUST_NS_QUALIFIER;

// `bytes` of this build's device memory (device/cuda/memory.cu,
// device/memory_host.cpp): qf::Error(Io) "device: out of memory ..." when
// there is none (or QF_DEVICE_FAULT says so). device_free never throws.
void* device_malloc(size_t bytes);
void device_free(void* p) noexcept;

// Runs f; what Thrust, the CUDA runtime or the host build's allocator throws
// becomes qf::Error(Io) "device: <what>: ...".
template <class F>
auto guarded(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw Error(ErrorKind::Io, std::string("device: ") + what + ": out of memory");
  } catch (const std::exception& e) {
    throw Error(ErrorKind::Io, std::string("device: ") + what + ": " + e.what());
  }
}

// The allocator of device vectors.
template <class T>
class DeviceAlloc : public thrust::device_allocator<T> {
 public:
  using base = thrust::device_allocator<T>;
  using value_type = T;
  using pointer = typename base::pointer;
  using size_type = typename base::size_type;
  template <class U>
  struct rebind {
    using other = DeviceAlloc<U>;
  };
  DeviceAlloc() = default;
  DeviceAlloc(const DeviceAlloc&) = default;
  DeviceAlloc& operator=(const DeviceAlloc&) = default;
  template <class U>
  DeviceAlloc(const DeviceAlloc<U>&) {}
  pointer allocate(size_type n) { return pointer(static_cast<T*>(device_malloc(n * sizeof(T)))); }
  void deallocate(pointer p, size_type) noexcept { device_free(thrust::raw_pointer_cast(p)); }
  bool operator==(const DeviceAlloc&) const { return true; }
  bool operator!=(const DeviceAlloc&) const { return false; }
};

template <class T>
using dvec = thrust::device_vector<T, DeviceAlloc<T>>;

// The execution policy of every algorithm: the cuda build's temporary
// storage from device_malloc, no synchronisation after each call; the host
// build's OpenMP system.
#if defined(__CUDACC__)
struct TempAlloc {
  using value_type = char;
  char* allocate(std::ptrdiff_t n) { return static_cast<char*>(device_malloc(static_cast<size_t>(n))); }
  void deallocate(char* p, size_t) noexcept { device_free(p); }
};
inline auto policy() { return thrust::cuda::par_nosync(TempAlloc{}); }
#else
inline auto policy() { return thrust::device; }
#endif

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
  return guarded("upload", [&] { return dvec<T>(p, p + n); });
}
template <class T>
std::vector<T> download(const dvec<T>& v) {
  std::vector<T> out(v.size());
  guarded("download", [&] { thrust::copy(v.begin(), v.end(), out.begin()); });
  return out;
}
// n device values at src -> host dst.
template <class T>
void download(const T* src, int64_t n, T* dst) {
  if (n <= 0) return;
  guarded("download", [&] { thrust::copy(thrust::device_pointer_cast(src), thrust::device_pointer_cast(src) + n, dst); });
}
// n device values at src -> device dst.
template <class T>
void copy_device(const T* src, int64_t n, T* dst) {
  if (n <= 0) return;
  guarded("copy", [&] {
    thrust::copy(policy(), thrust::device_pointer_cast(src), thrust::device_pointer_cast(src) + n,
                 thrust::device_pointer_cast(dst));
  });
}
// v := n values (size n, contents of the host or device range [p, p + n)).
template <class T, class P>
void assign(dvec<T>& v, P p, int64_t n) {
  guarded("assign", [&] { v.assign(p, p + n); });
}
// v := n copies of value.
template <class T>
void fill(dvec<T>& v, int64_t n, T value) {
  guarded("fill", [&] { v.assign(static_cast<size_t>(n), value); });
}
// v resized to at least n elements (contents kept).
template <class T>
void fit(dvec<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) guarded("resize", [&] { v.resize(static_cast<size_t>(n)); });
}

// The host build runs index spaces below this size on the calling thread:
// an OpenMP region per small launch (GPTQ launches two per column) costs
// more than the work, and far more when the cores are shared. Each index is
// independent, so the results are the same either way.
constexpr int64_t kHostSerialBelow = int64_t{1} << 16;

template <class F>
void for_each_index(int64_t n, F f) {
  if (n <= 0) return;
  guarded("kernel", [&] {
#if !defined(__CUDACC__)
    if (n < kHostSerialBelow) {
      for (int64_t i = 0; i < n; ++i) f(i);
      return;
    }
#endif
    thrust::for_each(policy(), thrust::counting_iterator<int64_t>(0), thrust::counting_iterator<int64_t>(n), f);
  });
}

// Number of indices in [0, n) for which f(i) is true (f: QF_HD bool(int64_t)).
template <class F>
int64_t count_if_index(int64_t n, F f) {
  if (n <= 0) return 0;
  return guarded("count", [&] {
    return static_cast<int64_t>(thrust::count_if(policy(), thrust::counting_iterator<int64_t>(0),
                                                 thrust::counting_iterator<int64_t>(n), f));
  });
}

// Reduction of n values op(x[i]) with `join` from `init` (transform_reduce).
template <class T, class U, class Op, class Join>
U transform_reduce_n(const T* x, int64_t n, Op op, U init, Join join) {
  if (n <= 0) return init;
  return guarded("reduce", [&] { return thrust::transform_reduce(policy(), x, x + n, op, init, join); });
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
  return transform_reduce_n(x, n, RangeOfValue{}, Range{0.0f, 0.0f}, RangeJoin{});
}

}  // namespace qf::QF_DEV_NS
