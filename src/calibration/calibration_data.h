// Calibration token sequences from a plain-text or jsonl file.
//
// Plain text: the whole file is tokenized once and `num_samples` windows of
// `seq_len` tokens are drawn at seeded random offsets (as GPTQ's reference
// draws its C4 windows); the first token of each window is replaced by BOS so
// that every sample looks like the start of a document. jsonl: one JSON object
// per line, the string under `text_field` is a sample (tokenized with BOS,
// truncated to seq_len, samples shorter than 2 tokens skipped); the records
// are shuffled with the seed and the first num_samples kept. Same inputs and
// seed, same sequences. The file is checked to be text first
// (core/text_input.h): binary or UTF-16/32 content is InvalidInput, invalid
// UTF-8 a warning.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <functional>

#include "core/text_input.h"
#include "formats/tokenizer/tokenizer.h"
#include "runtime/vision/multimodal_prompt.h"

namespace qf {

struct CalibrationOptions {
  int64_t num_samples = 128;
  int64_t seq_len = 512;
  uint64_t seed = 0;
  std::string text_field = "text";  // jsonl
  WarningSink warn;                 // invalid UTF-8 in the file (nullptr: stderr)
};

std::vector<std::vector<int32_t>> load_calibration(const std::filesystem::path& file, const Tokenizer& tok,
                                                   const CalibrationOptions& opts);

// A sample of a vision-language model's calibration: its tokens and, for an
// image record, the image's rows and positions (rt::image_text_sequence).
struct CalibrationSample {
  std::vector<int32_t> tokens;
  rt::MultimodalInputs inputs;  // empty for a text sample
  bool image = false;
};
// Makes an image record's sequence from the image's path and the text's
// tokens (without BOS).
using ImageSampleFn =
    std::function<rt::MultimodalSequence(const std::filesystem::path& image, const std::vector<int32_t>& text)>;

// load_calibration, where a jsonl record may also name an image:
// {"image": PATH, "text": ...} (PATH relative to the jsonl's folder unless
// absolute). Records are shuffled as load_calibration shuffles them (a file
// of text records gives the same samples); an image record's text is
// truncated so that the sample holds at most seq_len tokens, its image whole
// (an image longer than seq_len keeps its image and one text token). Without
// `image`, a record naming an image is InvalidInput naming the line.
std::vector<CalibrationSample> load_calibration_samples(const std::filesystem::path& file, const Tokenizer& tok,
                                                        const CalibrationOptions& opts, const ImageSampleFn& image);


}  // namespace qf
