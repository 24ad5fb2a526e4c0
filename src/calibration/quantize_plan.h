// What `quantize` will do to each Linear of a model, decided and checked
// before any work: which recipe modifiers run (SmoothQuant, AWQ, then one
// quantizer), the scheme of every Linear, whether calibration data is
// needed, and whether the export format can hold the result.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "calibration/smoothing.h"
#include "checkpoint/checkpoint_format.h"
#include "device/device.h"
#include "quantizers/gptq.h"
#include "quantizers/rtn.h"
#include "quantizers/quant_scheme.h"
#include "recipe/recipe.h"
#include "runtime/linear.h"
#include "runtime/model.h"

namespace qf {

// How one Linear is quantized, resolved from its recipe group.
struct PlannedLinear {
  QuantScheme weights;                       // scale dtype resolved (the model's unless the recipe names one)
  std::optional<ActivationScheme> act;       // input quantizer; empty: weight-only
  RangeObserver observer = RangeObserver::MinMax;  // integer ranges (RTN, and GPTQ's per-group scales)
  MseOptions mse;                            // the mse observer's settings
  GptqOptions::ActOrder actorder = GptqOptions::ActOrder::None;  // GPTQ only
  std::string where;                         // "FILE:LINE:COL" of its recipe group, for messages
};

enum class QuantMethod { Rtn, Gptq };

struct QuantizePlan {
  const CheckpointFormat* format = nullptr;   // the recipe's export.format
  QuantMethod quantizer = QuantMethod::Rtn;   // GPTQModifier: GPTQ; QuantizationModifier (or AWQ's own scheme): RTN
  GptqOptions gptq;                           // block size and dampening (act-order and observer are per Linear)
  std::optional<SmoothQuantOptions> smoothquant;  // SmoothQuantModifier, run first
  std::optional<AwqOptions> awq;              // AWQModifier, run before the quantizer (group size resolved)
  std::map<std::string, PlannedLinear> linears;             // Linears to quantize, by module name
  std::map<std::string, PlannedLinear> awq_linears;         // the scheme AWQ's search assumes for each
  // What the format's config describes: the groups in recipe order, the
  // KV-cache scheme (set: FP8 KV-cache scales are calibrated and stored), dampening.
  ExportConfig export_config;
  bool needs_calibration = false;             // GPTQ, transforms, static activations, NVFP4 inputs, KV scales
  bool needs_activation_ranges = false;       // static activation scales or NVFP4 input global scales
  std::string calibration_reason;             // what needs it, for the error when none is given
  std::string method;                         // "gptq", "rtn", "awq+rtn", "smoothquant+gptq", ...
  // Some {q,k,v} or {gate,up} set is quantized with NVFP4 weights: its
  // members share one weight global scale (computed from the set's amax).
  bool fused_nvfp4 = false;
};

// Throws (InvalidInput / Unsupported, naming the recipe position) for modifier
// orders other than [SmoothQuant] [AWQ] quantizer, group sizes that do not
// divide a Linear, schemes the export format cannot hold, and a layer whose
// q/k/v (or gate/up) are not all NVFP4 when one of them is: vLLM fuses each
// set into one Linear with one global scale, and llm-compressor refuses such
// a set too (its fuse_weight_observers asserts every member is TENSOR_GROUP).
QuantizePlan make_quantize_plan(const Recipe& recipe, const rt::Model& model);

// A resolved recipe group as the pipeline uses it.
PlannedLinear planned_linear(const ModifierSpec::Group& g);

// The model's dtype (config.json torch_dtype): scales and KV scales are stored in it.
DType plan_scale_dtype(const ModelConfig& c);

// Round-to-nearest in the planned scheme: integer (minmax or mse observer),
// FP8 or NVFP4. nvfp4_global_amax >= 0: the amax NVFP4's global scale is
// computed from (the fused set's, see LinearToQuantize::fused_weight_amax);
// < 0: the weight's own. Ignored by the other schemes. `where_to`: the CPU
// reference or a device build (quantizers/device_quantizers.h).
QuantizedTensor round_to_nearest(const float* w, int64_t rows, int64_t cols, const PlannedLinear& p,
                                 float nvfp4_global_amax = -1, device::Kind where_to = device::Kind::Cpu);

// The Linear SmoothQuant's strength search evaluates: the planned scheme by
// round-to-nearest, with the planned input quantizer (static scales and NVFP4
// global scales are taken from the trial input's own range at forward time,
// i.e. per-token dynamic scales stand in for static ones). Returns a dense
// Linear when the module is not quantized.
std::shared_ptr<rt::Linear> plan_trial_linear(const QuantizePlan& plan, const std::string& name, const float* w,
                                              int64_t rows, int64_t cols, const std::vector<float>& bias);

}  // namespace qf
