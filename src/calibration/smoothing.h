// Equivalent smoothing transforms of one decoder layer for the sequential
// pipeline: activation-aware scaling (AWQ, with its weight clip search) and
// SmoothQuant. Both fold per-input-channel scales s into a layer without
// changing its float function:
//   norm -> Linears:     norm weight / s, every balance Linear W[:, j] * s[j];
//   Linear -> Linear:    the previous Linear's output rows (and bias) / s, the
//                        balance Linear's input columns * s.
// The Linears touched become dense F32 Linears (biases kept). docs/smoothing.md
// describes the algorithms as implemented and how they differ from AutoAWQ,
// llm-compressor and mit-han-lab/smoothquant.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "device/device.h"
#include "runtime/model.h"

namespace qf {

// The calibration data of one layer.
struct LayerCalib {
  const std::vector<std::vector<int32_t>>* samples = nullptr;  // token ids of each sequence (positions 0..len-1)
  std::function<std::vector<float>(size_t sample)> input;      // hidden states entering the layer, [len, hidden]
  // Per sample, its multimodal rotary positions (image calibration); nullptr: text.
  const std::vector<rt::MultimodalInputs>* multimodal = nullptr;
};

// Pseudo-quantizes a weight the way the following quantizer will (dequantized
// Q(W), rows * cols values). An empty result means the Linear will not be
// quantized.
using FakeQuantFn =
    std::function<std::vector<float>(const std::string& linear_name, const float* w, int64_t rows, int64_t cols)>;
// Builds the quantized Linear (weights and activations) SmoothQuant's alpha
// search evaluates; nullptr leaves that Linear in float.
using TrialLinearFn = std::function<std::shared_ptr<rt::Linear>(
    const std::string& linear_name, const float* w, int64_t rows, int64_t cols, const std::vector<float>& bias)>;

// The four smoothing mappings of a Llama-family layer, in the order AWQ applies them.
// In a sparse (mixture-of-experts) layer the MLP mappings are
//   FfnNormToGateUp: post_attention_layernorm -> the router, every expert's
//                    gate and up (the shared expert's too) and the shared-expert
//                    gate; the router and that gate are scaled, never quantized;
//   UpToDown:        one per expert: that expert's up -> its down.
enum class Mapping {
  AttnNormToQKV,    // input_layernorm -> q_proj, k_proj, v_proj
  VToO,             // v_proj -> o_proj (only without GQA: v_proj and o_proj weights of equal shape)
  FfnNormToGateUp,  // post_attention_layernorm -> gate_proj, up_proj
  UpToDown,         // up_proj -> down_proj
};
const char* mapping_name(Mapping m);  // "input_layernorm->q,k,v", ...
// Whether the mapping exists in layers of this model (VToO needs q_dim == kv_dim).
bool mapping_applies(const rt::Model& model, Mapping m);
// Scales the mapping takes in a dense layer: hidden_size, q_dim (= kv_dim) or
// intermediate_size.
int64_t mapping_width(const rt::Model& model, Mapping m);

// Folds s (all > 0 and finite; as many as the balance Linears' input columns)
// into layer li. `expert` names the expert of a sparse layer's UpToDown (a
// routed index or rt::kSharedExpert) and is rt::kNoExpert otherwise. Throws
// InvalidInput for a wrong size, a non-positive scale, a mapping that does not
// apply to the model or a missing or needless expert.
void apply_smoothing_scales(rt::Model& model, int64_t li, Mapping which, const std::vector<float>& s,
                            int64_t expert = rt::kNoExpert);

// How AWQ scores a mapping's candidate scales:
//   Module  the mean squared change of the inspected module's output over the
//           calibration tokens (AutoAWQ's and llm-compressor's objective): the
//           attention block for the q/k/v mapping, the MLP for gate/up, the
//           Linear itself for v -> o and up -> down;
//   Linear  the mean squared change of every balance Linear's own output (the
//           AWQ paper's objective, its Eq. 4), computed from the Gram matrix of
//           the Linears' common input without running them.
// The Linear -> Linear mappings score the same either way (one Linear is its
// own module); they always use the Gram matrix. Linear is the default on the
// CPU (docs/calibration.md compares the two); the device evaluations score
// modules only.
enum class AwqLoss { Module, Linear };

struct AwqOptions {
  int n_grid = 20;               // ratios i / n_grid, i = 0 .. n_grid - 1
  // Unset: Linear on the CPU, Module on a device. Linear on a device is Unsupported.
  std::optional<AwqLoss> loss;
  bool duo_scaling = true;       // s = x_mean^r / (w_mean^(1-r) + 1e-4); false: s = x_mean^r
  int64_t group_size = 128;      // the fake quantizer's group size (w_mean and the clip groups); <= 0: whole row
  // Also evaluates s = 1 (no scaling) and keeps it unless a grid point is
  // strictly better (AutoAWQ and llm-compressor only search the grid).
  bool include_identity = true;
  bool apply_clip = true;        // AutoAWQ's clip search on every Linear but q_proj / k_proj
  int64_t clip_n_grid = 20;
  double clip_max_shrink = 0.5;
  int64_t clip_n_sample_tokens = 512;
  // Sparse layers: every calibration token goes through every expert for
  // the per-expert statistics (up -> down and the clip search), as
  // calibration.moe_calibrate_all_experts does for the quantizer.
  bool moe_calibrate_all_experts = false;
  // Where the layer runs for the statistics, the scale search's candidates
  // and the clip search's errors (runtime/device_runtime.h's
  // DeviceSmoothingEval); the search logic is the same code either way.
  // Mixture-of-experts models run on the CPU only.
  device::Kind device = device::Kind::Cpu;
};

struct SmoothQuantOptions {
  double alpha = 0.5;
  bool search = false;  // pick alpha per layer from alpha_grid (needs a TrialLinearFn)
  std::vector<double> alpha_grid = {0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95};
  // Where the layer runs for the statistics and the alpha search's candidates.
  device::Kind device = device::Kind::Cpu;
};

struct SmoothingReport {
  std::vector<std::string> lines;  // one per mapping / clip / alpha search, human-readable
  // Per mapping searched by AWQ (in order): the chosen ratio (-1: identity or
  // skipped) and the inspected module's MSE without scaling and with the chosen one.
  struct Entry {
    std::string what;
    double ratio = -1;
    double loss_before = 0, loss_after = 0;
  };
  std::vector<Entry> entries;
};

// AWQ on layer li (see docs/smoothing.md). The layer is modified in place:
// scales folded, then (apply_clip) weights clamped by the clip search.
SmoothingReport awq_layer(rt::Model& model, int64_t li, const LayerCalib& calib, const FakeQuantFn& fake_quant,
                          const AwqOptions& o, ThreadPool& pool);

// SmoothQuant on layer li: input_layernorm -> q/k/v and post_attention_layernorm
// -> gate/up (a sparse layer: the router and every expert's gate/up, w_max
// over the experts') with s = act_max^a / w_max^(1-a). With o.search, a is the grid
// value minimising the MSE of the layer's output when all its Linears are
// replaced by trial(...) against the float layer. `trial` may be empty when
// not searching (then no loss is reported).
SmoothingReport smoothquant_layer(rt::Model& model, int64_t li, const LayerCalib& calib, const SmoothQuantOptions& o,
                                  const TrialLinearFn& trial, ThreadPool& pool);

}  // namespace qf
