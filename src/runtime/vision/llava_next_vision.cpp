// LLaVA-NeXT's vision side: CLIP and the projector per tile (clip_vision.cpp),
// then the packing of modeling_llava_next.pack_image_features. Packing only
// copies rows, so the result is as close to transformers' as the tiles' rows
// are.
#include <algorithm>

#include "core/error.h"
#include "formats/safetensors.h"
#include "runtime/vision/anyres.h"
#include "runtime/vision/clip_vision.h"

namespace qf::rt {
namespace {

class LlavaNextVision final : public VisionTower {
 public:
  LlavaNextVision(const ClipVisionConfig& c, std::unique_ptr<VisionTower> clip, std::vector<float> newline,
                  GridPinpoints pinpoints)
      : c_(c), clip_(std::move(clip)), newline_(std::move(newline)), pinpoints_(std::move(pinpoints)) {}

  int64_t hidden() const override { return c_.out_hidden; }

  ImageEmbedding forward(const PixelValues& pv, ThreadPool& pool) const override {
    const int64_t S = c_.image_size, g = c_.grid(), D = c_.out_hidden;
    if (pv.shape.size() != 4 || pv.shape[1] != 3 || pv.shape[2] != S || pv.shape[3] != S || pv.grid_h < 1 ||
        pv.grid_w < 1 || pv.values.size() != static_cast<size_t>(pv.shape[0] * 3 * S * S))
      throw invalid_input("llava_next vision tower", "pixel values of shape " + shape_str(pv.shape) +
                                                         " are not the [tiles, 3, " + std::to_string(S) + ", " +
                                                         std::to_string(S) + "] anyres tiles of an image");
    const auto [best_h, best_w] = select_best_resolution(pv.grid_h, pv.grid_w, pinpoints_);
    const int64_t nph = best_h / S, npw = best_w / S, tiles = 1 + nph * npw;
    if (pv.shape[0] != tiles)
      throw invalid_input("llava_next vision tower",
                          std::to_string(pv.shape[0]) + " tiles, but an image of " + std::to_string(pv.grid_w) + "x" +
                              std::to_string(pv.grid_h) + " is tiled at " + std::to_string(best_h) + "x" +
                              std::to_string(best_w) + " (height x width) by config.json's image_grid_pinpoints: " +
                              std::to_string(tiles) + " tiles with the whole image");

    // Every tile through the tower and the projector: g*g rows each.
    std::vector<std::vector<float>> rows(static_cast<size_t>(tiles));
    const size_t plane = static_cast<size_t>(3 * S * S);
    for (int64_t t = 0; t < tiles; ++t) {
      PixelValues one;
      one.values.assign(pv.values.begin() + static_cast<std::ptrdiff_t>(t * plane),
                        pv.values.begin() + static_cast<std::ptrdiff_t>((t + 1) * plane));
      one.shape = {3, S, S};
      one.grid_h = one.grid_w = S;
      rows[static_cast<size_t>(t)] = clip_->forward(one, pool).rows;
    }

    // The whole image's rows, then the full grid (tile row, patch row) x
    // (tile column, patch column), unpadded, image_newline after each row.
    const UnpadWindow u = anyres_unpad(pv.grid_h, pv.grid_w, nph * g, npw * g);
    ImageEmbedding e;
    e.hidden = D;
    e.rows = std::move(rows[0]);
    for (int64_t r = u.top; r < u.bottom; ++r) {
      for (int64_t col = u.left; col < u.right; ++col) {
        const std::vector<float>& tile = rows[static_cast<size_t>(1 + (r / g) * npw + col / g)];
        const float* src = tile.data() + ((r % g) * g + col % g) * D;
        e.rows.insert(e.rows.end(), src, src + D);
      }
      e.rows.insert(e.rows.end(), newline_.begin(), newline_.end());
    }
    e.n_rows = static_cast<int64_t>(e.rows.size()) / D;
    e.grid_t = 1;
    e.grid_h = 1;
    e.grid_w = e.n_rows;
    return e;
  }

 private:
  ClipVisionConfig c_;
  std::unique_ptr<VisionTower> clip_;
  std::vector<float> newline_;
  GridPinpoints pinpoints_;
};

}  // namespace

std::unique_ptr<VisionTower> load_llava_next_vision(const ModelConfig& cfg, const Checkpoint& ck,
                                                    const std::string& where, const GridPinpoints& pinpoints) {
  const ClipVisionConfig c = parse_clip_vision_config(cfg, where);
  if (c.keep_cls)
    throw unsupported(where, "vision_feature_select_strategy 'full' for llava_next: transformers packs each tile's "
                             "rows as its (image_size / patch_size)^2 patch grid, which the kept CLS row does not "
                             "fit (supported: default)");
  check_grid_pinpoints(pinpoints, c.image_size, where + "/config.json", "vision_config.image_size");
  std::unique_ptr<VisionTower> clip = load_clip_vision(cfg, ck, where);
  const vision::VisionTensors t(cfg, ck, where);
  std::vector<float> newline =
      t.get("image_newline", {c.out_hidden}, "the text hidden_size " + std::to_string(c.out_hidden));
  return std::make_unique<LlavaNextVision>(c, std::move(clip), std::move(newline), pinpoints);
}

}  // namespace qf::rt
