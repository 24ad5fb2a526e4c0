// GPTQ checkpoint layout (AutoGPTQ v1 / GPTQModel checkpoint_format "gptq"),
// read by vLLM (gptq, gptq_marlin), transformers/optimum and ExLlama.
//
// Tensors of one Linear with in = K input and out = N output features, bits b
// in {2, 3, 4, 8}, G groups (ceil(K / group_size); 1 for channel / group_size -1):
//   <prefix>.qweight  I32 [K*b/32, N]  codes q packed along the input dim: column n
//                     is the dense LSB-first bit stream of q[n, 0..K) (AutoGPTQ's
//                     3-bit layout, 32 values in 3 words, is that same stream);
//   <prefix>.qzeros   I32 [G, N*b/32]  zero points packed along the output dim,
//                     stored as z - 1 (the "v1" convention; readers add 1 back);
//   <prefix>.scales   F16 [G, N];
//   <prefix>.g_idx    I32 [K]          the group of each input column (i / group_size
//                     unless act-order, desc_act, reorders it).
// Dequantization: w[n, k] = scales[g_idx[k], n] * (q[n, k] - (qzeros_field + 1)).
//
// Constraints checked by the writer: K*b and N*b multiples of 32 (vLLM sizes the
// tensors as K / (32/b) and N / (32/b)); tensor strategy is Unsupported; bits 5-7
// are Unsupported (AutoGPTQ/vLLM gptq take 2/3/4/8; GPTQModel's 5-7-bit layouts
// are its own); scales must be exactly representable in f16 (always true for a
// scheme with scale_dtype f16); a zero point of 0 cannot be stored in v1 (z - 1
// = -1 wraps to the field's all-ones value, which vLLM, AutoGPTQ and ExLlama
// decode as 2^b because they add 1 without masking, while GPTQModel's word-wise
// v1->v2 conversion decodes it as 0 but carries into the next field): the writer
// refuses it (InvalidInput), and the reader refuses a stored all-ones field.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "quantizers/quant_scheme.h"

namespace qf {

// Extra quantize_config.json fields describing how GPTQ was run (informational
// for every loader; vLLM reads only bits, group_size, desc_act, sym, lm_head, dynamic).
struct GptqConfigExtras {
  double damp_percent = 0.01;   // AutoGPTQ / reference GPTQ default
  bool static_groups = false;
  bool true_sequential = true;
  std::string quantizer = "quantforge";  // meta.quantizer, e.g. "quantforge:0.1.0"
};

// quantize_config.json, also mirrored into config.json "quantization_config":
// bits, group_size (-1 for channel), desc_act, sym, lm_head false, quant_method
// "gptq", checkpoint_format "gptq", pack_dtype "int32", damp_percent,
// static_groups, true_sequential (AutoGPTQ's BaseQuantizeConfig fields), and
// GPTQModel's meta {quantizer: [..], damp_percent, static_groups,
// true_sequential}. Throws Unsupported for the tensor strategy or bits outside {2,3,4,8}.
nlohmann::json gptq_quantize_config(const QuantScheme& s, bool desc_act, const GptqConfigExtras& extras = {});

// Parses bits, group_size, sym and the checkpoint format from a quantize_config.json
// (or config.json quantization_config) object. `v2` (optional) receives whether the
// checkpoint_format (or GPTQModel's "format") is "gptq_v2" (zeros stored without
// the -1). Unsupported: quant_method other than gptq, formats other than gptq /
// gptq_v2 (marlin, ...), bits outside {2,3,4,8}. scale_dtype is left at F16.
QuantScheme gptq_scheme_from_config(const nlohmann::json& cfg, bool* v2 = nullptr);

// Adds qweight, qzeros, scales, g_idx for one Linear (prefix without trailing dot).
void add_gptq_linear(SafetensorsWriter& w, const std::string& prefix, const QuantizedTensor& q);

// Reads one Linear back (validating dtypes and shapes; InvalidInput naming the
// tensor). Scales may be F16, BF16 or F32 (the result's scale_dtype is the stored
// one). A g_idx equal to the default i / group_size (all zeros for channel) gives
// an empty QuantizedTensor::g_idx; a missing g_idx is taken as the default. For a
// symmetric config every zero point must be 2^(b-1).
QuantizedTensor read_gptq_linear(const Checkpoint& ck, const std::string& prefix, const nlohmann::json& quantize_config);

}  // namespace qf
