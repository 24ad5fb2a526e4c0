// quantforge quantize MODEL --recipe R.yaml -o OUT [--calib FILE] [--threads N] [--device D] [--eval TEXT] [--json] [--resume] [--dry-run]
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "calibration/activation_store.h"
#include "calibration/quantize_model.h"
#include "commands.h"
#include "flags.h"
#include "core/error.h"
#include "core/io.h"
#include "core/progress.h"
#include "core/text_input.h"
#include "eval/perplexity.h"
#include "formats/tokenizer/tokenizer.h"
#include "runtime/model.h"

namespace qf::cli {
namespace {

struct QuantizeOpts {
  std::string model, recipe, out, calib, eval_text, max_memory, device = "cpu";
  int threads = 0;
  int64_t eval_chunks = 0;
  bool allow_nonfinite = false, json = false, resume = false, dry_run = false;
  LoraFlags lora;
};

// The command as given, for the report (paths as typed).
std::string invocation(const QuantizeOpts& o) {
  std::string s = "quantforge quantize " + o.model + " --recipe " + o.recipe + " -o " + o.out;
  for (const std::string& a : o.lora.adapters) s += " --lora " + a;
  if (!o.calib.empty()) s += " --calib " + o.calib;
  if (!o.eval_text.empty()) s += " --eval " + o.eval_text;
  if (o.eval_chunks) s += " --eval-chunks " + std::to_string(o.eval_chunks);
  if (!o.max_memory.empty()) s += " --max-memory " + o.max_memory;
  if (o.threads) s += " --threads " + std::to_string(o.threads);
  if (o.device != "cpu") s += " --device " + o.device;
  if (o.allow_nonfinite) s += " --allow-nonfinite";
  if (o.resume) s += " --resume";
  if (o.dry_run) s += " --dry-run";
  return s;
}

void print_summary(const QuantizeOpts& o, const QuantizeSummary& s);

void run_quantize(const QuantizeOpts& o) {
  const device::Kind dev = resolve_device(o.device, "quantize", o.threads);
  std::unique_ptr<ThreadPool> holder;
  ThreadPool& pool = pool_for(o.threads, holder);
  const bool quiet = Progress::quiet();
  auto log = [quiet](const std::string& s) {
    if (!quiet) std::fprintf(stderr, "%s\n", s.c_str());
  };
  QuantizeJob job;
  job.model = o.model;
  job.recipe = o.recipe;
  job.out = o.out;
  job.calib = o.calib;
  job.loras = o.lora.specs();
  job.max_memory_bytes = o.max_memory.empty() ? 0 : parse_memory_size(o.max_memory, "--max-memory");
  job.allow_nonfinite = o.allow_nonfinite;
  job.resume = o.resume;
  job.invocation = invocation(o);
  job.eval_text = o.eval_text;
  job.eval_max_chunks = o.eval_chunks;
  job.device = dev;
  job.dry_run = o.dry_run;
  // What the command prints is written and flushed while the output is
  // still staged: when stdout cannot take it (a full disk), the run fails
  // with nothing committed rather than exiting 5 with the output in place.
  job.before_commit = [&o](const QuantizeSummary& s) {
    print_summary(o, s);
    if (std::fflush(stdout) != 0 || std::ferror(stdout))
      throw io_error("standard output", std::string("write failed (") + std::strerror(errno) + "); " + o.out +
                                            " was not written");
  };
  const QuantizeSummary s = quantize_model(job, pool, log);
  if (o.dry_run) {
    // The plan only: nothing was calibrated or written.
    const std::string text = o.json ? s.report.dump(2) + "\n" : s.dry_run;
    std::fwrite(text.data(), 1, text.size(), stdout);
    if (std::fflush(stdout) != 0 || std::ferror(stdout))
      throw io_error("standard output", std::string("write failed (") + std::strerror(errno) + ")");
  }
}

void print_summary(const QuantizeOpts& o, const QuantizeSummary& s) {
  if (o.json) {
    const std::string text = s.report.dump(2) + "\n";
    std::fwrite(text.data(), 1, text.size(), stdout);
  } else {
    std::printf("quantized %lld linears in %lld layers with %s (%lld calibration samples, %lld tokens) in %.1f s\n",
                static_cast<long long>(s.linears), static_cast<long long>(s.layers), s.method.c_str(),
                static_cast<long long>(s.samples), static_cast<long long>(s.tokens), s.seconds);
    std::printf("relative output error: mean %.4g, max %.4g\n", s.mean_error, s.max_error);
    std::printf("%s\n", s.timing_line.c_str());
    std::printf("wrote %s (%s, %.2f MiB); peak RSS %.1f MiB%s\n", o.out.c_str(), s.format.c_str(),
                static_cast<double>(s.output_bytes) / 1048576.0, static_cast<double>(s.peak_rss_bytes) / 1048576.0,
                s.spilled ? ", calibration activations spilled to disk" : "");
  }
  if (s.evaluation) {
    const eval::EvalResult& r = *s.evaluation;
    if (!o.json)
      std::printf("eval %s: perplexity %.4f (baseline %.4f, delta %+.4f), mean KLD %.6f, top-1 %.2f%%\n",
                  o.eval_text.c_str(), r.ppl, r.base_ppl, r.ppl_delta, r.kld_mean, 100.0 * r.top1_agreement);
    for (const std::string& p : eval::measurement_problems(r))
      std::fprintf(stderr, "quantforge: warning: the evaluation is not valid: %s\n", p.c_str());
  }
}

}  // namespace

void register_quantize(CLI::App& app) {
  auto o = std::make_shared<QuantizeOpts>();
  CLI::App* cmd = app.add_subcommand("quantize", "Quantize a model with a YAML recipe (RTN, GPTQ, AWQ, SmoothQuant; int, FP8, NVFP4) to compressed-tensors, GPTQ, AWQ or modelopt");
  cmd->add_option("model", o->model, "model folder or Hugging Face cache id (f16/bf16/f32)")->required();
  cmd->add_option("--recipe", o->recipe, "YAML recipe (llm-compressor syntax; see docs/recipes.md)")->required();
  cmd->add_option("-o,--output", o->out, "output folder (must not exist, or be empty)")->required();
  add_lora_options(cmd, o->lora, false);
  cmd->add_option("--calib", o->calib, "calibration text (.txt) or .jsonl (overrides the recipe's calibration.dataset)");
  cmd->add_option("--eval", o->eval_text, "evaluate the result against MODEL on this text afterwards");
  cmd->add_option("--eval-chunks", o->eval_chunks, "--eval: score only the first N chunks (default: all)")
      ->check(int_at_least(1));
  cmd->add_option("--max-memory", o->max_memory, "memory for the calibration activations (e.g. 512M, 8G); beyond it they spill to disk, zstd-compressed");
  add_threads_option(cmd, o->threads);
  add_device_option(cmd, o->device);
  cmd->add_flag("--json", o->json, "print quantization_report.json (written into the output) instead of the summary");
  cmd->add_flag("--resume", o->resume, "continue an interrupted run to the same output from its last finished layer (same inputs; byte-identical result)");
  cmd->add_flag("--dry-run", o->dry_run, "print the plan (with mixed_precision: the searched allocation, its bytes and predicted KL) and write nothing");
  cmd->add_flag("--allow-nonfinite", o->allow_nonfinite, "quantize even when a weight or calibration statistic is NaN or infinite");
  cmd->callback([o] { run_quantize(*o); });
}

}  // namespace qf::cli
