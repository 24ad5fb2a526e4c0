#include "formats/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"

namespace qf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A fresh folder per test, removed afterwards.
struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path = fs::temp_directory_path() /
           ("qf_safetensors_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + "_" + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::vector<std::string> listing() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// length prefix + header + data, the header used exactly as given.
std::string raw_file(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << p;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string bytes_of(const Tensor& t) { return std::string(static_cast<const char*>(t.data()), t.nbytes()); }

// An owned tensor filled with a pattern that differs per seed.
Tensor pattern(DType dtype, Shape shape, int seed) {
  Tensor t = Tensor::zeros(dtype, std::move(shape));
  auto* p = static_cast<uint8_t*>(t.mutable_data());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(i * 31 + static_cast<size_t>(seed) * 7 + 1);
  return t;
}

// ---- round trips -------------------------------------------------------------

TEST(Safetensors, RoundTripSingleFile) {
  TempDir dir;
  std::map<std::string, Tensor> in = {
      {"embed.weight", pattern(DType::F16, {4, 8}, 1)},  {"norm.weight", pattern(DType::BF16, {8}, 2)},
      {"lm_head.weight", pattern(DType::F32, {3, 8}, 3)}, {"q.scale", pattern(DType::F8_E4M3, {5}, 4)},
      {"ids", pattern(DType::I64, {2, 3}, 5)},            {"scalar", pattern(DType::I32, {}, 6)},
      {"empty", pattern(DType::F32, {0, 3}, 7)},          {"mask", pattern(DType::U8, {7}, 8)},
  };
  std::vector<std::string> order = {"embed.weight", "norm.weight", "empty", "lm_head.weight", "q.scale", "ids", "scalar", "mask"};
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"quantforge", "0.1"}};
  {
    SafetensorsWriter w(dir.path, "model");
    w.set_metadata(meta);
    for (const auto& name : order) w.add(name, in.at(name));
    auto written = w.finish();
    ASSERT_EQ(written.size(), 1u);
    EXPECT_EQ(written[0], dir.path / "model.safetensors");
  }
  EXPECT_EQ(dir.listing(), std::vector<std::string>{"model.safetensors"});

  SafetensorsFile f = SafetensorsFile::open(dir.path / "model.safetensors");
  EXPECT_EQ(f.metadata(), meta);
  ASSERT_EQ(f.tensors().size(), order.size());
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(f.tensors()[i].name, order[i]) << "tensors() keeps data order";
  EXPECT_EQ((8 + f.header_size()) % 8, 0u);
  for (const auto& [name, t] : in) {
    Tensor v = f.tensor(name);
    EXPECT_EQ(v.dtype(), t.dtype()) << name;
    EXPECT_EQ(v.shape(), t.shape()) << name;
    EXPECT_EQ(bytes_of(v), bytes_of(t)) << name;
    EXPECT_EQ(f.find(name)->file, dir.path / "model.safetensors");
  }
  EXPECT_EQ(f.find("nope"), nullptr);
  try {
    f.tensor("nope");
    FAIL() << "expected NotFound";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NotFound);
    EXPECT_NE(std::string(e.what()).find("'nope'"), std::string::npos);
  }
}

TEST(Safetensors, ViewsAreZeroCopyIntoTheMapping) {
  TempDir dir;
  {
    SafetensorsWriter w(dir.path);
    w.add("a", pattern(DType::F32, {16}, 1));
    w.add("b", pattern(DType::F16, {3, 5}, 2));
    w.add("c", pattern(DType::U8, {9}, 3));
    w.finish();
  }
  Tensor keep;
  {
    SafetensorsFile f = SafetensorsFile::open(dir.path / "model.safetensors");
    // All views sit at (mapping base + 8 + N + begin), and mmap bases are page aligned.
    const auto* base = static_cast<const uint8_t*>(f.tensor("a").data()) - 8 - f.header_size() - f.find("a")->begin;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(base) % static_cast<uintptr_t>(sysconf(_SC_PAGESIZE)), 0u);
    for (const auto& t : f.tensors()) {
      EXPECT_EQ(f.tensor(t.name).data(), base + 8 + f.header_size() + t.begin) << t.name;
      EXPECT_EQ(f.tensor(t.name).data(), f.tensor(t.name).data()) << "no copy per call";
    }
    std::string file = read_bytes(dir.path / "model.safetensors");
    EXPECT_EQ(std::memcmp(base, file.data(), file.size()), 0);
    keep = f.tensor("b");
  }
  // The view keeps the mapping alive after the file object is gone.
  EXPECT_EQ(bytes_of(keep), bytes_of(pattern(DType::F16, {3, 5}, 2)));
}

TEST(Safetensors, RoundTripSharded) {
  TempDir dir;
  std::vector<std::pair<std::string, Tensor>> in = {
      {"layers.0.w", pattern(DType::F32, {10}, 1)},  // 40 bytes
      {"layers.0.b", pattern(DType::F32, {10}, 2)},  // 40 -> 80 (fits in 100)
      {"layers.1.w", pattern(DType::F32, {10}, 3)},  // 120 > 100: new shard
      {"big", pattern(DType::F32, {40}, 4)},         // 160 alone: a shard of its own
      {"tail", pattern(DType::F16, {2}, 5)},         // after an oversized shard: new shard
      {"tail.empty", pattern(DType::F16, {0}, 6)},
  };
  std::map<std::string, std::string> meta = {{"format", "pt"}};
  std::vector<fs::path> written;
  {
    SafetensorsWriter w(dir.path, "model", 100);
    w.set_metadata(meta);
    for (const auto& [name, t] : in) w.add(name, t);
    written = w.finish();
  }
  std::vector<fs::path> expect_files = {dir.path / "model-00001-of-00004.safetensors", dir.path / "model-00002-of-00004.safetensors",
                                        dir.path / "model-00003-of-00004.safetensors", dir.path / "model-00004-of-00004.safetensors",
                                        dir.path / "model.safetensors.index.json"};
  EXPECT_EQ(written, expect_files);
  EXPECT_EQ(dir.listing().size(), 5u) << "no temporaries left";

  std::string index_text = read_bytes(dir.path / "model.safetensors.index.json");
  json index = json::parse(index_text);
  EXPECT_EQ(index_text, index.dump(2) + "\n") << "pretty-printed with 2-space indent";
  EXPECT_EQ(index["metadata"]["total_size"], 40 + 40 + 40 + 160 + 4);
  json wm = {{"layers.0.w", "model-00001-of-00004.safetensors"}, {"layers.0.b", "model-00001-of-00004.safetensors"},
             {"layers.1.w", "model-00002-of-00004.safetensors"}, {"big", "model-00003-of-00004.safetensors"},
             {"tail", "model-00004-of-00004.safetensors"},       {"tail.empty", "model-00004-of-00004.safetensors"}};
  EXPECT_EQ(index["weight_map"], wm);

  for (const fs::path& p : {dir.path, dir.path / "model.safetensors.index.json"}) {
    Checkpoint ck = Checkpoint::open(p);
    EXPECT_EQ(ck.index_path(), dir.path / "model.safetensors.index.json");
    EXPECT_EQ(ck.files().size(), 4u);
    EXPECT_EQ(ck.names(), (std::vector<std::string>{"big", "layers.0.b", "layers.0.w", "layers.1.w", "tail", "tail.empty"}));
    EXPECT_EQ(ck.total_bytes(), 284u);
    EXPECT_EQ(ck.metadata(), meta);
    for (const auto& f : ck.files()) EXPECT_EQ(f.metadata(), meta) << "every shard carries __metadata__";
    for (const auto& [name, t] : in) {
      ASSERT_TRUE(ck.contains(name));
      EXPECT_EQ(bytes_of(ck.tensor(name)), bytes_of(t)) << name;
      EXPECT_EQ(ck.info(name).file.filename().string(), wm[name].get<std::string>());
    }
    EXPECT_FALSE(ck.contains("missing"));
    EXPECT_THROW(ck.info("missing"), Error);
  }
}

TEST(Safetensors, WriterReplacesAStaleIndexWhenUnsharded) {
  TempDir dir;
  {
    SafetensorsWriter w(dir.path, "model", 8);
    w.add("a", pattern(DType::F32, {2}, 1));
    w.add("b", pattern(DType::F32, {2}, 2));
    EXPECT_EQ(w.finish().size(), 3u);
  }
  {
    SafetensorsWriter w(dir.path);
    w.add("c", pattern(DType::F32, {2}, 3));
    w.finish();
  }
  EXPECT_FALSE(fs::exists(dir.path / "model.safetensors.index.json"));
  EXPECT_EQ(Checkpoint::open(dir.path).names(), std::vector<std::string>{"c"});
}

TEST(Safetensors, CheckpointOpensFilesAndFolders) {
  TempDir dir;
  {
    SafetensorsWriter w(dir.path, "weights");
    w.add("x", pattern(DType::F32, {3}, 1));
    w.finish();
  }
  // A folder with exactly one .safetensors file of any name.
  Checkpoint a = Checkpoint::open(dir.path);
  EXPECT_TRUE(a.index_path().empty());
  EXPECT_EQ(a.names(), std::vector<std::string>{"x"});
  // A file path.
  Checkpoint b = Checkpoint::open(dir.path / "weights.safetensors");
  EXPECT_EQ(b.files().size(), 1u);
  // model.safetensors wins over other files.
  {
    SafetensorsWriter w(dir.path);
    w.add("y", pattern(DType::F32, {3}, 2));
    w.finish();
  }
  EXPECT_EQ(Checkpoint::open(dir.path).names(), std::vector<std::string>{"y"});

  TempDir empty;
  try {
    Checkpoint::open(empty.path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NotFound);
  }
  try {
    Checkpoint::open(empty.path / "nothing.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NotFound);
    EXPECT_NE(std::string(e.what()).find("nothing.safetensors"), std::string::npos);
  }
}

TEST(Safetensors, ReaderAcceptsOtherWritersLayouts) {
  TempDir dir;
  // Header entries in a different order from the data, unpadded, no metadata.
  std::string header = R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},"a":{"shape":[2],"data_offsets":[0,2],"dtype":"U8"}})";
  write_bytes(dir.path / "x.safetensors", raw_file(header, "\x01\x02\x03\x04"));
  SafetensorsFile f = SafetensorsFile::open(dir.path / "x.safetensors");
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensors()[0].name, "a");
  EXPECT_EQ(f.tensors()[1].name, "b");
  EXPECT_EQ(bytes_of(f.tensor("b")), "\x03\x04");
  EXPECT_TRUE(f.metadata().empty());

  // No tensors at all.
  write_bytes(dir.path / "empty.safetensors", raw_file("{}      ", ""));
  EXPECT_TRUE(SafetensorsFile::open(dir.path / "empty.safetensors").tensors().empty());
}

// ---- writer behaviour ---------------------------------------------------------

TEST(Safetensors, WriterDestroyedBeforeFinishLeavesNoFiles) {
  TempDir dir;
  {
    SafetensorsWriter w(dir.path, "model", 16);
    w.set_metadata({{"k", "v"}});
    for (int i = 0; i < 5; ++i) w.add(std::string("t").append(std::to_string(i)), pattern(DType::F32, {3}, i));
    EXPECT_FALSE(dir.listing().empty()) << "data is streamed to temporaries as it is added";
    EXPECT_FALSE(fs::exists(dir.path / "model.safetensors"));
    EXPECT_FALSE(fs::exists(dir.path / "model-00001-of-00005.safetensors"));
  }
  EXPECT_TRUE(dir.listing().empty());
}

TEST(Safetensors, WriterRejectsBadTensorsAndStillCleansUp) {
  TempDir dir;
  {
    SafetensorsWriter w(dir.path);
    w.add("a", pattern(DType::F32, {2}, 1));
    std::vector<uint8_t> buf(10);
    auto expect_invalid = [&](auto&& fn, const std::string& fragment) {
      try {
        fn();
        FAIL() << "expected an error containing " << fragment;
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
        EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
      }
    };
    expect_invalid([&] { w.add("b", DType::F16, {2, 2}, buf.data(), 10); }, "10 bytes given but shape [2, 2] of F16 needs 8");
    expect_invalid([&] { w.add("a", DType::U8, {10}, buf.data(), 10); }, "'a' added twice");
    expect_invalid([&] { w.add("__metadata__", DType::U8, {10}, buf.data(), 10); }, "invalid tensor name");
    expect_invalid([&] { w.add("neg", DType::U8, {-1}, buf.data(), 0); }, "invalid shape");
    expect_invalid([&] { w.add("bad\xff", DType::U8, {10}, buf.data(), 10); }, "invalid tensor name");
    w.add("b", DType::U8, {10}, buf.data(), 10);
  }
  EXPECT_TRUE(dir.listing().empty());
}

TEST(Safetensors, FinishTwiceIsAnError) {
  TempDir dir;
  SafetensorsWriter w(dir.path);
  w.add("a", pattern(DType::F32, {2}, 1));
  w.finish();
  EXPECT_THROW(w.finish(), Error);
  EXPECT_THROW(w.add("b", pattern(DType::F32, {2}, 1)), Error);
}

TEST(Safetensors, ByteLevelLayoutIsPinned) {
  TempDir dir;
  const uint8_t data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  {
    SafetensorsWriter w(dir.path);
    w.set_metadata({{"format", "pt"}});
    w.add("w", DType::F16, {2, 2}, data, sizeof data);
    w.finish();
  }
  const std::string header = R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8]}})";
  ASSERT_EQ(header.size(), 87u);
  const std::string padded = header + ' ';  // 8 + 88 = 96, a multiple of 8
  const std::string expected = std::string("\x58\0\0\0\0\0\0\0", 8) + padded + std::string(reinterpret_cast<const char*>(data), 8);
  const std::string got = read_bytes(dir.path / "model.safetensors");
  EXPECT_EQ(got, expected);

  ASSERT_GE(got.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(got[static_cast<size_t>(i)]);
  EXPECT_EQ(n, 88u);
  EXPECT_EQ((8 + n) % 8, 0u);
  json h = json::parse(got.substr(8, n));
  EXPECT_EQ(h.size(), 2u);
  EXPECT_EQ(h["__metadata__"], (json{{"format", "pt"}}));
  EXPECT_EQ(h["w"]["dtype"], "F16");
  EXPECT_EQ(h["w"]["shape"], (json{2, 2}));
  EXPECT_EQ(h["w"]["data_offsets"], (json{0, 8}));
  EXPECT_EQ(h["w"].size(), 3u);
}

// ---- the malformed-file corpus -----------------------------------------------

struct BadCase {
  const char* id;
  // Writes the files into the folder and returns what to open.
  std::function<fs::path(const fs::path& dir)> make;
  ErrorKind kind;
  std::string file;      // file name that the message must contain
  std::string fragment;  // and this
};

fs::path single(const fs::path& dir, const std::string& bytes) {
  fs::path p = dir / "bad.safetensors";
  write_bytes(p, bytes);
  return p;
}

std::string u8_entry(const std::string& name, int begin, int end) {
  return "\"" + name + "\":{\"dtype\":\"U8\",\"shape\":[" + std::to_string(end - begin) + "],\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

// A valid shard holding U8 tensors of 4 bytes each, named as given.
void shard(const fs::path& dir, const std::string& file, const std::vector<std::string>& names) {
  std::string header = "{";
  for (size_t i = 0; i < names.size(); ++i)
    header.append(i ? "," : "").append(u8_entry(names[i], static_cast<int>(4 * i), static_cast<int>(4 * i + 4)));
  write_bytes(dir / file, raw_file(header + "}", std::string(4 * names.size(), 'x')));
}

fs::path indexed(const fs::path& dir, const json& weight_map) {
  write_bytes(dir / "model.safetensors.index.json", json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump(2));
  return dir;
}

const std::string kOk = u8_entry("ok", 0, 4);

std::vector<BadCase> corpus() {
  const ErrorKind kInv = ErrorKind::InvalidInput;
  const std::string kBad = "bad.safetensors", kIdx = "model.safetensors.index.json";
  auto one = [](std::string bytes) { return [bytes](const fs::path& d) { return single(d, bytes); }; };
  auto hdr = [](std::string header, std::string data) {
    return [header, data](const fs::path& d) { return single(d, raw_file(header, data)); };
  };
  return {
      {"EmptyFile", one(""), kInv, kBad, "file is empty"},
      {"ShorterThan8Bytes", one(std::string("\x05\x00\x00", 3)), kInv, kBad, "3 bytes, shorter than the 8-byte header length"},
      {"HeaderLengthPastEnd", one(le64(100) + "{}"), kInv, kBad, "header length 100 runs past the end of the file (10 bytes)"},
      {"HeaderLengthOver100MB", one(le64(100'000'001) + "{}"), kInv, kBad, "header length 100000001 exceeds the limit"},
      {"HeaderLengthNearU64Max", one(le64(~0ull - 3) + "{}"), kInv, kBad, "exceeds the limit"},
      {"HeaderLengthBelow2", one(le64(1) + "{"), kInv, kBad, "header length 1 is less than 2"},
      {"HeaderNotJson", hdr("{not json}", ""), kInv, kBad, "header is not valid JSON (at byte 3): parse error at line 1, column 3"},
      {"HeaderInvalidUtf8", hdr("{\"\xff\xfe\":1}", ""), kInv, kBad, "header is not valid JSON"},
      {"HeaderTrailingGarbage", hdr("{} x", ""), kInv, kBad, "header is not valid JSON"},
      // Found by fuzz_safetensors: nlohmann reports a number beyond double as out_of_range, not parse_error.
      {"HeaderNumberOverflow", hdr("{\"a\": 1e999}", ""), kInv, kBad, "header is not valid JSON: number overflow parsing '1e999'"},
      {"HeaderIsArray", hdr("[1,2]", ""), kInv, kBad, "header must be a JSON object starting with '{'"},
      {"HeaderLeadingSpace", hdr(" {}", ""), kInv, kBad, "starting with '{'"},
      {"HeaderDeeplyNested", hdr("{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}", ""), kInv, kBad,
       "nested more than"},
      {"TruncatedData", hdr("{" + kOk + "," + u8_entry("last", 4, 12) + "}", "12345678"), kInv, kBad,
       "tensor 'last': data_offsets [4, 12] run past the end of the 8-byte data section"},
      {"OverlappingRanges", hdr("{" + u8_entry("a", 0, 8) + "," + u8_entry("b", 4, 12) + "}", std::string(12, 'x')), kInv,
       kBad, "tensor 'b': data_offsets [4, 12] overlap tensor 'a'"},
      {"GapBetweenRanges", hdr("{" + u8_entry("a", 0, 4) + "," + u8_entry("b", 8, 12) + "}", std::string(12, 'x')), kInv,
       kBad, "tensor 'b': data_offsets [8, 12] leave a gap of 4 bytes after tensor 'a'"},
      {"GapAtStart", hdr("{" + u8_entry("a", 4, 8) + "}", std::string(8, 'x')), kInv, kBad,
       "gap of 4 bytes after the start of the data section"},
      {"TrailingBytes", hdr("{" + kOk + "}", "12345"), kInv, kBad, "1 trailing bytes after the last tensor"},
      {"SizeShapeMismatch",
       hdr(R"({"lm_head.weight":{"dtype":"F16","shape":[4,8],"data_offsets":[0,100]}})", std::string(100, 'x')), kInv,
       kBad, "tensor 'lm_head.weight': data_offsets [0, 100] hold 100 bytes but shape [4, 8] of F16 needs 64"},
      {"ShapeProductOverflow",
       hdr(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", ""), kInv, kBad,
       "shape [4294967296, 4294967296] of F32 overflows"},
      {"UnknownDtype", hdr(R"({"w":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", "x"), ErrorKind::Unsupported, kBad,
       "tensor 'w': unknown dtype 'Q7'"},
      {"DtypeNotString", hdr(R"({"w":{"dtype":4,"shape":[1],"data_offsets":[0,1]}})", "x"), kInv, kBad,
       "tensor 'w': dtype must be a string"},
      {"MissingDataOffsets", hdr(R"({"w":{"dtype":"U8","shape":[1]}})", "x"), kInv, kBad,
       "tensor 'w': missing key 'data_offsets'"},
      {"MissingShape", hdr(R"({"w":{"dtype":"U8","data_offsets":[0,1]}})", "x"), kInv, kBad, "tensor 'w': missing key 'shape'"},
      {"UnknownEntryKey", hdr(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"crc":7}})", "x"), kInv, kBad,
       "tensor 'w': unknown key 'crc'"},
      {"EntryNotObject", hdr(R"({"w":[1,2]})", ""), kInv, kBad, "tensor 'w': entry must be a JSON object"},
      {"ShapeWithString", hdr(R"({"w":{"dtype":"U8","shape":["a"],"data_offsets":[0,1]}})", "x"), kInv, kBad,
       "tensor 'w': shape[0] is \"a\""},
      {"ShapeNotArray", hdr(R"({"w":{"dtype":"U8","shape":1,"data_offsets":[0,1]}})", "x"), kInv, kBad,
       "tensor 'w': shape must be an array"},
      {"NegativeDimension", hdr(R"({"w":{"dtype":"U8","shape":[2,-1],"data_offsets":[0,0]}})", ""), kInv, kBad,
       "tensor 'w': shape[1] is -1"},
      {"FloatDimension", hdr(R"({"w":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}})", "x"), kInv, kBad,
       "tensor 'w': shape[0] is 1.0"},
      {"DimensionAboveInt64", hdr(R"({"w":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,1]}})", "x"), kInv,
       kBad, "tensor 'w': shape[0] is 9223372036854775808"},
      {"BeginAfterEnd", hdr(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", std::string(8, 'x')), kInv, kBad,
       "tensor 'w': data_offsets [8, 0] have begin > end"},
      {"OffsetsWrongArity", hdr(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", "x"), kInv, kBad,
       "tensor 'w': data_offsets must be [begin, end]"},
      {"NegativeOffset", hdr(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", "x"), kInv, kBad,
       "tensor 'w': data_offsets must be [begin, end]"},
      {"OffsetsNearU64Max",
       hdr(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551614,18446744073709551615]}})", "x"), kInv,
       kBad, "run past the end"},
      {"MetadataValueNotString", hdr(R"({"__metadata__":{"format":1}})", ""), kInv, kBad,
       "__metadata__ value for 'format' must be a string"},
      {"MetadataNotObject", hdr(R"({"__metadata__":"pt"})", ""), kInv, kBad, "__metadata__ must be an object of strings"},
      {"DuplicateTensorKey", hdr("{" + kOk + "," + u8_entry("ok", 0, 4) + "}", "1234"), kInv, kBad,
       "header has a duplicate key 'ok'"},
      {"DuplicateKeyInEntry", hdr(R"({"w":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "x"), kInv, kBad,
       "header has a duplicate key 'dtype'"},
      {"IndexNotJson",
       [](const fs::path& d) {
         shard(d, "model-00001-of-00001.safetensors", {"a"});
         write_bytes(d / "model.safetensors.index.json", "{\"weight_map\": {,}");
         return d;
       },
       kInv, kIdx, "index is not valid JSON"},
      {"IndexNotObject",
       [](const fs::path& d) {
         write_bytes(d / "model.safetensors.index.json", "[]");
         return d / "model.safetensors.index.json";
       },
       kInv, kIdx, "index must be a JSON object"},
      {"IndexWithoutWeightMap",
       [](const fs::path& d) {
         write_bytes(d / "model.safetensors.index.json", R"({"metadata":{}})");
         return d;
       },
       kInv, kIdx, "no \"weight_map\""},
      {"IndexValueNotString", [](const fs::path& d) { return indexed(d, {{"a", 1}}); }, kInv, kIdx,
       "tensor 'a' maps to 1"},
      {"IndexMissingShard",
       [](const fs::path& d) {
         shard(d, "model-00001-of-00002.safetensors", {"a"});
         return indexed(d, {{"a", "model-00001-of-00002.safetensors"}, {"b", "model-00002-of-00002.safetensors"}});
       },
       ErrorKind::NotFound, kIdx, "shard 'model-00002-of-00002.safetensors' (listed for tensor 'b') does not exist"},
      {"IndexTensorAbsentFromShard",
       [](const fs::path& d) {
         shard(d, "s1.safetensors", {"a"});
         return indexed(d, {{"a", "s1.safetensors"}, {"ghost", "s1.safetensors"}});
       },
       kInv, kIdx, "weight_map lists tensor 'ghost' in 's1.safetensors', but that shard does not contain it"},
      {"IndexNamesWrongShard",
       [](const fs::path& d) {
         shard(d, "s1.safetensors", {"a"});
         shard(d, "s2.safetensors", {"b"});
         return indexed(d, {{"a", "s2.safetensors"}, {"b", "s1.safetensors"}});
       },
       kInv, kIdx, "(it is in s1.safetensors)"},
      {"ShardTensorNotListed",
       [](const fs::path& d) {
         shard(d, "s1.safetensors", {"a", "extra"});
         return indexed(d, {{"a", "s1.safetensors"}});
       },
       kInv, kIdx, "tensor 'extra' in shard s1.safetensors is not listed in weight_map"},
      {"TensorInTwoShards",
       [](const fs::path& d) {
         shard(d, "s1.safetensors", {"a", "dup"});
         shard(d, "s2.safetensors", {"dup"});
         return indexed(d, {{"a", "s1.safetensors"}, {"dup", "s2.safetensors"}});
       },
       kInv, kIdx, "tensor 'dup' is in both s1.safetensors and s2.safetensors"},
      {"ShardNameWithDotDot",
       [](const fs::path& d) {
         fs::create_directories(d / "sub");
         shard(d, "evil.safetensors", {"a"});
         return indexed(d / "sub", {{"a", "../evil.safetensors"}});
       },
       kInv, kIdx, "names shard '../evil.safetensors', which is not a plain file name"},
      {"ShardNameAbsolute", [](const fs::path& d) { return indexed(d, {{"a", "/etc/passwd"}}); }, kInv, kIdx,
       "not a plain file name"},
      {"EmptyWeightMap", [](const fs::path& d) { return indexed(d, json::object()); }, kInv, kIdx, "\"weight_map\" is empty"},
      {"BadShardInsideIndex",
       [](const fs::path& d) {
         write_bytes(d / "s1.safetensors", "abc");
         return indexed(d, {{"a", "s1.safetensors"}});
       },
       kInv, "s1.safetensors", "shorter than the 8-byte header length"},
      {"SeveralFilesWithoutIndex",
       [](const fs::path& d) {
         shard(d, "a.safetensors", {"x"});
         shard(d, "b.safetensors", {"y"});
         return d;
       },
       kInv, "", "several .safetensors files and no model.safetensors.index.json: a.safetensors, b.safetensors"},
  };
}

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.id; }

class MalformedFile : public testing::TestWithParam<BadCase> {};

void expect_error(const std::function<void()>& fn, const BadCase& c) {
  try {
    fn();
    ADD_FAILURE() << c.id << ": opened without error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(e.kind(), c.kind) << c.id << ": " << msg;
    EXPECT_NE(msg.find(c.file), std::string::npos) << c.id << ": message does not name " << c.file << ": " << msg;
    EXPECT_NE(msg.find(c.fragment), std::string::npos) << c.id << ": expected \"" << c.fragment << "\" in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << c.id << ": threw a non-qf exception: " << e.what();
  }
}

TEST_P(MalformedFile, IsRejectedWithAPreciseError) {
  const BadCase& c = GetParam();
  TempDir dir;
  fs::path target = c.make(dir.path);
  expect_error([&] { Checkpoint::open(target); }, c);
  if (target.extension() == ".safetensors") expect_error([&] { SafetensorsFile::open(target); }, c);
}

INSTANTIATE_TEST_SUITE_P(Corpus, MalformedFile, testing::ValuesIn(corpus()),
                         [](const testing::TestParamInfo<BadCase>& info) { return std::string(info.param.id); });

}  // namespace
}  // namespace qf
