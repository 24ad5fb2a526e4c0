#include "calibration/calibration_data.h"

#include <gtest/gtest.h>

#include "calibration/activation_store.h"
#include "test_util.h"

namespace qf {
namespace {

using namespace qf::test;

std::filesystem::path fixture() { return source_dir() / "tests" / "data" / "fixture-llama"; }

TEST(CalibrationData, TextWindowsAreSeededAndStartWithBos) {
  auto tok = load_tokenizer(fixture());
  CalibrationOptions o;
  o.num_samples = 8;
  o.seq_len = 64;
  o.seed = 3;
  const auto path = source_dir() / "tests/data/text/calibration.txt";
  const auto a = load_calibration(path, *tok, o), b = load_calibration(path, *tok, o);
  ASSERT_EQ(a.size(), 8u);
  EXPECT_EQ(a, b);
  for (const auto& s : a) {
    EXPECT_EQ(s.size(), 64u);
    EXPECT_EQ(s[0], tok->bos_id());
  }
  o.seed = 4;
  EXPECT_NE(load_calibration(path, *tok, o), a);
}

TEST(CalibrationData, JsonlRecordsAndErrors) {
  auto tok = load_tokenizer(fixture());
  TempDir t;
  write_file(t.path() / "d.jsonl", "{\"text\": \"The President said that\"}\n\n{\"text\": \"a\", \"id\": 2}\n{\"body\": \"x\", \"text\": \"Moby Dick is a whale of a book about a whale\"}\n");
  CalibrationOptions o;
  o.num_samples = 10;
  o.seq_len = 6;
  const auto s = load_calibration(t.path() / "d.jsonl", *tok, o);
  ASSERT_EQ(s.size(), 3u);
  for (const auto& x : s) {
    EXPECT_LE(x.size(), 6u);
    EXPECT_EQ(x[0], tok->bos_id());
  }
  o.text_field = "content";
  EXPECT_QF_ERROR(load_calibration(t.path() / "d.jsonl", *tok, o), ErrorKind::InvalidInput, "d.jsonl:1: no string field 'content'");
  write_file(t.path() / "bad.jsonl", "{\"text\": \"ok\"}\n{not json\n");
  o.text_field = "text";
  EXPECT_QF_ERROR(load_calibration(t.path() / "bad.jsonl", *tok, o), ErrorKind::InvalidInput, "bad.jsonl:2: not valid JSON");
  write_file(t.path() / "short.txt", "too short");
  o.seq_len = 512;
  EXPECT_QF_ERROR(load_calibration(t.path() / "short.txt", *tok, o), ErrorKind::InvalidInput, "fewer than one sample of 512");
}

// Calibration files are checked to be text (core/text_input.h) before they are tokenized.
// Image records: the sequencer gets the resolved path and the text's tokens;
// the image block is kept whole when the sample is cut to seq_len; text
// records are those load_calibration gives.
TEST(CalibrationData, ImageRecords) {
  auto tok = load_tokenizer(fixture());
  TempDir t;
  write_file(t.path() / "d.jsonl",
             "{\"image\": \"pics/a.png\", \"text\": \"A red circle on white paper, round and bright.\"}\n"
             "{\"text\": \"The President said that the nation was at peace.\"}\n");
  std::vector<std::filesystem::path> seen;
  const ImageSampleFn image = [&](const std::filesystem::path& p, const std::vector<int32_t>& text) {
    seen.push_back(p);
    rt::MultimodalSequence m;
    m.tokens.assign(5, 77);  // BOS-less stand-in image block of 5 tokens
    m.inputs.embed_row = {0, 1, 2, 3, 4};
    m.first_text = 5;
    for (int32_t x : text) m.tokens.push_back(x), m.inputs.embed_row.push_back(-1);
    return m;
  };
  CalibrationOptions o;
  o.num_samples = 10;
  o.seq_len = 8;
  const auto s = load_calibration_samples(t.path() / "d.jsonl", *tok, o, image);
  ASSERT_EQ(s.size(), 2u);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], t.path() / "pics/a.png");
  write_file(t.path() / "t.jsonl", "{\"text\": \"The President said that the nation was at peace.\"}\n");
  const auto text = load_calibration(t.path() / "t.jsonl", *tok, o);
  for (const CalibrationSample& c : s) {
    EXPECT_EQ(c.tokens.size(), 8u);
    if (c.image) {
      EXPECT_EQ(c.inputs.embed_row.size(), 8u);
      EXPECT_EQ(c.tokens[0], 77);
    } else {
      EXPECT_EQ(c.tokens, text[0]);
      EXPECT_TRUE(c.inputs.embed_row.empty());
    }
  }
  // An image block longer than seq_len: kept whole with one text token.
  o.seq_len = 3;
  for (const CalibrationSample& c : load_calibration_samples(t.path() / "d.jsonl", *tok, o, image))
    if (c.image) {
      EXPECT_EQ(c.tokens.size(), 6u);
    }
  // A text model's calibration: an image record is an error naming its line.
  EXPECT_QF_ERROR(load_calibration(t.path() / "d.jsonl", *tok, o), ErrorKind::InvalidInput,
                  "d.jsonl:1: the record names an image, but the model is not a vision-language model");
  write_file(t.path() / "e.jsonl", "{\"image\": 3, \"text\": \"x\"}\n");
  EXPECT_QF_ERROR(load_calibration_samples(t.path() / "e.jsonl", *tok, o, image), ErrorKind::InvalidInput,
                  "e.jsonl:1: 'image' must be the path of an image file");
}

TEST(CalibrationData, BinaryAndUtf16AreErrorsInvalidUtf8AWarning) {
  auto tok = load_tokenizer(fixture());
  TempDir t;
  CalibrationOptions o;
  o.num_samples = 2;
  o.seq_len = 4;
  std::vector<std::string> warnings;
  o.warn = [&](const std::string& w) { warnings.push_back(w); };
  write_file(t.path() / "u16.txt", std::string("\xFF\xFE" "a\0b\0c\0", 8));
  EXPECT_QF_ERROR(load_calibration(t.path() / "u16.txt", *tok, o), ErrorKind::InvalidInput, "u16.txt: is UTF-16 text");
  write_file(t.path() / "nul.jsonl", std::string("{\"text\": \"a\"}\n\0\n", 15));
  EXPECT_QF_ERROR(load_calibration(t.path() / "nul.jsonl", *tok, o), ErrorKind::InvalidInput, "nul.jsonl: has a NUL byte at offset 14");
  EXPECT_QF_ERROR(load_calibration(t.path(), *tok, o), ErrorKind::InvalidInput, "is a folder, not a regular file");
  EXPECT_TRUE(warnings.empty());
  write_file(t.path() / "latin1.txt", "The President said caf\xE9 cr\xE8me and went on with the day");
  const auto s = load_calibration(t.path() / "latin1.txt", *tok, o);
  EXPECT_EQ(s.size(), 2u);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("latin1.txt: 2 bytes of invalid UTF-8 (the first at offset 22)"), std::string::npos) << warnings[0];
}

TEST(ActivationStore, SpillsBeyondTheBudgetAndReadsBackExactly) {
  std::vector<size_t> sizes = {1000, 10, 5000};
  ActivationStore mem(sizes, 0), disk(sizes, 4000);
  EXPECT_FALSE(mem.spilled());
  EXPECT_TRUE(disk.spilled());
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<float> x(sizes[i]);
    for (size_t j = 0; j < x.size(); ++j) x[j] = static_cast<float>(j % 17) * 0.25f - static_cast<float>(i);
    mem.store(i, x);
    disk.store(i, x);
    EXPECT_EQ(disk.load(i), x);
    EXPECT_EQ(mem.load(i), x);
  }
  EXPECT_GT(disk.bytes_on_disk(), 0u);
  EXPECT_LT(disk.bytes_on_disk(), 6010u * 4);  // compressed
}

TEST(ActivationStore, ParsesMemorySizes) {
  EXPECT_EQ(parse_memory_size("512M", "--max-memory"), 512ull << 20);
  EXPECT_EQ(parse_memory_size("8G", "--max-memory"), 8ull << 30);
  EXPECT_EQ(parse_memory_size("1.5GiB", "--max-memory"), 3ull << 29);
  EXPECT_EQ(parse_memory_size("1000", "--max-memory"), 1000u);
  EXPECT_QF_ERROR(parse_memory_size("lots", "--max-memory"), ErrorKind::Usage, "--max-memory must be a size");
  EXPECT_QF_ERROR(parse_memory_size("-1G", "--max-memory"), ErrorKind::Usage, "--max-memory");
  EXPECT_QF_ERROR(parse_memory_size("5X", "--max-memory"), ErrorKind::Usage, "--max-memory");
}

}  // namespace
}  // namespace qf
