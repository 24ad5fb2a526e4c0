// tests/data/vlm/resize_vectors.bin (scripts/fixture/make_resize_vectors.py):
// what Pillow 9.4 makes of small images, resized and decoded.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "formats/image/image_file.h"
#include "test_util.h"

namespace qf::test {

struct ResizeVector {
  int filter;
  size_t image;  // index into ImageVectors::images
  int64_t width, height;
  std::vector<uint8_t> rgb;
};

struct DecodeVector {
  std::string name;
  std::vector<uint8_t> file;
  bool ok;  // false: Pillow refuses the file
  ImageU8 image;
};

struct ImageVectors {
  std::vector<ImageU8> images;
  std::vector<ResizeVector> resizes;
  std::vector<DecodeVector> decodes;
};

inline std::filesystem::path image_vectors_path() {
  return source_dir() / "tests" / "data" / "vlm" / "resize_vectors.bin";
}

inline ImageVectors load_image_vectors() {
  std::ifstream f(image_vectors_path(), std::ios::binary);
  const std::vector<uint8_t> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t pos = 0;
  auto take = [&](size_t n) {
    if (n > b.size() - pos) throw std::runtime_error("resize_vectors.bin is truncated");
    const uint8_t* p = b.data() + pos;
    pos += n;
    return p;
  };
  auto u8 = [&] { return *take(1); };
  auto u16 = [&] { const uint8_t* p = take(2); return static_cast<int64_t>(p[0] | (p[1] << 8)); };
  auto u32 = [&] {
    const uint8_t* p = take(4);
    return static_cast<uint32_t>(p[0] | (p[1] << 8) | (p[2] << 16) | (uint32_t(p[3]) << 24));
  };
  auto bytes = [&](size_t n) { const uint8_t* p = take(n); return std::vector<uint8_t>(p, p + n); };
  if (b.size() < 8 || std::memcmp(b.data(), "QFIMGV1\0", 8) != 0) throw std::runtime_error("not resize_vectors.bin");
  pos = 8;
  ImageVectors v;
  const uint32_t count = u32();
  for (uint32_t i = 0; i < count; ++i) {
    const uint8_t kind = u8();
    if (kind == 0) {
      ImageU8 img;
      img.width = u16();
      img.height = u16();
      img.rgb = bytes(static_cast<size_t>(img.width * img.height * 3));
      v.images.push_back(std::move(img));
    } else if (kind == 1) {
      ResizeVector r;
      r.filter = u8();
      r.image = static_cast<size_t>(u16());
      r.width = u16();
      r.height = u16();
      r.rgb = bytes(static_cast<size_t>(r.width * r.height * 3));
      v.resizes.push_back(std::move(r));
    } else if (kind == 2) {
      DecodeVector d;
      const int64_t n = u16();
      const std::vector<uint8_t> name = bytes(static_cast<size_t>(n));
      d.name.assign(name.begin(), name.end());
      d.file = bytes(u32());
      d.ok = u8() != 0;
      if (d.ok) {
        d.image.width = u16();
        d.image.height = u16();
        d.image.rgb = bytes(static_cast<size_t>(d.image.width * d.image.height * 3));
      }
      v.decodes.push_back(std::move(d));
    } else {
      throw std::runtime_error("resize_vectors.bin: unknown record kind");
    }
  }
  return v;
}

}  // namespace qf::test
