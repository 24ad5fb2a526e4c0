// quantforge inspect MODEL [--json]
#include <cstdio>

#include "commands.h"
#include "inspect/gguf_inspect.h"
#include "inspect/hf_inspect.h"

namespace qf::cli {

void register_inspect(CLI::App& app) {
  struct Opts {
    std::string model, revision = "main";
    bool json = false;
  };
  auto opts = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("inspect", "Show a model's architecture, dimensions, tensors and files");
  cmd->add_option("model", opts->model, "model folder, Hugging Face cache folder (models--ORG--NAME), cached ORG/NAME, or a .gguf file")
      ->required();
  cmd->add_option("--revision", opts->revision, "ref or commit inside a Hugging Face cache folder")
      ->capture_default_str();
  cmd->add_flag("--json", opts->json, "print one JSON object instead of the table");
  cmd->callback([opts] {
    const std::filesystem::path p(opts->model);
    const bool gguf = std::filesystem::is_regular_file(p) && p.extension() == ".gguf";
    nlohmann::json info = gguf ? inspect_gguf(p) : inspect_model(opts->model, opts->revision);
    std::string text = opts->json ? info.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"
                       : gguf     ? format_gguf_report(info)
                                  : format_inspect_report(info);
    std::fwrite(text.data(), 1, text.size(), stdout);
  });
}

}  // namespace qf::cli
