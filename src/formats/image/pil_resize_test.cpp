// pil_resize against Pillow 9.4 itself: every vector of resize_vectors.bin
// (up, down, one axis, unchanged; all five filters on some, BILINEAR and
// BICUBIC on all) must come out byte for byte.
#include "formats/image/pil_resize.h"

#include <gtest/gtest.h>

#include "image_vectors.h"
#include "test_util.h"

namespace qf {
namespace {

TEST(ImageResize, ByteIdenticalToPillow) {
  const test::ImageVectors v = test::load_image_vectors();
  ASSERT_GE(v.resizes.size(), 30u);
  int bilinear = 0, bicubic = 0;
  for (const auto& r : v.resizes) {
    const ImageU8& in = v.images.at(r.image);
    const ImageU8 out = pil_resize(in, r.width, r.height, static_cast<PilFilter>(r.filter));
    ASSERT_EQ(out.width, r.width);
    ASSERT_EQ(out.height, r.height);
    size_t diffs = 0;
    for (size_t i = 0; i < out.rgb.size(); ++i) diffs += out.rgb[i] != r.rgb[i];
    EXPECT_EQ(diffs, 0u) << "filter " << r.filter << ": " << in.width << "x" << in.height << " -> " << r.width << "x"
                         << r.height;
    bilinear += r.filter == 2;
    bicubic += r.filter == 3;
  }
  EXPECT_GE(bilinear, 15);
  EXPECT_GE(bicubic, 15);
}

TEST(ImageResize, UnchangedSizeIsACopy) {
  ImageU8 img{3, 2, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18}};
  const ImageU8 out = pil_resize(img, 3, 2, PilFilter::Bicubic);
  EXPECT_EQ(out.rgb, img.rgb);
}

TEST(ImageResize, BadSizesAreErrors) {
  ImageU8 img{2, 2, std::vector<uint8_t>(12, 7)};
  EXPECT_QF_ERROR(pil_resize(img, 0, 3, PilFilter::Bilinear), ErrorKind::InvalidInput, "empty");
  EXPECT_QF_ERROR(pil_resize(img, 3, kMaxImageSide + 1, PilFilter::Bilinear), ErrorKind::InvalidInput, "limits");
  img.rgb.pop_back();
  EXPECT_QF_ERROR(pil_resize(img, 3, 3, PilFilter::Bilinear), ErrorKind::InvalidInput, "width * height * 3");
}

}  // namespace
}  // namespace qf
