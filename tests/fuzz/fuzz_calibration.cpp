// Fuzz target: a calibration file, read as JSON lines (calib.jsonl) and as
// plain text (calib.txt), through the text checks (binary, UTF-16, invalid
// UTF-8) and load_calibration with a small byte-fallback tokenizer; every
// sample must have 2 to seq_len tokens, all in range.
#include "calibration/calibration_data.h"
#include "core/text_input.h"
#include "fuzz_util.h"

namespace {

// A "llama" vocabulary: <unk>, <s>, </s>, the 256 byte tokens, a few words.
const qf::Tokenizer& tokenizer() {
  static const std::unique_ptr<qf::Tokenizer> tok = [] {
    qf::Vocab v;
    v.model = "llama";
    v.pre = "default";
    v.tokens = {"<unk>", "<s>", "</s>"};
    v.types = {qf::TokenType::Unknown, qf::TokenType::Control, qf::TokenType::Control};
    for (int b = 0; b < 256; ++b) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", b);
      v.tokens.push_back(buf);
      v.types.push_back(qf::TokenType::Byte);
    }
    for (const char* w : {"\xE2\x96\x81", "e", "t", "\xE2\x96\x81t", "he", "\xE2\x96\x81the", "text"}) {
      v.tokens.push_back(w);
      v.types.push_back(qf::TokenType::Normal);
    }
    v.scores.assign(v.tokens.size(), 0.0f);
    for (size_t i = 259; i < v.scores.size(); ++i) v.scores[i] = -static_cast<float>(i);
    v.unk_id = 0, v.bos_id = 1, v.eos_id = 2;
    v.add_bos = true;
    return qf::make_tokenizer(std::move(v));
  }();
  return *tok;
}

void check(const std::vector<std::vector<int32_t>>& samples, const qf::CalibrationOptions& o) {
  if (samples.empty() || static_cast<int64_t>(samples.size()) > o.num_samples) qf::fuzz::fail("bad sample count");
  for (const auto& s : samples) {
    if (s.size() < 2 || static_cast<int64_t>(s.size()) > o.seq_len) qf::fuzz::fail("bad sample length");
    for (int32_t id : s)
      if (id < 0 || id >= tokenizer().vocab_size()) qf::fuzz::fail("token id out of range");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const qf::Tokenizer& tok = tokenizer();
  qf::CalibrationOptions o;
  o.num_samples = 4;
  o.seq_len = 8;
  o.seed = size;
  o.warn = [](const std::string&) {};
  const auto jsonl = qf::fuzz::write_file("calibration/calib.jsonl", data, size);
  qf::fuzz::run([&] { check(qf::load_calibration(jsonl, tok, o), o); });
  const auto txt = qf::fuzz::write_file("calibration/calib.txt", data, size);
  qf::fuzz::run([&] { check(qf::load_calibration(txt, tok, o), o); });
  qf::fuzz::run([&] {
    const qf::CheckedText t = qf::check_text_input(std::string(reinterpret_cast<const char*>(data), size), "text");
    if (t.text.size() > size) qf::fuzz::fail("checked text grew");
  });
  return 0;
}
