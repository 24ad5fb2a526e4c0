// make_image_sequencer: the model's vision side, loaded once, run per image.
#include "core/error.h"
#include "formats/hf/model_tensors.h"
#include "formats/image/image_file.h"
#include "formats/safetensors.h"
#include "runtime/vision/multimodal_prompt.h"
#include "runtime/vision/vision_model.h"

namespace qf::rt {

ImageSequencer make_image_sequencer(const Model& model, const std::filesystem::path& dir, std::optional<int32_t> bos) {
  const ModelConfig& cfg = model.config();
  if (!cfg.vlm) throw unsupported(dir.string(), "not a vision-language model: it takes no images");
  Checkpoint ck = Checkpoint::open(dir);
  apply_hf_tensor_naming(cfg, ck);
  auto vision = std::make_shared<const VisionModel>(VisionModel::load(cfg, ck, dir));
  if (vision->hidden() != cfg.hidden_size)
    throw invalid_input((dir / "config.json").string(), "the projector gives rows of width " +
                                                            std::to_string(vision->hidden()) + ", the language model takes " +
                                                            std::to_string(cfg.hidden_size));
  return [vision, cfg, bos](const std::filesystem::path& image, const std::vector<int32_t>& text) {
    return image_text_sequence(cfg, vision->embed(read_image(image)), text, bos);
  };
}

}  // namespace qf::rt
