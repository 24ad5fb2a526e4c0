#include "formats/gguf/gguf.h"
#include "formats/gguf/gguf_writer.h"
#include "formats/tokenizer/tokenizer.h"
#include "test_util.h"

namespace qf {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

void expect_same(const Vocab& a, const Vocab& b) {
  EXPECT_EQ(a.model, b.model);
  EXPECT_EQ(a.pre, b.pre);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.scores, b.scores);
  EXPECT_EQ(a.types, b.types);
  EXPECT_EQ(a.merges, b.merges);
  EXPECT_EQ(a.bos_id, b.bos_id);
  EXPECT_EQ(a.eos_id, b.eos_id);
  EXPECT_EQ(a.unk_id, b.unk_id);
  EXPECT_EQ(a.pad_id, b.pad_id);
  EXPECT_EQ(a.add_bos, b.add_bos);
  EXPECT_EQ(a.add_eos, b.add_eos);
  EXPECT_EQ(a.add_space_prefix, b.add_space_prefix);
  EXPECT_EQ(a.byte_fallback, b.byte_fallback);
}

Vocab llama_vocab() {
  Vocab v;
  v.model = "llama";
  v.pre = "default";
  v.tokens = {"<unk>", "<s>", "</s>", "<0x41>", "\xe2\x96\x81hi", "a"};
  v.scores = {0, 0, 0, 0, -1.5f, -2.25f};
  v.types = {TokenType::Unknown, TokenType::Control, TokenType::Control, TokenType::Byte, TokenType::Normal,
             TokenType::UserDefined};
  v.unk_id = 0;
  v.bos_id = 1;
  v.eos_id = 2;
  v.add_bos = false;  // not the llama default, so the key must carry it
  v.add_eos = true;
  v.add_space_prefix = false;
  return v;
}

Vocab gpt2_vocab() {
  Vocab v;
  v.model = "gpt2";
  v.pre = "llama3";
  v.tokens = {"a", "b", "ab", "\xc4\xa0", "<|end|>"};
  v.merges = {"a b"};
  v.types = {TokenType::Normal, TokenType::Normal, TokenType::Normal, TokenType::Normal, TokenType::Control};
  v.bos_id = 4;
  v.eos_id = 4;
  v.pad_id = 3;
  v.add_bos = true;
  v.add_space_prefix = false;  // what reading a gpt2 vocab yields (the key is only written for llama)
  return v;
}

fs::path write_vocab(const TempDir& dir, const std::string& name, const Vocab& v) {
  GgufWriter w(dir / name);
  w.add_string("general.architecture", "llama");
  write_tokenizer_metadata(w, v);
  return w.finish();
}

TEST(VocabGguf, RoundTripsLlamaVocab) {
  TempDir dir;
  Vocab v = llama_vocab();
  expect_same(vocab_from_gguf(write_vocab(dir, "llama.gguf", v)), v);
}

TEST(VocabGguf, RoundTripsGpt2Vocab) {
  TempDir dir;
  Vocab v = gpt2_vocab();
  expect_same(vocab_from_gguf(write_vocab(dir, "gpt2.gguf", v)), v);
}

TEST(VocabGguf, WritesLlamaCppKeyNames) {
  TempDir dir;
  GgufFile f = GgufFile::open(write_vocab(dir, "llama.gguf", llama_vocab()));
  for (const char* key : {"tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                          "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                          "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.add_bos_token",
                          "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix"})
    EXPECT_TRUE(f.has(key)) << key;
  EXPECT_FALSE(f.has("tokenizer.ggml.padding_token_id"));  // pad_id < 0
  EXPECT_FALSE(f.has("tokenizer.ggml.merges"));
  EXPECT_EQ(f.value("tokenizer.ggml.bos_token_id").type, GgufType::U32);
  EXPECT_EQ(f.value("tokenizer.ggml.token_type").elem_type, GgufType::I32);
  EXPECT_EQ(f.value("tokenizer.ggml.scores").elem_type, GgufType::F32);
}

TEST(VocabGguf, DefaultsFollowLlamaCpp) {
  TempDir dir;
  for (const char* model : {"llama", "gpt2"}) {
    GgufWriter w(dir / (std::string(model) + ".gguf"));
    w.add_string("tokenizer.ggml.model", model);
    w.add_string_array("tokenizer.ggml.tokens", {"x", "y"});
    Vocab v = vocab_from_gguf(w.finish());
    const bool spm = std::string(model) == "llama";
    EXPECT_EQ(v.pre, "default");
    EXPECT_EQ(v.add_bos, spm) << model;
    EXPECT_FALSE(v.add_eos);
    EXPECT_EQ(v.add_space_prefix, spm) << model;
    EXPECT_EQ(v.bos_id, -1);
    EXPECT_TRUE(v.scores.empty());
    EXPECT_TRUE(v.types.empty());
  }
}

// Builds a vocab file from a callback that adds (possibly bad) keys.
template <typename F>
fs::path vocab_file(const TempDir& dir, const std::string& name, F add) {
  GgufWriter w(dir / name);
  add(w);
  return w.finish();
}

TEST(VocabGguf, RejectsInconsistentMetadata) {
  TempDir dir;
  auto base = [](GgufWriter& w, std::vector<std::string> tokens) {
    w.add_string("tokenizer.ggml.model", "llama");
    w.add_string_array("tokenizer.ggml.tokens", tokens);
  };
  fs::path p = vocab_file(dir, "no-tokens.gguf", [](GgufWriter& w) { w.add_string("tokenizer.ggml.model", "llama"); });
  EXPECT_QF_ERROR(vocab_from_gguf(p), ErrorKind::NotFound, "no-tokens.gguf: no metadata key 'tokenizer.ggml.tokens'");
  p = vocab_file(dir, "no-model.gguf", [](GgufWriter& w) { w.add_string_array("tokenizer.ggml.tokens", {"a"}); });
  EXPECT_QF_ERROR(vocab_from_gguf(p), ErrorKind::NotFound, "'tokenizer.ggml.model'");
  p = vocab_file(dir, "empty.gguf", [&](GgufWriter& w) { base(w, {}); });
  EXPECT_QF_ERROR(vocab_from_gguf(p), ErrorKind::InvalidInput, "empty.gguf: metadata 'tokenizer.ggml.tokens' is empty");
  p = vocab_file(dir, "scores.gguf", [&](GgufWriter& w) {
    base(w, {"a", "b"});
    w.add_f32_array("tokenizer.ggml.scores", {1.0f});
  });
  EXPECT_QF_ERROR(vocab_from_gguf(p), ErrorKind::InvalidInput, "scores.gguf: metadata 'tokenizer.ggml.scores' has 1 entries");
  p = vocab_file(dir, "types.gguf", [&](GgufWriter& w) {
    base(w, {"a", "b"});
    w.add_i32_array("tokenizer.ggml.token_type", {1, 1, 1});
  });
  EXPECT_QF_ERROR(vocab_from_gguf(p), ErrorKind::InvalidInput, "'tokenizer.ggml.token_type' has 3 entries");
  p = vocab_file(dir, "type-value.gguf", [&](GgufWriter& w) {
    base(w, {"a", "b"});
    w.add_i32_array("tokenizer.ggml.token_type", {1, 9});
  });
  EXPECT_QF_ERROR(vocab_from_gguf(p), ErrorKind::InvalidInput, "entry 1 is 9, not a token type");
  p = vocab_file(dir, "bos.gguf", [&](GgufWriter& w) {
    base(w, {"a", "b"});
    w.add_u32("tokenizer.ggml.bos_token_id", 2);
  });
  EXPECT_QF_ERROR(vocab_from_gguf(p), ErrorKind::InvalidInput, "bos.gguf: metadata 'tokenizer.ggml.bos_token_id': token id 2 is out of range");
  p = vocab_file(dir, "model-type.gguf", [&](GgufWriter& w) {
    w.add_u32("tokenizer.ggml.model", 1);
    w.add_string_array("tokenizer.ggml.tokens", {"a"});
  });
  EXPECT_QF_ERROR(vocab_from_gguf(p), ErrorKind::InvalidInput, "'tokenizer.ggml.model': expected STRING, got UINT32");
  p = vocab_file(dir, "tokens-type.gguf", [&](GgufWriter& w) {
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_i32_array("tokenizer.ggml.tokens", {1});
  });
  EXPECT_QF_ERROR(vocab_from_gguf(p), ErrorKind::InvalidInput, "expected ARRAY of STRING, got ARRAY of INT32");
}

TEST(VocabGguf, NoneSentinelIdsMeanAbsent) {
  TempDir dir;
  fs::path p = vocab_file(dir, "none.gguf", [](GgufWriter& w) {
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string_array("tokenizer.ggml.tokens", {"a"});
    w.add_i32("tokenizer.ggml.padding_token_id", -1);
    w.add_u32("tokenizer.ggml.unknown_token_id", 0xffffffffu);
  });
  Vocab v = vocab_from_gguf(p);
  EXPECT_EQ(v.pad_id, -1);
  EXPECT_EQ(v.unk_id, -1);
}

// The real vocabularies from llama.cpp's test models.
TEST(VocabGguf, ReadsRealVocabularies) {
  const fs::path dir = test::shared_dir() / "data" / "tokenizer-vectors";
  if (!fs::is_directory(dir)) GTEST_SKIP() << dir << " is absent; real GGUF vocabularies not tested";
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".gguf") continue;
    SCOPED_TRACE(entry.path().filename().string());
    ++files;
    GgufFile f = GgufFile::open(entry.path());
    EXPECT_EQ(f.version(), 3u);
    EXPECT_TRUE(f.tensors().empty());
    Vocab v = vocab_from_gguf(entry.path());
    EXPECT_TRUE(v.model == "llama" || v.model == "gpt2") << v.model;
    EXPECT_FALSE(v.pre.empty());
    EXPECT_GE(v.tokens.size(), 30000u);
    EXPECT_LE(v.tokens.size(), 200000u);
    EXPECT_EQ(v.types.size(), v.tokens.size());
    if (v.model == "llama") {
      EXPECT_EQ(v.scores.size(), v.tokens.size());
      EXPECT_TRUE(v.merges.empty());
      EXPECT_EQ(v.tokens[v.bos_id], "<s>");
    } else {
      EXPECT_GT(v.merges.size(), v.tokens.size() * 9 / 10);
      EXPECT_NE(v.merges[0].find(' '), std::string::npos) << v.merges[0];
    }
    EXPECT_GE(v.eos_id, 0);
    // Round trip through our writer keeps every field.
    TempDir tmp;
    expect_same(vocab_from_gguf(write_vocab(tmp, "copy.gguf", v)), v);
  }
  EXPECT_GE(files, 9);
}

}  // namespace
}  // namespace qf
