// Runs llama.cpp's CLIP encoder (examples/llava/clip.h) on an image that is
// already preprocessed, and writes the image embeddings: the check of an
// mmproj file against reference embeddings (scripts/bench/vlm_llama_cpp_check.sh
// builds it against a llama.cpp tree; it is not part of quantforge's build).
//
//   vlm_clip_embed MMPROJ PIXELS.f32 HEIGHT WIDTH OUT.f32
//
// PIXELS.f32: HEIGHT x WIDTH x 3 little-endian floats, normalized (mean/std
// applied), row-major with the channel fastest. OUT.f32: tokens x width floats.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "clip.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s MMPROJ PIXELS.f32 HEIGHT WIDTH OUT.f32\n", argv[0]);
    return 2;
  }
  const int h = std::atoi(argv[3]), w = std::atoi(argv[4]);
  std::vector<float> px(static_cast<size_t>(h) * w * 3);
  FILE* in = std::fopen(argv[2], "rb");
  if (!in || std::fread(px.data(), sizeof(float), px.size(), in) != px.size()) {
    std::fprintf(stderr, "%s: cannot read %zu floats\n", argv[2], px.size());
    return 1;
  }
  std::fclose(in);
  clip_ctx* ctx = clip_model_load(argv[1], 1);
  if (!ctx) return 1;
  const size_t bytes = clip_is_qwen2vl(ctx) ? clip_embd_nbytes_by_img(ctx, h, w) : clip_embd_nbytes(ctx);
  std::vector<float> out(bytes / sizeof(float));
  if (!clip_encode_float_image(ctx, 1, px.data(), h, w, out.data())) return 1;
  FILE* o = std::fopen(argv[5], "wb");
  if (!o || std::fwrite(out.data(), sizeof(float), out.size(), o) != out.size()) return 1;
  std::fclose(o);
  std::printf("%zu tokens x %d\n", out.size() / clip_n_mmproj_embd(ctx), clip_n_mmproj_embd(ctx));
  clip_free(ctx);
  return 0;
}
