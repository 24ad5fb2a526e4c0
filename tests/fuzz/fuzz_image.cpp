// Fuzz target: an image file (PNG or JPEG, told by its signature, as
// read_image reads it). A file that decodes must hold width * height * 3
// bytes within the size limits, and must go through Pillow's resize (down
// to a few pixels with BICUBIC, whose negative lobes need clipping) to the
// size asked for.
#include "formats/image/image_file.h"
#include "formats/image/pil_resize.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  qf::ImageU8 img;
  bool ok = false;
  qf::fuzz::run([&] {
    img = qf::decode_image(data, size, "fuzz image");
    ok = true;
  });
  if (!ok) return 0;
  if (img.width < 1 || img.height < 1 || img.width > qf::kMaxImageSide || img.height > qf::kMaxImageSide ||
      img.rgb.size() != static_cast<size_t>(img.width * img.height * 3))
    qf::fuzz::fail("decode_image returned an image of inconsistent size");
  qf::fuzz::run([&] {
    const qf::ImageU8 small = qf::pil_resize(img, 1 + img.width % 7, 1 + img.height % 5, qf::PilFilter::Bicubic);
    if (small.rgb.size() != static_cast<size_t>(small.width * small.height * 3)) qf::fuzz::fail("resize size");
  });
  return 0;
}
