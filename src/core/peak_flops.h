// What the machine's arithmetic units offer, measured the way the bandwidth
// probe (core/read_rate.h) measures memory: a register-only loop of
// independent multiply-adds on every thread of a pool, timed in rounds, the
// best round kept. quantize reports it next to the GFLOP/s its phases
// achieved, so a report says how far from the machine each phase ran.
#pragma once

#include <string>
#include <vector>

#include "core/simd.h"

namespace qf {

class ThreadPool;

// One kind of arithmetic at one SIMD level.
struct PeakFlops {
  SimdLevel level = SimdLevel::Scalar;
  std::string kind;  // "f32", "f64" (fused multiply-adds of that type; at the scalar level separate multiplies and adds, as the scalar kernels run), "bf16" (AVX512-BF16 pair dot products into f32)
  double gflops = 0;  // with all the pool's threads
};

// Every kind at every level up to best_simd_level() (bf16 where the CPU has
// AVX512-BF16), on all of the pool's threads. About 0.1 s in all.
std::vector<PeakFlops> measure_peak_flops(ThreadPool& pool);

}  // namespace qf
