// read_image / decode_image against Pillow 9.4 + transformers' convert_to_rgb
// (resize_vectors.bin: PNGs of every colour type and bit depth, with tRNS,
// short palettes and interlacing; JPEGs 4:2:0, 4:4:4 progressive, grayscale,
// CMYK), and the errors every kind of bad file must give.
#include "formats/image/image_file.h"

#include <gtest/gtest.h>

#include "image_vectors.h"
#include "test_util.h"

namespace qf {
namespace {

std::string as_string(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

const test::DecodeVector& vector_named(const test::ImageVectors& v, const std::string& name) {
  for (const auto& d : v.decodes)
    if (d.name == name) return d;
  throw std::runtime_error("no decode vector " + name);
}

uint32_t crc32(const uint8_t* p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return ~c;
}

void put32(std::string& s, uint32_t v) {
  for (int i = 3; i >= 0; --i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string png_chunk(const std::string& type, const std::string& data) {
  std::string s;
  put32(s, static_cast<uint32_t>(data.size()));
  std::string body = type + data;
  s += body;
  put32(s, crc32(reinterpret_cast<const uint8_t*>(body.data()), body.size()));
  return s;
}

// A PNG whose IHDR claims width x height (valid checksum, no image data).
std::string png_header_only(uint32_t width, uint32_t height) {
  std::string ihdr;
  put32(ihdr, width);
  put32(ihdr, height);
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);  // 8-bit RGB
  const std::string empty_zlib("\x78\x9c\x03\x00\x00\x00\x00\x01", 8);
  return std::string("\x89PNG\r\n\x1a\n", 8) + png_chunk("IHDR", ihdr) + png_chunk("IDAT", empty_zlib) +
         png_chunk("IEND", "");
}

ImageU8 decode(const std::string& bytes, const std::string& where) {
  return decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), where);
}

TEST(ImageFile, DecodesAsPillowAndConvertToRgb) {
  const test::ImageVectors v = test::load_image_vectors();
  ASSERT_GE(v.decodes.size(), 20u);
  int png = 0, jpeg = 0;
  for (const auto& d : v.decodes) {
    SCOPED_TRACE(d.name);
    if (!d.ok) {
      EXPECT_QF_ERROR(decode_image(d.file.data(), d.file.size(), d.name), ErrorKind::InvalidInput, d.name);
      continue;
    }
    const ImageU8 img = decode_image(d.file.data(), d.file.size(), d.name);
    ASSERT_EQ(img.width, d.image.width);
    ASSERT_EQ(img.height, d.image.height);
    size_t diffs = 0;
    for (size_t i = 0; i < img.rgb.size(); ++i) diffs += img.rgb[i] != d.image.rgb[i];
    EXPECT_EQ(diffs, 0u);
    png += d.name.find(".png") != std::string::npos;
    jpeg += d.name.find(".jpg") != std::string::npos;
  }
  EXPECT_GE(png, 15);
  EXPECT_GE(jpeg, 4);
}

TEST(ImageFile, ReadsFilesAndTellsFormatsBySignature) {
  const test::ImageVectors v = test::load_image_vectors();
  test::TempDir dir;
  for (const char* name : {"rgba8.png", "rgb420.jpg"}) {
    const auto& d = vector_named(v, name);
    // A misleading extension: the signature decides.
    test::write_file(dir / (std::string(name) + ".bin"), as_string(d.file));
    const ImageU8 img = read_image(dir / (std::string(name) + ".bin"));
    EXPECT_EQ(img.rgb, d.image.rgb) << name;
  }
  EXPECT_QF_ERROR(read_image(dir / "missing.png"), ErrorKind::NotFound, "missing.png");
  test::write_file(dir / "empty.png", "");
  EXPECT_QF_ERROR(read_image(dir / "empty.png"), ErrorKind::InvalidInput, "empty.png");
  test::write_file(dir / "image.gif", "GIF89a\x01\x00\x01\x00");
  EXPECT_QF_ERROR(read_image(dir / "image.gif"), ErrorKind::Unsupported, "image.gif");
}

TEST(ImageFile, CorruptAndTruncatedFilesAreClearErrors) {
  const test::ImageVectors v = test::load_image_vectors();
  const std::string png = as_string(vector_named(v, "rgb8_adam7.png").file);
  const std::string jpg = as_string(vector_named(v, "rgb420.jpg").file);
  EXPECT_QF_ERROR(decode(png.substr(0, 8), "sig.png"), ErrorKind::InvalidInput, "sig.png: corrupt PNG");
  EXPECT_QF_ERROR(decode(png.substr(0, png.size() - 20), "cut.png"), ErrorKind::InvalidInput, "cut.png");
  std::string garbage = png;
  for (size_t i = 40; i < garbage.size() - 12; ++i) garbage[i] = static_cast<char>(i * 37);
  EXPECT_QF_ERROR(decode(garbage, "garbage.png"), ErrorKind::InvalidInput, "garbage.png");
  EXPECT_QF_ERROR(decode(jpg.substr(0, jpg.size() / 2), "half.jpg"), ErrorKind::InvalidInput,
                  "half.jpg: truncated JPEG");
  EXPECT_QF_ERROR(decode(jpg.substr(0, 3), "three.jpg"), ErrorKind::InvalidInput, "three.jpg");
  EXPECT_QF_ERROR(decode(std::string("\xff\xd8\xff\xd8", 4) + std::string(200, '\x55'), "bogus.jpg"),
                  ErrorKind::InvalidInput, "bogus.jpg: corrupt JPEG");
  // Every prefix of both files fails cleanly or decodes (none crashes or leaks under the sanitizers).
  for (size_t n = 0; n < jpg.size(); n += 97) {
    try {
      decode(jpg.substr(0, n), "prefix.jpg");
    } catch (const Error&) {
    }
  }
  for (size_t n = 0; n < png.size(); n += 13) {
    try {
      decode(png.substr(0, n), "prefix.png");
    } catch (const Error&) {
    }
  }
}

TEST(ImageFile, DimensionLimits) {
  EXPECT_QF_ERROR(decode(png_header_only(30000, 30000), "huge.png"), ErrorKind::InvalidInput,
                  "huge.png: image size 30000x30000");
  EXPECT_QF_ERROR(decode(png_header_only(40000, 8), "wide.png"), ErrorKind::InvalidInput, "wide.png");
  // A JPEG whose frame header claims 60000 x 60000.
  const test::ImageVectors v = test::load_image_vectors();
  std::string jpg = as_string(vector_named(v, "rgb420.jpg").file);
  const size_t sof = jpg.find(std::string("\xff\xc0", 2));
  ASSERT_NE(sof, std::string::npos);
  for (size_t at : {sof + 5, sof + 7}) {
    jpg[at] = static_cast<char>(0xea);
    jpg[at + 1] = 0x60;
  }
  EXPECT_QF_ERROR(decode(jpg, "huge.jpg"), ErrorKind::InvalidInput, "huge.jpg: image size 60000x60000");
  EXPECT_QF_ERROR(check_image_size(0, 5, "x"), ErrorKind::InvalidInput, "empty");
  EXPECT_NO_THROW(check_image_size(kMaxImageSide, kMaxImagePixels / kMaxImageSide, "x"));
}

TEST(ImageFile, CompositeOverWhite) {
  const uint8_t opaque[4] = {10, 200, 255, 255}, clear[4] = {10, 200, 0, 0}, half[4] = {0, 100, 255, 128};
  uint8_t out[3];
  composite_over_white(opaque, out);
  EXPECT_EQ(out[0], 10);
  EXPECT_EQ(out[1], 200);
  EXPECT_EQ(out[2], 255);
  composite_over_white(clear, out);
  EXPECT_EQ(out[0], 255);
  EXPECT_EQ(out[1], 255);
  EXPECT_EQ(out[2], 255);
  composite_over_white(half, out);  // ~ c * a / 255 + 255 * (1 - a / 255)
  EXPECT_NEAR(out[0], 127, 1);
  EXPECT_NEAR(out[1], 177, 1);
  EXPECT_EQ(out[2], 255);
}

}  // namespace
}  // namespace qf
