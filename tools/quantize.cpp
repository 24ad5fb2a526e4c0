// quantforge quantize MODEL --recipe R.yaml -o OUT [--calib FILE] [--threads N] [--eval TEXT]
#include <cstdio>

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
  std::string model, recipe, out, calib, eval_text, max_memory;
  int threads = 0;
  bool allow_nonfinite = false;
};

void run_quantize(const QuantizeOpts& o) {
  std::unique_ptr<ThreadPool> holder;
  ThreadPool& pool = pool_for(o.threads, holder);
  const bool quiet = Progress::quiet();
  auto log = [quiet](const std::string& s) {
    if (!quiet) std::fprintf(stderr, "%s\n", s.c_str());
  };
  const uint64_t max_memory = o.max_memory.empty() ? 0 : parse_memory_size(o.max_memory, "--max-memory");
  const QuantizeSummary s = quantize_model({o.model, o.recipe, o.out, o.calib, max_memory, o.allow_nonfinite}, pool, log);
  std::printf("quantized %lld linears in %lld layers with %s (%lld calibration samples, %lld tokens) in %.1f s\n",
              static_cast<long long>(s.linears), static_cast<long long>(s.layers), s.method.c_str(),
              static_cast<long long>(s.samples), static_cast<long long>(s.tokens), s.seconds);
  std::printf("relative output error: mean %.4g, max %.4g\n", s.mean_error, s.max_error);
  std::printf("wrote %s (%s, %.2f MiB); peak RSS %.1f MiB%s\n", o.out.c_str(), s.format.c_str(),
              static_cast<double>(s.output_bytes) / 1048576.0, static_cast<double>(s.peak_rss_bytes) / 1048576.0,
              s.spilled ? ", calibration activations spilled to disk" : "");
  if (!o.eval_text.empty()) {
    auto qm = rt::load_model(o.out);
    auto base = rt::load_model(o.model);
    auto tok = load_tokenizer(qm->source());
    eval::PplOptions p;
    const auto spans = eval::make_spans(*tok, read_text_input(o.eval_text), p, qm->max_context(), o.eval_text);
    const eval::EvalResult r = eval::evaluate(*qm, base.get(), spans, p, pool);
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
  cmd->add_option("--calib", o->calib, "calibration text (.txt) or .jsonl (overrides the recipe's calibration.dataset)");
  cmd->add_option("--eval", o->eval_text, "evaluate the result against MODEL on this text afterwards");
  cmd->add_option("--max-memory", o->max_memory, "memory for the calibration activations (e.g. 512M, 8G); beyond it they spill to disk, zstd-compressed");
  add_threads_option(cmd, o->threads);
  cmd->add_flag("--allow-nonfinite", o->allow_nonfinite, "quantize even when a weight or calibration statistic is NaN or infinite");
  cmd->callback([o] { run_quantize(*o); });
}

}  // namespace qf::cli
