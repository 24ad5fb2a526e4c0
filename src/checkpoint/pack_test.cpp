#include "checkpoint/pack.h"

#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"

namespace qf {
namespace {

std::vector<uint8_t> random_codes(size_t n, int bits, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& x : v) x = static_cast<uint8_t>(rng() & ((1u << bits) - 1));
  return v;
}

uint32_t u(int32_t w) { return static_cast<uint32_t>(w); }

TEST(Pack, HandComputedWords) {
  const std::vector<uint8_t> nib = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(u(pack_int32_rows(nib.data(), 1, 8, 4)[0]), 0x76543210u);
  const std::vector<uint8_t> nib_hi = {0xF, 0xE, 0xD, 0xC, 0xB, 0xA, 0x9, 0x8};
  EXPECT_EQ(u(pack_int32_rows(nib_hi.data(), 1, 8, 4)[0]), 0x89ABCDEFu);
  const std::vector<uint8_t> bytes = {1, 2, 3, 0xFF};
  EXPECT_EQ(u(pack_int32_rows(bytes.data(), 1, 4, 8)[0]), 0xFF030201u);
  std::vector<uint8_t> two(16);
  for (int i = 0; i < 16; ++i) two[i] = static_cast<uint8_t>(i & 3);
  EXPECT_EQ(u(pack_int32_rows(two.data(), 1, 16, 2)[0]), 0xE4E4E4E4u);
  // Symmetric 4-bit GPTQ zeros (8 - 1 = 7 in every nibble).
  const std::vector<uint8_t> sevens(8, 7);
  EXPECT_EQ(u(pack_int32_rows(sevens.data(), 1, 8, 4)[0]), 0x77777777u);
  // A short 4-bit row: 3 values, one word, zero padding above.
  const std::vector<uint8_t> three = {0xA, 0xB, 0xC};
  auto w = pack_int32_rows(three.data(), 1, 3, 4);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(u(w[0]), 0x00000CBAu);
}

TEST(Pack, StraddlingValues) {
  // 3-bit: value 10 starts at bit 30: its low two bits end word 0, its high bit starts word 1.
  std::vector<uint8_t> v(32, 0);
  v[10] = 0b101;
  auto w = pack_int32_rows(v.data(), 1, 32, 3);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(u(w[0]), 0x40000000u);
  EXPECT_EQ(u(w[1]), 0x00000001u);
  EXPECT_EQ(u(w[2]), 0u);
  // 3-bit: value 21 starts at bit 63: bit 31 of word 1, then bits 0-1 of word 2.
  std::fill(v.begin(), v.end(), 0);
  v[21] = 0b110;
  w = pack_int32_rows(v.data(), 1, 32, 3);
  EXPECT_EQ(u(w[0]), 0u);
  EXPECT_EQ(u(w[1]), 0x00000000u);  // low bit of 0b110 is 0
  EXPECT_EQ(u(w[2]), 0x00000003u);
  v[21] = 0b111;
  w = pack_int32_rows(v.data(), 1, 32, 3);
  EXPECT_EQ(u(w[1]), 0x80000000u);
  EXPECT_EQ(u(w[2]), 0x00000003u);
  // 32 sevens fill three words completely.
  std::fill(v.begin(), v.end(), 7);
  w = pack_int32_rows(v.data(), 1, 32, 3);
  for (int32_t x : w) EXPECT_EQ(u(x), 0xFFFFFFFFu);
  // 5-bit, 7 values -> ceil(35/32) = 2 words; value 6 = 22 (0b10110) starts at bit 30.
  std::vector<uint8_t> f(7, 0);
  f[6] = 22;
  w = pack_int32_rows(f.data(), 1, 7, 5);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(u(w[0]), 0x80000000u);
  EXPECT_EQ(u(w[1]), 0x00000005u);
}

// AutoGPTQ's explicit 3-bit packing (qlinear pack(), written out with its
// straddles) produces the same words as the dense LSB-first packing.
TEST(Pack, ThreeBitMatchesAutoGptqLayout) {
  const auto v = random_codes(32 * 5, 3, 7);
  std::vector<uint32_t> ref(3 * 5, 0);
  size_t i = 0, row = 0;
  while (row < ref.size()) {
    for (size_t j = i; j < i + 10; ++j) ref[row] |= uint32_t(v[j]) << (3 * (j - i));
    i += 10;
    ref[row] |= uint32_t(v[i]) << 30;
    ++row;
    ref[row] |= (uint32_t(v[i]) >> 2) & 1;
    ++i;
    for (size_t j = i; j < i + 10; ++j) ref[row] |= uint32_t(v[j]) << (3 * (j - i) + 1);
    i += 10;
    ref[row] |= uint32_t(v[i]) << 31;
    ++row;
    ref[row] |= (uint32_t(v[i]) >> 1) & 3;
    ++i;
    for (size_t j = i; j < i + 10; ++j) ref[row] |= uint32_t(v[j]) << (3 * (j - i) + 2);
    i += 10;
    ++row;
  }
  const auto w = pack_int32_rows(v.data(), 1, static_cast<int64_t>(v.size()), 3);
  ASSERT_EQ(w.size(), ref.size());
  for (size_t k = 0; k < ref.size(); ++k) EXPECT_EQ(u(w[k]), ref[k]) << "word " << k;
}

// compressed-tensors <= 0.14 packed 32/bits values per word with padding; for
// 2, 4 and 8 bits that is the same layout as the dense one.
TEST(Pack, PaddedLayoutIdenticalWhenBitsDivide32) {
  for (int bits : {2, 4, 8}) {
    const int64_t cols = 77;
    const auto v = random_codes(3 * cols, bits, 100 + bits);
    const int per = 32 / bits;
    const int64_t nw = (cols + per - 1) / per;
    std::vector<uint32_t> ref(3 * nw, 0);
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t c = 0; c < cols; ++c) ref[r * nw + c / per] |= uint32_t(v[r * cols + c]) << (bits * (c % per));
    const auto w = pack_int32_rows(v.data(), 3, cols, bits);
    ASSERT_EQ(static_cast<int64_t>(w.size()), 3 * nw) << bits;
    for (size_t k = 0; k < ref.size(); ++k) EXPECT_EQ(u(w[k]), ref[k]) << bits << " word " << k;
  }
  EXPECT_EQ(packed_words(32, 3), 3);   // dense; the old padded layout needed 4 (10 per word)
  EXPECT_EQ(packed_words(100, 3), 10);
  EXPECT_EQ(packed_words(100, 5), 16);
  EXPECT_EQ(packed_words(0, 4), 0);
}

TEST(Pack, RoundTripAllWidthsOddSizes) {
  for (int bits = 1; bits <= 8; ++bits) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {5, 33}, {7, 100}, {2, 257}, {0, 5}}) {
      const auto v = random_codes(static_cast<size_t>(rows * cols), bits, static_cast<uint32_t>(bits * 1000 + cols));
      const auto w = pack_int32_rows(v.data(), rows, cols, bits);
      ASSERT_EQ(static_cast<int64_t>(w.size()), rows * packed_words(cols, bits));
      EXPECT_EQ(unpack_int32_rows(w.data(), rows, cols, bits), v) << bits << " " << rows << "x" << cols;
      const auto wc = pack_int32_cols(v.data(), rows, cols, bits);
      ASSERT_EQ(static_cast<int64_t>(wc.size()), packed_words(rows, bits) * cols);
      EXPECT_EQ(unpack_int32_cols(wc.data(), rows, cols, bits), v) << bits << " " << rows << "x" << cols;
    }
  }
}

// Packing along dim 0 is packing the rows of the transpose, transposed back.
TEST(Pack, ColumnPackingIsTransposedRowPacking) {
  const int64_t rows = 45, cols = 6;
  for (int bits : {3, 4, 7}) {
    const auto v = random_codes(rows * cols, bits, 9 + bits);
    std::vector<uint8_t> t(v.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = v[r * cols + c];
    const auto wr = pack_int32_rows(t.data(), cols, rows, bits);  // [cols, nw]
    const auto wc = pack_int32_cols(v.data(), rows, cols, bits);  // [nw, cols]
    const int64_t nw = packed_words(rows, bits);
    for (int64_t k = 0; k < nw; ++k)
      for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(wc[k * cols + c], wr[c * nw + k]);
  }
}

TEST(Pack, UnpackIgnoresPaddingBits) {
  std::vector<int32_t> w = {static_cast<int32_t>(0xFFFFF321u)};
  EXPECT_EQ(unpack_int32_rows(w.data(), 1, 3, 4), (std::vector<uint8_t>{1, 2, 3}));
}

TEST(Pack, RejectsBadInput) {
  const std::vector<uint8_t> v = {16};
  EXPECT_QF_ERROR(pack_int32_rows(v.data(), 1, 1, 4), ErrorKind::InvalidInput, "does not fit in 4 bits");
  EXPECT_QF_ERROR(pack_int32_cols(v.data(), 1, 1, 4), ErrorKind::InvalidInput, "does not fit in 4 bits");
  EXPECT_QF_ERROR(pack_int32_rows(v.data(), 1, 1, 9), ErrorKind::InvalidInput, "bits must be 1..8");
  EXPECT_QF_ERROR(pack_int32_rows(v.data(), 1, 1, 0), ErrorKind::InvalidInput, "bits must be 1..8");
}

}  // namespace
}  // namespace qf
