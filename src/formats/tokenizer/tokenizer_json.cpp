// Hugging Face tokenizer.json (model.type "BPE") -> Vocab.
//
// Two families are recognised:
//  - byte-level BPE (pre_tokenizer ByteLevel, alone or in a Sequence):
//    model "gpt2", merges kept in rank order. Vocab::pre is derived from the
//    pre-tokenizer: the regex list it implies (Split {"Regex"} patterns,
//    ByteLevel's built-in GPT-2 pattern when use_regex, Digits, Punctuation) is
//    compared with the lists of the named pre-tokenizers ("gpt-2", "llama3",
//    "qwen2", ...); when one matches, its name is stored (so GGUF export writes
//    a name llama.cpp knows), otherwise pre = "regex:" + a JSON array of the
//    patterns, which the gpt2 algorithm applies one after another.
//  - SentencePiece-style BPE (byte_fallback, a normalizer Prepend("▁") +
//    Replace(" ", "▁"), or a Metaspace pre-tokenizer): model "llama". The
//    "llama" algorithm merges by score, so scores are derived from the merge
//    ranks: a token's score is -(rank of the first merge producing it), which
//    makes "highest score" the same pair as "lowest rank". <0xXX> tokens are
//    typed Byte.
// added_tokens become Control (special) or UserDefined; BOS/EOS come from a
// TemplateProcessing post-processor and from tokenizer_config.json beside the
// file (bos_token, eos_token, add_bos_token, add_eos_token), which wins.
#include <map>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io.h"
#include "formats/tokenizer/tokenizer_impl.h"

namespace qf {
namespace {

using nlohmann::json;
constexpr const char* kSpaceMark = "\xE2\x96\x81";  // U+2581

struct Ctx {
  std::string where;
  [[noreturn]] void fail(const std::string& what) const { throw invalid_input(where, what); }
};

// Collects the vocabulary (model.vocab plus added_tokens) into id order.
void read_tokens(const json& root, const json& model, const Ctx& c, Vocab& v, std::vector<bool>& added, std::vector<bool>& special) {
  if (!model.contains("vocab") || !model["vocab"].is_object()) c.fail("model.vocab is missing or not an object");
  std::map<int64_t, std::string> by_id;
  auto put = [&](int64_t id, const std::string& tok, const char* what) {
    if (id < 0 || id > 0x7fffffff) c.fail(std::string(what) + " '" + tok + "' has id " + std::to_string(id) + ", out of range");
    auto [it, fresh] = by_id.emplace(id, tok);
    if (!fresh && it->second != tok)
      c.fail(std::string(what) + " '" + tok + "' has id " + std::to_string(id) + ", already used by '" + it->second + "'");
  };
  for (const auto& [tok, id] : model["vocab"].items()) {
    if (!id.is_number_integer()) c.fail("model.vocab entry '" + tok + "' has a non-integer id");
    put(id.get<int64_t>(), tok, "model.vocab entry");
  }
  std::vector<std::pair<int64_t, bool>> extra;
  if (root.contains("added_tokens")) {
    if (!root["added_tokens"].is_array()) c.fail("added_tokens is not an array");
    for (const json& a : root["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") || !a["content"].is_string())
        c.fail("an added_tokens entry lacks an integer id or a string content");
      put(a["id"].get<int64_t>(), a["content"].get<std::string>(), "added token");
      extra.emplace_back(a["id"].get<int64_t>(), a.value("special", false));
    }
  }
  if (by_id.empty()) c.fail("the vocabulary is empty");
  const int64_t n = by_id.rbegin()->first + 1;
  if (static_cast<int64_t>(by_id.size()) != n) {
    int64_t expect = 0;
    for (const auto& [id, tok] : by_id) {
      if (id != expect) break;
      ++expect;
    }
    c.fail("token ids are not contiguous: id " + std::to_string(expect) + " is missing (largest id " + std::to_string(n - 1) + ")");
  }
  for (auto& [id, tok] : by_id) v.tokens.push_back(std::move(tok));
  added.assign(static_cast<size_t>(n), false);
  special.assign(static_cast<size_t>(n), false);
  for (auto [id, sp] : extra) {
    added[static_cast<size_t>(id)] = true;
    special[static_cast<size_t>(id)] = sp;
  }
}

// Merges as (left, right) strings, accepting "a b" and ["a", "b"].
std::vector<std::pair<std::string, std::string>> read_merges(const json& model, const Ctx& c) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!model.contains("merges")) return out;
  if (!model["merges"].is_array()) c.fail("model.merges is not an array");
  size_t i = 0;
  for (const json& m : model["merges"]) {
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      size_t sp = s.find(' ', 1);
      if (sp == std::string::npos || sp + 1 >= s.size()) c.fail("merge " + std::to_string(i) + " '" + s + "' is not of the form 'left right'");
      out.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      out.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      c.fail("merge " + std::to_string(i) + " is neither a 'left right' string nor a pair of strings");
    }
    ++i;
  }
  return out;
}

// Sequences of pre-tokenizers, normalizers and processors nest one or two
// levels in practice; deeper nesting is refused rather than recursed into.
constexpr int kMaxNesting = 16;

void check_nesting(int depth, const Ctx& c) {
  if (depth > kMaxNesting) c.fail("Sequence nodes are nested more than " + std::to_string(kMaxNesting) + " levels deep");
}

bool has_type(const json& node, const std::string& type, const Ctx& c, int depth = 0) {
  if (!node.is_object()) return false;
  check_nesting(depth, c);
  if (node.value("type", "") == type) return true;
  for (const char* list : {"pretokenizers", "normalizers", "processors"})
    if (node.contains(list) && node[list].is_array())
      for (const json& child : node[list])
        if (has_type(child, type, c, depth + 1)) return true;
  return false;
}

std::string regex_quote(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(ch) != std::string_view::npos) out += '\\';
    out += ch;
  }
  return out;
}

// The regexes a byte-level pre_tokenizer applies, in order.
void collect_regexes(const json& node, const Ctx& c, std::vector<std::string>& out, int depth = 0) {
  if (!node.is_object()) return;
  check_nesting(depth, c);
  const std::string type = node.value("type", "");
  if (type == "Sequence" && node.contains("pretokenizers")) {
    for (const json& child : node["pretokenizers"]) collect_regexes(child, c, out, depth + 1);
  } else if (type == "Split") {
    if (node.value("invert", false)) throw unsupported(c.where, "a Split pre-tokenizer with invert: true is not supported");
    const json& p = node.contains("pattern") ? node["pattern"] : json();
    if (p.contains("Regex") && p["Regex"].is_string()) out.push_back(p["Regex"].get<std::string>());
    else if (p.contains("String") && p["String"].is_string()) out.push_back(regex_quote(p["String"].get<std::string>()));
    else c.fail("a Split pre-tokenizer has no Regex or String pattern");
  } else if (type == "ByteLevel") {
    if (node.value("use_regex", true)) out.push_back(tok::pretokenizer_regexes("gpt-2").front());
  } else if (type == "Digits") {
    out.push_back(node.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+");
  } else if (type == "Punctuation") {
    out.push_back("[\\p{P}\\$\\+<=>\\^~\\|`]+");
  } else if (!type.empty()) {
    throw unsupported(c.where, "pre-tokenizer '" + type + "' is not supported with byte-level BPE");
  }
}

std::string pre_name(const json& root, const Ctx& c) {
  std::vector<std::string> regexes;
  collect_regexes(root.value("pre_tokenizer", json()), c, regexes);
  for (const char* name : {"gpt-2", "llama3", "qwen2", "deepseek-llm", "deepseek-coder", "falcon", "starcoder", "gpt-2-digits"})
    if (tok::pretokenizer_regexes(name) == regexes) return name;
  if (regexes.empty()) c.fail("a byte-level tokenizer whose pre-tokenizer applies no regex is not supported");
  return "regex:" + json(regexes).dump();
}

// Token id by content, or -1.
int32_t id_of(const Vocab& v, const std::string& s) {
  for (size_t i = 0; i < v.tokens.size(); ++i)
    if (v.tokens[i] == s) return static_cast<int32_t>(i);
  return -1;
}

// Finds TemplateProcessing (possibly inside a Sequence) and takes its leading
// special token as BOS.
void read_template(const json& node, Vocab& v, const Ctx& c, int depth = 0) {
  if (!node.is_object()) return;
  check_nesting(depth, c);
  if (node.value("type", "") == "Sequence" && node.contains("processors")) {
    for (const json& p : node["processors"]) read_template(p, v, c, depth + 1);
    return;
  }
  if (node.value("type", "") != "TemplateProcessing" || !node.contains("single") || !node["single"].is_array()) return;
  const json& single = node["single"];
  if (!single.empty() && single[0].contains("SpecialToken")) {
    int32_t id = id_of(v, single[0]["SpecialToken"].value("id", ""));
    if (id >= 0) {
      v.bos_id = id;
      v.add_bos = true;
    }
  }
  if (single.size() > 1 && single.back().contains("SpecialToken")) {
    int32_t id = id_of(v, single.back()["SpecialToken"].value("id", ""));
    if (id >= 0) {
      v.eos_id = id;
      v.add_eos = true;
    }
  }
}

std::string token_text(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return {};
}

void read_config(const std::filesystem::path& json_path, Vocab& v) {
  const auto cfg_path = json_path.parent_path() / "tokenizer_config.json";
  if (!path_exists(cfg_path)) return;
  json cfg = json::parse(read_text_file(cfg_path), nullptr, false);
  if (!cfg.is_object()) throw invalid_input(cfg_path.string(), "not a JSON object");
  auto set_id = [&](const char* key, int32_t& id) {
    if (!cfg.contains(key)) return;
    int32_t found = id_of(v, token_text(cfg[key]));
    if (found >= 0) id = found;
  };
  set_id("bos_token", v.bos_id);
  set_id("eos_token", v.eos_id);
  set_id("unk_token", v.unk_id);
  set_id("pad_token", v.pad_id);
  if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) v.add_bos = cfg["add_bos_token"].get<bool>();
  if (cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean()) v.add_eos = cfg["add_eos_token"].get<bool>();
  if (v.bos_id < 0) v.add_bos = false;
}

bool is_sentencepiece_style(const json& root, const json& model, const Ctx& c) {
  if (model.value("byte_fallback", false)) return true;
  const json norm = root.value("normalizer", json());
  const json pre = root.value("pre_tokenizer", json());
  return has_type(pre, "Metaspace", c) || has_type(norm, "Prepend", c) ||
         (has_type(norm, "Replace", c) && norm.dump().find(kSpaceMark) != std::string::npos);
}

bool space_prefix(const json& root, const Ctx& c) {
  const json norm = root.value("normalizer", json());
  if (has_type(norm, "Prepend", c)) return true;
  const json pre = root.value("pre_tokenizer", json());
  if (!has_type(pre, "Metaspace", c)) return false;
  std::string d = pre.dump();  // prepend_scheme "never" or add_prefix_space false turn it off
  return d.find("\"never\"") == std::string::npos && d.find("\"add_prefix_space\":false") == std::string::npos;
}

void fill_sentencepiece(const json& root, const json& model, const std::vector<std::pair<std::string, std::string>>& merges,
                        Vocab& v, const Ctx& c) {
  v.model = "llama";
  v.pre = "default";
  v.byte_fallback = model.value("byte_fallback", false);
  v.add_space_prefix = space_prefix(root, c);
  std::unordered_map<std::string, int32_t> ids;
  for (size_t i = 0; i < v.tokens.size(); ++i) ids.emplace(v.tokens[i], static_cast<int32_t>(i));
  // Tokens no merge produces (single characters, specials) rank below all merges.
  v.scores.assign(v.tokens.size(), -static_cast<float>(merges.size()) - 1.0f);
  std::vector<bool> scored(v.tokens.size(), false);
  for (size_t r = 0; r < merges.size(); ++r) {
    auto it = ids.find(merges[r].first + merges[r].second);
    if (it == ids.end() || scored[static_cast<size_t>(it->second)]) continue;
    v.scores[static_cast<size_t>(it->second)] = -static_cast<float>(r);
    scored[static_cast<size_t>(it->second)] = true;
  }
  for (size_t i = 0; i < v.tokens.size(); ++i)
    if (v.types[i] == TokenType::Normal && tok::parse_byte_piece(v.tokens[i]) >= 0) v.types[i] = TokenType::Byte;
}

}  // namespace

namespace {

Vocab read_tokenizer_json(const std::filesystem::path& path) {
  Ctx c{path.string()};
  if (!path_exists(path)) throw not_found(c.where, "no such file");
  json root = json::parse(read_text_file(path), nullptr, false);
  if (root.is_discarded()) c.fail("not valid JSON");
  if (!root.is_object()) c.fail("the top level is not a JSON object");
  if (!root.contains("model") || !root["model"].is_object()) c.fail("no \"model\" object");
  const json& model = root["model"];
  const std::string type = model.value("type", model.contains("merges") ? "BPE" : "");
  if (type != "BPE") throw unsupported(c.where, "model type '" + type + "' is not supported (only BPE)");

  Vocab v;
  std::vector<bool> added, special;
  read_tokens(root, model, c, v, added, special);
  auto merges = read_merges(model, c);
  std::unordered_map<std::string_view, int> known;
  for (const std::string& t : v.tokens) known.emplace(t, 0);
  for (size_t i = 0; i < merges.size(); ++i)
    if (!known.count(merges[i].first) || !known.count(merges[i].second))
      c.fail("merge " + std::to_string(i) + " '" + merges[i].first + " " + merges[i].second + "' names a token that is not in the vocabulary");

  v.types.assign(v.tokens.size(), TokenType::Normal);
  for (size_t i = 0; i < v.tokens.size(); ++i)
    if (added[i]) v.types[i] = special[i] ? TokenType::Control : TokenType::UserDefined;
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    v.unk_id = id_of(v, model["unk_token"].get<std::string>());
    if (v.unk_id >= 0) v.types[static_cast<size_t>(v.unk_id)] = TokenType::Unknown;
  }

  if (is_sentencepiece_style(root, model, c)) {
    fill_sentencepiece(root, model, merges, v, c);
  } else if (has_type(root.value("pre_tokenizer", json()), "ByteLevel", c)) {
    v.model = "gpt2";
    v.pre = pre_name(root, c);
    v.add_space_prefix = false;
    v.byte_fallback = false;
    for (auto& [l, r] : merges) v.merges.push_back(l + " " + r);
  } else {
    throw unsupported(c.where, "a BPE tokenizer that is neither byte-level (ByteLevel pre-tokenizer) nor SentencePiece-style "
                               "(byte_fallback, Metaspace or a U+2581 normalizer) is not supported");
  }
  read_template(root.value("post_processor", json()), v, c);
  read_config(path, v);
  return v;
}

}  // namespace

Vocab vocab_from_tokenizer_json(const std::filesystem::path& path) {
  try {
    return read_tokenizer_json(path);
  } catch (const nlohmann::json::exception& e) {
    // A value of the wrong JSON type where a string, bool or object is read
    // (e.g. "special": 1, a SpecialToken that is not an object).
    throw invalid_input(path.string(), std::string("unexpected JSON value: ") + e.what());
  }
}

}  // namespace qf
