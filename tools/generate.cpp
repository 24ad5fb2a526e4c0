// quantforge generate MODEL [--prompt TEXT] [-n N] [--temperature T] [--top-p P] [--seed S]
// stdout: the prompt followed by the continuation and a newline, as llama2.c
// prints it; statistics go to stderr.
#include <cstdio>

#include "commands.h"
#include "flags.h"
#include "core/error.h"
#include "core/progress.h"
#include "formats/hf/resolve.h"
#include "formats/tokenizer/tokenizer.h"
#include "runtime/generate.h"

namespace qf::cli {
namespace {

struct GenerateOpts {
  std::string model, prompt;
  KvFlags kv;
  int64_t n = 128;
  float temperature = 0.f, top_p = 1.f;
  uint64_t seed = 0;
  int threads = 0;
  LoraFlags lora;
};

void run_generate(const GenerateOpts& o) {
  std::unique_ptr<ThreadPool> holder;
  ThreadPool& pool = pool_for(o.threads, holder);
  std::unique_ptr<rt::Model> model = rt::load_model(o.model, device::Kind::Cpu, o.lora.load());
  std::unique_ptr<Tokenizer> tok = load_tokenizer(model->source());
  rt::GenerateOptions g;
  g.max_new_tokens = o.n;
  g.sampler = {o.temperature, o.top_p, o.seed};
  g.kv_dtype = o.kv.format();
  rt::GenerateResult r = rt::generate(*model, *tok, o.prompt, g, pool, [](const std::string& s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  });
  std::fputs("\n", stdout);
  std::fflush(stdout);
  if (!Progress::quiet()) {
    const double pre = r.prefill_seconds > 0 ? static_cast<double>(r.prompt.size()) / r.prefill_seconds : 0;
    const double dec = r.decode_seconds > 0 ? static_cast<double>(r.generated.size()) / r.decode_seconds : 0;
    std::fprintf(stderr, "prompt %zu tokens (%.1f tok/s), generated %zu tokens (%.1f tok/s)%s\n", r.prompt.size(), pre,
                 r.generated.size(), dec, r.stopped ? ", stopped at end of sequence" : "");
  }
}

}  // namespace

void register_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOpts>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text with the built-in runtime");
  cmd->add_option("model", o->model, "model folder, Hugging Face cache id (ORG/NAME)")->required();
  cmd->add_option("--prompt", o->prompt, "prompt text (empty: start from BOS alone)");
  cmd->add_option("-n", o->n, "new tokens to generate (stops early at end of sequence)")->check(int_range(0, 1 << 24));
  cmd->add_option("--temperature", o->temperature, "sampling temperature; 0 is greedy (default)")
      ->check(finite_at_least(0, false));
  cmd->add_option("--top-p", o->top_p, "nucleus sampling threshold in (0, 1] (default 1)")->check(finite_at_least(0, true, 1, true));
  cmd->add_option("--seed", o->seed, "random seed for sampling (default 0)");
  add_kv_options(cmd, o->kv);
  add_lora_options(cmd, o->lora, true);
  add_threads_option(cmd, o->threads);
  cmd->callback([o] { run_generate(*o); });
}

}  // namespace qf::cli
