// The tensors a Hugging Face checkpoint of a given config.json holds: their
// names, the shapes the config implies, and the check that a checkpoint's
// tensors agree with its config. The runtime's loader and the GGUF converter
// both run that check before they read a weight, so a checkpoint that one of
// them refuses is refused by the other with the same message.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "formats/hf/model_config.h"
#include "formats/tensor_naming.h"

namespace qf {

class Checkpoint;

// What a decoder layer's Linear computes, in forward order.
enum class LinearRole { Q, K, V, O, Gate, Up, Down };

inline constexpr int64_t kDenseLinear = -1;         // attention and dense-MLP Linears
inline constexpr int64_t kSharedExpertLinear = -2;  // qwen2_moe's shared expert

// One quantizable Linear of a decoder layer: its role, its expert (a routed
// expert's index, kSharedExpertLinear or kDenseLinear) and its module name
// under "model.layers.N." as the architecture's checkpoints spell it
// ("self_attn.q_proj", "mlp.down_proj", "block_sparse_moe.experts.3.w1",
// "mlp.experts.3.gate_proj", "mlp.shared_expert.up_proj").
struct HfLinear {
  LinearRole role;
  int64_t expert = kDenseLinear;
  std::string name;
};

// Every quantizable Linear of layer `layer` in forward order: q, k, v, o, then
// the dense MLP's gate, up, down, or each routed expert's (expert 0 first)
// followed by the shared expert's. Routers are not listed (hf_layer_routers).
std::vector<HfLinear> hf_layer_linears(const ModelConfig& c, int64_t layer);

// The [out, in] shape of a Linear of that role and expert.
struct HfLinearShape {
  int64_t out, in;
};
HfLinearShape hf_linear_shape(const ModelConfig& c, LinearRole role, int64_t expert = kDenseLinear);

// Whether a Linear of that role has a bias: q/k/v for qwen2 (always) and
// with attention_bias, o with attention_bias except for qwen2, the MLP's
// (experts' too) with mlp_bias.
bool hf_linear_has_bias(const ModelConfig& c, LinearRole role);

// A sparse layer's MLP module prefix ("block_sparse_moe." for mixtral, "mlp."
// for the qwen MoE models): the router is <prefix>gate.
std::string hf_moe_prefix(const ModelConfig& c);

// The Linears of a sparse layer that read the MLP input but are never
// quantized: the router (<moe prefix>gate, [experts, hidden]) and qwen2_moe's
// shared-expert gate (mlp.shared_expert_gate, [1, hidden]). Empty for a dense
// layer.
struct HfRouter {
  std::string name;  // the module name under "model.layers.N."
  bool shared_gate = false;
};
std::vector<HfRouter> hf_layer_routers(const ModelConfig& c, int64_t layer);

// Checks a checkpoint's tensor names and shapes against its config before
// anything reads a weight:
//  - the layers present are exactly 0 .. num_hidden_layers - 1
//    (check_layer_tensors, naming `config_file`);
//  - every tensor the config implies is present: NotFound naming it (with
//    `dense_linears` false, the Linears' own weights are left to the
//    checkpoint format that stores them in its own way);
//  - no tensor of a layer's MLP ("mlp.*", "block_sparse_moe.*") lies outside
//    what the config describes: an expert beyond the expert count, a shared
//    expert without shared_expert_intermediate_size, expert tensors in a
//    dense layer or a dense MLP in a sparse one are InvalidInput naming the
//    tensor and the config key it contradicts;
//  - every such tensor has the shape the config implies (Linear weights
//    [out, in] only with `dense_linears`; routers, norms and biases always):
//    InvalidInput naming it.
// `where` (the model folder) prefixes the messages about tensors.
void check_hf_checkpoint(const ModelConfig& c, const Checkpoint& ck, bool dense_linears, const std::string& where,
                         const std::string& config_file);

// How a vision-language checkpoint spells its parts (formats/tensor_naming.h),
// told from its stored tensor names: the names transformers used before 4.52
// ("model.layers." and "visual." for qwen2_vl; "language_model.model.",
// "language_model.lm_head.", "vision_tower.", "multi_modal_projector." for
// llava) or those it uses since ("model.language_model.", "model.visual.",
// "model.vision_tower.", "model.multi_modal_projector.", "lm_head."). The
// working names are the older qwen2_vl ones for the language model
// ("model.", "lm_head.") and the vision parts' older names. Identity for a
// text model.
TensorNaming hf_tensor_naming(const ModelConfig& c, const std::vector<std::string>& stored_names);
// The same, applied to the checkpoint (Checkpoint::set_naming).
void apply_hf_tensor_naming(const ModelConfig& c, Checkpoint& ck);

// Whether a working tensor or module name belongs to a vision-language
// model's vision tower or projector ("visual.", "vision_tower.",
// "multi_modal_projector.", "image_newline").
bool is_vision_tensor(const std::string& name);

// The module whose Linear weight the tensor `name` of `ck` is: a 2-D
// "<module>.weight" whose last module component does not mention "embed"
// (not embed_tokens, not a vision tower's position_embedding); "" for any
// other tensor.
std::string linear_weight_module(const Checkpoint& ck, const std::string& name);

}  // namespace qf
