// The mixed stage (calibration/quantize_run.h): a recipe's mixed_precision
// section searched on the calibration data, its choice written into the
// quantizer as one group per scheme; and what --dry-run prints.
#include <algorithm>
#include <cstdio>

#include "calibration/calibration_data.h"
#include "calibration/quantize_run.h"
#include "checkpoint/compressed_tensors.h"
#include "core/error.h"

namespace qf {

void mixed_stage(QuantizeRun& r) {
  if (!r.recipe.mixed_precision) return;
  const MixedPrecisionSpec& mp = *r.recipe.mixed_precision;
  ModifierSpec* quantizer = nullptr;  // the recipe parser allows exactly one with mixed_precision
  for (ModifierSpec& m : r.recipe.modifiers)
    if (!m.is_transform()) quantizer = &m;
  if (!quantizer) throw Error(ErrorKind::Internal, "mixed_precision without a quantizer");
  const std::filesystem::path calib = calibration_path(r);
  if (calib.empty())
    throw Error(ErrorKind::Usage, "mixed_precision measures each Linear's sensitivity on calibration data: give --calib "
                                  "FILE or calibration.dataset in the recipe");
  const std::vector<std::vector<int32_t>> windows = load_calibration(calib, *r.tok, calibration_options(r, mp.probe_samples));
  r.calib_used = std::filesystem::absolute(calib).lexically_normal();
  MixedPrecisionResult res = search_mixed_precision(*r.model, *quantizer, mp, windows, r.pool, r.log);
  quantizer->groups = res.groups;
  check_mixed_groups(*r.model, *quantizer, res.items, res.schemes, res.exact.choice);
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "mixed precision: %zu items, %llu of %llu bytes (%.4f bits per weight), predicted KL %.6g "
                "(lagrangian %.6g) in %.1f s",
                res.items.size(), static_cast<unsigned long long>(res.exact.bytes),
                static_cast<unsigned long long>(res.budget),
                8.0 * static_cast<double>(res.exact.bytes) / static_cast<double>(res.weights), res.exact.cost,
                res.lagrangian.cost, res.seconds);
  r.log(buf);
  r.mixed = std::move(res);
}

std::string dry_run_text(const QuantizeRun& r) {
  if (r.mixed) return r.mixed->table();
  std::string out;
  char buf[512];
  size_t w = 6;
  for (const auto& [name, _] : r.plan.linears) w = std::max(w, name.size());
  for (const VisionLinear& v : r.vision) w = std::max(w, v.module.size());
  uint64_t total = 0;
  for (const auto& [name, p] : r.plan.linears) {
    // The plan's map is ordered by name; shapes come from the model.
    int64_t rows = 0, cols = 0;
    const ModelConfig& cfg = r.model->config();
    for (int64_t li = 0; li < cfg.num_hidden_layers && rows == 0; ++li)
      for (const rt::LayerLinearId& id : rt::layer_linears(cfg, li))
        if ("model.layers." + std::to_string(li) + "." + id.name == name) {
          const rt::Linear& l = *rt::layer_linear(r.model->weights().layers[static_cast<size_t>(li)], id);
          rows = l.out_features(), cols = l.in_features();
        }
    const uint64_t b = compressed_tensors_linear_bytes(p.weights, p.act ? &*p.act : nullptr, rows, cols,
                                                       p.actorder == GptqOptions::ActOrder::Group);
    total += b;
    std::snprintf(buf, sizeof buf, "%-*s  %-36s %12llu\n", static_cast<int>(w), name.c_str(),
                  (p.weights.describe() + (p.act ? " / " + p.act->describe() : std::string())).c_str(),
                  static_cast<unsigned long long>(b));
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "total: %zu Linears, %llu bytes (%s, %s)\n", r.plan.linears.size(),
                static_cast<unsigned long long>(total), r.plan.method.c_str(), r.plan.format->name());
  out += buf;
  if (r.vision.empty()) return out;
  // The vision side the recipe's vision: section quantizes (round to nearest).
  uint64_t vision_total = 0;
  for (const VisionLinear& v : r.vision) {
    const PlannedLinear& p = v.plan;
    const uint64_t b = compressed_tensors_linear_bytes(p.weights, p.act ? &*p.act : nullptr, v.rows, v.cols, false);
    vision_total += b;
    std::snprintf(buf, sizeof buf, "%-*s  %-36s %12llu%s\n", static_cast<int>(w), v.module.c_str(),
                  (p.weights.describe() + (p.act ? " / " + p.act->describe() : std::string())).c_str(),
                  static_cast<unsigned long long>(b), v.note.empty() ? "" : "  (per channel: group size does not divide)");
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "vision: %zu Linears, %llu bytes (rtn)\n", r.vision.size(),
                static_cast<unsigned long long>(vision_total));
  return out + buf;
}

}  // namespace qf
