// quantforge kv-sweep MODEL --text FILE [--ctx 2048] [--ppl-mode windows] [--max-chunks N]
//                    [--max-kld K] [--types T,...] [--decode-tokens N] [--json OUT]
// Every KV-cache format on one model: bytes per token, tokens per GiB, KL
// divergence against the f16 cache (mean, p99), perplexity and decode speed;
// with --max-kld, the smallest format within the bound and the vLLM and
// llama.cpp flags that select it.
#include <cstdio>
#include <sstream>

#include "commands.h"
#include "flags.h"
#include "core/error.h"
#include "core/io.h"
#include "core/progress.h"
#include "core/text_input.h"
#include "eval/kv_sweep.h"
#include "formats/hf/resolve.h"
#include "formats/tokenizer/tokenizer.h"

namespace qf::cli {
namespace {

struct SweepOpts {
  std::string model, text, mode = "windows", json_out, types;
  int64_t ctx = 0, max_chunks = 4, decode_tokens = 32;
  std::optional<double> max_kld;
  int threads = 0;
};

void run_sweep(const SweepOpts& o) {
  std::unique_ptr<ThreadPool> holder;
  ThreadPool& pool = pool_for(o.threads, holder);
  eval::KvSweepOptions so;
  so.ppl.mode = eval::parse_ppl_mode(o.mode);
  so.ppl.ctx = o.ctx;
  so.ppl.max_spans = o.max_chunks;
  so.max_kld = o.max_kld;
  so.decode_tokens = o.decode_tokens;
  if (!o.types.empty()) {  // names as the table prints them; "k=A,v=B" keeps its comma
    std::vector<std::string> parts;
    std::stringstream ss(o.types);
    for (std::string t; std::getline(ss, t, ',');) {
      if (t.rfind("v=", 0) == 0 && !parts.empty() && parts.back().rfind("k=", 0) == 0) parts.back() += "," + t;
      else if (!t.empty()) parts.push_back(t);
    }
    for (const std::string& t : parts) so.formats.push_back(rt::parse_kv_format_name(t));
  }
  if (!o.json_out.empty()) check_output_file(o.json_out, {model_input_path(o.model), o.text}, true, true, "--json");
  const std::string text = read_text_input(o.text);
  std::unique_ptr<rt::Model> model = rt::load_model(o.model);
  std::unique_ptr<Tokenizer> tok = load_tokenizer(model->source());
  if (so.ppl.ctx == 0) so.ppl.ctx = model->max_context() > 0 ? std::min<int64_t>(model->max_context(), 2048) : 2048;
  const std::vector<eval::Span> spans = eval::make_spans(*tok, text, so.ppl, model->max_context(), o.text);
  LazyProgress progress("kv-sweep", "formats");
  const eval::KvSweepResult r = eval::kv_sweep(*model, spans, so, pool, std::ref(progress));
  progress.finish();
  const std::string t = eval::kv_sweep_table(r, so);
  std::fwrite(t.data(), 1, t.size(), stdout);
  for (const std::string& p : r.problems) std::fprintf(stderr, "quantforge: warning: not valid: %s\n", p.c_str());
  if (!o.json_out.empty()) write_output_file(o.json_out, eval::kv_sweep_report(o.model, o.text, so, r).dump(2) + "\n");
}

}  // namespace

void register_kv_sweep(CLI::App& app) {
  auto o = std::make_shared<SweepOpts>();
  CLI::App* cmd = app.add_subcommand(
      "kv-sweep", "Every KV-cache format on a model: bytes per token, KL against f16, perplexity, decode speed");
  cmd->add_option("model", o->model, "model folder, Hugging Face cache id or .gguf")->required();
  cmd->add_option("--text", o->text, "UTF-8 text file to score")->required();
  cmd->add_option("--ppl-mode", o->mode, "windows (default), chunks or lines");
  cmd->add_option("--ctx", o->ctx, "context per window (default: the model's, at most 2048)")->check(int_at_least(4));
  cmd->add_option("--max-chunks", o->max_chunks, "windows scored per format (default 4)")->check(int_at_least(1));
  cmd->add_option("--max-kld", o->max_kld, "name the smallest format whose mean KL divergence is within K")
      ->check(finite_at_least(0, false));
  cmd->add_option("--types", o->types,
                  "comma-separated formats as the table names them (default: every one): f16, f8, int8, q8_0, q5_1, "
                  "q5_0, q4_1, q4_0, iq4_nl (each +hadamard too), k=q8_0,v=q4_0, turboquant_k8v4, turboquant_4bit_nc, "
                  "turboquant_k3v4_nc, turboquant_3bit_nc (+edge0: every layer compressed), nvfp4, kivi4, kivi2");
  cmd->add_option("--decode-tokens", o->decode_tokens,
                  "decode timing: tokens decoded after a prompt filling the context (default 32; 0: none)")
      ->check(int_range(0, 1 << 20));
  cmd->add_option("--json", o->json_out, "write the table as JSON to this file (quantforge report charts it)");
  add_threads_option(cmd, o->threads);
  cmd->callback([o] { run_sweep(*o); });
}

}  // namespace qf::cli
