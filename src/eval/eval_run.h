// One evaluation as the CLI's `eval` and the Python module's `evaluate` run
// it: load the model (and baseline), tokenize the text, score it, check the
// gate, and build the JSON report (`eval --json`'s keys).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/thread_pool.h"
#include "eval/perplexity.h"

namespace qf::eval {

struct EvalRequest {
  std::string model;     // folder, cache id or .gguf
  std::string text;      // path of the UTF-8 text
  std::string baseline;  // optional reference model (same vocabulary)
  std::string kv = "f16";
  std::string device = "cpu";  // cpu, host, cuda or auto (device::resolve)
  PplOptions ppl;        // kv_dtype is set from `kv`
  Gate gate;
};

struct EvalRun {
  EvalResult result;
  std::vector<std::string> failures;  // of the gate (empty: passed or no gate)
  nlohmann::ordered_json report;      // eval --json
};

// Usage error for gate bounds without a baseline; InvalidInput when the
// baseline's tokenizer differs. progress(done, total) counts spans.
EvalRun run_eval(const EvalRequest& req, ThreadPool& pool, const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace qf::eval
