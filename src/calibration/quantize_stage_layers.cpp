// The layers stage (calibration/quantize_run.h): the sequential pipeline
// with the plan's quantizer, the smoothing searches before each layer's
// capture pass, each finished layer handed to the export format and saved
// for --resume.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "calibration/quantize_run.h"
#include "formats/hf/model_tensors.h"
#include "calibration/sequential.h"
#include "calibration/smoothing.h"
#include "core/error.h"
#include "core/sha256.h"
#include "core/version.h"
#include "checkpoint/manifest.h"
#include "quantizers/device_quantizers.h"

namespace qf {
namespace {

// Calibration statistics of a Linear: non-finite activations (an overflow in
// an earlier layer, a NaN the weights check could not see) make every number
// derived from them meaningless. A NaN or Inf input reaches the Hessian's
// diagonal (x_i * x_i), so the diagonal is enough.
void check_finite_statistics(const LinearToQuantize& in) {
  if (!std::isfinite(in.act_min) || !std::isfinite(in.act_max))
    throw invalid_input(in.name, "the calibration activations entering this Linear are not finite (range " +
                                     std::to_string(in.act_min) + " .. " + std::to_string(in.act_max) + ")");
  if (!in.hessian) return;
  const std::vector<double>& h = in.hessian->matrix();
  const int64_t n = in.hessian->cols();
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(h[static_cast<size_t>(i * n + i)]))
      throw invalid_input(in.name, "the calibration statistics (Hessian) are not finite at input column " + std::to_string(i) +
                                       ": the activations overflowed or are NaN");
}

// Everything the output depends on, for the resume state: the tool, the
// model's files (sizes and modification times), the recipe, the calibration
// data (hashed) and the flags that change what is written.
nlohmann::ordered_json resume_fingerprint(const QuantizeRun& r) {
  nlohmann::ordered_json fp;
  fp["tool"] = version();
  fp["model_files"] = model_file_stats(r.rm.dir);
  if (!r.job.loras.empty()) {  // each adapter's files and scale, in order
    nlohmann::ordered_json adapters = nlohmann::ordered_json::array();
    for (const LoraSpec& s : r.job.loras)
      adapters.push_back({{"files", model_file_stats(s.path)}, {"scale", s.scale}});
    fp["lora"] = adapters;
  }
  fp["recipe"] = r.recipe.text;
  // By content: the Python module's list of samples lives in a new temporary file each call.
  fp["calibration"] = r.calib_used.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(sha256_file_hex(r.calib_used));
  fp["allow_nonfinite"] = r.job.allow_nonfinite;
  // Image records: the image files the rows came from may change on their own.
  if (r.image_samples > 0) {
    std::string rows;
    for (const rt::MultimodalInputs& m : r.multimodal)
      if (m.embeds) rows.append(reinterpret_cast<const char*>(m.embeds->data()), m.embeds->size() * sizeof(float));
    fp["image_rows"] = sha256_hex(rows);
  }
  return fp;
}

// The plan's quantizer for one Linear (GPTQ with its Hessian, else
// round-to-nearest in the planned scheme), with its input quantizer.
std::optional<QuantizedLinearResult> quantize_linear(QuantizeRun& r, const LinearToQuantize& in) {
  const QuantizePlan& plan = r.plan;
  auto it = plan.linears.find(in.name);
  if (it == plan.linears.end()) return std::nullopt;
  const PlannedLinear& p = it->second;
  if (!r.job.allow_nonfinite) check_finite_statistics(in);
  QuantizedLinearResult out;
  out.name = in.name;
  out.note = in.note;
  out.expert_tokens = in.expert_tokens;
  const bool gptq = plan.quantizer == QuantMethod::Gptq;
  if (gptq && in.hessian) {
    GptqOptions o = plan.gptq;
    o.dampening_frac *= in.dampening_scale;
    o.actorder = p.actorder;
    o.observer = p.observer;
    o.mse = p.mse;
    o.pool = &r.pool;
    o.factor_cache = in.hessian->factor_cache();  // q/k/v and gate/up share their Hessian's factor
    GptqResult g = gptq_quantize_on(r.job.device, in.weight->data(), in.rows, in.cols,
                                    gptq_hessian(*in.hessian, in.cols, in.name), p.weights, o, in.name);
    out.q = std::move(g.q);
    out.flops = g.flops;
    if (!g.fallback.empty()) out.note += (out.note.empty() ? "" : "; ") + g.fallback;
  } else {
    // NVFP4: one global scale for the whole fused set (q/k/v, gate/up).
    out.q = round_to_nearest(in.weight->data(), in.rows, in.cols, p, in.fused_weight_amax, r.job.device);
    // GPTQ without a Hessian: an expert no calibration token reached, in the same scheme.
    if (gptq) out.note += "; quantized with round-to-nearest instead of GPTQ";
  }
  if (p.act) {
    out.act = calibrate_activation(*p.act, in.act_min, in.act_max, in.name);
    // Static input scales are stored in the model dtype (compressed-tensors'
    // input_scale); the runtime and every exporter use the rounded value.
    if (out.act->scale > 0) out.act->scale = round_scale(out.act->scale, plan_scale_dtype(r.cfg));
  }
  return out;
}

// SmoothQuant, then AWQ, on layer li before its capture pass.
void smooth_layer(QuantizeRun& r, int64_t li, const std::vector<std::vector<int32_t>>& s,
                  const std::function<std::vector<float>(size_t)>& input) {
  const QuantizePlan& plan = r.plan;
  LayerCalib lc{&s, input, r.image_samples > 0 ? &r.multimodal : nullptr};
  if (plan.smoothquant) {
    SmoothQuantOptions o = *plan.smoothquant;
    o.device = r.job.device;
    const TrialLinearFn trial = [&](const std::string& name, const float* w, int64_t rows, int64_t cols,
                                    const std::vector<float>& bias) -> std::shared_ptr<rt::Linear> {
      return plan_trial_linear(plan, name, w, rows, cols, bias);
    };
    for (const auto& line : smoothquant_layer(*r.model, li, lc, o, trial, r.pool).lines) r.log(line);
  }
  if (plan.awq) {
    AwqOptions o = *plan.awq;
    o.device = r.job.device;
    o.moe_calibrate_all_experts = r.recipe.calibration.moe_calibrate_all_experts;
    const FakeQuantFn fq = [&](const std::string& name, const float* w, int64_t rows, int64_t cols) {
      auto it = plan.awq_linears.find(name);
      if (it == plan.awq_linears.end()) return std::vector<float>();
      return round_to_nearest(w, rows, cols, it->second, -1, r.job.device).dequantize();
    };
    for (const auto& line : awq_layer(*r.model, li, lc, fq, o, r.pool).lines) r.log(line);
  }
}

// A finished (or restored) layer: its Linears to the writer, its records
// to the summary and the report, one log line.
void export_layer(QuantizeRun& r, int64_t li, std::vector<QuantizedLinearResult>& done, double secs, bool restored) {
  const CheckpointFormat& format = *r.plan.format;
  QuantizeSummary& sum = r.sum;
  double worst = 0;
  for (auto& d : done) {
    const ActQuantParams* act = d.act ? &*d.act : nullptr;
    format.add_linear(*r.writer, d.name, d.q, act);
    r.written.insert(d.name + ".weight");
    ++sum.linears;
    r.err_sum += d.error;
    worst = std::max(worst, d.error);
    sum.max_error = std::max(sum.max_error, d.error);
    if (!d.note.empty()) r.log("note: " + d.note);
  }
  QuantizedLayerRecord rec;
  rec.layer = li, rec.linears = static_cast<int64_t>(done.size()), rec.seconds = secs, rec.max_error = worst;
  for (auto& d : done) rec.mean_error += d.error;
  if (!done.empty()) rec.mean_error /= static_cast<double>(done.size());
  sum.per_layer.push_back(rec);
  for (const auto& d : done) {
    const PlannedLinear& p = r.plan.linears.at(d.name);
    r.linear_reports.push_back({{"name", d.name},
                                {"layer", li},
                                {"method", r.plan.method},
                                {"shape", {d.q.rows, d.q.cols}},
                                {"weights", d.q.scheme.describe()},
                                {"activations", d.act ? nlohmann::ordered_json(d.act->scheme.describe()) : nlohmann::ordered_json()},
                                {"observer", p.observer == RangeObserver::Mse ? "mse" : "minmax"},
                                {"bits_per_weight", stored_bits_per_weight(d.q)},
                                {"error", d.error},
                                {"seconds", d.seconds}});
    if (d.expert_tokens >= 0) r.linear_reports.back()["expert_calibration_tokens"] = d.expert_tokens;
    if (!d.note.empty()) r.linear_reports.back()["note"] = d.note;
  }
  char line[256];
  std::snprintf(line, sizeof line, "layer %lld/%lld: %zu linears in %.2f s, relative error mean %.3g, max %.3g",
                static_cast<long long>(li + 1), static_cast<long long>(r.cfg.num_hidden_layers), done.size(), secs,
                rec.mean_error, worst);
  r.log(std::string(line) + (restored ? " (restored)" : ""));
  ++sum.layers;
  if (r.job.on_layer) r.job.on_layer(sum.layers, r.cfg.num_hidden_layers);
}

}  // namespace

void layers_stage(QuantizeRun& r) {
  const QuantizeJob& job = r.job;
  r.stage = std::make_unique<StagingDir>(job.out);
  r.writer = std::make_unique<SafetensorsWriter>(r.stage->path(), "model", r.recipe.export_.max_shard_bytes);
  // The output keeps the source's spelling of a vision-language model's parts.
  r.writer->set_naming(hf_tensor_naming(r.cfg, Checkpoint::open(r.rm.dir).names()));

  SequentialOptions so;
  so.device = job.device;
  so.device_reserve_bytes = r.device_bytes;
  so.hessian_weighted_error = r.plan.quantizer == QuantMethod::Gptq;
  so.max_memory_bytes = job.max_memory_bytes;
  so.spill_beside = r.stage->final_path();
  so.observe_ranges = r.plan.needs_activation_ranges;
  so.moe_calibrate_all_experts = r.recipe.calibration.moe_calibrate_all_experts;
  so.log = r.log;
  so.fused_weight_amax = r.plan.fused_nvfp4;
  so.times = &r.times;
  so.release_done_layers = true;  // one layer in memory at a time
  so.bf16 = r.recipe.calibration.bf16;
  if (r.plan.export_config.kv_cache) so.kv_amax = &r.kv_amax;
  if (r.plan.smoothquant || r.plan.awq)
    so.transform = [&](int64_t li, const std::vector<std::vector<int32_t>>& s,
                       const std::function<std::vector<float>(size_t)>& input) { smooth_layer(r, li, s, input); };

  // Each finished layer is saved beside the output until it is committed, so
  // that an interrupted run can go on (--resume) with the same result.
  r.state = std::make_unique<ResumeState>(job.out, resume_fingerprint(r), job.resume, r.log);
  ResumeState& state = *r.state;
  so.resume_layers = std::min<int64_t>(state.layers_done(), r.cfg.num_hidden_layers);
  r.sum.resumed_layers = so.resume_layers;
  so.restore = [&](int64_t li) {
    SavedLayer saved = state.restore_layer(r.cfg, li, r.model->mutable_layer(li));
    if (so.kv_amax) {
      if (!saved.kv_amax) throw invalid_input(ResumeState::folder_for(job.out).string(), "layer " + std::to_string(li) + " has no KV-cache ranges");
      so.kv_amax->push_back(*saved.kv_amax);
    }
    export_layer(r, li, saved.done, saved.seconds, true);
  };
  r.log(r.memory_line);  // once the output is ours (the state's lock is held)
  const QuantizeFn quantize = [&](const LinearToQuantize& in) { return quantize_linear(r, in); };
  if (r.image_samples > 0) so.multimodal = &r.multimodal;
  run_sequential(*r.model, r.samples, quantize, r.pool, [&](int64_t li, std::vector<QuantizedLinearResult>& done, double secs) {
    export_layer(r, li, done, secs, false);
    state.save_layer(r.cfg, li, r.model->weights().layers[static_cast<size_t>(li)], std::move(done), secs,
                     so.kv_amax ? std::optional<std::pair<float, float>>(so.kv_amax->back()) : std::nullopt);
  }, so);
  state.finish();
  r.sum.mean_error = r.sum.linears ? r.err_sum / static_cast<double>(r.sum.linears) : 0;
}

}  // namespace qf
