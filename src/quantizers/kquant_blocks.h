// The GGUF block layouts (ggml's legacy Q4_0..Q8_1 and the k-quants
// Q2_K..Q8_K) and the decoding of one block to floats. Host and device
// (core/hd.h): the CPU's kquants::dequantize_row and a GPU kernel decode
// with the same functions; quantizers/kquant_blocks_test.cpp checks them.
//
// Every decoder gives the floats ggml's dequantize_row_* gives, bit for bit:
// the same operations in the same order, and a*b+c never fused into an FMA
// (hd::mul_add_unfused; kquants.cpp, which calls them on the CPU, turns
// contraction off, and the library's baseline x86-64 target has no FMA).
#pragma once

#include <cstdint>

#include "core/f16.h"
#include "core/hd.h"

namespace qf::kquants {

constexpr int kLegacyBlock = 32;  // elements per Q4_0 .. Q8_1 block
constexpr int kSuperBlock = 256;  // elements per Q2_K .. Q8_K super-block

// ---- block layouts (byte-packed, little-endian; fp16 fields as raw bits) ----
#pragma pack(push, 1)
struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };                     // x = (q - 8) d
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[16]; };                  // x = q d + m
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };      // x = (q - 16) d
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; };   // x = q d + m
struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };                      // x = q d
struct BlockQ8_1 { uint16_t d, s; int8_t qs[32]; };                   // s = d * sum(q)
struct BlockIQ4_NL { uint16_t d; uint8_t qs[16]; };                   // x = d * iq4nl_value(q)
struct BlockQ2_K { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; };
struct BlockQ3_K { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; };
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
struct BlockQ6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };
struct BlockQ8_K { float d; int8_t qs[256]; int16_t bsums[16]; };    // bsums: sums of 16 qs
#pragma pack(pop)
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36, "legacy block sizes");
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292, "k-quant block sizes");

// ---- packed fields ------------------------------------------------------------

// 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K `scales[12]` array.
QF_HD inline void unpack_scale_min_k4(int j, const uint8_t* s, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// 6-bit scale of sub-block j (0..15) of a Q3_K `scales[12]` array, minus 32.
QF_HD inline int q3k_scale(int j, const uint8_t* s) {
  const int lo = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
  const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

// The 32 high bits of a Q5_0/Q5_1 block, little-endian as ggml stores them.
QF_HD inline uint32_t q5_high_bits(const uint8_t* qh) {
  return static_cast<uint32_t>(qh[0]) | static_cast<uint32_t>(qh[1]) << 8 | static_cast<uint32_t>(qh[2]) << 16 |
         static_cast<uint32_t>(qh[3]) << 24;
}

// 5-bit codes of elements j and j+16 (j < 16) of a Q5_0/Q5_1 block.
QF_HD inline int q5_lo(const uint8_t* qs, uint32_t qh, int j) { return (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4); }
QF_HD inline int q5_hi(const uint8_t* qs, uint32_t qh, int j) { return (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4); }

// 2-bit field of element e (0..255) in the Q2_K/Q3_K qs layout.
QF_HD inline int q2_code(const uint8_t* qs, int e) { return (qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3; }

// 6-bit code of element e (0..255) of a Q6_K block, minus 32.
QF_HD inline int q6k_code(const BlockQ6_K& b, int e) {
  const int h = e / 128, t = (e % 128) / 32, l = e % 32;
  const uint8_t lo = b.ql[64 * h + l + 32 * (t & 1)];
  return ((t < 2 ? lo & 0xF : lo >> 4) | (((b.qh[32 * h + l] >> (2 * t)) & 3) << 4)) - 32;
}

// IQ4_NL's 16 levels (ggml's kvalues_iq4nl).
QF_HD inline int iq4nl_value(int code) {
  const int8_t v[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  return v[code];
}

QF_HD inline void dequantize_block(const BlockIQ4_NL& b, float* y) {
  const float d = hd::f16_to_f32(b.d);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(iq4nl_value(b.qs[j] & 0x0F));
    y[j + 16] = d * static_cast<float>(iq4nl_value(b.qs[j] >> 4));
  }
}

// ---- one block -> floats (y: 32 values for the legacy types, 256 for the k-quants) ----

QF_HD inline void dequantize_block(const BlockQ4_0& b, float* y) {
  const float d = hd::f16_to_f32(b.d);
  for (int j = 0; j < 16; ++j) {
    y[j] = ((b.qs[j] & 0x0F) - 8) * d;
    y[j + 16] = ((b.qs[j] >> 4) - 8) * d;
  }
}

QF_HD inline void dequantize_block(const BlockQ4_1& b, float* y) {
  const float d = hd::f16_to_f32(b.d), m = hd::f16_to_f32(b.m);
  for (int j = 0; j < 16; ++j) {
    y[j] = hd::mul_add_unfused(static_cast<float>(b.qs[j] & 0x0F), d, m);
    y[j + 16] = hd::mul_add_unfused(static_cast<float>(b.qs[j] >> 4), d, m);
  }
}

QF_HD inline void dequantize_block(const BlockQ5_0& b, float* y) {
  const float d = hd::f16_to_f32(b.d);
  const uint32_t qh = q5_high_bits(b.qh);
  for (int j = 0; j < 16; ++j) {
    y[j] = (q5_lo(b.qs, qh, j) - 16) * d;
    y[j + 16] = (q5_hi(b.qs, qh, j) - 16) * d;
  }
}

QF_HD inline void dequantize_block(const BlockQ5_1& b, float* y) {
  const float d = hd::f16_to_f32(b.d), m = hd::f16_to_f32(b.m);
  const uint32_t qh = q5_high_bits(b.qh);
  for (int j = 0; j < 16; ++j) {
    y[j] = hd::mul_add_unfused(static_cast<float>(q5_lo(b.qs, qh, j)), d, m);
    y[j + 16] = hd::mul_add_unfused(static_cast<float>(q5_hi(b.qs, qh, j)), d, m);
  }
}

QF_HD inline void dequantize_block(const BlockQ8_0& b, float* y) {
  const float d = hd::f16_to_f32(b.d);
  for (int j = 0; j < kLegacyBlock; ++j) y[j] = b.qs[j] * d;
}

QF_HD inline void dequantize_block(const BlockQ8_1& b, float* y) {
  const float d = hd::f16_to_f32(b.d);
  for (int j = 0; j < kLegacyBlock; ++j) y[j] = b.qs[j] * d;
}

QF_HD inline void dequantize_block(const BlockQ2_K& b, float* y) {
  const float d = hd::f16_to_f32(b.d), dmin = hd::f16_to_f32(b.dmin);
  for (int j = 0; j < 16; ++j) {
    const float dl = d * (b.scales[j] & 0xF), ml = dmin * (b.scales[j] >> 4);
    for (int l = 0; l < 16; ++l) y[16 * j + l] = hd::mul_sub_unfused(dl, static_cast<float>(q2_code(b.qs, 16 * j + l)), ml);
  }
}

QF_HD inline void dequantize_block(const BlockQ3_K& b, float* y) {
  const float d = hd::f16_to_f32(b.d);
  for (int j = 0; j < 16; ++j) {
    const float dl = d * q3k_scale(j, b.scales);
    for (int l = 0; l < 16; ++l) {
      const int e = 16 * j + l;
      const int hi = (b.hmask[e % 32] >> (e / 32)) & 1;
      y[e] = dl * (q2_code(b.qs, e) - (hi ? 0 : 4));
    }
  }
}

QF_HD inline void dequantize_block(const BlockQ4_K& b, float* y) {
  const float d = hd::f16_to_f32(b.d), dmin = hd::f16_to_f32(b.dmin);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    unpack_scale_min_k4(j, b.scales, &sc, &m);
    const float d1 = d * sc, m1 = dmin * m;
    const uint8_t* q = b.qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) y[32 * j + l] = hd::mul_sub_unfused(d1, static_cast<float>((q[l] >> shift) & 0xF), m1);
  }
}

QF_HD inline void dequantize_block(const BlockQ5_K& b, float* y) {
  const float d = hd::f16_to_f32(b.d), dmin = hd::f16_to_f32(b.dmin);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    unpack_scale_min_k4(j, b.scales, &sc, &m);
    const float d1 = d * sc, m1 = dmin * m;
    const uint8_t* q = b.qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      const int hi = (b.qh[l] >> j) & 1;
      y[32 * j + l] = hd::mul_sub_unfused(d1, static_cast<float>(((q[l] >> shift) & 0xF) + (hi ? 16 : 0)), m1);
    }
  }
}

QF_HD inline void dequantize_block(const BlockQ6_K& b, float* y) {
  const float d = hd::f16_to_f32(b.d);
  for (int e = 0; e < kSuperBlock; ++e) y[e] = d * b.scales[e / 16] * q6k_code(b, e);
}

QF_HD inline void dequantize_block(const BlockQ8_K& b, float* y) {
  for (int j = 0; j < kSuperBlock; ++j) y[j] = b.d * b.qs[j];
}

}  // namespace qf::kquants
