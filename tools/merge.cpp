// quantforge merge MODEL --lora DIR[:SCALE] [--lora ...] -o OUT
// The Hugging Face model with its LoRA adapters merged, in the base's dtype.
#include <cstdio>

#include "commands.h"
#include "flags.h"
#include "checkpoint/lora_merge.h"
#include "core/error.h"
#include "core/io.h"
#include "core/progress.h"
#include "formats/hf/resolve.h"

namespace qf::cli {
namespace {

struct MergeOpts {
  std::string model, out;
  LoraFlags lora;
};

void run_merge(const MergeOpts& o) {
  const std::vector<LoraSpec> specs = o.lora.specs();
  if (specs.empty()) throw Error(ErrorKind::Usage, "merge needs at least one --lora DIR[:SCALE]");
  const ResolvedModel m = resolve_model(o.model);
  for (const LoraSpec& s : specs)
    if (is_within(o.out, s.path) || is_within(s.path, o.out) || is_within(o.out, m.dir) || is_within(m.dir, o.out))
      throw Error(ErrorKind::Usage, "-o " + o.out + " must be a new folder outside the model and the adapters");
  const MergeResult r = write_merged_model(m.dir, specs, o.out);
  if (!Progress::quiet())
    std::fprintf(stderr, "wrote %s: %lld tensors (%lld changed by %zu adapter%s), %.2f MiB\n", r.path.c_str(),
                 static_cast<long long>(r.tensors), static_cast<long long>(r.merged), specs.size(),
                 specs.size() == 1 ? "" : "s", static_cast<double>(r.bytes) / 1048576.0);
}

}  // namespace

void register_merge(CLI::App& app) {
  auto o = std::make_shared<MergeOpts>();
  CLI::App* cmd = app.add_subcommand("merge", "Merge LoRA adapters into a Hugging Face model (f32 arithmetic, one rounding to its dtype)");
  cmd->add_option("model", o->model, "the base: a Hugging Face folder or cache id (f32/f16/bf16)")->required();
  add_lora_options(cmd, o->lora, false);
  cmd->add_option("-o,--output", o->out, "output folder (must not exist, or be empty)")->required();
  cmd->callback([o] { run_merge(*o); });
}

}  // namespace qf::cli
