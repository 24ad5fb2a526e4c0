// Images as a vision-language model's image processor receives them: 8-bit
// RGB, decoded from PNG or JPEG the way Pillow 9.4 decodes them and then
// turned into RGB the way transformers' convert_to_rgb does (a non-RGB image
// is converted to RGBA and composited over opaque white). Matching those two
// steps byte for byte is what lets the vision towers reproduce transformers'
// pixel values exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace qf {

// Row-major, 3 bytes (R, G, B) per pixel, width * height * 3 bytes.
struct ImageU8 {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> rgb;
};

// The largest image read_image accepts: a side of at most kMaxImageSide
// pixels and at most kMaxImagePixels pixels in all (768 MiB of RGB), far
// beyond what any image processor keeps and small enough that a forged
// header cannot ask for an absurd allocation.
inline constexpr int64_t kMaxImageSide = 32768;
inline constexpr int64_t kMaxImagePixels = int64_t(1) << 28;

// Decodes a PNG (every colour type and bit depth, interlaced or not) or a
// JPEG (baseline or progressive; grayscale, YCbCr, RGB or CMYK/YCCK) file,
// told by its first bytes. A missing file is NotFound; an unknown format is
// Unsupported; a corrupt or truncated file, or one beyond the limits above,
// is InvalidInput naming the file. Never crashes on bad bytes.
ImageU8 read_image(const std::filesystem::path& path);

// The same on bytes in memory; `where` names them in error messages.
ImageU8 decode_image(const uint8_t* data, size_t size, const std::string& where);

// The decoders behind decode_image (the bytes must start with the format's
// signature; `where` names them in errors).
ImageU8 decode_png(const uint8_t* data, size_t size, const std::string& where);
ImageU8 decode_jpeg(const uint8_t* data, size_t size, const std::string& where);

// InvalidInput naming `where` unless 1 <= width, height <= kMaxImageSide and
// width * height <= kMaxImagePixels.
void check_image_size(int64_t width, int64_t height, const std::string& where);

// Pillow's alpha_composite of one RGBA pixel over opaque white (its integer
// arithmetic, 7 extra bits of precision): the colour convert_to_rgb keeps.
void composite_over_white(const uint8_t rgba[4], uint8_t rgb[3]);

}  // namespace qf
