// preprocess_image: the model's processor on one image; and the per-value
// rescale and normalisation the processors share.
#pragma GCC optimize("fp-contract=off")
#include "runtime/vision/image_preprocess.h"

#include "core/error.h"

namespace qf::rt {

// image_transforms.rescale multiplies in float64 and casts to float32;
// normalize casts mean and std to the image's float32 and computes
// (x - mean) / std elementwise: two correctly rounded float32 operations.
float rescale_normalize(const ImagePreprocessConfig& cfg, uint8_t v, int channel) {
  float x = cfg.do_rescale ? static_cast<float>(static_cast<double>(v) * cfg.rescale_factor) : static_cast<float>(v);
  if (cfg.do_normalize)
    x = (x - static_cast<float>(cfg.image_mean[channel])) / static_cast<float>(cfg.image_std[channel]);
  return x;
}

PixelValues preprocess_image(const ImagePreprocessConfig& cfg, const ImageU8& image) {
  check_image_size(image.width, image.height, "image");
  if (image.rgb.size() != static_cast<size_t>(image.width * image.height * 3))
    throw invalid_input("image", "holds " + std::to_string(image.rgb.size()) + " bytes, not width * height * 3");
  switch (cfg.kind) {
    case ImageProcessorKind::Qwen2VL: return qwen2_vl_pixel_values(cfg, image);
    case ImageProcessorKind::LlavaNext: return llava_next_pixel_values(cfg, image);
    case ImageProcessorKind::Clip: break;
  }
  return clip_pixel_values(cfg, image);
}

}  // namespace qf::rt
