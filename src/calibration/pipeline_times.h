// Where the sequential pipeline's time goes, phase by phase, with the
// floating-point operations each phase did (counted from the shapes, not
// from the kernels: useful work only), so that a report can state the
// GFLOP/s each phase achieved next to the machine's peak
// (core/peak_flops.h).
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "core/simd.h"
#include "formats/hf/model_config.h"

namespace qf {

struct PhaseCount {
  double seconds = 0;
  double flops = 0;
  // GFLOP/s, or 0 when the phase did no counted work or took no time.
  double gflops() const { return seconds > 0 && flops > 0 ? flops / seconds / 1e9 : 0.0; }
  void add(double s, double f) { seconds += s, flops += f; }
};

struct PipelineTimes {
  PhaseCount search;     // AWQ's and SmoothQuant's searches (the transform callback)
  PhaseCount forward;    // the capture pass through each layer, without the Hessian updates
  PhaseCount hessian;    // the Hessian updates (capture pass and experts)
  PhaseCount solve;      // quantizing each Linear (GPTQ's factor and column loop, RTN, FP8, ...)
  PhaseCount propagate;  // the quantized layer's forward, making the next layer's inputs
  PhaseCount restore;    // resumed layers: their forward only
  double export_seconds = 0;  // handing each layer's results on (the writer, the resume state)
};

// Floating-point operations of one decoder layer's forward over a sequence
// of `tokens` positions starting at 0: every Linear (2 per weight and
// token; in a sparse layer the router, the shared expert and
// num_experts_per_tok experts a token), attention's two products (2 per
// head dimension, query and visible key each), nothing for the norms,
// RoPE, softmax and activations.
double layer_forward_flops(const ModelConfig& c, int64_t layer, int64_t tokens, int64_t window);

// The JSON of a phase: {"seconds", "gflop", "gflops"} (gflops null when
// nothing was counted).
nlohmann::ordered_json phase_json(const PhaseCount& p);

}  // namespace qf
