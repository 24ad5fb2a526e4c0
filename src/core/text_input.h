// Calibration and evaluation text files: read as bytes, then checked to be
// text before they are tokenized.
//   - NUL bytes, or a UTF-16 / UTF-32 byte-order mark: InvalidInput (a binary
//     file, or text in UTF-16/32, which tokenizers would read as byte soup;
//     the message says how to convert it);
//   - a UTF-8 byte-order mark at the start: removed (no tokenizer expects it);
//   - invalid UTF-8 sequences (Latin-1 text, a truncated character): kept
//     as they are, with one warning on stderr naming the file, the count and
//     the first offset; byte-fallback tokenizers encode them as byte tokens.
#pragma once

#include <filesystem>
#include <functional>
#include <string>

namespace qf {

struct CheckedText {
  std::string text;     // without a UTF-8 byte-order mark
  std::string warning;  // "" when the text is valid UTF-8
};

// The checks above on bytes already read; `where` names the source in the
// error and the warning. Throws InvalidInput for binary / UTF-16 / UTF-32.
CheckedText check_text_input(std::string bytes, const std::string& where);

// Receives a warning; nullptr: print it on stderr as "quantforge: warning: ...".
using WarningSink = std::function<void(const std::string&)>;

// read_text_file + check_text_input; the warning, if any, goes to `warn`.
std::string read_text_input(const std::filesystem::path& path, const WarningSink& warn = nullptr);

}  // namespace qf
