// What `quantize` holds in host memory, estimated before it starts from the
// model's shapes, the plan and the calibration set, and printed up front
// (docs/calibration.md, "Memory", derives each term and compares the sum
// with measured peaks). The pipeline keeps one decoder layer at a time: the
// model's weights stay mapped from their files and each layer's pages are
// released once it is done, so the peak does not grow with the number of
// layers; what grows is the calibration set.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibration/quantize_plan.h"
#include "runtime/model.h"

namespace qf {

struct QuantizeMemory {
  uint64_t activations = 0;    // the hidden states between layers held in memory (all of them, or the --max-memory budget)
  uint64_t layer_weights = 0;  // the largest decoder layer's stored weights, read in while it is worked on
  uint64_t layer_output = 0;   // the largest layer's quantized form, held until it is written
  uint64_t forward = 0;        // one sample's temporaries through one layer (and an MoE layer's MLP inputs)
  uint64_t solve = 0;          // the largest Linear's work: f32 weight, GPTQ's double copy, the Hessians alive, the factor
  uint64_t search = 0;         // AWQ's or SmoothQuant's copies of a layer's calibration activations
  uint64_t fixed = 0;          // the embedding rows read, norms, the program's own
  uint64_t total() const;
  nlohmann::ordered_json json() const;
  std::string line() const;  // "about 1.2 GiB at the peak: ..."
};

QuantizeMemory estimate_quantize_memory(const rt::Model& model, const QuantizePlan& plan,
                                        const std::vector<std::vector<int32_t>>& samples, uint64_t max_memory_bytes);

}  // namespace qf
