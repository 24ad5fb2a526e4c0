// LLaVA-NeXT's "anyres" geometry, as transformers computes it: which
// resolution an image is tiled at, how large it is drawn inside it, which
// part of the tiles' feature grid is the image (the rest is padding), and
// how many rows the image becomes. The image processor, the tower's packing
// and the prompt's image-token count all follow from these.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "runtime/vision/image_preprocess.h"

namespace qf::rt {

// image_processing_utils.select_best_resolution: the (height, width) of
// `pinpoints` keeping the most of the image's pixels once it is scaled to fit
// (min(w_t / w, h_t / h), each side truncated), ties broken by the least
// wasted area, then by list order. `pinpoints` must not be empty.
std::pair<int64_t, int64_t> select_best_resolution(int64_t height, int64_t width, const GridPinpoints& pinpoints);

// image_processing_utils.get_patch_output_size: the image's size scaled to
// fit `target` (height, width): the side with the smaller scale fills the
// target, the other is ceil(side * scale), at most the target's.
std::pair<int64_t, int64_t> anyres_fit_size(int64_t height, int64_t width, std::pair<int64_t, int64_t> target);

// Python's int(round(x, 7)) for a non-negative x: x truncated, except that a
// value within 5e-8 below an integer becomes that integer (the rounding to 7
// decimals that transformers applies before truncating, so that 5.9999999...
// from a division counts as 6).
int64_t trunc_round7(double x);

// modeling_llava_next.unpad_image on a feature grid of cur_h x cur_w (the
// tiles' patch rows side by side): the rows [top, bottom) and columns [left,
// right) that hold the original height x width image; the padding removed
// from one axis only, the same amount from both ends.
struct UnpadWindow {
  int64_t top = 0, bottom = 0, left = 0, right = 0;
};
UnpadWindow anyres_unpad(int64_t height, int64_t width, int64_t cur_h, int64_t cur_w);

// LlavaNextProcessor._get_number_of_features for vision_feature_select_strategy
// "default": the rows one image of height x width becomes (and the number of
// <image> tokens the processor expands it into). `tile` is the tiles' side in
// pixels (crop_size, = vision_config.image_size), `patch` the tower's patch
// size: (tile / patch)^2 rows of the whole image, then the unpadded grid's
// rows each followed by one image_newline row.
int64_t llava_next_feature_count(int64_t height, int64_t width, const GridPinpoints& pinpoints, int64_t tile,
                                 int64_t patch);

// image_grid_pinpoints as written in a config (a non-empty list of
// [height, width] pairs of positive integers); InvalidInput naming `where`
// and `key` otherwise.
GridPinpoints parse_grid_pinpoints(const nlohmann::json& v, const std::string& where, const std::string& key);

// InvalidInput naming `where` when a resolution is not a whole number of
// `tile` x `tile` tiles (`what` says where `tile` comes from): transformers
// would cut partial tiles that the model's grid does not count.
void check_grid_pinpoints(const GridPinpoints& pinpoints, int64_t tile, const std::string& where,
                          const std::string& what);

std::string pinpoints_str(const GridPinpoints& pinpoints);

}  // namespace qf::rt
