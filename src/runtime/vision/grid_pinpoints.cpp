// image_grid_pinpoints read from config.json or preprocessor_config.json and
// checked against the tile size.
#include "core/error.h"
#include "runtime/vision/anyres.h"

namespace qf::rt {

GridPinpoints parse_grid_pinpoints(const nlohmann::json& v, const std::string& where, const std::string& key) {
  GridPinpoints out;
  bool ok = v.is_array() && !v.empty();
  for (const nlohmann::json& pair : ok ? v : nlohmann::json::array()) {
    ok = ok && pair.is_array() && pair.size() == 2;
    for (const nlohmann::json& e : ok ? pair : nlohmann::json::array())
      ok = ok && e.is_number_integer() && e.get<int64_t>() > 0 && e.get<int64_t>() <= (int64_t(1) << 20);
    if (!ok) break;
    out.emplace_back(pair[0].get<int64_t>(), pair[1].get<int64_t>());
  }
  if (!ok)
    throw invalid_input(where, "'" + key + "' must be a non-empty list of [height, width] pairs of positive "
                                           "integers, got " + printable_text(v.dump()));
  return out;
}

void check_grid_pinpoints(const GridPinpoints& pinpoints, int64_t tile, const std::string& where,
                          const std::string& what) {
  for (const auto& [h, w] : pinpoints)
    if (h % tile != 0 || w % tile != 0)
      throw invalid_input(where, "image_grid_pinpoints' [" + std::to_string(h) + ", " + std::to_string(w) +
                                     "] is not a whole number of " + std::to_string(tile) + "x" +
                                     std::to_string(tile) + " tiles (" + what + ")");
}

std::string pinpoints_str(const GridPinpoints& pinpoints) {
  std::string s = "[";
  for (size_t i = 0; i < pinpoints.size(); ++i)
    s += (i ? ", [" : "[") + std::to_string(pinpoints[i].first) + ", " + std::to_string(pinpoints[i].second) + "]";
  return s + "]";
}

}  // namespace qf::rt
