#include "calibration/calibration_data.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace qf {

std::vector<std::vector<int32_t>> load_calibration(const std::filesystem::path& file, const Tokenizer& tok,
                                                   const CalibrationOptions& o) {
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
  std::vector<std::vector<int32_t>> out;
  const bool bos = tok.bos_id() >= 0;
  if (file.extension() == ".jsonl") {
    std::vector<std::string> samples;
    size_t b = 0, line_no = 0;
    while (b < text.size()) {
      size_t e = text.find('\n', b);
      if (e == std::string::npos) e = text.size();
      const std::string line = text.substr(b, e - b);
      ++line_no;
      b = e + 1;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& ex) {
        throw invalid_input(where + ":" + std::to_string(line_no), std::string("not valid JSON: ") + ex.what());
      }
      if (!j.is_object() || !j.contains(o.text_field) || !j[o.text_field].is_string())
        throw invalid_input(where + ":" + std::to_string(line_no), "no string field '" + o.text_field + "'");
      samples.push_back(j[o.text_field].get<std::string>());
    }
    for (size_t i = samples.size(); i > 1; --i) std::swap(samples[i - 1], samples[next() % i]);
    for (const auto& s : samples) {
      if (static_cast<int64_t>(out.size()) >= o.num_samples) break;
      std::vector<int32_t> ids = tok.encode(s, bos);
      if (ids.size() < 2) continue;
      if (static_cast<int64_t>(ids.size()) > o.seq_len) ids.resize(static_cast<size_t>(o.seq_len));
      out.push_back(std::move(ids));
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
    std::vector<int32_t> w(ids.begin() + s, ids.begin() + s + o.seq_len);
    if (bos) w[0] = tok.bos_id();
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace qf
