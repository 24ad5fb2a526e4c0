// The "llama" model: SentencePiece-style BPE over scores, as SentencePiece's
// BPE model and llama.cpp's SPM tokenizer encode.
//
// Text (between special tokens) is normalised by turning every ' ' into
// U+2581 and, when Vocab::add_space_prefix is set, prepending one U+2581 at the
// start of the text and after every special token (llama.cpp's rule). It is
// split into UTF-8 characters, and the adjacent pair whose concatenation is a
// vocabulary token of the highest score is merged, the leftmost one on ties,
// until no pair merges. A priority queue of candidate pairs over a linked list
// of symbols keeps this O(n log n); stale queue entries are recognised by the
// symbol lengths they were made for. Symbols that are no token fall back to
// <0xXX> byte tokens (Vocab::byte_fallback) or to UNK.
#include <queue>

#include "core/error.h"
#include "formats/tokenizer/tokenizer_impl.h"

namespace qf::tok {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581

struct Symbol {
  size_t start = 0, len = 0;  // a byte range of the normalised text; len 0: merged away
  int prev = -1, next = -1;
};

struct Candidate {
  int left = 0, right = 0;
  float score = 0;
  size_t len = 0;  // left.len + right.len when queued
};

struct CandidateOrder {
  // priority_queue pops the largest: highest score, then leftmost.
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.score != b.score) return a.score < b.score;
    return a.left > b.left;
  }
};

class SpmTokenizer final : public TokenizerBase {
 public:
  explicit SpmTokenizer(Vocab v) : TokenizerBase(std::move(v)), word_split_(no_inner_space()) {}

  std::vector<int32_t> encode(std::string_view text, bool add_bos) const override {
    std::vector<int32_t> out;
    if (add_bos && vocab_.bos_id >= 0) out.push_back(vocab_.bos_id);
    bool after_special = true;  // the text start counts as "after a special token"
    for (const Fragment& f : split_special(text)) {
      if (f.id >= 0) {
        out.push_back(f.id);
        after_special = true;
        continue;
      }
      encode_words(normalize(f.text, vocab_.add_space_prefix && after_special), out);
      after_special = false;
    }
    return out;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    bool first = true;
    for (int32_t id : ids) {
      piece(id);  // range check
      std::string s = render(id);
      if (s.empty()) continue;
      // The dummy prefix added by encode() is not part of the text.
      if (first && vocab_.add_space_prefix && type_of(id) != TokenType::Byte && s[0] == ' ') s.erase(0, 1);
      first = false;
      out += s;
    }
    return out;
  }

 protected:
  std::string render(int32_t id) const override {
    const std::string& p = vocab_.tokens[static_cast<size_t>(id)];
    TokenType t = type_of(id);
    if (t == TokenType::Byte) {
      int b = parse_byte_piece(p);
      return b < 0 ? p : std::string(1, static_cast<char>(b));
    }
    if (t == TokenType::Control && (id == vocab_.bos_id || id == vocab_.eos_id || id == vocab_.pad_id)) return {};
    std::string s;
    for (size_t i = 0; i < p.size();) {
      if (p.compare(i, kSpace.size(), kSpace) == 0) {
        s += ' ';
        i += kSpace.size();
      } else {
        s += p[i++];
      }
    }
    return s;
  }

 private:
  static std::string normalize(std::string_view text, bool prefix) {
    std::string s;
    s.reserve(text.size() + 8);
    if (prefix) s += kSpace;
    for (char c : text) {
      if (c == ' ') s += kSpace;
      else s += c;
    }
    return s;
  }

  // True when no mergeable token has U+2581 after a non-U+2581 character
  // (SentencePiece's split_by_whitespace, the usual case). Then no merge can
  // cross the start of a "▁" run, and the words between such starts can be
  // encoded independently with the same result: small heaps, linear overall.
  bool no_inner_space() const {
    for (size_t id = 0; id < vocab_.tokens.size(); ++id) {
      const std::string& t = vocab_.tokens[id];
      if (text_token(t) < 0) continue;
      size_t lead = 0;
      while (t.compare(lead, kSpace.size(), kSpace) == 0) lead += kSpace.size();
      if (t.find(kSpace, lead) != std::string::npos) return false;
    }
    return true;
  }

  static bool space_at(std::string_view s, size_t i) { return s.compare(i, kSpace.size(), kSpace) == 0; }

  void encode_words(const std::string& text, std::vector<int32_t>& out) const {
    if (!word_split_) return encode_text(text, out);
    size_t start = 0;
    // A word starts where a U+2581 follows another character (U+2581's lead
    // byte 0xE2 is never a continuation byte, so i is a character boundary).
    for (size_t i = kSpace.size(); i < text.size(); ++i) {
      if (space_at(text, i) && !space_at(text, i - kSpace.size())) {
        encode_text(std::string_view(text).substr(start, i - start), out);
        start = i;
      }
    }
    encode_text(std::string_view(text).substr(start), out);
  }

  // A token that a merge may produce or a symbol may map to: SentencePiece
  // never produces control, unknown or byte pieces from text.
  int32_t text_token(std::string_view s) const {
    int32_t id = find(s);
    if (id < 0) return -1;
    TokenType t = type_of(id);
    return (t == TokenType::Control || t == TokenType::Unknown || t == TokenType::Byte) ? -1 : id;
  }

  float score_of(int32_t id) const { return vocab_.scores.empty() ? 0.0f : vocab_.scores[static_cast<size_t>(id)]; }

  void push_candidate(std::string_view text, const std::vector<Symbol>& sym, int l, int r,
                      std::priority_queue<Candidate, std::vector<Candidate>, CandidateOrder>& q) const {
    if (l < 0 || r < 0) return;
    size_t len = sym[l].len + sym[r].len;
    int32_t id = text_token(text.substr(sym[l].start, len));
    if (id >= 0) q.push({l, r, score_of(id), len});
  }

  void encode_text(std::string_view text, std::vector<int32_t>& out) const {
    std::vector<Symbol> sym;
    for (size_t i = 0; i < text.size();) {
      size_t n = utf8_char_len(text, i);
      int idx = static_cast<int>(sym.size());
      sym.push_back({i, n, idx - 1, -1});
      if (idx > 0) sym[idx - 1].next = idx;
      i += n;
    }
    std::priority_queue<Candidate, std::vector<Candidate>, CandidateOrder> q;
    for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) push_candidate(text, sym, i, i + 1, q);
    while (!q.empty()) {
      Candidate c = q.top();
      q.pop();
      Symbol& l = sym[c.left];
      Symbol& r = sym[c.right];
      if (l.len == 0 || r.len == 0 || l.len + r.len != c.len || l.next != c.right) continue;  // stale
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) sym[r.next].prev = c.left;
      push_candidate(text, sym, l.prev, c.left, q);
      push_candidate(text, sym, c.left, l.next, q);
    }
    for (int i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) emit(text.substr(sym[i].start, sym[i].len), out);
  }

  void emit(std::string_view s, std::vector<int32_t>& out) const {
    int32_t id = text_token(s);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
    if (vocab_.byte_fallback) {
      bool all = true;
      std::vector<int32_t> bytes;
      for (unsigned char b : s) {
        int32_t bid = find(byte_piece(b));
        if (bid < 0) all = false;
        bytes.push_back(bid);
      }
      if (all) {
        out.insert(out.end(), bytes.begin(), bytes.end());
        return;
      }
    }
    if (vocab_.unk_id < 0)
      throw invalid_input("tokenizer", "text '" + std::string(s) + "' has no token and the vocabulary has no UNK token");
    out.push_back(vocab_.unk_id);
  }

  bool word_split_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_spm_tokenizer(Vocab vocab) { return std::make_unique<SpmTokenizer>(std::move(vocab)); }

}  // namespace qf::tok
