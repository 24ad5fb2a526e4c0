// The anyres geometry of LLaVA-NeXT (anyres.h), in the double arithmetic
// Python does it in: the same operations in the same order give the same
// truncations.
#pragma GCC optimize("fp-contract=off")
#include "runtime/vision/anyres.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace qf::rt {

std::pair<int64_t, int64_t> select_best_resolution(int64_t height, int64_t width, const GridPinpoints& pinpoints) {
  std::pair<int64_t, int64_t> best{0, 0};
  int64_t max_effective = 0;
  double min_wasted = std::numeric_limits<double>::infinity();
  for (const auto& [h, w] : pinpoints) {
    const double scale = std::min(static_cast<double>(w) / static_cast<double>(width),
                                  static_cast<double>(h) / static_cast<double>(height));
    const auto down_w = static_cast<int64_t>(static_cast<double>(width) * scale);
    const auto down_h = static_cast<int64_t>(static_cast<double>(height) * scale);
    const int64_t effective = std::min(down_w * down_h, width * height);
    const auto wasted = static_cast<double>(w * h - effective);
    if (effective > max_effective || (effective == max_effective && wasted < min_wasted)) {
      max_effective = effective;
      min_wasted = wasted;
      best = {h, w};
    }
  }
  return best;
}

std::pair<int64_t, int64_t> anyres_fit_size(int64_t height, int64_t width, std::pair<int64_t, int64_t> target) {
  const auto [th, tw] = target;
  const double scale_w = static_cast<double>(tw) / static_cast<double>(width);
  const double scale_h = static_cast<double>(th) / static_cast<double>(height);
  if (scale_w < scale_h)
    return {std::min(static_cast<int64_t>(std::ceil(static_cast<double>(height) * scale_w)), th), tw};
  return {th, std::min(static_cast<int64_t>(std::ceil(static_cast<double>(width) * scale_h)), tw)};
}

int64_t trunc_round7(double x) {
  const double f = std::floor(x);
  return static_cast<int64_t>(x - f >= 0.99999995 ? f + 1 : f);
}

UnpadWindow anyres_unpad(int64_t height, int64_t width, int64_t cur_h, int64_t cur_w) {
  UnpadWindow u{0, cur_h, 0, cur_w};
  const double original_aspect = static_cast<double>(width) / static_cast<double>(height);
  const double current_aspect = static_cast<double>(cur_w) / static_cast<double>(cur_h);
  if (original_aspect > current_aspect) {
    const double scale = static_cast<double>(cur_w) / static_cast<double>(width);
    const int64_t pad = (cur_h - trunc_round7(static_cast<double>(height) * scale)) / 2;
    u.top = pad;
    u.bottom = cur_h - pad;
  } else {
    const double scale = static_cast<double>(cur_h) / static_cast<double>(height);
    const int64_t pad = (cur_w - trunc_round7(static_cast<double>(width) * scale)) / 2;
    u.left = pad;
    u.right = cur_w - pad;
  }
  return u;
}

int64_t llava_next_feature_count(int64_t height, int64_t width, const GridPinpoints& pinpoints, int64_t tile,
                                 int64_t patch) {
  if (pinpoints.empty() || tile < 1 || patch < 1)
    throw invalid_input("llava_next", "no image_grid_pinpoints or no tile size to count an image's rows with");
  const auto [bh, bw] = select_best_resolution(height, width, pinpoints);
  const int64_t side = tile / patch;  // patches along a tile's side
  int64_t cur_h = side * (bh / tile), cur_w = side * (bw / tile);
  if (static_cast<double>(width) / static_cast<double>(height) >
      static_cast<double>(cur_w) / static_cast<double>(cur_h)) {
    const int64_t new_h =
        trunc_round7(static_cast<double>(height) * (static_cast<double>(cur_w) / static_cast<double>(width)));
    cur_h -= (cur_h - new_h) / 2 * 2;
  } else {
    const int64_t new_w =
        trunc_round7(static_cast<double>(width) * (static_cast<double>(cur_h) / static_cast<double>(height)));
    cur_w -= (cur_w - new_w) / 2 * 2;
  }
  return cur_h * cur_w + cur_h + side * side;
}

}  // namespace qf::rt
