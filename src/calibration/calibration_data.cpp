#include "calibration/calibration_data.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace qf {

std::vector<std::vector<int32_t>> load_calibration(const std::filesystem::path& file, const Tokenizer& tok,
                                                   const CalibrationOptions& o) {
  std::vector<std::vector<int32_t>> out;
  for (CalibrationSample& s : load_calibration_samples(file, tok, o, {})) out.push_back(std::move(s.tokens));
  return out;
}

std::vector<CalibrationSample> load_calibration_samples(const std::filesystem::path& file, const Tokenizer& tok,
                                                        const CalibrationOptions& o, const ImageSampleFn& image) {
  const std::string where = file.string();
  if (o.num_samples < 1) throw invalid_input(where, "num_samples must be at least 1");
  if (o.seq_len < 2) throw invalid_input(where, "seq_len must be at least 2");
  const std::string text = read_text_input(file, o.warn);
  // splitmix64 with our own range reduction and shuffle: the same samples
  // for a seed whatever the C++ standard library.
  uint64_t state = o.seed;
  auto next = [&state] {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  std::vector<CalibrationSample> out;
  const bool bos = tok.bos_id() >= 0;
  if (file.extension() == ".jsonl") {
    std::vector<rt::ImageTextRecord> records = rt::parse_image_text_records(text, file, o.text_field);
    for (size_t i = records.size(); i > 1; --i) std::swap(records[i - 1], records[next() % i]);
    for (const rt::ImageTextRecord& r : records) {
      if (static_cast<int64_t>(out.size()) >= o.num_samples) break;
      CalibrationSample s;
      if (!r.image.empty()) {
        if (!image)
          throw invalid_input(r.where, "the record names an image, but the model is not a vision-language model");
        rt::MultimodalSequence m = image(r.image, tok.encode(r.text, false));
        const auto keep = static_cast<size_t>(std::max<int64_t>(o.seq_len, m.first_text + 1));
        if (m.tokens.size() > keep) {
          m.tokens.resize(keep);
          if (!m.inputs.embed_row.empty()) m.inputs.embed_row.resize(keep);
          if (!m.inputs.rope_pos.empty()) m.inputs.rope_pos.resize(3 * keep);
        }
        s.tokens = std::move(m.tokens);
        s.inputs = std::move(m.inputs);
        s.image = true;
      } else {
        s.tokens = tok.encode(r.text, bos);
        if (static_cast<int64_t>(s.tokens.size()) > o.seq_len) s.tokens.resize(static_cast<size_t>(o.seq_len));
      }
      if (s.tokens.size() < 2) continue;
      out.push_back(std::move(s));
    }
    if (out.empty()) throw invalid_input(where, "no record with at least 2 tokens");
    return out;
  }
  const std::vector<int32_t> ids = tok.encode(text, bos);
  if (static_cast<int64_t>(ids.size()) < o.seq_len)
    throw invalid_input(where, "the text has " + std::to_string(ids.size()) + " tokens, fewer than one sample of " +
                                   std::to_string(o.seq_len) + " (use a longer text or a smaller seq_len)");
  const uint64_t span = static_cast<uint64_t>(ids.size()) - static_cast<uint64_t>(o.seq_len) + 1;
  for (int64_t i = 0; i < o.num_samples; ++i) {
    const int64_t s = static_cast<int64_t>(next() % span);
    CalibrationSample c;
    c.tokens.assign(ids.begin() + s, ids.begin() + s + o.seq_len);
    if (bos) c.tokens[0] = tok.bos_id();
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace qf
