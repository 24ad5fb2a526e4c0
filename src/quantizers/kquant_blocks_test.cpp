// The shared block decoders against references that walk each block the way
// ggml's dequantize_row_* loops do (per 64 or 128 elements, shifting masks),
// a structure different from the per-element field accessors of
// kquant_blocks.h, so a wrong bit position fails here. Blocks are random
// bytes with finite fp16 scales, so every code, scale and sign occurs.
#include "quantizers/kquant_blocks.h"

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "quantizers/kquants.h"

namespace qf::kquants {
namespace {

constexpr int kBlocks = 2000;

// Random bytes; every fp16 field replaced by a finite value (sign included).
template <class Block>
Block random_block(std::mt19937& rng, std::initializer_list<uint16_t Block::*> halves) {
  Block b;
  auto* p = reinterpret_cast<uint8_t*>(&b);
  for (size_t i = 0; i < sizeof b; ++i) p[i] = static_cast<uint8_t>(rng());
  for (auto h : halves) b.*h = static_cast<uint16_t>(f32_to_f16(std::ldexp(static_cast<float>(rng() % 2048) - 1024.0f, -14)));
  return b;
}

void expect_same_floats(const float* got, const float* want, int n, const char* what, int block) {
  for (int i = 0; i < n; ++i) {
    uint32_t a, b;
    std::memcpy(&a, got + i, 4);
    std::memcpy(&b, want + i, 4);
    ASSERT_EQ(a, b) << what << " block " << block << " element " << i << ": " << got[i] << " vs " << want[i];
  }
}

// Decodes with `decode`, compares with `reference`, and checks that the
// library's dequantize_row of the same bytes equals both.
template <class Block, class Ref>
void check(uint32_t type, int n, const char* what, std::initializer_list<uint16_t Block::*> halves, Ref reference) {
  std::mt19937 rng(7);
  std::vector<Block> blocks;
  for (int k = 0; k < kBlocks; ++k) blocks.push_back(random_block<Block>(rng, halves));
  std::vector<float> got(static_cast<size_t>(n)), want(static_cast<size_t>(n)), row(static_cast<size_t>(n) * kBlocks);
  dequantize_row(type, blocks.data(), row.data(), static_cast<int64_t>(n) * kBlocks);
  for (int k = 0; k < kBlocks; ++k) {
    dequantize_block(blocks[static_cast<size_t>(k)], got.data());
    reference(blocks[static_cast<size_t>(k)], want.data());
    expect_same_floats(got.data(), want.data(), n, what, k);
    expect_same_floats(row.data() + static_cast<size_t>(k) * n, want.data(), n, what, k);
  }
}

TEST(KQuantBlocks, LegacyBlocksMatchTheLayout) {
  check<BlockQ4_0>(ggml_type::Q4_0, 32, "q4_0", {&BlockQ4_0::d}, [](const BlockQ4_0& b, float* y) {
    const float d = f16_to_f32(b.d);
    for (int i = 0; i < 32; ++i) y[i] = static_cast<float>(((b.qs[i % 16] >> (4 * (i / 16))) & 15) - 8) * d;
  });
  check<BlockQ4_1>(ggml_type::Q4_1, 32, "q4_1", {&BlockQ4_1::d, &BlockQ4_1::m}, [](const BlockQ4_1& b, float* y) {
    const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
    for (int i = 0; i < 32; ++i) {
      const float p = static_cast<float>((b.qs[i % 16] >> (4 * (i / 16))) & 15) * d;
      y[i] = p + m;
    }
  });
  auto q5 = [](const uint8_t* qs, const uint8_t* qh, int i) {
    return ((qs[i % 16] >> (4 * (i / 16))) & 15) | (((qh[i / 8] >> (i % 8)) & 1) << 4);
  };
  check<BlockQ5_0>(ggml_type::Q5_0, 32, "q5_0", {&BlockQ5_0::d}, [&](const BlockQ5_0& b, float* y) {
    const float d = f16_to_f32(b.d);
    for (int i = 0; i < 32; ++i) y[i] = static_cast<float>(q5(b.qs, b.qh, i) - 16) * d;
  });
  check<BlockQ5_1>(ggml_type::Q5_1, 32, "q5_1", {&BlockQ5_1::d, &BlockQ5_1::m}, [&](const BlockQ5_1& b, float* y) {
    const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
    for (int i = 0; i < 32; ++i) {
      const float p = static_cast<float>(q5(b.qs, b.qh, i)) * d;
      y[i] = p + m;
    }
  });
  check<BlockQ8_0>(ggml_type::Q8_0, 32, "q8_0", {&BlockQ8_0::d}, [](const BlockQ8_0& b, float* y) {
    for (int i = 0; i < 32; ++i) y[i] = static_cast<float>(b.qs[i]) * f16_to_f32(b.d);
  });
  check<BlockQ8_1>(ggml_type::Q8_1, 32, "q8_1", {&BlockQ8_1::d, &BlockQ8_1::s}, [](const BlockQ8_1& b, float* y) {
    for (int i = 0; i < 32; ++i) y[i] = static_cast<float>(b.qs[i]) * f16_to_f32(b.d);
  });
}

// 6-bit scale and min of Q4_K/Q5_K sub-block j from the 12 packed bytes: the
// low 6 bits of bytes 0-3 (scales 0-3) and 4-7 (mins 0-3); for 4-7, a nibble
// of bytes 8-11 plus the top two bits of bytes 0-3 (scales) or 4-7 (mins).
void ref_scale_min(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] % 64;
    *m = s[4 + j] % 64;
  } else {
    *sc = (s[8 + j - 4] % 16) + 16 * (s[j - 4] / 64);
    *m = (s[8 + j - 4] / 16) + 16 * (s[j] / 64);
  }
}

TEST(KQuantBlocks, KQuantBlocksMatchTheLayout) {
  check<BlockQ2_K>(ggml_type::Q2_K, 256, "q2_K", {&BlockQ2_K::d, &BlockQ2_K::dmin}, [](const BlockQ2_K& b, float* y) {
    const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
    for (int half = 0; half < 2; ++half)        // 128 elements from 32 bytes of qs
      for (int shift = 0; shift < 8; shift += 2)  // four 2-bit planes of 32 elements
        for (int l = 0; l < 32; ++l) {
          const int e = 128 * half + 16 * shift + l, sb = e / 16;
          const float dl = d * static_cast<float>(b.scales[sb] % 16), ml = dmin * static_cast<float>(b.scales[sb] / 16);
          const float p = dl * static_cast<float>((b.qs[32 * half + l] >> shift) & 3);
          y[e] = p - ml;
        }
  });
  check<BlockQ3_K>(ggml_type::Q3_K, 256, "q3_K", {&BlockQ3_K::d}, [](const BlockQ3_K& b, float* y) {
    const float d = f16_to_f32(b.d);
    for (int e = 0; e < 256; ++e) {
      const int sb = e / 16;
      // 4 low bits: nibble sb%8 of bytes 0-7; 2 high bits: bits 2*(sb/4) of byte 8 + sb%4.
      const int low = sb < 8 ? b.scales[sb] % 16 : b.scales[sb - 8] / 16;
      const int scale = (low | (((b.scales[8 + sb % 4] >> (2 * (sb / 4))) & 3) << 4)) - 32;
      const int plane = (e % 128) / 32, l = e % 32;
      const int q = ((b.qs[32 * (e / 128) + l] >> (2 * plane)) & 3) - ((b.hmask[l] >> (e / 32)) & 1 ? 0 : 4);
      y[e] = (d * static_cast<float>(scale)) * static_cast<float>(q);
    }
  });
  check<BlockQ4_K>(ggml_type::Q4_K, 256, "q4_K", {&BlockQ4_K::d, &BlockQ4_K::dmin}, [](const BlockQ4_K& b, float* y) {
    const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
    for (int e = 0; e < 256; ++e) {
      int sc, m;
      ref_scale_min(b.scales, e / 32, &sc, &m);
      const int q = (b.qs[32 * (e / 64) + e % 32] >> (4 * ((e / 32) % 2))) & 15;
      const float p = (d * static_cast<float>(sc)) * static_cast<float>(q);
      y[e] = p - dmin * static_cast<float>(m);
    }
  });
  check<BlockQ5_K>(ggml_type::Q5_K, 256, "q5_K", {&BlockQ5_K::d, &BlockQ5_K::dmin}, [](const BlockQ5_K& b, float* y) {
    const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
    for (int e = 0; e < 256; ++e) {
      int sc, m;
      ref_scale_min(b.scales, e / 32, &sc, &m);
      const int q = ((b.qs[32 * (e / 64) + e % 32] >> (4 * ((e / 32) % 2))) & 15) | (((b.qh[e % 32] >> (e / 32)) & 1) << 4);
      const float p = (d * static_cast<float>(sc)) * static_cast<float>(q);
      y[e] = p - dmin * static_cast<float>(m);
    }
  });
  check<BlockQ6_K>(ggml_type::Q6_K, 256, "q6_K", {&BlockQ6_K::d}, [](const BlockQ6_K& b, float* y) {
    const float d = f16_to_f32(b.d);
    for (int half = 0; half < 2; ++half)
      for (int l = 0; l < 32; ++l) {
        const uint8_t* ql = b.ql + 64 * half;
        const uint8_t hb = b.qh[32 * half + l];
        const int q[4] = {(ql[l] & 15) | ((hb & 3) << 4), (ql[l + 32] & 15) | (((hb >> 2) & 3) << 4),
                          (ql[l] >> 4) | (((hb >> 4) & 3) << 4), (ql[l + 32] >> 4) | (((hb >> 6) & 3) << 4)};
        for (int t = 0; t < 4; ++t) {
          const int e = 128 * half + 32 * t + l;
          y[e] = d * static_cast<float>(b.scales[e / 16]) * static_cast<float>(q[t] - 32);
        }
      }
  });
  check<BlockQ8_K>(ggml_type::Q8_K, 256, "q8_K", {}, [](const BlockQ8_K& b, float* y) {
    for (int e = 0; e < 256; ++e) y[e] = b.d * static_cast<float>(b.qs[e]);
  });
}

}  // namespace
}  // namespace qf::kquants
