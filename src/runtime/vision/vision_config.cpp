// vision_config readers with transformers' defaults: a config.json written by
// transformers may leave out any key whose value is the default (Qwen2-VL's
// leaves out hidden_act, llava-1.5's layer_norm_eps), so absence is normal;
// a value of the wrong type is an error naming the key.
#include <cmath>

#include "core/error.h"
#include "runtime/vision/vision_ops.h"

namespace qf::rt::vision {

using nlohmann::json;

int64_t config_int(const json& vc, const std::string& key, int64_t fallback, const std::string& where) {
  auto it = vc.find(key);
  if (it == vc.end() || it->is_null()) return fallback;
  if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > (int64_t(1) << 24))
    throw invalid_input(where, "vision_config." + key + " must be a positive integer, got " +
                                   printable_text(it->dump()));
  return it->get<int64_t>();
}

double config_number(const json& vc, const std::string& key, double fallback, const std::string& where) {
  auto it = vc.find(key);
  if (it == vc.end() || it->is_null()) return fallback;
  if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() <= 0)
    throw invalid_input(where, "vision_config." + key + " must be a positive number, got " +
                                   printable_text(it->dump()));
  return it->get<double>();
}

std::string config_string(const json& vc, const std::string& key, const std::string& fallback,
                          const std::string& where) {
  auto it = vc.find(key);
  if (it == vc.end() || it->is_null()) return fallback;
  if (!it->is_string())
    throw invalid_input(where, "vision_config." + key + " must be a string, got " + printable_text(it->dump()));
  return it->get<std::string>();
}

}  // namespace qf::rt::vision
