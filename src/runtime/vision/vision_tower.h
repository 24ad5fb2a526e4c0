// What a vision tower (with its merger or projector) turns one image's pixel
// values into: rows in the language model's embedding space, one per image
// token, and the grid the language model's multimodal RoPE positions them on.
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "runtime/vision/image_preprocess.h"

namespace qf::rt {

struct ImageEmbedding {
  std::vector<float> rows;  // [n_rows, hidden] row-major
  int64_t n_rows = 0, hidden = 0;
  // The image tokens' grid after merging (Qwen2-VL: grid_t, grid_h / merge,
  // grid_w / merge, whose product is n_rows); LLaVA: 1, 1, n_rows.
  int64_t grid_t = 1, grid_h = 1, grid_w = 0;
};

class VisionTower {
 public:
  virtual ~VisionTower() = default;
  // InvalidInput when the pixel values do not have the shape this tower
  // reads (another processor's output, a grid that does not merge).
  virtual ImageEmbedding forward(const PixelValues& pv, ThreadPool& pool) const = 0;
  virtual int64_t hidden() const = 0;  // the language model's width
};

}  // namespace qf::rt
