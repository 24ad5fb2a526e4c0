// quantforge imatrix MODEL --text FILE -o imatrix.gguf [--ctx 512] [--chunks N] [--process-output]
#include <cstdio>

#include "calibration/imatrix_collect.h"
#include "commands.h"
#include "flags.h"
#include "core/error.h"
#include "core/progress.h"

namespace qf::cli {
namespace {

struct ImatrixOpts {
  std::string model, text, out;
  int64_t ctx = 512, chunks = 0;
  bool process_output = false, force = false, allow_nonfinite = false;
  int threads = 0;
  std::string device = "cpu";
  LoraFlags lora;
};

void run_imatrix(const ImatrixOpts& o) {
  const device::Kind kind = resolve_device(o.device, "imatrix", o.threads);
  std::unique_ptr<ThreadPool> holder;
  ThreadPool& pool = pool_for(o.threads, holder);
  ImatrixOptions io;
  io.ctx = o.ctx;
  io.max_chunks = o.chunks;
  io.process_output = o.process_output;
  io.device = kind;
  io.lora = o.lora.load();
  Progress progress("imatrix", 0, "chunks");
  const Imatrix m = write_imatrix_from_text(o.model, o.text, o.out, "-o", io, o.force, o.allow_nonfinite, pool,
                                            [&](int64_t done, int64_t) { progress.set(static_cast<uint64_t>(done)); });
  progress.finish();
  if (!Progress::quiet())
    std::fprintf(stderr, "wrote %s: %zu tensors, %u chunks of %u tokens\n", o.out.c_str(), m.entries.size(),
                 m.chunk_count, m.chunk_size);
}

}  // namespace

void register_imatrix(CLI::App& app) {
  auto o = std::make_shared<ImatrixOpts>();
  CLI::App* cmd = app.add_subcommand("imatrix", "Importance matrix (llama.cpp's GGUF imatrix layout) from a calibration text");
  cmd->add_option("model", o->model, "model folder, Hugging Face cache id or .gguf file")->required();
  cmd->add_option("--text", o->text, "calibration text (UTF-8)")->required();
  cmd->add_option("-o,--output", o->out, "output imatrix .gguf (--force to replace an existing file)")->required();
  cmd->add_option("--ctx", o->ctx, "tokens per chunk (default 512)")->check(int_at_least(2));
  cmd->add_option("--chunks", o->chunks, "use at most N chunks (default: all)")->check(int_at_least(1));
  cmd->add_flag("--process-output", o->process_output, "also collect output.weight");
  cmd->add_flag("--force", o->force, "replace an existing output file (never an input of this run)");
  cmd->add_flag("--allow-nonfinite", o->allow_nonfinite, "collect even when a weight is NaN or infinite (non-finite statistics are still refused: llama-quantize rejects them)");
  add_lora_options(cmd, o->lora, true);
  add_threads_option(cmd, o->threads);
  add_device_option(cmd, o->device);
  cmd->callback([o] { run_imatrix(*o); });
}

}  // namespace qf::cli
