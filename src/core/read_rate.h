// How the bandwidth probes (eval/bench.h's measure_read_bandwidth, the
// device runtime's read_bandwidth) size their buffer and time their passes,
// so that the CPU and device figures are measured the same way.
#pragma once

#include <cstdint>
#include <functional>

namespace qf {

// The probe buffer's size for `bytes` of weights: whole 64-byte lines, at
// least 1 MiB, at most 1 GiB (beyond a few hundred MiB the rate is memory's,
// and the buffer must not double a big model's footprint).
uint64_t probe_bytes(uint64_t bytes);

// Bytes/s of `pass`, which reads `bytes`: one warm-up pass, then rounds of
// passes doubled until a round lasts 20 ms, then the best of 5 such rounds.
double best_read_rate(uint64_t bytes, const std::function<void()>& pass);

}  // namespace qf
