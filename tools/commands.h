// Each subcommand lives in its own tools/<name>.cpp and registers itself here.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "core/thread_pool.h"

namespace qf::cli {

// Adds the subcommand to `app`; its callback runs the command and may throw qf::Error.
void register_inspect(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_convert(CLI::App& app);
void register_generate(CLI::App& app);
void register_eval(CLI::App& app);
void register_bench(CLI::App& app);
void register_imatrix(CLI::App& app);
void register_quantize(CLI::App& app);
void register_report(CLI::App& app);

// The pool for a command's --threads value: 0 gives the global pool (QF_THREADS
// or every core), N > 0 a pool of N threads kept in `holder`.
ThreadPool& pool_for(int threads, std::unique_ptr<ThreadPool>& holder);

// The file or folder a model argument reads (a .gguf or .bin file, or the
// resolved Hugging Face folder), so that outputs can be checked against it;
// empty when the argument is empty or cannot be resolved (loading the model
// reports that).
std::filesystem::path model_input(const std::string& model);

}  // namespace qf::cli
