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
void register_batch(CLI::App& app);
void register_kv_sweep(CLI::App& app);
void register_merge(CLI::App& app);

// The pool for a command's --threads value: 0 gives the global pool (QF_THREADS
// or every core), N > 0 a pool of N threads kept in `holder`.
ThreadPool& pool_for(int threads, std::unique_ptr<ThreadPool>& holder);

}  // namespace qf::cli
