#include <cstring>
#include <iostream>
#include <random>

#include "formats/gguf/gguf.h"
#include "core/io.h"
#include "inspect/gguf_inspect.h"
#include "formats/gguf/gguf_writer.h"
#include "test_util.h"

namespace qf {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

// Hand assembly of GGUF bytes, for the byte-level and malformed-file tests.
struct Raw {
  std::string b;
  Raw& u8(uint8_t v) { b.push_back(static_cast<char>(v)); return *this; }
  Raw& u32(uint32_t v) { for (int k = 0; k < 4; ++k) u8(static_cast<uint8_t>(v >> (8 * k))); return *this; }
  Raw& u64(uint64_t v) { for (int k = 0; k < 8; ++k) u8(static_cast<uint8_t>(v >> (8 * k))); return *this; }
  Raw& str(const std::string& s) { u64(s.size()); b += s; return *this; }
  Raw& header(uint64_t tensors, uint64_t kvs, uint32_t version = 3) { u32(kGgufMagic).u32(version).u64(tensors).u64(kvs); return *this; }
  Raw& kv_u32(const std::string& k, uint32_t v) { str(k).u32(4).u32(v); return *this; }
  Raw& tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) u64(d);
    u32(type).u64(offset);
    return *this;
  }
  Raw& pad(size_t align = 32) { b.resize((b.size() + align - 1) / align * align, '\0'); return *this; }
  Raw& zeros(size_t n) { b.append(n, '\0'); return *this; }
};

fs::path write_raw(const TempDir& dir, const std::string& name, const std::string& bytes) {
  fs::path p = dir / name;
  test::write_file(p, bytes);
  return p;
}

// ---- writer -> reader round trips --------------------------------------------------

TEST(Gguf, RoundTripsEveryValueType) {
  TempDir dir;
  GgufWriter w(dir / "kv.gguf");
  w.add_u8("u8", 200);
  w.add_i8("i8", -100);
  w.add_u16("u16", 60000);
  w.add_i16("i16", -30000);
  w.add_u32("u32", 4000000000u);
  w.add_i32("i32", -2000000000);
  w.add_u64("u64", 1ull << 60);
  w.add_i64("i64", -(1ll << 60));
  w.add_f32("f32", 1.5f);
  w.add_f64("f64", -2.25);
  w.add_bool("t", true);
  w.add_bool("f", false);
  w.add_string("s", std::string("h\0llo", 5));
  w.add_string("empty", "");
  w.add_string_array("sa", {"a", "", "ccc"});
  w.add_f32_array("fa", {0.5f, -1.0f});
  w.add_i32_array("ia", {-1, 7});
  w.add_u32_array("ua", {4000000000u});
  w.add_i64_array("la", {-(1ll << 40)});
  w.add_bool_array("ba", {true, false});
  std::vector<double> doubles = {1.0, 2.5};
  w.add_raw_array("da", GgufType::F64, 2, doubles.data());
  w.add_string_array("none", {});
  w.finish();

  GgufFile f = GgufFile::open(dir / "kv.gguf");
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.keys().size(), 22u);
  EXPECT_EQ(f.keys().front(), "u8");
  EXPECT_EQ(f.value("u8").type, GgufType::U8);
  EXPECT_EQ(f.get_u32("u8"), 200u);
  EXPECT_EQ(f.get_i64("i8"), -100);
  EXPECT_EQ(f.get_u32("u16"), 60000u);
  EXPECT_EQ(f.get_i64("i16"), -30000);
  EXPECT_EQ(f.get_u32("u32"), 4000000000u);
  EXPECT_EQ(f.get_i64("i32"), -2000000000);
  EXPECT_EQ(f.get_i64("u64"), 1ll << 60);
  EXPECT_EQ(f.value("u64").type, GgufType::U64);
  EXPECT_EQ(f.get_i64("i64"), -(1ll << 60));
  EXPECT_EQ(f.get_f32("f32"), 1.5f);
  EXPECT_EQ(f.value("f64").f, -2.25);
  EXPECT_TRUE(f.get_bool("t"));
  EXPECT_FALSE(f.get_bool("f"));
  EXPECT_EQ(f.get_string("s"), std::string("h\0llo", 5));
  EXPECT_EQ(f.get_string("empty"), "");
  EXPECT_EQ(f.get_string_array("sa"), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(f.get_float_array("fa"), (std::vector<float>{0.5f, -1.0f}));
  EXPECT_EQ(f.get_int_array("ia"), (std::vector<int64_t>{-1, 7}));
  EXPECT_EQ(f.get_int_array("ua"), (std::vector<int64_t>{4000000000ll}));
  EXPECT_EQ(f.get_int_array("la"), (std::vector<int64_t>{-(1ll << 40)}));
  EXPECT_EQ(f.value("ba").elem_type, GgufType::Bool);
  EXPECT_EQ(f.get_array_size("ba"), 2u);
  EXPECT_EQ(f.get_float_array("da"), (std::vector<float>{1.0f, 2.5f}));
  EXPECT_TRUE(f.get_string_array("none").empty());
  EXPECT_TRUE(f.tensors().empty());
}

TEST(Gguf, TypedGettersNameKeyAndTypes) {
  TempDir dir;
  GgufWriter w(dir / "kv.gguf");
  w.add_string("name", "x");
  w.add_i32("neg", -1);
  w.add_f32_array("fa", {1.0f});
  w.finish();
  GgufFile f = GgufFile::open(dir / "kv.gguf");
  EXPECT_QF_ERROR(f.get_u32("name"), ErrorKind::InvalidInput, "'name': expected UINT32, got STRING");
  EXPECT_QF_ERROR(f.get_u32("neg"), ErrorKind::InvalidInput, "'neg': value -1 does not fit in UINT32");
  EXPECT_QF_ERROR(f.get_bool("neg"), ErrorKind::InvalidInput, "'neg': expected BOOL, got INT32");
  EXPECT_QF_ERROR(f.get_string_array("fa"), ErrorKind::InvalidInput, "expected ARRAY of STRING, got ARRAY of FLOAT32");
  EXPECT_QF_ERROR(f.get_int_array("name"), ErrorKind::InvalidInput, "expected ARRAY of integers, got STRING");
  EXPECT_QF_ERROR(f.get_string("missing"), ErrorKind::NotFound, "no metadata key 'missing'");
  EXPECT_QF_ERROR(f.tensor_data("nope"), ErrorKind::NotFound, "no tensor 'nope'");
}

TEST(Gguf, RoundTripsTensors) {
  TempDir dir;
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::string q4(2 * 2 * 18, '\0'), q4k(144, '\0'), bf(2 * 3, '\0');
  for (size_t i = 0; i < q4.size(); ++i) q4[i] = static_cast<char>(i);
  for (size_t i = 0; i < q4k.size(); ++i) q4k[i] = static_cast<char>(255 - i);
  GgufWriter w(dir / "t.gguf");
  w.add_string("general.architecture", "llama");
  w.add_tensor("a", ggml_type::F32, {3, 2}, a.data(), a.size() * 4);
  w.declare_tensor("q4", ggml_type::Q4_0, {64, 2});
  w.add_tensor("bf", ggml_type::BF16, {3}, bf.data(), bf.size());
  w.declare_tensor("q4k", ggml_type::Q4_K, {256});
  w.write_tensor_data("q4", q4.data(), q4.size());
  EXPECT_QF_ERROR(w.write_tensor_data("a", a.data(), 24), ErrorKind::InvalidInput, "out of order");
  w.write_tensor_data("q4k", q4k.data(), q4k.size());
  w.finish();

  GgufFile f = GgufFile::open(dir / "t.gguf");
  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  const GgufTensorInfo* t = f.find_tensor("a");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dims, (std::vector<uint64_t>{3, 2}));
  EXPECT_EQ(t->nbytes, 24u);
  EXPECT_EQ(std::memcmp(f.tensor_data("a"), a.data(), 24), 0);
  t = f.find_tensor("q4");
  EXPECT_EQ(t->type, ggml_type::Q4_0);
  EXPECT_EQ(t->nbytes, q4.size());
  EXPECT_EQ(t->offset, 32u);  // after 24 bytes of "a" padded to 32
  EXPECT_EQ(std::memcmp(f.tensor_data("q4"), q4.data(), q4.size()), 0);
  EXPECT_EQ(f.find_tensor("bf")->numel(), 3u);
  EXPECT_EQ(std::memcmp(f.tensor_data("q4k"), q4k.data(), q4k.size()), 0);
  for (const auto& ti : f.tensors()) EXPECT_EQ(ti.offset % 32, 0u) << ti.name;
  // The file ends with the last tensor's padding.
  EXPECT_EQ(f.mapping()->size(), f.data_offset() + f.find_tensor("q4k")->offset + 160);
}

TEST(Gguf, TypeTable) {
  struct Want { uint32_t id; uint32_t block, bytes; };
  for (Want w : {Want{0, 1, 4}, {1, 1, 2}, {2, 32, 18}, {3, 32, 20}, {6, 32, 22}, {7, 32, 24}, {8, 32, 34}, {9, 32, 36},
                 {10, 256, 84}, {11, 256, 110}, {12, 256, 144}, {13, 256, 176}, {14, 256, 210}, {15, 256, 292},
                 {24, 1, 1}, {25, 1, 2}, {26, 1, 4}, {27, 1, 8}, {28, 1, 8}, {30, 1, 2}}) {
    const GgmlTypeInfo* t = ggml_type_info(w.id);
    ASSERT_NE(t, nullptr) << w.id;
    EXPECT_EQ(t->block_size, w.block) << t->name;
    EXPECT_EQ(t->type_size, w.bytes) << t->name;
  }
  EXPECT_EQ(ggml_type_info(4), nullptr);  // Q4_2, removed from ggml
  EXPECT_EQ(ggml_type_info(1000), nullptr);
}

TEST(Gguf, WriterMatchesHandBuiltBytes) {
  TempDir dir;
  GgufWriter w(dir / "tiny.gguf");
  w.add_u32("n", 7);
  w.add_string_array("v", {"ab"});
  float one = 1.0f;
  w.add_tensor("t", ggml_type::F32, {1}, &one, 4);
  w.finish();
  Raw want;
  want.header(1, 2).kv_u32("n", 7);
  want.str("v").u32(9).u32(8).u64(1).str("ab");
  want.tensor("t", {1}, 0, 0).pad();
  want.u32(0x3f800000).pad();
  EXPECT_EQ(read_text_file(dir / "tiny.gguf"), want.b);
}

TEST(Gguf, FailedWriteLeavesNothing) {
  TempDir dir;
  {
    GgufWriter w(dir / "out.gguf");
    w.add_u32("n", 1);
    w.declare_tensor("t", ggml_type::F32, {4});
    EXPECT_QF_ERROR(w.finish(), ErrorKind::InvalidInput, "declared but never written");
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
  GgufWriter w(dir / "out.gguf");
  w.add_u32("n", 1);
  EXPECT_QF_ERROR(w.add_u32("n", 2), ErrorKind::InvalidInput, "duplicate metadata key 'n'");
  EXPECT_QF_ERROR(w.add_tensor("t", ggml_type::F32, {4}, "abc", 3), ErrorKind::InvalidInput, "need 16");
  EXPECT_QF_ERROR(w.declare_tensor("q", ggml_type::Q8_0, {33}), ErrorKind::InvalidInput, "block size");
  EXPECT_QF_ERROR(w.declare_tensor("u", 99, {4}), ErrorKind::Unsupported, "unknown ggml type 99");
}

TEST(Gguf, AcceptsVersion2AndCustomAlignment) {
  TempDir dir;
  Raw r;
  r.header(1, 1, 2).kv_u32("general.alignment", 64).tensor("t", {2}, 1, 64).pad(64).zeros(64 + 4);
  GgufFile f = GgufFile::open(write_raw(dir, "v2.gguf", r.b));
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.tensors()[0].nbytes, 4u);
}

TEST(Gguf, VocabOnlyFileWithoutPaddingIsValid) {
  TempDir dir;
  Raw r;
  r.header(0, 1).kv_u32("x", 1);  // ends right after the metadata, like llama.cpp's vocab files
  GgufFile f = GgufFile::open(write_raw(dir, "vocab.gguf", r.b));
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_EQ(f.get_u32("x"), 1u);
}

// ---- malformed files ----------------------------------------------------------------

struct BadCase {
  const char* name;
  std::string bytes;
  ErrorKind kind;
  const char* fragment;
};

std::vector<BadCase> bad_cases() {
  const uint64_t huge = 1ull << 60;
  std::vector<BadCase> cases;
  auto add = [&](const char* name, const Raw& r, ErrorKind kind, const char* fragment) {
    cases.push_back({name, r.b, kind, fragment});
  };
  const auto bad = ErrorKind::InvalidInput;
  add("empty", Raw{}, bad, "empty");
  add("bad-magic", Raw{}.u32(0x46554746).u32(3).u64(0).u64(0), bad, "bad magic");
  add("version-1", Raw{}.header(0, 0, 1), ErrorKind::Unsupported, "version 1 is not supported");
  add("version-4", Raw{}.header(0, 0, 4), ErrorKind::Unsupported, "version 4");
  add("truncated-header", Raw{}.u32(kGgufMagic).u32(3).u32(0), bad, "truncated: tensor count");
  add("kv-count-huge", Raw{}.header(0, huge), bad, "metadata count 1152921504606846976 cannot fit");
  add("tensor-count-huge", Raw{}.header(huge, 0), bad, "tensor count");
  add("key-past-eof", Raw{}.header(0, 1).u64(1000).zeros(20), bad, "truncated: key of metadata entry 0");
  add("key-over-1gib", Raw{}.header(0, 1).u64(2ull << 30).zeros(20), bad, "exceeds the 1 GiB limit");
  add("string-past-eof", Raw{}.header(0, 1).str("k").u32(8).u64(500).zeros(10), bad, "truncated: metadata 'k'");
  add("array-count-huge", Raw{}.header(0, 1).str("k").u32(9).u32(4).u64(huge).zeros(16), bad, "metadata 'k' count");
  add("string-array-count-huge", Raw{}.header(0, 1).str("k").u32(9).u32(8).u64(huge).zeros(16), bad, "metadata 'k' count");
  add("array-element-past-eof", Raw{}.header(0, 1).str("k").u32(9).u32(8).u64(2).str("ab").u64(9), bad, "element 1");
  add("unknown-value-type", Raw{}.header(0, 1).str("k").u32(13).u32(0), bad, "metadata 'k' has unknown value type 13");
  add("unknown-element-type", Raw{}.header(0, 1).str("k").u32(9).u32(77).u64(0), bad, "unknown value type 77");
  add("nested-array", Raw{}.header(0, 1).str("k").u32(9).u32(9).u64(0), ErrorKind::Unsupported, "array of arrays");
  add("bool-not-0-or-1", Raw{}.header(0, 1).str("k").u32(7).u8(2), bad, "must be 0 or 1");
  add("duplicate-key", Raw{}.header(0, 2).kv_u32("k", 1).kv_u32("k", 2), bad, "duplicate metadata key 'k'");
  add("alignment-zero", Raw{}.header(0, 1).kv_u32("general.alignment", 0), bad, "not a nonzero power of two");
  add("alignment-48", Raw{}.header(0, 1).kv_u32("general.alignment", 48), bad, "general.alignment 48");
  add("alignment-string", Raw{}.header(0, 1).str("general.alignment").u32(8).str("32"), bad, "must be UINT32");
  add("five-dims", Raw{}.header(1, 0).tensor("t", {1, 1, 1, 1, 1}, 0, 0).pad().zeros(32), bad, "tensor 't' has 5 dims");
  add("zero-dims", Raw{}.header(1, 0).tensor("t", {}, 0, 0).u64(0).pad().zeros(32), bad, "has 0 dims");
  add("dim-zero", Raw{}.header(1, 0).tensor("t", {4, 0}, 0, 0).pad().zeros(32), bad, "invalid dims");
  add("dims-overflow", Raw{}.header(1, 0).tensor("t", {1ull << 40, 1ull << 40}, 0, 0).pad().zeros(32), bad, "invalid dims");
  add("bytes-overflow", Raw{}.header(1, 0).tensor("t", {1ull << 31, 1ull << 31}, 28, 0).pad().zeros(32), bad, "overflows");
  add("offset-unaligned", Raw{}.header(1, 0).tensor("t", {1}, 0, 4).pad().zeros(32), bad, "offset 4 is not a multiple");
  add("data-past-eof", Raw{}.header(1, 0).tensor("t", {16}, 0, 0).pad().zeros(32), bad, "runs past the end");
  add("offset-past-eof", Raw{}.header(1, 0).tensor("t", {1}, 0, 1ull << 62).pad().zeros(32), bad, "runs past the end");
  add("overlap", Raw{}.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {4}, 0, 32).pad().zeros(64), bad,
      "tensor 'b' at offset 32 overlaps tensor 'a'");
  add("unknown-ggml-type", Raw{}.header(1, 0).tensor("w", {32}, 4, 0).pad().zeros(32), ErrorKind::Unsupported,
      "tensor 'w' has unknown ggml type 4");
  add("row-not-block-multiple", Raw{}.header(1, 0).tensor("q", {33}, 2, 0).pad().zeros(64), bad,
      "row length 33 is not a multiple of the q4_0 block size 32");
  add("duplicate-tensor", Raw{}.header(2, 0).tensor("t", {1}, 0, 0).tensor("t", {1}, 0, 32).pad().zeros(64), bad,
      "duplicate tensor name 't'");
  add("truncated-tensor-info", Raw{}.header(1, 0).str(std::string(20, 't')).u32(2).u64(4), bad, "dims needs 8 bytes");
  return cases;
}

TEST(Gguf, RejectsMalformedFiles) {
  TempDir dir;
  std::vector<BadCase> cases = bad_cases();
  ASSERT_GE(cases.size(), 15u);
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    fs::path p = write_raw(dir, std::string(c.name) + ".gguf", c.bytes);
    EXPECT_QF_ERROR(GgufFile::open(p), c.kind, c.fragment);
    EXPECT_QF_ERROR(GgufFile::open(p), c.kind, p.string() + ": ");
  }
}

// ---- fuzz ----------------------------------------------------------------------------

std::string small_valid_file(const TempDir& dir) {
  GgufWriter w(dir / "seed.gguf");
  w.add_string("general.architecture", "llama");
  w.add_u32("general.alignment", 32);
  w.add_string_array("tokenizer.ggml.tokens", {"<s>", "a", "bc"});
  w.add_f32_array("tokenizer.ggml.scores", {0, -1, -2});
  w.add_i32_array("tokenizer.ggml.token_type", {3, 1, 1});
  w.add_bool("b", true);
  std::vector<float> a(8, 1.0f);
  std::string q(18, '\x11');
  w.add_tensor("a", ggml_type::F32, {4, 2}, a.data(), 32);
  w.add_tensor("q", ggml_type::Q4_0, {32}, q.data(), q.size());
  w.finish();
  return read_text_file(dir / "seed.gguf");
}

// Touches everything a parsed file exposes, so that ASan sees any bad pointer.
uint64_t exercise(const GgufFile& f) {
  uint64_t sum = 0;
  for (const auto& k : f.keys()) {
    const GgufValue& v = f.value(k);
    try {
      if (v.type == GgufType::Array) {
        if (v.elem_type == GgufType::String) for (const auto& s : f.get_string_array(k)) sum += s.size();
        else if (v.elem_type == GgufType::F32 || v.elem_type == GgufType::F64) sum += f.get_float_array(k).size();
        else sum += f.get_int_array(k).size();
      } else if (v.type == GgufType::String) {
        sum += f.get_string(k).size();
      }
    } catch (const Error&) {
    }
  }
  for (const auto& t : f.tensors()) {
    const uint8_t* p = f.tensor_data(t);
    for (uint64_t i = 0; i < t.nbytes; ++i) sum += p[i];
  }
  return sum;
}

// inspect describes malformed files too: keys of the wrong type are shown as
// written (the report once read them as integers and threw a JSON type_error).
TEST(Gguf, InspectShowsKeysOfTheWrongType) {
  TempDir t;
  {
    GgufWriter w(t.path() / "odd.gguf");
    w.add_string("general.architecture", "llama");
    w.add_string("llama.block_count", "four");
    w.add_f32("llama.embedding_length", 4096.5f);
    w.add_string("general.file_type", "Q4_K_M");
    w.finish();
  }
  const nlohmann::json info = inspect_gguf(t.path() / "odd.gguf");
  EXPECT_EQ(info["architecture"], "llama");
  EXPECT_FALSE(info.contains("file_type"));
  const std::string report = format_gguf_report(info);
  EXPECT_NE(report.find("hidden -1, layers -1"), std::string::npos) << report;
  EXPECT_NE(report.find("llama.block_count = \"four\""), std::string::npos) << report;
  {
    GgufWriter w(t.path() / "arch.gguf");
    w.add_u32("general.architecture", 7);
    w.finish();
  }
  EXPECT_EQ(inspect_gguf(t.path() / "arch.gguf")["architecture"], "");
}

TEST(Gguf, SurvivesRandomMutations) {
  TempDir dir;
  const std::string seed = small_valid_file(dir);
  ASSERT_NO_THROW(exercise(GgufFile::open(dir / "seed.gguf")));
  std::mt19937_64 rng(12345);
  int parsed = 0, rejected = 0;
  const fs::path p = dir / "fuzz.gguf";
  for (int iter = 0; iter < 2000; ++iter) {
    std::string b = seed;
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations; ++m) {
      size_t at = rng() % b.size();
      switch (rng() % 4) {
        case 0: b[at] = static_cast<char>(rng()); break;                 // random byte
        case 1: b[at] = static_cast<char>(b[at] ^ (1 << (rng() % 8))); break;  // bit flip
        case 2: b[at] = static_cast<char>(0xff); break;                   // saturate (huge counts)
        default: b.resize(at); break;                                     // truncate
      }
      if (b.empty()) break;
    }
    test::write_file(p, b);
    try {
      exercise(GgufFile::open(p));
      ++parsed;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
  std::cout << "[ fuzz     ] 2000 mutations: " << parsed << " parsed, " << rejected << " rejected with qf::Error\n";
}

}  // namespace
}  // namespace qf
