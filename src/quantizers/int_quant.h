// Integer quantization of one element, the formula RTN, GPTQ, AWQ and the
// int8 activation schemes share (compressed-tensors' _quantize and
// _dequantize): x / scale in f32, rounded half to even, shifted by the zero
// point and clamped to the code range; decoding is (q - zero) * scale in f32.
// Host and device (core/hd.h); quantizers/int_quant_test.cpp checks them.
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace qf::hd {

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

}  // namespace qf::hd
