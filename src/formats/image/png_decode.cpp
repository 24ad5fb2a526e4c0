// PNG through libpng, to 8-bit RGB as Pillow 9.4 opens the file and
// transformers' convert_to_rgb then converts it.
//
// libpng hands over the raw samples (only unpacked to a byte per sample and
// de-interlaced); the colour handling is ours, because Pillow's differs from
// libpng's own expansions in ways that change pixels:
//  - 16-bit samples keep their high byte, except 16-bit grayscale, which
//    Pillow opens as 32-bit integers ("I") that the RGBA conversion clips to
//    0..255 (so most 16-bit gray values turn white: what transformers sees);
//  - 1/2/4-bit gray is scaled to 0..255 (x255, x85, x17);
//  - an RGB image is returned as it is: convert_to_rgb leaves mode RGB alone,
//    so a tRNS colour key of an RGB image is ignored;
//  - a gray tRNS key is compared with the already converted 8-bit value
//    (Pillow masks the key to its low byte), then that pixel is transparent;
//  - palette indices beyond the PLTE entries read Pillow's default ramp
//    (index i is gray i);
//  - any mode other than RGB is composited over opaque white.
//
// libpng reports errors by longjmp. The functions that call setjmp hold no
// C++ objects, and the png structs are freed by a guard in the caller, so an
// error frees everything and becomes one qf::Error naming the file.
#include <png.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"
#include "formats/image/image_file.h"

namespace qf {
namespace {

struct PngInput {
  const uint8_t* data;
  size_t size;
  size_t pos;
  char message[256];
};

void on_error(png_structp png, png_const_charp msg) {
  auto* in = static_cast<PngInput*>(png_get_error_ptr(png));
  std::snprintf(in->message, sizeof in->message, "%s", msg ? msg : "unknown libpng error");
  png_longjmp(png, 1);
}

void on_warning(png_structp, png_const_charp) {}  // Pillow ignores what libpng only warns about

void on_read(png_structp png, png_bytep out, size_t n) {
  auto* in = static_cast<PngInput*>(png_get_io_ptr(png));
  if (n > in->size - in->pos) png_error(png, "the file is truncated");
  std::memcpy(out, in->data + in->pos, n);
  in->pos += n;
}

// What the header and the chunks before the image data say (plain data: it
// is filled inside the setjmp region).
struct PngHeader {
  png_uint_32 width, height;
  int bit_depth, color_type;
  size_t rowbytes;
  uint8_t palette[256][3];
  int num_palette;
  uint8_t palette_alpha[256];
  bool has_key;                // a tRNS colour key (gray or RGB images)
  png_uint_16 key_gray;
};

bool read_header(png_structp png, png_infop info, PngHeader* h) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_user_limits(png, kMaxImageSide, kMaxImageSide);
  png_read_info(png, info);
  int interlace = 0;
  png_get_IHDR(png, info, &h->width, &h->height, &h->bit_depth, &h->color_type, &interlace, nullptr, nullptr);
  png_colorp pal = nullptr;
  h->num_palette = 0;
  if (png_get_PLTE(png, info, &pal, &h->num_palette) == 0) h->num_palette = 0;
  h->num_palette = std::clamp(h->num_palette, 0, 256);
  for (int i = 0; i < 256; ++i) {  // Pillow's palette starts as a gray ramp, fully opaque
    const bool set = i < h->num_palette;
    h->palette[i][0] = set ? pal[i].red : static_cast<uint8_t>(i);
    h->palette[i][1] = set ? pal[i].green : static_cast<uint8_t>(i);
    h->palette[i][2] = set ? pal[i].blue : static_cast<uint8_t>(i);
    h->palette_alpha[i] = 255;
  }
  png_bytep trans_alpha = nullptr;
  int num_trans = 0;
  png_color_16p trans_color = nullptr;
  h->has_key = false;
  if (png_get_tRNS(png, info, &trans_alpha, &num_trans, &trans_color) != 0) {
    if (h->color_type == PNG_COLOR_TYPE_PALETTE && trans_alpha) {
      for (int i = 0; i < std::clamp(num_trans, 0, 256); ++i) h->palette_alpha[i] = trans_alpha[i];
    } else if (h->color_type == PNG_COLOR_TYPE_GRAY && trans_color) {
      h->has_key = true;
      h->key_gray = trans_color->gray;
    }
  }
  if (h->bit_depth < 8) png_set_packing(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  h->rowbytes = png_get_rowbytes(png, info);
  return true;
}

bool read_rows(png_structp png, png_bytepp rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_image(png, rows);
  return true;
}

struct PngGuard {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngGuard() { png_destroy_read_struct(&png, info ? &info : nullptr, nullptr); }
};

// One pixel as Pillow's RGBA conversion of the opened mode gives it.
void pixel_rgba(const PngHeader& h, const uint8_t* row, int64_t x, uint8_t px[4]) {
  const int depth = h.bit_depth;
  auto sample = [&](int64_t i) -> uint8_t { return depth == 16 ? row[2 * i] : row[i]; };  // the high byte
  px[3] = 255;
  switch (h.color_type) {
    case PNG_COLOR_TYPE_GRAY: {
      uint8_t v;
      if (depth == 16) {
        v = static_cast<uint8_t>(std::min<int>((row[2 * x] << 8) | row[2 * x + 1], 255));
      } else {
        const int scale = depth == 1 ? 255 : depth == 2 ? 85 : depth == 4 ? 17 : 1;
        v = static_cast<uint8_t>(row[x] * scale);
      }
      px[0] = px[1] = px[2] = v;
      if (h.has_key && v == (h.key_gray & 0xff)) px[3] = 0;
      break;
    }
    case PNG_COLOR_TYPE_RGB:
      for (int c = 0; c < 3; ++c) px[c] = sample(3 * x + c);
      break;
    case PNG_COLOR_TYPE_PALETTE: {
      const uint8_t i = row[x];
      std::memcpy(px, h.palette[i], 3);
      px[3] = h.palette_alpha[i];
      break;
    }
    case PNG_COLOR_TYPE_GRAY_ALPHA:
      px[0] = px[1] = px[2] = sample(2 * x);
      px[3] = sample(2 * x + 1);
      break;
    default:  // PNG_COLOR_TYPE_RGB_ALPHA
      for (int c = 0; c < 4; ++c) px[c] = sample(4 * x + c);
  }
}

}  // namespace

ImageU8 decode_png(const uint8_t* data, size_t size, const std::string& where) {
  PngInput in{data, size, 0, ""};
  PngGuard g;
  g.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &in, on_error, on_warning);
  if (!g.png) throw Error(ErrorKind::Internal, where + ": libpng could not start");
  g.info = png_create_info_struct(g.png);
  if (!g.info) throw Error(ErrorKind::Internal, where + ": libpng could not start");
  png_set_read_fn(g.png, &in, on_read);

  // Large: the palette tables. On the heap so the setjmp frame stays small.
  auto h = std::make_unique<PngHeader>();
  if (!read_header(g.png, g.info, h.get())) throw invalid_input(where, std::string("corrupt PNG: ") + in.message);
  check_image_size(h->width, h->height, where);

  std::vector<uint8_t> raw(h->rowbytes * h->height);
  std::vector<png_bytep> rows(h->height);
  for (png_uint_32 y = 0; y < h->height; ++y) rows[y] = raw.data() + y * h->rowbytes;
  if (!read_rows(g.png, rows.data())) throw invalid_input(where, std::string("corrupt PNG: ") + in.message);

  ImageU8 img;
  img.width = h->width;
  img.height = h->height;
  img.rgb.resize(static_cast<size_t>(img.width * img.height * 3));
  const bool keep_rgb = h->color_type == PNG_COLOR_TYPE_RGB;  // convert_to_rgb returns mode RGB as it is
  for (int64_t y = 0; y < img.height; ++y) {
    uint8_t* out = img.rgb.data() + y * img.width * 3;
    for (int64_t x = 0; x < img.width; ++x) {
      uint8_t px[4];
      pixel_rgba(*h, rows[y], x, px);
      if (keep_rgb)
        std::memcpy(out + 3 * x, px, 3);
      else
        composite_over_white(px, out + 3 * x);
    }
  }
  return img;
}

}  // namespace qf
