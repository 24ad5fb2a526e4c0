// The sequential calibration pipeline: one decoder layer at a time.
//
// For layer l, the hidden states entering it (one [len, hidden] array per
// calibration sequence, produced by the already-quantized layers before it)
// are run through the layer with an observer that accumulates the Hessian
// H = 2/n sum x x^T of every Linear's input (q/k/v share one, as do
// gate/up). Each Linear is then quantized by the callback, replaced in the
// model by its packed form, and the quantized layer is run again on the same
// inputs to produce the next layer's. Memory: the model, the hidden states of
// the calibration set, and one layer's Hessians.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "calibration/pipeline_times.h"
#include "core/thread_pool.h"
#include "device/device.h"
#include "quantizers/act_quant.h"
#include "quantizers/gptq.h"
#include "quantizers/quant_scheme.h"
#include "runtime/model.h"

namespace qf {

// What the callback gets for one Linear.
struct LinearToQuantize {
  std::string name;      // Hugging Face module name: model.layers.3.self_attn.q_proj
  int64_t layer = 0;
  const std::vector<float>* weight = nullptr;  // [rows * cols] f32
  int64_t rows = 0, cols = 0;
  const HessianAccumulator* hessian = nullptr;  // nullptr when run without calibration (RTN)
  // Range of the Linear's input over the calibration tokens (observe_ranges);
  // 0, 0 when not observed.
  float act_min = 0, act_max = 0;
  // With SequentialOptions::fused_weight_amax: the largest |w| over the float
  // weights of the Linears vLLM fuses with this one ({q,k,v} -> qkv_proj,
  // {gate,up} -> gate_up_proj), taken after the layer's transforms, right
  // before the first of them is quantized. -1 for o_proj and down_proj, when
  // not asked for, or when a weight is not finite.
  float fused_weight_amax = -1;
  // An expert's Linear (sparse layers): the calibration tokens its statistics
  // came from (-1 for the other Linears). With GPTQ, an expert that saw none
  // has no Hessian (round-to-nearest), and one that saw fewer tokens than its
  // input columns gets dampening_scale 10; `note` says so for the report.
  int64_t expert_tokens = -1;
  double dampening_scale = 1.0;
  std::string note;
};

struct QuantizedLinearResult {
  std::string name;
  QuantizedTensor q;
  double error = 0;      // relative output error estimate sum (dW^2 diag H) / sum (W^2 diag H)
  double seconds = 0;
  std::string note;      // e.g. a GPTQ fallback
  double flops = 0;      // floating-point operations of the quantizer (GPTQ's factor and column loop; 0: not counted)
  int64_t expert_tokens = -1;  // an expert's Linear: the calibration tokens its statistics came from
  std::optional<ActQuantParams> act;  // the input quantizer, when activations are quantized
};

// Returns the quantized form, or nullopt to leave the Linear as it is.
using QuantizeFn = std::function<std::optional<QuantizedLinearResult>(const LinearToQuantize&)>;
// Called after each layer with the layer index, its quantized Linears (to be
// exported now: the pipeline keeps nothing of them) and the layer's wall time.
using LayerDoneFn = std::function<void(int64_t, std::vector<QuantizedLinearResult>&, double)>;

struct SequentialOptions {
  // Collect Hessians (and weight the reported error by diag(H), the input
  // energy of each column); false: no capture pass, no Hessians, plain
  // relative weight error (for methods run without calibration, RTN).
  bool hessian_weighted_error = true;
  // Bytes the inter-layer hidden states may take in memory (0: no limit);
  // beyond it they are spilled to disk, zstd-compressed (ActivationStore).
  uint64_t max_memory_bytes = 0;
  // Where spilled activations go: a folder ".NAME.spill.HOST.PID.RAND" beside
  // this path (quantize passes its output), or under $TMPDIR when empty.
  std::filesystem::path spill_beside;
  // Record each Linear's input range in the capture pass (static activation
  // scales, NVFP4 input global scales).
  bool observe_ranges = false;
  // Called for each layer before its capture pass, with the calibration token
  // ids and a loader of the hidden states entering the layer (sample s ->
  // [len, hidden]); it may rewrite the layer's float weights (SmoothQuant, AWQ).
  std::function<void(int64_t layer, const std::vector<std::vector<int32_t>>& samples,
                     const std::function<std::vector<float>(size_t)>& input)>
      transform;
  // When set, receives per layer the largest |K| (after RoPE) and |V| the
  // quantized layer produces on the calibration set (FP8 KV-cache scales).
  std::vector<std::pair<float, float>>* kv_amax = nullptr;
  // Fill LinearToQuantize::fused_weight_amax (NVFP4 global scales shared by
  // the Linears vLLM fuses).
  bool fused_weight_amax = false;
  // Resuming: layers [0, resume_layers) were quantized by an earlier run.
  // For each, restore(layer) puts its saved weights into the model (and
  // hands its saved results on); the pipeline then only runs the layer's
  // forward to rebuild the hidden states entering the next one. Neither
  // transform, quantize nor layer_done is called for them.
  int64_t resume_layers = 0;
  std::function<void(int64_t layer)> restore;
  // Where the layers run: the CPU runtime, or (host, cuda) the device layer
  // pass (runtime/device_runtime.h), which also accumulates the Hessians on
  // the device. The hidden states between layers stay on the device when
  // they fit (hidden_states_on_device), else in the ActivationStore (host
  // memory, spilled to disk beyond max_memory_bytes). The transform callback
  // (AWQ, SmoothQuant) gets each layer's inputs on the host either way.
  device::Kind device = device::Kind::Cpu;
  // On a GPU, the device memory the rest of the run needs (the layer pass,
  // GPTQ, the smoothing searches): the hidden states stay on the device
  // only when they fit beside it (hidden_states_on_device).
  uint64_t device_reserve_bytes = 0;
  // Sparse layers: each routed expert's statistics (Hessians, input ranges)
  // come from every calibration token instead of the tokens routed to it
  // (llm-compressor's moe_calibrate_all_experts). The layer's output, and
  // so the next layer's input, still follows the router.
  bool moe_calibrate_all_experts = false;
  // Called once per sparse layer with a line giving the calibration tokens
  // each expert's statistics came from.
  std::function<void(const std::string&)> log;
  // The capture and propagation passes (and each expert's rows) run the
  // layer's Linears in bf16 (rt::make_bf16_linear): weights and inputs
  // rounded to bf16, products summed in f32. Linears that quantize their
  // input, routers, attention and norms stay as they are. CPU only.
  bool bf16 = false;
  // Keep one layer in memory (quantize): once a layer is handed to
  // layer_done, its quantized Linears are replaced by stand-ins holding only
  // their shape and bias (rt::make_released_linear), and the mapped pages
  // of the model's float weights are given back as each is done with (the
  // embedding's after the samples are embedded). The model cannot run
  // afterwards.
  bool release_done_layers = false;
  // When set, receives each phase's seconds and counted flops, added up
  // over the layers (calibration/pipeline_times.h). On a device the
  // Hessians are summed inside the capture pass and count as forward.
  PipelineTimes* times = nullptr;
  // Multimodal samples (image calibration of a vision-language model): per
  // sample, its image rows and rotary positions (an entry without inputs is
  // a text sample). nullptr: every sample is text. CPU only.
  const std::vector<rt::MultimodalInputs>* multimodal = nullptr;
};

// Whether the pipeline keeps the calibration set's hidden states (`bytes`
// in all) on the device between layers instead of in the ActivationStore:
// never on the CPU; on the host build when they fit within max_memory_bytes
// (0: always); on a GPU when they fit, with device_reserve_bytes, in 90% of
// its free memory. Otherwise each sequence crosses to the device and back
// once per pass.
bool hidden_states_on_device(const SequentialOptions& o, uint64_t bytes);

// Which of the fused sets a layer Linear belongs to: 0 for q/k/v (vLLM's
// qkv_proj), 1 for gate/up (gate_up_proj), -1 for o_proj and down_proj.
int fused_set_of(rt::LinearObserver::Slot slot);

// Quantizes `model` in place (its Linears become quantized Linears, with the
// input quantizer the callback returns), handing each layer's
// quantized Linears to layer_done.
void run_sequential(rt::Model& model, const std::vector<std::vector<int32_t>>& samples,
                    const QuantizeFn& quantize, ThreadPool& pool, const LayerDoneFn& layer_done = {},
                    const SequentialOptions& opts = {});

}  // namespace qf
