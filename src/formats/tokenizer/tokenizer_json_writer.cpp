// Writes a "llama" (SentencePiece BPE) Vocab as the Hugging Face files a
// LlamaTokenizerFast loads: tokenizer.json, tokenizer_config.json and
// special_tokens_map.json.
//
// Merges are derived as Hugging Face's SentencePiece converter derives them:
// every split of a normal piece into two vocabulary pieces, ranked by the
// merged piece's score (highest first), ties by the ids of the two halves.
#include <algorithm>
#include <map>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io.h"
#include "formats/tokenizer/tokenizer.h"

namespace qf {
namespace {

using json = nlohmann::ordered_json;
const char* kSpace = "\xE2\x96\x81";

std::vector<std::string> derive_merges(const Vocab& v) {
  std::map<std::string, int32_t> id;
  for (size_t i = 0; i < v.tokens.size(); ++i) id.emplace(v.tokens[i], static_cast<int32_t>(i));
  struct M {
    int32_t left, right;
    float score;
    size_t order;
  };
  std::vector<M> merges;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    if (!v.types.empty() && v.types[i] != TokenType::Normal) continue;
    const std::string& p = v.tokens[i];
    std::vector<M> local;
    for (size_t k = 1; k < p.size(); ++k) {
      if ((static_cast<unsigned char>(p[k]) & 0xC0) == 0x80) continue;  // split only between characters
      auto l = id.find(p.substr(0, k)), r = id.find(p.substr(k));
      if (l != id.end() && r != id.end()) local.push_back({l->second, r->second, v.scores[i], 0});
    }
    std::sort(local.begin(), local.end(),
              [](const M& a, const M& b) { return std::tie(a.left, a.right) < std::tie(b.left, b.right); });
    for (auto& m : local) {
      m.order = merges.size();
      merges.push_back(m);
    }
  }
  std::stable_sort(merges.begin(), merges.end(), [](const M& a, const M& b) { return a.score > b.score; });
  std::vector<std::string> out;
  out.reserve(merges.size());
  for (const auto& m : merges)
    out.push_back(v.tokens[static_cast<size_t>(m.left)] + " " + v.tokens[static_cast<size_t>(m.right)]);
  return out;
}

json added_token(int32_t id, const std::string& content) {
  return {{"id", id},           {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},    {"normalized", false}, {"special", true}};
}

json token_decl(const std::string& content) {
  return {{"content", content}, {"lstrip", false}, {"normalized", false}, {"rstrip", false},
          {"single_word", false}, {"special", true}};
}

}  // namespace

void write_hf_tokenizer(const Vocab& v, const std::filesystem::path& dir, int64_t model_max_length) {
  if (v.model != "llama")
    throw unsupported(dir.string(), "writing tokenizer.json is implemented for SentencePiece-style (llama) vocabularies only");
  if (v.scores.size() != v.tokens.size())
    throw invalid_input(dir.string(), "the vocabulary has no score per token; merges cannot be derived");
  auto name = [&](int32_t id) { return id >= 0 ? v.tokens.at(static_cast<size_t>(id)) : std::string(); };
  json vocab = json::object();
  for (size_t i = 0; i < v.tokens.size(); ++i) vocab[v.tokens[i]] = static_cast<int32_t>(i);
  json added = json::array();
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const TokenType t = v.types.empty() ? TokenType::Normal : v.types[i];
    if (t == TokenType::Control || t == TokenType::Unknown || t == TokenType::UserDefined)
      added.push_back(added_token(static_cast<int32_t>(i), v.tokens[i]));
  }
  json bos_seq = json::array();
  if (v.bos_id >= 0 && v.add_bos) bos_seq.push_back({{"SpecialToken", {{"id", name(v.bos_id)}, {"type_id", 0}}}});
  json single = bos_seq, pair = bos_seq;
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  pair.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  if (v.bos_id >= 0 && v.add_bos) pair.push_back({{"SpecialToken", {{"id", name(v.bos_id)}, {"type_id", 1}}}});
  pair.push_back({{"Sequence", {{"id", "B"}, {"type_id", 1}}}});
  json special = json::object();
  if (v.bos_id >= 0 && v.add_bos)
    special[name(v.bos_id)] = {{"id", name(v.bos_id)}, {"ids", {v.bos_id}}, {"tokens", {name(v.bos_id)}}};

  json normalizers = json::array();
  if (v.add_space_prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", kSpace}});
  normalizers.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}});
  json decoders = json::array({json{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                               json{{"type", "ByteFallback"}}, json{{"type", "Fuse"}}});
  if (v.add_space_prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});

  json tj = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", {{"type", "Sequence"}, {"normalizers", normalizers}}},
      {"pre_tokenizer", nullptr},
      {"post_processor", {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", special}}},
      {"decoder", {{"type", "Sequence"}, {"decoders", decoders}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", v.unk_id >= 0 ? json(name(v.unk_id)) : json(nullptr)},
        {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", true},
        {"byte_fallback", v.byte_fallback}, {"ignore_merges", false}, {"vocab", vocab}, {"merges", derive_merges(v)}}},
  };

  json decl = json::object();
  for (const auto& a : added) decl[std::to_string(a["id"].get<int32_t>())] = token_decl(a["content"]);
  auto opt = [&](int32_t id) { return id >= 0 ? json(name(id)) : json(nullptr); };
  json cfg = {{"add_bos_token", v.add_bos},
              {"add_eos_token", v.add_eos},
              {"added_tokens_decoder", decl},
              {"bos_token", opt(v.bos_id)},
              {"eos_token", opt(v.eos_id)},
              {"unk_token", opt(v.unk_id)},
              {"pad_token", opt(v.pad_id)},
              {"clean_up_tokenization_spaces", false},
              {"legacy", false},
              {"model_max_length", model_max_length},
              {"sp_model_kwargs", json::object()},
              {"spaces_between_special_tokens", false},
              {"tokenizer_class", "LlamaTokenizer"}};
  json stm = json::object();
  if (v.bos_id >= 0) stm["bos_token"] = token_decl(name(v.bos_id));
  if (v.eos_id >= 0) stm["eos_token"] = token_decl(name(v.eos_id));
  if (v.unk_id >= 0) stm["unk_token"] = token_decl(name(v.unk_id));
  if (v.pad_id >= 0) stm["pad_token"] = token_decl(name(v.pad_id));

  auto dump = [](const json& j) { return j.dump(2, ' ', false, json::error_handler_t::strict) + "\n"; };
  write_file_atomic(dir / "tokenizer.json", dump(tj));
  write_file_atomic(dir / "tokenizer_config.json", dump(cfg));
  write_file_atomic(dir / "special_tokens_map.json", dump(stm));
}

}  // namespace qf
