// Vocab from GGUF tokenizer metadata (tokenizer.ggml.*), as llama.cpp writes it.
#include <limits>

#include "core/error.h"
#include "formats/gguf/gguf.h"
#include "formats/tokenizer/tokenizer.h"

namespace qf {

namespace {

constexpr const char* kPrefix = "tokenizer.ggml.";

std::string key_of(const char* name) { return std::string(kPrefix) + name; }

// A special token id: absent -> -1. Some converters store "none" as -1 in a
// signed type or as 0xFFFFFFFF; both mean absent. Anything else must be a
// valid token id.
int32_t read_id(const GgufFile& f, const char* name, size_t n_tokens) {
  const std::string key = key_of(name);
  if (!f.has(key)) return -1;
  int64_t v = f.get_i64(key);
  if (v == -1 || v == 0xffffffffll) return -1;
  if (v < 0 || static_cast<uint64_t>(v) >= n_tokens)
    throw invalid_input(f.path().string(), "metadata '" + key + "': token id " + std::to_string(v) +
                                               " is out of range (the vocabulary has " + std::to_string(n_tokens) + " tokens)");
  return static_cast<int32_t>(v);
}

bool read_bool(const GgufFile& f, const char* name, bool fallback) {
  const std::string key = key_of(name);
  return f.has(key) ? f.get_bool(key) : fallback;
}

// Per-token arrays (types, scores) must have one entry per token.
void check_per_token(const GgufFile& f, const std::string& key, size_t entries, size_t n_tokens) {
  if (entries != n_tokens)
    throw invalid_input(f.path().string(), "metadata '" + key + "' has " + std::to_string(entries) +
                                               " entries, but tokenizer.ggml.tokens has " + std::to_string(n_tokens));
}

std::vector<TokenType> read_types(const GgufFile& f, size_t n_tokens) {
  const std::string key = key_of("token_type");
  if (!f.has(key)) return {};
  std::vector<int64_t> raw = f.get_int_array(key);
  check_per_token(f, key, raw.size(), n_tokens);
  std::vector<TokenType> types;
  types.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] < 0 || raw[i] > static_cast<int64_t>(TokenType::Byte))
      throw invalid_input(f.path().string(), "metadata '" + key + "': entry " + std::to_string(i) + " is " +
                                                 std::to_string(raw[i]) + ", not a token type (0 to 6)");
    types.push_back(static_cast<TokenType>(raw[i]));
  }
  return types;
}

std::vector<float> read_scores(const GgufFile& f, size_t n_tokens) {
  const std::string key = key_of("scores");
  if (!f.has(key)) return {};
  std::vector<float> scores = f.get_float_array(key);
  check_per_token(f, key, scores.size(), n_tokens);
  return scores;
}

}  // namespace

Vocab vocab_from_gguf(const std::filesystem::path& path) {
  GgufFile f = GgufFile::open(path);
  const std::string where = path.string();
  Vocab v;
  v.model = f.get_string(key_of("model"));
  v.pre = f.has(key_of("pre")) ? f.get_string(key_of("pre")) : "default";
  v.tokens = f.get_string_array(key_of("tokens"));
  if (v.tokens.empty()) throw invalid_input(where, "metadata 'tokenizer.ggml.tokens' is empty");
  if (v.tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    throw invalid_input(where, "metadata 'tokenizer.ggml.tokens' has more tokens than int32 ids can address");
  const size_t n = v.tokens.size();
  v.scores = read_scores(f, n);
  v.types = read_types(f, n);
  if (f.has(key_of("merges"))) v.merges = f.get_string_array(key_of("merges"));
  v.bos_id = read_id(f, "bos_token_id", n);
  v.eos_id = read_id(f, "eos_token_id", n);
  v.unk_id = read_id(f, "unknown_token_id", n);
  v.pad_id = read_id(f, "padding_token_id", n);
  // llama.cpp's defaults: SentencePiece models add BOS and a space prefix; byte-level BPE neither.
  const bool spm = v.model == "llama";
  v.add_bos = read_bool(f, "add_bos_token", spm);
  v.add_eos = read_bool(f, "add_eos_token", false);
  v.add_space_prefix = read_bool(f, "add_space_prefix", spm);
  return v;
}

}  // namespace qf
