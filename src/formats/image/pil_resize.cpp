// pil_resize: Pillow 9.4's ImagingResample for 8 bits per channel.
//
// For every output index Pillow computes, in double, the filter's weights
// over the input pixels within its support (the filter's support scaled by
// the downscale factor, at least 1), normalises them to sum 1, converts them
// to fixed point with 22 fraction bits (rounding half away from zero), and
// sums pixel * weight in 32-bit integers starting from one half, keeping
// bits 22.. clipped to 0..255. The code below does the same operations in
// the same order; floating-point contraction is off so that no compiler
// flag fuses the double products into FMAs Pillow's build does not use.
#pragma GCC optimize("fp-contract=off")
#include "formats/image/pil_resize.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace qf {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;

double box_filter(double x) { return x > -0.5 && x <= 0.5 ? 1.0 : 0.0; }

double bilinear_filter(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

double hamming_filter(double x) {
  if (x < 0.0) x = -x;
  if (x == 0.0) return 1.0;
  if (x >= 1.0) return 0.0;
  x = x * M_PI;
  return std::sin(x) / x * (0.54f + 0.46f * std::cos(x));  // Pillow's float literals, promoted
}

double bicubic_filter(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

double sinc_filter(double x) {
  if (x == 0.0) return 1.0;
  x = x * M_PI;
  return std::sin(x) / x;
}

double lanczos_filter(double x) {
  if (-3.0 <= x && x < 3.0) return sinc_filter(x) * sinc_filter(x / 3);
  return 0.0;
}

struct Filter {
  double (*fn)(double);
  double support;
};

Filter filter_of(PilFilter f) {
  switch (f) {
    case PilFilter::Box: return {box_filter, 0.5};
    case PilFilter::Bilinear: return {bilinear_filter, 1.0};
    case PilFilter::Hamming: return {hamming_filter, 1.0};
    case PilFilter::Bicubic: return {bicubic_filter, 2.0};
    case PilFilter::Lanczos: return {lanczos_filter, 3.0};
  }
  throw invalid_input("pil_resize", "unknown resampling filter " + std::to_string(static_cast<int>(f)));
}

// One axis: for output index i, the first input index bounds[2i], the count
// bounds[2i + 1], and `ksize` fixed-point weights at coeffs[i * ksize].
struct Coeffs {
  int ksize = 0;
  std::vector<int> bounds;
  std::vector<int32_t> k;
};

Coeffs precompute_coeffs(int in_size, float in0, float in1, int out_size, const Filter& f) {
  double scale = static_cast<double>(in1 - in0) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = f.support * filterscale;
  Coeffs c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.bounds.resize(static_cast<size_t>(out_size) * 2);
  c.k.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> w(static_cast<size_t>(c.ksize));
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      w[x] = f.fn((x + xmin - center + 0.5) * ss);
      ww += w[x];
    }
    for (int x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? w[x] / ww : w[x];
      // normalize_coeffs_8bpc: to fixed point, rounding half away from zero
      c.k[static_cast<size_t>(xx) * c.ksize + x] =
          v < 0 ? static_cast<int32_t>(-0.5 + v * (1 << kPrecisionBits))
                : static_cast<int32_t>(0.5 + v * (1 << kPrecisionBits));
    }
    c.bounds[2 * xx] = xmin;
    c.bounds[2 * xx + 1] = xmax;
  }
  return c;
}

uint8_t clip8(int32_t ss) {
  const int32_t v = ss >> kPrecisionBits;  // arithmetic shift, as Pillow's table lookup indexes
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

// Horizontal pass over input rows [offset, offset + out_h).
ImageU8 resample_horizontal(const ImageU8& in, int64_t out_w, int64_t out_h, int offset, const Coeffs& c) {
  ImageU8 out{out_w, out_h, std::vector<uint8_t>(static_cast<size_t>(out_w * out_h * 3))};
  for (int64_t yy = 0; yy < out_h; ++yy) {
    const uint8_t* row = in.rgb.data() + (yy + offset) * in.width * 3;
    for (int64_t xx = 0; xx < out_w; ++xx) {
      const int xmin = c.bounds[2 * xx], xmax = c.bounds[2 * xx + 1];
      const int32_t* k = c.k.data() + xx * c.ksize;
      int32_t ss[3] = {1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1)};
      for (int x = 0; x < xmax; ++x)
        for (int ch = 0; ch < 3; ++ch) ss[ch] += row[(x + xmin) * 3 + ch] * k[x];
      for (int ch = 0; ch < 3; ++ch) out.rgb[(yy * out_w + xx) * 3 + ch] = clip8(ss[ch]);
    }
  }
  return out;
}

ImageU8 resample_vertical(const ImageU8& in, int64_t out_h, const Coeffs& c) {
  const int64_t w = in.width;
  ImageU8 out{w, out_h, std::vector<uint8_t>(static_cast<size_t>(w * out_h * 3))};
  for (int64_t yy = 0; yy < out_h; ++yy) {
    const int ymin = c.bounds[2 * yy], ymax = c.bounds[2 * yy + 1];
    const int32_t* k = c.k.data() + yy * c.ksize;
    for (int64_t xx = 0; xx < w; ++xx) {
      int32_t ss[3] = {1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1)};
      for (int y = 0; y < ymax; ++y)
        for (int ch = 0; ch < 3; ++ch) ss[ch] += in.rgb[((y + ymin) * w + xx) * 3 + ch] * k[y];
      for (int ch = 0; ch < 3; ++ch) out.rgb[(yy * w + xx) * 3 + ch] = clip8(ss[ch]);
    }
  }
  return out;
}

}  // namespace

ImageU8 pil_resize(const ImageU8& image, int64_t width, int64_t height, PilFilter filter) {
  const std::string where = "image resize";
  check_image_size(image.width, image.height, where + " (input)");
  if (image.rgb.size() != static_cast<size_t>(image.width * image.height * 3))
    throw invalid_input(where,
                        "the input holds " + std::to_string(image.rgb.size()) + " bytes, not width * height * 3");
  check_image_size(width, height, where + " (output)");
  const Filter f = filter_of(filter);
  // Image.resize returns a copy when the size is unchanged.
  if (width == image.width && height == image.height) return image;

  const bool need_h = width != image.width, need_v = height != image.height;
  Coeffs vert = precompute_coeffs(static_cast<int>(image.height), 0.0f, static_cast<float>(image.height),
                                  static_cast<int>(height), f);
  // The rows the vertical pass reads: only they go through the horizontal pass.
  const int ybox_first = vert.bounds[0];
  const int ybox_last = vert.bounds[2 * height - 2] + vert.bounds[2 * height - 1];
  const ImageU8* src = &image;
  ImageU8 tmp;
  if (need_h) {
    Coeffs horiz = precompute_coeffs(static_cast<int>(image.width), 0.0f, static_cast<float>(image.width),
                                     static_cast<int>(width), f);
    for (int64_t i = 0; i < height; ++i) vert.bounds[2 * i] -= ybox_first;
    tmp = resample_horizontal(image, width, ybox_last - ybox_first, ybox_first, horiz);
    src = &tmp;
  }
  if (need_v) return resample_vertical(*src, height, vert);
  return tmp;
}

}  // namespace qf
