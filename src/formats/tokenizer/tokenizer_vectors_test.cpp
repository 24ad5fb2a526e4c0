// Parity with real tokenizers: llama.cpp's vocab test vectors, whose expected
// ids come from the Hugging Face tokenizers library (see ../shared/data/README.md).
//
// File format, checked byte by byte:
//   NAME.gguf.inp: each input is followed by "\n__ggml_vocab_test__\n", the
//     last one included (so the file ends with the separator line). An input
//     may be empty or consist of newlines only; the separator's leading "\n"
//     is not part of the input.
//   NAME.gguf.out: one line per input, ids separated by spaces (each line
//     starts with a space; an empty input has an empty line), "\n" after every
//     line. No BOS is included.
#include <algorithm>
#include <iostream>
#include <sstream>

#include "core/io.h"
#include "formats/tokenizer/tokenizer.h"
#include "test_util.h"

namespace qf {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kSeparator = "\n__ggml_vocab_test__\n";

std::vector<std::string> split_inputs(const std::string& text) {
  std::vector<std::string> inputs;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(kSeparator, pos);
    if (end == std::string::npos) {
      ADD_FAILURE() << "trailing text without a separator: " << text.substr(pos, 40);
      break;
    }
    inputs.push_back(text.substr(pos, end - pos));
    pos = end + kSeparator.size();
  }
  return inputs;
}

std::vector<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<std::vector<int32_t>> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ids(line);
    std::vector<int32_t> row;
    for (int32_t id; ids >> id;) row.push_back(id);
    EXPECT_TRUE(ids.eof()) << "bad id line: " << line;
    lines.push_back(std::move(row));
  }
  return lines;
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s.append(" ").append(std::to_string(id));
  return s.empty() ? "(none)" : s;
}

std::string escape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else out += static_cast<char>(c);
  }
  return out;
}

std::vector<fs::path> vector_files() {
  std::vector<fs::path> out;
  const fs::path dir = test::shared_dir() / "data" / "tokenizer-vectors";
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".gguf") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(TokenizerVectors, SplitsInputsExactly) {
  EXPECT_EQ(split_inputs("a\n__ggml_vocab_test__\n\n__ggml_vocab_test__\n\n\n__ggml_vocab_test__\n"),
            (std::vector<std::string>{"a", "", "\n"}));
  EXPECT_EQ(parse_ids(" 1 2\n\n 3\n"), (std::vector<std::vector<int32_t>>{{1, 2}, {}, {3}}));
  std::vector<fs::path> files = vector_files();
  if (files.empty()) GTEST_SKIP() << "../shared/data/tokenizer-vectors is absent";
  for (const fs::path& gguf : files) {
    SCOPED_TRACE(gguf.filename().string());
    auto inputs = split_inputs(read_text_file(gguf.string() + ".inp"));
    auto expected = parse_ids(read_text_file(gguf.string() + ".out"));
    EXPECT_EQ(inputs.size(), expected.size());
    EXPECT_GE(inputs.size(), 40u);
  }
}

TEST(TokenizerVectors, MatchesHuggingFaceIds) {
  std::vector<fs::path> files = vector_files();
  if (files.empty()) GTEST_SKIP() << "../shared/data/tokenizer-vectors is absent";
  std::string summary;
  for (const fs::path& gguf : files) {
    const std::string name = gguf.filename().string();
    SCOPED_TRACE(name);
    auto inputs = split_inputs(read_text_file(gguf.string() + ".inp"));
    auto expected = parse_ids(read_text_file(gguf.string() + ".out"));
    ASSERT_EQ(inputs.size(), expected.size());
    std::unique_ptr<Tokenizer> tok;
    try {
      tok = load_tokenizer(gguf);
    } catch (const Error& e) {
      ADD_FAILURE() << "load_tokenizer failed: " << e.what();
      summary += "  " + name + ": load failed\n";
      continue;
    }
    size_t pass = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::vector<int32_t> got;
      try {
        got = tok->encode(inputs[i], /*add_bos=*/false);
      } catch (const Error& e) {
        ADD_FAILURE() << "input " << i << " \"" << escape(inputs[i]) << "\" threw: " << e.what();
        continue;
      }
      if (got == expected[i]) {
        ++pass;
        continue;
      }
      ADD_FAILURE() << "input " << i << " \"" << escape(inputs[i]) << "\"\n  want:" << show(expected[i])
                    << "\n  got: " << show(got);
    }
    summary += "  " + name + ": " + std::to_string(pass) + "/" + std::to_string(inputs.size()) + "\n";
  }
  std::cout << "[ vectors  ] per-vocabulary pass counts:\n" << summary;
}

}  // namespace
}  // namespace qf
