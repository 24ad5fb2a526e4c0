#include "calibration/quantize_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <set>

#include <nlohmann/json.hpp>

#include "calibration/calibration_data.h"
#include "calibration/quantize_plan.h"
#include "calibration/resume_state.h"
#include "calibration/sequential.h"
#include "calibration/smoothing.h"
#include "core/error.h"
#include "core/io.h"
#include "core/sha256.h"
#include "core/version.h"
#include "eval/bench.h"
#include "eval/eval_run.h"
#include "checkpoint/checkpoint_format.h"
#include "checkpoint/manifest.h"
#include "formats/hf/model_config.h"
#include "formats/hf/resolve.h"
#include "formats/safetensors.h"
#include "formats/tokenizer/tokenizer.h"
#include "quantizers/device_quantizers.h"
#include "quantizers/gptq.h"
#include "quantizers/rtn.h"
#include "recipe/recipe.h"
#include "runtime/device_runtime.h"
#include "runtime/finite_weights.h"
#include "runtime/model.h"
#include "runtime/router_linears.h"

namespace qf {
namespace {

const char* kCopiedFiles[] = {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                              "generation_config.json", "vocab.json", "merges.txt", "added_tokens.json",
                              "chat_template.jinja"};

// The tensors of the model as it is now, for everything the pipeline does not
// write as quantized: norms (SmoothQuant and AWQ rescale them), biases and
// Linears left in full precision (AWQ may have rescaled those too), in the
// checkpoint's dtype. Unchanged values round-trip exactly (f16/bf16 -> f32 -> same).
void add_current(SafetensorsWriter& w, const Checkpoint& ck, const std::string& name, const std::vector<float>& v,
                 std::set<std::string>& written) {
  const TensorInfo& info = ck.info(name);
  w.add(name, Tensor::from_f32(v, info.shape).to(info.dtype));
  written.insert(name);
}

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
nlohmann::ordered_json resume_fingerprint(const QuantizeJob& job, const std::filesystem::path& model_dir,
                                          const Recipe& recipe, const std::filesystem::path& calib_used) {
  nlohmann::ordered_json fp;
  fp["tool"] = version();
  fp["model_files"] = model_file_stats(model_dir);
  fp["recipe"] = recipe.text;
  // By content: the Python module's list of samples lives in a new temporary file each call.
  fp["calibration"] = calib_used.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(sha256_file_hex(calib_used));
  fp["allow_nonfinite"] = job.allow_nonfinite;
  return fp;
}

}  // namespace

QuantizeSummary quantize_model(const QuantizeJob& job, ThreadPool& pool, const std::function<void(const std::string&)>& log) {
  namespace fs = std::filesystem;
  const auto t0 = std::chrono::steady_clock::now();
  const Recipe recipe = parse_recipe_file(job.recipe);
  checkpoint_format(recipe.export_.format, recipe.export_.format_where);  // an unknown name fails before any work
  const ResolvedModel rm = resolve_model(job.model);
  const ModelConfig cfg = load_model_config(rm.dir);
  if (cfg.quantization_config)
    throw unsupported(rm.dir.string(), "the model is already quantized (config.json has a quantization_config); start from f16/bf16/f32 weights");
  std::unique_ptr<rt::Model> model = rt::load_hf_model(rm.dir);
  std::unique_ptr<Tokenizer> tok = load_tokenizer(rm.dir);
  if (!job.allow_nonfinite) {
    const std::string bad = rt::find_nonfinite_weight(*model, pool);
    if (!bad.empty())
      throw invalid_input(rm.dir.string(), bad + "; a model with non-finite weights cannot be quantized meaningfully (--allow-nonfinite overrides)");
  }

  const QuantizePlan plan = make_quantize_plan(recipe, *model);
  if (job.device != device::Kind::Cpu) rt::refuse_sparse_on_device(*model);
  if (job.device != device::Kind::Cpu)
    for (const auto& [name, p] : plan.linears)
      if (p.observer == RangeObserver::Mse && p.weights.strategy == QuantStrategy::Tensor && !p.weights.is_float())
        throw unsupported(job.recipe.string(), std::string("the mse observer with the tensor strategy (") + name +
                                                   ") has no device version; quantize with --device cpu");
  const bool gptq = plan.quantizer == QuantMethod::Gptq;
  const CheckpointFormat& format = *plan.format;
  const std::string on_device = "device " + std::string(device::kind_name(job.device)) + ": ";
  const auto mib = [](uint64_t b) { return std::to_string((b + (1u << 20) - 1) >> 20) + " MiB"; };
  uint64_t gptq_need = 0;
  if (gptq && job.device != device::Kind::Cpu) {
    // The largest Linear's device memory, said up front and, on a GPU, checked.
    const ModelConfig& c = model->config();
    const int64_t shapes[4][2] = {{c.q_dim(), c.hidden_size}, {c.hidden_size, c.q_dim()},
                                  {c.intermediate_size, c.hidden_size}, {c.hidden_size, c.intermediate_size}};
    for (const auto& sh : shapes) gptq_need = std::max(gptq_need, gptq_device_bytes(sh[0], sh[1], plan.gptq.block_size));
    log(on_device + "GPTQ needs up to " + mib(gptq_need) + " of device memory per Linear");
    device::require_device_memory(job.device, gptq_need, "quantize " + job.model);
  }

  std::vector<std::vector<int32_t>> samples;
  fs::path calib_used;  // absolute, when calibration data was read
  if (plan.needs_calibration) {
    // A relative calibration.dataset is relative to the recipe file.
    fs::path calib = job.calib;
    if (calib.empty() && !recipe.calibration.dataset.empty()) {
      calib = recipe.calibration.dataset;
      if (calib.is_relative()) calib = job.recipe.parent_path() / calib;
    }
    if (calib.empty())
      throw Error(ErrorKind::Usage, plan.calibration_reason + " needs calibration data: give --calib FILE or calibration.dataset in the recipe");
    CalibrationOptions co;
    co.num_samples = recipe.calibration.num_samples;
    co.seq_len = recipe.calibration.seq_len;
    co.seed = recipe.calibration.seed;
    co.text_field = recipe.calibration.text_field;
    if (model->max_context() > 0 && co.seq_len > model->max_context())
      throw invalid_input(recipe.source, "calibration.seq_len " + std::to_string(co.seq_len) + " exceeds the model's context " +
                                             std::to_string(model->max_context()));
    samples = load_calibration(calib, *tok, co);
    calib_used = fs::absolute(calib).lexically_normal();
  }

  QuantizeSummary sum;
  nlohmann::ordered_json linear_reports = nlohmann::ordered_json::array();
  sum.format = format.name();
  sum.method = plan.method;
  sum.samples = static_cast<int64_t>(samples.size());
  for (const auto& s : samples) sum.tokens += static_cast<int64_t>(s.size());

  StagingDir stage(job.out);
  SafetensorsWriter writer(stage.path(), "model", recipe.export_.max_shard_bytes);
  Checkpoint ck = Checkpoint::open(rm.dir);
  std::set<std::string> written;

  const QuantizeFn quantize = [&](const LinearToQuantize& in) -> std::optional<QuantizedLinearResult> {
    auto it = plan.linears.find(in.name);
    if (it == plan.linears.end()) return std::nullopt;
    const PlannedLinear& p = it->second;
    if (!job.allow_nonfinite) check_finite_statistics(in);
    QuantizedLinearResult out;
    out.name = in.name;
    out.note = in.note;
    out.expert_tokens = in.expert_tokens;
    if (gptq && in.hessian) {
      GptqOptions o = plan.gptq;
      o.dampening_frac *= in.dampening_scale;
      o.actorder = p.actorder;
      o.observer = p.observer;
      o.mse = p.mse;
      o.pool = &pool;
      GptqResult r = gptq_quantize_on(job.device, in.weight->data(), in.rows, in.cols,
                                      gptq_hessian(*in.hessian, in.cols, in.name), p.weights, o, in.name);
      out.q = std::move(r.q);
      if (!r.fallback.empty()) out.note += (out.note.empty() ? "" : "; ") + r.fallback;
    } else {
      // NVFP4: one global scale for the whole fused set (q/k/v, gate/up).
      out.q = round_to_nearest(in.weight->data(), in.rows, in.cols, p, in.fused_weight_amax, job.device);
      // GPTQ without a Hessian: an expert no calibration token reached, in the same scheme.
      if (gptq) out.note += "; quantized with round-to-nearest instead of GPTQ";
    }
    if (p.act) {
      out.act = calibrate_activation(*p.act, in.act_min, in.act_max, in.name);
      // Static input scales are stored in the model dtype (compressed-tensors'
      // input_scale); the runtime and every exporter use the rounded value.
      if (out.act->scale > 0) out.act->scale = round_scale(out.act->scale, plan_scale_dtype(cfg));
    }
    return out;
  };
  // Without calibration (RTN, dynamic activations) a single pseudo-sample
  // keeps the pipeline's bookkeeping; nothing is observed on it.
  if (!plan.needs_calibration) samples = {{tok->bos_id() >= 0 ? tok->bos_id() : 0, 0}};

  uint64_t device_need = 0;
  if (job.device != device::Kind::Cpu) {
    // The calibration forward: one layer, its cache, activations and Hessians
    // on the device, next to the GPTQ solve of one Linear.
    int64_t longest = 1;
    for (const auto& sm : samples) longest = std::max(longest, static_cast<int64_t>(sm.size()));
    const uint64_t fwd = rt::device_layer_pass_bytes(*model, longest, gptq);
    uint64_t smooth = 0;
    if (plan.awq || plan.smoothquant) {
      // The smoothing searches hold every calibration token's block inputs and outputs.
      smooth = rt::device_smoothing_eval_bytes(*model, sum.tokens, longest);
      log(on_device + std::string(plan.awq ? "AWQ" : "SmoothQuant") + "'s search needs up to " + mib(smooth) +
          " of device memory per layer");
    }
    log(on_device + "the calibration forward needs up to " + mib(fwd) + " of device memory (one layer at a time); " +
        mib(fwd + gptq_need + smooth) + " in all");
    device_need = fwd + gptq_need + smooth;
    device::require_device_memory(job.device, device_need, "quantize " + job.model);
  }

  SequentialOptions so;
  so.device = job.device;
  so.device_reserve_bytes = device_need;
  so.hessian_weighted_error = gptq;
  so.max_memory_bytes = job.max_memory_bytes;
  so.spill_beside = stage.final_path();
  if (job.device != device::Kind::Cpu && plan.needs_calibration) {
    const uint64_t hidden_bytes = static_cast<uint64_t>(sum.tokens) * static_cast<uint64_t>(model->config().hidden_size) * 4;
    log(on_device + "the calibration set's hidden states (" + mib(hidden_bytes) + ") " +
        (hidden_states_on_device(so, hidden_bytes) ? "stay on the device between layers"
                                                   : "stay in host memory and cross to the device once per pass"));
  }
  so.observe_ranges = plan.needs_activation_ranges;
  so.moe_calibrate_all_experts = recipe.calibration.moe_calibrate_all_experts;
  so.log = log;
  so.fused_weight_amax = plan.fused_nvfp4;
  std::vector<std::pair<float, float>> kv_amax;
  if (plan.export_config.kv_cache) so.kv_amax = &kv_amax;
  if (plan.smoothquant || plan.awq) {
    so.transform = [&](int64_t li, const std::vector<std::vector<int32_t>>& s,
                       const std::function<std::vector<float>(size_t)>& input) {
      LayerCalib lc{&s, input};
      if (plan.smoothquant) {
        SmoothQuantOptions o = *plan.smoothquant;
        o.device = job.device;
        const TrialLinearFn trial = [&](const std::string& name, const float* w, int64_t rows, int64_t cols,
                                        const std::vector<float>& bias) -> std::shared_ptr<rt::Linear> {
          return plan_trial_linear(plan, name, w, rows, cols, bias);
        };
        for (const auto& line : smoothquant_layer(*model, li, lc, o, trial, pool).lines) log(line);
      }
      if (plan.awq) {
        AwqOptions o = *plan.awq;
        o.device = job.device;
        o.moe_calibrate_all_experts = recipe.calibration.moe_calibrate_all_experts;
        const FakeQuantFn fq = [&](const std::string& name, const float* w, int64_t rows, int64_t cols) {
          auto it = plan.awq_linears.find(name);
          if (it == plan.awq_linears.end()) return std::vector<float>();
          return round_to_nearest(w, rows, cols, it->second, -1, job.device).dequantize();
        };
        for (const auto& line : awq_layer(*model, li, lc, fq, o, pool).lines) log(line);
      }
    };
  }

  double err_sum = 0;
  const auto export_layer = [&](int64_t li, std::vector<QuantizedLinearResult>& done, double secs, bool restored) {
    double worst = 0;
    for (auto& d : done) {
      const ActQuantParams* act = d.act ? &*d.act : nullptr;
      format.add_linear(writer, d.name, d.q, act);
      written.insert(d.name + ".weight");
      ++sum.linears;
      err_sum += d.error;
      worst = std::max(worst, d.error);
      sum.max_error = std::max(sum.max_error, d.error);
      if (!d.note.empty()) log("note: " + d.note);
    }
    QuantizedLayerRecord rec;
    rec.layer = li, rec.linears = static_cast<int64_t>(done.size()), rec.seconds = secs, rec.max_error = worst;
    for (auto& d : done) rec.mean_error += d.error;
    if (!done.empty()) rec.mean_error /= static_cast<double>(done.size());
    sum.per_layer.push_back(rec);
    for (const auto& d : done) {
      const PlannedLinear& p = plan.linears.at(d.name);
      linear_reports.push_back({{"name", d.name},
                                {"layer", li},
                                {"method", plan.method},
                                {"shape", {d.q.rows, d.q.cols}},
                                {"weights", d.q.scheme.describe()},
                                {"activations", d.act ? nlohmann::ordered_json(d.act->scheme.describe()) : nlohmann::ordered_json()},
                                {"observer", p.observer == RangeObserver::Mse ? "mse" : "minmax"},
                                {"bits_per_weight", stored_bits_per_weight(d.q)},
                                {"error", d.error},
                                {"seconds", d.seconds}});
      if (d.expert_tokens >= 0) linear_reports.back()["expert_calibration_tokens"] = d.expert_tokens;
      if (!d.note.empty()) linear_reports.back()["note"] = d.note;
    }
    char line[256];
    std::snprintf(line, sizeof line, "layer %lld/%lld: %zu linears in %.2f s, relative error mean %.3g, max %.3g",
                  static_cast<long long>(li + 1), static_cast<long long>(cfg.num_hidden_layers), done.size(), secs,
                  rec.mean_error, worst);
    log(std::string(line) + (restored ? " (restored)" : ""));
    ++sum.layers;
    if (job.on_layer) job.on_layer(sum.layers, cfg.num_hidden_layers);
  };
  // Each finished layer is saved beside the output until it is committed, so
  // that an interrupted run can go on (--resume) with the same result.
  ResumeState state(job.out, resume_fingerprint(job, rm.dir, recipe, calib_used), job.resume, log);
  so.resume_layers = std::min<int64_t>(state.layers_done(), cfg.num_hidden_layers);
  sum.resumed_layers = so.resume_layers;
  so.restore = [&](int64_t li) {
    SavedLayer saved = state.restore_layer(cfg, li, model->mutable_layer(li));
    if (so.kv_amax) {
      if (!saved.kv_amax) throw invalid_input(ResumeState::folder_for(job.out).string(), "layer " + std::to_string(li) + " has no KV-cache ranges");
      so.kv_amax->push_back(*saved.kv_amax);
    }
    export_layer(li, saved.done, saved.seconds, true);
  };
  run_sequential(*model, samples, quantize, pool, [&](int64_t li, std::vector<QuantizedLinearResult>& done, double secs) {
    export_layer(li, done, secs, false);
    state.save_layer(cfg, li, model->weights().layers[static_cast<size_t>(li)], std::move(done), secs,
                     so.kv_amax ? std::optional<std::pair<float, float>>(so.kv_amax->back()) : std::nullopt);
  }, so);
  state.finish();
  sum.mean_error = sum.linears ? err_sum / static_cast<double>(sum.linears) : 0;

  // Norms, biases, full-precision Linears and routers of the decoder layers,
  // as the pipeline left them.
  for (int64_t li = 0; li < cfg.num_hidden_layers; ++li) {
    const std::string p = "model.layers." + std::to_string(li) + ".";
    const rt::LayerWeights& L = model->weights().layers[static_cast<size_t>(li)];
    add_current(writer, ck, p + "input_layernorm.weight", L.attn_norm, written);
    add_current(writer, ck, p + "post_attention_layernorm.weight", L.ffn_norm, written);
    for (const rt::LayerLinearId& id : rt::layer_linears(cfg, li)) {
      const rt::Linear& lin = *rt::layer_linear(L, id);
      const std::string base = p + id.name;
      if (ck.contains(base + ".bias")) add_current(writer, ck, base + ".bias", lin.bias_values(), written);
      if (!written.count(base + ".weight")) add_current(writer, ck, base + ".weight", lin.decode_all(), written);
    }
    for (const rt::RouterLinear& r : rt::router_linears(cfg, li))  // smoothing scales them
      add_current(writer, ck, p + r.name + ".weight", (L.moe.*r.member)->decode_all(), written);
  }
  // FP8 KV-cache scales: amax / 448 of the calibrated K (after RoPE) and V;
  // modelopt's export raises them to at least 1 (llm-compressor's does not).
  std::vector<KvScales> kv;
  for (const auto& [k, v] : kv_amax)
    kv.push_back({k > 0 ? k / 448.0f : 1.0f, v > 0 ? v / 448.0f : 1.0f});
  for (size_t li = 0; li < kv.size(); ++li)
    format.add_kv_scales(writer, static_cast<int64_t>(li), kv[li], plan_scale_dtype(cfg));

  // Everything else is copied as it is. lm_head is never quantized here; it
  // is listed in ignore even when tied to the embeddings (it is still a
  // Linear a loader would otherwise look for).
  std::vector<std::string> ignore = {"lm_head"};
  std::set<std::string> quantized;
  for (const auto& [name, _] : plan.linears) quantized.insert(name);
  for (const std::string& name : ck.names()) {
    const std::string suffix = ".weight";
    const bool is_weight = name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    const std::string module = is_weight ? name.substr(0, name.size() - suffix.size()) : "";
    if (is_weight && ck.info(name).shape.size() == 2 && name.find("embed_tokens") == std::string::npos &&
        name != "lm_head.weight" && !quantized.count(module))
      ignore.push_back(module);
    if (written.count(name)) continue;
    writer.add(name, ck.tensor(name));
  }
  writer.set_metadata({{"format", "pt"}});
  writer.finish();

  nlohmann::ordered_json config = cfg.raw;
  ExportConfig ec = plan.export_config;
  ec.ignore = ignore;
  format.write_config(ec, config, stage.path());
  write_file_atomic(stage.path() / "config.json", config.dump(2) + "\n");
  for (const char* f : kCopiedFiles)
    if (fs::exists(rm.dir / f)) fs::copy_file(rm.dir / f, stage.path() / f);
  // The recipe as run: with calibration, its dataset is the absolute path
  // actually read (--calib included), so the copy reproduces the output.
  std::string dataset = calib_used.string();
  if (!calib_used.empty() && job.copy_calibration) {
    dataset = calib_used.extension() == ".jsonl" ? "calibration.jsonl" : "calibration.txt";
    fs::copy_file(calib_used, stage.path() / dataset);  // relative to the copied recipe: it travels with the output
  }
  const std::string recipe_copy =
      calib_used.empty() ? recipe.text
                         : resolved_recipe_text(recipe, dataset,
                                                std::string("# The recipe as quantforge ") + version() +
                                                    " ran it (calibration resolved; the original's comments are not kept).\n");
  write_file_atomic(stage.path() / "recipe.yaml", recipe_copy);
  uint64_t act = 0;
  for (const auto& s : samples) act += s.size() * static_cast<uint64_t>(cfg.hidden_size) * 4;
  sum.spilled = job.max_memory_bytes > 0 && act > job.max_memory_bytes;

  nlohmann::ordered_json report;
  report["tool"] = {{"name", "quantforge"}, {"version", version()}};
  report["invocation"] = job.invocation;
  report["model"] = {{"argument", job.model}, {"path", fs::absolute(rm.dir).lexically_normal().string()}};
  report["recipe"] = {{"path", fs::absolute(job.recipe).lexically_normal().string()}, {"text", recipe_copy}};
  report["format"] = sum.format;
  report["method"] = sum.method;
  report["device"] = device::kind_name(job.device);
  nlohmann::ordered_json cal = nullptr;
  if (!calib_used.empty())
    cal = {{"dataset", dataset},         {"text_field", recipe.calibration.text_field},
           {"num_samples", recipe.calibration.num_samples}, {"seq_len", recipe.calibration.seq_len},
           {"seed", recipe.calibration.seed},         {"samples", sum.samples},
           {"tokens", sum.tokens}};
  report["calibration"] = cal;
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const QuantizedLayerRecord& r : sum.per_layer)
    layers.push_back({{"layer", r.layer}, {"linears", r.linears}, {"seconds", r.seconds}, {"mean_error", r.mean_error},
                      {"max_error", r.max_error}});
  report["layers"] = layers;
  report["linears"] = linear_reports;
  double weights = 0, bits = 0;
  for (const auto& l : linear_reports) {
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
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  sum.peak_rss_bytes = eval::peak_rss_bytes();
  report["totals"]["seconds"] = sum.seconds;  // the evaluation's time is its own
  report["totals"]["peak_rss_bytes"] = sum.peak_rss_bytes;
  report["evaluation"] = nullptr;
  if (!job.eval_text.empty()) {
    eval::EvalRequest req;
    req.model = stage.path().string();
    req.text = job.eval_text.string();
    req.baseline = job.model;
    req.ppl.max_spans = job.eval_max_chunks;
    req.device = device::kind_name(job.device);  // where the layers ran
    eval::EvalRun run = eval::run_eval(req, pool, job.eval_progress);
    run.report["model"] = job.out.string();  // where it will be, not the staging folder
    report["evaluation"] = run.report;
    sum.evaluation = run.result;
  }
  write_file_atomic(stage.path() / kQuantizationReportFile, report.dump(2) + "\n");
  write_manifest(stage.path());
  for (const auto& e : fs::directory_iterator(stage.path())) sum.output_bytes += e.is_regular_file() ? e.file_size() : 0;
  sum.report = std::move(report);
  if (job.before_commit) job.before_commit(sum);
  stage.commit();
  state.remove();
  return sum;
}

double stored_bits_per_weight(const QuantizedTensor& q) {
  const QuantScheme& s = q.scheme;
  const double n = static_cast<double>(q.rows) * static_cast<double>(q.cols);
  if (n <= 0) return 0;
  const double params = static_cast<double>(q.scales.size());
  double bits = n * s.bits + params * 8.0 * static_cast<double>(dtype_size(s.scale_dtype));
  if (!s.is_float() && !s.symmetric) bits += params * s.bits;  // packed zero points
  bits += static_cast<double>(q.g_idx.size()) * 32;
  if (s.is_nvfp4()) bits += 32;  // the global scale
  return bits / n;
}

}  // namespace qf
