// Private to the tokenizer sources: the shared base class (decode, piece,
// special-token splitting) and the two algorithm factories.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "formats/tokenizer/tokenizer.h"

namespace qf::tok {

// Length in bytes of the UTF-8 sequence starting with `lead` (1 for a stray
// continuation or invalid byte, so that malformed text still advances).
size_t utf8_len(unsigned char lead);
// Length of the character at s[i]: utf8_len of its lead byte when that many
// bytes remain and all continuation bytes are 10xxxxxx, else 1 (a byte of
// invalid UTF-8 is a character of its own, as SentencePiece treats it).
size_t utf8_char_len(std::string_view s, size_t i);

// "<0xXX>" for a byte, the SentencePiece byte-token spelling.
std::string byte_piece(unsigned char b);
// The byte value of "<0xXX>", or -1 when `piece` is not of that form.
int parse_byte_piece(std::string_view piece);

// GPT-2's byte <-> printable-unicode alphabet (byte-level BPE).
const std::string& byte_to_unicode(unsigned char b);
// Reverse map of one UTF-8 character; -1 when it is not in the alphabet.
int unicode_to_byte(std::string_view ch);

// A piece of input text after special tokens are split out: either raw text
// or one special token id.
struct Fragment {
  std::string_view text;
  int32_t id = -1;  // >= 0: a special token
};

// State shared by both algorithms: the vocabulary, its reverse map, and the
// special tokens (Control / UserDefined) matched in raw text before encoding.
class TokenizerBase : public Tokenizer {
 public:
  explicit TokenizerBase(Vocab vocab);
  std::string piece(int32_t id) const override;
  const Vocab& vocab() const override { return vocab_; }
  std::string decode(const std::vector<int32_t>& ids) const override;

 protected:
  TokenizerBase(const TokenizerBase&) = delete;
  TokenizerBase& operator=(const TokenizerBase&) = delete;

  // Splits `text` at special tokens (leftmost, then longest match).
  std::vector<Fragment> split_special(std::string_view text) const;
  // The id of a vocabulary string, or -1.
  int32_t find(std::string_view piece) const;
  TokenType type_of(int32_t id) const;
  // Text of one id as decode() renders it (model-specific).
  virtual std::string render(int32_t id) const = 0;

  // Heterogeneous lookup: find() by string_view without building a string.
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  Vocab vocab_;
  std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> to_id_;

 private:
  // Special tokens grouped by first byte, longest first.
  std::vector<std::vector<int32_t>> special_by_byte_;
};

std::unique_ptr<Tokenizer> make_spm_tokenizer(Vocab vocab);
std::unique_ptr<Tokenizer> make_bpe_tokenizer(Vocab vocab);

// The pre-tokenizer regexes for Vocab::pre (throws Unsupported for an unknown
// name). A pre of the form "regex:[...]" (a JSON array of patterns, written by
// vocab_from_tokenizer_json for unrecognised Split regexes) is used verbatim.
std::vector<std::string> pretokenizer_regexes(const std::string& pre);
// Whether `pre` names a known pre-tokenizer or is a "regex:" list.
bool is_known_pretokenizer(const std::string& pre);

}  // namespace qf::tok
