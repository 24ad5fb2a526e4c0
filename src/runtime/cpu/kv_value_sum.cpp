#include "runtime/cpu/kv_value_sum.h"

#include <immintrin.h>

#include <cstring>

#include "core/dtype.h"
#include "core/f8_e4m3.h"
#include "core/simd.h"
#include "quantizers/kquants.h"
#include "runtime/cpu/kernels.h"
#include "runtime/kv_codec.h"

namespace qf::rt {

namespace {

using namespace qf::kquants;

// One 32-value block as signed 8-bit codes c[i] with x = d * c + m (the
// 5-bit types; the others go to registers directly, simd_codes below).
struct Codes {
  alignas(32) int8_t c[32];
  float d, m;
};

template <class B>
void unpack(const uint8_t* src, Codes& k);

template <>
void unpack<BlockQ5_0>(const uint8_t* src, Codes& k) {
  const auto* b = reinterpret_cast<const BlockQ5_0*>(src);
  const uint32_t qh = q5_high_bits(b->qh);
  for (int j = 0; j < 16; ++j)
    k.c[j] = static_cast<int8_t>(q5_lo(b->qs, qh, j) - 16), k.c[j + 16] = static_cast<int8_t>(q5_hi(b->qs, qh, j) - 16);
  k.d = f16_to_f32(b->d), k.m = 0.f;
}

template <>
void unpack<BlockQ5_1>(const uint8_t* src, Codes& k) {
  const auto* b = reinterpret_cast<const BlockQ5_1*>(src);
  const uint32_t qh = q5_high_bits(b->qh);
  for (int j = 0; j < 16; ++j)
    k.c[j] = static_cast<int8_t>(q5_lo(b->qs, qh, j)), k.c[j + 16] = static_cast<int8_t>(q5_hi(b->qs, qh, j));
  k.d = f16_to_f32(b->d), k.m = f16_to_f32(b->m);
}

// The codes of the 4-bit and 8-bit blocks straight into a vector.
__attribute__((target("avx2"))) inline __m256i nibbles(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)), m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

template <class B>
__attribute__((target("avx2"))) inline __m256i simd_codes(const uint8_t* src, Codes& k) {
  unpack<B>(src, k);
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(k.c));
}

template <>
__attribute__((target("avx2,f16c"))) inline __m256i simd_codes<BlockQ8_0>(const uint8_t* src, Codes& k) {
  const auto* b = reinterpret_cast<const BlockQ8_0*>(src);
  k.d = _cvtsh_ss(b->d), k.m = 0.f;
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs));
}

template <>
__attribute__((target("avx2,f16c"))) inline __m256i simd_codes<BlockQ4_0>(const uint8_t* src, Codes& k) {
  const auto* b = reinterpret_cast<const BlockQ4_0*>(src);
  k.d = _cvtsh_ss(b->d), k.m = 0.f;
  return _mm256_sub_epi8(nibbles(b->qs), _mm256_set1_epi8(8));
}

template <>
__attribute__((target("avx2,f16c"))) inline __m256i simd_codes<BlockQ4_1>(const uint8_t* src, Codes& k) {
  const auto* b = reinterpret_cast<const BlockQ4_1*>(src);
  k.d = _cvtsh_ss(b->d), k.m = _cvtsh_ss(b->m);
  return nibbles(b->qs);
}

template <>
__attribute__((target("avx2,f16c"))) inline __m256i simd_codes<BlockIQ4_NL>(const uint8_t* src, Codes& k) {
  const auto* b = reinterpret_cast<const BlockIQ4_NL*>(src);
  k.d = _cvtsh_ss(b->d), k.m = 0.f;
  const __m256i table = _mm256_broadcastsi128_si256(
      _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113));
  return _mm256_shuffle_epi8(table, nibbles(b->qs));
}

template <class B>
__attribute__((target("avx2,fma,f16c"))) void blocks_avx2(const uint8_t* v, size_t stride, int64_t n, int64_t hd,
                                                     const float* w, int64_t ws, int nq, float* out) {
  Codes k;
  const int64_t nb = hd / 32;
  for (int64_t p = 0; p < n; ++p) {
    const uint8_t* row = v + static_cast<size_t>(p) * stride;
    for (int64_t bi = 0; bi < nb; ++bi) {
      const __m256i c = simd_codes<B>(row + static_cast<size_t>(bi) * sizeof(B), k);
      const __m128i c0 = _mm256_castsi256_si128(c), c1 = _mm256_extracti128_si256(c, 1);
      const __m256 d = _mm256_set1_ps(k.d), m = _mm256_set1_ps(k.m);
      // (q4_1's and q5_1's unsigned codes, at most 31, fit in a signed byte)
      __m256 x[4] = {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c0)),
                     _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c0, 8))),
                     _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c1)),
                     _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c1, 8)))};
      for (auto& xi : x) xi = _mm256_fmadd_ps(xi, d, m);
      for (int j = 0; j < nq; ++j) {
        const __m256 wj = _mm256_set1_ps(w[j * ws + p]);
        float* o = out + j * hd + bi * 32;
        for (int q = 0; q < 4; ++q) _mm256_storeu_ps(o + 8 * q, _mm256_fmadd_ps(wj, x[q], _mm256_loadu_ps(o + 8 * q)));
      }
    }
  }
}

__attribute__((target("avx2,fma,f16c"))) void f16_avx2(const uint8_t* v, size_t stride, int64_t n, int64_t hd,
                                                        const float* w, int64_t ws, int nq, float* out) {
  for (int64_t p = 0; p < n; ++p) {
    const uint16_t* row = reinterpret_cast<const uint16_t*>(v + static_cast<size_t>(p) * stride);
    for (int64_t i = 0; i < hd; i += 8) {
      const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i)));
      for (int j = 0; j < nq; ++j) {
        float* o = out + j * hd + i;
        _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_set1_ps(w[j * ws + p]), x, _mm256_loadu_ps(o)));
      }
    }
  }
}

// 32 NVFP4 values (16 code bytes, element 2i in the low nibble; two e4m3
// block scales) as four vectors: e2m1 doubled as bytes, then times half the
// block's scale over the global one, the same floats as kv_decode (scaling by
// 2 and by 1/2 is exact).
__attribute__((target("avx2,fma"))) inline void nvfp4_32(const uint8_t* codes, const uint8_t* scales, float g,
                                                         __m256* x) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)), m = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
  const __m128i table = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m128i e0 = _mm_shuffle_epi8(table, _mm_unpacklo_epi8(lo, hi));  // elements 0..15
  const __m128i e1 = _mm_shuffle_epi8(table, _mm_unpackhi_epi8(lo, hi));  // 16..31
  const __m256 s0 = _mm256_set1_ps(0.5f * (hd::f8e4m3_to_f32(scales[0]) / g));
  const __m256 s1 = _mm256_set1_ps(0.5f * (hd::f8e4m3_to_f32(scales[1]) / g));
  x[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e0)), s0);
  x[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e0, 8))), s0);
  x[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e1)), s1);
  x[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e1, 8))), s1);
}

__attribute__((target("avx2,fma"))) void nvfp4_values_avx2(const uint8_t* v, size_t stride, int64_t n, int64_t hd,
                                                           float g, const float* w, int64_t ws, int nq, float* out) {
  __m256 x[4];
  for (int64_t p = 0; p < n; ++p) {
    const uint8_t* row = v + static_cast<size_t>(p) * stride;
    for (int64_t c = 0; c < hd / 32; ++c) {
      nvfp4_32(row + c * 16, row + hd / 2 + c * 2, g, x);
      for (int j = 0; j < nq; ++j) {
        const __m256 wj = _mm256_set1_ps(w[j * ws + p]);
        float* o = out + j * hd + c * 32;
        for (int q = 0; q < 4; ++q) _mm256_storeu_ps(o + 8 * q, _mm256_fmadd_ps(wj, x[q], _mm256_loadu_ps(o + 8 * q)));
      }
    }
  }
}

__attribute__((target("avx2,fma"))) void nvfp4_scores_avx2(const uint8_t* keys, size_t stride, int64_t n, int64_t hd,
                                                           float g, const float* q, int nq, float* out, int64_t os) {
  __m256 x[4];
  for (int64_t p = 0; p < n; ++p) {
    const uint8_t* row = keys + static_cast<size_t>(p) * stride;
    __m256 acc[8];
    for (int j = 0; j < nq; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t c = 0; c < hd / 32; ++c) {
      nvfp4_32(row + c * 16, row + hd / 2 + c * 2, g, x);
      for (int j = 0; j < nq; ++j) {
        const float* qj = q + j * hd + c * 32;
        for (int k = 0; k < 4; ++k) acc[j] = _mm256_fmadd_ps(x[k], _mm256_loadu_ps(qj + 8 * k), acc[j]);
      }
    }
    for (int j = 0; j < nq; ++j) {
      __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[j]), _mm256_extractf128_ps(acc[j], 1));
      s = _mm_add_ps(s, _mm_movehl_ps(s, s));
      s = _mm_add_ss(s, _mm_movehdup_ps(s));
      out[j * os + p] = _mm_cvtss_f32(s);
    }
  }
}

// TurboQuant's uniform values (4 or 3 bits, one f16 scale and minimum per
// vector): the codes unpacked to bytes once, then code * scale + min in
// registers, the decoder's floats.
__attribute__((target("avx2,fma"))) void tq_values_avx2(const uint8_t* v, size_t stride, int64_t n, int64_t hd,
                                                        int bits, const float* w, int64_t ws, int nq, float* out) {
  alignas(32) uint8_t codes[512];
  alignas(32) float x[512];
  for (int64_t p = 0; p < n; ++p) {
    const uint8_t* row = v + static_cast<size_t>(p) * stride;
    unpack_kv_codes(row, hd, bits, codes);
    uint16_t sz[2];
    std::memcpy(sz, row + hd * bits / 8, 4);
    const __m256 s = _mm256_set1_ps(f16_to_f32(sz[0])), z = _mm256_set1_ps(f16_to_f32(sz[1]));
    for (int64_t i = 0; i < hd; i += 8) {
      const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i)));
      _mm256_store_ps(x + i, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(c), s), z));  // no FMA: the decoder rounds twice
    }
    for (int j = 0; j < nq; ++j) {
      const __m256 wj = _mm256_set1_ps(w[j * ws + p]);
      float* o = out + j * hd;
      for (int64_t i = 0; i < hd; i += 8) _mm256_storeu_ps(o + i, _mm256_fmadd_ps(wj, _mm256_load_ps(x + i), _mm256_loadu_ps(o + i)));
    }
  }
}

}  // namespace

bool kv_nvfp4_scores(const uint8_t* keys, size_t stride, int64_t n, int64_t hd, float g, const float* q, int nq,
                     float* out, int64_t os) {
  if (simd_level() == SimdLevel::Scalar || hd % 32 != 0 || nq > 8) return false;
  nvfp4_scores_avx2(keys, stride, n, hd, g, q, nq, out, os);
  return true;
}

void kv_value_sum(KvDType t, const uint8_t* v, size_t stride, int64_t n, int64_t hd, float param, const float* w,
                  int64_t ws, int nq, float* out) {
  if (simd_level() != SimdLevel::Scalar && hd % 32 == 0) {
    switch (t) {
      case KvDType::F16: return f16_avx2(v, stride, n, hd, w, ws, nq, out);
      case KvDType::Q8_0: return blocks_avx2<BlockQ8_0>(v, stride, n, hd, w, ws, nq, out);
      case KvDType::Q4_0: return blocks_avx2<BlockQ4_0>(v, stride, n, hd, w, ws, nq, out);
      case KvDType::Q4_1: return blocks_avx2<BlockQ4_1>(v, stride, n, hd, w, ws, nq, out);
      case KvDType::Q5_0: return blocks_avx2<BlockQ5_0>(v, stride, n, hd, w, ws, nq, out);
      case KvDType::Q5_1: return blocks_avx2<BlockQ5_1>(v, stride, n, hd, w, ws, nq, out);
      case KvDType::IQ4_NL: return blocks_avx2<BlockIQ4_NL>(v, stride, n, hd, w, ws, nq, out);
      case KvDType::NVFP4: return nvfp4_values_avx2(v, stride, n, hd, param, w, ws, nq, out);
      case KvDType::TQ_V4: return tq_values_avx2(v, stride, n, hd, 4, w, ws, nq, out);
      case KvDType::TQ_V3: return tq_values_avx2(v, stride, n, hd, 3, w, ws, nq, out);
      default: break;
    }
  }
  const KvDecodeFn decode = kv_decoder(t);
  float x[512];
  for (int64_t p = 0; p < n; ++p) {
    decode(v + static_cast<size_t>(p) * stride, hd, param, x);
    for (int j = 0; j < nq; ++j) axpy(w[j * ws + p], x, out + j * hd, hd);
  }
}

}  // namespace qf::rt
