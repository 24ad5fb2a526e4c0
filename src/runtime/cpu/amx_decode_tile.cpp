// A tile of GGUF block rows decoded for the AMX GEMM (amx_gemm.h): the
// codes of 32 elements at a time pulled out of the blocks with AVX2 byte
// operations and converted to bf16 with AVX512-BF16 (exact: every code is a
// small integer), the sub-blocks' scale and min as the decoders of
// quantizers/kquant_blocks.h form them.

// GCC 12 warns inside its own AVX-512 headers (_mm512_undefined_* operands).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "formats/gguf/gguf.h"
#include "quantizers/kquant_blocks.h"
#include "runtime/cpu/amx_gemm.h"
#include "runtime/cpu/kernels.h"

#define QF_AMX_DECODE __attribute__((target("avx2,avx512f,avx512bw,avx512vl,avx512bf16")))

namespace qf::rt {

bool amx_gemm_supports(uint32_t t) {
  return t == ggml_type::Q8_0 || t == ggml_type::Q4_K || t == ggml_type::Q5_K || t == ggml_type::Q6_K;
}

int amx_sub_block(uint32_t t) { return t == ggml_type::Q6_K ? 16 : 32; }

bool amx_has_min(uint32_t t) { return t == ggml_type::Q4_K || t == ggml_type::Q5_K; }

namespace {

using kquants::kSuperBlock;

// 32 int8 codes -> 32 bf16 values.
QF_AMX_DECODE inline void store_codes(__m256i c8, uint16_t* dst) {
  const __m512i c16 = _mm512_cvtepi8_epi16(c8);
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(c16)));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(c16, 1)));
  _mm512_storeu_si512(dst, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
}

// 32 int8 codes that span two 16-element sub-blocks -> the first sub-block's
// 16 bf16 at dst, the second's at dst + 16 * 16 (the next sub-block's block).
QF_AMX_DECODE inline void store_codes16(__m256i c8, uint16_t* dst) {
  alignas(64) uint16_t both[32];
  store_codes(c8, both);
  std::memcpy(dst, both, 32);
  std::memcpy(dst + 16 * 16, both + 16, 32);
}

QF_AMX_DECODE inline __m256i low_nibbles(__m256i q) { return _mm256_and_si256(q, _mm256_set1_epi8(0x0F)); }
QF_AMX_DECODE inline __m256i high_nibbles(__m256i q) {
  return _mm256_and_si256(_mm256_srli_epi16(q, 4), _mm256_set1_epi8(0x0F));
}

// Row r of the tile: the codes of sub-block j at codes[j * 16 * sub] (the
// rows of a 16-row group are `sub` codes apart), scale/min at [j * 64 + r].
QF_AMX_DECODE void decode_q8_0(const uint8_t* row, int64_t k, uint16_t* codes, float* scale) {
  const auto* b = reinterpret_cast<const kquants::BlockQ8_0*>(row);
  for (int64_t j = 0; j < k / 32; ++j) {
    store_codes(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[j].qs)), codes + j * 16 * 32);
    scale[j * 64] = hd::f16_to_f32(b[j].d);
  }
}

template <bool kFifth>
QF_AMX_DECODE void decode_q45_k(const uint8_t* row, int64_t k, uint16_t* codes, float* scale, float* min) {
  using Block = std::conditional_t<kFifth, kquants::BlockQ5_K, kquants::BlockQ4_K>;
  const auto* blocks = reinterpret_cast<const Block*>(row);
  for (int64_t s = 0; s < k / kSuperBlock; ++s) {
    const Block& b = blocks[s];
    const float d = hd::f16_to_f32(b.d), dmin = hd::f16_to_f32(b.dmin);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFifth) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh));
    for (int j = 0; j < 8; ++j) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * (j / 2)));
      __m256i c = j % 2 ? high_nibbles(q) : low_nibbles(q);
      if constexpr (kFifth) {
        const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << j));
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
        c = _mm256_or_si256(c, _mm256_and_si256(set, _mm256_set1_epi8(16)));
      }
      store_codes(c, codes + (s * 8 + j) * 16 * 32);
      uint8_t sc, m;
      kquants::unpack_scale_min_k4(j, b.scales, &sc, &m);
      scale[(s * 8 + j) * 64] = d * sc;
      min[(s * 8 + j) * 64] = dmin * m;
    }
  }
}

QF_AMX_DECODE void decode_q6_k(const uint8_t* row, int64_t k, uint16_t* codes, float* scale) {
  const auto* blocks = reinterpret_cast<const kquants::BlockQ6_K*>(row);
  for (int64_t s = 0; s < k / kSuperBlock; ++s) {
    const kquants::BlockQ6_K& b = blocks[s];
    const float d = hd::f16_to_f32(b.d);
    for (int h = 0; h < 2; ++h) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h));
      for (int t = 0; t < 4; ++t) {
        const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h + 32 * (t & 1)));
        const __m256i lo = t < 2 ? low_nibbles(ql) : high_nibbles(ql);
        const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * t), _mm256_set1_epi8(3)), 4);
        const __m256i c = _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32));
        const int e0 = 128 * h + 32 * t;
        store_codes16(c, codes + (s * 16 + e0 / 16) * 16 * 16);
        for (int u = 0; u < 2; ++u) scale[(s * 16 + e0 / 16 + u) * 64] = d * b.scales[e0 / 16 + u];
      }
    }
  }
}

}  // namespace

void amx_decode_tile(uint32_t type, const uint8_t* w, size_t row_bytes, int64_t rows, int64_t k, AmxWeightTile& out) {
  const int64_t block = type == ggml_type::Q8_0 ? kquants::kLegacyBlock : kSuperBlock;
  if (!amx_gemm_supports(type) || rows < 1 || rows > 64 || k < 1 || k % block != 0 || simd_level() < SimdLevel::Amx)
    throw Error(ErrorKind::Internal, "amx_decode_tile: unsupported type, shape or SIMD level");
  const int64_t padded = (rows + 15) / 16 * 16, sub = amx_sub_block(type), subs = k / sub;
  out.rows = rows;
  out.has_min = amx_has_min(type);
  out.codes.resize(static_cast<size_t>(padded * k));
  out.scale.resize(static_cast<size_t>(subs * 64));
  if (out.has_min) out.min.resize(static_cast<size_t>(subs * 64));
  else out.min.clear();  // nothing reads it
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = w + static_cast<size_t>(r) * row_bytes;
    uint16_t* codes = out.codes.data() + (r / 16) * 16 * k + (r % 16) * sub;
    float* scale = out.scale.data() + r;
    switch (type) {
      case ggml_type::Q8_0: decode_q8_0(row, k, codes, scale); break;
      case ggml_type::Q4_K: decode_q45_k<false>(row, k, codes, scale, out.min.data() + r); break;
      case ggml_type::Q5_K: decode_q45_k<true>(row, k, codes, scale, out.min.data() + r); break;
      default: decode_q6_k(row, k, codes, scale); break;
    }
  }
  for (int64_t r = rows; r < padded; ++r)
    for (int64_t j = 0; j < subs; ++j)
      std::memset(out.codes.data() + (r / 16) * 16 * k + j * 16 * sub + (r % 16) * sub, 0, static_cast<size_t>(sub) * 2);
  // Rows past the tile multiply zero codes; their scales and mins are zeroed
  // too, so a stale value from an earlier tile (an inf) cannot make a NaN.
  for (int64_t j = 0; j < subs; ++j)
    for (int64_t r = rows; r < 64; ++r) {
      out.scale[static_cast<size_t>(j * 64 + r)] = 0.0f;
      if (out.has_min) out.min[static_cast<size_t>(j * 64 + r)] = 0.0f;
    }
}

}  // namespace qf::rt
