#include "calibration/quantize_model.h"

#include <chrono>

#include "calibration/quantize_run.h"
#include "checkpoint/manifest.h"
#include "core/io.h"

namespace qf {
namespace {

// Runs one stage and records its wall time under `name`.
template <typename Fn>
void timed(QuantizeRun& r, const char* name, Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn(r);
  r.stage_seconds.emplace_back(name, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace

QuantizeSummary quantize_model(const QuantizeJob& job, ThreadPool& pool, const std::function<void(const std::string&)>& log) {
  const auto t0 = std::chrono::steady_clock::now();
  QuantizeRun r(job, pool, log);
  timed(r, "load", load_stage);
  if (r.recipe.mixed_precision) timed(r, "mixed", mixed_stage);
  timed(r, "plan", plan_stage);
  if (job.dry_run) {
    r.sum.dry_run = dry_run_text(r);
    r.sum.method = r.plan.method;
    r.sum.format = r.plan.format->name();
    r.sum.report = nlohmann::ordered_json::object();
    if (r.mixed) r.sum.report["mixed_precision"] = r.mixed->json(*r.recipe.mixed_precision);
    return std::move(r.sum);
  }
  timed(r, "data", data_stage);
  timed(r, "layers", layers_stage);
  timed(r, "export", export_stage);
  r.sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  report_stage(r);
  if (!job.eval_text.empty()) timed(r, "evaluate", evaluate_stage);
  // What the phases achieved, next to what the machine offers.
  r.peak = measure_peak_flops(pool);
  r.sum.report["timing"] = timing_json(r);
  r.sum.timing_line = timing_line(r.sum.report["timing"]);
  const std::filesystem::path out = r.stage->path();
  write_file_atomic(out / kQuantizationReportFile, r.sum.report.dump(2) + "\n");
  write_manifest(out);
  for (const auto& e : std::filesystem::directory_iterator(out)) r.sum.output_bytes += e.is_regular_file() ? e.file_size() : 0;
  if (job.before_commit) job.before_commit(r.sum);
  r.stage->commit();
  r.state->remove();
  return std::move(r.sum);
}

double stored_bits_per_weight(const QuantizedTensor& q) {
  const QuantScheme& s = q.scheme;
  const double n = static_cast<double>(q.rows) * static_cast<double>(q.cols);
  if (n <= 0) return 0;
  const double params = static_cast<double>(q.scales.size());
  if (s.is_bnb4()) {  // codes, absmax (f32, or 8-bit codes + f32 per 256 + the offset)
    const double absmax = s.double_quant ? params * 8 + static_cast<double>(q.nested_absmax.size()) * 32 + 32 : params * 32;
    return (n * 4 + absmax) / n;
  }
  double bits = n * s.bits + params * 8.0 * static_cast<double>(dtype_size(s.scale_dtype));
  if (!s.is_float() && !s.symmetric) bits += params * s.bits;  // packed zero points
  bits += static_cast<double>(q.g_idx.size()) * 32;
  if (s.is_nvfp4()) bits += 32;  // the global scale
  return bits / n;
}

}  // namespace qf
