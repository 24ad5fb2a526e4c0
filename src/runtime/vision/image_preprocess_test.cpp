// The image processors' pieces that the fixtures' four images do not all
// reach: smart_resize's three branches and its refusal, CLIP's resize rule
// and its center crop's zero padding, and preprocessor_config.json parsing.
#include "runtime/vision/image_preprocess.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace qf::rt {
namespace {

TEST(VisionPreprocess, SmartResize) {
  // rounding (90x70: 70 / 28 = 2.5 rounds half to even, to 2)
  EXPECT_EQ(qwen2_vl_smart_resize(70, 90, 28, 3136, 50176), (std::pair<int64_t, int64_t>{56, 84}));
  EXPECT_EQ(qwen2_vl_smart_resize(48, 64, 28, 3136, 50176), (std::pair<int64_t, int64_t>{56, 56}));
  // below min_pixels: scaled up, ceil
  EXPECT_EQ(qwen2_vl_smart_resize(52, 40, 28, 3136, 50176), (std::pair<int64_t, int64_t>{84, 56}));
  // above max_pixels: scaled down, floor, at least one factor
  EXPECT_EQ(qwen2_vl_smart_resize(1000, 2000, 28, 3136, 50176), (std::pair<int64_t, int64_t>{140, 308}));
  EXPECT_EQ(qwen2_vl_smart_resize(30, 5000, 28, 3136, 50176).first, 28);
  EXPECT_QF_ERROR(qwen2_vl_smart_resize(10, 2500, 28, 3136, 50176, "cfg"), ErrorKind::InvalidInput, "aspect ratio");
}

TEST(VisionPreprocess, ClipResizeSize) {
  EXPECT_EQ(clip_resize_size(48, 64, 56), (std::pair<int64_t, int64_t>{56, 74}));  // int(56 * 64 / 48) = 74
  EXPECT_EQ(clip_resize_size(90, 70, 56), (std::pair<int64_t, int64_t>{72, 56}));
  EXPECT_EQ(clip_resize_size(30, 30, 56), (std::pair<int64_t, int64_t>{56, 56}));
}

TEST(VisionPreprocess, ClipCenterCropPadsWithZeros) {
  ImagePreprocessConfig c;
  c.do_resize = false;
  c.do_normalize = false;
  c.crop_height = c.crop_width = 4;
  ImageU8 img{3, 2, {}};  // 3 wide, 2 high
  for (int i = 0; i < 18; ++i) img.rgb.push_back(static_cast<uint8_t>(10 + i));
  const PixelValues pv = clip_pixel_values(c, img);
  ASSERT_EQ(pv.shape, (Shape{3, 4, 4}));
  // transformers pads to 4x4 with the image at rows 1-2, columns 1-3, then crops all of it.
  auto at = [&](int ch, int y, int x) { return pv.values[(ch * 4 + y) * 4 + x]; };
  EXPECT_EQ(at(0, 0, 0), 0.0f);
  EXPECT_EQ(at(0, 1, 0), 0.0f);
  EXPECT_EQ(at(0, 1, 1), static_cast<float>(10 * (1.0 / 255)));
  EXPECT_EQ(at(2, 2, 3), static_cast<float>(27 * (1.0 / 255)));
  EXPECT_EQ(at(1, 3, 3), 0.0f);
}

TEST(VisionPreprocess, RescaleNormalizeIsTransformersFloat32) {
  ImagePreprocessConfig c;
  for (int v : {0, 1, 128, 254, 255})
    for (int ch = 0; ch < 3; ++ch) {
      const float x = static_cast<float>(v * c.rescale_factor);
      EXPECT_EQ(rescale_normalize(c, static_cast<uint8_t>(v), ch),
                (x - static_cast<float>(c.image_mean[ch])) / static_cast<float>(c.image_std[ch]));
    }
}

TEST(VisionPreprocess, ParsesConfigs) {
  using nlohmann::json;
  const auto q = parse_image_preprocess_config(
      json{{"image_processor_type", "Qwen2VLImageProcessor"},
           {"size", {{"shortest_edge", 100}, {"longest_edge", 9000}}}},
      "p.json", ImageProcessorKind::Qwen2VL);
  EXPECT_EQ(q.min_pixels, 100);
  EXPECT_EQ(q.max_pixels, 9000);
  const auto q2 = parse_image_preprocess_config(json{{"min_pixels", 200}, {"size", {{"shortest_edge", 100}}}}, "p.json",
                                                ImageProcessorKind::Qwen2VL);
  EXPECT_EQ(q2.min_pixels, 200);  // min_pixels overrides size, as the processor's constructor does
  const auto clip = parse_image_preprocess_config(json{{"size", 336}, {"crop_size", 336}, {"image_mean", 0.5}},
                                                  "p.json", ImageProcessorKind::Clip);
  EXPECT_EQ(clip.shortest_edge, 336);
  EXPECT_EQ(clip.crop_width, 336);
  EXPECT_EQ(clip.image_mean[2], 0.5);
  EXPECT_QF_ERROR(parse_image_preprocess_config(json{{"resample", 0}}, "p.json", ImageProcessorKind::Clip),
                  ErrorKind::Unsupported, "p.json: 'resample': 0");
  EXPECT_QF_ERROR(parse_image_preprocess_config(json{{"size", {{"width", 3}}}}, "p.json", ImageProcessorKind::Clip),
                  ErrorKind::InvalidInput, "p.json: 'size'");
  EXPECT_QF_ERROR(parse_image_preprocess_config(json{{"image_mean", {1, 2}}}, "p.json", ImageProcessorKind::Clip),
                  ErrorKind::InvalidInput, "'image_mean'");
  EXPECT_QF_ERROR(parse_image_preprocess_config(json{{"do_resize", "yes"}}, "p.json", ImageProcessorKind::Clip),
                  ErrorKind::InvalidInput, "'do_resize'");
  EXPECT_QF_ERROR(parse_image_preprocess_config(json{{"image_processor_type", "CLIPImageProcessor"}}, "p.json",
                                                ImageProcessorKind::Qwen2VL),
                  ErrorKind::InvalidInput, "not the processor of this model");
  EXPECT_QF_ERROR(parse_image_preprocess_config(json{{"min_pixels", 10}, {"max_pixels", 5}}, "p.json",
                                                ImageProcessorKind::Qwen2VL),
                  ErrorKind::InvalidInput, "min_pixels 10 exceeds max_pixels 5");
  EXPECT_QF_ERROR(parse_image_preprocess_config(json::array(), "p.json", ImageProcessorKind::Clip),
                  ErrorKind::InvalidInput, "JSON object");
}

TEST(VisionPreprocess, QwenWithoutResizeNeedsWholeWindows) {
  ImagePreprocessConfig c;
  c.kind = ImageProcessorKind::Qwen2VL;
  c.do_resize = false;
  ImageU8 img{30, 28, std::vector<uint8_t>(30 * 28 * 3, 9)};
  EXPECT_QF_ERROR(preprocess_image(c, img), ErrorKind::InvalidInput, "multiple of patch_size * merge_size = 28");
  img = ImageU8{56, 28, std::vector<uint8_t>(56 * 28 * 3, 9)};
  const PixelValues pv = preprocess_image(c, img);
  EXPECT_EQ(pv.shape, (Shape{8, 1176}));
  EXPECT_EQ(pv.grid_h, 2);
  EXPECT_EQ(pv.grid_w, 4);
}

}  // namespace
}  // namespace qf::rt
