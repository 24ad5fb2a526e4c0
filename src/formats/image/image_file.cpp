// read_image: the file's bytes, told apart by their signature and handed to
// the PNG or JPEG decoder; and the helpers both decoders share.
#include "formats/image/image_file.h"

#include <cstring>

#include "core/error.h"
#include "core/io.h"

namespace qf {

void check_image_size(int64_t width, int64_t height, const std::string& where) {
  if (width < 1 || height < 1)
    throw invalid_input(where, "image size " + std::to_string(width) + "x" + std::to_string(height) + " is empty");
  if (width > kMaxImageSide || height > kMaxImageSide || width * height > kMaxImagePixels)
    throw invalid_input(where, "image size " + std::to_string(width) + "x" + std::to_string(height) +
                                   " is beyond the limits (" + std::to_string(kMaxImageSide) + " pixels a side, " +
                                   std::to_string(kMaxImagePixels) + " pixels in all)");
}

// Pillow's ImagingAlphaComposite with the destination opaque white: the
// coefficient of the source is a * 255^2 * 2^7 / outa255, rounded down, and
// each channel is divided by 255 with its rounding shift trick. Spelled out
// rather than simplified so that every intermediate matches Pillow's.
void composite_over_white(const uint8_t rgba[4], uint8_t rgb[3]) {
  const uint32_t a = rgba[3];
  if (a == 0) {
    rgb[0] = rgb[1] = rgb[2] = 255;
    return;
  }
  constexpr uint32_t kBits = 7, dst_a = 255, dst_c = 255;
  const uint32_t blend = dst_a * (255 - a);
  const uint32_t outa255 = a * 255 + blend;
  const uint32_t coef1 = a * 255 * 255 * (1u << kBits) / outa255;
  const uint32_t coef2 = 255 * (1u << kBits) - coef1;
  for (int c = 0; c < 3; ++c) {
    const uint32_t tmp = rgba[c] * coef1 + dst_c * coef2 + (0x80u << kBits);
    rgb[c] = static_cast<uint8_t>((((tmp >> 8) + tmp) >> 8) >> kBits);
  }
}

ImageU8 decode_image(const uint8_t* data, size_t size, const std::string& where) {
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (size >= 8 && std::memcmp(data, kPng, 8) == 0) return decode_png(data, size, where);
  if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) return decode_jpeg(data, size, where);
  if (size == 0) throw invalid_input(where, "the image file is empty");
  throw unsupported(where, "not a PNG or JPEG file (unknown signature); convert the image to PNG or JPEG");
}

ImageU8 read_image(const std::filesystem::path& path) {
  auto file = MappedFile::open(path);
  return decode_image(file->data(), file->size(), path.string());
}

}  // namespace qf
