#include "core/text_input.h"

#include <cstdint>
#include <cstdio>

#include "core/error.h"
#include "core/io.h"

namespace qf {

namespace {

bool starts_with(const std::string& s, const char* prefix, size_t n) { return s.size() >= n && s.compare(0, n, prefix, n) == 0; }

// Length of the valid UTF-8 sequence at s[i], or 0 when it is invalid
// (overlong forms, surrogates and code points above U+10FFFF included).
size_t utf8_sequence(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n;
  uint32_t cp;
  if (c >= 0xC2 && c <= 0xDF) n = 2, cp = c & 0x1F;
  else if (c >= 0xE0 && c <= 0xEF) n = 3, cp = c & 0x0F;
  else if (c >= 0xF0 && c <= 0xF4) n = 4, cp = c & 0x07;
  else return 0;
  if (s.size() - i < n) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
  return n;
}

}  // namespace

CheckedText check_text_input(std::string bytes, const std::string& where) {
  const char* convert = "; convert it to UTF-8 (e.g. iconv -f UTF-16 -t UTF-8)";
  if (starts_with(bytes, "\xFF\xFE\x00\x00", 4) || starts_with(bytes, "\x00\x00\xFE\xFF", 4))
    throw invalid_input(where, std::string("is UTF-32 text (byte-order mark), not UTF-8") + convert);
  if (starts_with(bytes, "\xFF\xFE", 2) || starts_with(bytes, "\xFE\xFF", 2))
    throw invalid_input(where, std::string("is UTF-16 text (byte-order mark), not UTF-8") + convert);
  if (const size_t nul = bytes.find('\0'); nul != std::string::npos)
    throw invalid_input(where, "has a NUL byte at offset " + std::to_string(nul) +
                                   ": not a text file (binary data, or UTF-16/UTF-32 text without a byte-order mark)" + convert);
  CheckedText out;
  if (starts_with(bytes, "\xEF\xBB\xBF", 3)) bytes.erase(0, 3);
  size_t invalid = 0, first = 0;
  for (size_t i = 0; i < bytes.size();) {
    const size_t n = utf8_sequence(bytes, i);
    if (n == 0) {
      if (invalid++ == 0) first = i;
      ++i;
    } else {
      i += n;
    }
  }
  if (invalid)
    out.warning = where + ": " + std::to_string(invalid) + " byte" + (invalid == 1 ? "" : "s") +
                  " of invalid UTF-8 (the first at offset " + std::to_string(first) +
                  "); they are tokenized as bytes, which may not be what the model saw in training";
  out.text = std::move(bytes);
  return out;
}

std::string read_text_input(const std::filesystem::path& path, const WarningSink& warn) {
  CheckedText t = check_text_input(read_text_file(path), path.string());
  if (!t.warning.empty()) {
    if (warn) warn(t.warning);
    else std::fprintf(stderr, "quantforge: warning: %s\n", t.warning.c_str());
  }
  return std::move(t.text);
}

}  // namespace qf
