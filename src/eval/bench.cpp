#include "eval/bench.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/huge_page_buffer.h"
#include "core/weight_residency.h"
#include "core/read_rate.h"
#include "runtime/cpu/kernels.h"
#include "runtime/device_runtime.h"

namespace qf::eval {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

uint64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

double measure_read_bandwidth(ThreadPool& pool, uint64_t bytes) {
  bytes = probe_bytes(bytes);
  const size_t words = static_cast<size_t>(bytes / 8);
  // Memory of the kind the runtime reads weights into (huge pages where the
  // system has them), so the bound is not below what decode can reach.
  HugePageBuffer memory(words * 8, "read bandwidth probe");
  uint64_t* buf = reinterpret_cast<uint64_t*>(memory.data());
  for (size_t i = 0; i < words; ++i) buf[i] = i;
  // One contiguous span per thread, as decode's row partitions are.
  const int64_t parts = pool.size();
  std::vector<uint64_t> sums(static_cast<size_t>(parts));
  const auto pass = [&] {
    pool.parallel_for(parts, 1, [&](const Chunk& c) {
      for (int64_t p = c.begin; p < c.end; ++p) {
        const size_t lo = words / static_cast<size_t>(parts) / 8 * 8 * static_cast<size_t>(p);
        const size_t hi = p + 1 == parts ? words : lo + words / static_cast<size_t>(parts) / 8 * 8;
        uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
        size_t i = lo;
        for (; i + 8 <= hi; i += 8) {
          a0 += buf[i], a1 += buf[i + 1], a2 += buf[i + 2], a3 += buf[i + 3];
          a4 += buf[i + 4], a5 += buf[i + 5], a6 += buf[i + 6], a7 += buf[i + 7];
        }
        for (; i < hi; ++i) a0 += buf[i];
        sums[static_cast<size_t>(p)] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
      }
    });
  };
  const double best = best_read_rate(bytes, pass);
  // The sums must be used, or the loads could be dropped; they are also a check.
  uint64_t total = 0, want = 0;
  for (uint64_t v : sums) total += v;
  want = static_cast<uint64_t>(words) * (static_cast<uint64_t>(words) - 1) / 2;
  if (total != want) throw Error(ErrorKind::Internal, "read bandwidth: the buffer's sum is wrong");
  return best;
}

namespace {

// run_bench on the device decoder: one sequence, the prompt in one forward,
// then a token per forward.
BenchResult run_device_bench(const rt::Model& model, const BenchOptions& o, BenchResult r) {
  const std::string where = std::string("bench --device ") + device::kind_name(o.device);
  if (o.batch != 1) throw unsupported(where, "the device decoder runs one sequence; --batch above 1 runs on the CPU only for now");
  if (o.kv_dtype != rt::KvDType::F16)
    throw unsupported(where, std::string("the device decoder keeps an f16 KV cache; --kv-dtype ") +
                                 o.kv_dtype.name() + " runs on the CPU only for now");
  const int64_t per_seq = o.prompt + o.gen;
  r.device_bytes = rt::device_decoder_bytes(model, per_seq);
  device::require_device_memory(o.device, r.device_bytes, where);
  std::unique_ptr<rt::DeviceDecoder> dev = rt::make_device_decoder(o.device, model, per_seq);
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(model.vocab_size() - 1));
  double best_prefill = 1e300, best_decode = 1e300;
  std::vector<float> logits;
  for (int rep = 0; rep < std::max(1, o.reps); ++rep) {
    dev->reset();
    std::vector<int32_t> prompt(static_cast<size_t>(o.prompt));
    for (int32_t& t : prompt) t = tok(rng);
    std::vector<uint8_t> want(prompt.size(), 0);
    want.back() = 1;
    const double t0 = now_s();
    dev->forward(prompt.data(), o.prompt, want.data(), logits);  // the logits' download waits for the device
    best_prefill = std::min(best_prefill, now_s() - t0);
    const uint8_t one = 1;
    const double t1 = now_s();
    for (int64_t step = 0; step < o.gen; ++step) {
      const int32_t t = tok(rng);
      dev->forward(&t, 1, &one, logits);
    }
    best_decode = std::min(best_decode, now_s() - t1);
  }
  r.prefill_tokens_per_s = static_cast<double>(o.prompt) / best_prefill;
  r.decode_tokens_per_s = o.gen > 0 ? static_cast<double>(o.gen) / best_decode : 0;
  r.ttft_seconds = best_prefill;
  r.kv_bytes_per_token = dev->kv_bytes_per_token();
  r.kv_bytes_reserved = r.kv_bytes_per_token * static_cast<uint64_t>(per_seq);
  r.kv_bytes_used = r.kv_bytes_per_token * static_cast<uint64_t>(dev->position());
  r.weight_bytes_per_step = dev->weight_bytes_per_token();
  r.peak_rss_bytes = peak_rss_bytes();
  r.read_bandwidth_bytes_per_s = rt::device_read_bandwidth(o.device, r.weight_bytes_per_step);
  r.decode_bound_tokens_per_s = r.read_bandwidth_bytes_per_s / static_cast<double>(r.weight_bytes_per_step);
  return r;
}

}  // namespace

BenchResult run_bench(const rt::Model& model, const BenchOptions& o, ThreadPool& pool) {
  if (o.prompt < 1 || o.gen < 0 || o.batch < 1) throw Error(ErrorKind::Usage, "bench: -p >= 1, -n >= 0 and --batch >= 1");
  if (model.max_context() > 0 && o.prompt + o.gen > model.max_context())
    throw invalid_input("bench", "-p " + std::to_string(o.prompt) + " plus -n " + std::to_string(o.gen) +
                                     " exceeds the model's context of " + std::to_string(model.max_context()));
  BenchResult r;
  r.prompt = o.prompt, r.gen = o.gen, r.batch = o.batch;
  r.kv_dtype = o.kv_dtype.name();
  r.simd = rt::simd_level_name(rt::simd_level());
  r.threads = pool.size();
  r.device = device::kind_name(o.device);
  if (o.device != device::Kind::Cpu) return run_device_bench(model, o, r);
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(model.vocab_size() - 1));
  const int64_t per_seq = o.prompt + o.gen;
  double best_prefill = 1e300, best_decode = 1e300, best_ttft = 1e300;
  for (int rep = 0; rep < std::max(1, o.reps); ++rep) {
    rt::KvCache cache = model.make_cache(o.kv_dtype, (per_seq + 32) * o.batch);  // blocks round up per sequence
    if (cache.needs_calibration()) {  // NVFP4: global scales from a random prompt's keys and values
      std::vector<int32_t> calib(static_cast<size_t>(std::min<int64_t>(o.prompt, 512)));
      for (int32_t& t : calib) t = tok(rng);
      model.calibrate_kv(cache, {calib}, pool);
    }
    std::vector<int32_t> seqs;
    for (int64_t s = 0; s < o.batch; ++s) seqs.push_back(cache.add_sequence());
    std::vector<float> logits;
    rt::Batch b;
    // Time to first token: the first sequence's prompt alone, then its first sample.
    double prefill = 0, ttft = 0;
    for (int64_t s = 0; s < o.batch; ++s) {
      b.clear();
      for (int64_t j = 0; j < o.prompt; ++j) b.add(tok(rng), seqs[static_cast<size_t>(s)], j, j + 1 == o.prompt);
      const double t0 = now_s();
      model.forward(b, cache, logits, pool);
      const double dt = now_s() - t0;
      prefill += dt;
      if (s == 0) ttft = dt;
    }
    const double t0 = now_s();
    for (int64_t step = 0; step < o.gen; ++step) {
      b.clear();
      for (int64_t s = 0; s < o.batch; ++s) b.add(tok(rng), seqs[static_cast<size_t>(s)], o.prompt + step, true);
      model.forward(b, cache, logits, pool);
    }
    const double decode = now_s() - t0;
    best_prefill = std::min(best_prefill, prefill);
    best_decode = std::min(best_decode, decode);
    best_ttft = std::min(best_ttft, ttft);
    r.kv_bytes_reserved = cache.bytes_reserved();
    r.kv_bytes_used = cache.bytes_used();
    r.kv_bytes_per_token = cache.bytes_per_token();
    r.kv_bytes_per_sequence = cache.bytes_per_sequence();
  }
  if (o.kv_budget > 0) {
    r.kv_budget_bytes = o.kv_budget;
    r.kv_budget_tokens = o.kv_budget > r.kv_bytes_per_sequence
                             ? static_cast<int64_t>((o.kv_budget - r.kv_bytes_per_sequence) / r.kv_bytes_per_token)
                             : 0;
  }
  r.prefill_tokens_per_s = static_cast<double>(o.prompt * o.batch) / best_prefill;
  r.decode_tokens_per_s = o.gen > 0 ? static_cast<double>(o.gen * o.batch) / best_decode : 0;
  r.ttft_seconds = best_ttft;
  r.weight_bytes_per_step = model.bytes_per_token();
  r.peak_rss_bytes = peak_rss_bytes();  // before the bandwidth test's buffer
  // A decode step reads every weight once whatever the batch (plus the KV
  // cache): a streaming read of as many bytes bounds it.
  r.read_bandwidth_bytes_per_s = measure_read_bandwidth(pool, r.weight_bytes_per_step);
  r.decode_bound_tokens_per_s =
      static_cast<double>(o.batch) * r.read_bandwidth_bytes_per_s / static_cast<double>(r.weight_bytes_per_step);
  return r;
}

nlohmann::ordered_json bench_report(const std::string& model_arg, const rt::Model& model, const BenchResult& r) {
  nlohmann::ordered_json j = {{"model", model_arg},
                              {"weight_format", model.weight_format()},
                              {"weights", residency_name(model.weights_residency())},
                              {"parameters", model.parameter_count()},
                              {"active_parameters", model.active_parameter_count()},
                              {"prompt", r.prompt},
                              {"gen", r.gen},
                              {"batch", r.batch},
                              {"kv_dtype", r.kv_dtype},
                              {"threads", r.threads},
                              {"device", r.device},
                              {"device_bytes", r.device_bytes},
                              {"simd", r.simd},
                              {"prefill_tokens_per_s", r.prefill_tokens_per_s},
                              {"decode_tokens_per_s", r.decode_tokens_per_s},
                              {"ttft_seconds", r.ttft_seconds},
                              {"kv_bytes_reserved", r.kv_bytes_reserved},
                              {"kv_bytes_used", r.kv_bytes_used},
                              {"kv_bytes_per_token", r.kv_bytes_per_token},
                              {"kv_bytes_per_sequence", r.kv_bytes_per_sequence},
                              {"peak_rss_bytes", r.peak_rss_bytes},
                              {"weight_bytes_per_step", r.weight_bytes_per_step},
                              {"read_bandwidth_bytes_per_s", r.read_bandwidth_bytes_per_s},
                              {"decode_bound_tokens_per_s", r.decode_bound_tokens_per_s},
                              {"decode_fraction_of_bound", r.decode_bound_tokens_per_s > 0
                                                               ? r.decode_tokens_per_s / r.decode_bound_tokens_per_s
                                                               : 0.0}};
  if (r.kv_budget_bytes > 0) j["kv_budget"] = {{"bytes", r.kv_budget_bytes}, {"tokens", r.kv_budget_tokens}};
  return j;
}

}  // namespace qf::eval
