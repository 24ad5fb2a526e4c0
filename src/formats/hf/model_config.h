// config.json of a Hugging Face decoder-only model, parsed and validated.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace qf {

// rope_scaling, every field kept. `type` is rope_type (or the older "type").
struct RopeScaling {
  std::string type;  // "llama3", "linear", "yarn", "dynamic", ...
  double factor = 1.0;
  std::optional<double> low_freq_factor, high_freq_factor;        // llama3
  std::optional<int64_t> original_max_position_embeddings;       // llama3, yarn
  std::optional<double> beta_fast, beta_slow, attention_factor;  // yarn
  std::optional<double> mscale, mscale_all_dim;                  // yarn (deepseek style)
  nlohmann::json raw;  // the object as written
};

// A vision-language model's parts besides its language model: qwen2_vl and
// qwen2_5_vl (a Qwen2 language model with multimodal RoPE, a ViT with a patch
// merger), llava and llava_next (a Llama or Mistral language model, a CLIP
// vision tower, an MLP projector). The ModelConfig around it describes the
// language model (its model_type is the text model's: qwen2, llama, mistral).
struct VisionLanguageConfig {
  std::string model_type;  // the config's own: qwen2_vl, qwen2_5_vl, llava, llava_next
  nlohmann::json vision;   // vision_config as written
  // qwen: how many of the head_dim / 2 RoPE frequencies follow the temporal,
  // height and width positions (rope_scaling.mrope_section); sums to head_dim / 2.
  std::vector<int64_t> mrope_section;
  int64_t image_token_id = -1;  // qwen: image_token_id; llava: image_token_index
  int64_t vision_start_token_id = -1, vision_end_token_id = -1;  // qwen only
  bool text_config = false;     // the language model's fields were read from text_config
};

struct ModelConfig {
  std::string model_type;                 // llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe
  std::vector<std::string> architectures; // e.g. LlamaForCausalLM
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v (and o for llama) biases; qwen2 always has q/k/v biases
  bool mlp_bias = false;
  std::optional<int64_t> sliding_window;  // mistral; qwen2/qwen3 when use_sliding_window
  std::optional<int64_t> max_window_layers;
  std::string torch_dtype;  // "float16", "bfloat16", "float32" ("" if absent)
  std::optional<int64_t> bos_token_id, eos_token_id, pad_token_id;
  // Mixture of experts (mixtral, qwen2_moe, qwen3_moe). A layer is sparse
  // when moe_layer(i); the others are dense with intermediate_size.
  int64_t num_experts = 0;           // mixtral: num_local_experts
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;  // each routed expert's width (mixtral: intermediate_size)
  int64_t shared_expert_intermediate_size = 0;  // qwen2_moe's shared expert (0: none)
  int64_t decoder_sparse_step = 0;   // qwen: every step-th layer is sparse (mixtral: 1)
  std::vector<int64_t> mlp_only_layers;  // qwen: layers kept dense
  bool norm_topk_prob = false;       // renormalise the top-k routing weights (mixtral: always)
  std::optional<nlohmann::json> quantization_config;
  std::optional<VisionLanguageConfig> vlm;  // set for a vision-language model
  nlohmann::json raw;  // the whole config.json

  bool is_moe() const { return num_experts > 0; }
  // Whether decoder layer i routes through experts (transformers' rule:
  // not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0).
  bool moe_layer(int64_t i) const {
    if (!is_moe()) return false;
    if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), i) != mlp_only_layers.end()) return false;
    return decoder_sparse_step <= 1 || (i + 1) % decoder_sparse_step == 0;
  }
  // The input width of a layer's down projection(s) and the output width of
  // its gate/up: the dense MLP's or one routed expert's.
  int64_t ffn_width(int64_t i) const { return moe_layer(i) ? moe_intermediate_size : intermediate_size; }
  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
};

// Text models, then the vision-language models (whose language model is one
// of the text models).
const std::vector<std::string>& supported_model_types();
const std::vector<std::string>& vision_language_model_types();

// How a source spells a hyper-parameter in messages, given its config.json
// key ("hidden_size"); the GGUF loader maps them to its metadata keys
// ("llama.embedding_length"). Empty: the config.json key itself.
using ConfigKeyName = std::function<std::string(const std::string& config_key)>;

// Derives head_dim when it is 0 (hidden_size / num_attention_heads, which must
// then divide) and checks every hyper-parameter the runtime, the converters
// and the quantizers rely on, for config.json and GGUF alike: sizes positive
// and within bounds that keep every product of them far from overflow (widths
// and head counts up to 2^20, vocabularies up to 2^24, layers up to 2^16,
// contexts up to 2^32 - 1); attention heads a multiple of KV heads; an even
// head_dim (RoPE rotates pairs); rms_norm_eps and rope_theta positive and
// finite; rope_scaling factors positive and finite (llama3: low/high
// frequency factors and original_max_position_embeddings positive, high above
// low). InvalidInput naming `where` and the key.
void check_model_config(ModelConfig& c, const std::string& where, const ConfigKeyName& key = {});

// The layers a checkpoint's tensor names hold (names "<prefix><i>.<rest>",
// e.g. "model.layers.3.mlp.up_proj.weight" or "blk.3.ffn_up.weight") must be
// exactly 0 .. n_layers - 1: InvalidInput naming `where` and `key` (the layer
// count's key) when a layer below n_layers has no tensor, or a tensor belongs
// to a layer beyond it.
void check_layer_tensors(const std::vector<std::string>& names, const std::string& prefix, int64_t n_layers,
                         const std::string& where, const std::string& key);

// Parses the object; `where` names the source in error messages.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& where);
// Reads and parses <dir>/config.json (or a path to a config file).
ModelConfig load_model_config(const std::filesystem::path& dir_or_file);

}  // namespace qf
