// Tokenizers: one interface, one vocabulary model, several sources.
//
// Every source (tokenizer.json, tokenizer.model, llama2.c tokenizer files,
// GGUF tokenizer metadata) is turned into a `Vocab`, the same data GGUF stores
// under tokenizer.ggml.*; an algorithm chosen by Vocab::model encodes it:
//   - "llama": SentencePiece-style BPE over scores, with byte fallback
//              (Llama-2, Mistral, TinyLlama, phi-3, llama2.c files);
//   - "gpt2":  byte-level BPE over ranked merges after a pre-tokenizer split
//              (GPT-2, Llama-3, Qwen2, DeepSeek, StarCoder, Falcon, ...).
// Special tokens (token_type CONTROL / USER_DEFINED) are split out of the text
// before the model runs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace qf {

// GGUF's tokenizer.ggml.token_type values.
enum class TokenType : int32_t { Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

struct Vocab {
  std::string model;                  // "llama" or "gpt2" (tokenizer.ggml.model)
  std::string pre;                    // pre-tokenizer name (tokenizer.ggml.pre): "default", "llama3", "qwen2", "gpt-2", ...
  std::vector<std::string> tokens;    // id -> piece, as GGUF stores it (SentencePiece "▁" / byte-level "Ġ" forms)
  std::vector<float> scores;          // may be empty for gpt2
  std::vector<TokenType> types;       // may be empty (all Normal)
  std::vector<std::string> merges;    // "left right", rank order (gpt2)
  int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
  bool add_bos = false;               // add BOS by default
  bool add_eos = false;
  bool add_space_prefix = true;       // SentencePiece dummy prefix ("llama" model)
  bool byte_fallback = true;          // "llama" model: unknown characters -> <0xXX> tokens
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // add_bos: prepend BOS (when the vocabulary has one).
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // The vocabulary string of one id (throws qf::Error for an id out of range).
  virtual std::string piece(int32_t id) const = 0;
  virtual const Vocab& vocab() const = 0;
  int32_t vocab_size() const { return static_cast<int32_t>(vocab().tokens.size()); }
  int32_t bos_id() const { return vocab().bos_id; }
  int32_t eos_id() const { return vocab().eos_id; }
  int32_t unk_id() const { return vocab().unk_id; }
  int32_t pad_id() const { return vocab().pad_id; }
  bool add_bos_by_default() const { return vocab().add_bos; }
};

// Builds the tokenizer for a vocabulary (validates it: ids in range, merges
// naming known tokens, a known model and pre-tokenizer).
std::unique_ptr<Tokenizer> make_tokenizer(Vocab vocab);

// tokenizer.model itself is encoded by libsentencepiece (its vocab() is still
// filled from the model proto, for GGUF export).
std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::filesystem::path& model_file);

// Loads from a model folder (tokenizer.json preferred, else tokenizer.model),
// a tokenizer.json or tokenizer.model path, a .gguf file, or a llama2.c
// tokenizer file (.bin). Errors name the file and the problem.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& path);

// Individual sources.
Vocab vocab_from_tokenizer_json(const std::filesystem::path& path);
Vocab vocab_from_sentencepiece_model(const std::filesystem::path& path);
Vocab vocab_from_llama2c(const std::filesystem::path& path);
Vocab vocab_from_gguf(const std::filesystem::path& path);

// Writes tokenizer.json, tokenizer_config.json and special_tokens_map.json
// for a "llama" (SentencePiece BPE) vocabulary into `dir`, as Hugging Face's
// LlamaTokenizerFast files (merges derived from the scores the way HF's
// converter does).
void write_hf_tokenizer(const Vocab& vocab, const std::filesystem::path& dir, int64_t model_max_length);

}  // namespace qf
