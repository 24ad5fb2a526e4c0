#include "quantizers/act_quant.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/dtype.h"
#include "core/error.h"
#include "quantizers/float_quant.h"
#include "quantizers/int_quant.h"
#include "quantizers/nvfp4.h"

namespace qf {

std::string ActivationScheme::describe() const {
  if (is_nvfp4()) return "nvfp4";
  std::string s = type == QuantType::Float ? "fp8 " : "int" + std::to_string(bits) + (symmetric ? " " : " asym ");
  return s + strategy_name(strategy) + (dynamic ? " dynamic" : " static");
}

void ActivationScheme::validate(const std::string& where) const {
  if (type == QuantType::Float) {
    if (bits == 8) {
      if (!symmetric) throw invalid_input(where, "FP8 activations are symmetric");
      if (strategy != QuantStrategy::Token && strategy != QuantStrategy::Tensor)
        throw invalid_input(where, "FP8 activations use the token (dynamic) or tensor strategy");
      if (strategy == QuantStrategy::Token && !dynamic) throw invalid_input(where, "per-token activation scales are dynamic");
      return;
    }
    if (bits == 4) {
      if (strategy != QuantStrategy::TensorGroup || group_size != 16 || !symmetric)
        throw invalid_input(where, "NVFP4 activations: strategy tensor_group, group_size 16, symmetric");
      return;
    }
    throw invalid_input(where, "float activations have 8 or 4 bits, got " + std::to_string(bits));
  }
  if (bits != 8) throw unsupported(where, "integer activations are quantized to 8 bits only, not " + std::to_string(bits));
  if (strategy != QuantStrategy::Token && strategy != QuantStrategy::Tensor)
    throw invalid_input(where, "int8 activations use the token (dynamic) or tensor strategy");
  if (strategy == QuantStrategy::Token && !dynamic) throw invalid_input(where, "per-token activation scales are dynamic");
  if (strategy == QuantStrategy::Token && !symmetric) throw unsupported(where, "asymmetric per-token activations");
}

namespace {

// compressed-tensors' conventions (quantization/utils/helpers.py
// calculate_qparams, lifecycle/forward_helpers.py _quantize_dequantize):
//   - symmetric scale = amax / (bit_range / 2): int8 amax / 127.5, fp8 amax / 448;
//   - asymmetric int8: scale = (max - min) / 255, zero = round(clamp(-128 - min / scale));
//   - a zero scale becomes the eps of the activation dtype (f32 here);
//   - codes: x / scale (+ zero) in f32, clamped to the type's range, then
//     rounded (int: half to even; fp8/e2m1: the RNE cast);
//   - NVFP4 "local": per 16-value block, scale = e4m3(global * (amax_block / 6))
//     (zero -> 0.125), x / (scale / global) rounded to e2m1.
constexpr float kFp8Max = 448.0f;
constexpr float kInt8Half = 127.5f;  // (127 - (-128)) / 2
constexpr float kF32Eps = std::numeric_limits<float>::epsilon();

float nonzero(float s) { return s > 0 && std::isfinite(s) ? s : kF32Eps; }

float row_amax(const float* x, int64_t n) {
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}

// One NVFP4 block of n (<= 16) values in place, against the global scale.
void nvfp4_block(float* x, int64_t n, float global) {
  const float s = nvfp4_block_scale(row_amax(x, n), global);
  for (int64_t i = 0; i < n; ++i) x[i] = hd::nvfp4_value(hd::nvfp4_code(x[i], s, global), s, global);
}

}  // namespace

ActQuantParams calibrate_activation(const ActivationScheme& s, float min, float max, const std::string& where) {
  s.validate(where);
  if (!std::isfinite(min) || !std::isfinite(max)) throw invalid_input(where, "activation range is not finite");
  ActQuantParams p;
  p.scheme = s;
  const float lo = std::min(min, 0.0f), hi = std::max(max, 0.0f);
  const float amax = std::max(-lo, hi);
  if (s.is_nvfp4()) {
    p.global_scale = nvfp4_global_scale(amax);
    return p;
  }
  if (s.dynamic) return p;
  if (s.type == QuantType::Float) {
    p.scale = nonzero(amax / kFp8Max);
  } else if (s.symmetric) {
    p.scale = nonzero(amax / kInt8Half);
  } else {
    const float scale = (hi - lo) / 255.0f;
    p.scale = nonzero(scale);
    p.zero_point = static_cast<int32_t>(std::nearbyint(std::clamp(-128.0f - lo / p.scale, -128.0f, 127.0f)));
  }
  return p;
}

void quantize_activations_int8(const ActQuantParams& p, const float* x, int64_t n, int64_t in, int8_t* q,
                               float* row_scale, int32_t* row_zero) {
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * in;
    float s = p.scale;
    int32_t z = p.zero_point;
    if (p.scheme.dynamic) {
      s = nonzero(row_amax(xr, in) / kInt8Half);
      z = 0;
    }
    int8_t* qr = q + t * in;
    for (int64_t i = 0; i < in; ++i) qr[i] = hd::quantize_int8(xr[i], s, z);
    row_scale[t] = s;
    row_zero[t] = z;
  }
}

void quantize_activations(const ActQuantParams& p, float* x, int64_t n, int64_t in) {
  const ActivationScheme& s = p.scheme;
  for (int64_t t = 0; t < n; ++t) {
    float* xr = x + t * in;
    if (s.is_nvfp4()) {
      for (int64_t b = 0; b < in; b += 16) nvfp4_block(xr + b, std::min<int64_t>(16, in - b), p.global_scale);
      continue;
    }
    float sc = p.scale;
    int32_t z = p.zero_point;
    if (s.dynamic) {
      sc = nonzero(row_amax(xr, in) / (s.type == QuantType::Float ? kFp8Max : kInt8Half));
      z = 0;
    }
    if (s.type == QuantType::Float) {
      for (int64_t i = 0; i < in; ++i) xr[i] = f8e4m3_to_f32(f32_to_f8e4m3(xr[i] / sc)) * sc;
    } else {
      for (int64_t i = 0; i < in; ++i)
        xr[i] = hd::dequantize_int(hd::quantize_int8(xr[i], sc, z), sc, z);
    }
  }
}

}  // namespace qf
