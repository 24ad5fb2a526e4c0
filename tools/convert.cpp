// quantforge convert INPUT --to hf [--tokenizer FILE] -o OUT
//   INPUT: a llama2.c checkpoint (.bin) with its tokenizer (--tokenizer).
#include <filesystem>

#include "commands.h"
#include "core/error.h"
#include "core/progress.h"
#include "formats/llama2c/llama2c_model.h"

namespace qf::cli {
namespace {

struct ConvertOpts {
  std::string input, to, tokenizer, out;
};

void run_convert(const ConvertOpts& o) {
  namespace fs = std::filesystem;
  if (o.to != "hf")
    throw unsupported("--to " + o.to, "this build converts to 'hf' (Hugging Face folder) only");
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
  CLI::App* cmd = app.add_subcommand("convert", "Convert a model to another format (llama2.c checkpoint -> Hugging Face folder)");
  cmd->add_option("input", o->input, "the model to convert (a llama2.c .bin checkpoint)")->required();
  cmd->add_option("--to", o->to, "target format: hf")->required();
  cmd->add_option("--tokenizer", o->tokenizer, "llama2.c tokenizer file (tok512.bin, tokenizer.bin)");
  cmd->add_option("-o,--output", o->out, "output folder (must not exist, or be empty)")->required();
  cmd->callback([o] { run_convert(*o); });
}

}  // namespace qf::cli
