#include "calibration/vision_plan.h"

#include <algorithm>
#include <map>

#include "checkpoint/checkpoint_format.h"
#include "core/error.h"
#include "formats/hf/model_tensors.h"

namespace qf {

std::string vision_part(const std::string& module) {
  for (const char* p : {"multi_modal_projector.", "visual.merger."})
    if (module.compare(0, std::char_traits<char>::length(p), p) == 0) return "projector";
  return "tower";
}

std::vector<VisionLinear> plan_vision_linears(const Recipe& recipe, const ModelConfig& cfg, const Checkpoint& ck,
                                              const CheckpointFormat& format,
                                              const std::function<void(const std::string&)>& log) {
  std::vector<VisionLinear> out;
  if (!recipe.vision || (!recipe.vision->tower && !recipe.vision->projector)) return out;
  const VisionQuantSpec& spec = *recipe.vision;
  if (!cfg.vlm)
    throw invalid_input(spec.where, "vision: model_type '" + cfg.model_type +
                                        "' has no vision tower or projector to quantize (vision-language models only)");
  if (std::string(format.name()) != "compressed-tensors")
    throw unsupported(spec.where, std::string("vision: export format '") + format.name() +
                                      "' holds one scheme for the language model only; a quantized vision side is "
                                      "written as compressed-tensors config groups (export: {format: compressed-tensors})");
  const DType sdt = plan_scale_dtype(cfg);
  std::map<std::pair<std::string, int64_t>, std::vector<std::string>> fallbacks;  // (part, cols) -> modules
  std::map<std::pair<std::string, int64_t>, int64_t> group_of;
  for (const std::string& name : ck.names()) {
    const std::string module = is_vision_tensor(name) ? linear_weight_module(ck, name) : "";
    if (module.empty()) continue;
    const TensorInfo& info = ck.info(name);
    VisionLinear v;
    v.module = module;
    v.part = vision_part(module);
    const std::optional<ModifierSpec::Group>& g = v.part == "tower" ? spec.tower : spec.projector;
    if (!g) continue;
    if (!dtype_is_float(info.dtype))
      throw invalid_input(spec.where, "vision: tensor '" + name + "' is " + dtype_name(info.dtype) +
                                              "; the vision side is quantized from float weights");
    v.rows = info.shape[0];
    v.cols = info.shape[1];
    v.plan = planned_linear(*g);
    if (!g->scale_dtype_set) v.plan.weights.scale_dtype = sdt;
    if (v.plan.weights.strategy == QuantStrategy::Group && v.cols % v.plan.weights.group_size != 0) {
      v.note = std::to_string(v.cols) + " columns are not a multiple of the group size " +
               std::to_string(v.plan.weights.group_size) + ": one scale per output channel";
      fallbacks[{v.part, v.cols}].push_back(module);
      group_of[{v.part, v.cols}] = v.plan.weights.group_size;
      v.plan.weights.strategy = QuantStrategy::Channel;
      v.plan.weights.group_size = 0;
    }
    v.plan.weights.validate(v.plan.where, v.cols);
    out.push_back(std::move(v));
  }
  for (const auto& [key, modules] : fallbacks) {
    std::string names;
    for (size_t i = 0; i < modules.size() && i < 3; ++i) names += (i ? ", " : "") + modules[i];
    if (modules.size() > 3) names += ", ...";
    log("vision " + key.first + ": " + std::to_string(modules.size()) + " Linear" + (modules.size() > 1 ? "s" : "") +
        " with " + std::to_string(key.second) + " input columns (" + names + ") not divisible by the group size " +
        std::to_string(group_of[key]) + ": quantized with one scale per output channel instead");
  }
  if (out.empty())
    throw invalid_input(spec.where, "vision: the checkpoint has no Linear in the vision parts the section quantizes");
  return out;
}

std::vector<ExportGroup> vision_export_groups(const std::vector<VisionLinear>& v, const TensorNaming& naming) {
  std::vector<ExportGroup> groups;
  for (const VisionLinear& l : v) {
    const PlannedLinear& p = l.plan;
    auto same = [&](const ExportGroup& g) {
      return g.weights.describe() == p.weights.describe() && g.weights.scale_dtype == p.weights.scale_dtype &&
             g.act.has_value() == p.act.has_value() && (!g.act || g.act->describe() == p.act->describe());
    };
    auto it = std::find_if(groups.begin(), groups.end(), same);
    if (it == groups.end()) {
      ExportGroup g;
      g.weights = p.weights;
      g.act = p.act;
      groups.push_back(g);
      it = groups.end() - 1;
    }
    it->targets.push_back(naming.module_to_stored(l.module));
  }
  return groups;
}

}  // namespace qf
