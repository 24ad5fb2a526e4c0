// Image.resize of Pillow 9.4 on 8-bit RGB, byte for byte: the resampling of
// its libImaging/Resample.c, which transformers' image processors call (via
// PIL) for every image they resize. A different resize (OpenCV's, a float
// one) moves pixel values by a unit here and there, and those differences
// flow into every patch a vision tower sees.
#pragma once

#include <cstdint>

#include "formats/image/image_file.h"

namespace qf {

// Pillow's resampling filters, numbered as PIL.Image.Resampling numbers them
// (preprocessor_config.json's "resample"). NEAREST (0) is not a
// convolution in Pillow and is not provided.
enum class PilFilter { Lanczos = 1, Bilinear = 2, Bicubic = 3, Box = 4, Hamming = 5 };

// `image` resized to width x height (each 1 .. kMaxImageSide) with the
// filter over the whole image (box (0, 0, w, h), reducing_gap None):
// separable, the horizontal pass first into an 8-bit intermediate holding
// only the rows the vertical pass reads; a pass whose size is unchanged is
// skipped, and an unchanged size returns a copy. InvalidInput for an empty
// or inconsistent input or an out-of-range size.
ImageU8 pil_resize(const ImageU8& image, int64_t width, int64_t height, PilFilter filter);

}  // namespace qf
