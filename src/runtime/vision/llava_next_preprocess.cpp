// LlavaNextImageProcessor on one image: the best of image_grid_pinpoints for
// its size, the image resized (Pillow, aspect kept) to fit that resolution and
// padded with zeros to it, centred (the odd pixel after), cut into crop-size
// tiles row by row; before them the whole image resized to the base size.
// Every tile then goes through CLIPImageProcessor's steps (resize, center
// crop, rescale, normalize).
#include <algorithm>

#include "core/error.h"
#include "runtime/vision/anyres.h"
#include "runtime/vision/image_preprocess.h"

namespace qf::rt {
namespace {

// `img` on a zero (black) canvas of width x height at (left, top).
ImageU8 pad_zeros(const ImageU8& img, int64_t width, int64_t height, int64_t left, int64_t top) {
  ImageU8 out{width, height, std::vector<uint8_t>(static_cast<size_t>(width * height * 3), 0)};
  for (int64_t y = 0; y < img.height; ++y)
    std::copy_n(img.rgb.data() + y * img.width * 3, img.width * 3, out.rgb.data() + ((y + top) * width + left) * 3);
  return out;
}

// The side x side tile of `img` at (x0, y0).
ImageU8 tile_at(const ImageU8& img, int64_t x0, int64_t y0, int64_t side) {
  ImageU8 out{side, side, std::vector<uint8_t>(static_cast<size_t>(side * side * 3))};
  for (int64_t y = 0; y < side; ++y)
    std::copy_n(img.rgb.data() + ((y0 + y) * img.width + x0) * 3, side * 3, out.rgb.data() + y * side * 3);
  return out;
}

}  // namespace

PixelValues llava_next_pixel_values(const ImagePreprocessConfig& cfg, const ImageU8& image) {
  if (cfg.grid_pinpoints.empty()) throw invalid_input(cfg.where, "no image_grid_pinpoints to tile the image with");
  const int64_t side = cfg.crop_height;  // divide_to_patches' patch_size: crop_size["height"]
  const auto best = select_best_resolution(image.height, image.width, cfg.grid_pinpoints);
  const auto [fit_h, fit_w] = anyres_fit_size(image.height, image.width, best);
  const ImageU8 fitted = pil_resize(image, fit_w, fit_h, cfg.resample);
  const ImageU8 padded =
      pad_zeros(fitted, best.second, best.first, (best.second - fit_w) / 2, (best.first - fit_h) / 2);

  // The base image: (shortest_edge, shortest_edge), or size's height and width.
  const int64_t base_h = cfg.shortest_edge > 0 ? cfg.shortest_edge : cfg.size_height;
  const int64_t base_w = cfg.shortest_edge > 0 ? cfg.shortest_edge : cfg.size_width;
  std::vector<PixelValues> tiles{clip_pixel_values(cfg, pil_resize(image, base_w, base_h, cfg.resample))};
  for (int64_t y = 0; y + side <= padded.height; y += side)
    for (int64_t x = 0; x + side <= padded.width; x += side)
      tiles.push_back(clip_pixel_values(cfg, tile_at(padded, x, y, side)));

  PixelValues out;
  const Shape& one = tiles[0].shape;
  for (const PixelValues& t : tiles) {
    if (t.shape != one)
      throw invalid_input(cfg.where, "the tiles come out as " + shape_str(t.shape) + " and " + shape_str(one) +
                                         "; size and crop_size must give every tile the same shape");
    out.values.insert(out.values.end(), t.values.begin(), t.values.end());
  }
  out.shape = {static_cast<int64_t>(tiles.size()), one[0], one[1], one[2]};
  out.grid_t = 1;
  out.grid_h = image.height;
  out.grid_w = image.width;
  return out;
}

}  // namespace qf::rt
