// quantforge eval MODEL --text FILE [--ppl-mode chunks|windows|lines] [--ctx N]
//                 [--baseline MODEL] [--max-ppl-delta D] [--max-ppl-ratio R] [--max-kld K] [--json OUT]
// A failed gate exits with code 10 after printing the report.
#include <cstdio>
#include <optional>

#include "commands.h"
#include "flags.h"
#include "core/error.h"
#include "formats/hf/resolve.h"
#include "core/io.h"
#include "core/progress.h"
#include "core/text_input.h"
#include "eval/eval_run.h"
#include "eval/perplexity.h"
#include "runtime/cpu/kernels.h"

namespace qf::cli {
namespace {

struct EvalOpts {
  std::string model, text, baseline, mode = "chunks", json_out, baseline_kv = "f16", kv_calibration;
  KvFlags kv;
  int64_t ctx = 0, max_chunks = 0, bucket = 512;
  bool bos_per_line = false, keep_tail = false;
  std::optional<double> max_delta, max_ratio, max_kld;
  int threads = 0;
  std::string device = "cpu";
  LoraFlags lora, baseline_lora;
};

std::string table(const EvalOpts& o, const eval::EvalResult& r) {
  char buf[512];
  std::string s;
  std::snprintf(buf, sizeof buf, "model      %s\n", o.model.c_str());
  s += buf;
  std::snprintf(buf, sizeof buf, "text       %s (%s, ctx %lld, %lld spans, %lld tokens scored)\n", o.text.c_str(),
                r.mode.c_str(), static_cast<long long>(r.ctx), static_cast<long long>(r.spans),
                static_cast<long long>(r.tokens_scored));
  s += buf;
  std::snprintf(buf, sizeof buf, "perplexity %.4f +/- %.4f (mean NLL %.6f)\n", r.ppl, r.ppl_stderr, r.nll_mean);
  s += buf;
  std::snprintf(buf, sizeof buf, "KV cache   %s, %llu bytes per token\n", o.kv.format().name().c_str(),
                static_cast<unsigned long long>(r.kv_bytes_per_token));
  s += buf;
  if (r.has_baseline) {
    std::snprintf(buf, sizeof buf, "baseline   %s: perplexity %.4f\n", o.baseline.c_str(), r.base_ppl);
    s += buf;
    std::snprintf(buf, sizeof buf, "delta      %+.4f (ratio %.5f)\n", r.ppl_delta, r.ppl_ratio);
    s += buf;
    std::snprintf(buf, sizeof buf, "KLD        mean %.6f  p99 %.6f  max %.6f\n", r.kld_mean, r.kld_p99, r.kld_max);
    s += buf;
    std::snprintf(buf, sizeof buf, "top-1      %.2f%% agreement\n", 100.0 * r.top1_agreement);
    s += buf;
    if (r.by_position.size() > 1)
      for (const auto& b : r.by_position) {
        std::snprintf(buf, sizeof buf, "  pos %5lld-%-5lld KLD mean %.6f  p99 %.6f  (%lld tokens)\n",
                      static_cast<long long>(b.from), static_cast<long long>(b.to - 1), b.kld_mean, b.kld_p99,
                      static_cast<long long>(b.tokens));
        s += buf;
      }
  }
  std::snprintf(buf, sizeof buf, "time       %.2f s (%.1f tokens/s)\n", r.seconds,
                r.seconds > 0 ? static_cast<double>(r.tokens_processed) / r.seconds : 0.0);
  s += buf;
  if (r.device != "cpu") {
    std::snprintf(buf, sizeof buf, "device     %s (decoders: up to %.1f MiB of device memory)\n", r.device.c_str(),
                  static_cast<double>(r.device_bytes) / 1048576.0);
    s += buf;
  }
  return s;
}

void run_eval(const EvalOpts& o) {
  resolve_device(o.device, "eval", o.threads);  // a bad word or a missing GPU before any work
  std::unique_ptr<ThreadPool> holder;
  ThreadPool& pool = pool_for(o.threads, holder);
  eval::EvalRequest req;
  req.model = o.model, req.text = o.text, req.baseline = o.baseline, req.device = o.device;
  req.kv = o.kv.both, req.kv_k = o.kv.k, req.kv_v = o.kv.v, req.kv_rotation = o.kv.rotation;
  req.kv_f16_edge = o.kv.f16_edge;
  req.baseline_kv = o.baseline_kv, req.kv_calibration = o.kv_calibration;
  req.lora = o.lora.load(), req.baseline_lora = o.baseline_lora.load();
  req.gate = eval::Gate{o.max_delta, o.max_ratio, o.max_kld};
  eval::check_gate_bounds(req.gate, eval::GateBoundNames::flags());  // the flags' checks apply the same rule
  if (req.gate.any() && o.baseline.empty())
    throw Error(ErrorKind::Usage, "--max-ppl-delta, --max-ppl-ratio and --max-kld need --baseline");
  req.ppl.mode = eval::parse_ppl_mode(o.mode);
  req.ppl.ctx = o.ctx;
  req.ppl.bos_per_line = o.bos_per_line;
  req.ppl.keep_tail = o.keep_tail;
  req.ppl.max_spans = o.max_chunks;
  req.ppl.position_bucket = o.bucket;
  o.kv.format();  // a bad KV-cache flag is a usage error before any work
  rt::parse_kv_format(o.baseline_kv);
  if (!o.json_out.empty())
    check_output_file(o.json_out, {model_input_path(o.model), model_input_path(o.baseline), o.text}, true, true, "--json");
  LazyProgress progress("eval", "spans");
  const eval::EvalRun run = eval::run_eval(req, pool, std::ref(progress));
  progress.finish();
  const eval::EvalResult& r = run.result;
  const std::string t = table(o, r);
  std::fwrite(t.data(), 1, t.size(), stdout);
  const std::vector<std::string> problems = eval::measurement_problems(r);
  if (!problems.empty()) {
    std::string msg;
    for (const auto& p : problems) msg += (msg.empty() ? "" : "; ") + p;
    std::printf("INVALID    %s\n", msg.c_str());
    if (!req.gate.any()) std::fprintf(stderr, "quantforge: warning: the measurement is not valid: %s\n", msg.c_str());
  }
  if (!o.json_out.empty()) write_output_file(o.json_out, run.report.dump(2) + "\n");
  if (!run.failures.empty()) {
    std::string msg;
    for (const auto& f : run.failures) msg += (msg.empty() ? "" : "; ") + f;
    throw Error(ErrorKind::GateFailed, msg);
  }
  if (req.gate.any()) std::printf("gate       passed\n");
}

}  // namespace

void register_eval(CLI::App& app) {
  auto o = std::make_shared<EvalOpts>();
  CLI::App* cmd = app.add_subcommand("eval", "Perplexity of a model on a text, optionally against a baseline, with CI gates");
  cmd->add_option("model", o->model, "model folder or Hugging Face cache id")->required();
  cmd->add_option("--text", o->text, "UTF-8 text file to score")->required();
  cmd->add_option("--ppl-mode", o->mode, "chunks (llama.cpp, default), windows (GPTQ/AWQ papers) or lines");
  cmd->add_option("--ctx", o->ctx, "context per chunk/window (default: 512 for chunks and lines, 2048 for windows)")
      ->check(int_at_least(2));
  cmd->add_option("--max-chunks", o->max_chunks, "score only the first N chunks/windows/lines (default: all)")
      ->check(int_at_least(1));
  cmd->add_flag("--bos-per-line", o->bos_per_line, "windows: tokenize each non-empty line with BOS and join the tokens");
  cmd->add_flag("--keep-tail", o->keep_tail, "windows: also score the last, shorter window");
  cmd->add_option("--baseline", o->baseline, "a reference model (same vocabulary) run on the same tokens");
  cmd->add_option("--max-ppl-delta", o->max_delta, "gate: fail (exit 10) if ppl - baseline ppl exceeds D")
      ->check(gate_bound(eval::GateBound::PplDelta));
  cmd->add_option("--max-ppl-ratio", o->max_ratio, "gate: fail (exit 10) if ppl / baseline ppl exceeds R")
      ->check(gate_bound(eval::GateBound::PplRatio));
  cmd->add_option("--max-kld", o->max_kld, "gate: fail (exit 10) if the mean KL divergence exceeds K")
      ->check(gate_bound(eval::GateBound::Kld));
  add_kv_options(cmd, o->kv);
  add_lora_options(cmd, o->lora, true);
  add_lora_options(cmd, o->baseline_lora, true, "baseline-");
  cmd->add_option("--kld-bucket", o->bucket, "with --baseline: KL by position in buckets of N tokens (default 512)")
      ->check(int_at_least(1));
  cmd->add_option("--baseline-kv-dtype", o->baseline_kv, "the baseline's KV-cache type (default f16)");
  cmd->add_option("--kv-calibration", o->kv_calibration,
                  "text an NVFP4 cache's global scales are calibrated on (default: the first 4 spans of --text)");
  cmd->add_option("--json", o->json_out, "write the report as JSON to this file (a pipe or /dev/stdout is written through)");
  add_threads_option(cmd, o->threads);
  add_device_option(cmd, o->device);
  cmd->callback([o] { run_eval(*o); });
}

}  // namespace qf::cli
