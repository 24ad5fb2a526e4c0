#include "quantizers/kquants.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "quantizers/distortion.h"
#include "simd_level_fixture.h"
#include "test_util.h"

namespace qf::kquants {
namespace {

namespace gt = ggml_type;

const std::vector<uint32_t> kWeightTypes = {gt::F32,  gt::F16,  gt::BF16, gt::Q4_0, gt::Q4_1, gt::Q5_0, gt::Q5_1,
                                            gt::Q8_0, gt::Q2_K, gt::Q3_K, gt::Q4_K, gt::Q5_K, gt::Q6_K};
const std::vector<uint32_t> kQuantTypes = {gt::Q4_0, gt::Q4_1, gt::Q5_0, gt::Q5_1, gt::Q8_0,
                                           gt::Q2_K, gt::Q3_K, gt::Q4_K, gt::Q5_K, gt::Q6_K, gt::IQ4_NL};

std::string tname(uint32_t t) { return ggml_type_info(t)->name; }

// A platform-independent pseudo-Gaussian stream (xorshift64*, sum of four
// uniforms) with an outlier every 97th element, a scale per row, a zero block
// and a constant block: only exact float operations, so the golden byte hashes
// below hold on any IEEE machine.
std::vector<float> synthetic_rows(int64_t rows, int64_t npr, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(rows * npr));
  uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
  auto uni = [&]() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return static_cast<float>((s * 0x2545F4914F6CDD1DULL) >> 40) * (1.0f / 16777216.0f);
  };
  for (int64_t r = 0; r < rows; ++r) {
    const float row_scale = 0.25f + static_cast<float>(r % 13) * 0.5f;
    for (int64_t c = 0; c < npr; ++c) {
      const int64_t i = r * npr + c;
      const float u1 = uni(), u2 = uni(), u3 = uni(), u4 = uni();
      float g = ((((u1 + u2) + u3) + u4) - 2.0f) * 0.05f * row_scale;
      if (i % 97 == 13) g *= 12.0f;
      if (r % 16 == 3 && c < 256) g = 0.0f;
      if (r % 16 == 5 && c >= 256 && c < 512) g = 0.125f;
      v[static_cast<size_t>(i)] = g;
    }
  }
  return v;
}

std::vector<float> gaussian(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(rng);
  return v;
}

std::vector<uint8_t> quantize(uint32_t type, const std::vector<float>& x, int64_t n_per_row, const float* imatrix = nullptr) {
  const int64_t rows = static_cast<int64_t>(x.size()) / n_per_row;
  std::vector<uint8_t> q(row_size(type, n_per_row) * static_cast<size_t>(rows));
  quantize_rows(type, x.data(), q.data(), rows, n_per_row, imatrix);
  return q;
}

std::vector<float> dequantize(uint32_t type, const std::vector<uint8_t>& q, int64_t n_per_row, int64_t rows) {
  std::vector<float> y(static_cast<size_t>(n_per_row * rows));
  const size_t rs = row_size(type, n_per_row);
  for (int64_t r = 0; r < rows; ++r) dequantize_row(type, q.data() + rs * r, y.data() + n_per_row * r, n_per_row);
  return y;
}

// The shared distortion measure's relative RMSE of y against x.
double rel_rmse(const std::vector<float>& x, const std::vector<float>& y) {
  Distortion d;
  d.add(x, y);
  return d.relative_rmse();
}

uint64_t fnv1a(const std::vector<uint8_t>& b) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (uint8_t c : b) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// ---- sizes and errors ------------------------------------------------------------

TEST(KQuant, RowSizeFollowsGgmlTypeInfo) {
  for (uint32_t t : kWeightTypes) {
    const auto* info = ggml_type_info(t);
    EXPECT_EQ(row_size(t, 4096), 4096 / info->block_size * info->type_size) << tname(t);
  }
  EXPECT_EQ(row_size(gt::Q4_K, 512), 288u);
  EXPECT_EQ(row_size(gt::Q8_K, 256), 292u);
  EXPECT_EQ(row_size(gt::Q6_K, 256), 210u);
}

TEST(KQuant, BadRowLengthAndTypeThrow) {
  std::vector<float> x(300, 1.0f);
  std::vector<uint8_t> out(4096);
  EXPECT_QF_ERROR(quantize_rows(gt::Q4_K, x.data(), out.data(), 1, 300, nullptr), ErrorKind::InvalidInput,
                  "q4_K row length 300 is not a multiple of the block size 256");
  EXPECT_QF_ERROR(quantize_rows(gt::Q4_0, x.data(), out.data(), 1, 40, nullptr), ErrorKind::InvalidInput,
                  "q4_0 row length 40");
  EXPECT_QF_ERROR(row_size(gt::Q6_K, 100), ErrorKind::InvalidInput, "q6_K row length 100");
  EXPECT_QF_ERROR(dequantize_row(gt::Q2_K, out.data(), x.data(), 128), ErrorKind::InvalidInput, "q2_K row length 128");
  EXPECT_QF_ERROR(vec_dot(gt::Q5_K, 100, out.data(), out.data()), ErrorKind::InvalidInput, "q5_K row length 100");
  EXPECT_QF_ERROR(quantize_activation(gt::Q8_K, x.data(), out.data(), 32), ErrorKind::InvalidInput, "q8_K row length 32");
  EXPECT_QF_ERROR(quantize_rows(16 /*iq2_xxs*/, x.data(), out.data(), 1, 256, nullptr), ErrorKind::Unsupported, "iq2_xxs");
  EXPECT_QF_ERROR(quantize_rows(gt::Q8_K, x.data(), out.data(), 1, 256, nullptr), ErrorKind::Unsupported, "activation");
  EXPECT_QF_ERROR(quantize_activation(gt::Q4_0, x.data(), out.data(), 32), ErrorKind::Unsupported, "q4_0");
  EXPECT_QF_ERROR(vec_dot(999, 32, out.data(), out.data()), ErrorKind::Unsupported, "999");
  EXPECT_QF_ERROR(vec_dot_type(gt::Q8_K), ErrorKind::Unsupported, "q8_K");
}

// ---- byte identity with llama.cpp (golden hashes) ---------------------------------

// The importance matrix the golden hashes were made with: zero, heavy and
// light columns.
std::vector<float> golden_imatrix(int64_t npr) {
  std::vector<float> im(static_cast<size_t>(npr));
  for (int64_t j = 0; j < npr; ++j)
    im[static_cast<size_t>(j)] = (j % 101 == 0) ? 0.0f : (j % 7 == 0) ? 9.0f : 0.25f + static_cast<float>(j % 5);
  return im;
}

// FNV-1a of quantize_rows' bytes for synthetic_rows(128 x 4096, seed 7),
// without and with the imatrix below. The values were produced by llama.cpp's
// ggml_quantize_chunk (ggml-org/llama.cpp d3cf1f14, via ggml-org/ggml d99724f2)
// on the same floats and matched by this code (docs/kquants.md). The data is
// large enough that a changed float operation order in a scale search shows.
TEST(KQuant, BytesMatchLlamaCppGolden) {
  const int64_t npr = 4096, rows = 128;
  const auto x = synthetic_rows(rows, npr, 7);
  const std::vector<float> im = golden_imatrix(npr);
  const std::map<uint32_t, std::pair<uint64_t, uint64_t>> golden = {
      {gt::Q4_0, {0xe2fa5797f0d7627dULL, 0x9662675284744272ULL}},
      {gt::Q4_1, {0x1bdb39880d934120ULL, 0xf8592d53a74c7019ULL}},
      {gt::Q5_0, {0x227dffbf5347c579ULL, 0xbbc9e703d5b8277cULL}},
      {gt::Q5_1, {0x3e6a91e31ea06a33ULL, 0x75ddd556cc39aeb1ULL}},
      {gt::Q8_0, {0x518c156ece51bb59ULL, 0x518c156ece51bb59ULL}},
      {gt::Q2_K, {0xf43a55962e68d4e2ULL, 0x6d01fc9e00fcb091ULL}},
      {gt::Q3_K, {0x79ff4b04426c7041ULL, 0x764fac3d4f0072faULL}},
      {gt::Q4_K, {0x59718f3a5cbf7f39ULL, 0xc970252fbfb5b36dULL}},
      {gt::Q5_K, {0xa9cbf59bc02ce605ULL, 0x028f2d8e7782b75dULL}},
      {gt::Q6_K, {0x600e0d9801543848ULL, 0x9e8846f0b90ee398ULL}},
      {gt::F16, {0xa1bb1bab7424f218ULL, 0xa1bb1bab7424f218ULL}},
      {gt::BF16, {0x6fd1ef07eda23fe2ULL, 0x6fd1ef07eda23fe2ULL}},
  };
  for (const auto& [t, want] : golden) {
    EXPECT_EQ(fnv1a(quantize(t, x, npr)), want.first) << tname(t) << " without imatrix";
    EXPECT_EQ(fnv1a(quantize(t, x, npr, im.data())), want.second) << tname(t) << " with imatrix";
  }
}

// IQ4_NL against llama.cpp b4748 on the same floats: ggml_quantize_chunk
// (without and with the imatrix above; 7 extra scales tried) and the row
// converter that fills its KV cache, quantize_row_iq4_nl_ref (none tried).
TEST(KQuant, Iq4NlBytesMatchLlamaCppGolden) {
  const int64_t npr = 4096, rows = 128;
  const auto x = synthetic_rows(rows, npr, 7);
  const std::vector<float> im = golden_imatrix(npr);
  EXPECT_EQ(fnv1a(quantize(gt::IQ4_NL, x, npr)), 0xccbbf7b220cc26f8ULL);
  EXPECT_EQ(fnv1a(quantize(gt::IQ4_NL, x, npr, im.data())), 0x8c1fa6478b5c52caULL);
  // ggml's row converter leaves the codes of an all-zero block (scale 0)
  // as whatever its stack held, so the rows that start with one (r % 16 == 3)
  // are left out of this hash.
  std::vector<uint8_t> q, row(row_size(gt::IQ4_NL, npr));
  for (int64_t r = 0; r < rows; ++r) {
    if (r % 16 == 3) continue;
    quantize_row_iq4_nl_ref(x.data() + r * npr, row.data(), npr);
    q.insert(q.end(), row.begin(), row.end());
  }
  EXPECT_EQ(fnv1a(q), 0x4720a15cc74dec11ULL);
  // Decoding: d * level; the dot against Q8_0 equals the dequantized float dot
  // within the activation's rounding.
  const std::vector<float> y = dequantize(gt::IQ4_NL, quantize(gt::IQ4_NL, x, npr), npr, rows);
  EXPECT_LT(rel_rmse(x, y), 0.12);
}

// ---- round trips -------------------------------------------------------------------

TEST(KQuant, RoundTripErrorByBitWidth) {
  const int64_t npr = 4096, rows = 8;
  const auto x = gaussian(npr * rows, 11);
  // Relative RMSE bounds on Gaussian data, ~15% above the measured values
  // (f16 2.1e-4, bf16 1.7e-3, q8_0 0.0054, q6_K 0.018, q5_K 0.036, q5_1 0.038,
  // q5_0 0.043, q4_K 0.072, q4_1 0.079, q4_0 0.086, q3_K 0.151, q2_K 0.296).
  const std::map<uint32_t, double> bound = {
      {gt::F32, 1e-7},   {gt::F16, 2.5e-4}, {gt::BF16, 2e-3},  {gt::Q8_0, 0.0062}, {gt::Q6_K, 0.021},
      {gt::Q5_1, 0.044}, {gt::Q5_0, 0.050}, {gt::Q5_K, 0.042}, {gt::Q4_1, 0.091},  {gt::Q4_0, 0.099},
      {gt::Q4_K, 0.083}, {gt::Q3_K, 0.175}, {gt::Q2_K, 0.34}};
  std::map<uint32_t, double> err;
  for (uint32_t t : kWeightTypes) {
    err[t] = rel_rmse(x, dequantize(t, quantize(t, x, npr), npr, rows));
    EXPECT_LT(err[t], bound.at(t)) << tname(t);
  }
  // More bits, less error.
  const std::vector<uint32_t> kseq = {gt::F16, gt::Q8_0, gt::Q6_K, gt::Q5_K, gt::Q4_K, gt::Q3_K, gt::Q2_K};
  for (size_t i = 1; i < kseq.size(); ++i) EXPECT_LT(err[kseq[i - 1]], err[kseq[i]]) << tname(kseq[i]);
  EXPECT_LT(err[gt::Q5_0], err[gt::Q4_0]);
  EXPECT_LT(err[gt::Q5_1], err[gt::Q4_1]);
  EXPECT_LT(err[gt::Q8_0], err[gt::Q5_0]);
  EXPECT_LT(err[gt::Q6_K], err[gt::Q5_0]);
}

TEST(KQuant, ZeroBlocksDecodeToZero) {
  const std::vector<float> x(512, 0.0f);
  const std::vector<float> im(512, 1.0f);
  for (uint32_t t : kWeightTypes) {
    for (const float* w : {static_cast<const float*>(nullptr), im.data()}) {
      const auto y = dequantize(t, quantize(t, x, 512, w), 512, 1);
      size_t nonzero = 0;
      for (float v : y) nonzero += v != 0.0f;
      EXPECT_EQ(nonzero, 0u) << tname(t) << (w ? " imatrix" : "");
    }
  }
}

TEST(KQuant, ConstantBlocks) {
  for (float c : {0.37f, -1.25f}) {
    const std::vector<float> x(512, c);
    for (uint32_t t : kWeightTypes) {
      const auto y = dequantize(t, quantize(t, x, 512), 512, 1);
      // Legacy types hit the constant up to fp16 rounding of the scale; the
      // k-quants within their 6-bit scale grid.
      const float rel = t == gt::BF16 ? 4e-3f : ggml_type_info(t)->block_size <= 32 ? 1e-3f : 0.04f;
      float worst = 0;
      for (float v : y) worst = std::max(worst, std::fabs(v - c));
      EXPECT_LE(worst, std::fabs(c) * rel) << tname(t) << " c=" << c;
    }
  }
}

TEST(KQuant, MaxAbsElementIsExactUpToScaleRounding) {
  auto x = gaussian(32 * 64, 5);
  for (uint32_t t : {gt::Q8_0, gt::Q4_0, gt::Q5_0}) {
    const auto y = dequantize(t, quantize(t, x, 32 * 64), 32 * 64, 1);
    for (int b = 0; b < 64; ++b) {
      int imax = 0;
      for (int j = 1; j < 32; ++j)
        if (std::fabs(x[32 * b + j]) > std::fabs(x[32 * b + imax])) imax = j;
      const float v = x[32 * b + imax];
      EXPECT_NEAR(y[32 * b + imax], v, std::fabs(v) * 0.0005f) << tname(t) << " block " << b;
    }
  }
}

// ---- decoding formulas on hand-built blocks ----------------------------------------

uint16_t h(float f) { return f32_to_f16(f); }

TEST(KQuant, DecodeHandBuiltLegacyBlocks) {
  std::vector<float> y(32);
  {
    BlockQ4_0 b{h(0.5f), {}};
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    dequantize_row(gt::Q4_0, &b, y.data(), 32);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(y[j], (j - 8) * 0.5f);
      EXPECT_EQ(y[j + 16], (7 - j) * 0.5f);
    }
  }
  {
    BlockQ4_1 b{h(0.25f), h(-1.0f), {}};
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    dequantize_row(gt::Q4_1, &b, y.data(), 32);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(y[j], j * 0.25f - 1.0f);
      EXPECT_EQ(y[j + 16], (15 - j) * 0.25f - 1.0f);
    }
  }
  {
    // Q5_0: 5th bits in qh (bit j for element j); qh = 0xA5A5F00F.
    BlockQ5_0 b{h(2.0f), {0x0F, 0xF0, 0xA5, 0xA5}, {}};
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(((j * 3) & 15) | ((j ^ 9) << 4));
    dequantize_row(gt::Q5_0, &b, y.data(), 32);
    const uint32_t qh = 0xA5A5F00Fu;
    for (int j = 0; j < 32; ++j) {
      const int low = j < 16 ? ((j * 3) & 15) : ((j - 16) ^ 9);
      const int code = low + 16 * static_cast<int>((qh >> j) & 1);
      EXPECT_EQ(y[j], (code - 16) * 2.0f) << j;
    }
    BlockQ5_1 c{h(0.5f), h(3.0f), {0x0F, 0xF0, 0xA5, 0xA5}, {}};
    std::memcpy(c.qs, b.qs, 16);
    dequantize_row(gt::Q5_1, &c, y.data(), 32);
    for (int j = 0; j < 32; ++j) {
      const int low = j < 16 ? ((j * 3) & 15) : ((j - 16) ^ 9);
      EXPECT_EQ(y[j], (low + 16 * static_cast<int>((qh >> j) & 1)) * 0.5f + 3.0f) << j;
    }
  }
  {
    BlockQ8_0 b{h(0.125f), {}};
    for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(j * 8 - 128);
    dequantize_row(gt::Q8_0, &b, y.data(), 32);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], (j * 8 - 128) * 0.125f);
  }
}

TEST(KQuant, DecodeHandBuiltKBlocks) {
  std::vector<float> y(256);
  {
    // Q2_K: element e uses scales[e/16] (low nibble scale, high nibble min) and
    // bits 2*((e%128)/32) of qs[32*(e/128) + e%32].
    BlockQ2_K b{};
    for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<uint8_t>((j % 16) | ((15 - j) << 4));
    for (int k = 0; k < 64; ++k) b.qs[k] = static_cast<uint8_t>(k * 37 + 11);
    b.d = h(0.5f);
    b.dmin = h(0.25f);
    dequantize_row(gt::Q2_K, &b, y.data(), 256);
    for (int e = 0; e < 256; ++e) {
      const int q = (b.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
      const int j = e / 16;
      EXPECT_EQ(y[e], 0.5f * j * q - 0.25f * (15 - j)) << e;
    }
    // Spot values: e=0 -> q = 11 & 3 = 3, scale 0, min 15 -> -3.75.
    EXPECT_EQ(y[0], -3.75f);
  }
  {
    // Q3_K: scale j = (low 4 bits: scales[j] or scales[j-8]>>4) | (2 bits of scales[8+j%4] at 2*(j/4)) << 4, minus 32;
    // value = code - 4 + 4*hbit, hbit = hmask[e%32] bit e/32.
    BlockQ3_K b{};
    const int want_scale[16] = {-32, -20, -7, -1, 0, 1, 5, 9, 13, 17, 21, 25, 28, 30, 31, -16};
    for (int j = 0; j < 16; ++j) {
      const int code = want_scale[j] + 32;
      if (j < 8)
        b.scales[j] |= static_cast<uint8_t>(code & 0xF);
      else
        b.scales[j - 8] |= static_cast<uint8_t>((code & 0xF) << 4);
      b.scales[8 + j % 4] |= static_cast<uint8_t>((code >> 4) << (2 * (j / 4)));
    }
    for (int k = 0; k < 32; ++k) b.hmask[k] = static_cast<uint8_t>(k * 29 + 3);
    for (int k = 0; k < 64; ++k) b.qs[k] = static_cast<uint8_t>(k * 53 + 7);
    b.d = h(0.125f);
    for (int j = 0; j < 16; ++j) EXPECT_EQ(q3k_scale(j, b.scales), want_scale[j]);
    dequantize_row(gt::Q3_K, &b, y.data(), 256);
    for (int e = 0; e < 256; ++e) {
      const int q = (b.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
      const int hb = (b.hmask[e % 32] >> (e / 32)) & 1;
      EXPECT_EQ(y[e], 0.125f * want_scale[e / 16] * (q - 4 + 4 * hb)) << e;
    }
  }
  // Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scale and min.
  const uint8_t sc[8] = {1, 63, 17, 32, 5, 48, 33, 60};
  const uint8_t mn[8] = {0, 2, 63, 40, 31, 7, 16, 59};
  auto pack = [&](uint8_t* s) {
    for (int j = 0; j < 4; ++j) {
      s[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
      s[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
      s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
    }
  };
  {
    BlockQ4_K b{};
    b.d = h(0.5f);
    b.dmin = h(0.125f);
    pack(b.scales);
    for (int k = 0; k < 128; ++k) b.qs[k] = static_cast<uint8_t>(k * 97 + 5);
    for (int j = 0; j < 8; ++j) {
      uint8_t s, m;
      unpack_scale_min_k4(j, b.scales, &s, &m);
      EXPECT_EQ(s, sc[j]);
      EXPECT_EQ(m, mn[j]);
    }
    dequantize_row(gt::Q4_K, &b, y.data(), 256);
    for (int e = 0; e < 256; ++e) {
      const int c = e / 64, l = e % 64;
      const int q = l < 32 ? (b.qs[32 * c + l] & 0xF) : (b.qs[32 * c + l - 32] >> 4);
      EXPECT_EQ(y[e], 0.5f * sc[e / 32] * q - 0.125f * mn[e / 32]) << e;
    }
    BlockQ5_K b5{};
    b5.d = h(0.5f);
    b5.dmin = h(0.125f);
    std::memcpy(b5.scales, b.scales, 12);
    std::memcpy(b5.qs, b.qs, 128);
    for (int k = 0; k < 32; ++k) b5.qh[k] = static_cast<uint8_t>(k * 71 + 13);
    dequantize_row(gt::Q5_K, &b5, y.data(), 256);
    for (int e = 0; e < 256; ++e) {
      const int c = e / 64, l = e % 64;
      const int q = (l < 32 ? (b.qs[32 * c + l] & 0xF) : (b.qs[32 * c + l - 32] >> 4)) + 16 * ((b5.qh[e % 32] >> (e / 32)) & 1);
      EXPECT_EQ(y[e], 0.5f * sc[e / 32] * q - 0.125f * mn[e / 32]) << e;
    }
  }
  {
    // Q6_K: element 128h + 32t + l: low 4 bits from ql[64h + l + 32(t&1)] (high nibble for t >= 2),
    // top 2 bits from qh[32h + l] >> 2t; value (code - 32) * d * scales[e/16].
    BlockQ6_K b{};
    for (int k = 0; k < 128; ++k) b.ql[k] = static_cast<uint8_t>(k * 31 + 1);
    for (int k = 0; k < 64; ++k) b.qh[k] = static_cast<uint8_t>(k * 59 + 17);
    for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<int8_t>(j * 17 - 128);
    b.d = h(0.0625f);
    dequantize_row(gt::Q6_K, &b, y.data(), 256);
    for (int e = 0; e < 256; ++e) {
      const int hh = e / 128, t = (e % 128) / 32, l = e % 32;
      const uint8_t lo = b.ql[64 * hh + l + 32 * (t & 1)];
      const int code = (t < 2 ? (lo & 0xF) : (lo >> 4)) | (((b.qh[32 * hh + l] >> (2 * t)) & 3) << 4);
      EXPECT_EQ(y[e], 0.0625f * b.scales[e / 16] * (code - 32)) << e;
    }
  }
  {
    BlockQ8_K b{};
    b.d = 0.01f;
    for (int k = 0; k < 256; ++k) b.qs[k] = static_cast<int8_t>(k - 128);
    dequantize_row(gt::Q8_K, &b, y.data(), 256);
    for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], 0.01f * (e - 128));
  }
}

TEST(KQuant, ActivationQ8KHasBlockSums) {
  const auto x = gaussian(512, 3);
  std::vector<BlockQ8_K> a(2);
  quantize_activation(gt::Q8_K, x.data(), a.data(), 512);
  for (const auto& b : a) {
    int amax = 0;
    for (int j = 0; j < 16; ++j) {
      int s = 0;
      for (int l = 0; l < 16; ++l) {
        s += b.qs[16 * j + l];
        amax = std::max(amax, std::abs(int(b.qs[16 * j + l])));
      }
      EXPECT_EQ(s, b.bsums[j]);
    }
    EXPECT_EQ(amax, 127);
  }
  std::vector<float> y(512);
  dequantize_row(gt::Q8_K, a.data(), y.data(), 512);
  EXPECT_LT(rel_rmse(x, y), 0.008);  // measured 0.0066: one scale per 256 values
}

// ---- importance matrix ------------------------------------------------------------

TEST(KQuant, ImatrixLowersErrorOnImportantColumns) {
  const int64_t npr = 1024, rows = 16;
  const auto x = gaussian(npr * rows, 21);
  std::vector<float> im(npr, 0.01f);
  for (int64_t j = 0; j < npr; ++j)
    if (j % 8 == 0) im[static_cast<size_t>(j)] = 100.0f;  // every 8th column matters
  for (uint32_t t : kQuantTypes) {
    if (t == gt::Q8_0) continue;  // llama.cpp ignores the imatrix for Q8_0
    auto weighted_err = [&](const float* w) {
      const auto y = dequantize(t, quantize(t, x, npr, w), npr, rows);
      double e = 0;
      for (size_t i = 0; i < x.size(); ++i) e += im[i % npr] * (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
      return e;
    };
    const double plain = weighted_err(nullptr), weighted = weighted_err(im.data());
    EXPECT_LT(weighted, 0.9 * plain) << tname(t) << ": " << weighted << " vs " << plain;
  }
}

// ---- dot products ------------------------------------------------------------------

struct DotCase {
  std::vector<uint8_t> w, a;
  std::vector<float> wf, xf;
};

DotCase make_dot_case(uint32_t t, int64_t n, uint32_t seed) {
  DotCase c;
  c.wf = gaussian(n, seed, 0.02f);
  for (int64_t i = 0; i < n; i += 61) c.wf[static_cast<size_t>(i)] *= 15.0f;  // outliers
  c.xf = gaussian(n, seed + 1000);
  c.w = quantize(t, c.wf, n);
  const uint32_t at = vec_dot_type(t);
  c.a.resize(row_size(at, n));
  quantize_activation(at, c.xf.data(), c.a.data(), n);
  return c;
}

TEST(KQuant, VecDotTypes) {
  EXPECT_EQ(vec_dot_type(gt::Q4_0), gt::Q8_0);
  EXPECT_EQ(vec_dot_type(gt::Q5_0), gt::Q8_0);
  EXPECT_EQ(vec_dot_type(gt::Q8_0), gt::Q8_0);
  EXPECT_EQ(vec_dot_type(gt::Q4_1), gt::Q8_1);
  EXPECT_EQ(vec_dot_type(gt::Q5_1), gt::Q8_1);
  for (uint32_t t : {gt::Q2_K, gt::Q3_K, gt::Q4_K, gt::Q5_K, gt::Q6_K}) EXPECT_EQ(vec_dot_type(t), gt::Q8_K);
  for (uint32_t t : {gt::F32, gt::F16, gt::BF16}) EXPECT_EQ(vec_dot_type(t), t);
}

// vec_dot obeys the library's one SIMD switch, and set_simd_level takes effect
// at once: each level's kernels at that level, the scalar code at scalar.
TEST(KQuant, DotLevelFollowsTheSimdSwitch) {
  for (SimdLevel l : {SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512}) {
    if (l > best_simd_level()) continue;
    test::ScopedSimdLevel at(l);
    EXPECT_EQ(qf::simd_level(), l);
  }
  // Each level has its own kernels: Q4_K, Q5_K and Q6_K one per level, the
  // other types their AVX2 kernel at avx512 too.
  auto kernel_at = [](SimdLevel l, uint32_t t) {
    test::ScopedSimdLevel at(l);
    return dot_kernel(t, 256);
  };
  const SimdLevel best = best_simd_level();
  for (uint32_t t : {gt::Q4_K, gt::Q5_K, gt::Q6_K, gt::Q8_0, gt::F16}) {
    if (best >= SimdLevel::Avx2) {
      EXPECT_NE(kernel_at(SimdLevel::Scalar, t), kernel_at(SimdLevel::Avx2, t)) << tname(t);
    }
    if (best < SimdLevel::Avx512) continue;
    const bool own = t == gt::Q4_K || t == gt::Q5_K || t == gt::Q6_K;
    EXPECT_EQ(kernel_at(SimdLevel::Avx512, t) != kernel_at(SimdLevel::Avx2, t), own) << tname(t);
  }
}

// SIMD against the scalar reference, at each level (skipped at scalar, where
// vec_dot is the reference).
class KQuantLevels : public test::SimdVsScalarFixture {};
INSTANTIATE_TEST_SUITE_P(KQuant, KQuantLevels, test::all_simd_levels(), test::simd_case_name);

// SIMD and scalar agree bit for bit (both sum codes exactly in integers and do
// the float steps in one fixed order); lengths cover partial 8-block groups
// and float tails.
TEST_P(KQuantLevels, VecDotSimdMatchesScalarExactly) {
  for (uint32_t t : kWeightTypes) {
    const int64_t bs = ggml_type_info(t)->block_size;
    for (int64_t n : {int64_t{4096}, bs * 13, bs == 1 ? int64_t{45} : bs * 3}) {
      for (uint32_t seed : {1u, 2u, 3u}) {
        const DotCase c = make_dot_case(t, n, seed * 7 + static_cast<uint32_t>(n));
        const float fast = vec_dot(t, n, c.w.data(), c.a.data());
        const float ref = vec_dot_ref(t, n, c.w.data(), c.a.data());
        EXPECT_EQ(fast, ref) << tname(t) << " n=" << n << " seed=" << seed;
      }
    }
  }
}

// Quantization at this level gives the scalar code's bytes (the scale
// searches run 8 groups per AVX2 pass): every type, with and without an
// imatrix, on rows with zero and constant blocks, outliers and a wide range of
// scales.
TEST_P(KQuantLevels, QuantizeSimdMatchesScalarBytes) {
  const int64_t npr = 1024, rows = 48;
  auto x = synthetic_rows(rows, npr, 3);
  const auto g = gaussian(npr * 8, 5, 3.0f);
  std::copy(g.begin(), g.end(), x.begin());
  for (int64_t c = 0; c < npr; ++c) x[static_cast<size_t>(9 * npr + c)] = -std::fabs(x[static_cast<size_t>(9 * npr + c)]);
  std::vector<float> im(npr);
  for (int64_t j = 0; j < npr; ++j) im[static_cast<size_t>(j)] = (j % 37 == 0) ? 0.0f : 0.5f + static_cast<float>(j % 11);
  for (uint32_t t : kQuantTypes) {
    for (const float* imp : {static_cast<const float*>(nullptr), static_cast<const float*>(im.data())}) {
      const auto fast = quantize(t, x, npr, imp);
      std::vector<uint8_t> ref;
      {
        test::ScopedSimdLevel scalar(SimdLevel::Scalar);
        ref = quantize(t, x, npr, imp);
      }
      EXPECT_TRUE(fast == ref) << tname(t) << (imp ? " with" : " without") << " imatrix";
    }
  }
}

// Extreme codes: random bytes with sane scales exercise saturation-prone paths
// (maddubs with 6-bit codes, -128 scales, full-range int8 activations).
TEST_P(KQuantLevels, VecDotSimdMatchesScalarOnRandomBytes) {
  std::mt19937 rng(99);
  const int64_t n = 2048;
  for (uint32_t t : kQuantTypes) {
    std::vector<uint8_t> w(row_size(t, n)), a(row_size(vec_dot_type(t), n));
    for (auto& b : w) b = static_cast<uint8_t>(rng());
    for (auto& b : a) b = static_cast<uint8_t>(rng());
    // Give every fp16/f32 scale field a finite value; keep int8 activations in [-127, 127].
    const auto* info = ggml_type_info(t);
    const size_t wbs = info->type_size;
    for (size_t off = 0; off < w.size(); off += wbs) {
      const uint16_t d = h(0.01f), m = h(-0.02f);
      switch (t) {
        case gt::Q2_K: std::memcpy(&w[off + 80], &d, 2); std::memcpy(&w[off + 82], &m, 2); break;
        case gt::Q3_K: std::memcpy(&w[off + 108], &d, 2); break;
        case gt::Q6_K: std::memcpy(&w[off + 208], &d, 2); break;
        case gt::Q4_K: case gt::Q5_K: case gt::Q4_1: case gt::Q5_1:
          std::memcpy(&w[off], &d, 2); std::memcpy(&w[off + 2], &m, 2); break;
        default: std::memcpy(&w[off], &d, 2);
      }
    }
    const uint32_t at = vec_dot_type(t);
    const size_t abs_ = ggml_type_info(at)->type_size;
    for (size_t off = 0; off < a.size(); off += abs_) {
      if (at == gt::Q8_K) {
        auto* b = reinterpret_cast<BlockQ8_K*>(&a[off]);
        b->d = 0.003f;
        for (int j = 0; j < 16; ++j) {
          int s = 0;
          for (int l = 0; l < 16; ++l) {
            if (b->qs[16 * j + l] == -128) b->qs[16 * j + l] = -127;
            s += b->qs[16 * j + l];
          }
          b->bsums[j] = static_cast<int16_t>(s);
        }
      } else {
        const uint16_t d = h(0.02f), s = h(0.5f);
        std::memcpy(&a[off], &d, 2);
        if (at == gt::Q8_1) std::memcpy(&a[off + 2], &s, 2);
        for (size_t j = off + (at == gt::Q8_1 ? 4 : 2); j < off + abs_; ++j)
          if (a[j] == 0x80) a[j] = 0x81;
      }
    }
    EXPECT_EQ(vec_dot(t, n, w.data(), a.data()), vec_dot_ref(t, n, w.data(), a.data())) << tname(t);
  }
}

// vec_dot against the float dot of the dequantized weights with the original
// activations: the difference is the activation quantization (8-bit), bounded
// relative to |w|*|x|.
TEST(KQuant, VecDotMatchesDequantizedFloatDot) {
  const int64_t n = 4096;
  for (uint32_t t : kWeightTypes) {
    for (uint32_t seed : {5u, 6u}) {
      const DotCase c = make_dot_case(t, n, seed);
      std::vector<float> wd(static_cast<size_t>(n));
      dequantize_row(t, c.w.data(), wd.data(), n);
      double dot = 0, nw = 0, nx = 0;
      for (int64_t i = 0; i < n; ++i) {
        dot += double(wd[i]) * c.xf[i];
        nw += double(wd[i]) * wd[i];
        nx += double(c.xf[i]) * c.xf[i];
      }
      const double scale = std::sqrt(nw * nx);
      // F32: the kernels sum element i into partial i % 32 (n / 32 products
      // each, rounded), then reduce the 32 partials in 5 levels: within
      // gamma(n / 32 + 6) sum |w x| <= gamma(n / 32 + 6) |w| |x| of the exact
      // dot. The other types are dominated by the activation's rounding to
      // f16 (2^-11 relative), bf16 (2^-8) or 8 bits per block.
      const double u = 1.0 / 16777216.0, k = static_cast<double>(n) / 32 + 6;
      const double tol = (t == gt::F32 ? k * u / (1 - k * u) : t == gt::F16 ? 2e-3 : t == gt::BF16 ? 1e-2 : 1.5e-2) * scale;
      EXPECT_NEAR(vec_dot(t, n, c.w.data(), c.a.data()), dot, tol) << tname(t) << " seed " << seed;
    }
  }
}

}  // namespace
}  // namespace qf::kquants
