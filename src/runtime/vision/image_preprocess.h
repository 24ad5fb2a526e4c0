// The image processors of the vision-language models, as transformers runs
// them (its "slow", numpy/PIL processors): preprocessor_config.json parsed,
// then an 8-bit RGB image turned into the pixel values a vision tower reads,
// equal bit for bit to transformers' own.
//
// The processors resize with Pillow (formats/image/pil_resize.h) on uint8,
// rescale in float64 and cast to float32 (image_transforms.rescale), then
// normalise in float32 as (x - mean) / std with mean and std cast to float32
// (image_transforms.normalize). The same operations in the same precision
// give the same floats.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "formats/image/image_file.h"
#include "formats/image/pil_resize.h"

namespace qf::rt {

enum class ImageProcessorKind {
  Qwen2VL,    // Qwen2VLImageProcessor (Qwen2-VL, Qwen2.5-VL)
  Clip,       // CLIPImageProcessor (LLaVA-1.5)
  LlavaNext,  // LlavaNextImageProcessor (LLaVA-NeXT): anyres tiles, each as CLIP's
};

// LLaVA-NeXT's image_grid_pinpoints: the (height, width) resolutions an
// image may be tiled at, in the file's order.
using GridPinpoints = std::vector<std::pair<int64_t, int64_t>>;

struct ImagePreprocessConfig {
  ImageProcessorKind kind = ImageProcessorKind::Clip;
  std::string where;           // the file, for messages
  std::string processor_type;  // image_processor_type as written ("" when absent)
  bool do_resize = true, do_rescale = true, do_normalize = true;
  PilFilter resample = PilFilter::Bicubic;
  double rescale_factor = 1.0 / 255;
  std::array<double, 3> image_mean{0.48145466, 0.4578275, 0.40821073};  // OPENAI_CLIP_MEAN
  std::array<double, 3> image_std{0.26862954, 0.26130258, 0.27577711};  // OPENAI_CLIP_STD
  // Qwen2VLImageProcessor: the pixel budget (min_pixels / max_pixels, or
  // size.shortest_edge / size.longest_edge) and the patch geometry.
  int64_t min_pixels = 56 * 56, max_pixels = 28 * 28 * 1280;
  int64_t patch_size = 14, temporal_patch_size = 2, merge_size = 2;
  // CLIPImageProcessor: size.shortest_edge, or size.height and size.width
  // (shortest_edge 0); then the center crop.
  int64_t shortest_edge = 224, size_height = 0, size_width = 0;
  bool do_center_crop = true;
  int64_t crop_height = 224, crop_width = 224;
  // LlavaNextImageProcessor: the CLIP keys above for every tile, and the
  // resolutions (empty when the file has none: config.json's are taken).
  GridPinpoints grid_pinpoints;
};

// preprocessor_config.json's object. `expected` is the processor the model
// needs: an image_processor_type naming another processor, or one quantforge
// does not implement, is Unsupported; an absent type means `expected`.
// Values of the wrong type or out of range are InvalidInput naming `where`
// and the key. Keys left out take transformers' defaults (those above).
ImagePreprocessConfig parse_image_preprocess_config(const nlohmann::json& j, const std::string& where,
                                                    ImageProcessorKind expected);
// <model_dir>/preprocessor_config.json (NotFound when absent).
ImagePreprocessConfig load_image_preprocess_config(const std::filesystem::path& model_dir,
                                                   ImageProcessorKind expected);

// A processor's output for one image.
//  - Qwen2-VL: shape [grid_t * grid_h * grid_w, 3 * temporal_patch_size *
//    patch_size^2], one row per patch, rows ordered (t, h / merge, w / merge,
//    h % merge, w % merge) so that each merge window's patches are
//    consecutive; columns (channel, temporal copy, row, column) as the
//    Conv3d weight is flattened. grid_* count patches (before merging).
//  - CLIP: shape [3, height, width] (channels first); grid_t = 1, grid_h and
//    grid_w the image's height and width in pixels.
//  - LLaVA-NeXT: shape [tiles, 3, crop, crop], the whole image first, then
//    the tiles of the padded high-resolution image row by row; grid_t = 1,
//    grid_h and grid_w the original image's height and width (transformers'
//    image_sizes, which the model unpads to).
struct PixelValues {
  std::vector<float> values;
  Shape shape;
  int64_t grid_t = 1, grid_h = 0, grid_w = 0;
};

PixelValues preprocess_image(const ImagePreprocessConfig& cfg, const ImageU8& image);
PixelValues qwen2_vl_pixel_values(const ImagePreprocessConfig& cfg, const ImageU8& image);
PixelValues clip_pixel_values(const ImagePreprocessConfig& cfg, const ImageU8& image);
PixelValues llava_next_pixel_values(const ImagePreprocessConfig& cfg, const ImageU8& image);

// Qwen2VLImageProcessor's smart_resize: the (height, width) nearest to the
// image's that are multiples of `factor` (Python's round, halves to even),
// scaled down (floor, at least `factor`) when their product exceeds
// max_pixels or up (ceil) when it is below min_pixels, in the same double
// arithmetic. InvalidInput naming `where` for an aspect ratio above 200.
std::pair<int64_t, int64_t> qwen2_vl_smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                                                  int64_t max_pixels, const std::string& where = "image processor");

// CLIPImageProcessor's resize target for a shortest edge (transformers'
// get_resize_output_image_size with default_to_square False): the short side
// becomes `shortest_edge`, the long side int(shortest_edge * long / short).
std::pair<int64_t, int64_t> clip_resize_size(int64_t height, int64_t width, int64_t shortest_edge);

// One channel value as rescale then normalize compute it: float32(double(v)
// * rescale_factor), then (x - float32(mean)) / float32(std) in float32.
float rescale_normalize(const ImagePreprocessConfig& cfg, uint8_t v, int channel);

}  // namespace qf::rt
