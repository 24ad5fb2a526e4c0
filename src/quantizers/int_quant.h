// Integer quantization of one element, the formula RTN, GPTQ, AWQ and the
// int8 activation schemes share (compressed-tensors' _quantize and
// _dequantize): x / scale in f32, rounded half to even, shifted by the zero
// point and clamped to the code range; decoding is (q - zero) * scale in f32.
// Host and device (core/hd.h); quantizers/int_quant_test.cpp checks them.
#pragma once

#include <cstdint>

#include "core/bf16.h"
#include "core/f16.h"
#include "core/hd.h"

namespace qf {

// One group's integer quantizer: the scale (already rounded to the scheme's
// scale dtype, > 0) and the unsigned zero point in [0, qmax].
struct GroupParams {
  float scale;
  int32_t zero;
};

}  // namespace qf

namespace qf::hd {

// How an integer scheme's scales are stored (its scale_dtype): f16, bf16,
// or f32 (every other dtype keeps f32 scales).
enum class ScaleStore : uint8_t { F16, BF16, F32 };

// torch.finfo(dtype).eps of the scale dtype: what a zero scale becomes.
QF_HD inline float scale_store_eps(ScaleStore t) {
  return t == ScaleStore::F16 ? 0.0009765625f : (t == ScaleStore::BF16 ? 0.0078125f : 1.1920929e-7f);
}

// A positive f32 scale rounded (RNE) to its store: zero, negative or NaN ->
// eps; above the largest finite value -> that value; a result that rounds
// to zero -> eps.
QF_HD inline float round_scale_to(float s, ScaleStore t) {
  const float eps = scale_store_eps(t);
  if (!(s > 0.0f)) return eps;
  float r;
  if (t == ScaleStore::F16) {
    r = f16_to_f32(f32_to_f16(s < 65504.0f ? s : 65504.0f));
  } else if (t == ScaleStore::BF16) {
    r = bf16_to_f32(f32_to_bf16(s < 3.38953139e38f ? s : 3.38953139e38f));
  } else {
    r = s < 3.40282347e38f ? s : 3.40282347e38f;
  }
  return r > 0.0f ? r : eps;
}

// (scale, zero) for the range [lo, hi] (lo <= 0 <= hi), the scale rounded
// to its store before the zero point is computed from it (rtn.h).
QF_HD inline GroupParams params_for_range(float lo, float hi, bool symmetric, int32_t qmax, ScaleStore t) {
  GroupParams p{};
  if (symmetric) {
    const float amax = -lo > hi ? -lo : hi;
    p.scale = round_scale_to(amax / (static_cast<float>(qmax) / 2.0f), t);
    p.zero = (qmax + 1) / 2;  // 2^(bits-1)
  } else {
    p.scale = round_scale_to((hi - lo) / static_cast<float>(qmax), t);
    const float z = round_half_even(-lo / p.scale);
    const float hi_z = static_cast<float>(qmax);
    p.zero = static_cast<int32_t>(z < 0.0f ? 0.0f : (hi_z < z ? hi_z : z));
  }
  return p;
}

// Unsigned code: clamp(round(x / scale) + zero, 0, qmax); NaN gives the zero
// point (the code of 0). `scale` > 0; codes fit 8 bits (qmax <= 255).
QF_HD inline uint8_t quantize_int(float x, float scale, int32_t zero, int32_t qmax) {
  const float t = round_half_even(x / scale) + static_cast<float>(zero);
  if (t != t) return static_cast<uint8_t>(zero);
  const float hi = static_cast<float>(qmax);
  return static_cast<uint8_t>(t < 0.0f ? 0.0f : (hi < t ? hi : t));
}

// (q - zero) * scale in f32.
QF_HD inline float dequantize_int(int32_t q, float scale, int32_t zero) {
  return static_cast<float>(q - zero) * scale;
}

// Signed int8 code of an activation: round(clamp(x / scale + zero, -128, 127)),
// clamped before rounding as compressed-tensors does for activations (the
// same code as rounding first, except at the clamp bounds, which are
// integers). `scale` > 0; x / scale + zero must not be NaN.
QF_HD inline int8_t quantize_int8(float x, float scale, int32_t zero) {
  const float t = x / scale + static_cast<float>(zero);
  return static_cast<int8_t>(round_half_even(t < -128.0f ? -128.0f : (127.0f < t ? 127.0f : t)));
}

// The range [min(x, 0), max(x, 0)] of the n values x[k * stride], taken as
// f32; NaN is ignored.
template <class T>
QF_HD inline void group_range(const T* x, int64_t n, int64_t stride, float* lo, float* hi) {
  float l = 0.0f, h = 0.0f;
  for (int64_t k = 0; k < n; ++k) {
    const float v = static_cast<float>(x[k * stride]);
    if (v < l) l = v;
    if (v > h) h = v;
  }
  *lo = l;
  *hi = h;
}

// The min-max observer's (scale, zero) for those values.
template <class T>
QF_HD inline GroupParams minmax_fit(const T* x, int64_t n, int64_t stride, bool symmetric, int32_t qmax,
                                    ScaleStore store) {
  float lo, hi;
  group_range(x, n, stride, &lo, &hi);
  return params_for_range(lo, hi, symmetric, qmax, store);
}

}  // namespace qf::hd
