// Fuzz target: an input of `quantforge report` / qf.report(), read both as an
// `eval --json` file and as a quantize output's quantization_report.json.
// A row the parser accepts must hold only what the chart and report.json can
// take: finite numbers in their ranges, a positive token count, names, and a
// report.json that is valid JSON again (no NaN or infinity).
#include <cmath>

#include "eval/report_input.h"
#include "fuzz_util.h"

namespace {

void check_row(const qf::eval::ReportRow& r) {
  const bool ok = std::isfinite(r.ppl) && r.ppl > 0 && std::isfinite(r.kld) && r.kld >= 0 &&
                  std::isfinite(r.baseline_ppl) && r.baseline_ppl > 0 && r.tokens > 0 &&
                  (!r.top1 || (std::isfinite(*r.top1) && *r.top1 >= 0 && *r.top1 <= 1)) && !r.model.empty() &&
                  !r.baseline_model.empty() && !r.text.empty();
  if (!ok) qf::fuzz::fail("parse_report_input accepted a row the chart cannot draw");
  qf::eval::ReportInputs in;
  in.reference = r;
  in.outputs = {r};
  const std::string dumped = qf::eval::report_rows_json(in).dump();
  if (!nlohmann::json::accept(dumped)) qf::fuzz::fail("report.json of an accepted row is not valid JSON");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  using qf::eval::ReportInputKind;
  for (const ReportInputKind kind : {ReportInputKind::EvalJson, ReportInputKind::QuantizeReport})
    qf::fuzz::run([&] { check_row(qf::eval::parse_report_input(text, "input.json", "runs/q", kind)); });
  return 0;
}
