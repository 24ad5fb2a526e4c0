// Each subcommand lives in its own tools/<name>.cpp and registers itself here.
#pragma once

#include <CLI/CLI.hpp>

namespace qf::cli {

// Adds the subcommand to `app`; its callback runs the command and may throw qf::Error.
void register_inspect(CLI::App& app);
void register_tokenize(CLI::App& app);

}  // namespace qf::cli
