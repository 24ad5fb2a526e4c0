// The inputs of `quantforge report` and qf.report(): quantize output folders
// (their quantization_report.json, with the evaluation `quantize --eval`
// recorded) and `eval --baseline REF --json` files, read and validated into
// the rows the chart draws. The CLI and the Python module both call this one
// parser, so a file is accepted or refused the same way by both; the drawing
// (matplotlib, python/quantforge/chart.py) only ever sees validated rows.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace qf::eval {

enum class ReportInputKind {
  EvalJson,         // eval --json (or evaluate()'s dict saved as JSON)
  QuantizeReport,   // a quantize output's quantization_report.json
};

// One evaluated output, as read from its file. Every number is finite.
struct ReportRow {
  std::string name;   // the output's folder or model file name
  std::string label;  // quantize: "METHOD SCHEME"; eval JSON: the model's name
  std::string model;  // the evaluated model's file or folder (sized for the chart)
  double ppl = 0;
  double kld = 0;                // mean KL divergence against the baseline
  std::optional<double> top1;    // top-1 agreement with the baseline, 0..1
  std::string baseline_model;
  double baseline_ppl = 0;
  std::string text;              // the evaluation text's path as recorded
  int64_t tokens = 0;            // tokens scored
  uint64_t bytes = 0;            // the model's size; set by load_report_inputs
  // The chart's series: "size-budget mix" for a GGUF file with the plan
  // `convert --target-bpw` writes beside it (MODEL.mix.json), "" otherwise.
  std::string series;
};

// Parses and validates one input's JSON text. `source` is what the user named
// (the quantize output folder or the eval JSON file): it names the row of a
// quantize output and is the size path of that output. Strict: the JSON must
// be an object; numbers finite and in range; strings, booleans and objects
// where those are expected; the evaluation valid and compared with a
// baseline. Throws qf::Error InvalidInput naming `where` (the file read) and
// the key, on one line.
ReportRow parse_report_input(std::string_view json_text, const std::string& where, const std::string& source,
                             ReportInputKind kind);

struct ReportInputs {
  // "model" (sizes are the models' bytes) or "kv_cache" (one `kv-sweep
  // --json` file: a row per cache format, sized by its KV bytes per token,
  // the reference the f16 cache).
  std::string unit = "model";
  ReportRow reference;               // the baseline, drawn as one more point (kld 0, top-1 1)
  std::vector<ReportRow> outputs;    // sorted by size
  std::vector<std::filesystem::path> read;  // every file and folder read: what the output must not touch
};

// Reads every path (a quantize output folder, its quantization_report.json,
// or an eval JSON file), sizes the models, and checks that all were evaluated
// against the same baseline, on the same text and the same number of tokens:
// perplexities over different tokens are not comparable. NotFound for a
// missing path or model, InvalidInput for a bad or inconsistent input, Usage
// for no paths.
ReportInputs load_report_inputs(const std::vector<std::string>& paths);

// The names the report writes into its output folder.
const std::vector<std::string>& report_output_files();

// Checks the output folder before anything is written (Io errors, one line,
// naming `flag`): it must not be one of `inputs` nor lie inside an input
// folder (a quantize output, a model folder), must be a folder if it exists,
// and none of its report files may be an input (same device and inode) or, unless
// `force`, exist already.
void check_report_output(const std::filesystem::path& out, const std::vector<std::filesystem::path>& inputs,
                         bool force, const std::string& flag);

// {"reference": row, "outputs": [row...]}: what report.json holds.
nlohmann::ordered_json report_rows_json(const ReportInputs& inputs);

}  // namespace qf::eval
