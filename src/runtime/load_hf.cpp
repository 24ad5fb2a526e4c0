// Hugging Face safetensors -> runtime Model, weights viewed in the mapping.
#include <memory>

#include "core/error.h"
#include "formats/hf/model_config.h"
#include "formats/hf/resolve.h"
#include "formats/export/compressed_tensors.h"
#include "formats/export/gptq_format.h"
#include "formats/safetensors.h"
#include "recipe/recipe.h"
#include "runtime/model.h"

namespace qf::rt {
namespace {

struct HfReader {
  std::shared_ptr<Checkpoint> ck;

  Tensor get(const std::string& name) const {
    if (!ck->contains(name)) throw not_found(ck->files().front().path().parent_path().string(), "tensor '" + name + "' is missing");
    return ck->tensor(name);
  }
  nlohmann::json qcfg;   // quantization_config, when the checkpoint is quantized
  std::string method;    // "compressed-tensors", "gptq" or ""

  std::shared_ptr<Linear> linear(const std::string& prefix, bool bias) const {
    std::optional<Tensor> b;
    if (bias) b = get(prefix + ".bias");
    if (method == "compressed-tensors" && ck->contains(prefix + ".weight_packed")) {
      return make_packed_linear(read_compressed_tensors_linear(*ck, prefix, group_args(prefix)), b ? &*b : nullptr, prefix);
    }
    if (method == "gptq" && ck->contains(prefix + ".qweight"))
      return make_packed_linear(read_gptq_linear(*ck, prefix, qcfg), b ? &*b : nullptr, prefix);
    Tensor w = get(prefix + ".weight");
    return make_dense_linear(w, b ? &*b : nullptr, prefix + ".weight");
  }

  // The weights args of the config group that claims the module, with
  // compressed-tensors' precedence: an exact module name, then a "re:"
  // pattern, then a class name.
  nlohmann::json group_args(const std::string& module) const {
    if (!qcfg.contains("config_groups") || !qcfg["config_groups"].is_object())
      throw invalid_input(module, "quantization_config has no config_groups");
    const nlohmann::json* best = nullptr;
    int best_rank = 0;
    for (const auto& [name, g] : qcfg["config_groups"].items()) {
      if (!g.is_object() || !g.contains("weights")) continue;
      for (const auto& t : g.value("targets", nlohmann::json::array())) {
        if (!t.is_string()) continue;
        const std::string target = t.get<std::string>();
        if (!recipe_matches(target, module)) continue;
        const int rank = target == module ? 3 : target.rfind("re:", 0) == 0 ? 2 : 1;
        if (rank > best_rank) best = &g["weights"], best_rank = rank;
      }
    }
    if (!best) throw invalid_input(module, "no config group of quantization_config targets this module");
    return *best;
  }

  std::vector<float> vec(const std::string& name) const {
    Tensor t = get(name);
    if (!dtype_is_float(t.dtype()) || t.ndim() != 1)
      throw invalid_input(name, "expected a 1-D float tensor, got " + std::string(dtype_name(t.dtype())) + " " +
                                    shape_str(t.shape()));
    return t.to_f32_vector();
  }
};

}  // namespace

std::unique_ptr<Model> load_hf_model(const std::filesystem::path& dir) {
  ModelConfig c = load_model_config(dir);
  std::string method;
  if (c.quantization_config) {
    method = c.quantization_config->value("quant_method", "");
    const std::string fmt = c.quantization_config->value("format", "");
    if (method == "compressed-tensors" && fmt != "pack-quantized")
      throw unsupported(dir.string(), "compressed-tensors format '" + fmt + "' is not supported by the runtime yet (pack-quantized is)");
    if (method != "compressed-tensors" && method != "gptq")
      throw unsupported(dir.string(), "quant_method '" + method + "' is not supported by the runtime (compressed-tensors, gptq)");
  }
  if (c.is_moe()) throw unsupported(dir.string(), "mixture-of-experts models are not supported by the runtime yet");
  HfReader r{std::make_shared<Checkpoint>(Checkpoint::open(dir)), c.quantization_config.value_or(nlohmann::json()), method};
  const bool qkv_bias = c.model_type == "qwen2" || c.attention_bias;
  const bool o_bias = c.model_type != "qwen2" && c.attention_bias;
  ModelWeights w;
  w.embed = r.linear("model.embed_tokens", false);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights l;
    l.attn_norm = r.vec(p + "input_layernorm.weight");
    l.ffn_norm = r.vec(p + "post_attention_layernorm.weight");
    if (c.model_type == "qwen3") {
      l.q_norm = r.vec(p + "self_attn.q_norm.weight");
      l.k_norm = r.vec(p + "self_attn.k_norm.weight");
    }
    l.q = r.linear(p + "self_attn.q_proj", qkv_bias);
    l.k = r.linear(p + "self_attn.k_proj", qkv_bias);
    l.v = r.linear(p + "self_attn.v_proj", qkv_bias);
    l.o = r.linear(p + "self_attn.o_proj", o_bias);
    l.gate = r.linear(p + "mlp.gate_proj", c.mlp_bias);
    l.up = r.linear(p + "mlp.up_proj", c.mlp_bias);
    l.down = r.linear(p + "mlp.down_proj", c.mlp_bias);
    w.layers.push_back(std::move(l));
  }
  w.final_norm = r.vec("model.norm.weight");
  if (c.tie_word_embeddings || !r.ck->contains("lm_head.weight")) {
    if (!c.tie_word_embeddings)
      throw not_found(dir.string(), "tensor 'lm_head.weight' is missing and tie_word_embeddings is false");
    w.lm_head = w.embed;
  } else {
    w.lm_head = r.linear("lm_head", false);
  }
  return std::make_unique<Model>(std::move(c), std::move(w), dir);
}

std::unique_ptr<Model> load_model(const std::string& model) {
  const std::filesystem::path p(model);
  if (std::filesystem::is_regular_file(p)) {
    if (p.extension() == ".gguf") return load_gguf_model(p);
    throw unsupported(model, "the runtime reads .gguf files and Hugging Face folders; this is neither");
  }
  ResolvedModel m = resolve_model(model);
  return load_hf_model(m.dir);
}

}  // namespace qf::rt
