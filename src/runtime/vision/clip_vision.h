// LLaVA's vision side: a CLIP vision transformer (transformers'
// CLIPVisionModel, read up to the selected feature layer) and the
// multi-modal projector (Linear, activation, Linear) into the language
// model's width; LLaVA-NeXT's runs the same on every anyres tile and packs
// the tiles' rows with image_newline rows.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "formats/hf/model_config.h"
#include "runtime/vision/vision_ops.h"
#include "runtime/vision/vision_tower.h"

namespace qf::rt {

struct ClipVisionConfig {
  // vision_config (CLIPVisionConfig defaults)
  int64_t hidden = 768, intermediate = 3072, layers = 12, heads = 12, image_size = 224, patch_size = 32;
  double layer_norm_eps = 1e-5;
  vision::Activation act = vision::Activation::QuickGelu;
  // the llava config around it
  std::vector<int64_t> feature_layers{-2};  // vision_feature_layer: an index or a list, into hidden_states
  bool keep_cls = false;                    // vision_feature_select_strategy "full" (true) or "default"
  vision::Activation projector_act = vision::Activation::Gelu;
  bool projector_bias = true;               // multimodal_projector_bias
  int64_t out_hidden = 4096;                // the language model's hidden_size
  int64_t head_dim() const { return hidden / heads; }
  int64_t grid() const { return image_size / patch_size; }
};

// InvalidInput naming `where` for inconsistent values (heads not dividing
// hidden_size, an image_size patch_size does not divide, a feature layer
// outside -(layers + 1) .. layers); Unsupported for a vision tower other than
// CLIP (vision_config.model_type) or a strategy other than default/full.
ClipVisionConfig parse_clip_vision_config(const ModelConfig& cfg, const std::string& where);

// Reads and checks the tower's tensors ("vision_tower.vision_model.*",
// "multi_modal_projector.*" working names) from `ck`.
std::unique_ptr<VisionTower> load_clip_vision(const ModelConfig& cfg, const Checkpoint& ck, const std::string& where);

// LLaVA-NeXT (modeling_llava_next's get_image_features and
// pack_image_features): the tower above on each [3, S, S] tile of a
// [tiles, 3, S, S] input, then the whole image's rows, then the high-resolution
// tiles' rows arranged as the full grid (rows of tiles, each tile's patch
// rows), unpadded to the original image's aspect (PixelValues' grid_h,
// grid_w) and with the "image_newline" vector after each grid row. The grid's
// shape is the one select_best_resolution picks from `pinpoints` (config.json's
// image_grid_pinpoints), each a whole number of vision_config.image_size
// tiles (InvalidInput otherwise). Unsupported for
// vision_feature_select_strategy "full" (transformers' packing reshapes each
// tile's rows as its patch grid, which a CLS row does not fit); NotFound or
// InvalidInput naming image_newline when it is missing or not [text hidden].
std::unique_ptr<VisionTower> load_llava_next_vision(const ModelConfig& cfg, const Checkpoint& ck,
                                                    const std::string& where, const GridPinpoints& pinpoints);

}  // namespace qf::rt
