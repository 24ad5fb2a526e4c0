// The kinds of weight row the dot and GEMM blocks of gemm_blocks.h read,
// each converted to f32 in registers. Every kind gives exactly the floats of
// its decoded row (kquants::dequantize_row / row_to_f32), so a kernel over a
// kind returns the floats of the same kernel over the decoded f32 row (at
// AVX2, for kinds that sum in the f32 kind's one accumulator):
//   F32Row   f32 as it is
//   F16Row   f16 (every f16 is an f32)
//   Q8_0Row  34-byte blocks of an f16 scale d and 32 int8 codes: q * d, exact
//            in f32 (11 x 8 significant bits)
//
// A kind has: T (the element type rows are addressed in); kAvx2Accs (how
// many 8-lane accumulators an AVX2 sum over its rows uses, gemm_blocks.h:
// 1, the f32 kind's order, except f16's 2); stride(k) (the
// distance between rows of k elements, in T); load8(row, i) and
// load16(row, i) (elements i .. i+7 or i+15, i a multiple of 8 or 16);
// load16(mask, row, i) (the masked tail of a row
// whose length is not a multiple of 16; the block kinds hold whole blocks, so
// theirs is never reached and ignores the mask: their callers check the row
// length); at(row, i) (one element, for scalar tails).
//
// Only kinds whose decoding costs a few operations per 16 elements belong
// here: the blocks decode a row once per block of tokens, so the k-quants
// (several shifts, masks and scale lookups per element) are faster decoded
// once into an f32 tile and multiplied by the f32 kind (linear_tiles.cpp).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "core/dtype.h"
#include "quantizers/kquant_blocks.h"

namespace qf::rt::rows {

#define QF_ROWS_AVX2 __attribute__((target("avx2,fma,f16c"))) inline
#define QF_ROWS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl"))) inline

struct F32Row {
  using T = float;
  static constexpr int kAvx2Accs = 1;
  static int64_t stride(int64_t k) { return k; }
  static QF_ROWS_AVX2 __m256 load8(const float* w, int64_t i) { return _mm256_loadu_ps(w + i); }
  static QF_ROWS_AVX512 __m512 load16(const float* w, int64_t i) { return _mm512_loadu_ps(w + i); }
  static QF_ROWS_AVX512 __m512 load16(__mmask16 m, const float* w, int64_t i) {
    return _mm512_maskz_loadu_ps(m, w + i);
  }
  static float at(const float* w, int64_t i) { return w[i]; }
};

struct F16Row {
  using T = uint16_t;
  static constexpr int kAvx2Accs = 2;
  static int64_t stride(int64_t k) { return k; }
  static QF_ROWS_AVX2 __m256 load8(const uint16_t* w, int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i)));
  }
  static QF_ROWS_AVX512 __m512 load16(const uint16_t* w, int64_t i) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i)));
  }
  static QF_ROWS_AVX512 __m512 load16(__mmask16 m, const uint16_t* w, int64_t i) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w + i));
  }
  static float at(const uint16_t* w, int64_t i) { return f16_to_f32(w[i]); }
};

struct Q8_0Row {
  using T = uint8_t;
  static constexpr int kAvx2Accs = 1;
  using Block = kquants::BlockQ8_0;
  static constexpr int64_t kN = kquants::kLegacyBlock;
  static int64_t stride(int64_t k) { return k / kN * static_cast<int64_t>(sizeof(Block)); }
  static const Block& block(const uint8_t* w, int64_t i) { return reinterpret_cast<const Block*>(w)[i / kN]; }
  static QF_ROWS_AVX2 __m256 load8(const uint8_t* w, int64_t i) {
    const Block& b = block(w, i);
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs + i % kN));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)),
                         _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(b.d))));
  }
  static QF_ROWS_AVX512 __m512 load16(const uint8_t* w, int64_t i) {
    const Block& b = block(w, i);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + i % kN));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)),
                         _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(b.d))));
  }
  static QF_ROWS_AVX512 __m512 load16(__mmask16, const uint8_t* w, int64_t i) {
    return load16(w, i);  // whole blocks: never a partial one
  }
  static float at(const uint8_t* w, int64_t i) {
    const Block& b = block(w, i);
    return b.qs[i % kN] * f16_to_f32(b.d);
  }
};

#undef QF_ROWS_AVX2
#undef QF_ROWS_AVX512

}  // namespace qf::rt::rows
