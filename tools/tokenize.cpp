// quantforge tokenize MODEL (--text TEXT | --file F) [--no-bos] [--json]
#include <cstdio>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "core/io.h"
#include "formats/tokenizer/tokenizer.h"

namespace qf::cli {
namespace {

struct TokenizeOpts {
  std::string model, text, file;
  bool no_bos = false, json = false;
};

// Pieces may hold partial UTF-8 (llama2.c files): replace rather than throw.
std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

void run_tokenize(const TokenizeOpts& o, bool have_text, bool have_file) {
  if (have_text == have_file) throw Error(ErrorKind::Usage, "tokenize: give exactly one of --text and --file");
  const std::string text = have_file ? read_text_file(o.file) : o.text;
  std::unique_ptr<Tokenizer> tok = load_tokenizer(o.model);
  std::vector<int32_t> ids = tok->encode(text, !o.no_bos && tok->add_bos_by_default());
  nlohmann::json pieces = nlohmann::json::array();
  for (int32_t id : ids) pieces.push_back(tok->piece(id));
  std::string out;
  if (o.json) {
    out = dump({{"ids", ids}, {"pieces", pieces}}) + "\n";
  } else {
    out = "ids:";
    for (int32_t id : ids) out += " " + std::to_string(id);
    out += "\npieces:";
    for (const auto& p : pieces) out += " " + dump(p);
    out += "\n";
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto opts = std::make_shared<TokenizeOpts>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Encode text with a model's tokenizer and print the ids and pieces");
  cmd->add_option("model", opts->model, "model folder (tokenizer.json / tokenizer.model), .gguf file, or llama2.c tokenizer .bin")
      ->required();
  CLI::Option* text = cmd->add_option("--text", opts->text, "the text to encode");
  CLI::Option* file = cmd->add_option("--file", opts->file, "encode the contents of this file");
  text->excludes(file);
  cmd->add_flag("--no-bos", opts->no_bos, "do not prepend BOS (by default BOS is added when the vocabulary asks for it)");
  cmd->add_flag("--json", opts->json, "print one JSON object {\"ids\": [...], \"pieces\": [...]}");
  cmd->callback([opts, text, file] { run_tokenize(*opts, text->count() > 0, file->count() > 0); });
}

}  // namespace qf::cli
