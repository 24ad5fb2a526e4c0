// Qwen2VLImageProcessor on one image: smart_resize to multiples of
// patch_size * merge_size within the pixel budget, Pillow resize, rescale
// and normalise, the still image repeated temporal_patch_size times as
// frames, and the patches flattened in the order the vision tower reads them.
#pragma GCC optimize("fp-contract=off")
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "runtime/vision/image_preprocess.h"

namespace qf::rt {

// Python's arithmetic: `/` on ints is the correctly rounded double quotient
// (exact operands here, so the C++ division is the same), round() rounds
// halves to even (nearbyint in the default rounding mode).
std::pair<int64_t, int64_t> qwen2_vl_smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                                                  int64_t max_pixels, const std::string& where) {
  const double hd = static_cast<double>(height), wd = static_cast<double>(width), f = static_cast<double>(factor);
  const double ratio = std::max(hd, wd) / std::min(hd, wd);
  if (ratio > 200)
    throw invalid_input(where, "the image's aspect ratio " + std::to_string(ratio) +
                                   " is above 200, which Qwen2-VL's image processor refuses");
  int64_t h_bar = static_cast<int64_t>(std::nearbyint(hd / f)) * factor;
  int64_t w_bar = static_cast<int64_t>(std::nearbyint(wd / f)) * factor;
  if (h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt(static_cast<double>(height * width) / static_cast<double>(max_pixels));
    h_bar = std::max(factor, static_cast<int64_t>(std::floor(hd / beta / f)) * factor);
    w_bar = std::max(factor, static_cast<int64_t>(std::floor(wd / beta / f)) * factor);
  } else if (h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / static_cast<double>(height * width));
    h_bar = static_cast<int64_t>(std::ceil(hd * beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(wd * beta / f)) * factor;
  }
  return {h_bar, w_bar};
}

PixelValues qwen2_vl_pixel_values(const ImagePreprocessConfig& cfg, const ImageU8& image) {
  const int64_t p = cfg.patch_size, m = cfg.merge_size, tp = cfg.temporal_patch_size, factor = p * m;
  int64_t rh = image.height, rw = image.width;
  if (cfg.do_resize)
    std::tie(rh, rw) =
        qwen2_vl_smart_resize(image.height, image.width, factor, cfg.min_pixels, cfg.max_pixels, cfg.where);
  if (rh % factor != 0 || rw % factor != 0)
    throw invalid_input(cfg.where, "with do_resize false the image's size " + std::to_string(rw) + "x" +
                                       std::to_string(rh) + " must be a multiple of patch_size * merge_size = " +
                                       std::to_string(factor));
  const ImageU8 resized = cfg.do_resize ? pil_resize(image, rw, rh, cfg.resample) : image;

  // Every value depends only on its byte and channel: one table per channel.
  float table[3][256];
  for (int c = 0; c < 3; ++c)
    for (int v = 0; v < 256; ++v) table[c][v] = rescale_normalize(cfg, static_cast<uint8_t>(v), c);

  PixelValues out;
  out.grid_t = 1;  // one image: its tp copies make one temporal patch
  out.grid_h = rh / p;
  out.grid_w = rw / p;
  const int64_t cols = 3 * tp * p * p, rows = out.grid_h * out.grid_w;
  out.shape = {rows, cols};
  out.values.resize(static_cast<size_t>(rows * cols));
  const int64_t bw_count = out.grid_w / m;
  for (int64_t bh = 0; bh < out.grid_h / m; ++bh)
    for (int64_t bw = 0; bw < bw_count; ++bw)
      for (int64_t mh = 0; mh < m; ++mh)
        for (int64_t mw = 0; mw < m; ++mw) {
          const int64_t row = ((bh * bw_count + bw) * m + mh) * m + mw;
          const int64_t y0 = (bh * m + mh) * p, x0 = (bw * m + mw) * p;
          float* dst = out.values.data() + row * cols;
          for (int c = 0; c < 3; ++c)
            for (int64_t t = 0; t < tp; ++t)
              for (int64_t py = 0; py < p; ++py)
                for (int64_t px = 0; px < p; ++px)
                  *dst++ = table[c][resized.rgb[((y0 + py) * rw + x0 + px) * 3 + c]];
        }
  return out;
}

}  // namespace qf::rt
