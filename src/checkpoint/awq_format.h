// AutoAWQ GEMM checkpoint layout (WQLinear_GEMM), read by vLLM (awq,
// awq_marlin) and transformers as quant_method "awq", version "gemm".
//
// Tensors of one Linear with in = K input and out = N output features, 4-bit
// codes, group size g (K % g == 0, N % 8 == 0):
//   <prefix>.qweight  I32 [K, N/8]    codes packed along the output dim: word c of
//                     row k holds, in nibble slot i (bits 4i..4i+3), the code of
//                     output 8c + kAwqOrder[i], kAwqOrder = {0, 2, 4, 6, 1, 3, 5, 7};
//   <prefix>.qzeros   I32 [K/g, N/8]  the zero points [group, out], packed the same
//                     way, holding the real (unsigned) zero;
//   <prefix>.scales   F16 [K/g, N]    the scales transposed to [group, out].
// Dequantization: w[n, k] = (q[n, k] - z[n, k/g]) * scales[k/g, n].
//
// Our symmetric 4-bit schemes (z = 8) are written with qzeros of 8 and
// zero_point false; loaders always apply qzeros, so both decode the same.
// Unsupported: bits other than 4, strategies other than group, float schemes,
// act-order (g_idx), N not a multiple of 8; scales must be exactly
// representable in f16.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "quantizers/quant_scheme.h"

namespace qf {

inline constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

// Adds qweight, qzeros, scales for one Linear (prefix without trailing dot).
// Validates q (InvalidInput naming prefix); Unsupported for the schemes above.
void add_awq_linear(SafetensorsWriter& w, const std::string& prefix, const QuantizedTensor& q);

// config.json "quantization_config" as AutoAWQ's to_transformers_dict writes it:
// {quant_method "awq", zero_point (!symmetric), group_size, bits 4, version "gemm",
// modules_to_not_convert}. Unsupported for schemes add_awq_linear refuses.
nlohmann::json awq_quantization_config(const QuantScheme& s, const std::vector<std::string>& modules_to_not_convert);

// Parses a quantization_config (or AutoAWQ quant_config.json: w_bit, q_group_size)
// into a 4-bit group scheme (scale_dtype F16). Unsupported: quant_method other
// than awq, versions other than gemm (case-insensitive), bits other than 4,
// group_size < 1; InvalidInput for malformed fields.
QuantScheme awq_scheme_from_config(const nlohmann::json& qcfg);

// Reads one Linear back, validating every dtype and shape (InvalidInput naming
// the tensor; NotFound when missing). Scales may be F16, BF16 or F32 (the result's
// scale_dtype is the stored one). With zero_point false every zero must be 8.
QuantizedTensor read_awq_linear(const Checkpoint& ck, const std::string& prefix, const nlohmann::json& qcfg);

}  // namespace qf
