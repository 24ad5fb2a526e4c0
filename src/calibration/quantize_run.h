// The stages of `quantforge quantize` (calibration/quantize_model.h), each a
// function over one QuantizeRun that the previous stages filled in:
//
//   load      recipe, model, tokenizer; every refusal that needs no work
//   mixed     with a mixed_precision section: the search that chooses each
//             Linear's scheme (mixed_precision.h), written into the recipe's
//             quantizer as its groups
//   plan      what each Linear becomes (quantize_plan.h); device memory
//   data      the calibration samples; the memory the run will take
//   layers    the sequential pipeline: per layer search, calibrate
//             (forward and Hessians), solve, propagate, export the layer
//   export    everything else the output holds: the other tensors, the
//             config, tokenizer files, the recipe as run
//   report    quantization_report.json (with each stage's and phase's time)
//   evaluate  the staged output against the model (--eval)
//
// quantize_model() runs them in this order and times each one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibration/calibration_data.h"
#include "calibration/mixed_precision.h"
#include "calibration/pipeline_times.h"
#include "calibration/quantize_model.h"
#include "calibration/quantize_plan.h"
#include "calibration/resume_state.h"
#include "calibration/vision_plan.h"
#include "core/io.h"
#include "core/peak_flops.h"
#include "formats/hf/model_config.h"
#include "formats/hf/resolve.h"
#include "formats/safetensors.h"
#include "formats/tokenizer/tokenizer.h"
#include "recipe/recipe.h"
#include "runtime/model.h"

namespace qf {

struct QuantizeRun {
  QuantizeRun(const QuantizeJob& j, ThreadPool& p, const std::function<void(const std::string&)>& l)
      : job(j), pool(p), log(l) {}

  const QuantizeJob& job;
  ThreadPool& pool;
  const std::function<void(const std::string&)>& log;

  // load
  Recipe recipe;
  ResolvedModel rm;
  ModelConfig cfg;
  std::unique_ptr<rt::Model> model;
  std::unique_ptr<Tokenizer> tok;
  // mixed
  std::optional<MixedPrecisionResult> mixed;
  // plan
  QuantizePlan plan;
  uint64_t gptq_device_bytes = 0;  // the largest Linear's GPTQ on the device
  std::vector<VisionLinear> vision;  // the recipe's `vision:` section: the vision Linears it quantizes
  // data
  std::vector<std::vector<int32_t>> samples;
  // A vision-language model's image records: per sample its image rows and
  // positions (empty when every sample is text).
  std::vector<rt::MultimodalInputs> multimodal;
  int64_t image_samples = 0;
  std::filesystem::path calib_used;  // absolute, when calibration data was read
  uint64_t device_bytes = 0;         // what the run needs on the device, in all
  nlohmann::ordered_json memory;     // the host memory estimate (report "memory")
  std::string memory_line;           // the same, as quantize prints it when the layers start
  // layers
  std::unique_ptr<StagingDir> stage;
  std::unique_ptr<SafetensorsWriter> writer;
  std::unique_ptr<ResumeState> state;  // each finished layer, saved until the output is committed
  std::set<std::string> written;  // tensor names already in the writer
  QuantizeSummary sum;
  nlohmann::ordered_json linear_reports = nlohmann::ordered_json::array();
  std::vector<std::pair<float, float>> kv_amax;  // per layer, when the export takes FP8 KV-cache scales
  double err_sum = 0;
  PipelineTimes times;
  // export
  std::string dataset;      // calibration.dataset as recorded in the copied recipe and the report
  std::string recipe_copy;  // the recipe as run
  nlohmann::ordered_json vision_reports;  // one entry per quantized vision Linear (null: none)
  // report
  std::vector<std::pair<std::string, double>> stage_seconds;  // in order
  std::vector<PeakFlops> peak;
};

void load_stage(QuantizeRun& r);
void mixed_stage(QuantizeRun& r);
void plan_stage(QuantizeRun& r);
void data_stage(QuantizeRun& r);
void layers_stage(QuantizeRun& r);
void export_stage(QuantizeRun& r);
void report_stage(QuantizeRun& r);
void evaluate_stage(QuantizeRun& r);

// Part of export: the vision Linears of r.vision rounded to nearest and
// written (their names added to r.written and `quantized`), their report
// entries in r.vision_reports.
void export_vision_linears(QuantizeRun& r, const Checkpoint& ck, std::set<std::string>& quantized);

// The calibration file a run reads: --calib, else the recipe's
// calibration.dataset (relative to the recipe file); empty when neither.
std::filesystem::path calibration_path(const QuantizeRun& r);

// The recipe's calibration settings (num_samples capped at `max_samples`
// when positive), checked against the model's context (InvalidInput naming
// the recipe).
CalibrationOptions calibration_options(const QuantizeRun& r, int64_t max_samples = 0);

// The plan as --dry-run prints it: every quantized Linear's scheme and
// stored bytes (with mixed precision: the allocation and its predicted KL).
std::string dry_run_text(const QuantizeRun& r);

// The per-stage and per-phase times of a run as the report holds them
// (report "timing"), and the one line quantize prints from it.
nlohmann::ordered_json timing_json(const QuantizeRun& r);
std::string timing_line(const nlohmann::ordered_json& timing);

}  // namespace qf
