// Qwen2-VL's vision transformer and patch merger (transformers'
// Qwen2VisionTransformerPretrainedModel): the patch embedding (a Conv3d whose
// stride is its kernel, so one matrix product over the flattened patches),
// `depth` pre-norm blocks with 2-D rotary attention over the whole image and
// an MLP, then the merger (LayerNorm, each merge window's patches side by
// side, Linear, exact GELU, Linear) into the language model's width.
//
// Qwen2.5-VL's (Qwen2_5_VisionTransformerPretrainedModel) differs in four
// places: RMSNorm instead of LayerNorm (blocks and merger), a gated MLP
// (down(act(gate(x)) * up(x)), all with biases), attention within windows
// of window_size pixels except in the fullatt_block_indexes blocks, and so
// the patches reordered window by window before the blocks (and the merged
// rows put back in image order after the merger).
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "formats/hf/model_config.h"
#include "runtime/vision/vision_ops.h"
#include "runtime/vision/vision_tower.h"

namespace qf::rt {

struct Qwen2VLVisionConfig {
  bool v2_5 = false;  // qwen2_5_vl
  int64_t depth = 32, embed_dim = 1280, num_heads = 16, mlp_hidden = 5120, in_channels = 3;
  int64_t patch_size = 14, merge_size = 2, temporal_patch_size = 2;
  int64_t out_hidden = 3584;  // vision_config.hidden_size: the merger's output, the LM's width
  vision::Activation act = vision::Activation::QuickGelu;
  int64_t window_size = 112;                   // 2.5: an attention window's side in pixels
  std::vector<int64_t> full_attention_blocks;  // 2.5: fullatt_block_indexes
  int64_t head_dim() const { return embed_dim / num_heads; }
  // 2.5: a window's side in merged units (window_size / merge / patch).
  int64_t window_units() const { return window_size / merge_size / patch_size; }
};

// Qwen2.5-VL's get_window_index for one image or video of grid_t x grid_h x
// grid_w patches: the merged units (groups of merge^2 consecutive patch
// rows) in window order (frame, window row, window column, then row-major
// inside the window, each window of window_units^2 units cut from the top
// left, the last ones short), and the windows' bounds in patch rows (empty
// windows dropped, as unique_consecutive drops them).
struct VisionWindows {
  std::vector<int64_t> order;     // order[j]: the image-order unit at window position j
  std::vector<int64_t> segments;  // 0, end of window 0, ..., n
};
VisionWindows qwen2_5_vl_windows(int64_t grid_t, int64_t grid_h, int64_t grid_w, int64_t merge, int64_t window_units);

// vision_config of a qwen2_vl or qwen2_5_vl model with transformers'
// defaults for absent keys (2.5 spells the width hidden_size, the MLP's
// intermediate_size and the merger's out_hidden_size); InvalidInput naming
// `where` for inconsistent values (heads not dividing the width, a head_dim
// the 2-D rotary embedding cannot split in four, a merger width other than
// the language model's hidden_size, a window smaller than one merged unit, a
// full-attention block past depth); Unsupported for other than 3 channels.
Qwen2VLVisionConfig parse_qwen2_vl_vision_config(const ModelConfig& cfg, const std::string& where);

// Reads and checks the tower's tensors ("visual.*" working names) from `ck`.
std::unique_ptr<VisionTower> load_qwen2_vl_vision(const ModelConfig& cfg, const Checkpoint& ck,
                                                  const std::string& where);

}  // namespace qf::rt
