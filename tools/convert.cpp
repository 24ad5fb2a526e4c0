// quantforge convert INPUT --to hf --tokenizer FILE -o OUT      (llama2.c checkpoint -> Hugging Face folder)
// quantforge convert MODEL --to gguf --type TYPE [--imatrix F] [--output-tensor-type T]
//                   [--token-embedding-type T] -o OUT.gguf   (Hugging Face -> GGUF)
#include <filesystem>

#include "commands.h"
#include "flags.h"
#include "core/io.h"
#include "core/error.h"
#include "core/progress.h"
#include "convert/hf_to_gguf.h"
#include "formats/hf/resolve.h"
#include "formats/llama2c/llama2c_model.h"

namespace qf::cli {
namespace {

struct ConvertOpts {
  std::string input, to, tokenizer, out, type = "F16", imatrix, output_type, token_embd_type;
  int threads = 0;
  bool force = false, allow_nonfinite = false;
  // Whether the type flags were given at all: an empty value is an error, not "no override".
  bool output_type_given = false, token_embd_type_given = false;
};

void run_gguf(const ConvertOpts& o) {
  std::unique_ptr<ThreadPool> holder;
  ThreadPool& pool = pool_for(o.threads, holder);
  if (!o.tokenizer.empty()) throw Error(ErrorKind::Usage, "--tokenizer applies to llama2.c checkpoints; a Hugging Face folder brings its own");
  GgufConvertOptions g;
  g.preset = o.type;
  g.imatrix = o.imatrix;
  g.allow_nonfinite = o.allow_nonfinite;
  // Flags first: a bad value is a usage error whatever the model.
  if (o.output_type_given) g.overrides.output = gguf_mix::parse_tensor_type(o.output_type, "--output-tensor-type");
  if (o.token_embd_type_given)
    g.overrides.token_embd = gguf_mix::parse_tensor_type(o.token_embd_type, "--token-embedding-type");
  const ResolvedModel m = resolve_model(o.input);
  check_output_file(o.out, {m.dir, o.imatrix}, o.force, false, "-o");
  const bool quiet = Progress::quiet();
  g.note = [quiet](const std::string& s) {
    if (!quiet) std::fprintf(stderr, "note: %s\n", s.c_str());
  };
  const GgufConvertResult r = convert_hf_to_gguf(m.dir, o.out, g, pool);
  if (!quiet)
    std::fprintf(stderr, "wrote %s: %.2f MiB (%.2f bits per weight) from %.2f MiB in %.2f s (%.1f MB/s of input)\n",
                 r.path.c_str(), static_cast<double>(r.output_bytes) / 1048576.0,
                 r.parameters ? 8.0 * static_cast<double>(r.output_bytes) / static_cast<double>(r.parameters) : 0.0,
                 static_cast<double>(r.input_bytes) / 1048576.0, r.seconds,
                 static_cast<double>(r.input_bytes) / 1e6 / std::max(r.seconds, 1e-9));
}

void run_convert(const ConvertOpts& o) {
  namespace fs = std::filesystem;
  if (o.to == "gguf") return run_gguf(o);
  if (!o.imatrix.empty()) throw Error(ErrorKind::Usage, "--imatrix applies to --to gguf");
  if (o.allow_nonfinite) throw Error(ErrorKind::Usage, "--allow-nonfinite applies to --to gguf");
  if (o.output_type_given || o.token_embd_type_given)
    throw Error(ErrorKind::Usage, "--output-tensor-type and --token-embedding-type apply to --to gguf");
  if (o.to != "hf")
    throw Error(ErrorKind::Usage, "--to must be 'hf' (llama2.c checkpoint -> Hugging Face folder) or 'gguf', got '" + o.to + "'");
  if (fs::is_directory(o.input))
    throw unsupported(o.input, "is already a folder; --to hf converts llama2.c checkpoints (.bin)");
  if (o.tokenizer.empty())
    throw Error(ErrorKind::Usage, "converting a llama2.c checkpoint needs --tokenizer (its tokenizer .bin, e.g. tok512.bin)");
  convert_llama2c_to_hf(o.input, o.tokenizer, o.out);
  if (!Progress::quiet()) std::fprintf(stderr, "wrote %s\n", o.out.c_str());
}

}  // namespace

void register_convert(CLI::App& app) {
  auto o = std::make_shared<ConvertOpts>();
  CLI::App* cmd = app.add_subcommand("convert", "Convert a model: Hugging Face -> GGUF (with k-quant presets), llama2.c -> Hugging Face");
  cmd->add_option("input", o->input, "the model to convert: a Hugging Face folder or cache id (--to gguf), a llama2.c .bin (--to hf)")->required();
  cmd->add_option("--to", o->to, "target format: gguf or hf")->required();
  cmd->add_option("--type", o->type, "gguf: F32 F16 BF16 Q8_0 Q6_K Q5_K_S Q5_K_M Q4_K_S Q4_K_M Q3_K_S Q3_K_M Q3_K_L Q2_K Q4_0 Q4_1 Q5_0 Q5_1 (default F16)");
  cmd->add_option("--imatrix", o->imatrix, "gguf: importance matrix (.gguf or llama.cpp .dat) weighting the quantization");
  CLI::Option* output_type = cmd->add_option(
      "--output-tensor-type", o->output_type,
      "gguf: type of output.weight (f16, q8_0, q6_K, ...) instead of the preset's, as llama-quantize's option");
  CLI::Option* token_embd_type = cmd->add_option(
      "--token-embedding-type", o->token_embd_type,
      "gguf: type of token_embd.weight instead of the preset's, as llama-quantize's option");
  add_threads_option(cmd, o->threads);
  cmd->add_option("--tokenizer", o->tokenizer, "llama2.c tokenizer file (tok512.bin, tokenizer.bin)");
  cmd->add_option("-o,--output", o->out, "output: a .gguf file (--force to replace one), or a folder for --to hf (must not exist, or be empty)")->required();
  cmd->add_flag("--force", o->force, "gguf: replace an existing output file (never an input of this run)");
  cmd->add_flag("--allow-nonfinite", o->allow_nonfinite, "gguf: convert even when a weight is NaN or infinite");
  cmd->callback([o, output_type, token_embd_type] {
    o->output_type_given = output_type->count() > 0;
    o->token_embd_type_given = token_embd_type->count() > 0;
    run_convert(*o);
  });
}

}  // namespace qf::cli
