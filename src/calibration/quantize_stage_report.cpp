// The report and evaluate stages (calibration/quantize_run.h):
// quantization_report.json, its timing section, and the optional evaluation
// of the staged output.
#include <cstdio>

#include "calibration/quantize_run.h"
#include "checkpoint/lora_merge.h"
#include "core/version.h"
#include "eval/bench.h"
#include "eval/eval_run.h"

namespace qf {
namespace {

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 10 ? "%.2f s" : "%.1f s", s);
  return buf;
}

}  // namespace

nlohmann::ordered_json timing_json(const QuantizeRun& r) {
  nlohmann::ordered_json stages = nlohmann::ordered_json::object();
  for (const auto& [name, s] : r.stage_seconds) stages[name] = s;
  const PipelineTimes& t = r.times;
  nlohmann::ordered_json phases = {{"search", phase_json(t.search)},     {"forward", phase_json(t.forward)},
                                   {"hessian", phase_json(t.hessian)},   {"solve", phase_json(t.solve)},
                                   {"propagate", phase_json(t.propagate)}, {"restore", phase_json(t.restore)},
                                   {"layer_export_seconds", t.export_seconds}};
  nlohmann::ordered_json peak = nlohmann::ordered_json::object();
  for (const PeakFlops& p : r.peak) peak[simd_level_name(p.level)][p.kind] = p.gflops;
  return {{"simd_level", simd_level_name(simd_level())},
          {"threads", r.pool.size()},
          {"stages", stages},
          {"phases", phases},
          {"peak_gflops", peak}};
}

std::string timing_line(const nlohmann::ordered_json& timing) {
  std::string s = "time:";
  bool first = true;
  for (const auto& [name, v] : timing["stages"].items()) {
    if (!v.is_number()) continue;
    s += std::string(first ? " " : ", ") + name + " " + seconds_text(v.get<double>());
    first = false;
  }
  std::string ph;
  for (const char* name : {"search", "forward", "hessian", "solve", "propagate", "restore"}) {
    const auto& p = timing["phases"][name];
    const double sec = p["seconds"].get<double>();
    if (sec <= 0) continue;
    ph += std::string(ph.empty() ? "" : ", ") + name + " " + seconds_text(sec);
    if (p["gflops"].is_number()) {
      char buf[32];
      std::snprintf(buf, sizeof buf, " at %.0f GFLOP/s", p["gflops"].get<double>());
      ph += buf;
    }
  }
  if (!ph.empty()) s += " (layers: " + ph + ")";
  const std::string level = timing["simd_level"].get<std::string>();
  const std::string at = level == "amx" ? "avx512" : level;
  if (timing["peak_gflops"].contains(at)) {
    std::string pk;
    for (const auto& [kind, v] : timing["peak_gflops"][at].items()) {
      char buf[48];
      std::snprintf(buf, sizeof buf, "%s%s %.0f", pk.empty() ? "" : ", ", kind.c_str(), v.get<double>());
      pk += buf;
    }
    s += "; machine peak at " + at + ": " + pk + " GFLOP/s";
  }
  return s;
}

void report_stage(QuantizeRun& r) {
  namespace fs = std::filesystem;
  const QuantizeJob& job = r.job;
  QuantizeSummary& sum = r.sum;
  nlohmann::ordered_json report;
  report["tool"] = {{"name", "quantforge"}, {"version", version()}};
  report["invocation"] = job.invocation;
  report["model"] = {{"argument", job.model}, {"path", fs::absolute(r.rm.dir).lexically_normal().string()}};
  if (!job.loras.empty()) report["model"]["lora"] = lora_provenance(job.loras);
  report["recipe"] = {{"path", fs::absolute(job.recipe).lexically_normal().string()}, {"text", r.recipe_copy}};
  report["format"] = sum.format;
  report["method"] = sum.method;
  report["device"] = device::kind_name(job.device);
  nlohmann::ordered_json cal = nullptr;
  if (!r.calib_used.empty())
    cal = {{"dataset", r.dataset},
           {"text_field", r.recipe.calibration.text_field},
           {"num_samples", r.recipe.calibration.num_samples},
           {"seq_len", r.recipe.calibration.seq_len},
           {"seed", r.recipe.calibration.seed},
           {"samples", sum.samples},
           {"image_samples", r.image_samples},
           {"tokens", sum.tokens}};
  report["calibration"] = cal;
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const QuantizedLayerRecord& l : sum.per_layer)
    layers.push_back({{"layer", l.layer}, {"linears", l.linears}, {"seconds", l.seconds}, {"mean_error", l.mean_error},
                      {"max_error", l.max_error}});
  report["layers"] = layers;
  report["linears"] = r.linear_reports;
  report["vision"] = r.vision_reports;  // null unless the recipe's vision: section quantized the vision side
  double weights = 0, bits = 0;
  for (const auto& l : r.linear_reports) {
    const double n = l["shape"][0].get<double>() * l["shape"][1].get<double>();
    weights += n;
    bits += l["bits_per_weight"].get<double>() * n;
  }
  report["totals"] = {{"linears", sum.linears},
                      {"layers", sum.layers},
                      {"quantized_weights", weights},
                      {"bits_per_quantized_weight", weights > 0 ? bits / weights : 0.0},
                      {"mean_error", sum.mean_error},
                      {"max_error", sum.max_error},
                      {"spilled", sum.spilled},
                      {"resumed_layers", sum.resumed_layers}};
  report["totals"]["seconds"] = sum.seconds;  // the evaluation's time is its own
  sum.peak_rss_bytes = eval::peak_rss_bytes();
  report["totals"]["peak_rss_bytes"] = sum.peak_rss_bytes;
  report["memory"] = r.memory;
  report["memory"]["measured_peak_rss_bytes"] = sum.peak_rss_bytes;
  report["mixed_precision"] = r.mixed ? r.mixed->json(*r.recipe.mixed_precision) : nlohmann::ordered_json(nullptr);
  report["evaluation"] = nullptr;
  sum.report = std::move(report);
}

void evaluate_stage(QuantizeRun& r) {
  const QuantizeJob& job = r.job;
  eval::EvalRequest req;
  req.model = r.stage->path().string();
  req.text = job.eval_text.string();
  req.baseline = job.model;
  req.baseline_lora = rt::LoraLoad{job.loras, rt::LoraLoad::Mode::Merge};
  req.ppl.max_spans = job.eval_max_chunks;
  req.device = device::kind_name(job.device);  // where the layers ran
  eval::EvalRun run = eval::run_eval(req, r.pool, job.eval_progress);
  run.report["model"] = job.out.string();  // where it will be, not the staging folder
  r.sum.report["evaluation"] = run.report;
  r.sum.evaluation = run.result;
}

}  // namespace qf
