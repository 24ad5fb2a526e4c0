// A vision-language model's vision tower and projector, quantized on request
// (the recipe's `vision:` section, recipe.h VisionQuantSpec): which Linears,
// in which scheme, and the config groups they are written as. They are
// rounded to nearest from the stored weights when the output is exported
// (quantize_stage_vision.cpp); nothing of the language model's calibration
// depends on them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "calibration/quantize_plan.h"
#include "formats/hf/model_config.h"
#include "formats/safetensors.h"
#include "formats/tensor_naming.h"
#include "recipe/recipe.h"

namespace qf {

struct VisionLinear {
  std::string module;      // working name, e.g. "visual.blocks.0.attn.qkv"
  std::string part;        // "tower" or "projector"
  int64_t rows = 0, cols = 0;
  PlannedLinear plan;      // the model's scale dtype; per channel where the group size does not divide cols
  std::string note;        // why the scheme differs from the recipe's (the fallback), empty otherwise
};

// "projector" for a projector or merger module ("multi_modal_projector.",
// "visual.merger."), "tower" for the rest of the vision side (working names).
std::string vision_part(const std::string& module);

// The vision Linears the recipe's `vision:` section quantizes, in checkpoint
// order (empty without the section or with both parts kept). A scheme whose
// group size does not divide a Linear's columns falls back to one scale per
// output channel for that Linear, said by one `log` line per column count.
// InvalidInput (at the section) for a model without a vision side;
// Unsupported for an export format other than compressed-tensors (the only
// one with per-module schemes beside an ignore list).
std::vector<VisionLinear> plan_vision_linears(const Recipe& recipe, const ModelConfig& cfg, const Checkpoint& ck,
                                              const CheckpointFormat& format,
                                              const std::function<void(const std::string&)>& log);

// The config groups the vision Linears are written as: one per distinct
// (weights, activations) scheme in order of first use, targeting each
// module by its stored name (exact names outrank the language model's
// class-name targets in compressed-tensors' and vLLM's matching).
std::vector<ExportGroup> vision_export_groups(const std::vector<VisionLinear>& v, const TensorNaming& naming);

}  // namespace qf
