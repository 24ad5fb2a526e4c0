// The scale searches of kquant_search.cpp run on 8 groups at once: each AVX2
// lane follows one group through exactly the scalar function's sequence of
// float operations (same operands, same order, no fused multiply-add), and a
// data-dependent branch of the scalar code becomes a per-lane select. The
// results are therefore bit for bit those of 8 scalar calls, which is what
// byte identity with llama.cpp needs (kquants_test checks it on every level).
// Below AVX2 the x8 functions make the 8 scalar calls.

#include "quantizers/kquant_impl.h"  // first: its pragma turns off FMA contraction for this file

#include <immintrin.h>

#include <cstring>

#include "core/simd.h"
#include "quantizers/kquant_avx2.h"

namespace qf::kquants::detail {

namespace {

constexpr int kMaxGroup = 32;

// v[i] lane g = src[g * n + i] for i < n: group g's element i.
QF_AVX2_INLINE void load_groups(const float* src, int n, __m256* v) {
  alignas(32) float t[8];
  for (int i = 0; i < n; ++i) {
    for (int g = 0; g < 8; ++g) t[g] = src[g * n + i];
    v[i] = _mm256_load_ps(t);
  }
}

// The fit weights as load_groups lays them out, or x^2 (the scalar searches'
// default) when there are none.
QF_AVX2_INLINE void load_weights(const float* w, int n, const __m256* xv, __m256* wv) {
  if (w)
    load_groups(w, n, wv);
  else
    for (int i = 0; i < n; ++i) wv[i] = _mm256_mul_ps(xv[i], xv[i]);
}

// ggml's nearest_int on 8 lanes: the same magic-number addition and bit mask.
QF_AVX2_INLINE __m256i nearest8(__m256 v) {
  const __m256 shifted = _mm256_add_ps(v, _mm256_set1_ps(12582912.f));
  return _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(shifted), _mm256_set1_epi32(0x007fffff)),
                          _mm256_set1_epi32(0x00400000));
}

QF_AVX2_INLINE __m256i clamp8(__m256i v, __m256i lo, __m256i hi) {
  return _mm256_min_epi32(_mm256_max_epi32(v, lo), hi);
}

QF_AVX2_INLINE __m256 select(__m256 keep, __m256 take, __m256 mask) { return _mm256_blendv_ps(keep, take, mask); }
QF_AVX2_INLINE __m256i select(__m256i keep, __m256i take, __m256 mask) {
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(keep), _mm256_castsi256_ps(take), mask));
}

QF_AVX2_INLINE __m256 fabs8(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.f), v); }

// Codes lane g of v[i] -> out[g * n + i] (+ offset), or 0 in lanes of `zero`.
template <typename T>
QF_AVX2_INLINE void store_groups(const __m256i* v, int n, int offset, __m256 zero, T* out) {
  alignas(32) int32_t t[8];
  const int zmask = _mm256_movemask_ps(zero);
  for (int i = 0; i < n; ++i) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(t), v[i]);
    for (int g = 0; g < 8; ++g) out[g * n + i] = static_cast<T>(((zmask >> g) & 1) ? 0 : t[g] + offset);
  }
}

// max |x| and the signed x that has it, over n elements ("if (ax > amax)").
QF_AVX2_INLINE void signed_absmax(const __m256* x, int n, __m256* amax, __m256* max) {
  __m256 a = _mm256_setzero_ps(), m = _mm256_setzero_ps();
  for (int i = 0; i < n; ++i) {
    const __m256 ax = fabs8(x[i]);
    const __m256 gt = _mm256_cmp_ps(ax, a, _CMP_GT_OQ);
    a = select(a, ax, gt);
    m = select(m, x[i], gt);
  }
  *amax = a;
  *max = m;
}

// Functions rather than lambdas: a lambda inside a target("avx2") function
// does not inherit the target under clang, which then refuses the intrinsics.

// One element's weighted error in the asymmetric search: w * |s * l + m - x|
// (use_mad) or w * (s * l + m - x)^2.
QF_AVX2_INLINE __m256 error_term8(__m256 s, __m256 m, __m256 lf, __m256 x, __m256 w, bool use_mad) {
  __m256 diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(s, lf), m), x);
  diff = use_mad ? fabs8(diff) : _mm256_mul_ps(diff, diff);
  return _mm256_mul_ps(w, diff);
}

// The symmetric search's codes for one inverse scale, and its sums
// sum w x l and sum w l^2.
QF_AVX2_INLINE void fit_symmetric8(__m256 iscale, const __m256* xv, const __m256* wv, int n, __m256i lo, __m256i hi,
                                   __m256i* Lout, __m256* sumlx, __m256* suml2) {
  __m256 slx = _mm256_setzero_ps(), sl2 = _mm256_setzero_ps();
  for (int i = 0; i < n; ++i) {
    Lout[i] = clamp8(nearest8(_mm256_mul_ps(iscale, xv[i])), lo, hi);
    const __m256 lf = _mm256_cvtepi32_ps(Lout[i]);
    slx = _mm256_add_ps(slx, _mm256_mul_ps(_mm256_mul_ps(wv[i], xv[i]), lf));
    sl2 = _mm256_add_ps(sl2, _mm256_mul_ps(_mm256_mul_ps(wv[i], lf), lf));
  }
  *sumlx = slx;
  *suml2 = sl2;
}

QF_AVX2 void asymmetric_avx2(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* scales,
                             float* neg_mins, float rmin, float rdelta, int nstep, bool use_mad, bool x3) {
  __m256 xv[kMaxGroup] = {}, wv[kMaxGroup] = {};  // zeroed: GCC cannot see that n >= 1 fills [0]
  __m256i Lv[kMaxGroup], La[kMaxGroup];
  load_groups(x, n, xv);
  load_weights(weights, n, xv, wv);
  const __m256 zero = _mm256_setzero_ps();
  const __m256i lo = _mm256_setzero_si256(), hi = _mm256_set1_epi32(nmax);
  __m256 min = xv[0], max = xv[0];
  const __m256 sum_w0 = wv[0];
  __m256 sum_w = sum_w0, sum_x = _mm256_mul_ps(sum_w0, xv[0]);
  for (int i = 1; i < n; ++i) {
    min = _mm256_min_ps(xv[i], min);  // x < min ? x : min
    max = _mm256_max_ps(xv[i], max);  // x > max ? x : max
    sum_w = _mm256_add_ps(sum_w, wv[i]);
    sum_x = _mm256_add_ps(sum_x, _mm256_mul_ps(wv[i], xv[i]));
  }
  min = select(min, zero, _mm256_cmp_ps(min, zero, _CMP_GT_OQ));
  // Two calls: the predicate must be a constant expression (clang insists).
  const __m256 flat = x3 ? _mm256_cmp_ps(max, min, _CMP_LE_OQ) : _mm256_cmp_ps(max, min, _CMP_EQ_OQ);
  __m256 iscale = _mm256_div_ps(_mm256_set1_ps(static_cast<float>(nmax)), _mm256_sub_ps(max, min));
  __m256 scale = _mm256_div_ps(_mm256_set1_ps(1.f), iscale);
  __m256 best_error = zero;
  for (int i = 0; i < n; ++i) {
    Lv[i] = clamp8(nearest8(_mm256_mul_ps(iscale, _mm256_sub_ps(xv[i], min))), lo, hi);
    best_error = _mm256_add_ps(best_error, error_term8(scale, min, _mm256_cvtepi32_ps(Lv[i]), xv[i], wv[i], use_mad));
  }
  for (int is = 0; nstep >= 1 && is <= nstep; ++is) {
    // The scalar expression, same roundings; min is the best fit's so far.
    const float num = rmin + rdelta * is + nmax;
    iscale = _mm256_div_ps(_mm256_set1_ps(num), _mm256_sub_ps(max, min));
    __m256 sum_l = zero, sum_l2 = zero, sum_xl = zero;
    for (int i = 0; i < n; ++i) {
      La[i] = clamp8(nearest8(_mm256_mul_ps(iscale, _mm256_sub_ps(xv[i], min))), lo, hi);
      const __m256 lf = _mm256_cvtepi32_ps(La[i]);
      const __m256 wl = _mm256_mul_ps(wv[i], lf);
      sum_l = _mm256_add_ps(sum_l, wl);
      sum_l2 = _mm256_add_ps(sum_l2, _mm256_mul_ps(wl, lf));
      sum_xl = _mm256_add_ps(sum_xl, _mm256_mul_ps(wl, xv[i]));
    }
    const __m256 D = _mm256_sub_ps(_mm256_mul_ps(sum_w, sum_l2), _mm256_mul_ps(sum_l, sum_l));
    const __m256 d_pos = _mm256_cmp_ps(D, zero, _CMP_GT_OQ);
    if (!_mm256_movemask_ps(d_pos)) continue;
    __m256 this_scale = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sum_w, sum_xl), _mm256_mul_ps(sum_x, sum_l)), D);
    __m256 this_min = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sum_l2, sum_x), _mm256_mul_ps(sum_l, sum_xl)), D);
    const __m256 min_pos = _mm256_cmp_ps(this_min, zero, _CMP_GT_OQ);
    this_min = select(this_min, zero, min_pos);
    this_scale = select(this_scale, _mm256_div_ps(sum_xl, sum_l2), min_pos);
    __m256 err = zero;
    for (int i = 0; i < n; ++i)
      err = _mm256_add_ps(err, error_term8(this_scale, this_min, _mm256_cvtepi32_ps(La[i]), xv[i], wv[i], use_mad));
    const __m256 take = _mm256_andnot_ps(flat, _mm256_and_ps(d_pos, _mm256_cmp_ps(err, best_error, _CMP_LT_OQ)));
    if (!_mm256_movemask_ps(take)) continue;
    for (int i = 0; i < n; ++i) Lv[i] = select(Lv[i], La[i], take);
    best_error = select(best_error, err, take);
    scale = select(scale, this_scale, take);
    min = select(min, this_min, take);
  }
  store_groups(Lv, n, 0, flat, L);
  _mm256_storeu_ps(scales, select(scale, zero, flat));
  _mm256_storeu_ps(neg_mins, _mm256_xor_ps(min, _mm256_set1_ps(-0.f)));
}

QF_AVX2 void symmetric_avx2(int n, int nmax, const float* x, int8_t* L, float* scales, const float* qw) {
  __m256 xv[kMaxGroup], wv[kMaxGroup];
  __m256i Lv[kMaxGroup], Ln[kMaxGroup];
  load_groups(x, n, xv);
  load_weights(qw, n, xv, wv);
  const __m256 zero = _mm256_setzero_ps();
  const __m256i lo = _mm256_set1_epi32(-nmax), hi = _mm256_set1_epi32(nmax - 1);
  __m256 amax, max;
  signed_absmax(xv, n, &amax, &max);
  const __m256 small = _mm256_cmp_ps(amax, _mm256_set1_ps(kGroupMaxEps), _CMP_LT_OQ);
  __m256 sumlx, suml2;
  fit_symmetric8(_mm256_div_ps(_mm256_set1_ps(static_cast<float>(-nmax)), max), xv, wv, n, lo, hi, Lv, &sumlx, &suml2);
  __m256 scale = select(zero, _mm256_div_ps(sumlx, suml2), _mm256_cmp_ps(suml2, zero, _CMP_NEQ_UQ));
  __m256 best = _mm256_mul_ps(scale, sumlx);
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    const float num = -(nmax + 0.1f * is);  // the scalar expression, same roundings
    fit_symmetric8(_mm256_div_ps(_mm256_set1_ps(num), max), xv, wv, n, lo, hi, Ln, &sumlx, &suml2);
    const __m256 take = _mm256_and_ps(_mm256_cmp_ps(suml2, zero, _CMP_GT_OQ),
                                      _mm256_cmp_ps(_mm256_mul_ps(sumlx, sumlx), _mm256_mul_ps(best, suml2), _CMP_GT_OQ));
    if (!_mm256_movemask_ps(take)) continue;
    for (int i = 0; i < n; ++i) Lv[i] = select(Lv[i], Ln[i], take);
    scale = select(scale, _mm256_div_ps(sumlx, suml2), take);
    best = select(best, _mm256_mul_ps(scale, sumlx), take);
  }
  store_groups(Lv, n, nmax, small, L);
  _mm256_storeu_ps(scales, select(scale, zero, small));
}

QF_AVX2 void q3_avx2(int n, int nmax, const float* x, int8_t* L, float* scales) {
  __m256 xv[kMaxGroup], wx[kMaxGroup];
  __m256i Lv[kMaxGroup];
  load_groups(x, n, xv);
  const __m256 zero = _mm256_setzero_ps();
  const __m256i lo = _mm256_set1_epi32(-nmax), hi = _mm256_set1_epi32(nmax - 1);
  __m256 amax, max;
  signed_absmax(xv, n, &amax, &max);
  const __m256 small = _mm256_cmp_ps(amax, _mm256_set1_ps(kGroupMaxEps), _CMP_LT_OQ);
  const __m256 iscale = _mm256_div_ps(_mm256_set1_ps(static_cast<float>(-nmax)), max);
  __m256 sumlx = zero, suml2 = zero;
  for (int i = 0; i < n; ++i) {
    Lv[i] = clamp8(nearest8(_mm256_mul_ps(iscale, xv[i])), lo, hi);
    const __m256 w = _mm256_mul_ps(xv[i], xv[i]);
    wx[i] = _mm256_mul_ps(w, xv[i]);
    const __m256 lf = _mm256_cvtepi32_ps(Lv[i]);
    sumlx = _mm256_add_ps(sumlx, _mm256_mul_ps(wx[i], lf));
    suml2 = _mm256_add_ps(suml2, _mm256_mul_ps(_mm256_mul_ps(w, lf), lf));
  }
  // A lane whose pass changed nothing would change nothing in a later pass
  // either (same state, same decisions), so running all lanes until none
  // changes gives each lane the scalar loop's result.
  for (int pass = 0; pass < 5; ++pass) {
    __m256 changed = zero;
    for (int i = 0; i < n; ++i) {
      const __m256 w = _mm256_mul_ps(xv[i], xv[i]);
      const __m256 lf = _mm256_cvtepi32_ps(Lv[i]);
      __m256 slx = _mm256_sub_ps(sumlx, _mm256_mul_ps(wx[i], lf));
      const __m256 slx_pos = _mm256_cmp_ps(slx, zero, _CMP_GT_OQ);
      if (!_mm256_movemask_ps(slx_pos)) continue;
      __m256 sl2 = _mm256_sub_ps(suml2, _mm256_mul_ps(_mm256_mul_ps(w, lf), lf));
      const __m256i nl = clamp8(nearest8(_mm256_div_ps(_mm256_mul_ps(xv[i], sl2), slx)), lo, hi);
      const __m256 differs = _mm256_xor_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(nl, Lv[i])), _mm256_castsi256_ps(_mm256_set1_epi32(-1)));
      const __m256 nlf = _mm256_cvtepi32_ps(nl);
      slx = _mm256_add_ps(slx, _mm256_mul_ps(wx[i], nlf));
      sl2 = _mm256_add_ps(sl2, _mm256_mul_ps(_mm256_mul_ps(w, nlf), nlf));
      const __m256 better = _mm256_cmp_ps(_mm256_mul_ps(_mm256_mul_ps(slx, slx), suml2),
                                          _mm256_mul_ps(_mm256_mul_ps(sumlx, sumlx), sl2), _CMP_GT_OQ);
      const __m256 take =
          _mm256_and_ps(_mm256_and_ps(slx_pos, differs), _mm256_and_ps(_mm256_cmp_ps(sl2, zero, _CMP_GT_OQ), better));
      Lv[i] = select(Lv[i], nl, take);
      sumlx = select(sumlx, slx, take);
      suml2 = select(suml2, sl2, take);
      changed = _mm256_or_ps(changed, take);
    }
    if (!_mm256_movemask_ps(_mm256_andnot_ps(small, changed))) break;
  }
  store_groups(Lv, n, nmax, small, L);
  const __m256 scale = select(zero, _mm256_div_ps(sumlx, suml2), _mm256_cmp_ps(suml2, zero, _CMP_GT_OQ));
  _mm256_storeu_ps(scales, select(scale, zero, small));
}

bool use_avx2(int n) { return n <= kMaxGroup && qf::simd_level() >= SimdLevel::Avx2; }

}  // namespace

void search_asymmetric_x8(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* scales,
                          float* neg_mins, float rmin, float rdelta, int nstep, bool use_mad, bool x3) {
  if (use_avx2(n)) return asymmetric_avx2(n, nmax, x, weights, L, scales, neg_mins, rmin, rdelta, nstep, use_mad, x3);
  uint8_t Laux[kMaxGroup * 8];
  for (int g = 0; g < 8; ++g)
    scales[g] = search_asymmetric(n, nmax, x + g * n, weights ? weights + g * n : nullptr, L + g * n, &neg_mins[g],
                                  Laux, rmin, rdelta, nstep, use_mad, x3);
}

void search_symmetric_x8(int n, int nmax, const float* x, int8_t* L, float* scales, const float* qw) {
  if (use_avx2(n)) return symmetric_avx2(n, nmax, x, L, scales, qw);
  for (int g = 0; g < 8; ++g) scales[g] = search_symmetric(n, nmax, x + g * n, L + g * n, qw ? qw + g * n : nullptr);
}

void search_q3_x8(int n, int nmax, const float* x, int8_t* L, float* scales) {
  if (use_avx2(n)) return q3_avx2(n, nmax, x, L, scales);
  for (int g = 0; g < 8; ++g) scales[g] = search_q3(n, nmax, x + g * n, L + g * n);
}

}  // namespace qf::kquants::detail
