// One evaluation as the CLI's `eval` and the Python module's `evaluate` run
// it: load the model (and baseline), tokenize the text, score it, check the
// gate, and build the JSON report (`eval --json`'s keys).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/thread_pool.h"
#include "eval/perplexity.h"
#include "runtime/kv_format.h"

namespace qf::eval {

struct EvalRequest {
  std::string model;     // folder, cache id or .gguf
  std::string text;      // path of the UTF-8 text
  std::string baseline;  // optional reference model (same vocabulary)
  // The KV cache (rt::parse_kv_format's words): both sides or a preset, each
  // side, the rotation; and the baseline's cache (f16 unless told).
  std::string kv = "f16", kv_k, kv_v, kv_rotation = "none", baseline_kv = "f16";
  int64_t kv_f16_edge = -1;
  rt::KvFormat kv_format() const { return rt::parse_kv_format(kv, kv_k, kv_v, kv_rotation, kv_f16_edge); }
  std::string kv_calibration;  // text an NVFP4 cache is calibrated on ("": the evaluated text's first spans)
  std::string device = "cpu";  // cpu, host, cuda or auto (device::resolve)
  rt::LoraLoad lora, baseline_lora;  // adapters loaded with the model and with the baseline
  PplOptions ppl;        // kv_dtype is set from `kv`
  Gate gate;
};

struct EvalRun {
  EvalResult result;
  std::vector<std::string> failures;  // of the gate (empty: passed or no gate)
  nlohmann::ordered_json report;      // eval --json
};

// Usage error for gate bounds without a baseline; InvalidInput when the
// baseline's tokenizer differs. Both models' weights are checked for NaN and
// infinities (a measurement problem, see measurement_problems). progress(done,
// total) counts spans.
EvalRun run_eval(const EvalRequest& req, ThreadPool& pool, const std::function<void(int64_t, int64_t)>& progress = {});

// The JSON report of a measurement (eval --json's keys; what batch records
// and quantization_report.json's "evaluation" hold). A number that is NaN or
// infinite is written as null, since JSON has neither; "valid" is false and
// "problems" says which one.
nlohmann::ordered_json eval_report(const EvalRequest& req, const EvalResult& r, const std::vector<std::string>& failures);

// A number of such a report, read back: the value at keys ("ppl"; "kld",
// "mean"), or nullopt when it is missing, null (not finite when measured) or
// not a number. Readers use this instead of get<double>(), which throws on
// null.
std::optional<double> report_number(const nlohmann::ordered_json& report, std::initializer_list<const char*> keys);

}  // namespace qf::eval
