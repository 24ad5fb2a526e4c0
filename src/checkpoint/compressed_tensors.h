// compressed-tensors export and import (what llm-compressor writes and vLLM
// loads as quant_method "compressed-tensors"), every format our schemes map to.
//
// Format of one Linear, chosen as compressed-tensors' infer_module_format does
// (compressors/format.py priority list and each compressor's can_compress):
//   nvfp4-pack-quantized  float 4-bit weights, group 16 (NVFP4), any activations;
//   int-quantized         integer weights with quantized activations (W8A8, ...);
//   pack-quantized        integer weights (1..8 bits) without activations;
//   float-quantized       FP8 weights with quantized activations;
//   naive-quantized       FP8 weights without activations (the fallback
//                         compressor; same tensors as float-quantized).
//
// pack-quantized tensors ([out, in] weight, `prefix` the module name with no
// trailing dot), as PackedQuantizationCompressor writes them
// (compressors/pack_quantized/base.py and helpers.py):
//   <prefix>.weight_packed      I32 [out, ceil(in*bits/32)]   codes packed along the
//                               input dim, dense LSB-first (checkpoint/pack.h).
//                               compressed-tensors quantizes to signed int8
//                               s in [-2^(b-1), 2^(b-1)-1] and packs s + 2^(b-1),
//                               which is exactly our unsigned code q.
//   <prefix>.weight_scale       [1] (tensor) | [out, 1] (channel) | [out, ceil(in/g)] (group),
//                               in the scheme's scale dtype (f16/bf16/f32).
//   <prefix>.weight_zero_point  asymmetric only. group/channel: I32 [ceil(out*bits/32), groups],
//                               packed along dim 0 (out) with the same +2^(b-1) offset on
//                               the signed int8 zero point, i.e. the packed field is our
//                               unsigned z. tensor: I8 [1] holding the signed z - 2^(b-1),
//                               unpacked (the compressor packs only group/channel zero points).
//                               Symmetric schemes store no zero point (z = 2^(b-1) implied).
//   <prefix>.weight_shape       I64 [2] = {out, in}.
//   <prefix>.weight_g_idx       I32 [in], only with actorder "group" (q.g_idx non-empty).
// Dequantization: w = (s_q - s_z) * scale = (q - z) * scale.
//
// int-quantized / naive-quantized with integer weights (NaiveQuantizationCompressor:
// the weight quantized to torch.int8, unpacked):
//   <prefix>.weight             I8 [out, in]  signed q - 2^(b-1)
//   <prefix>.weight_scale       [1] | [out, 1] | [out, groups], model dtype (scheme.scale_dtype)
//   <prefix>.weight_zero_point  asymmetric only: I8, the scale's shape, signed z - 2^(b-1)
//   <prefix>.weight_g_idx       I32 [in], actorder group only
// float-quantized / naive-quantized with FP8 weights:
//   <prefix>.weight             F8_E4M3 [out, in]  (our codes are the e4m3 bytes)
//   <prefix>.weight_scale       [1] | [out, 1] | [out, groups], model dtype
// nvfp4-pack-quantized (NVFP4PackedCompressor, compressors/nvfp4/):
//   <prefix>.weight_packed       U8 [out, in/2]: element 2j in the low nibble, 2j+1 high
//   <prefix>.weight_scale        F8_E4M3 [out, in/16]
//   <prefix>.weight_global_scale F32 [1] (448 * 6 / amax, the multiplier convention)
// Input quantizer parameters (quantization/lifecycle/initialize.py): static
// tensor activations add <prefix>.input_scale [1] in the model dtype (and
// <prefix>.input_zero_point I8 [1] when asymmetric); NVFP4 activations add
// <prefix>.input_global_scale F32 [1]; dynamic activations store nothing.
// KV cache (kv_cache_scheme): <attn>.k_scale and <attn>.v_scale, [1] in the model
// dtype, on the self_attn module.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "quantizers/act_quant.h"
#include "quantizers/quant_scheme.h"

namespace qf {

// The compressed-tensors release whose layout we write (dense packing is
// 0.17.0+; 0.18.0 is the version read for docs/peers). Written as "version".
inline constexpr const char* kCompressedTensorsVersion = "0.18.0";

// The compression format compressed-tensors gives a Linear with these weights
// and input activations (act nullptr: weight-only). Validates both.
std::string compressed_tensors_format_of(const QuantScheme& w, const ActivationScheme* act);

// Adds the tensors above for one Linear, in the format compressed_tensors_format_of
// gives (act nullptr: weight-only). Validates q and act first (InvalidInput naming
// prefix); Unsupported for NVFP4 weights with non-NVFP4 activations or NVFP4
// activations on other weights. A static act.scale is stored in the weights'
// scale dtype (the model dtype), so it should already be rounded to it.
void add_compressed_tensors_linear(SafetensorsWriter& w, const std::string& prefix, const QuantizedTensor& q,
                                   const ActQuantParams* act = nullptr);

// The bytes add_compressed_tensors_linear writes for a [rows, cols] Linear
// with these weights (scale dtype resolved), input activations (nullptr:
// weight-only) and, with `g_idx`, actorder group: every tensor's data
// (codes, scales, zero points, weight_shape, g_idx, global and input scales),
// not the safetensors header. The size budget of mixed precision counts these.
uint64_t compressed_tensors_linear_bytes(const QuantScheme& w, const ActivationScheme* act, int64_t rows, int64_t cols,
                                         bool g_idx = false);

// <attn_prefix>.k_scale and .v_scale, shape [1], in `dtype` (compressed-tensors
// stores them in the model dtype). attn_prefix is "model.layers.N.self_attn".
void add_compressed_tensors_kv_scales(SafetensorsWriter& w, const std::string& attn_prefix, const KvScales& kv,
                                      DType dtype = DType::F32);
// Reads them back (f16/bf16/f32, shape [1] or scalar); NotFound when absent.
KvScales read_compressed_tensors_kv_scales(const Checkpoint& ck, const std::string& attn_prefix);

// Parses one config group's "weights" QuantizationArgs into a scheme through the
// resolver that recipes use too (quantizers/quant_args.h); the readers take the
// scale dtype from the stored tensor. Infers the strategy from group_size when
// "strategy" is absent, as compressed-tensors does. Float types give FP8 (num_bits 8: tensor, channel or group) or NVFP4 (num_bits 4,
// tensor_group, group_size 16). Throws Unsupported for other float layouts (MXFP4,
// block), dynamic weights, integer bits outside 2..8, or strategies other than
// tensor/channel/group; InvalidInput for malformed fields.
// `actorder_group` (optional) receives whether actorder is "group" (or its alias
// "dynamic", or true).
QuantScheme compressed_tensors_scheme_from_args(const nlohmann::json& weights_args, bool* actorder_group = nullptr);

// Reads one pack-quantized Linear back (Unsupported for float args), validating
// every dtype and shape against weight_shape and the group's weights args (InvalidInput naming the tensor; NotFound for a
// missing tensor). A weight_zero_point present for a symmetric scheme is ignored;
// weight_g_idx must be present exactly when actorder is "group".
QuantizedTensor read_compressed_tensors_linear(const Checkpoint& ck, const std::string& prefix,
                                               const nlohmann::json& group_weights_args);

// Parses an "input_activations" QuantizationArgs (int8 or fp8 token dynamic /
// tensor static, NVFP4: float 4-bit, tensor_group 16, dynamic "local") or,
// with kv_cache, a kv_cache_scheme (fp8 tensor static) through the resolver
// that recipes use too (quantizers/quant_args.h). Unsupported for anything else.
ActivationScheme compressed_tensors_activation_from_args(const nlohmann::json& args, bool kv_cache = false);

// One Linear read back with its input quantizer (act empty: weight-only). For
// dynamic activations act->scale is 0; static ones carry input_scale (and
// input_zero_point); NVFP4 carries input_global_scale.
struct CompressedTensorsLinear {
  QuantizedTensor q;
  std::optional<ActQuantParams> act;
};

// Reads one Linear of any format. `config_group` is the whole config group
// (weights, input_activations, format); `top_format` is the quantization_config
// "format", used when the group has none. Every tensor's dtype and shape is
// checked (InvalidInput naming it; NotFound when missing); Unsupported naming
// the format for formats we do not read.
CompressedTensorsLinear read_compressed_tensors_any(const Checkpoint& ck, const std::string& prefix,
                                                    const nlohmann::json& config_group, const std::string& top_format);

// One config group: a scheme and the modules it targets.
struct CompressedTensorsGroup {
  QuantScheme scheme;
  std::optional<ActivationScheme> input_activations;  // empty: weight-only
  std::string format;  // empty: compressed_tensors_format_of(scheme, input_activations)
  std::vector<std::string> targets = {"Linear"};  // class names, module names or "re:" patterns
  bool actorder_group = false;                    // "actorder": "group" (weights carry weight_g_idx)
  std::string observer = "memoryless_minmax";     // informational; compressed-tensors' default
  std::map<std::string, std::string> observer_kwargs;  // the weights' observer_kwargs as given (raw scalars)
};

// The "weights" QuantizationArgs, every field compressed-tensors serializes:
// num_bits, type "int" | "float", symmetric, group_size (null unless group /
// tensor_group), strategy, block_structure null, dynamic false, actorder
// ("group" or null), scale_dtype (null: scales are in the model dtype,
// compressed-tensors' default; "torch.float8_e4m3fn" for NVFP4 as its preset
// sets it), zp_dtype (null when symmetric, else "torch.int8"), observer,
// observer_kwargs (as given; numbers as JSON numbers).
nlohmann::json compressed_tensors_weights_args(const QuantScheme& s, bool actorder_group,
                                               const std::string& observer = "memoryless_minmax",
                                               const std::map<std::string, std::string>& observer_kwargs = {});

// An activation's QuantizationArgs as compressed-tensors serializes it: num_bits,
// type, symmetric, group_size (16 for NVFP4, else null), strategy ("token",
// "tensor", "tensor_group"), block_structure null, dynamic (true, false or
// "local"), actorder null, scale_dtype (NVFP4: "torch.float8_e4m3fn", else null),
// zp_dtype (null when symmetric, else "torch.int8"), observer (null for dynamic
// true; "static_minmax" for static and NVFP4 activations, as the FP8 and NVFP4
// presets set it), observer_kwargs {}.
nlohmann::json compressed_tensors_activation_args(const ActivationScheme& a);

// config.json "quantization_config", as ModelCompressor.update_config writes it:
// config_groups {group_0: {targets, weights, input_activations (args or null),
// output_activations null, format}, group_1: ...}, format (the groups' single
// format, or "mixed-precision" when they differ), global_compression_ratio null,
// ignore, kv_cache_scheme (null, or the FP8 static tensor QuantizationArgs with
// observer "memoryless_minmax", compressed-tensors' default for a static scheme
// given without one), quant_method "compressed-tensors", quantization_status "compressed",
// sparsity_config {}, transform_config {}, version. (nlohmann::json objects keep
// keys sorted, as the peer's json.dump(sort_keys=True) does.) Groups are named
// group_0.. in the order given; schemes are validated; an empty list is InvalidInput.
nlohmann::json compressed_tensors_config(const std::vector<CompressedTensorsGroup>& groups,
                                         const std::vector<std::string>& ignore,
                                         const std::string& version = kCompressedTensorsVersion,
                                         const std::optional<ActivationScheme>& kv_cache_scheme = std::nullopt);

}  // namespace qf
