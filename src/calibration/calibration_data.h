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

#include "core/text_input.h"
#include "formats/tokenizer/tokenizer.h"

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

}  // namespace qf
