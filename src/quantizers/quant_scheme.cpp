#include "quantizers/quant_scheme.h"

#include <cmath>

#include "core/error.h"
#include "quantizers/bnb4.h"
#include "quantizers/int_quant.h"
#include "quantizers/nvfp4.h"

namespace qf {

const char* quant_type_name(QuantType t) {
  switch (t) {
    case QuantType::Int: return "int";
    case QuantType::Float: return "float";
    case QuantType::Nf4: return "nf4";
    case QuantType::Fp4: return "fp4";
  }
  return "?";
}

const char* strategy_name(QuantStrategy s) {
  switch (s) {
    case QuantStrategy::Tensor: return "tensor";
    case QuantStrategy::Channel: return "channel";
    case QuantStrategy::Group: return "group";
    case QuantStrategy::TensorGroup: return "tensor_group";
    case QuantStrategy::Token: return "token";
  }
  return "?";
}

std::string QuantScheme::describe() const {
  if (is_nvfp4()) return "nvfp4";
  if (is_bnb4()) return std::string(quant_type_name(type)) + " b" + std::to_string(group_size) + (double_quant ? " dq" : "");
  std::string s = is_fp8() ? std::string("fp8 ") : "int" + std::to_string(bits) + (symmetric ? " sym " : " asym ");
  if (strategy == QuantStrategy::Group) return s + "g" + std::to_string(group_size);
  return s + strategy_name(strategy);
}

void QuantScheme::validate(const std::string& where, int64_t cols) const {
  if (strategy == QuantStrategy::Token) throw invalid_input(where, "the token strategy applies to activations, not weights");
  if (double_quant && !is_bnb4()) throw invalid_input(where, "double quantization is for the bitsandbytes NF4/FP4 schemes");
  if (is_bnb4()) {
    // bitsandbytes' blocks run over the flattened weight: no column condition.
    if (bits != 4 || !symmetric || strategy != QuantStrategy::Group || group_size != kBnbBlock)
      throw invalid_input(where, std::string(quant_type_name(type)) + " weights are 4-bit blocks of 64 (bitsandbytes' blocksize)");
    if (scale_dtype != DType::F16 && scale_dtype != DType::BF16 && scale_dtype != DType::F32)
      throw invalid_input(where, "bitsandbytes dequantizes to f16, bf16 or f32");
    return;
  }
  if (type == QuantType::Float) {
    if (bits == 8) {
      if (strategy == QuantStrategy::TensorGroup) throw invalid_input(where, "FP8 weights use tensor, channel or group scales");
      if (!symmetric) throw invalid_input(where, "float schemes are symmetric");
    } else if (bits == 4) {
      if (strategy != QuantStrategy::TensorGroup || group_size != 16 || !symmetric)
        throw invalid_input(where, "4-bit float weights are NVFP4: strategy tensor_group, group_size 16, symmetric");
    } else {
      throw invalid_input(where, "float weights have 8 (FP8 E4M3) or 4 (NVFP4) bits, got " + std::to_string(bits));
    }
  } else if (bits < 2 || bits > 8) {
    throw invalid_input(where, "num_bits must be 2..8, got " + std::to_string(bits));
  } else if (strategy == QuantStrategy::TensorGroup) {
    throw invalid_input(where, "the tensor_group strategy is for NVFP4 (type float, 4 bits)");
  }
  if (grouped()) {
    if (group_size < 1) throw invalid_input(where, "group_size must be >= 1, got " + std::to_string(group_size));
    if (cols > 0 && cols % group_size != 0)
      throw invalid_input(where, "group_size " + std::to_string(group_size) + " does not divide the " +
                                     std::to_string(cols) + " input columns");
  }
  if (is_nvfp4()) {
    if (scale_dtype != DType::F8_E4M3) throw invalid_input(where, "NVFP4 block scales are stored as f8_e4m3");
  } else if (scale_dtype != DType::F16 && scale_dtype != DType::BF16 && scale_dtype != DType::F32) {
    throw invalid_input(where, "scales must be stored as f16, bf16 or f32");
  }
}

int64_t QuantizedTensor::n_groups() const {
  switch (scheme.strategy) {
    case QuantStrategy::Group:
    case QuantStrategy::TensorGroup: return (cols + scheme.group_size - 1) / scheme.group_size;
    default: return 1;
  }
}

int64_t QuantizedTensor::n_params() const {
  if (scheme.is_bnb4()) return (rows * cols + scheme.group_size - 1) / scheme.group_size;
  return scheme.strategy == QuantStrategy::Tensor ? 1 : rows * n_groups();
}

int64_t QuantizedTensor::group_of(int64_t col) const {
  if (!scheme.grouped()) return 0;
  return g_idx.empty() ? col / scheme.group_size : g_idx[static_cast<size_t>(col)];
}

int64_t QuantizedTensor::param_index(int64_t row, int64_t group) const {
  if (scheme.strategy == QuantStrategy::Tensor) return 0;
  return row * n_groups() + group;
}

void QuantizedTensor::dequantize_row(int64_t r, float* out) const {
  const uint8_t* qr = q.data() + r * cols;
  if (scheme.is_fp8()) {
    for (int64_t c = 0; c < cols; ++c) out[c] = f8e4m3_to_f32(qr[c]) * scales[static_cast<size_t>(param_index(r, group_of(c)))];
    return;
  }
  if (scheme.is_bnb4()) {
    const bool fp4 = scheme.type == QuantType::Fp4;
    const int64_t e0 = r * cols;
    for (int64_t c = 0; c < cols; ++c)
      out[c] = bnb_round_out(scheme.scale_dtype,
                              hd::bnb4_value(fp4, qr[c]) * scales[static_cast<size_t>((e0 + c) / scheme.group_size)]);
    return;
  }
  if (scheme.is_nvfp4()) {
    for (int64_t c = 0; c < cols; ++c)
      out[c] = hd::nvfp4_value(qr[c], scales[static_cast<size_t>(param_index(r, group_of(c)))], global_scale);
    return;
  }
  for (int64_t c = 0; c < cols; ++c) {
    const int64_t p = param_index(r, group_of(c));
    out[c] = hd::dequantize_int(qr[c], scales[static_cast<size_t>(p)], zeros[static_cast<size_t>(p)]);
  }
}

std::vector<float> QuantizedTensor::dequantize() const {
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) dequantize_row(r, w.data() + r * cols);
  return w;
}

void QuantizedTensor::validate(const std::string& where) const {
  scheme.validate(where, scheme.grouped() && g_idx.empty() ? cols : 0);
  const size_t np = static_cast<size_t>(n_params());
  const size_t nz = scheme.is_int() ? np : 0;
  if (q.size() != static_cast<size_t>(rows * cols) || scales.size() != np || zeros.size() != nz)
    throw invalid_input(where, "quantized tensor sizes do not match its shape and scheme");
  if (!g_idx.empty() && (g_idx.size() != static_cast<size_t>(cols) || !scheme.is_int()))
    throw invalid_input(where, "g_idx must have one entry per input column (integer schemes only)");
  for (int32_t g : g_idx)
    if (g < 0 || g >= n_groups()) throw invalid_input(where, "g_idx entry " + std::to_string(g) + " is out of range");
  for (uint8_t v : q)
    if (v > scheme.qmax()) throw invalid_input(where, "code " + std::to_string(v) + " exceeds the " + std::to_string(scheme.bits) + "-bit range");
  if (scheme.is_fp8())
    for (uint8_t v : q)
      if ((v & 0x7f) == 0x7f) throw invalid_input(where, "FP8 weight code is NaN");
  if (scheme.is_nvfp4() && !(std::isfinite(global_scale) && global_scale > 0))
    throw invalid_input(where, "NVFP4 global scale must be positive and finite");
  if (scheme.is_nvfp4())
    for (float s : scales)
      if (!(s >= 0) || f8e4m3_to_f32(f32_to_f8e4m3(s)) != s)
        throw invalid_input(where, "NVFP4 block scale " + std::to_string(s) + " is negative or not an e4m3 value");
  for (float s : scales)
    if (!std::isfinite(s)) throw invalid_input(where, "a scale is not finite");
  if (scheme.is_bnb4()) {
    for (float s : scales)
      if (!(s >= 0) && !scheme.double_quant) throw invalid_input(where, "a bitsandbytes absmax is negative");
    if (scheme.double_quant) {
      const size_t nn = (np + kBnbNestedBlock - 1) / kBnbNestedBlock;
      if (absmax_codes.size() != np || nested_absmax.size() != nn || !std::isfinite(absmax_offset))
        throw invalid_input(where, "bitsandbytes double quantization sizes do not match the blocks");
      for (float v : nested_absmax)
        if (!std::isfinite(v)) throw invalid_input(where, "a nested absmax is not finite");
      if (bnb_decode_absmax(absmax_codes, nested_absmax, absmax_offset) != scales)
        throw invalid_input(where, "the absmax values are not what the double quantization decodes to");
    } else if (!absmax_codes.empty() || !nested_absmax.empty()) {
      throw invalid_input(where, "double-quantized absmax values without double_quant");
    }
  }
  for (int32_t z : zeros)
    if (z < 0 || z > scheme.qmax()) throw invalid_input(where, "zero point " + std::to_string(z) + " is out of range");
}

}  // namespace qf
