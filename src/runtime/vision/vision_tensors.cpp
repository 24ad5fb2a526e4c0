// Reading a vision tower's weights: every tensor checked against the shape
// its config implies before any value is used, so a checkpoint that does not
// match its config.json fails with the tensor's name instead of computing
// garbage or reading out of bounds.
#include <cstdlib>

#include <filesystem>

#include "checkpoint/checkpoint_format.h"
#include "core/error.h"
#include "formats/safetensors.h"
#include "runtime/vision/vision_ops.h"

namespace qf::rt::vision {

VisionTensors::VisionTensors(const ModelConfig& cfg, const Checkpoint& ck, std::string where)
    : ck_(ck), where_(std::move(where)) {
  if (!cfg.quantization_config) return;
  OpenedConfig opened;
  format_ = &open_checkpoint_format(where_, *cfg.quantization_config,
                                    (std::filesystem::path(where_) / "config.json").string(), &opened);
  qcfg_ = std::move(opened.qcfg);
}

bool VisionTensors::has(const std::string& name) const { return ck_.contains(name); }

void VisionTensors::check_if_present(const std::string& name, const Shape& shape, const std::string& why) const {
  if (!ck_.contains(name)) return;
  const TensorInfo& info = ck_.info(name);
  // An FP8 weight of a quantized Linear keeps the Linear's shape; its
  // format reads it (load_linear).
  const bool quantized_weight = format_ && name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0 &&
                                ck_.contains(name.substr(0, name.size() - 7) + ".weight_scale");
  if (!quantized_weight && info.dtype != DType::F32 && info.dtype != DType::F16 && info.dtype != DType::BF16)
    throw unsupported(where_, "tensor '" + name + "' is " + dtype_name(info.dtype) +
                                  "; the vision tower is read from float32, float16 or bfloat16 weights only");
  if (info.shape != shape)
    throw invalid_input(where_, "tensor '" + name + "' has shape " + shape_str(info.shape) + ", but " + why +
                                    " imply " + shape_str(shape));
}

std::vector<float> VisionTensors::get(const std::string& name, const Shape& shape, const std::string& why) const {
  if (!ck_.contains(name))
    throw not_found(where_, "tensor '" + name + "' of the vision tower is missing (expected " + shape_str(shape) +
                                " from " + why + ")");
  check_if_present(name, shape, why);
  return ck_.tensor(name).to_f32_vector();
}

void check_layer_count(const Checkpoint& ck, const std::string& prefix, int64_t layers, const std::string& where,
                       const std::string& config_key) {
  for (const std::string& name : ck.names()) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const char* p = name.c_str() + prefix.size();
    char* end = nullptr;
    const long long i = std::strtoll(p, &end, 10);
    if (end == p || *end != '.') continue;
    if (i >= layers)
      throw invalid_input(where, "tensor '" + name + "' belongs to block " + std::to_string(i) + ", but " + config_key +
                                     " is " + std::to_string(layers));
  }
}

DenseLinear load_linear(const VisionTensors& t, const std::string& prefix, int64_t out, int64_t in, bool bias,
                        const std::string& why) {
  DenseLinear l;
  l.in = in;
  l.out = out;
  std::optional<ReadLinear> q;
  if (t.format()) q = t.format()->read_linear(t.checkpoint(), prefix, t.quantization_config());
  if (q) {
    if (q->q.rows != out || q->q.cols != in)
      throw invalid_input(t.where(), "quantized Linear '" + prefix + "' is [" + std::to_string(q->q.rows) + ", " +
                                         std::to_string(q->q.cols) + "], but " + why + " imply [" +
                                         std::to_string(out) + ", " + std::to_string(in) + "]");
    l.w = q->q.dequantize();
    l.act = q->act;
  } else {
    l.w = t.get(prefix + ".weight", {out, in}, why);
  }
  if (bias) l.b = t.get(prefix + ".bias", {out}, why);
  return l;
}

Norm load_layer_norm(const VisionTensors& t, const std::string& prefix, int64_t d, float eps, const std::string& why) {
  Norm n;
  n.w = t.get(prefix + ".weight", {d}, why);
  n.b = t.get(prefix + ".bias", {d}, why);
  n.eps = eps;
  return n;
}

Norm load_rms_norm(const VisionTensors& t, const std::string& prefix, int64_t d, float eps, const std::string& why) {
  Norm n;
  n.w = t.get(prefix + ".weight", {d}, why);
  n.eps = eps;
  return n;
}

}  // namespace qf::rt::vision
