// Throughput benchmark of the runtime: prefill and decode tokens/s, time to
// first token, KV-cache bytes, peak RSS, and the memory-bandwidth bound of
// decode (weight bytes read per step against a measured read bandwidth).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/thread_pool.h"
#include "device/device.h"
#include "runtime/model.h"

namespace qf::eval {

struct BenchOptions {
  int64_t prompt = 512;
  int64_t gen = 128;
  int64_t batch = 1;
  int reps = 1;           // repetitions; the best is reported
  rt::KvFormat kv_dtype = rt::KvDType::F16;
  uint64_t seed = 1;
  uint64_t kv_budget = 0;  // bytes; > 0: report the tokens a cache of this size holds
  // Where the forward passes run: the CPU runtime, or the device decoder
  // (runtime/device_runtime.h: one sequence, f16 KV cache).
  device::Kind device = device::Kind::Cpu;
};

struct BenchResult {
  int64_t prompt = 0, gen = 0, batch = 0;
  std::string kv_dtype, simd;
  std::string device = "cpu";
  uint64_t device_bytes = 0;  // device memory the decoder needs at most (0 on the CPU)
  int threads = 0;
  double prefill_tokens_per_s = 0, decode_tokens_per_s = 0, ttft_seconds = 0;
  uint64_t kv_bytes_reserved = 0, kv_bytes_used = 0, kv_bytes_per_token = 0;
  uint64_t kv_bytes_per_sequence = 0;  // f16 windows a sequence holds besides its blocks (KIVI)
  uint64_t kv_budget_bytes = 0;
  int64_t kv_budget_tokens = 0;        // positions one sequence fits in kv_budget_bytes
  uint64_t peak_rss_bytes = 0;
  uint64_t weight_bytes_per_step = 0;       // bytes of weights one decode step reads
  double read_bandwidth_bytes_per_s = 0;    // measured streaming read over as many bytes, all threads
  double decode_bound_tokens_per_s = 0;     // batch * read bandwidth / weight bytes per step
};

// On a device: weight bytes per step and the read bandwidth are the
// device's (the decoder's stored weights, a device reduction's rate); the
// KV figures are its f32 cache; peak RSS is the host's. Unsupported for a
// batch above 1 or a cache other than f16 there; Io when the device's
// memory cannot hold the decoder.
BenchResult run_bench(const rt::Model& model, const BenchOptions& o, ThreadPool& pool);

// bench --json's object: the model argument as given, its format and size, and the results.
nlohmann::ordered_json bench_report(const std::string& model_arg, const rt::Model& model, const BenchResult& r);

// Bytes/s read by every thread of the pool streaming through a buffer of
// `bytes` (clamped to 1 MiB .. 1 GiB; one contiguous span per thread, as
// decode's row partitions read the weights), best of 5 timings after a
// warm-up. A model whose weights fit in the caches gets the caches' rate,
// as its decode does.
double measure_read_bandwidth(ThreadPool& pool, uint64_t bytes);

// Peak resident set size of this process (VmHWM), 0 if unknown.
uint64_t peak_rss_bytes();

}  // namespace qf::eval
