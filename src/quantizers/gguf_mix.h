// llama.cpp's per-tensor type choice for a quantization preset ("Q4_K_M" and
// friends): which ggml type each tensor of a model gets in the GGUF file that
// `llama-quantize MODEL-F16.gguf OUT.gguf Q4_K_M` would write.
//
// Reproduced from ggml-org/llama.cpp src/llama-quant.cpp at commit
// 007dbbf3fd17eefe9b47fee45f48f7ba5e62b714 (tensor_get_category,
// tensor_allows_quantization, llama_tensor_get_type_impl, tensor_type_fallback,
// llama_ftype_get_default_type, init_quantize_state_counters) and
// src/llama-model-loader.h (weight_name_comparer: the order llama-quantize
// processes the tensors in, which matters because the attn_v / ffn_down rules
// count tensors as they go). Only the presets listed in presets() are
// supported (no IQ*, TQ*, MXFP4, Q2_K_S); --output-tensor-type and
// --token-embedding-type are (TypeOverrides), and types by exact tensor name
// (TypeOverrides::tensors; not --tensor-type's regexes); --pure and
// --leave-output-tensor are not.
//
// Rules in short (k-quant presets):
//   - output.weight (and token_embd.weight when the model has no output.weight,
//     i.e. tied embeddings) -> Q6_K; Q8_0 when the preset's base type is Q8_0
//     or its block size does not divide the row length;
//   - attn_v (and attn_qkv, attn_kv_b), counted in processing order i of n:
//     Q2_K: Q4_K if n_head/n_head_kv >= 4 else Q3_K; Q3_K_M: Q5_K for the first
//     two, then Q4_K; Q3_K_L: Q5_K; Q4_K_M/Q5_K_M: Q6_K where use_more_bits(i, n)
//     (i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2); Q4_K_S: Q5_K for i < 4;
//     8 experts: Q8_0;
//   - ffn_down, layer i of n_layer: Q2_K: Q3_K; Q3_K_M: Q5_K for i < n/16, else
//     Q4_K; Q3_K_L: Q5_K; Q4_K_M/Q5_K_M: Q6_K where use_more_bits; Q4_K_S: Q5_K
//     for i < n/8; Q4_0/Q5_0 with an imatrix: Q4_1/Q5_1 for i < n/8;
//   - attn_output: Q2_K: Q3_K, Q3_K_M: Q4_K, Q3_K_L: Q5_K (8 experts: Q5_K for
//     Q2_K, Q3_K_S, Q3_K_M, Q4_K_S, Q4_K_M);
//   - then a row length the chosen type's block size does not divide falls back:
//     Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, and F16 when
//     the fallback does not divide it either. llama.cpp defines no fallback
//     for the legacy types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and aborts; here such
//     a tensor stays F16, with a note.
// MoE models (n_expert > 1) take the layer of ffn_* tensors from the name
// ("blk.N."), as llama.cpp does. The "70B" rule (attn_v Q3_K/Q4_K -> Q5_K) is
// applied where llama.cpp's loader would call the model LLM_TYPE_70B for the
// architectures we know: llama with 80 layers and n_head != n_head_kv, qwen2
// and deci with 80 layers (other architectures' 70B sizes are not detected).
// Falcon's special cases are followed when arch == "falcon".
//
// Tensors llama.cpp never quantizes keep the type llama.cpp's converter
// (convert_hf_to_gguf.py) gives them: F32 for 1-D tensors, *_norm.weight,
// names not ending in ".weight", ffn_gate_inp, position_embd, token_types and
// ssm_conv1d; the preset's float type (F32/F16/BF16; F16 for quantized presets,
// the converter's default) for other 2-D tensors.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace qf::gguf_mix {

struct Preset {
  std::string name;    // "Q4_K_M"
  uint32_t ftype;      // llama.cpp's LLAMA_FTYPE_* value, written to general.file_type
  uint32_t base_type;  // qf::ggml_type id of llama_ftype_get_default_type(ftype)
};

// The supported presets, in this order: F32 F16 BF16 Q8_0 Q6_K Q5_K_S Q5_K_M
// Q4_K_S Q4_K_M Q3_K_S Q3_K_M Q3_K_L Q2_K Q4_0 Q4_1 Q5_0 Q5_1.
const std::vector<Preset>& presets();
// Case-insensitive; Q3_K, Q4_K and Q5_K are aliases of the _M presets (as in
// llama-quantize). Unknown: qf::Error Usage listing the valid names.
const Preset& parse_preset(const std::string& name);

struct ModelDesc {
  std::string arch;  // general.architecture: "llama", "qwen2", ...
  int64_t n_layer = 0, n_head = 0, n_head_kv = 0, n_expert = 0;
};

struct TensorDesc {
  std::string name;         // GGUF name: token_embd.weight, blk.N.attn_v.weight, output.weight, ...
  std::vector<int64_t> ne;  // ne[0] = row length (ggml order)
};

struct TensorPlan {
  std::string name;
  uint32_t type = 0;       // qf::ggml_type id
  bool quantized = false;  // type is a block-quantized type (block size > 1); false for F32/F16/BF16
  // Non-empty when the row length forced a different type, e.g.
  // "blk.0.ffn_down.weight: row length 172 is not a multiple of 256 (q4_K); using q5_0".
  std::string note;
};

// llama-quantize's --output-tensor-type and --token-embedding-type: the type
// of output.weight (with tied embeddings: token_embd.weight, through the
// output rule) and of token_embd.weight, whatever the preset's rules say, for
// every preset (the float ones too). kNoOverride leaves the rules alone.
inline constexpr uint32_t kNoOverride = ~0u;
struct TypeOverrides {
  uint32_t output = kNoOverride, token_embd = kNoOverride;
  // Types by exact tensor name (a size budget's allocation, docs/mixed-
  // precision.md), applied last like the two above: each must name a tensor
  // llama-quantize quantizes, with a type whose block divides its row length.
  std::map<std::string, uint32_t> tensors;
};
// A ggml type name as llama-quantize takes it ("q6_K", "Q8_0", "f16"; case-
// insensitive) among the types the converter writes, the presets' base types:
// F32 F16 BF16 Q8_0 Q6_K Q5_K Q4_K Q3_K Q2_K Q4_0 Q4_1 Q5_0 Q5_1. Unknown: Usage error naming `flag`.
uint32_t parse_tensor_type(const std::string& name, const std::string& flag);

// One plan per tensor, in llama.cpp's processing order (sorted_tensor_order).
// Errors: InvalidInput for a bad description (n_layer < 1, empty or non-positive
// ne, duplicate names, an MoE ffn tensor whose "blk.N." is missing or out of
// range), an override type whose block size does not divide the tensor's
// row length, or a per-tensor override naming a tensor that is absent or
// never quantized, or a type kquants cannot write.
std::vector<TensorPlan> plan(const Preset& p, const ModelDesc& m, std::vector<TensorDesc> tensors, bool has_imatrix,
                             const TypeOverrides& overrides = {});

// Whether llama-quantize quantizes the tensor at all (2-D ".weight" tensors
// other than norms, routers, position and token-type embeddings); the others
// keep the converter's type.
bool allows_quantization(const TensorDesc& t);
// The type a quantizable tensor gets for `type` once its row length is
// respected: `type` when its block size divides ne[0], else the presets'
// fallback (Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0; F16
// when that does not divide it either, and for the legacy types), with `note`
// saying so.
uint32_t shape_fallback(const TensorDesc& t, uint32_t type, std::string& note);

// weight_name_comparer order: names without a "blk.N." prefix first (layer -1),
// then by block number; names sorted bytewise within a layer.
std::vector<std::string> sorted_tensor_order(std::vector<std::string> names);
bool weight_name_less(const std::string& a, const std::string& b);

}  // namespace qf::gguf_mix
