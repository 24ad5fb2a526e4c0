// Tokenizer algorithms and sources: llama2.c parity (an independent O(n^2)
// reference of llama2.c's encoder), tokenizer.json vs tokenizer.model parity
// on the fixture model, malformed inputs, vocabulary validation, special
// tokens and decode(encode(x)) round trips.
#include <cstring>
#include <fstream>
#include <map>

#include "core/io.h"
#include "formats/gguf/gguf_writer.h"
#include "formats/tokenizer/tokenizer.h"
#include "test_util.h"

namespace qf {
namespace {

namespace fs = std::filesystem;

fs::path stories_tok() { return test::shared_dir() / "models" / "stories260K" / "tok512.bin"; }
fs::path fixture_dir() { return test::source_dir() / "tests" / "data" / "fixture-llama"; }

// ---- an independent llama2.c encoder (run.c's algorithm, quadratic) -------

struct RefVocab {
  std::vector<std::string> pieces;  // raw, with plain spaces, as in the file
  std::vector<float> scores;
};

RefVocab read_ref_vocab(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  RefVocab v;
  int32_t max_len = 0;
  in.read(reinterpret_cast<char*>(&max_len), 4);
  float score;
  int32_t len;
  while (in.read(reinterpret_cast<char*>(&score), 4) && in.read(reinterpret_cast<char*>(&len), 4)) {
    std::string s(static_cast<size_t>(len), '\0');
    in.read(s.data(), len);
    v.pieces.push_back(s);
    v.scores.push_back(score);
  }
  return v;
}

int lookup(const RefVocab& v, const std::string& s) {
  static std::map<std::string, int> index;  // first id of each piece, as run.c's sorted lookup finds it
  if (index.empty())
    for (size_t i = 0; i < v.pieces.size(); ++i) index.emplace(v.pieces[i], static_cast<int>(i));
  auto it = index.find(s);
  return it == index.end() ? -1 : it->second;
}

std::vector<int32_t> ref_encode(const RefVocab& v, const std::string& text) {
  std::vector<int32_t> ids{1};  // BOS
  if (text.empty()) return ids;
  const std::string t = " " + text;
  for (size_t i = 0; i < t.size();) {
    size_t n = 1;
    while (i + n < t.size() && (static_cast<unsigned char>(t[i + n]) & 0xC0) == 0x80 && n < 4) ++n;
    int id = lookup(v, t.substr(i, n));
    if (id >= 0) {
      ids.push_back(id);
    } else {
      for (size_t k = 0; k < n; ++k) ids.push_back(static_cast<unsigned char>(t[i + k]) + 3);
    }
    i += n;
  }
  for (;;) {
    float best = -1e10f;
    int best_id = -1;
    size_t best_at = 0;
    for (size_t i = 1; i + 1 < ids.size(); ++i) {  // ids[0] is BOS
      int id = lookup(v, v.pieces[ids[i]] + v.pieces[ids[i + 1]]);
      if (id >= 0 && v.scores[id] > best) {
        best = v.scores[id];
        best_id = id;
        best_at = i;
      }
    }
    if (best_id < 0) break;
    ids[best_at] = best_id;
    ids.erase(ids.begin() + static_cast<long>(best_at) + 1);
  }
  return ids;
}

const std::vector<std::string>& diverse_strings() {
  static const std::vector<std::string> s = {
      "Once upon a time",
      "Lily and Tom went to the park. They saw a big dog!",
      "Hello, world!\nA new line\tand a tab.",
      "   leading spaces and trailing   ",
      "double  spaces   triple",
      "ünïcödé Führer naïve café",
      "emoji 🎉🦙 and flags 🇩🇪",
      "日本語のテキスト 中文 한국어",
      "numbers 1234567890 3.14159",
      "\n\n\n",
      " ",
      "x",
      "'s 've 're it's DON'T",
      "tabs\t\tand\r\nCRLF\r\n",
      "",
  };
  return s;
}

// ---- llama2.c -----------------------------------------------------------------

TEST(TokStories, MatchesLlama2cReferenceEncoder) {
  if (!fs::exists(stories_tok())) GTEST_SKIP() << stories_tok() << " is absent";
  RefVocab ref = read_ref_vocab(stories_tok());
  ASSERT_EQ(ref.pieces.size(), 512u);
  auto tok = load_tokenizer(stories_tok());
  EXPECT_EQ(tok->vocab_size(), 512);
  std::vector<std::string> texts = diverse_strings();
  std::ifstream frag(test::shared_dir() / "models" / "stories260K" / "ts_fragment.txt");
  for (std::string line; std::getline(frag, line) && texts.size() < 40;) texts.push_back(line.substr(0, 600));
  for (const std::string& t : texts) {
    if (t.empty()) continue;  // llama2.c never sees empty text with a BOS-only result difference
    EXPECT_EQ(tok->encode(t, true), ref_encode(ref, t)) << t;
  }
  std::vector<int32_t> once = tok->encode("Once upon a time", true);
  EXPECT_EQ(once.front(), 1);
  EXPECT_EQ(tok->decode(once), "Once upon a time");
}

TEST(TokStories, GoldenTextRoundTrips) {
  const fs::path golden = test::shared_dir() / "models" / "stories260K" / "greedy_once_upon_a_time_n64.txt";
  if (!fs::exists(golden) || !fs::exists(stories_tok())) GTEST_SKIP() << "stories260K files are absent";
  auto tok = load_tokenizer(stories_tok());
  const std::string text = read_text_file(golden);
  std::vector<int32_t> ids = tok->encode(text, true);
  EXPECT_EQ(tok->decode(ids), text);
  std::vector<int32_t> prompt = tok->encode("Once upon a time", false);
  ASSERT_GE(ids.size(), prompt.size() + 1);
  EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), ids.begin() + 1));
}

TEST(TokLlama2c, VocabLooksLikeSentencePiece) {
  if (!fs::exists(stories_tok())) GTEST_SKIP() << stories_tok() << " is absent";
  Vocab v = vocab_from_llama2c(stories_tok());
  EXPECT_EQ(v.model, "llama");
  EXPECT_EQ(v.tokens[0], "<unk>");
  EXPECT_EQ(v.tokens[1], "<s>");
  EXPECT_EQ(v.tokens[2], "</s>");
  EXPECT_EQ(v.tokens[3], "<0x00>");
  EXPECT_EQ(v.types[3], TokenType::Byte);
  EXPECT_EQ(v.types[1], TokenType::Control);
  EXPECT_EQ(v.bos_id, 1);
  EXPECT_EQ(v.eos_id, 2);
  EXPECT_EQ(v.unk_id, 0);
  for (const std::string& t : v.tokens) EXPECT_EQ(t.find(' '), std::string::npos) << t;
}

TEST(TokLlama2c, TruncatedFileIsAnError) {
  if (!fs::exists(stories_tok())) GTEST_SKIP() << stories_tok() << " is absent";
  const std::string full = read_text_file(stories_tok());
  test::TempDir dir;
  for (size_t cut : {size_t{1}, size_t{3}, size_t{6}, full.size() / 2}) {
    test::write_file(dir / "tok.bin", full.substr(0, full.size() - cut));
    EXPECT_QF_ERROR(vocab_from_llama2c(dir / "tok.bin"), ErrorKind::InvalidInput, "truncated");
  }
  test::write_file(dir / "tiny.bin", "ab");
  EXPECT_QF_ERROR(vocab_from_llama2c(dir / "tiny.bin"), ErrorKind::InvalidInput, "too short");
  std::string bad_len = full;
  int32_t huge = 100000;
  std::memcpy(bad_len.data() + 8, &huge, 4);  // token 0's length
  test::write_file(dir / "len.bin", bad_len);
  EXPECT_QF_ERROR(vocab_from_llama2c(dir / "len.bin"), ErrorKind::InvalidInput, "length");
}

// ---- fixture: tokenizer.json vs tokenizer.model ---------------------------------

TEST(TokFixture, JsonAndModelGiveIdenticalIds) {
  const fs::path eval = test::source_dir() / "tests" / "data" / "text" / "evaluation.txt";
  if (!fs::exists(fixture_dir() / "tokenizer.json") || !fs::exists(fixture_dir() / "tokenizer.model"))
    GTEST_SKIP() << fixture_dir() << " is absent";
  if (!fs::exists(eval)) GTEST_SKIP() << eval << " is absent";
  auto from_json = load_tokenizer(fixture_dir() / "tokenizer.json");
  auto from_model = load_tokenizer(fixture_dir() / "tokenizer.model");
  auto from_model_vocab = make_tokenizer(vocab_from_sentencepiece_model(fixture_dir() / "tokenizer.model"));
  EXPECT_EQ(from_json->vocab_size(), from_model->vocab_size());
  EXPECT_EQ(from_json->bos_id(), from_model->bos_id());
  EXPECT_EQ(from_json->eos_id(), from_model->eos_id());
  std::ifstream in(eval);
  size_t lines = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    std::vector<int32_t> want = from_model->encode(line, true);
    EXPECT_EQ(from_json->encode(line, true), want) << "line " << lines + 1 << ": " << line;
    EXPECT_EQ(from_model_vocab->encode(line, true), want) << "line " << lines + 1 << ": " << line;
    EXPECT_EQ(from_json->decode(want), line);
  }
  EXPECT_GT(lines, 0u);
}

// tokenizer.json -> Vocab -> GGUF tokenizer metadata -> Vocab: the GGUF copy encodes
// the evaluation text exactly as the Hugging Face original.
TEST(TokFixture, TokenizerJsonSurvivesGgufExport) {
  const fs::path eval = test::source_dir() / "tests" / "data" / "text" / "evaluation.txt";
  if (!fs::exists(fixture_dir() / "tokenizer.json") || !fs::exists(eval)) GTEST_SKIP() << fixture_dir() << " is absent";
  test::TempDir dir;
  Vocab original = vocab_from_tokenizer_json(fixture_dir() / "tokenizer.json");
  {
    GgufWriter w(dir / "vocab.gguf");
    write_tokenizer_metadata(w, original);
    w.finish();
  }
  auto from_json = make_tokenizer(original);
  auto from_gguf = load_tokenizer(dir / "vocab.gguf");
  EXPECT_EQ(from_gguf->vocab().tokens, original.tokens);
  std::ifstream in(eval);
  size_t lines = 0;
  for (std::string line; std::getline(in, line) && lines < 400; ++lines)
    ASSERT_EQ(from_gguf->encode(line, true), from_json->encode(line, true)) << "line " << lines + 1;
  EXPECT_EQ(lines, 400u);
}

TEST(TokFixture, FolderPrefersTokenizerJson) {
  if (!fs::exists(fixture_dir() / "tokenizer.json")) GTEST_SKIP() << fixture_dir() << " is absent";
  auto tok = load_tokenizer(fixture_dir());
  EXPECT_EQ(tok->vocab().model, "llama");
  EXPECT_TRUE(tok->add_bos_by_default());
  for (const std::string& s : diverse_strings()) EXPECT_EQ(tok->decode(tok->encode(s, true)), s) << s;
}

// ---- malformed tokenizer.json ----------------------------------------------------

struct BadJson {
  const char* name;
  std::string text;
  ErrorKind kind;
  const char* fragment;
};

// A ByteLevel pre-tokenizer inside `depth` Sequence nodes.
std::string nested_sequence(int depth) {
  std::string s = R"({"type": "ByteLevel"})";
  for (int i = 0; i < depth; ++i) s = R"({"type": "Sequence", "pretokenizers": [)" + s + "]}";
  return s;
}

TEST(TokJson, MalformedFilesGiveOneClearError) {
  const std::string merges_ok = R"("merges": ["a b"])";
  const std::string vocab_ok = R"("vocab": {"a": 0, "b": 1, "ab": 2})";
  const std::string byte_level = R"("pre_tokenizer": {"type": "ByteLevel"},)";
  const std::vector<BadJson> cases = {
      {"not json", "{ this is not json", ErrorKind::InvalidInput, "not valid JSON"},
      {"array", "[1, 2]", ErrorKind::InvalidInput, "not a JSON object"},
      {"no model", R"({"added_tokens": []})", ErrorKind::InvalidInput, "no \"model\""},
      {"unigram", R"({"model": {"type": "Unigram", "vocab": []}})", ErrorKind::Unsupported, "Unigram"},
      {"vocab array", "{" + byte_level + R"("model": {"type": "BPE", "vocab": [], )" + merges_ok + "}}", ErrorKind::InvalidInput,
       "model.vocab"},
      {"id not int", "{" + byte_level + R"("model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}})", ErrorKind::InvalidInput,
       "non-integer id"},
      {"duplicate id", "{" + byte_level + R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 0}, "merges": []}})",
       ErrorKind::InvalidInput, "already used"},
      {"negative id", "{" + byte_level + R"("model": {"type": "BPE", "vocab": {"a": -4}, "merges": []}})", ErrorKind::InvalidInput,
       "out of range"},
      {"gap", "{" + byte_level + R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 5}, "merges": []}})", ErrorKind::InvalidInput,
       "id 1 is missing"},
      {"unknown merge", "{" + byte_level + R"("model": {"type": "BPE", )" + vocab_ok + R"(, "merges": ["a zz"]}})",
       ErrorKind::InvalidInput, "'a zz' names a token"},
      {"bad merge", "{" + byte_level + R"("model": {"type": "BPE", )" + vocab_ok + R"(, "merges": ["ab"]}})", ErrorKind::InvalidInput,
       "not of the form"},
      {"merge object", "{" + byte_level + R"("model": {"type": "BPE", )" + vocab_ok + R"(, "merges": [{"x": 1}]}})",
       ErrorKind::InvalidInput, "neither"},
      {"added token clash", "{" + byte_level + R"("added_tokens": [{"id": 1, "content": "<s>", "special": true}], "model": {"type": "BPE", )" +
                                vocab_ok + "," + merges_ok + "}}",
       ErrorKind::InvalidInput, "already used by 'b'"},
      {"no pre-tokenizer", R"({"model": {"type": "BPE", )" + vocab_ok + "," + merges_ok + "}}", ErrorKind::Unsupported,
       "neither byte-level"},
      // Values of the wrong JSON type once escaped as nlohmann's type_error (an internal error).
      {"special not bool", "{" + byte_level + R"("added_tokens": [{"id": 3, "content": "<s>", "special": "yes"}], "model": {"type": "BPE", )" +
                               vocab_ok + "," + merges_ok + "}}",
       ErrorKind::InvalidInput, "unexpected JSON value"},
      {"SpecialToken not object", "{" + byte_level + R"("post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": 5}]}, "model": {"type": "BPE", )" +
                                      vocab_ok + "," + merges_ok + "}}",
       ErrorKind::InvalidInput, "unexpected JSON value"},
      {"type not string", R"({"model": {"type": 7, )" + vocab_ok + "," + merges_ok + "}}", ErrorKind::InvalidInput,
       "unexpected JSON value"},
      {"deep Sequence", "{\"pre_tokenizer\": " + nested_sequence(20) + R"(, "model": {"type": "BPE", )" + vocab_ok + "," + merges_ok + "}}",
       ErrorKind::InvalidInput, "Sequence nodes are nested more than 16 levels deep"},
  };
  test::TempDir dir;
  for (const BadJson& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path p = dir / (std::string(c.name) + ".json");
    test::write_file(p, c.text);
    EXPECT_QF_ERROR(vocab_from_tokenizer_json(p), c.kind, c.fragment);
    EXPECT_QF_ERROR(vocab_from_tokenizer_json(p), c.kind, p.string());
  }
}

// A byte-level tokenizer.json in miniature: "Ġ" is GPT-2's byte 0x20.
std::string mini_byte_level(const std::string& pre_tokenizer, const std::string& merges) {
  return R"({"added_tokens": [{"id": 6, "content": "<|end|>", "special": true}],
    "pre_tokenizer": )" + pre_tokenizer + R"(,
    "post_processor": null,
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "Ġ": 2, "ab": 3, "Ġab": 4, "c": 5}, "merges": )" + merges + "}}";
}

TEST(TokJson, ByteLevelPreTokenizersAreNamedOrKeptAsRegex) {
  test::TempDir dir;
  test::write_file(dir / "gpt2.json", mini_byte_level(R"({"type": "ByteLevel", "add_prefix_space": false})", R"(["a b", "Ġ ab"])"));
  Vocab v = vocab_from_tokenizer_json(dir / "gpt2.json");
  EXPECT_EQ(v.model, "gpt2");
  EXPECT_EQ(v.pre, "gpt-2");
  EXPECT_EQ(v.types[6], TokenType::Control);
  auto tok = make_tokenizer(v);
  EXPECT_EQ(tok->encode("ab ab<|end|>c", false), (std::vector<int32_t>{3, 4, 6, 5}));
  EXPECT_EQ(tok->decode({3, 4, 5}), "ab abc");

  const std::string llama3 =
      R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "use_regex": false}]})";
  test::write_file(dir / "llama3.json", mini_byte_level(llama3, R"([["a", "b"], ["Ġ", "ab"]])"));
  EXPECT_EQ(vocab_from_tokenizer_json(dir / "llama3.json").pre, "llama3");

  const std::string custom =
      R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "[a-c]"}, "behavior": "Isolated"}, {"type": "ByteLevel", "use_regex": false}]})";
  test::write_file(dir / "custom.json", mini_byte_level(custom, R"(["a b"])"));
  Vocab c = vocab_from_tokenizer_json(dir / "custom.json");
  EXPECT_EQ(c.pre, R"(regex:["[a-c]"])");
  EXPECT_EQ(make_tokenizer(c)->encode("abc", false), (std::vector<int32_t>{0, 1, 5}));  // the regex isolates every letter

  // A regex that matches empty at the end of a piece ("$") stops there
  // (it stepped one character past the end before).
  const std::string at_end =
      R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "$|b"}, "behavior": "Isolated"}, {"type": "ByteLevel", "use_regex": false}]})";
  test::write_file(dir / "end.json", mini_byte_level(at_end, R"(["a b"])"));
  EXPECT_EQ(make_tokenizer(vocab_from_tokenizer_json(dir / "end.json"))->encode("abab", false), (std::vector<int32_t>{0, 1, 0, 1}));
}

// ---- vocabulary validation and synthetic vocabularies ------------------------------

Vocab tiny_spm() {
  Vocab v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "ab", "ba", "\xE2\x96\x81" "a", "<|x|>"};
  v.scores = {0, 0, 0, -1, -1, -1, -2, -2, -3, 0};
  v.types = {TokenType::Unknown, TokenType::Control, TokenType::Control, TokenType::Normal, TokenType::Normal, TokenType::Normal,
             TokenType::Normal,  TokenType::Normal,  TokenType::Normal,  TokenType::Control};
  v.unk_id = 0;
  v.bos_id = 1;
  v.eos_id = 2;
  v.add_bos = true;
  v.byte_fallback = false;
  return v;
}

TEST(TokVocab, SpmMergesLeftmostOnTiesAndSplitsSpecialTokens) {
  auto tok = make_tokenizer(tiny_spm());
  // "▁aba": "▁a" (-3) loses to "ab" / "ba" (-2, a tie): the leftmost pair "ab" merges.
  EXPECT_EQ(tok->encode("aba", false), (std::vector<int32_t>{3, 6, 4}));
  // The dummy prefix applies at the start and after a special token.
  EXPECT_EQ(tok->encode("a<|x|>b", true), (std::vector<int32_t>{1, 8, 9, 3, 5}));
  // No byte fallback here: an unknown character becomes <unk>.
  EXPECT_EQ(tok->encode("c", false), (std::vector<int32_t>{3, 0}));
  EXPECT_EQ(tok->decode({1, 8, 9, 3, 5}), "a<|x|> b");
  EXPECT_EQ(tok->encode("", true), (std::vector<int32_t>{1}));
}

TEST(TokVocab, InvalidUtf8BytesAreCharactersOfTheirOwn) {
  Vocab v = tiny_spm();
  v.byte_fallback = true;
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    v.tokens.push_back(buf);
    v.scores.push_back(0);
    v.types.push_back(TokenType::Byte);
  }
  auto tok = make_tokenizer(v);
  const int32_t byte0 = 10;  // <0x00>
  // 0xE9 announces a 3-byte character but "ab" follows: it is one byte on its
  // own, and "ab" still merges (it was swallowed into one 3-byte symbol before).
  EXPECT_EQ(tok->encode("\xE9" "ab", false), (std::vector<int32_t>{3, byte0 + 0xE9, 6}));
}

TEST(TokVocab, ValidationRejectsInconsistentVocabularies) {
  Vocab v = tiny_spm();
  v.model = "wordpiece";
  EXPECT_QF_ERROR(make_tokenizer(v), ErrorKind::Unsupported, "wordpiece");
  v = tiny_spm();
  v.bos_id = 99;
  EXPECT_QF_ERROR(make_tokenizer(v), ErrorKind::InvalidInput, "BOS id 99");
  v = tiny_spm();
  v.scores.pop_back();
  EXPECT_QF_ERROR(make_tokenizer(v), ErrorKind::InvalidInput, "scores");
  v = tiny_spm();
  v.model = "gpt2";
  v.merges = {"a b"};
  v.pre = "no-such-pre";
  EXPECT_QF_ERROR(make_tokenizer(v), ErrorKind::Unsupported, "'no-such-pre'");
  EXPECT_QF_ERROR(make_tokenizer(v), ErrorKind::Unsupported, "llama3");
  v.pre = "gpt-2";
  v.merges = {"a zz"};
  EXPECT_QF_ERROR(make_tokenizer(v), ErrorKind::InvalidInput, "'a zz'");
  v.merges = {"a b"};
  EXPECT_NO_THROW(make_tokenizer(v));
  auto tok = make_tokenizer(tiny_spm());
  EXPECT_QF_ERROR(tok->piece(10), ErrorKind::InvalidInput, "out of range");
  EXPECT_QF_ERROR(tok->decode({-1}), ErrorKind::InvalidInput, "out of range");
}

TEST(TokLoad, MissingPathsAreNotFound) {
  test::TempDir dir;
  EXPECT_QF_ERROR(load_tokenizer(dir / "nope.gguf"), ErrorKind::NotFound, "nope.gguf");
  EXPECT_QF_ERROR(load_tokenizer(dir.path()), ErrorKind::NotFound, "no tokenizer.json or tokenizer.model");
  test::write_file(dir / "broken.model", "not a protobuf");
  EXPECT_QF_ERROR(load_tokenizer(dir / "broken.model"), ErrorKind::InvalidInput, "broken.model");
  // Found by fuzz_sentencepiece (tests/fuzz/corpus/sentencepiece/crash-nul-piece.model): a
  // piece starting with a NUL byte makes libsentencepiece's trie builder throw
  // its own exception, which escaped as an internal error.
  test::write_file(dir / "nul.model", std::string("\x0a\x0e\x15\x00\x00\x00\x00\x18\x02\x0a\x05\x0a\x03\xc8\x18\x01"
                                                  "\x0a\x0b\x0a\x02\x00\x01\x98\x18\x01\x20\x00\x28\x01", 29));
  EXPECT_QF_ERROR(load_tokenizer(dir / "nul.model"), ErrorKind::InvalidInput, "nul.model: not a valid SentencePiece model");
}

// ---- round trips over every real vocabulary available ------------------------------

TEST(TokRoundTrip, DecodeInvertsEncode) {
  std::vector<fs::path> sources = {stories_tok(), fixture_dir() / "tokenizer.json", fixture_dir() / "tokenizer.model"};
  const fs::path vec = test::shared_dir() / "data" / "tokenizer-vectors";
  if (fs::is_directory(vec))
    for (const auto& e : fs::directory_iterator(vec))
      if (e.path().extension() == ".gguf") sources.push_back(e.path());
  size_t tried = 0;
  for (const fs::path& p : sources) {
    if (!fs::exists(p)) continue;
    SCOPED_TRACE(p.filename().string());
    std::unique_ptr<Tokenizer> tok;
    try {
      tok = load_tokenizer(p);
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
      continue;
    }
    ++tried;
    for (const std::string& s : diverse_strings()) EXPECT_EQ(tok->decode(tok->encode(s, true)), s) << s;
  }
  if (tried == 0) GTEST_SKIP() << "no tokenizer files are available";
}

}  // namespace
}  // namespace qf
