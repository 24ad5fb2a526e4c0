#include "quantizers/act_quant.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "core/error.h"

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

}  // namespace qf

namespace qf {
namespace {

constexpr float kFp8Max = 448.0f, kFp4Max = 6.0f;

float nonzero(float s) { return s > 0 && std::isfinite(s) ? s : 1.0f; }

// One NVFP4 block of 16 (or fewer) values in place, against the global scale.
void nvfp4_block(float* x, int64_t n, float global) {
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  float s = f8e4m3_to_f32(f32_to_f8e4m3(global * (amax / kFp4Max)));
  if (s == 0) s = 1.0f;  // all-zero block (or underflow): codes are zero either way
  const float inv = global / s;  // x / (s / global)
  for (int64_t i = 0; i < n; ++i) x[i] = e2m1_to_f32(f32_to_e2m1(x[i] * inv)) * (s / global);
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
    p.global_scale = amax > 0 ? kFp8Max * kFp4Max / amax : 1.0f;
    return p;
  }
  if (s.dynamic) return p;
  if (s.type == QuantType::Float) {
    p.scale = nonzero(amax / kFp8Max);
  } else if (s.symmetric) {
    p.scale = nonzero(amax / 127.5f);
  } else {
    p.scale = nonzero((hi - lo) / 255.0f);
    p.zero_point = static_cast<int32_t>(std::clamp(std::nearbyint(-128.0f - lo / p.scale), -128.0f, 127.0f));
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
      float amax = 0;
      for (int64_t i = 0; i < in; ++i) amax = std::max(amax, std::fabs(xr[i]));
      s = nonzero(amax / 127.5f);
      z = 0;
    }
    const float inv = 1.0f / s;
    for (int64_t i = 0; i < in; ++i)
      q[t * in + i] = static_cast<int8_t>(std::clamp(std::nearbyint(xr[i] * inv) + static_cast<float>(z), -128.0f, 127.0f));
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
      float amax = 0;
      for (int64_t i = 0; i < in; ++i) amax = std::max(amax, std::fabs(xr[i]));
      sc = nonzero(amax / (s.type == QuantType::Float ? kFp8Max : 127.5f));
      z = 0;
    }
    if (s.type == QuantType::Float) {
      for (int64_t i = 0; i < in; ++i) xr[i] = f8e4m3_to_f32(f32_to_f8e4m3(xr[i] / sc)) * sc;
    } else {
      for (int64_t i = 0; i < in; ++i)
        xr[i] = (std::clamp(std::nearbyint(xr[i] / sc) + static_cast<float>(z), -128.0f, 127.0f) - static_cast<float>(z)) * sc;
    }
  }
}

}  // namespace qf
