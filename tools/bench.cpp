// quantforge bench MODEL [-p 512] [-n 128] [--batch B] [--kv-dtype T] [--kv-budget 8GiB] [--reps R] [--json OUT]
#include <cstdio>

#include "commands.h"
#include "flags.h"
#include "core/error.h"
#include "formats/hf/resolve.h"
#include "core/io.h"
#include "core/weight_residency.h"
#include "calibration/activation_store.h"
#include "eval/bench.h"

namespace qf::cli {
namespace {

struct BenchOpts {
  std::string model, json_out, device = "cpu", kv_budget;
  KvFlags kv;
  int64_t p = 512, n = 128, batch = 1;
  int reps = 1, threads = 0;
  LoraFlags lora;
};

double mib(uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

void run_bench(const BenchOpts& o) {
  const device::Kind kind = resolve_device(o.device, "bench", o.threads);
  std::unique_ptr<ThreadPool> holder;
  ThreadPool& pool = pool_for(o.threads, holder);
  if (!o.json_out.empty()) check_output_file(o.json_out, {model_input_path(o.model)}, true, true, "--json");
  std::unique_ptr<rt::Model> model = rt::load_model(o.model, kind, o.lora.load());
  eval::BenchOptions b;
  b.prompt = o.p, b.gen = o.n, b.batch = o.batch, b.reps = o.reps, b.kv_dtype = o.kv.format();
  if (!o.kv_budget.empty()) b.kv_budget = parse_memory_size(o.kv_budget, "--kv-budget");
  b.device = kind;
  eval::BenchResult r = eval::run_bench(*model, b, pool);
  if (model->config().is_moe())
    std::printf("model            %s (%s, %.2f M parameters, %.2f M active per token: %lld of %lld experts)\n",
                o.model.c_str(), model->weight_format().c_str(), static_cast<double>(model->parameter_count()) / 1e6,
                static_cast<double>(model->active_parameter_count()) / 1e6,
                static_cast<long long>(model->config().num_experts_per_tok), static_cast<long long>(model->config().num_experts));
  else
    std::printf("model            %s (%s, %.2f M parameters)\n", o.model.c_str(), model->weight_format().c_str(),
                static_cast<double>(model->parameter_count()) / 1e6);
  std::printf("weights          %s\n", model->weights_residency() == FileResidency::InMemory
                                            ? "read into memory (QF_WEIGHTS=map keeps them mapped from the file)"
                                            : "mapped from the file");
  std::printf("setup            p %lld, n %lld, batch %lld, kv %s, %d threads, %s\n", static_cast<long long>(r.prompt),
              static_cast<long long>(r.gen), static_cast<long long>(r.batch), r.kv_dtype.c_str(), r.threads,
              r.simd.c_str());
  std::printf("prefill          %.1f tokens/s (time to first token %.1f ms)\n", r.prefill_tokens_per_s,
              r.ttft_seconds * 1e3);
  std::printf("decode           %.1f tokens/s\n", r.decode_tokens_per_s);
  std::printf("bandwidth bound  %.1f tokens/s (%.2f MiB of weights per step, read bandwidth %.1f GB/s); decode at %.0f%%\n",
              r.decode_bound_tokens_per_s, mib(r.weight_bytes_per_step), r.read_bandwidth_bytes_per_s / 1e9,
              r.decode_bound_tokens_per_s > 0 ? 100.0 * r.decode_tokens_per_s / r.decode_bound_tokens_per_s : 0.0);
  std::printf("KV cache         %.2f MiB reserved, %.2f MiB used (%llu bytes per token", mib(r.kv_bytes_reserved),
              mib(r.kv_bytes_used), static_cast<unsigned long long>(r.kv_bytes_per_token));
  if (r.kv_bytes_per_sequence > 0)
    std::printf(", plus %.2f MiB of f16 windows per sequence", mib(r.kv_bytes_per_sequence));
  std::printf(")\n");
  if (r.kv_budget_bytes > 0)
    std::printf("KV budget        %.2f GiB holds %lld tokens (one sequence; %.0f tokens per GiB)\n",
                static_cast<double>(r.kv_budget_bytes) / (1024.0 * 1024.0 * 1024.0), static_cast<long long>(r.kv_budget_tokens),
                1024.0 * 1024.0 * 1024.0 / static_cast<double>(r.kv_bytes_per_token));
  std::printf("peak RSS         %.1f MiB\n", mib(r.peak_rss_bytes));
  if (r.device != "cpu")
    std::printf("device           %s (decoder: up to %.1f MiB of device memory; weights and bandwidth above are the device's)\n",
                r.device.c_str(), mib(r.device_bytes));
  if (!o.json_out.empty()) {
    write_output_file(o.json_out, eval::bench_report(o.model, *model, r).dump(2) + "\n");
  }
}

}  // namespace

void register_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOpts>();
  CLI::App* cmd = app.add_subcommand("bench", "Prefill/decode throughput, KV-cache memory and the bandwidth bound");
  cmd->add_option("model", o->model, "model folder or Hugging Face cache id")->required();
  cmd->add_option("-p", o->p, "prompt tokens per sequence (default 512)")->check(int_range(1, 1 << 24));
  cmd->add_option("-n", o->n, "generated tokens per sequence (default 128; 0: prefill only)")->check(int_range(0, 1 << 24));
  cmd->add_option("--batch", o->batch, "sequences decoded together (default 1)")->check(int_range(1, 4096));
  add_kv_options(cmd, o->kv);
  add_lora_options(cmd, o->lora, true);
  cmd->add_option("--kv-budget", o->kv_budget, "report how many tokens a KV cache of this size holds (e.g. 8GiB)");
  cmd->add_option("--reps", o->reps, "repetitions, best reported (default 1)")->check(int_range(1, 1000));
  cmd->add_option("--json", o->json_out, "write the results as JSON to this file (a pipe or /dev/stdout is written through)");
  add_threads_option(cmd, o->threads);
  add_device_option(cmd, o->device);
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace qf::cli
