// NVIDIA TensorRT Model Optimizer (modelopt) unified Hugging Face checkpoint
// (export_hf_checkpoint), FP8 and NVFP4, as vLLM and TensorRT-LLM load it
// (quant_method "modelopt").
//
// Tensors of one Linear ([out, in] weight, prefix the module name):
//   FP8 (quant_algo "FP8": per-tensor weights, static per-tensor input):
//     <prefix>.weight          F8_E4M3 [out, in]
//     <prefix>.weight_scale    F32 [] (a scalar tensor) = amax / 448
//     <prefix>.input_scale     F32 []                   = input amax / 448
//   NVFP4 (quant_algo "NVFP4" with activations, "W4A16_NVFP4" weight-only):
//     <prefix>.weight          U8 [out, in/2]: element 2j in the low nibble, 2j+1 high
//     <prefix>.weight_scale    F8_E4M3 [out, in/16]
//     <prefix>.weight_scale_2  F32 [] = amax / (6 * 448) = 1 / global_scale
//     <prefix>.input_scale     F32 [] = 1 / input_global_scale (NVFP4 only)
//   KV cache (kv_cache_quant_algo "FP8"), per decoder layer:
//     <layer>.self_attn.k_proj.k_scale, <layer>.self_attn.v_proj.v_scale  F32 []
// modelopt keeps the reciprocal of compressed-tensors' global scales; the
// reciprocals are taken in double and rounded once, so a value may move by
// one f32 ulp on a round trip (exactly representable reciprocals, such as
// powers of two, come back unchanged).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "quantizers/act_quant.h"
#include "quantizers/quant_scheme.h"

namespace qf {

inline constexpr const char* kModeloptProducerVersion = "0.33.0";

// Adds one Linear. FP8: q is FP8 tensor strategy and act FP8 tensor static;
// NVFP4: act NVFP4 or nullptr (weight-only). Unsupported for anything else
// (FP8 channel/group, integer weights, FP8 weight-only); InvalidInput for an
// invalid q or act, or an NVFP4 block scale that is not an e4m3 value.
void add_modelopt_linear(SafetensorsWriter& w, const std::string& prefix, const QuantizedTensor& q,
                         const ActQuantParams* act);

// <layer_prefix>.self_attn.k_proj.k_scale and .self_attn.v_proj.v_scale, F32 [],
// written as given (see modelopt_fp8_kv_scales). layer_prefix is "model.layers.N".
void add_modelopt_kv_scales(SafetensorsWriter& w, const std::string& layer_prefix, const KvScales& kv);
// The FP8 KV-cache scales modelopt's Hugging Face export writes for calibrated
// ones (amax / 448): max(amax / 448, 1.0) each, its postprocess_state_dict rule
// for kv_cache_quant_algo FP8 (modelopt 0.33, the producer version we write;
// 0.43 dropped the clamp on that path, its TensorRT-LLM export keeps it).
KvScales modelopt_fp8_kv_scales(const KvScales& calibrated);
KvScales read_modelopt_kv_scales(const Checkpoint& ck, const std::string& layer_prefix);

// hf_quant_config.json: {"producer": {"name": "modelopt", "version"}, "quantization":
// {"quant_algo", "kv_cache_quant_algo" (string or null), "group_size" (when given:
// NVFP4's 16), "exclude_modules"}}. quant_algo: "FP8", "NVFP4" or "W4A16_NVFP4";
// kv_cache_quant_algo: "FP8" or nullopt. Unsupported for other values.
nlohmann::json modelopt_hf_quant_config(const std::string& quant_algo, const std::optional<std::string>& kv_cache_quant_algo,
                                        std::optional<int> group_size, const std::vector<std::string>& exclude_modules,
                                        const std::string& producer_version = kModeloptProducerVersion);

// The config.json "quantization_config" block modelopt derives from it
// (convert_hf_quant_config_format): config_groups {group_0: {input_activations
// {dynamic false, num_bits, type "float"[, group_size]}, weights {...}, targets
// ["Linear"]}}, ignore (exclude_modules), quant_algo, kv_cache_scheme ({dynamic
// false, num_bits 8, type "float"} for FP8; absent without KV quantization),
// producer, quant_method "modelopt".
nlohmann::json modelopt_config_block(const nlohmann::json& hf_quant_config);

// The quant_algo of either form above (hf_quant_config.json, or the config.json
// block); InvalidInput when absent.
std::string modelopt_quant_algo(const nlohmann::json& cfg);
// The kv_cache_quant_algo ("FP8", ...) of either form, or "" when there is none.
std::string modelopt_kv_cache_algo(const nlohmann::json& cfg);

struct ModeloptLinear {
  QuantizedTensor q;
  std::optional<ActQuantParams> act;
};

// Reads one Linear back under `cfg` (either form). Every dtype and shape is
// checked (InvalidInput naming the tensor, NotFound when missing); scalars may
// be stored as [] or [1]. Unsupported for quant_algo values other than FP8,
// NVFP4, W4A16_NVFP4. FP8 gives scheme fp8(tensor, f32) with an FP8 static
// input; NVFP4 global scales are the reciprocals of weight_scale_2 / input_scale.
ModeloptLinear read_modelopt_linear(const Checkpoint& ck, const std::string& prefix, const nlohmann::json& cfg);

}  // namespace qf
