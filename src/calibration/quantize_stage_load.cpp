// The stages before any layer is touched: load, plan, data
// (calibration/quantize_run.h).
#include <algorithm>

#include "calibration/calibration_data.h"
#include "calibration/quantize_memory.h"
#include "calibration/quantize_run.h"
#include "calibration/sequential.h"
#include "checkpoint/checkpoint_format.h"
#include "core/error.h"
#include "core/weight_residency.h"
#include "formats/hf/model_tensors.h"
#include "quantizers/device_quantizers.h"
#include "runtime/device_runtime.h"
#include "runtime/finite_weights.h"

namespace qf {
namespace {

std::string mib(uint64_t b) { return std::to_string((b + (1u << 20) - 1) >> 20) + " MiB"; }

std::string on_device(const QuantizeRun& r) { return "device " + std::string(device::kind_name(r.job.device)) + ": "; }

}  // namespace

void load_stage(QuantizeRun& r) {
  r.recipe = parse_recipe_file(r.job.recipe);
  checkpoint_format(r.recipe.export_.format, r.recipe.export_.format_where);  // an unknown name fails before any work
  r.rm = resolve_model(r.job.model);
  r.cfg = load_model_config(r.rm.dir);
  if (r.cfg.quantization_config)
    throw unsupported(r.rm.dir.string(), "the model is already quantized (config.json has a quantization_config); start from f16/bf16/f32 weights");
  // Mapped: the pipeline reads one layer at a time and gives each layer's
  // pages back when it is done (QF_WEIGHTS=memory reads the model in).
  r.model = rt::load_hf_model(r.rm.dir, streaming_weight_residency(),
                              rt::LoraLoad{r.job.loras, rt::LoraLoad::Mode::Merge});
  r.tok = load_tokenizer(r.rm.dir);
  if (!r.job.allow_nonfinite) {
    const std::string bad = rt::find_nonfinite_weight(*r.model, r.pool, true);
    if (!bad.empty())
      throw invalid_input(r.rm.dir.string(), bad + "; a model with non-finite weights cannot be quantized meaningfully (--allow-nonfinite overrides)");
  }
}

void plan_stage(QuantizeRun& r) {
  const QuantizeJob& job = r.job;
  r.plan = make_quantize_plan(r.recipe, *r.model);
  if (r.recipe.vision) {
    Checkpoint ck = Checkpoint::open(r.rm.dir);
    apply_hf_tensor_naming(r.cfg, ck);
    r.vision = plan_vision_linears(r.recipe, r.cfg, ck, *r.plan.format, r.log);
  }
  if (job.device != device::Kind::Cpu && (r.plan.awq || r.plan.smoothquant))
    rt::refuse_sparse_on_device(*r.model, std::string(r.plan.awq ? "AWQ" : "SmoothQuant") + " with --device " +
                                              device::kind_name(job.device));
  if (job.device != device::Kind::Cpu)
    for (const auto& [name, p] : r.plan.linears)
      if (p.observer == RangeObserver::Mse && p.weights.strategy == QuantStrategy::Tensor && !p.weights.is_float())
        throw unsupported(job.recipe.string(), std::string("the mse observer with the tensor strategy (") + name +
                                                   ") has no device version; quantize with --device cpu");
  if (r.plan.quantizer == QuantMethod::Gptq && job.device != device::Kind::Cpu) {
    // The largest Linear's device memory, said up front and, on a GPU, checked.
    // Every layer's Linears (a sparse layer's experts and shared expert included).
    const ModelConfig& c = r.model->config();
    for (int64_t li = 0; li < c.num_hidden_layers; ++li)
      for (const rt::LayerLinearId& id : rt::layer_linears(c, li)) {
        const rt::LinearShape sh = rt::layer_linear_shape(c, id);
        r.gptq_device_bytes = std::max(r.gptq_device_bytes, gptq_device_bytes(sh.out, sh.in, r.plan.gptq.block_size));
      }
    r.log(on_device(r) + "GPTQ needs up to " + mib(r.gptq_device_bytes) + " of device memory per Linear");
    device::require_device_memory(job.device, r.gptq_device_bytes, "quantize " + job.model);
  }
}

CalibrationOptions calibration_options(const QuantizeRun& r, int64_t max_samples) {
  CalibrationOptions co;
  co.num_samples = max_samples > 0 ? std::min(r.recipe.calibration.num_samples, max_samples) : r.recipe.calibration.num_samples;
  co.seq_len = r.recipe.calibration.seq_len;
  co.seed = r.recipe.calibration.seed;
  co.text_field = r.recipe.calibration.text_field;
  if (r.model->max_context() > 0 && co.seq_len > r.model->max_context())
    throw invalid_input(r.recipe.source, "calibration.seq_len " + std::to_string(co.seq_len) + " exceeds the model's context " +
                                             std::to_string(r.model->max_context()));
  return co;
}

std::filesystem::path calibration_path(const QuantizeRun& r) {
  // A relative calibration.dataset is relative to the recipe file.
  std::filesystem::path calib = r.job.calib;
  if (calib.empty() && !r.recipe.calibration.dataset.empty()) {
    calib = r.recipe.calibration.dataset;
    if (calib.is_relative()) calib = r.job.recipe.parent_path() / calib;
  }
  return calib;
}

void data_stage(QuantizeRun& r) {
  namespace fs = std::filesystem;
  const QuantizeJob& job = r.job;
  if (r.plan.needs_calibration) {
    const fs::path calib = calibration_path(r);
    if (calib.empty())
      throw Error(ErrorKind::Usage, r.plan.calibration_reason + " needs calibration data: give --calib FILE or calibration.dataset in the recipe");
    if (r.cfg.vlm && rt::jsonl_names_images(calib)) {
      // Image records: each image through the vision side, its rows into the
      // language model's input where its tokens are.
      if (job.device != device::Kind::Cpu)
        throw unsupported(calib.string(), "image calibration records run on the CPU only (--device cpu)");
      const int32_t bos = r.tok->bos_id();
      const rt::ImageSequencer seq =
          rt::make_image_sequencer(*r.model, r.rm.dir, bos >= 0 ? std::optional<int32_t>(bos) : std::nullopt);
      for (CalibrationSample& s : load_calibration_samples(calib, *r.tok, calibration_options(r), seq)) {
        r.samples.push_back(std::move(s.tokens));
        r.image_samples += s.image ? 1 : 0;
        r.multimodal.push_back(std::move(s.inputs));
      }
      r.log("calibration: " + std::to_string(r.samples.size()) + " samples, " + std::to_string(r.image_samples) +
            " with an image");
    } else {
      r.samples = load_calibration(calib, *r.tok, calibration_options(r));
    }
    r.calib_used = fs::absolute(calib).lexically_normal();
  }
  r.sum.format = r.plan.format->name();
  r.sum.method = r.plan.method;
  r.sum.samples = static_cast<int64_t>(r.samples.size());
  for (const auto& s : r.samples) r.sum.tokens += static_cast<int64_t>(s.size());
  // Without calibration (RTN, dynamic activations) a single pseudo-sample
  // keeps the pipeline's bookkeeping; nothing is observed on it.
  if (!r.plan.needs_calibration) r.samples = {{r.tok->bos_id() >= 0 ? r.tok->bos_id() : 0, 0}};

  // What the run will hold in host memory (said when the layers start).
  const QuantizeMemory mem = estimate_quantize_memory(*r.model, r.plan, r.samples, job.max_memory_bytes);
  r.memory = mem.json();
  r.memory_line = "memory: " + mem.line();

  if (job.device == device::Kind::Cpu) return;
  // The calibration forward: one layer, its cache, activations and Hessians
  // on the device, next to the GPTQ solve of one Linear.
  const bool gptq = r.plan.quantizer == QuantMethod::Gptq;
  int64_t longest = 1;
  for (const auto& sm : r.samples) longest = std::max(longest, static_cast<int64_t>(sm.size()));
  const uint64_t fwd = rt::device_layer_pass_bytes(*r.model, longest, gptq);
  uint64_t smooth = 0;
  if (r.plan.awq || r.plan.smoothquant) {
    // The smoothing searches hold every calibration token's block inputs and outputs.
    smooth = rt::device_smoothing_eval_bytes(*r.model, r.sum.tokens, longest);
    r.log(on_device(r) + std::string(r.plan.awq ? "AWQ" : "SmoothQuant") + "'s search needs up to " + mib(smooth) +
          " of device memory per layer");
  }
  r.log(on_device(r) + "the calibration forward needs up to " + mib(fwd) + " of device memory (one layer at a time); " +
        mib(fwd + r.gptq_device_bytes + smooth) + " in all");
  r.device_bytes = fwd + r.gptq_device_bytes + smooth;
  device::require_device_memory(job.device, r.device_bytes, "quantize " + job.model);
  if (r.plan.needs_calibration) {
    SequentialOptions so;
    so.device = job.device;
    so.device_reserve_bytes = r.device_bytes;
    so.max_memory_bytes = job.max_memory_bytes;
    const uint64_t hidden_bytes = static_cast<uint64_t>(r.sum.tokens) * static_cast<uint64_t>(r.model->config().hidden_size) * 4;
    r.log(on_device(r) + "the calibration set's hidden states (" + mib(hidden_bytes) + ") " +
          (hidden_states_on_device(so, hidden_bytes) ? "stay on the device between layers"
                                                     : "stay in host memory and cross to the device once per pass"));
  }
}

}  // namespace qf
