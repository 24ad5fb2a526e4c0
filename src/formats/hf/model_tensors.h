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

}  // namespace qf
