// Tokenizer plumbing shared by both algorithms: vocabulary validation,
// make_tokenizer(), load_tokenizer() dispatch, special-token splitting,
// decode() and the byte-level alphabet.
#include <algorithm>
#include <array>
#include <cstdio>

#include "core/error.h"
#include "core/io.h"
#include "formats/tokenizer/tokenizer_impl.h"

namespace qf {
namespace tok {

size_t utf8_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

size_t utf8_char_len(std::string_view s, size_t i) {
  const size_t n = utf8_len(static_cast<unsigned char>(s[i]));
  if (n > s.size() - i) return 1;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  return n;
}

std::string byte_piece(unsigned char b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "<0x%02X>", b);
  return buf;
}

int parse_byte_piece(std::string_view p) {
  if (p.size() != 6 || p.substr(0, 3) != "<0x" || p[5] != '>') return -1;
  int v = 0;
  for (char c : p.substr(3, 2)) {
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

namespace {

std::string utf8_of(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// GPT-2 keeps printable Latin-1 bytes as themselves and moves the other 68
// bytes (controls, space, 0x7F-0xA0, 0xAD) to U+0100 onwards, in byte order.
struct ByteAlphabet {
  std::array<std::string, 256> to_unicode;
  std::unordered_map<std::string, int> to_byte;
  ByteAlphabet() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_unicode[b] = utf8_of(printable ? static_cast<uint32_t>(b) : next++);
      to_byte[to_unicode[b]] = b;
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

}  // namespace

const std::string& byte_to_unicode(unsigned char b) { return alphabet().to_unicode[b]; }

int unicode_to_byte(std::string_view ch) {
  auto it = alphabet().to_byte.find(std::string(ch));
  return it == alphabet().to_byte.end() ? -1 : it->second;
}

TokenizerBase::TokenizerBase(Vocab vocab) : vocab_(std::move(vocab)), special_by_byte_(256) {
  to_id_.reserve(vocab_.tokens.size() * 2);
  for (size_t i = 0; i < vocab_.tokens.size(); ++i) to_id_.emplace(vocab_.tokens[i], static_cast<int32_t>(i));
  for (size_t i = 0; i < vocab_.types.size(); ++i) {
    TokenType t = vocab_.types[i];
    if ((t == TokenType::Control || t == TokenType::UserDefined) && !vocab_.tokens[i].empty())
      special_by_byte_[static_cast<unsigned char>(vocab_.tokens[i][0])].push_back(static_cast<int32_t>(i));
  }
  for (auto& list : special_by_byte_)
    std::stable_sort(list.begin(), list.end(),
                     [&](int32_t a, int32_t b) { return vocab_.tokens[a].size() > vocab_.tokens[b].size(); });
}

int32_t TokenizerBase::find(std::string_view p) const {
  auto it = to_id_.find(p);
  return it == to_id_.end() ? -1 : it->second;
}

TokenType TokenizerBase::type_of(int32_t id) const {
  return vocab_.types.empty() ? TokenType::Normal : vocab_.types[static_cast<size_t>(id)];
}

std::string TokenizerBase::piece(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    throw invalid_input("tokenizer", "token id " + std::to_string(id) + " is out of range (the vocabulary has " +
                                         std::to_string(vocab_size()) + " tokens)");
  return vocab_.tokens[static_cast<size_t>(id)];
}

std::string TokenizerBase::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    piece(id);  // range check
    out += render(id);
  }
  return out;
}

std::vector<Fragment> TokenizerBase::split_special(std::string_view text) const {
  std::vector<Fragment> out;
  size_t start = 0;  // start of the pending raw text
  for (size_t i = 0; i < text.size();) {
    int32_t hit = -1;
    for (int32_t id : special_by_byte_[static_cast<unsigned char>(text[i])]) {
      const std::string& s = vocab_.tokens[static_cast<size_t>(id)];
      if (text.compare(i, s.size(), s) == 0) {
        hit = id;
        break;  // the list is longest first
      }
    }
    if (hit < 0) {
      ++i;
      continue;
    }
    if (i > start) out.push_back({text.substr(start, i - start), -1});
    out.push_back({{}, hit});
    i += vocab_.tokens[static_cast<size_t>(hit)].size();
    start = i;
  }
  if (start < text.size()) out.push_back({text.substr(start), -1});
  return out;
}

}  // namespace tok

namespace {

const char* kWhere = "tokenizer vocabulary";

void check_id(int32_t id, size_t n, const char* what) {
  if (id < -1 || (id >= 0 && static_cast<size_t>(id) >= n))
    throw invalid_input(kWhere, std::string(what) + " id " + std::to_string(id) + " is out of range (the vocabulary has " +
                                    std::to_string(n) + " tokens)");
}

void check_merges(const Vocab& v) {
  std::unordered_map<std::string_view, int> known;
  known.reserve(v.tokens.size() * 2);
  for (const std::string& t : v.tokens) known.emplace(t, 0);
  for (size_t i = 0; i < v.merges.size(); ++i) {
    const std::string& m = v.merges[i];
    size_t sp = m.find(' ', 1);  // a merge "  x" (left ' ') is impossible in byte-level form
    if (sp == std::string::npos || sp + 1 >= m.size())
      throw invalid_input(kWhere, "merge " + std::to_string(i) + " '" + m + "' is not of the form 'left right'");
    std::string_view l(m.data(), sp), r(m.data() + sp + 1, m.size() - sp - 1);
    if (!known.count(l) || !known.count(r))
      throw invalid_input(kWhere, "merge " + std::to_string(i) + " '" + m + "' names a token that is not in the vocabulary");
  }
}

void validate(const Vocab& v) {
  if (v.model != "llama" && v.model != "gpt2")
    throw unsupported(kWhere, "tokenizer model '" + v.model + "' is not supported (known: llama, gpt2)");
  if (v.tokens.empty()) throw invalid_input(kWhere, "the vocabulary has no tokens");
  const size_t n = v.tokens.size();
  if (!v.scores.empty() && v.scores.size() != n)
    throw invalid_input(kWhere, std::to_string(v.scores.size()) + " scores for " + std::to_string(n) + " tokens");
  if (!v.types.empty() && v.types.size() != n)
    throw invalid_input(kWhere, std::to_string(v.types.size()) + " token types for " + std::to_string(n) + " tokens");
  check_id(v.bos_id, n, "BOS");
  check_id(v.eos_id, n, "EOS");
  check_id(v.unk_id, n, "UNK");
  check_id(v.pad_id, n, "PAD");
  if (v.model == "gpt2") {
    if (v.merges.empty()) throw invalid_input(kWhere, "a byte-level BPE vocabulary needs merges, and has none");
    check_merges(v);
    tok::pretokenizer_regexes(v.pre);  // throws Unsupported for an unknown name
  }
}

bool has_ext(const std::filesystem::path& p, const char* ext) { return p.extension() == ext; }

std::unique_ptr<Tokenizer> load_folder(const std::filesystem::path& dir) {
  if (path_exists(dir / "tokenizer.json")) return make_tokenizer(vocab_from_tokenizer_json(dir / "tokenizer.json"));
  if (path_exists(dir / "tokenizer.model")) return make_sentencepiece_tokenizer(dir / "tokenizer.model");
  throw not_found(dir.string(), "no tokenizer.json or tokenizer.model in this folder");
}

}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer(Vocab vocab) {
  validate(vocab);
  if (vocab.model == "llama") return tok::make_spm_tokenizer(std::move(vocab));
  return tok::make_bpe_tokenizer(std::move(vocab));
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& path) {
  if (!path_exists(path)) throw not_found(path.string(), "no such file or folder");
  if (is_folder(path)) return load_folder(path);
  // Vocabulary errors from make_tokenizer name no file: add it.
  auto build = [&](Vocab v) {
    try {
      return make_tokenizer(std::move(v));
    } catch (const Error& e) {
      throw Error(e.kind(), path.string() + ": " + e.what());
    }
  };
  if (has_ext(path, ".json")) return build(vocab_from_tokenizer_json(path));
  if (has_ext(path, ".model")) return make_sentencepiece_tokenizer(path);
  if (has_ext(path, ".gguf")) return build(vocab_from_gguf(path));
  return build(vocab_from_llama2c(path));
}

}  // namespace qf
