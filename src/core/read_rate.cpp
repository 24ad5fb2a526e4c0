#include "core/read_rate.h"

#include <algorithm>
#include <chrono>

namespace qf {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

uint64_t probe_bytes(uint64_t bytes) {
  return std::clamp<uint64_t>(bytes, uint64_t{1} << 20, uint64_t{1} << 30) / 64 * 64;
}

double best_read_rate(uint64_t bytes, const std::function<void()>& pass) {
  pass();  // warm-up: caches and the threads
  int reps = 1;
  for (;;) {
    const double s0 = now_s();
    for (int r = 0; r < reps; ++r) pass();
    if (now_s() - s0 >= 0.02 || reps >= (1 << 20)) break;
    reps *= 2;
  }
  double best = 0;
  for (int k = 0; k < 5; ++k) {
    const double t0 = now_s();
    for (int r = 0; r < reps; ++r) pass();
    const double dt = now_s() - t0;
    if (dt > 0) best = std::max(best, static_cast<double>(bytes) * reps / dt);
  }
  return best;
}

}  // namespace qf
