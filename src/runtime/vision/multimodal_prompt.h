// One image-and-text sequence as a vision-language model's processor lays it
// out, with what the language model needs besides token ids: which rows of
// the vision side's output replace which tokens, and (multimodal RoPE) every
// token's three rotary positions.
//
// qwen2_vl, qwen2_5_vl: [BOS] <|vision_start|> N x <|image_pad|>
//   <|vision_end|> text. Tokens before the image count 0, 1, ... in all
//   three positions; image token (row r, column c of the merged grid) has
//   temporal position s, height s + r, width s + c, where s is the number of
//   tokens before it; the tokens after it resume at s + max(rows, columns)
//   (transformers' get_rope_index for one image).
// llava, llava_next: [BOS] N x <image> text, ordinary positions (LLaVA-NeXT's
//   N: the whole image's rows, the unpadded grid's and its image_newline
//   rows, as LlavaNextProcessor counts them).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "formats/hf/model_config.h"
#include "runtime/model.h"
#include "runtime/vision/vision_tower.h"

namespace qf::rt {

struct MultimodalSequence {
  std::vector<int32_t> tokens;
  MultimodalInputs inputs;
  int64_t first_text = 0;  // the index of the first text token after the image
};

// `image` is the vision side's output (its rows move into the sequence's
// inputs); `text` holds the text's tokens without BOS; `bos` is prepended
// when given.
// InvalidInput when the rows do not match the grid or the language model's
// width; Unsupported for a config without the tokens the layout needs.
MultimodalSequence image_text_sequence(const ModelConfig& c, ImageEmbedding image, const std::vector<int32_t>& text,
                                       std::optional<int32_t> bos);

// Turns an image file and a text's tokens (without BOS) into the sequence
// above: the model's vision side run on the image, its preprocessing as the
// model's preprocessor_config.json says.
using ImageSequencer =
    std::function<MultimodalSequence(const std::filesystem::path& image, const std::vector<int32_t>& text)>;

// The sequencer of a vision-language model loaded from `dir` (its
// checkpoint's vision tower and projector, its preprocessor_config.json);
// `bos` is prepended to each sequence when given. Unsupported for a text
// model or a vision side the runtime does not run.
ImageSequencer make_image_sequencer(const Model& model, const std::filesystem::path& dir, std::optional<int32_t> bos);

// One record of a jsonl file of texts and images: {"TEXT_FIELD": ..., "image":
// PATH} or {"TEXT_FIELD": ...}.
struct ImageTextRecord {
  std::string text;
  std::filesystem::path image;  // resolved against the file's folder; empty: a text record
  std::string where;            // FILE:LINE
};
// The records of `text` (the file's contents, read by the caller), blank
// lines skipped; InvalidInput naming FILE:LINE for a line that is not a
// JSON object with a string `text_field`, or whose "image" is not a
// non-empty string.
std::vector<ImageTextRecord> parse_image_text_records(const std::string& text, const std::filesystem::path& file,
                                                      const std::string& text_field);

// Whether a .jsonl file has a record with an "image" key (false for any other file).
bool jsonl_names_images(const std::filesystem::path& file);

}  // namespace qf::rt
