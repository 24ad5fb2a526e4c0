// `quantforge quantize`: recipe -> calibration -> layer-by-layer RTN or GPTQ ->
// compressed-tensors (pack-quantized) or GPTQ checkpoint, written atomically.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "core/thread_pool.h"

namespace qf {

struct QuantizeJob {
  std::string model;                    // HF folder or cache id (float weights)
  std::filesystem::path recipe;
  std::filesystem::path out;
  std::filesystem::path calib;          // overrides the recipe's calibration.dataset
  uint64_t max_memory_bytes = 0;        // activation budget (0: unlimited); beyond it they spill to disk
  // NaN/Inf in a weight or a calibration statistic is an InvalidInput error
  // naming the tensor, unless this is set (then they go on as they are).
  bool allow_nonfinite = false;
};

struct QuantizeSummary {
  int64_t linears = 0, layers = 0, samples = 0, tokens = 0;
  double seconds = 0, mean_error = 0, max_error = 0;
  uint64_t output_bytes = 0;
  uint64_t peak_rss_bytes = 0;
  bool spilled = false;
  std::string format, method;
};

// log receives one line per layer (layer, time, reconstruction error) and notes.
QuantizeSummary quantize_model(const QuantizeJob& job, ThreadPool& pool, const std::function<void(const std::string&)>& log);

}  // namespace qf
