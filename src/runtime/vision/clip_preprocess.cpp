// CLIPImageProcessor on one image: resize (shortest edge, or a fixed
// height and width), center crop, rescale and normalise, channels first.
#pragma GCC optimize("fp-contract=off")
#include <algorithm>

#include "core/error.h"
#include "runtime/vision/image_preprocess.h"

namespace qf::rt {

// get_resize_output_image_size(default_to_square=False): Python computes
// int(size * long / short), the int product divided in double (exact
// operands) and truncated.
std::pair<int64_t, int64_t> clip_resize_size(int64_t height, int64_t width, int64_t shortest_edge) {
  const bool portrait = width <= height;
  const int64_t s = portrait ? width : height, l = portrait ? height : width;
  const int64_t new_long = static_cast<int64_t>(static_cast<double>(shortest_edge * l) / static_cast<double>(s));
  return portrait ? std::pair{new_long, shortest_edge} : std::pair{shortest_edge, new_long};
}

namespace {

// Python's floor division (center_crop's offsets may be negative).
int64_t floor_div2(int64_t v) { return v >= 0 ? v / 2 : -((-v + 1) / 2); }
int64_t ceil_div2(int64_t v) { return v >= 0 ? (v + 1) / 2 : -((-v) / 2); }

// image_transforms.center_crop on the uint8 image: a plain crop when the
// crop fits; otherwise the image is first padded with zeros (centred, the
// extra pixel after) to at least the crop's size, and the crop box moved by
// the padding and clipped to the padded image, as transformers does.
ImageU8 center_crop(const ImageU8& img, int64_t ch, int64_t cw) {
  const int64_t oh = img.height, ow = img.width;
  int64_t top = floor_div2(oh - ch), left = floor_div2(ow - cw);
  int64_t bottom = top + ch, right = left + cw;
  const ImageU8* src = &img;
  ImageU8 padded;
  int64_t H = oh, W = ow;
  if (!(top >= 0 && bottom <= oh && left >= 0 && right <= ow)) {
    H = std::max(ch, oh);
    W = std::max(cw, ow);
    const int64_t top_pad = ceil_div2(H - oh), left_pad = ceil_div2(W - ow);
    padded = ImageU8{W, H, std::vector<uint8_t>(static_cast<size_t>(W * H * 3), 0)};
    for (int64_t y = 0; y < oh; ++y)
      std::copy_n(img.rgb.data() + y * ow * 3, ow * 3, padded.rgb.data() + ((y + top_pad) * W + left_pad) * 3);
    top += top_pad, bottom += top_pad, left += left_pad, right += left_pad;
    top = std::max<int64_t>(0, top), bottom = std::min(H, bottom);
    left = std::max<int64_t>(0, left), right = std::min(W, right);
    src = &padded;
  }
  ImageU8 out{right - left, bottom - top, {}};
  out.rgb.resize(static_cast<size_t>(out.width * out.height * 3));
  for (int64_t y = 0; y < out.height; ++y)
    std::copy_n(src->rgb.data() + ((y + top) * W + left) * 3, out.width * 3, out.rgb.data() + y * out.width * 3);
  return out;
}

}  // namespace

PixelValues clip_pixel_values(const ImagePreprocessConfig& cfg, const ImageU8& image) {
  ImageU8 img = image;
  if (cfg.do_resize) {
    int64_t h = cfg.size_height, w = cfg.size_width;
    if (cfg.shortest_edge > 0) std::tie(h, w) = clip_resize_size(image.height, image.width, cfg.shortest_edge);
    check_image_size(w, h, cfg.where + ": the resized image");
    img = pil_resize(image, w, h, cfg.resample);
  }
  if (cfg.do_center_crop) img = center_crop(img, cfg.crop_height, cfg.crop_width);

  PixelValues out;
  out.grid_t = 1;
  out.grid_h = img.height;
  out.grid_w = img.width;
  out.shape = {3, img.height, img.width};
  const int64_t plane = img.height * img.width;
  out.values.resize(static_cast<size_t>(3 * plane));
  for (int c = 0; c < 3; ++c)
    for (int64_t i = 0; i < plane; ++i) out.values[c * plane + i] = rescale_normalize(cfg, img.rgb[i * 3 + c], c);
  return out;
}

}  // namespace qf::rt
