#include "core/peak_flops.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "core/thread_pool.h"

namespace qf {
namespace {

// Each probe runs `iters` steps of kAcc independent accumulator updates
// (enough to cover the latency of two FMA units) and returns a value derived
// from all of them, so no step can be optimised away.
constexpr int kAcc = 12;

// The scalar level's kernels are built for the x86-64 baseline: a multiply
// and an add (2 flops a step and accumulator).
double probe_scalar(int64_t iters) {
  double a[kAcc];
  for (int i = 0; i < kAcc; ++i) a[i] = 1.0 + i * 1e-3;
  const double b = 0.999999, c = 1e-7;
  for (int64_t t = 0; t < iters; ++t)
#pragma GCC unroll 12
    for (int i = 0; i < kAcc; ++i) a[i] = a[i] * b + c;
  double s = 0;
  for (double v : a) s += v;
  return s;
}

// One vector probe per level and type, written out by a macro: each needs
// its own target attribute (a template would be compiled for the baseline).
#define QF_VECTOR_PROBE(name, tgt, V, set1, fma, store, Elem, lanes)                            \
  __attribute__((target(tgt))) double name(int64_t iters) {                                    \
    V a[kAcc];                                                                                 \
    for (int i = 0; i < kAcc; ++i) a[i] = set1(static_cast<Elem>(1.0 + i * 1e-3));             \
    const V b = set1(static_cast<Elem>(0.999999)), c = set1(static_cast<Elem>(1e-7));          \
    for (int64_t t = 0; t < iters; ++t)                                                        \
      _Pragma("GCC unroll 12") for (int i = 0; i < kAcc; ++i) a[i] = fma(a[i], b, c);          \
    double s = 0;                                                                              \
    for (int i = 0; i < kAcc; ++i) {                                                           \
      alignas(64) Elem t[lanes];                                                               \
      store(t, a[i]);                                                                          \
      s += static_cast<double>(t[0]) + static_cast<double>(t[lanes - 1]);                      \
    }                                                                                          \
    return s;                                                                                  \
  }

QF_VECTOR_PROBE(probe_avx2_f32, "avx2,fma", __m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_store_ps, float, 8)
QF_VECTOR_PROBE(probe_avx2_f64, "avx2,fma", __m256d, _mm256_set1_pd, _mm256_fmadd_pd, _mm256_store_pd, double, 4)
QF_VECTOR_PROBE(probe_avx512_f32, "avx512f", __m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_store_ps, float, 16)
QF_VECTOR_PROBE(probe_avx512_f64, "avx512f", __m512d, _mm512_set1_pd, _mm512_fmadd_pd, _mm512_store_pd, double, 8)

// VDPBF16PS: 16 f32 lanes, each adding two bf16 products (4 flops a lane);
// the pairs are bf16 ones (the f32 arguments only keep the probe's shape).
__attribute__((target("avx512f,avx512bf16"))) inline __m512 bf16_dot(__m512 acc, __m512, __m512) {
  const __m512bh one_pair = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3F803F80));
  return _mm512_dpbf16_ps(acc, one_pair, one_pair);
}
QF_VECTOR_PROBE(probe_bf16, "avx512f,avx512bf16", __m512, _mm512_set1_ps, bf16_dot, _mm512_store_ps, float, 16)

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// GFLOP/s of `probe` (flops_per_iter a step) on every thread of the pool:
// rounds doubled until one lasts 3 ms, then the best of 3.
double measure(ThreadPool& pool, double (*probe)(int64_t), double flops_per_iter) {
  const int threads = pool.size();
  std::vector<double> sink(static_cast<size_t>(threads));
  auto round = [&](int64_t iters) {
    const double t0 = now_s();
    pool.parallel_for(threads, 1, [&](const Chunk& ch) { sink[static_cast<size_t>(ch.index)] += probe(iters); });
    return now_s() - t0;
  };
  int64_t iters = int64_t{1} << 15;
  round(iters);  // warm-up: the threads and the clocks
  while (round(iters) < 0.003 && iters < (int64_t{1} << 30)) iters *= 2;
  double best = 0;
  for (int k = 0; k < 3; ++k) {
    const double dt = round(iters);
    if (dt > 0) best = std::max(best, flops_per_iter * static_cast<double>(iters) * threads / dt / 1e9);
  }
  if (!(sink[0] == sink[0])) best = 0;  // keeps the sums alive; never NaN
  return best;
}

}  // namespace

std::vector<PeakFlops> measure_peak_flops(ThreadPool& pool) {
  std::vector<PeakFlops> out;
  const SimdLevel best = best_simd_level();
  out.push_back({SimdLevel::Scalar, "f64", measure(pool, probe_scalar, kAcc * 2.0)});
  if (best >= SimdLevel::Avx2) {
    out.push_back({SimdLevel::Avx2, "f32", measure(pool, probe_avx2_f32, kAcc * 8 * 2.0)});
    out.push_back({SimdLevel::Avx2, "f64", measure(pool, probe_avx2_f64, kAcc * 4 * 2.0)});
  }
  if (best >= SimdLevel::Avx512) {
    out.push_back({SimdLevel::Avx512, "f32", measure(pool, probe_avx512_f32, kAcc * 16 * 2.0)});
    out.push_back({SimdLevel::Avx512, "f64", measure(pool, probe_avx512_f64, kAcc * 8 * 2.0)});
    if (cpu_has_avx512_bf16()) out.push_back({SimdLevel::Avx512, "bf16", measure(pool, probe_bf16, kAcc * 16 * 4.0)});
  }
  return out;
}

}  // namespace qf
