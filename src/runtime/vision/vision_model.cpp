// VisionModel::load: the processor and tower of the model's type, and the
// checks that tie the two files together (the processor must cut the
// patches the tower was trained on).
#include "runtime/vision/vision_model.h"

#include "core/error.h"
#include "formats/safetensors.h"
#include "runtime/vision/anyres.h"
#include "runtime/vision/clip_vision.h"
#include "runtime/vision/qwen2_vl_vision.h"

namespace qf::rt {
namespace {

void check_equal(int64_t processor, const char* pkey, int64_t tower, const char* tkey, const std::string& pre_file) {
  if (processor != tower)
    throw invalid_input(pre_file, std::string(pkey) + " " + std::to_string(processor) + " differs from config.json's " +
                                      tkey + " " + std::to_string(tower));
}

// The processor tiles with preprocessor_config.json's image_grid_pinpoints
// and the model packs with config.json's; transformers reads each from its
// own file (defaulting to 336-pixel resolutions when absent). Here a file
// without them takes the other's; both absent, or different, is an error:
// the processor would cut tiles the model does not count.
GridPinpoints reconcile_pinpoints(const ModelConfig& cfg, ImagePreprocessConfig& pre, const std::string& where) {
  const std::string config = where + "/config.json";
  GridPinpoints model;
  if (auto it = cfg.raw.find("image_grid_pinpoints"); it != cfg.raw.end() && !it->is_null())
    model = parse_grid_pinpoints(*it, config, "image_grid_pinpoints");
  if (model.empty() && pre.grid_pinpoints.empty())
    throw invalid_input(where, "image_grid_pinpoints is in neither config.json nor preprocessor_config.json; "
                               "llava_next tiles images at those resolutions");
  if (model.empty()) return pre.grid_pinpoints;
  if (pre.grid_pinpoints.empty()) {
    check_grid_pinpoints(model, pre.crop_height, pre.where, "crop_size.height");
    pre.grid_pinpoints = model;
  } else if (pre.grid_pinpoints != model) {
    throw invalid_input(pre.where, "image_grid_pinpoints " + pinpoints_str(pre.grid_pinpoints) +
                                       " differs from config.json's " + pinpoints_str(model));
  }
  return model;
}

}  // namespace

VisionModel VisionModel::load(const ModelConfig& cfg, const Checkpoint& ck, const std::filesystem::path& model_dir) {
  const std::string where = model_dir.string();
  if (!cfg.vlm)
    throw invalid_input(where, "model_type '" + cfg.model_type + "' is a text model; images need a vision-language "
                               "model (qwen2_vl, llava, llava_next)");
  VisionModel m;
  m.model_type_ = cfg.vlm->model_type;
  const std::string& type = m.model_type_;
  if (type == "qwen2_vl" || type == "qwen2_5_vl") {
    m.pre_ = load_image_preprocess_config(model_dir, ImageProcessorKind::Qwen2VL);
    const Qwen2VLVisionConfig vc = parse_qwen2_vl_vision_config(cfg, where);
    check_equal(m.pre_.patch_size, "patch_size", vc.patch_size, "vision_config.patch_size", m.pre_.where);
    check_equal(m.pre_.merge_size, "merge_size", vc.merge_size, "vision_config.spatial_merge_size", m.pre_.where);
    check_equal(m.pre_.temporal_patch_size, "temporal_patch_size", vc.temporal_patch_size,
                "vision_config.temporal_patch_size", m.pre_.where);
    m.tower_ = load_qwen2_vl_vision(cfg, ck, where);
  } else if (type == "llava") {
    m.pre_ = load_image_preprocess_config(model_dir, ImageProcessorKind::Clip);
    const ClipVisionConfig vc = parse_clip_vision_config(cfg, where);
    if (m.pre_.do_center_crop) {
      check_equal(m.pre_.crop_height, "crop_size.height", vc.image_size, "vision_config.image_size", m.pre_.where);
      check_equal(m.pre_.crop_width, "crop_size.width", vc.image_size, "vision_config.image_size", m.pre_.where);
    }
    m.tower_ = load_clip_vision(cfg, ck, where);
  } else if (type == "llava_next") {
    m.pre_ = load_image_preprocess_config(model_dir, ImageProcessorKind::LlavaNext);
    const ClipVisionConfig vc = parse_clip_vision_config(cfg, where);
    // The tiles are cut crop_size.height square whether or not the center
    // crop runs; the tower reads image_size square tiles.
    check_equal(m.pre_.crop_height, "crop_size.height", vc.image_size, "vision_config.image_size", m.pre_.where);
    check_equal(m.pre_.crop_width, "crop_size.width", vc.image_size, "vision_config.image_size", m.pre_.where);
    const GridPinpoints pinpoints = reconcile_pinpoints(cfg, m.pre_, where);
    m.tower_ = load_llava_next_vision(cfg, ck, where, pinpoints);
  } else {
    throw unsupported(where, "images for model_type '" + type +
                                 "' are not supported (supported: qwen2_vl, qwen2_5_vl, llava, llava_next)");
  }
  return m;
}

PixelValues VisionModel::preprocess(const ImageU8& image) const { return preprocess_image(pre_, image); }

ImageEmbedding VisionModel::embed_pixels(const PixelValues& pv, ThreadPool& pool) const {
  return tower_->forward(pv, pool);
}

ImageEmbedding VisionModel::embed(const ImageU8& image, ThreadPool& pool) const {
  return tower_->forward(preprocess(image), pool);
}

}  // namespace qf::rt
