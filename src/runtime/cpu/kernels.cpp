#include "runtime/cpu/kernels.h"

// GCC 12 warns inside its own AVX-512 headers (_mm512_undefined_* operands).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "quantizers/kquant_blocks.h"

namespace qf::rt {

// ---- scalar references ------------------------------------------------------

namespace ref {

float dot_f32(const float* a, const float* b, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void row_to_f32(DType dtype, const void* src, float* dst, int64_t n) {
  switch (dtype) {
    case DType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::F16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::BF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    default:
      throw Error(ErrorKind::Internal, std::string("row_to_f32: no float row conversion for ") + dtype_name(dtype));
  }
}

}  // namespace ref

// ---- AVX2 -------------------------------------------------------------------

namespace {

__attribute__((target("avx2,fma"))) inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

__attribute__((target("avx2,fma"))) float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = hsum256(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Weight loads of the dot kernels, element i of a row: f32 rows as they are;
// f16 rows converted in registers (exactly: every f16 is an f32); Q8_0 rows
// (34-byte blocks of an f16 scale d and 32 int8 codes) as q * d, which is
// exact in f32 (11 x 8 significant bits) and so equals the decoded row. The
// kernels thus return the same floats as decoding the rows first. stride(k):
// the distance between rows of k elements, in T.
struct F32Row {
  using T = float;
  static __attribute__((target("avx2,fma,f16c"))) inline __m256 load8(const float* w, int64_t i) {
    return _mm256_loadu_ps(w + i);
  }
  static float at(const float* w, int64_t i) { return w[i]; }
  static int64_t stride(int64_t k) { return k; }
};
struct F16Row {
  using T = uint16_t;
  static __attribute__((target("avx2,fma,f16c"))) inline __m256 load8(const uint16_t* w, int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i)));
  }
  static float at(const uint16_t* w, int64_t i) { return f16_to_f32(w[i]); }
  static int64_t stride(int64_t k) { return k; }
};
struct Q8_0Row {
  using T = uint8_t;
  static const kquants::BlockQ8_0& block(const uint8_t* w, int64_t i) {
    return reinterpret_cast<const kquants::BlockQ8_0*>(w)[i / kquants::kLegacyBlock];
  }
  static __attribute__((target("avx2,fma,f16c"))) inline __m256 load8(const uint8_t* w, int64_t i) {
    const kquants::BlockQ8_0& b = block(w, i);
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs + i % kquants::kLegacyBlock));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(b.d))));
  }
  static float at(const uint8_t* w, int64_t i) {
    const kquants::BlockQ8_0& b = block(w, i);
    return b.qs[i % kquants::kLegacyBlock] * f16_to_f32(b.d);
  }
  static int64_t stride(int64_t k) {
    return k / kquants::kLegacyBlock * static_cast<int64_t>(sizeof(kquants::BlockQ8_0));
  }
};

template <typename Row>
__attribute__((target("avx2,fma,f16c"))) void dot4_avx2(const float* x, const typename Row::T* w, int64_t n, float* y) {
  const typename Row::T* w0 = w;
  const typename Row::T* w1 = w + Row::stride(n);
  const typename Row::T* w2 = w + 2 * Row::stride(n);
  const typename Row::T* w3 = w + 3 * Row::stride(n);
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 xv = _mm256_loadu_ps(x + i);
    s0 = _mm256_fmadd_ps(xv, Row::load8(w0, i), s0);
    s1 = _mm256_fmadd_ps(xv, Row::load8(w1, i), s1);
    s2 = _mm256_fmadd_ps(xv, Row::load8(w2, i), s2);
    s3 = _mm256_fmadd_ps(xv, Row::load8(w3, i), s3);
  }
  float r0 = hsum256(s0), r1 = hsum256(s1), r2 = hsum256(s2), r3 = hsum256(s3);
  for (; i < n; ++i) {  // explicit fused multiply-adds: the same for every Row type
    r0 = std::fma(x[i], Row::at(w0, i), r0);
    r1 = std::fma(x[i], Row::at(w1, i), r1);
    r2 = std::fma(x[i], Row::at(w2, i), r2);
    r3 = std::fma(x[i], Row::at(w3, i), r3);
  }
  y[0] = r0, y[1] = r1, y[2] = r2, y[3] = r3;
}

__attribute__((target("avx2,fma,f16c"))) void f16_to_f32_avx2(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i + 4 <= n; i += 4)
    _mm_storeu_ps(d + i, _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) d[i] = f16_to_f32(s[i]);
}

__attribute__((target("avx2,fma"))) void bf16_to_f32_avx2(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    _mm256_storeu_ps(d + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
  }
  for (; i < n; ++i) d[i] = bf16_to_f32(s[i]);
}


// exp(x), x clamped to [-87, 88]: 2^(x log2 e) split into 2^n * 2^f,
// 2^f by a degree-6 polynomial on [-0.5, 0.5]; relative error below 2e-7.
__attribute__((target("avx2,fma"))) inline __m256 exp_avx2(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
  const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(t, n);
  __m256 p = _mm256_set1_ps(1.535336188319500e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

__attribute__((target("avx2,fma"))) void softmax_avx2(float* x, int64_t n) {
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  const __m256 m = _mm256_set1_ps(mx);
  __m256 sum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
    _mm256_storeu_ps(x + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  float s = hsum256(sum);
  if (i < n) {
    float tmp[8] = {0};
    for (int64_t j = i; j < n; ++j) tmp[j - i] = x[j] - mx;
    for (int64_t j = n - i; j < 8; ++j) tmp[j] = -100.f;
    __m256 e = exp_avx2(_mm256_loadu_ps(tmp));
    _mm256_storeu_ps(tmp, e);
    for (int64_t j = i; j < n; ++j) {
      x[j] = tmp[j - i];
      s += tmp[j - i];
    }
  }
  const __m256 inv = _mm256_set1_ps(1.0f / s);
  for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
  for (; i < n; ++i) x[i] *= 1.0f / s;
}

__attribute__((target("avx2,fma"))) void swiglu_avx2(float* gate, const float* up, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) gate[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

__attribute__((target("avx2,fma"))) float max_avx2(const float* x, int64_t n) {
  __m256 m = _mm256_set1_ps(x[0]);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
  float buf[8];
  _mm256_storeu_ps(buf, m);
  float r = buf[0];
  for (int j = 1; j < 8; ++j) r = std::max(r, buf[j]);
  for (; i < n; ++i) r = std::max(r, x[i]);
  return r;
}

// Sums in float lanes per block of 1024 elements, blocks in double.
__attribute__((target("avx2,fma"))) double logsumexp_avx2(const float* x, int64_t n) {
  const float mx = max_avx2(x, n);
  const __m256 m = _mm256_set1_ps(mx);
  double total = 0.0;
  int64_t i = 0;
  while (i + 8 <= n) {
    __m256 acc = _mm256_setzero_ps();
    const int64_t end = std::min(n, i + 1024);
    for (; i + 8 <= end; i += 8) acc = _mm256_add_ps(acc, exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), m)));
    total += hsum256(acc);
  }
  for (; i < n; ++i) total += std::exp(x[i] - mx);
  return mx + std::log(total);
}

__attribute__((target("avx2,fma"))) double kl_avx2(const float* p, double p_lse, const float* q, double q_lse, int64_t n) {
  const __m256 pl = _mm256_set1_ps(static_cast<float>(p_lse));
  const __m256 d = _mm256_set1_ps(static_cast<float>(q_lse - p_lse));
  double total = 0.0;
  int64_t i = 0;
  while (i + 8 <= n) {
    __m256 acc = _mm256_setzero_ps();
    const int64_t end = std::min(n, i + 1024);
    for (; i + 8 <= end; i += 8) {
      const __m256 lp = _mm256_sub_ps(_mm256_loadu_ps(p + i), pl);  // log P_i
      const __m256 diff = _mm256_add_ps(_mm256_sub_ps(_mm256_loadu_ps(p + i), _mm256_loadu_ps(q + i)), d);
      acc = _mm256_fmadd_ps(exp_avx2(lp), diff, acc);
    }
    total += hsum256(acc);
  }
  for (; i < n; ++i) {
    const double lp = p[i] - p_lse, lq = q[i] - q_lse;
    total += std::exp(lp) * (lp - lq);
  }
  return total;
}

__attribute__((target("avx2,fma"))) void axpy_avx2(float a, const float* x, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

// ---- AVX-512 ----------------------------------------------------------------

__attribute__((target("avx512f"))) inline float hsum512(__m512 v) {
  __m256 lo = _mm512_castps512_ps256(v);
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return hsum256(_mm256_add_ps(lo, hi));
}

__attribute__((target("avx512f"))) float dot_avx512(const float* a, const float* b, int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
  if (i < n) {
    __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
  }
  return hsum512(_mm512_add_ps(s0, s1));
}

struct F32Row512 {
  using T = float;
  static __attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512 load16(const float* w, int64_t i) {
    return _mm512_loadu_ps(w + i);
  }
  static __attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512 load16(__mmask16 m, const float* w,
                                                                                     int64_t i) {
    return _mm512_maskz_loadu_ps(m, w + i);
  }
  static int64_t stride(int64_t k) { return k; }
};
struct F16Row512 {
  using T = uint16_t;
  static __attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512 load16(const uint16_t* w, int64_t i) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i)));
  }
  static __attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512 load16(__mmask16 m, const uint16_t* w,
                                                                                     int64_t i) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w + i));
  }
  static int64_t stride(int64_t k) { return k; }
};
struct Q8_0Row512 {
  using T = uint8_t;
  static __attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512 load16(const uint8_t* w, int64_t i) {
    const kquants::BlockQ8_0& b = Q8_0Row::block(w, i);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + i % kquants::kLegacyBlock));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(b.d))));
  }
  static __attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512 load16(__mmask16 m, const uint8_t* w,
                                                                                     int64_t i) {
    const kquants::BlockQ8_0& b = Q8_0Row::block(w, i);
    const __m128i q = _mm_maskz_loadu_epi8(m, b.qs + i % kquants::kLegacyBlock);
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(b.d))));
  }
  static int64_t stride(int64_t k) { return Q8_0Row::stride(k); }
};

template <typename Row>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void dot4_avx512(const float* x, const typename Row::T* w, int64_t n, float* y) {
  const typename Row::T* w0 = w;
  const typename Row::T* w1 = w + Row::stride(n);
  const typename Row::T* w2 = w + 2 * Row::stride(n);
  const typename Row::T* w3 = w + 3 * Row::stride(n);
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    if constexpr (sizeof(typename Row::T) == 2) {
      if ((i & 31) == 0) {  // one cache line of each row per 32 elements, 2 KiB ahead
        _mm_prefetch(reinterpret_cast<const char*>(w0 + i + 1024), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(w1 + i + 1024), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(w2 + i + 1024), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(w3 + i + 1024), _MM_HINT_T0);
      }
    }
    __m512 xv = _mm512_loadu_ps(x + i);
    s0 = _mm512_fmadd_ps(xv, Row::load16(w0, i), s0);
    s1 = _mm512_fmadd_ps(xv, Row::load16(w1, i), s1);
    s2 = _mm512_fmadd_ps(xv, Row::load16(w2, i), s2);
    s3 = _mm512_fmadd_ps(xv, Row::load16(w3, i), s3);
  }
  if (i < n) {
    __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
    s0 = _mm512_fmadd_ps(xv, Row::load16(m, w0, i), s0);
    s1 = _mm512_fmadd_ps(xv, Row::load16(m, w1, i), s1);
    s2 = _mm512_fmadd_ps(xv, Row::load16(m, w2, i), s2);
    s3 = _mm512_fmadd_ps(xv, Row::load16(m, w3, i), s3);
  }
  y[0] = hsum512(s0);
  y[1] = hsum512(s1);
  y[2] = hsum512(s2);
  y[3] = hsum512(s3);
}

// T tokens x 4 rows (T = 6: 24 accumulators, 10 loads per 24 multiply-adds;
// T = 4: 16 and 8 per 16), the rows f32 or f16 converted in registers. Each
// sum is formed in the order of dot4_avx512, so neither the block size nor
// the row type changes a result.
template <int T, typename Row>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void gemm_tx4_avx512(const float* x, int64_t xs,
                                                                         const typename Row::T* w, int64_t k,
                                                                         float* y, int64_t ys) {
  __m512 acc[T][4];
  for (auto& r : acc)
    for (auto& a : r) a = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    __m512 wv[4];
    for (int r = 0; r < 4; ++r) wv[r] = Row::load16(w + r * Row::stride(k), i);
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_loadu_ps(x + t * xs + i);
      for (int r = 0; r < 4; ++r) acc[t][r] = _mm512_fmadd_ps(xv, wv[r], acc[t][r]);
    }
  }
  if (i < k) {
    const __mmask16 m = static_cast<__mmask16>((1u << (k - i)) - 1);
    __m512 wv[4];
    for (int r = 0; r < 4; ++r) wv[r] = Row::load16(m, w + r * Row::stride(k), i);
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + t * xs + i);
      for (int r = 0; r < 4; ++r) acc[t][r] = _mm512_fmadd_ps(xv, wv[r], acc[t][r]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < 4; ++r) y[t * ys + r] = hsum512(acc[t][r]);
}

// 2 tokens x 4 rows: 8 accumulators, 6 loads per 8 multiply-adds; the order
// of dot4_avx2.
template <typename Row>
__attribute__((target("avx2,fma,f16c"))) void gemm2x4_avx2(const float* x, int64_t xs, const typename Row::T* w,
                                                           int64_t k, float* y, int64_t ys) {
  __m256 acc[2][4];
  for (auto& r : acc)
    for (auto& a : r) a = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    __m256 wv[4];
    for (int r = 0; r < 4; ++r) wv[r] = Row::load8(w + r * Row::stride(k), i);
    for (int t = 0; t < 2; ++t) {
      const __m256 xv = _mm256_loadu_ps(x + t * xs + i);
      for (int r = 0; r < 4; ++r) acc[t][r] = _mm256_fmadd_ps(xv, wv[r], acc[t][r]);
    }
  }
  for (int t = 0; t < 2; ++t)
    for (int r = 0; r < 4; ++r) {
      float s = hsum256(acc[t][r]);
      for (int64_t j = i; j < k; ++j) s = std::fma(x[t * xs + j], Row::at(w + r * Row::stride(k), j), s);  // as dot4_avx2's tail
      y[t * ys + r] = s;
    }
}

// Blocks of tb tokens x 4 rows while they fit; the rows past a multiple of 4
// and the tokens past the blocks through dot_rows (dot_rows_f32 or
// dot_rows_f16), which form their sums in the same orders.
template <typename Row512, typename Row256, typename W>
void gemm_tile(const float* x, int64_t tokens, int64_t xs, const W* w, int64_t rows, int64_t k, float* y, int64_t ys,
               void (*dot_rows)(const float*, const W*, int64_t, int64_t, float*)) {
  using Block = void (*)(const float*, int64_t, const W*, int64_t, float*, int64_t);
  int64_t t = 0;
  auto blocks = [&](int64_t tb, Block kernel) {
    for (; t + tb <= tokens; t += tb) {
      int64_t r = 0;
      for (; r + 4 <= rows; r += 4) kernel(x + t * xs, xs, w + r * Row512::stride(k), k, y + t * ys + r, ys);
      if (r < rows)
        for (int64_t u = t; u < t + tb; ++u)
          dot_rows(x + u * xs, w + r * Row512::stride(k), k, rows - r, y + u * ys + r);
    }
  };
  const SimdLevel level = simd_level();
  if (level == SimdLevel::Avx512) {
    blocks(6, gemm_tx4_avx512<6, Row512>);
    blocks(4, gemm_tx4_avx512<4, Row512>);
  } else if (level == SimdLevel::Avx2) {
    blocks(2, gemm2x4_avx2<Row256>);
  }
  for (; t < tokens; ++t) dot_rows(x + t * xs, w, k, rows, y + t * ys);
}

__attribute__((target("avx512f"))) void f16_to_f32_avx512(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
  if (i < n) f16_to_f32_avx2(s + i, d + i, n - i);
}

}  // namespace

// ---- dispatch ---------------------------------------------------------------

float dot_f32(const float* a, const float* b, int64_t n) {
  switch (simd_level()) {
    case SimdLevel::Avx512: return dot_avx512(a, b, n);
    case SimdLevel::Avx2: return dot_avx2(a, b, n);
    default: return ref::dot_f32(a, b, n);
  }
}

void dot_rows_f32(const float* x, const float* w, int64_t n, int64_t rows, float* y) {
  SimdLevel level = simd_level();
  int64_t r = 0;
  if (level != SimdLevel::Scalar) {
    for (; r + 4 <= rows; r += 4) {
      if (level == SimdLevel::Avx512) dot4_avx512<F32Row512>(x, w + r * n, n, y + r);
      else dot4_avx2<F32Row>(x, w + r * n, n, y + r);
    }
  }
  for (; r < rows; ++r) y[r] = dot_f32(x, w + r * n, n);
}

namespace {
// Rows 4 at a time by dot4 (converted in registers), the rest decoded to f32
// by `decode` and dotted by dot_f32: the floats of decoding every row first
// and calling dot_rows_f32.
template <typename Row512, typename Row256>
void dot_rows_decoding(const float* x, const typename Row512::T* w, int64_t n, int64_t rows, float* y,
                       void (*decode)(const typename Row512::T*, float*, int64_t)) {
  const SimdLevel level = simd_level();
  const int64_t stride = Row512::stride(n);
  int64_t r = 0;
  if (level != SimdLevel::Scalar) {
    for (; r + 4 <= rows; r += 4) {
      if (level == SimdLevel::Avx512) dot4_avx512<Row512>(x, w + r * stride, n, y + r);
      else dot4_avx2<Row256>(x, w + r * stride, n, y + r);
    }
  }
  if (r < rows) {
    thread_local std::vector<float> row;
    row.resize(static_cast<size_t>(n));
    for (; r < rows; ++r) {
      decode(w + r * stride, row.data(), n);
      y[r] = dot_f32(x, row.data(), n);
    }
  }
}

void decode_f16_row(const uint16_t* w, float* out, int64_t n) { row_to_f32(DType::F16, w, out, n); }
}  // namespace

void dot_rows_f16(const float* x, const uint16_t* w, int64_t n, int64_t rows, float* y) {
  dot_rows_decoding<F16Row512, F16Row>(x, w, n, rows, y, decode_f16_row);
}

void decode_q8_0_row(const uint8_t* w, float* out, int64_t n) {
  const auto* blocks = reinterpret_cast<const kquants::BlockQ8_0*>(w);
  for (int64_t b = 0; b < n / kquants::kLegacyBlock; ++b) kquants::dequantize_block(blocks[b], out + b * kquants::kLegacyBlock);
}

void dot_rows_q8_0(const float* x, const uint8_t* w, int64_t n, int64_t rows, float* y) {
  dot_rows_decoding<Q8_0Row512, Q8_0Row>(x, w, n, rows, y, decode_q8_0_row);
}

int64_t gemm_tile_token_block() {
  const SimdLevel level = simd_level();
  return level == SimdLevel::Avx512 ? 4 : level == SimdLevel::Avx2 ? 2 : 1;
}

namespace ref {
void gemm_tile_f32(const float* x, int64_t tokens, int64_t xs, const float* w, int64_t rows, int64_t k, float* y,
                   int64_t ys) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t r = 0; r < rows; ++r) y[t * ys + r] = dot_f32(x + t * xs, w + r * k, k);
}
}  // namespace ref

void gemm_tile_f32(const float* x, int64_t tokens, int64_t xs, const float* w, int64_t rows, int64_t k, float* y,
                   int64_t ys) {
  gemm_tile<F32Row512, F32Row>(x, tokens, xs, w, rows, k, y, ys, dot_rows_f32);
}

void gemm_tile_f16(const float* x, int64_t tokens, int64_t xs, const uint16_t* w, int64_t rows, int64_t k, float* y,
                   int64_t ys) {
  gemm_tile<F16Row512, F16Row>(x, tokens, xs, w, rows, k, y, ys, dot_rows_f16);
}

void gemm_tile_q8_0(const float* x, int64_t tokens, int64_t xs, const uint8_t* w, int64_t rows, int64_t k, float* y,
                    int64_t ys) {
  gemm_tile<Q8_0Row512, Q8_0Row>(x, tokens, xs, w, rows, k, y, ys, dot_rows_q8_0);
}

void row_to_f32(DType dtype, const void* src, float* dst, int64_t n) {
  SimdLevel level = simd_level();
  if (dtype == DType::F16 && level == SimdLevel::Avx512)
    return f16_to_f32_avx512(static_cast<const uint16_t*>(src), dst, n);
  if (dtype == DType::F16 && level == SimdLevel::Avx2)
    return f16_to_f32_avx2(static_cast<const uint16_t*>(src), dst, n);
  if (dtype == DType::BF16 && level != SimdLevel::Scalar)
    return bf16_to_f32_avx2(static_cast<const uint16_t*>(src), dst, n);
  ref::row_to_f32(dtype, src, dst, n);
}

void rms_norm(const float* x, const float* weight, float eps, int64_t n, float* out) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  if (weight) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale;
  }
}

void swiglu(float* gate, const float* up, int64_t n) {
  if (simd_level() != SimdLevel::Scalar) return swiglu_avx2(gate, up, n);
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.f + std::exp(-g)) * up[i];
  }
}

namespace ref {

void softmax(float* x, int64_t n) {
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

double logsumexp(const float* x, int64_t n) {
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - mx);
  return mx + std::log(sum);
}

double kl_divergence(const float* p, double p_lse, const float* q, double q_lse, int64_t n) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double lp = p[i] - p_lse, lq = q[i] - q_lse;
    total += std::exp(lp) * (lp - lq);
  }
  return total;
}

}  // namespace ref

double logsumexp(const float* x, int64_t n) {
  if (simd_level() != SimdLevel::Scalar) return logsumexp_avx2(x, n);
  return ref::logsumexp(x, n);
}

double kl_divergence(const float* p, double p_lse, const float* q, double q_lse, int64_t n) {
  if (simd_level() != SimdLevel::Scalar) return kl_avx2(p, p_lse, q, q_lse, n);
  return ref::kl_divergence(p, p_lse, q, q_lse, n);
}

void softmax(float* x, int64_t n) {
  if (simd_level() != SimdLevel::Scalar) return softmax_avx2(x, n);
  ref::softmax(x, n);
}

void axpy(float a, const float* x, float* y, int64_t n) {
  if (simd_level() != SimdLevel::Scalar) return axpy_avx2(a, x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace qf::rt
