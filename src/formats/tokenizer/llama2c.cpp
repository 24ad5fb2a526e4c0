// llama2.c tokenizer files (tokenizer.bin, tok512.bin): int32
// max_token_length, then per token float32 score, int32 length and the bytes,
// to the end of the file (the count comes from the model in llama2.c).
//
// The Vocab is made to look like SentencePiece's, so that the "llama"
// algorithm reproduces llama2.c's encoder and GGUF export is conventional:
// plain spaces in pieces become U+2581 (llama2.c's encoder prepends " " and
// looks pieces up with plain spaces, which is the same thing after the
// algorithm's own ' ' -> U+2581 step), "\n<s>\n" and "\n</s>\n" (how
// llama2.c's exporter writes ids 1 and 2) become "<s>" and "</s>", and
// <0xXX> pieces are typed Byte (llama2.c's byte fallback is id = byte + 3,
// which is exactly those pieces).
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/io.h"
#include "formats/tokenizer/tokenizer_impl.h"

namespace qf {
namespace {

std::string to_sentencepiece_form(std::string_view p) {
  std::string s;
  for (char c : p) {
    if (c == ' ') s += "\xE2\x96\x81";
    else s += c;
  }
  return s;
}

TokenType type_for(size_t id, const std::string& piece) {
  if (id == 0) return TokenType::Unknown;
  if (id == 1 || id == 2) return TokenType::Control;
  return tok::parse_byte_piece(piece) >= 0 ? TokenType::Byte : TokenType::Normal;
}

}  // namespace

Vocab vocab_from_llama2c(const std::filesystem::path& path) {
  auto file = MappedFile::open(path);
  const std::string where = path.string();
  const uint8_t* d = file->data();
  const size_t size = file->size();
  if (size < 4) throw invalid_input(where, "file of " + std::to_string(size) + " bytes is too short for a llama2.c tokenizer");
  int32_t max_len;
  std::memcpy(&max_len, d, 4);
  if (max_len <= 0 || max_len > 4096) throw invalid_input(where, "max_token_length " + std::to_string(max_len) + " is not plausible (1 to 4096); not a llama2.c tokenizer file?");
  Vocab v;
  v.model = "llama";
  v.pre = "default";
  for (size_t pos = 4; pos < size;) {
    const size_t id = v.tokens.size();
    if (size - pos < 8) throw invalid_input(where, "truncated at token " + std::to_string(id) + " (offset " + std::to_string(pos) + ")");
    float score;
    int32_t len;
    std::memcpy(&score, d + pos, 4);
    std::memcpy(&len, d + pos + 4, 4);
    pos += 8;
    if (len < 0 || len > max_len)
      throw invalid_input(where, "token " + std::to_string(id) + " has length " + std::to_string(len) + ", outside 0.." + std::to_string(max_len));
    if (static_cast<size_t>(len) > size - pos)
      throw invalid_input(where, "truncated inside token " + std::to_string(id) + " (needs " + std::to_string(len) + " bytes at offset " +
                                     std::to_string(pos) + ", file has " + std::to_string(size) + ")");
    std::string piece(reinterpret_cast<const char*>(d + pos), static_cast<size_t>(len));
    pos += static_cast<size_t>(len);
    if (id == 1 && piece == "\n<s>\n") piece = "<s>";
    if (id == 2 && piece == "\n</s>\n") piece = "</s>";
    v.types.push_back(type_for(id, piece));
    v.tokens.push_back(to_sentencepiece_form(piece));
    v.scores.push_back(score);
  }
  // Byte fallback is id = byte + 3, so <0x00>..<0xFF> must sit at ids 3..258.
  // Checking them also catches a file cut exactly at a token boundary, which
  // the format (it has no count) cannot show otherwise.
  if (v.tokens.size() < 259)
    throw invalid_input(where, "has " + std::to_string(v.tokens.size()) +
                                   " tokens; a llama2.c tokenizer needs <unk>, <s>, </s> and the 256 byte tokens (truncated?)");
  for (int b = 0; b < 256; ++b) {
    if (tok::parse_byte_piece(v.tokens[static_cast<size_t>(b) + 3]) != b) {
      char want[8];
      std::snprintf(want, sizeof want, "<0x%02X>", b);
      throw invalid_input(where, "token " + std::to_string(b + 3) + " is '" + v.tokens[static_cast<size_t>(b) + 3] +
                                     "', expected the byte token " + want);
    }
  }
  v.unk_id = 0;
  v.bos_id = 1;
  v.eos_id = 2;
  v.add_bos = true;
  v.add_space_prefix = true;
  v.byte_fallback = true;
  return v;
}

}  // namespace qf
