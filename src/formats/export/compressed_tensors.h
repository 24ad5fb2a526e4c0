// compressed-tensors "pack-quantized" export and import (what llm-compressor
// writes and vLLM loads as quant_method "compressed-tensors"), for integer
// weight-only schemes of 2..8 bits.
//
// Tensors of one Linear ([out, in] weight), with `prefix` the module name
// (no trailing dot), as compressed-tensors' PackedQuantizationCompressor
// writes them (compressors/pack_quantized/base.py and helpers.py):
//   <prefix>.weight_packed      I32 [out, ceil(in*bits/32)]   codes packed along the
//                               input dim, dense LSB-first (formats/export/pack.h).
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
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "quantizers/quant_scheme.h"

namespace qf {

// The compressed-tensors release whose layout we write (dense packing is
// 0.17.0+; 0.18.0 is the version read for docs/peers). Written as "version".
inline constexpr const char* kCompressedTensorsVersion = "0.18.0";

// Adds the tensors above for one Linear. Validates q first (InvalidInput naming prefix).
void add_compressed_tensors_linear(SafetensorsWriter& w, const std::string& prefix, const QuantizedTensor& q);

// Parses one config group's "weights" QuantizationArgs into a scheme (scale_dtype
// left at its default; the reader takes it from the stored tensor). Infers the
// strategy from group_size when "strategy" is absent, as compressed-tensors does.
// Throws Unsupported for float types, dynamic weights, bits outside 2..8, or
// strategies other than tensor/channel/group; InvalidInput for malformed fields.
// `actorder_group` (optional) receives whether actorder is "group" (or its alias
// "dynamic", or true).
QuantScheme compressed_tensors_scheme_from_args(const nlohmann::json& weights_args, bool* actorder_group = nullptr);

// Reads one Linear back, validating every dtype and shape against weight_shape
// and the group's weights args (InvalidInput naming the tensor; NotFound for a
// missing tensor). A weight_zero_point present for a symmetric scheme is ignored;
// weight_g_idx must be present exactly when actorder is "group".
QuantizedTensor read_compressed_tensors_linear(const Checkpoint& ck, const std::string& prefix,
                                               const nlohmann::json& group_weights_args);

// One config group: a scheme and the modules it targets.
struct CompressedTensorsGroup {
  QuantScheme scheme;
  std::vector<std::string> targets = {"Linear"};  // class names, module names or "re:" patterns
  bool actorder_group = false;                    // "actorder": "group" (weights carry weight_g_idx)
  std::string observer = "memoryless_minmax";     // informational; compressed-tensors' default
};

// The "weights" QuantizationArgs, every field compressed-tensors serializes:
// num_bits, type "int", symmetric, group_size (null unless group), strategy,
// block_structure null, dynamic false, actorder ("group" or null), scale_dtype
// null (scales are in the model dtype, compressed-tensors' default), zp_dtype
// (null when symmetric, else "torch.int8"), observer, observer_kwargs {}.
nlohmann::json compressed_tensors_weights_args(const QuantScheme& s, bool actorder_group,
                                               const std::string& observer = "memoryless_minmax");

// config.json "quantization_config", as ModelCompressor.update_config writes it
// for pack-quantized: config_groups {group_0: {targets, weights, input_activations
// null, output_activations null, format "pack-quantized"}, group_1: ...},
// format "pack-quantized", global_compression_ratio null, ignore, kv_cache_scheme
// null, quant_method "compressed-tensors", quantization_status "compressed",
// sparsity_config {}, transform_config {}, version. (nlohmann::json objects keep
// keys sorted, as the peer's json.dump(sort_keys=True) does.) Groups are named
// group_0.. in the order given; schemes are validated; an empty list is InvalidInput.
nlohmann::json compressed_tensors_config(const std::vector<CompressedTensorsGroup>& groups,
                                         const std::vector<std::string>& ignore,
                                         const std::string& version = kCompressedTensorsVersion);

}  // namespace qf
