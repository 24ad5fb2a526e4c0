// `quantforge quantize`: recipe -> calibration -> layer-by-layer RTN or GPTQ ->
// compressed-tensors (pack-quantized) or GPTQ checkpoint, written atomically.
// The stages it runs, each timed: calibration/quantize_run.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/lora_adapter.h"
#include "core/thread_pool.h"
#include "device/device.h"
#include "eval/perplexity.h"
#include "quantizers/quant_scheme.h"

namespace qf {

struct QuantizeSummary;

struct QuantizeJob {
  std::string model;                    // HF folder or cache id (float weights)
  // LoRA adapters merged into the model before anything else
  // (checkpoint/lora_merge.h): calibration, quantization, the copied
  // unquantized tensors and the evaluation's baseline all see the merged model.
  std::vector<LoraSpec> loras;
  std::filesystem::path recipe;
  std::filesystem::path out;
  std::filesystem::path calib;          // overrides the recipe's calibration.dataset
  uint64_t max_memory_bytes = 0;        // activation budget (0: unlimited); beyond it they spill to disk
  // NaN/Inf in a weight or a calibration statistic is an InvalidInput error
  // naming the tensor, unless this is set (then they go on as they are).
  bool allow_nonfinite = false;
  // Called after each decoder layer with (layers done, layers in all), in the
  // calling thread; it may throw to stop the run (nothing is left under `out`).
  std::function<void(int64_t, int64_t)> on_layer;
  // Keep a copy of the calibration file in the output (calibration.jsonl or
  // calibration.txt) and point the copied recipe at it: for data that lives
  // nowhere else (the Python module's list of strings).
  bool copy_calibration = false;
  // Continue an interrupted run to the same output from its last finished
  // layer (calibration/resume_state.h); without it a saved state is
  // discarded. Either way each finished layer is saved until the output is
  // committed.
  bool resume = false;
  // The command line or call, recorded in quantization_report.json.
  std::string invocation;
  // When set: the finished output, still staged (nothing is under `out` yet),
  // is evaluated against `model` on this text (eval::run_eval; `eval_max_chunks`
  // spans, 0 for all, eval_progress(done, total) counting them), and the
  // result goes into the summary and the report's "evaluation".
  std::filesystem::path eval_text;
  int64_t eval_max_chunks = 0;
  std::function<void(int64_t, int64_t)> eval_progress;
  // Where the weight quantizers run (GPTQ, RTN, FP8, NVFP4: quantizers/
  // device_quantizers.h); calibration forwards, AWQ's and SmoothQuant's
  // searches stay on the CPU. Not cpu: a recipe with the mse observer and
  // the tensor strategy is refused (Unsupported) before anything runs.
  device::Kind device = device::Kind::Cpu;
  // Called with the finished summary (report included) while the output is
  // still staged, just before it is committed under `out`; it may throw to
  // stop the run (nothing is left under `out`). The CLI prints there, so
  // that a failed write to stdout (`--json > /dev/full`) leaves no output.
  std::function<void(const QuantizeSummary&)> before_commit;
  // Stop after the plan (and, with mixed_precision, its search): nothing is
  // calibrated or written; the summary's dry_run holds what would be done
  // and its report only "mixed_precision" (when the recipe has the section).
  bool dry_run = false;
};

struct QuantizedLayerRecord {
  int64_t layer = 0, linears = 0;
  double seconds = 0, mean_error = 0, max_error = 0;  // relative output errors of its Linears
};

struct QuantizeSummary {
  int64_t linears = 0, layers = 0, samples = 0, tokens = 0;
  int64_t resumed_layers = 0;  // layers restored from an interrupted run
  double seconds = 0, mean_error = 0, max_error = 0;
  uint64_t output_bytes = 0;
  uint64_t peak_rss_bytes = 0;
  bool spilled = false;
  std::string format, method;
  std::vector<QuantizedLayerRecord> per_layer;  // in layer order
  nlohmann::ordered_json report;                // quantization_report.json as written
  std::optional<eval::EvalResult> evaluation;   // with QuantizeJob::eval_text
  std::string dry_run;      // QuantizeJob::dry_run: the plan as printed
  std::string timing_line;  // where the time went, one line: each stage, the layers' phases at their GFLOP/s, the machine's peak
};

// File name of the report written into every quantize output.
inline constexpr const char* kQuantizationReportFile = "quantization_report.json";

// Storage bits per weight of a quantized Linear: codes, scales, zero points,
// g_idx and NVFP4's global scale, over rows * cols.
double stored_bits_per_weight(const QuantizedTensor& q);

// log receives one line per layer (layer, time, reconstruction error) and notes.
QuantizeSummary quantize_model(const QuantizeJob& job, ThreadPool& pool, const std::function<void(const std::string&)>& log);

}  // namespace qf
