#include "formats/gguf/imatrix.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "formats/gguf/gguf.h"
#include "formats/gguf/gguf_writer.h"
#include "test_util.h"

using namespace qf::test;

namespace {

// Little-endian byte builder for hand-made legacy .dat files.
struct Bytes {
  std::string s;
  Bytes& i32(int32_t v) {
    for (int k = 0; k < 4; ++k) s.push_back(static_cast<char>((static_cast<uint32_t>(v) >> (8 * k)) & 0xff));
    return *this;
  }
  Bytes& f32(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return i32(static_cast<int32_t>(u));
  }
  Bytes& str(const std::string& x) {
    i32(static_cast<int32_t>(x.size()));
    s += x;
    return *this;
  }
};

// Two entries (ncall 5 and 2) and the optional trailer.
std::string legacy_dat(bool trailer) {
  Bytes b;
  b.i32(2);
  b.str("blk.0.attn_q.weight").i32(5).i32(4).f32(5.0f).f32(10.0f).f32(0.5f).f32(0.0f);
  b.str("blk.0.ffn_down.weight").i32(2).i32(2).f32(3.0f).f32(1.0f);
  if (trailer) b.i32(7).str("wiki.train.raw");
  return b.s;
}

qf::Imatrix sample() {
  qf::Imatrix m;
  m.entries["blk.0.attn_q.weight"] = {{4.0f, 8.0f, 0.0f, 2.5f}, 4.0f, {}};
  m.entries["blk.1.ffn_down.weight"] = {{1.0f, 3.0f, 9.0f}, 3.0f, {}};
  m.datasets = {"wiki.train.raw", "code.txt"};
  m.chunk_count = 10;
  m.chunk_size = 512;
  return m;
}

// A GGUF with imatrix metadata and hand-chosen tensors (for the error cases).
void write_raw_imatrix(const std::filesystem::path& p, const std::vector<float>& sums,
                       const std::vector<uint64_t>& sum_dims, const std::vector<float>& counts,
                       const std::vector<uint64_t>& count_dims, const std::string& type = "imatrix") {
  qf::GgufWriter w(p);
  w.add_string("general.type", type);
  w.add_string_array("imatrix.datasets", {"d"});
  w.add_u32("imatrix.chunk_count", 1);
  w.add_u32("imatrix.chunk_size", 512);
  w.add_tensor("blk.0.attn_k.weight.in_sum2", qf::ggml_type::F32, sum_dims, sums.data(), sums.size() * 4);
  if (!counts.empty())
    w.add_tensor("blk.0.attn_k.weight.counts", qf::ggml_type::F32, count_dims, counts.data(), counts.size() * 4);
  w.finish();
}

}  // namespace

TEST(Imatrix, GgufRoundTrip) {
  TempDir dir;
  const auto path = dir / "imatrix.gguf";
  const qf::Imatrix m = sample();
  qf::write_imatrix_gguf(m, path);

  // The layout llama-imatrix writes.
  const qf::GgufFile f = qf::GgufFile::open(path);
  EXPECT_EQ(f.keys(), (std::vector<std::string>{"general.type", "imatrix.datasets", "imatrix.chunk_count",
                                                 "imatrix.chunk_size"}));
  EXPECT_EQ(f.get_string("general.type"), "imatrix");
  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.tensors()[0].name, "blk.0.attn_q.weight.in_sum2");
  EXPECT_EQ(f.tensors()[0].dims, (std::vector<uint64_t>{4}));
  EXPECT_EQ(f.tensors()[1].name, "blk.0.attn_q.weight.counts");
  EXPECT_EQ(f.tensors()[1].dims, (std::vector<uint64_t>{1}));
  EXPECT_EQ(f.tensors()[2].name, "blk.1.ffn_down.weight.in_sum2");

  const qf::Imatrix r = qf::read_imatrix(path);
  EXPECT_EQ(r.datasets, m.datasets);
  EXPECT_EQ(r.chunk_count, 10u);
  EXPECT_EQ(r.chunk_size, 512u);
  ASSERT_EQ(r.entries.size(), 2u);
  EXPECT_EQ(r.entries.at("blk.0.attn_q.weight").in_sum2, m.entries.at("blk.0.attn_q.weight").in_sum2);
  EXPECT_EQ(r.entries.at("blk.0.attn_q.weight").count, 4.0f);
  EXPECT_EQ(r.entries.at("blk.1.ffn_down.weight").in_sum2, m.entries.at("blk.1.ffn_down.weight").in_sum2);
  EXPECT_EQ(r.importance("blk.1.ffn_down.weight"), (std::vector<float>{1.0f / 3.0f, 1.0f, 3.0f}));
}

TEST(Imatrix, ImportanceIsSumOverCount) {
  const qf::Imatrix m = sample();
  EXPECT_EQ(m.importance("blk.0.attn_q.weight"), (std::vector<float>{1.0f, 2.0f, 0.0f, 0.625f}));
  EXPECT_TRUE(m.importance("blk.7.attn_q.weight").empty());
}

TEST(Imatrix, ReadsLegacyDat) {
  TempDir dir;
  write_file(dir / "a.dat", legacy_dat(true));
  const qf::Imatrix m = qf::read_imatrix(dir / "a.dat");
  ASSERT_EQ(m.entries.size(), 2u);
  EXPECT_EQ(m.entries.at("blk.0.attn_q.weight").count, 5.0f);
  EXPECT_EQ(m.entries.at("blk.0.attn_q.weight").in_sum2, (std::vector<float>{5.0f, 10.0f, 0.5f, 0.0f}));
  // stored values are mean * ncall: importance gives the mean back
  EXPECT_EQ(m.importance("blk.0.attn_q.weight"), (std::vector<float>{1.0f, 2.0f, 0.1f, 0.0f}));
  EXPECT_EQ(m.importance("blk.0.ffn_down.weight"), (std::vector<float>{1.5f, 0.5f}));
  EXPECT_EQ(m.chunk_count, 7u);
  EXPECT_EQ(m.chunk_size, 0u);
  EXPECT_EQ(m.datasets, (std::vector<std::string>{"wiki.train.raw"}));

  // Without the trailer (older llama-imatrix).
  write_file(dir / "b.dat", legacy_dat(false));
  const qf::Imatrix b = qf::read_imatrix(dir / "b.dat");
  EXPECT_EQ(b.entries.size(), 2u);
  EXPECT_EQ(b.chunk_count, 0u);
  EXPECT_TRUE(b.datasets.empty());

  // A .dat converted to GGUF and read back keeps the means.
  qf::write_imatrix_gguf(m, dir / "c.gguf");
  EXPECT_EQ(qf::read_imatrix(dir / "c.gguf").importance("blk.0.attn_q.weight"),
            m.importance("blk.0.attn_q.weight"));
}

TEST(Imatrix, TruncatedDatIsInvalidInput) {
  TempDir dir;
  const std::string full = legacy_dat(true);
  // Cut inside the count, a name, the values, the trailer's length and the dataset name.
  for (size_t cut : {size_t(2), size_t(10), size_t(40), full.size() - 18, full.size() - 3}) {
    std::string name("cut");  // (not "t" + to_string(): GCC 12 warns -Wrestrict on it)
    name += std::to_string(cut);
    name += ".dat";
    write_file(dir / name, full.substr(0, cut));
    EXPECT_QF_ERROR(qf::read_imatrix(dir / name), qf::ErrorKind::InvalidInput, name);
  }
  write_file(dir / "values.dat", full.substr(0, 40));
  EXPECT_QF_ERROR(qf::read_imatrix(dir / "values.dat"), qf::ErrorKind::InvalidInput, "truncated");
  write_file(dir / "extra.dat", full + "xy");
  EXPECT_QF_ERROR(qf::read_imatrix(dir / "extra.dat"), qf::ErrorKind::InvalidInput, "unexpected bytes");
  write_file(dir / "empty.dat", "");
  EXPECT_QF_ERROR(qf::read_imatrix(dir / "empty.dat"), qf::ErrorKind::InvalidInput, "truncated");
  Bytes zero;
  zero.i32(0);
  write_file(dir / "zero.dat", zero.s);
  EXPECT_QF_ERROR(qf::read_imatrix(dir / "zero.dat"), qf::ErrorKind::InvalidInput, "entry count is 0");
  Bytes ncall;
  ncall.i32(1).str("blk.0.attn_q.weight").i32(0).i32(1).f32(1.0f);
  write_file(dir / "ncall.dat", ncall.s);
  EXPECT_QF_ERROR(qf::read_imatrix(dir / "ncall.dat"), qf::ErrorKind::InvalidInput, "blk.0.attn_q.weight");
  Bytes dup;
  dup.i32(2).str("a.weight").i32(1).i32(1).f32(1.0f).str("a.weight").i32(1).i32(1).f32(1.0f);
  write_file(dir / "dup.dat", dup.s);
  EXPECT_QF_ERROR(qf::read_imatrix(dir / "dup.dat"), qf::ErrorKind::InvalidInput, "duplicate");
}

TEST(Imatrix, RejectsNonImatrixGguf) {
  TempDir dir;
  const std::vector<float> sums = {1, 2, 3, 4}, counts = {1};
  write_raw_imatrix(dir / "model.gguf", sums, {4}, counts, {1}, "model");
  EXPECT_QF_ERROR(qf::read_imatrix(dir / "model.gguf"), qf::ErrorKind::InvalidInput, "not an imatrix");

  // A model-like GGUF without general.type or imatrix keys.
  {
    qf::GgufWriter w(dir / "plain.gguf");
    w.add_string("general.architecture", "llama");
    w.add_tensor("token_embd.weight", qf::ggml_type::F32, {4}, sums.data(), 16);
    w.finish();
  }
  EXPECT_QF_ERROR(qf::read_imatrix(dir / "plain.gguf"), qf::ErrorKind::InvalidInput, "imatrix.datasets");

  // Text is neither GGUF nor a plausible .dat.
  write_file(dir / "notes.txt", "hello, this is not an imatrix");
  EXPECT_QF_ERROR(qf::read_imatrix(dir / "notes.txt"), qf::ErrorKind::InvalidInput, "notes.txt");
  // A GGUF magic with a broken header goes to the GGUF reader's error.
  write_file(dir / "bad.gguf", std::string("GGUF\x03\0\0\0", 8));
  EXPECT_QF_ERROR(qf::read_imatrix(dir / "bad.gguf"), qf::ErrorKind::InvalidInput, "bad.gguf");
  // Sums without counts.
  write_raw_imatrix(dir / "nocounts.gguf", sums, {4}, {}, {});
  EXPECT_QF_ERROR(qf::read_imatrix(dir / "nocounts.gguf"), qf::ErrorKind::InvalidInput, "blk.0.attn_k.weight");
}

TEST(Imatrix, RejectsNonFiniteValues) {
  TempDir dir;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  write_raw_imatrix(dir / "nan.gguf", {1, nan, 3, 4}, {4}, {2}, {1});
  EXPECT_QF_ERROR(qf::read_imatrix(dir / "nan.gguf"), qf::ErrorKind::InvalidInput, "blk.0.attn_k.weight");
  write_raw_imatrix(dir / "infcount.gguf", {1, 2, 3, 4}, {4}, {inf}, {1});
  EXPECT_QF_ERROR(qf::read_imatrix(dir / "infcount.gguf"), qf::ErrorKind::InvalidInput, "blk.0.attn_k.weight");
  write_raw_imatrix(dir / "zerocount.gguf", {1, 2, 3, 4}, {4}, {0}, {1});
  EXPECT_QF_ERROR(qf::read_imatrix(dir / "zerocount.gguf"), qf::ErrorKind::InvalidInput, "not a positive");

  Bytes b;
  b.i32(1).str("blk.3.ffn_up.weight").i32(1).i32(2).f32(1.0f).f32(inf);
  write_file(dir / "inf.dat", b.s);
  EXPECT_QF_ERROR(qf::read_imatrix(dir / "inf.dat"), qf::ErrorKind::InvalidInput, "blk.3.ffn_up.weight");

  // The writer refuses what the reader would reject, and leaves no file.
  qf::Imatrix m = sample();
  m.entries["blk.0.attn_q.weight"].in_sum2[1] = nan;
  EXPECT_QF_ERROR(qf::write_imatrix_gguf(m, dir / "out.gguf"), qf::ErrorKind::InvalidInput, "blk.0.attn_q.weight");
  EXPECT_FALSE(std::filesystem::exists(dir / "out.gguf"));
}

TEST(Imatrix, MoEEntriesHoldOneRowAndCountPerExpert) {
  TempDir dir;
  write_raw_imatrix(dir / "moe.gguf", {1, 2, 3, 4, 5, 6, 7, 8}, {4, 2}, {3, 5}, {1, 2});
  const qf::Imatrix moe = qf::read_imatrix(dir / "moe.gguf");
  EXPECT_EQ(moe.entries.at("blk.0.attn_k.weight").nmat(), 2);
  EXPECT_EQ(moe.importance("blk.0.attn_k.weight"),
            (std::vector<float>{1 / 3.f, 2 / 3.f, 3 / 3.f, 4 / 3.f, 5 / 5.f, 6 / 5.f, 7 / 5.f, 8 / 5.f}));
  // An expert no token reached keeps its zero count (llama-quantize: importance 1) and round-trips.
  write_raw_imatrix(dir / "partial.gguf", {1, 2, 0, 0}, {2, 2}, {2, 0}, {1, 2});
  const qf::Imatrix partial = qf::read_imatrix(dir / "partial.gguf");
  EXPECT_EQ(partial.importance("blk.0.attn_k.weight"), (std::vector<float>{0.5f, 1.0f, 1.0f, 1.0f}));
  qf::write_imatrix_gguf(partial, dir / "again.gguf");
  const qf::Imatrix again = qf::read_imatrix(dir / "again.gguf");
  EXPECT_EQ(again.entries.at("blk.0.attn_k.weight").expert_counts, (std::vector<float>{2, 0}));
  EXPECT_EQ(again.entries.at("blk.0.attn_k.weight").in_sum2, (std::vector<float>{1, 2, 0, 0}));
  // Every expert without tokens: no data at all.
  write_raw_imatrix(dir / "none.gguf", {0, 0, 0, 0}, {2, 2}, {0, 0}, {1, 2});
  EXPECT_QF_ERROR(qf::read_imatrix(dir / "none.gguf"), qf::ErrorKind::InvalidInput, "blk.0.attn_k.weight");
  // nmat = 1 written as 2-D [n, 1] is accepted.
  write_raw_imatrix(dir / "one.gguf", {1, 2, 3, 4}, {4, 1}, {2}, {1, 1});
  EXPECT_EQ(qf::read_imatrix(dir / "one.gguf").importance("blk.0.attn_k.weight"),
            (std::vector<float>{0.5f, 1.0f, 1.5f, 2.0f}));
  // counts that do not match nmat
  write_raw_imatrix(dir / "badcounts.gguf", {1, 2, 3, 4}, {4}, {2, 2}, {1, 2});
  EXPECT_QF_ERROR(qf::read_imatrix(dir / "badcounts.gguf"), qf::ErrorKind::InvalidInput, "counts");
}
