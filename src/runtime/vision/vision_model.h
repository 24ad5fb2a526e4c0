// The one entry point to a vision-language model's image side: its image
// processor (preprocessor_config.json) and vision tower with merger or
// projector (from the checkpoint), turning an image into the rows that
// replace the image tokens in the language model's input.
//
//   ModelConfig cfg = load_model_config(dir);
//   Checkpoint ck = Checkpoint::open(dir);
//   apply_hf_tensor_naming(cfg, ck);             // vision tensors under their working names
//   VisionModel vm = VisionModel::load(cfg, ck, dir);
//   ImageEmbedding e = vm.embed(read_image(path));  // e.n_rows x e.hidden
//
// Supported: qwen2_vl and qwen2_5_vl (Qwen2VLImageProcessor, the ViT and
// patch merger; 2.5's window attention, RMSNorm and gated MLP), llava
// (CLIPImageProcessor, a CLIP tower and the projector) and llava_next
// (LlavaNextImageProcessor's anyres tiles, each through the CLIP tower and
// projector, packed into the full grid unpadded to the image's aspect with
// image_newline rows; runtime/vision/anyres.h).
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "core/thread_pool.h"
#include "formats/hf/model_config.h"
#include "formats/image/image_file.h"
#include "runtime/vision/image_preprocess.h"
#include "runtime/vision/vision_tower.h"

namespace qf {
class Checkpoint;
}

namespace qf::rt {

class VisionModel {
 public:
  // Reads <model_dir>/preprocessor_config.json and the vision tensors of
  // `ck` (every one checked against vision_config; the weights are copied,
  // widened to f32, so `ck` need not outlive the model). InvalidInput for a
  // text-only model or when the processor's patch geometry disagrees with
  // the tower's (llava_next: image_grid_pinpoints missing from both
  // config files, different in the two, or not whole tiles); errors name the
  // file, key or tensor.
  static VisionModel load(const ModelConfig& cfg, const Checkpoint& ck, const std::filesystem::path& model_dir);

  const std::string& model_type() const { return model_type_; }
  const ImagePreprocessConfig& preprocess_config() const { return pre_; }
  int64_t hidden() const { return tower_->hidden(); }

  PixelValues preprocess(const ImageU8& image) const;
  ImageEmbedding embed_pixels(const PixelValues& pv, ThreadPool& pool = ThreadPool::global()) const;
  ImageEmbedding embed(const ImageU8& image, ThreadPool& pool = ThreadPool::global()) const;

 private:
  std::string model_type_;
  ImagePreprocessConfig pre_;
  std::shared_ptr<const VisionTower> tower_;
};

}  // namespace qf::rt
