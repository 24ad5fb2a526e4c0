// JPEG through libjpeg(-turbo), to 8-bit RGB as Pillow 9.4 opens the file
// and transformers' convert_to_rgb then converts it.
//
// Pillow decodes with libjpeg's default settings (islow DCT, fancy
// upsampling), into grayscale for one component, RGB for three and CMYK for
// four. It takes four-component data as Adobe-inverted ("CMYK;I") and turns
// CMYK into RGB with its own integer formula; grayscale becomes RGB by
// replication (convert_to_rgb's RGBA round trip keeps the value).
//
// Errors: libjpeg's error_exit longjmps back into the function that called
// setjmp (which holds no C++ objects); the decompressor is freed by a guard
// in the caller. Running out of data is an error (libjpeg's own memory
// source would pad with a fake end marker and return a gray tail), as
// Pillow refuses a truncated file; a missing end marker after complete
// baseline data is accepted, as Pillow accepts it. Warnings are ignored.
#include <csetjmp>
#include <cstdio>  // jpeglib.h needs FILE and size_t first
#include <cstring>
#include <vector>

#include <jerror.h>
#include <jpeglib.h>

#include "core/error.h"
#include "formats/image/image_file.h"

namespace qf {
namespace {

struct JpegErrors {
  jpeg_error_mgr mgr;  // first: libjpeg hands back a pointer to it
  jmp_buf jump;
  bool truncated;
  char message[JMSG_LENGTH_MAX];
};

void on_error_exit(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

void on_output_message(j_common_ptr) {}

// A source over bytes in memory that fails, instead of padding, at the end.
void source_init(j_decompress_ptr) {}
void source_term(j_decompress_ptr) {}

boolean source_fill(j_decompress_ptr cinfo) {
  reinterpret_cast<JpegErrors*>(cinfo->err)->truncated = true;
  ERREXIT(cinfo, JERR_INPUT_EOF);
  return FALSE;
}

void source_skip(j_decompress_ptr cinfo, long n) {
  if (n <= 0) return;
  jpeg_source_mgr* src = cinfo->src;
  if (static_cast<unsigned long>(n) > src->bytes_in_buffer) source_fill(cinfo);
  src->next_input_byte += n;
  src->bytes_in_buffer -= static_cast<size_t>(n);
}

struct JpegGuard {
  jpeg_decompress_struct cinfo;
  bool created = false;
  ~JpegGuard() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

// Header: dimensions and the colour space Pillow asks for.
bool read_header(jpeg_decompress_struct* cinfo, JpegErrors* e) {
  if (setjmp(e->jump)) return false;
  jpeg_read_header(cinfo, TRUE);
  switch (cinfo->num_components) {
    case 1: cinfo->out_color_space = JCS_GRAYSCALE; break;
    case 3: cinfo->out_color_space = JCS_RGB; break;
    case 4: cinfo->out_color_space = JCS_CMYK; break;
    default: break;  // refused by the caller
  }
  return true;
}

bool read_pixels(jpeg_decompress_struct* cinfo, JpegErrors* e, uint8_t* out, size_t row_bytes) {
  if (setjmp(e->jump)) return false;
  jpeg_start_decompress(cinfo);
  if (cinfo->output_width != cinfo->image_width || cinfo->output_height != cinfo->image_height ||
      cinfo->output_components * cinfo->output_width != row_bytes) {
    std::snprintf(e->message, sizeof e->message, "unexpected output geometry");
    return false;
  }
  while (cinfo->output_scanline < cinfo->output_height) {
    JSAMPROW row = out + static_cast<size_t>(cinfo->output_scanline) * row_bytes;
    jpeg_read_scanlines(cinfo, &row, 1);
  }
  return true;
}

// Pillow's cmyk2rgb: nk = 255 - k; channel = nk - c * nk / 255 (rounded by
// its MULDIV255 shift trick), clipped.
uint8_t cmyk_channel(int c, int k) {
  const int nk = 255 - k;
  const int tmp = c * nk + 128;
  const int v = nk - (((tmp >> 8) + tmp) >> 8);
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

}  // namespace

ImageU8 decode_jpeg(const uint8_t* data, size_t size, const std::string& where) {
  JpegErrors e{};
  JpegGuard g;
  g.cinfo.err = jpeg_std_error(&e.mgr);
  e.mgr.error_exit = on_error_exit;
  e.mgr.output_message = on_output_message;
  jpeg_create_decompress(&g.cinfo);  // cannot fail but by running out of memory, which error_exit would report
  g.created = true;
  jpeg_source_mgr src{};
  src.next_input_byte = data;
  src.bytes_in_buffer = size;
  src.init_source = source_init;
  src.fill_input_buffer = source_fill;
  src.skip_input_data = source_skip;
  src.resync_to_restart = jpeg_resync_to_restart;
  src.term_source = source_term;
  g.cinfo.src = &src;

  auto fail = [&]() -> Error {
    if (e.truncated) return invalid_input(where, "truncated JPEG (the data ends before the image does)");
    return invalid_input(where, std::string("corrupt JPEG: ") + e.message);
  };
  if (!read_header(&g.cinfo, &e)) throw fail();
  const int comps = g.cinfo.num_components;
  if (comps != 1 && comps != 3 && comps != 4)
    throw unsupported(where, "a JPEG of " + std::to_string(comps) + " components (Pillow, and so transformers, "
                             "reads 1, 3 or 4)");
  check_image_size(g.cinfo.image_width, g.cinfo.image_height, where);

  const int64_t w = g.cinfo.image_width, h = g.cinfo.image_height;
  std::vector<uint8_t> raw(static_cast<size_t>(w * h * comps));
  if (!read_pixels(&g.cinfo, &e, raw.data(), static_cast<size_t>(w * comps))) throw fail();

  ImageU8 img;
  img.width = w;
  img.height = h;
  if (comps == 3) {
    img.rgb = std::move(raw);
    return img;
  }
  img.rgb.resize(static_cast<size_t>(w * h * 3));
  for (int64_t i = 0; i < w * h; ++i) {
    uint8_t* out = img.rgb.data() + 3 * i;
    if (comps == 1) {
      out[0] = out[1] = out[2] = raw[i];
    } else {
      const uint8_t* p = raw.data() + 4 * i;  // inverted CMYK, as Pillow assumes
      const int k = 255 - p[3];
      for (int c = 0; c < 3; ++c) out[c] = cmyk_channel(255 - p[c], k);
    }
  }
  return img;
}

}  // namespace qf
