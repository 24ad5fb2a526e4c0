#include "runtime/cpu/int8_gemm.h"

// GCC 12 warns inside its own AVX-512 headers (_mm512_undefined_* operands).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include "runtime/cpu/kernels.h"

namespace qf::rt {

namespace ref {
void gemm_s8s8_s32(const int8_t* x, int64_t tokens, int64_t xs, const int8_t* w, int64_t rows, int64_t k, int32_t* y,
                   int64_t ys) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      int32_t s = 0;
      for (int64_t i = 0; i < k; ++i) s += static_cast<int32_t>(x[t * xs + i]) * static_cast<int32_t>(w[r * k + i]);
      y[t * ys + r] = s;
    }
}
}  // namespace ref

std::vector<int32_t> int8_row_sums(const int8_t* w, int64_t rows, int64_t k) {
  std::vector<int32_t> s(static_cast<size_t>(rows), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < k; ++i) s[static_cast<size_t>(r)] += w[r * k + i];
  return s;
}

namespace {

bool cpu_has_vnni() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") != 0;
  }();
  return has;
}

// ---- AVX2: int16 madd -------------------------------------------------------

__attribute__((target("avx2"))) inline int32_t hsum_epi32_avx2(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

template <int NT, int NR>
__attribute__((target("avx2"))) void block_avx2(const int8_t* x, int64_t xs, const int8_t* w, int64_t k, int32_t* y,
                                                int64_t ys) {
  __m256i acc[NT][NR];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    __m256i wv[NR];
    for (int r = 0; r < NR; ++r)
      wv[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + r * k + i)));
    for (int t = 0; t < NT; ++t) {
      const __m256i xv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + t * xs + i)));
      for (int r = 0; r < NR; ++r) acc[t][r] = _mm256_add_epi32(acc[t][r], _mm256_madd_epi16(xv, wv[r]));
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) {
      int32_t s = hsum_epi32_avx2(acc[t][r]);
      for (int64_t j = i; j < k; ++j) s += static_cast<int32_t>(x[t * xs + j]) * static_cast<int32_t>(w[r * k + j]);
      y[t * ys + r] = s;
    }
}

// ---- AVX-512 VNNI: u8 x s8 dpbusd with the +128 bias ------------------------

template <int NT, int NR>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void block_vnni(const int8_t* x, int64_t xs, const int8_t* w,
                                                                       int64_t k, const int32_t* rowsum, int32_t* y,
                                                                       int64_t ys) {
  __m512i acc[NT][NR];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = _mm512_setzero_si512();
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  int64_t i = 0;
  for (; i + 64 <= k; i += 64) {
    __m512i wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = _mm512_loadu_si512(w + r * k + i);
    for (int t = 0; t < NT; ++t) {
      const __m512i xv = _mm512_xor_si512(_mm512_loadu_si512(x + t * xs + i), bias);  // x + 128 as u8
      for (int r = 0; r < NR; ++r) acc[t][r] = _mm512_dpbusd_epi32(acc[t][r], xv, wv[r]);
    }
  }
  if (i < k) {
    // masked tail: the weight lanes past k load as 0, so their products vanish
    const __mmask64 m = (~0ULL) >> (64 - (k - i));
    __m512i wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = _mm512_maskz_loadu_epi8(m, w + r * k + i);
    for (int t = 0; t < NT; ++t) {
      const __m512i xv = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, x + t * xs + i), bias);
      for (int r = 0; r < NR; ++r) acc[t][r] = _mm512_dpbusd_epi32(acc[t][r], xv, wv[r]);
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) {
      // modulo 2^32: the biased sum may wrap, the corrected result does not
      const uint32_t s = static_cast<uint32_t>(_mm512_reduce_add_epi32(acc[t][r])) - (static_cast<uint32_t>(rowsum[r]) << 7);
      y[t * ys + r] = static_cast<int32_t>(s);
    }
}

template <int NT>
void drive_avx2(const int8_t* x, int64_t tokens, int64_t xs, const int8_t* w, int64_t rows, int64_t k, int32_t* y,
                int64_t ys) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    int64_t t = 0;
    for (; t + NT <= tokens; t += NT) block_avx2<NT, 4>(x + t * xs, xs, w + r * k, k, y + t * ys + r, ys);
    for (; t < tokens; ++t) block_avx2<1, 4>(x + t * xs, xs, w + r * k, k, y + t * ys + r, ys);
  }
  for (; r < rows; ++r) {
    int64_t t = 0;
    for (; t + NT <= tokens; t += NT) block_avx2<NT, 1>(x + t * xs, xs, w + r * k, k, y + t * ys + r, ys);
    for (; t < tokens; ++t) block_avx2<1, 1>(x + t * xs, xs, w + r * k, k, y + t * ys + r, ys);
  }
}

void drive_vnni(const int8_t* x, int64_t tokens, int64_t xs, const int8_t* w, int64_t rows, int64_t k,
                const int32_t* rs, int32_t* y, int64_t ys) {
  constexpr int NT = 4;
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    int64_t t = 0;
    for (; t + NT <= tokens; t += NT) block_vnni<NT, 4>(x + t * xs, xs, w + r * k, k, rs + r, y + t * ys + r, ys);
    for (; t < tokens; ++t) block_vnni<1, 4>(x + t * xs, xs, w + r * k, k, rs + r, y + t * ys + r, ys);
  }
  for (; r < rows; ++r) {
    int64_t t = 0;
    for (; t + NT <= tokens; t += NT) block_vnni<NT, 1>(x + t * xs, xs, w + r * k, k, rs + r, y + t * ys + r, ys);
    for (; t < tokens; ++t) block_vnni<1, 1>(x + t * xs, xs, w + r * k, k, rs + r, y + t * ys + r, ys);
  }
}

}  // namespace

const char* int8_gemm_kernel_name() {
  switch (simd_level()) {
    case SimdLevel::Amx:
    case SimdLevel::Avx512: return cpu_has_vnni() ? "avx512-vnni" : "avx2";
    case SimdLevel::Avx2: return "avx2";
    default: return "scalar";
  }
}

void gemm_s8s8_s32(const int8_t* x, int64_t tokens, int64_t xs, const int8_t* w, int64_t rows, int64_t k,
                   const int32_t* w_rowsum, int32_t* y, int64_t ys) {
  if (tokens <= 0 || rows <= 0) return;
  const SimdLevel level = simd_level();
  if (level >= SimdLevel::Avx512 && cpu_has_vnni()) {
    std::vector<int32_t> own;
    if (!w_rowsum) {
      own = int8_row_sums(w, rows, k);
      w_rowsum = own.data();
    }
    return drive_vnni(x, tokens, xs, w, rows, k, w_rowsum, y, ys);
  }
  if (level != SimdLevel::Scalar) return drive_avx2<2>(x, tokens, xs, w, rows, k, y, ys);
  ref::gemm_s8s8_s32(x, tokens, xs, w, rows, k, y, ys);
}

}  // namespace qf::rt
