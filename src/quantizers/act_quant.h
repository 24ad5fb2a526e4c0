// Activation (input) quantization of a Linear, as compressed-tensors'
// `input_activations` QuantizationArgs describe it, and its calibrated
// parameters.
//
//   INT8 W8A8     type int, 8 bits, symmetric (or not), strategy token +
//                 dynamic (one absmax / 127.5 scale per row of x, computed
//                 on the fly) or strategy tensor + static (input_scale, and
//                 input_zero_point when asymmetric, from calibration);
//   FP8           type float, 8 bits, token + dynamic (amax_row / 448) or
//                 tensor + static (input_scale = calibrated amax / 448);
//   NVFP4 (W4A4)  type float, 4 bits, strategy tensor_group, group 16,
//                 dynamic "local": every 16-element block of a row gets an
//                 e4m3 scale computed on the fly against the calibrated
//                 input_global_scale = 448 * 6 / amax (the same multiplier
//                 convention as the weights).
//
// The runtime applies these exactly: x is quantized to the scheme's codes and
// decoded back (or fed as int8 to the int8 GEMM), so evaluation measures the
// quantized model, not an approximation of it.
#pragma once

#include <cstdint>
#include <string>

#include "quantizers/quant_scheme.h"

namespace qf {

struct ActivationScheme {
  QuantType type = QuantType::Int;
  int bits = 8;
  bool symmetric = true;
  QuantStrategy strategy = QuantStrategy::Token;  // Token, Tensor or TensorGroup (NVFP4)
  int64_t group_size = 0;                         // TensorGroup: 16
  bool dynamic = true;                            // false: static scales from calibration

  static ActivationScheme int8_token() { return {QuantType::Int, 8, true, QuantStrategy::Token, 0, true}; }
  static ActivationScheme int8_tensor_static() { return {QuantType::Int, 8, true, QuantStrategy::Tensor, 0, false}; }
  static ActivationScheme fp8_token() { return {QuantType::Float, 8, true, QuantStrategy::Token, 0, true}; }
  static ActivationScheme fp8_tensor_static() { return {QuantType::Float, 8, true, QuantStrategy::Tensor, 0, false}; }
  // NVFP4 activations: dynamic per-block scales, static global scale ("local").
  static ActivationScheme nvfp4() { return {QuantType::Float, 4, true, QuantStrategy::TensorGroup, 16, true}; }

  bool is_nvfp4() const { return type == QuantType::Float && bits == 4; }
  // Whether calibration must supply parameters: static scales, or NVFP4's global scale.
  bool needs_calibration() const { return !dynamic || is_nvfp4(); }
  std::string describe() const;  // "int8 token dynamic", "fp8 tensor static", "nvfp4", ...
  // InvalidInput naming `where` for combinations outside the list above.
  void validate(const std::string& where) const;
};

// One Linear's input quantizer.
struct ActQuantParams {
  ActivationScheme scheme;
  float scale = 0;          // static tensor strategy: x ~ (q - zero_point) * scale
  int32_t zero_point = 0;   // static asymmetric int8 (signed, in [-128, 127])
  float global_scale = 0;   // NVFP4: input_global_scale = 448 * 6 / amax
};

// Static parameters from the calibrated range of a Linear's input (min <= 0 <= max
// is not assumed; ranges are widened to include 0 as compressed-tensors does).
// Dynamic schemes get scale 0 (NVFP4 gets its global scale). A zero scale (static
// or per token) is replaced by the f32 eps 2^-23, compressed-tensors' eps of the
// activation dtype; the asymmetric zero point is round(clamp(-128 - min / scale)).
// InvalidInput naming `where` for a non-finite range.
ActQuantParams calibrate_activation(const ActivationScheme& s, float min, float max, const std::string& where);

// Quantizes and decodes n rows of `in` values in place (fake quantization,
// bit-exact to the scheme's codes): what the Linear then multiplies. Codes are
// x / scale (+ zero point) in f32, clamped, then rounded half to even (int8)
// or cast RNE (fp8, e2m1), as compressed-tensors' _quantize_dequantize.
void quantize_activations(const ActQuantParams& p, float* x, int64_t n, int64_t in);

// INT8 only: the codes and per-row scales of x (per token: one scale per row;
// static tensor: p.scale for every row), for the int8 GEMM. q holds n * in
// values; row_scale n values; row_zero n values (0 when symmetric).
void quantize_activations_int8(const ActQuantParams& p, const float* x, int64_t n, int64_t in, int8_t* q,
                               float* row_scale, int32_t* row_zero);

// Static FP8 KV-cache scales (compressed-tensors kv_cache_scheme: float 8-bit,
// strategy tensor, static): k_scale / v_scale of one attention layer, amax / 448.
struct KvScales {
  float k_scale = 0, v_scale = 0;
};

}  // namespace qf
