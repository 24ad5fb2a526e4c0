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
#include "quantizers/kquants.h"
#include "runtime/cpu/gemm_blocks.h"
#include "runtime/cpu/row_kinds.h"

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

using blocks::hsum256;
using blocks::hsum512;
using rows::F16Row;
using rows::F32Row;
using rows::Q8_0Row;

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
    case SimdLevel::Amx:
    case SimdLevel::Avx512: return dot_avx512(a, b, n);
    case SimdLevel::Avx2: return dot_avx2(a, b, n);
    default: return ref::dot_f32(a, b, n);
  }
}

void dot_rows_f32(const float* x, const float* w, int64_t n, int64_t rows, float* y) {
  blocks::dot_rows_kind<F32Row>(x, w, n, rows, y, nullptr);  // f32: used in place
}

namespace {
void decode_f16_row(const uint16_t* w, float* out, int64_t n) { row_to_f32(DType::F16, w, out, n); }
}  // namespace

void dot_rows_f16(const float* x, const uint16_t* w, int64_t n, int64_t rows, float* y) {
  blocks::dot_rows_kind<F16Row>(x, w, n, rows, y, decode_f16_row);
}

namespace {
// The Q8_0 kernels read whole 32-element blocks (their masked tail ignores the
// mask): a row of another length is a caller's bug.
void check_q8_0_length(int64_t k) {
  if (k % kquants::kLegacyBlock != 0)
    throw Error(ErrorKind::Internal, "Q8_0 row length " + std::to_string(k) + " is not a multiple of 32");
}
}  // namespace

void decode_q8_0_row(const uint8_t* w, float* out, int64_t n) { kquants::dequantize_row(ggml_type::Q8_0, w, out, n); }

void dot_rows_q8_0(const float* x, const uint8_t* w, int64_t n, int64_t rows, float* y) {
  check_q8_0_length(n);
  blocks::dot_rows_kind<Q8_0Row>(x, w, n, rows, y, decode_q8_0_row);
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
  blocks::gemm_tile<F32Row>(x, tokens, xs, w, rows, k, y, ys, dot_rows_f32, nullptr);
}

void gemm_tile_f16(const float* x, int64_t tokens, int64_t xs, const uint16_t* w, int64_t rows, int64_t k, float* y,
                   int64_t ys) {
  blocks::gemm_tile<F16Row>(x, tokens, xs, w, rows, k, y, ys, dot_rows_f16, decode_f16_row);
}

void gemm_tile_q8_0(const float* x, int64_t tokens, int64_t xs, const uint8_t* w, int64_t rows, int64_t k, float* y,
                    int64_t ys) {
  check_q8_0_length(k);
  blocks::gemm_tile<Q8_0Row>(x, tokens, xs, w, rows, k, y, ys, dot_rows_q8_0, decode_q8_0_row);
}

void row_to_f32(DType dtype, const void* src, float* dst, int64_t n) {
  SimdLevel level = simd_level();
  if (dtype == DType::F16 && level >= SimdLevel::Avx512)
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
