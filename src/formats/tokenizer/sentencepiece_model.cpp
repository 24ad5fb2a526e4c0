// tokenizer.model (a SentencePiece ModelProto): encoded and decoded by
// libsentencepiece itself; its Vocab (for GGUF export and for the "llama"
// algorithm) is read from the processor plus a few proto fields that the
// processor API does not expose (piece types, add_dummy_prefix,
// byte_fallback), which are decoded here from the protobuf wire format.
#include <sentencepiece_processor.h>

#include "core/error.h"
#include "core/io.h"
#include "formats/tokenizer/tokenizer_impl.h"

namespace qf {
namespace {

// A minimal protobuf wire reader: enough to walk fields and sub-messages.
class Wire {
 public:
  explicit Wire(std::string_view s) : s_(s) {}
  bool done() const { return pos_ >= s_.size(); }
  // Reads a field header; false on malformed input.
  bool next(uint32_t& field, uint32_t& wire) {
    uint64_t key;
    if (!varint(key)) return false;
    field = static_cast<uint32_t>(key >> 3);
    wire = static_cast<uint32_t>(key & 7);
    return true;
  }
  bool varint(uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64 && pos_ < s_.size(); shift += 7) {
      uint8_t b = static_cast<uint8_t>(s_[pos_++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  }
  bool bytes(std::string_view& out) {
    uint64_t n;
    if (!varint(n) || n > s_.size() - pos_) return false;
    out = s_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool skip(uint32_t wire) {
    uint64_t v;
    std::string_view b;
    switch (wire) {
      case 0: return varint(v);
      case 1: return advance(8);
      case 2: return bytes(b);
      case 5: return advance(4);
      default: return false;
    }
  }

 private:
  bool advance(size_t n) {
    if (n > s_.size() - pos_) return false;
    pos_ += n;
    return true;
  }
  std::string_view s_;
  size_t pos_ = 0;
};

// Reads varint field `want` of a sub-message; `fallback` when absent.
uint64_t varint_field(std::string_view msg, uint32_t want, uint64_t fallback) {
  Wire w(msg);
  uint32_t f, t;
  while (!w.done() && w.next(f, t)) {
    if (f == want && t == 0) {
      uint64_t v;
      return w.varint(v) ? v : fallback;
    }
    if (!w.skip(t)) break;
  }
  return fallback;
}

struct ProtoFacts {
  std::vector<TokenType> types;  // SentencePiece's piece types equal GGUF's (1..6)
  bool add_dummy_prefix = true;
  bool byte_fallback = false;
};

ProtoFacts read_proto(std::string_view proto) {
  ProtoFacts facts;
  Wire w(proto);
  uint32_t f, t;
  while (!w.done() && w.next(f, t)) {
    std::string_view sub;
    if (t != 2) {
      if (!w.skip(t)) break;
      continue;
    }
    if (!w.bytes(sub)) break;
    if (f == 1) facts.types.push_back(static_cast<TokenType>(varint_field(sub, 3, 1)));  // pieces
    if (f == 2) facts.byte_fallback = varint_field(sub, 35, 0) != 0;                     // trainer_spec
    if (f == 3) facts.add_dummy_prefix = varint_field(sub, 3, 1) != 0;                   // normalizer_spec
  }
  return facts;
}

void load(sentencepiece::SentencePieceProcessor& sp, const std::filesystem::path& path) {
  if (!path_exists(path)) throw not_found(path.string(), "no such file");
  if (is_folder(path)) throw invalid_input(path.string(), "is a folder, not a regular file");
  sentencepiece::util::Status status;
  try {
    status = sp.Load(path.string());
  } catch (const std::exception& e) {
    // libsentencepiece reports some malformed models by exception rather than
    // status (its trie builder throws on a piece that starts with a NUL byte).
    throw invalid_input(path.string(), std::string("not a valid SentencePiece model: ") + e.what());
  }
  if (!status.ok()) throw invalid_input(path.string(), "not a SentencePiece model: " + status.ToString());
}

Vocab vocab_of(const sentencepiece::SentencePieceProcessor& sp, const std::filesystem::path& path) {
  Vocab v;
  v.model = "llama";
  v.pre = "default";
  const int n = sp.GetPieceSize();
  ProtoFacts facts = read_proto(sp.serialized_model_proto());
  if (facts.types.size() != static_cast<size_t>(n))
    throw invalid_input(path.string(), "the model proto lists " + std::to_string(facts.types.size()) + " pieces, the processor " +
                                           std::to_string(n));
  for (int i = 0; i < n; ++i) {
    v.tokens.push_back(sp.IdToPiece(i));
    v.scores.push_back(sp.GetScore(i));
    TokenType t = facts.types[static_cast<size_t>(i)];
    v.types.push_back(static_cast<int>(t) >= 1 && static_cast<int>(t) <= 6 ? t : TokenType::Normal);
  }
  auto id = [n](int x) { return x >= 0 && x < n ? x : -1; };
  v.unk_id = id(sp.unk_id());
  v.bos_id = id(sp.bos_id());
  v.eos_id = id(sp.eos_id());
  v.pad_id = id(sp.pad_id());
  v.add_bos = v.bos_id >= 0;
  v.add_space_prefix = facts.add_dummy_prefix;
  v.byte_fallback = facts.byte_fallback;
  return v;
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::filesystem::path& path) {
    load(sp_, path);
    vocab_ = vocab_of(sp_, path);
  }
  std::vector<int32_t> encode(std::string_view text, bool add_bos) const override {
    std::vector<int> ids;
    sentencepiece::util::Status status;
    try {
      status = sp_.Encode(text, &ids);
    } catch (const std::exception& e) {
      throw invalid_input("sentencepiece", std::string("cannot encode text: ") + e.what());
    }
    if (!status.ok()) throw invalid_input("sentencepiece", "cannot encode text: " + status.ToString());
    std::vector<int32_t> out;
    if (add_bos && vocab_.bos_id >= 0) out.push_back(vocab_.bos_id);
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    for (int32_t id : ids) piece(id);  // range check: libsentencepiece would fail less clearly
    std::string text;
    sentencepiece::util::Status status;
    try {
      status = sp_.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    } catch (const std::exception& e) {
      throw invalid_input("sentencepiece", std::string("cannot decode ids: ") + e.what());
    }
    if (!status.ok()) throw invalid_input("sentencepiece", "cannot decode ids: " + status.ToString());
    return text;
  }
  std::string piece(int32_t id) const override {
    if (id < 0 || id >= vocab_size())
      throw invalid_input("tokenizer", "token id " + std::to_string(id) + " is out of range (the vocabulary has " +
                                           std::to_string(vocab_size()) + " tokens)");
    return vocab_.tokens[static_cast<size_t>(id)];
  }
  const Vocab& vocab() const override { return vocab_; }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  Vocab vocab_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::filesystem::path& model_file) {
  return std::make_unique<SentencePieceTokenizer>(model_file);
}

Vocab vocab_from_sentencepiece_model(const std::filesystem::path& path) {
  sentencepiece::SentencePieceProcessor sp;
  load(sp, path);
  return vocab_of(sp, path);
}

}  // namespace qf
