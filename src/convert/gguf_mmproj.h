// A vision-language model's vision encoder and projector as the CLIP
// "mmproj" GGUF that llama.cpp's clip.cpp (b4748: llama-llava-cli,
// llama-qwen2vl-cli) loads beside the language model's GGUF: Qwen2-VL's ViT
// and patch merger, LLaVA / LLaVA-NeXT's CLIP tower and MLP projector.
// docs/formats.md lists the keys and tensors.
//
// A plan (plan_mmproj) checks the vision config and tensors and names every
// output tensor with the slice of the checkpoint it holds, before anything is
// written; write_mmproj streams the file and leaves it unfinished, so that the
// caller renames it into place together with the language model's file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "formats/gguf/gguf_writer.h"
#include "formats/hf/model_config.h"

namespace qf {

class Checkpoint;

// Where an mmproj tensor's values come from.
struct MmprojSource {
  enum class Kind {
    Whole,     // the checkpoint tensor as it is
    Rows,      // rows [begin, end) of its first axis (a fused qkv's third)
    Temporal,  // slice `begin` of axis 2 of a Conv3d weight [out, in, T, kh, kw]
    Zeros,     // no source: zeros (a placeholder clip.cpp loads but never uses)
  };
  Kind kind = Kind::Whole;
  std::string tensor;  // working name in the checkpoint ("" for Zeros)
  int64_t begin = 0, end = 0;
};

struct MmprojTensor {
  std::string name;          // "v.blk.0.attn_q.weight"
  uint32_t type = 0;         // ggml_type::F32 or ggml_type::F16
  std::vector<uint64_t> ne;  // ggml order (ne[0] is the row length)
  MmprojSource src;
};

struct MmprojSpec {
  std::string description;  // general.description
  std::string name;         // general.name
  uint32_t file_type = 1;   // general.file_type: 1 when the matrices are f16, 0 when f32
  std::string projector_type;                      // clip.projector_type: "qwen2vl_merger" or "mlp"
  bool llava_projector = false, qwen2vl_merger = false;  // clip.has_llava_projector, clip.has_qwen2vl_merger
  bool use_gelu = false, use_silu = false;         // neither: quick GELU
  uint32_t image_size = 0, patch_size = 0;         // clip.vision.*
  uint32_t embedding_length = 0, feed_forward_length = 0, head_count = 0, block_count = 0, projection_dim = 0;
  float layer_norm_epsilon = 1e-6f;
  std::vector<float> image_mean, image_std;  // 3 each
  // LLaVA-NeXT only (empty / 0: not written).
  std::vector<int32_t> image_grid_pinpoints;  // flattened [h, w] pairs
  std::string mm_patch_merge_type;            // "spatial_unpad"
  uint32_t image_crop_resolution = 0;
  std::vector<MmprojTensor> tensors;  // in file order
};

// The mmproj path that goes with a language model's GGUF path:
// "mmproj-<file name>" in the same folder.
std::filesystem::path default_mmproj_path(const std::filesystem::path& lm_out);

// The mmproj of a vision-language model (c.vlm set) from its checkpoint (with
// apply_hf_tensor_naming's working names) and the model folder `dir` (for
// preprocessor_config.json; `dir` also names the model in messages).
// `name` becomes general.name. Throws before anything is written:
// Unsupported for qwen2_5_vl (b4748's clip.cpp has no Qwen2.5-VL vision
// tower) and for settings clip.cpp cannot express (a spatial merge other than
// 2x2, a list of feature layers, the "full" feature strategy, an activation
// it does not have); NotFound for a missing vision tensor; InvalidInput for a
// misshapen or non-float one, a vision tensor the model has no place for, or
// a malformed vision_config / preprocessor_config.json value.
MmprojSpec plan_mmproj(const ModelConfig& c, const Checkpoint& ck, const std::filesystem::path& dir,
                       const std::string& name);

// Writes the spec's metadata and every tensor's data and returns the writer
// unfinished: its finish() renames the file into place. A NaN or infinite
// value (or one beyond f16's range in an f16 tensor) is InvalidInput naming
// the tensor unless `allow_nonfinite`.
std::unique_ptr<GgufWriter> write_mmproj(const MmprojSpec& spec, const Checkpoint& ck, const std::filesystem::path& out,
                                         bool allow_nonfinite, const std::string& where);

}  // namespace qf
