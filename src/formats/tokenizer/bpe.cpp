// The "gpt2" model: byte-level BPE over ranked merges.
//
// Text between special tokens is pre-tokenised by the regexes that
// Vocab::pre names, applied one after another as llama.cpp does: each regex
// splits every piece left by the previous one into its matches and the text
// between them. Each piece is mapped byte by byte into GPT-2's printable
// alphabet, split into characters, and the adjacent pair with the lowest merge
// rank is merged (leftmost on ties) until none merges; a priority queue over a
// linked list keeps this O(n log n) per piece. Pairs are looked up by the two
// token ids, so no strings are built in the loop.
#include <queue>
#include <unordered_map>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/tokenizer/tokenizer_impl.h"

namespace qf::tok {
namespace {

// GPT-2's pattern (also MPT, OLMo, ...).
constexpr const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek LLM's Split sequence: newlines, Latin/Greek/Cyrillic/... letter runs,
// ASCII and full-width punctuation, trailing whitespace, CJK runs, digits.
constexpr const char* kDeepseekLetters =
    "\\s?[A-Za-z\u00B5\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u01BA\u01BC-\u01BF\u01C4-\u0293\u0295-\u02AF\u0370-\u0373"
    "\u0376\u0377\u037B-\u037D\u037F\u0386\u0388-\u038A\u038C\u038E-\u03A1\u03A3-\u03F5\u03F7-\u0481\u048A-\u052F"
    "\u0531-\u0556\u10A0-\u10C5\u13A0-\u13F5\u13F8-\u13FD\u1C90-\u1CBA\u1CBD-\u1CBF\u1D00-\u1D2B\u1D6B-\u1D77"
    "\u1D79-\u1D9A\u1E00-\u1F15\u1F18-\u1F1D\u1F20-\u1F45\u1F48-\u1F4D\u1F50-\u1F57\u1F59\u1F5B\u1F5D\u1F5F-\u1F7D"
    "\u1F80-\u1FB4\u1FB6-\u1FBC\u1FBE\u1FC2-\u1FC4\u1FC6-\u1FCC\u1FD0-\u1FD3\u1FD6-\u1FDB\u1FE0-\u1FEC\u1FF2-\u1FF4"
    "\u1FF6-\u1FFC\u2102\u2107\u210A-\u2113\u2115\u2119-\u211D\u2124\u2126\u2128\u212A-\u212D\u212F-\u2134\u2139"
    "\u213C-\u213F\u2145-\u2149\u214E\u2183\u2184\u2C00-\u2C7B\u2C7E-\u2CE4\u2CEB-\u2CEE\u2CF2\u2CF3\uA640-\uA66D"
    "\uA680-\uA69B\uA722-\uA76F\uA771-\uA787\uA78B-\uA78E\uAB70-\uABBF\uFB00-\uFB06\uFB13-\uFB17\uFF21-\uFF3A"
    "\uFF41-\uFF5A\U00010400-\U0001044F\U000104B0-\U000104D3\U000104D8-\U000104FB\U00010C80-\U00010CB2"
    "\U00010CC0-\U00010CF2\U000118A0-\U000118DF\U0001E900-\U0001E943]+";
constexpr const char* kDeepseekPunct = "\\s?[!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3000-\u3002]+";
constexpr const char* kCjk = "[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+";
// GPT-2's pattern without the final "\s+" alternative, as Falcon's and
// StarCoder's pre-tokenizers are approximated by llama.cpp.
constexpr const char* kGpt2NoTail = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";

struct Named {
  std::vector<const char*> names;
  std::vector<std::string> regexes;
};

const std::vector<Named>& known() {
  static const std::vector<Named> k = {
      {{"default", "gpt-2", "gpt2", "mpt", "olmo", "jais"}, {kGpt2}},
      {{"llama3", "llama-bpe", "llama-v3", "dbrx", "smaug-bpe"}, {kLlama3}},
      {{"qwen2", "stablelm2"}, {kQwen2}},
      {{"deepseek-llm"}, {"[\\r\\n]", kDeepseekLetters, kDeepseekPunct, "\\s+$", kCjk, "\\p{N}+"}},
      {{"deepseek-coder"}, {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", kCjk, "\\p{N}"}},
      {{"falcon"}, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", kGpt2NoTail, "[0-9][0-9][0-9]"}},
      {{"starcoder", "refact", "smollm", "command-r"}, {"\\p{N}", kGpt2NoTail}},
      {{"gpt-2-digits"}, {"\\p{N}", kGpt2}},
  };
  return k;
}

std::string known_names() {
  std::string s;
  for (const Named& n : known())
    for (const char* name : n.names) s += (s.empty() ? "" : ", ") + std::string(name);
  return s + ", or regex:[...]";
}

}  // namespace

std::vector<std::string> pretokenizer_regexes(const std::string& pre) {
  if (pre.rfind("regex:", 0) == 0) {
    nlohmann::json j = nlohmann::json::parse(pre.substr(6), nullptr, false);
    if (!j.is_array() || j.empty())
      throw invalid_input("tokenizer vocabulary", "pre-tokenizer '" + pre + "' is not regex: followed by a JSON array of patterns");
    std::vector<std::string> out;
    for (const auto& p : j) {
      if (!p.is_string()) throw invalid_input("tokenizer vocabulary", "pre-tokenizer '" + pre + "' holds a non-string pattern");
      out.push_back(p.get<std::string>());
    }
    return out;
  }
  for (const Named& n : known())
    for (const char* name : n.names)
      if (pre == name) return n.regexes;
  throw unsupported("tokenizer vocabulary", "pre-tokenizer '" + pre + "' is not supported (known: " + known_names() + ")");
}

bool is_known_pretokenizer(const std::string& pre) {
  try {
    pretokenizer_regexes(pre);
    return true;
  } catch (const Error&) {
    return false;
  }
}

namespace {

// One compiled pattern (JIT when available).
class Regex {
 public:
  explicit Regex(const std::string& pattern) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw invalid_input("tokenizer vocabulary", "pre-tokenizer regex '" + pattern + "' does not compile at offset " +
                                                      std::to_string(off) + ": " + reinterpret_cast<char*>(msg));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // optional: falls back to the interpreter
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the matches of the regex in `s` and the text between them.
  void split(std::string_view s, pcre2_match_data* md, std::vector<std::string_view>& out) const {
    size_t pos = 0, gap = 0;
    // PCRE2 validates the whole subject's UTF-8 on every call unless told not
    // to: check it on the first call only, or splitting is quadratic. Later
    // offsets are always character boundaries (ends of matches).
    uint32_t options = 0;
    while (pos < s.size()) {
      int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos, options, md, nullptr);
      options = PCRE2_NO_UTF_CHECK;
      if (rc < 0) break;  // no match (or invalid UTF-8: the rest stays one piece)
      PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t b = ov[0], e = ov[1];
      if (e == b) {  // an empty match: step over one character (none left at the end)
        if (b >= s.size()) break;
        pos = b + utf8_len(static_cast<unsigned char>(s[b]));
        continue;
      }
      if (b > gap) out.push_back(s.substr(gap, b - gap));
      out.push_back(s.substr(b, e - b));
      pos = gap = e;
    }
    if (gap < s.size()) out.push_back(s.substr(gap));
  }

 private:
  pcre2_code* code_ = nullptr;
};

struct Symbol {
  int32_t id;  // token of this symbol; -1 when the character is no token
  size_t start, len;
  int prev, next;
};

struct Candidate {
  int left, right;
  int32_t rank, result;
  size_t len;
};

struct CandidateOrder {
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.rank != b.rank) return a.rank > b.rank;  // lowest rank first
    return a.left > b.left;                        // then leftmost
  }
};

uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

class BpeTokenizer final : public TokenizerBase {
 public:
  explicit BpeTokenizer(Vocab v) : TokenizerBase(std::move(v)) {
    for (const std::string& p : pretokenizer_regexes(vocab_.pre)) regexes_.push_back(std::make_unique<Regex>(p));
    // Llama 3's tokenizer.json sets ignore_merges: a piece that is a token is emitted whole.
    ignore_merges_ = vocab_.pre == "llama3" || vocab_.pre == "llama-bpe" || vocab_.pre == "llama-v3";
    build_merges();
  }

  std::vector<int32_t> encode(std::string_view text, bool add_bos) const override {
    std::vector<int32_t> out;
    if (add_bos && vocab_.bos_id >= 0) out.push_back(vocab_.bos_id);
    pcre2_match_data* md = pcre2_match_data_create(4, nullptr);
    try {
      for (const Fragment& f : split_special(text)) {
        if (f.id >= 0) out.push_back(f.id);
        else for (std::string_view w : pretokenize(f.text, md)) encode_word(w, out);
      }
    } catch (...) {
      pcre2_match_data_free(md);
      throw;
    }
    pcre2_match_data_free(md);
    return out;
  }

 protected:
  std::string render(int32_t id) const override {
    const TokenType t = type_of(id);
    if (t == TokenType::Control && (id == vocab_.bos_id || id == vocab_.eos_id || id == vocab_.pad_id)) return {};
    // Added tokens (control, user-defined) are stored as plain text, not in
    // the byte-level alphabet (DeepSeek's "ü", Llama 3's "<|eot_id|>").
    const std::string& p = vocab_.tokens[static_cast<size_t>(id)];
    if (t == TokenType::Control || t == TokenType::UserDefined) return p;
    // Byte-level characters map back to bytes; a character outside the
    // alphabet (a malformed vocabulary) is copied.
    std::string s;
    for (size_t i = 0; i < p.size();) {
      size_t n = std::min(utf8_len(static_cast<unsigned char>(p[i])), p.size() - i);
      int b = unicode_to_byte(std::string_view(p).substr(i, n));
      if (b >= 0) s += static_cast<char>(b);
      else s.append(p, i, n);
      i += n;
    }
    return s;
  }

 private:
  void build_merges() {
    merges_.reserve(vocab_.merges.size() * 2);
    for (size_t r = 0; r < vocab_.merges.size(); ++r) {
      const std::string& m = vocab_.merges[r];
      size_t sp = m.find(' ', 1);
      int32_t a = find(std::string_view(m).substr(0, sp)), b = find(std::string_view(m).substr(sp + 1));
      int32_t res = find(m.substr(0, sp) + m.substr(sp + 1));
      if (a < 0 || b < 0 || res < 0) continue;  // validated earlier; a merge without a result token never applies
      merges_.emplace(pair_key(a, b), std::make_pair(static_cast<int32_t>(r), res));  // first (best) rank wins
    }
  }

  std::vector<std::string_view> pretokenize(std::string_view text, pcre2_match_data* md) const {
    std::vector<std::string_view> pieces{text}, next;
    for (const auto& re : regexes_) {
      next.clear();
      for (std::string_view p : pieces) re->split(p, md, next);
      pieces.swap(next);
    }
    return pieces;
  }

  void push_candidate(const std::vector<Symbol>& sym, int l, int r,
                      std::priority_queue<Candidate, std::vector<Candidate>, CandidateOrder>& q) const {
    if (l < 0 || r < 0 || sym[l].id < 0 || sym[r].id < 0) return;
    auto it = merges_.find(pair_key(sym[l].id, sym[r].id));
    if (it != merges_.end()) q.push({l, r, it->second.first, it->second.second, sym[l].len + sym[r].len});
  }

  void encode_word(std::string_view word, std::vector<int32_t>& out) const {
    std::string mapped;
    mapped.reserve(word.size() * 2);
    for (unsigned char c : word) mapped += byte_to_unicode(c);
    if (ignore_merges_) {
      int32_t whole = find(mapped);
      if (whole >= 0) {
        out.push_back(whole);
        return;
      }
    }
    std::vector<Symbol> sym;
    for (size_t i = 0; i < mapped.size();) {
      size_t n = utf8_len(static_cast<unsigned char>(mapped[i]));
      int idx = static_cast<int>(sym.size());
      sym.push_back({find(std::string_view(mapped).substr(i, n)), i, n, idx - 1, -1});
      if (idx > 0) sym[idx - 1].next = idx;
      i += n;
    }
    std::priority_queue<Candidate, std::vector<Candidate>, CandidateOrder> q;
    for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) push_candidate(sym, i, i + 1, q);
    while (!q.empty()) {
      Candidate c = q.top();
      q.pop();
      Symbol& l = sym[c.left];
      Symbol& r = sym[c.right];
      if (l.len == 0 || r.len == 0 || l.next != c.right || l.len + r.len != c.len) continue;  // stale
      l.id = c.result;
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) sym[r.next].prev = c.left;
      push_candidate(sym, l.prev, c.left, q);
      push_candidate(sym, c.left, l.next, q);
    }
    for (int i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) {
      if (sym[i].id >= 0) {
        out.push_back(sym[i].id);
      } else if (vocab_.unk_id >= 0) {
        out.push_back(vocab_.unk_id);
      } else {
        throw invalid_input("tokenizer", "byte-level character '" + mapped.substr(sym[i].start, sym[i].len) +
                                             "' is not in the vocabulary, which has no UNK token");
      }
    }
  }

  std::vector<std::unique_ptr<Regex>> regexes_;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left, right) -> (rank, result)
  bool ignore_merges_ = false;
};

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(Vocab vocab) { return std::make_unique<BpeTokenizer>(std::move(vocab)); }

}  // namespace qf::tok
