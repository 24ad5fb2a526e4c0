// Hugging Face safetensors -> runtime Model, weights viewed in the mapping.
#include <algorithm>
#include <iterator>
#include <memory>

#include "core/error.h"
#include "formats/hf/model_config.h"
#include "formats/hf/resolve.h"
#include "core/io.h"
#include "formats/export/awq_format.h"
#include "formats/export/compressed_tensors.h"
#include "formats/export/gptq_format.h"
#include "formats/export/modelopt_format.h"
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
  nlohmann::json qcfg;   // quantization_config (modelopt: hf_quant_config.json when present)
  std::string method;    // "compressed-tensors", "gptq", "awq", "modelopt" or ""

  std::shared_ptr<Linear> linear(const std::string& prefix, bool bias) const {
    std::optional<Tensor> b;
    if (bias) b = get(prefix + ".bias");
    const Tensor* bp = b ? &*b : nullptr;
    // Quantized modules carry a weight_scale (or a packed weight); ignored ones are dense.
    if (method == "compressed-tensors" &&
        (ck->contains(prefix + ".weight_packed") || ck->contains(prefix + ".weight_scale"))) {
      const auto r = read_compressed_tensors_any(*ck, prefix, group_of(prefix), qcfg.value("format", ""));
      return make_quantized_linear(r.q, r.act ? &*r.act : nullptr, bp, prefix);
    }
    if (method == "gptq" && ck->contains(prefix + ".qweight"))
      return make_packed_linear(read_gptq_linear(*ck, prefix, qcfg), bp, prefix);
    if (method == "awq" && ck->contains(prefix + ".qweight"))
      return make_quantized_linear(read_awq_linear(*ck, prefix, qcfg), nullptr, bp, prefix);
    if (method == "modelopt" && ck->contains(prefix + ".weight_scale")) {
      const auto r = read_modelopt_linear(*ck, prefix, qcfg);
      return make_quantized_linear(r.q, r.act ? &*r.act : nullptr, bp, prefix);
    }
    Tensor w = get(prefix + ".weight");
    return make_dense_linear(w, b ? &*b : nullptr, prefix + ".weight");
  }

  // The config group that claims the module, with compressed-tensors'
  // precedence: an exact module name, then a "re:" pattern, then a class name.
  nlohmann::json group_of(const std::string& module) const {
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
        if (rank > best_rank) best = &g, best_rank = rank;
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

namespace {

std::unique_ptr<Model> load_hf_model_checked(const std::filesystem::path& dir) {
  ModelConfig c = load_model_config(dir);
  std::string method;
  nlohmann::json qcfg;
  bool kv_scales = false;  // the checkpoint declares an FP8 KV-cache scheme
  const std::string cfg_file = (dir / "config.json").string();
  if (c.quantization_config) {
    qcfg = *c.quantization_config;
    method = qcfg.value("quant_method", "");
    if (method == "compressed-tensors") {
      const std::string fmt = qcfg.value("format", "");
      static const char* kFormats[] = {"pack-quantized", "int-quantized", "float-quantized", "naive-quantized",
                                       "nvfp4-pack-quantized", "mixed-precision"};
      if (std::find(std::begin(kFormats), std::end(kFormats), fmt) == std::end(kFormats))
        throw unsupported(cfg_file, "compressed-tensors format '" + fmt + "' is not supported by the runtime (pack-quantized, "
                                    "int-quantized, float-quantized, naive-quantized, nvfp4-pack-quantized, mixed-precision)");
      const auto& kv = qcfg.contains("kv_cache_scheme") ? qcfg["kv_cache_scheme"] : nlohmann::json();
      if (!kv.is_null()) {
        const ActivationScheme k = compressed_tensors_activation_from_args(kv);
        if (!(k.type == QuantType::Float && k.bits == 8 && k.strategy == QuantStrategy::Tensor && !k.dynamic))
          throw unsupported(cfg_file, "kv_cache_scheme '" + k.describe() + "' (the runtime reads fp8 tensor static)");
        kv_scales = true;
      }
    } else if (method == "awq") {
      try {
        awq_scheme_from_config(qcfg);  // Unsupported for other versions / bits
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::Unsupported) throw;
        throw unsupported(cfg_file, e.what());
      }
    } else if (method == "modelopt") {
      // hf_quant_config.json is modelopt's own description; config.json's block mirrors it.
      if (path_exists(dir / "hf_quant_config.json")) {
        const std::filesystem::path hq = dir / "hf_quant_config.json";
        qcfg = nlohmann::json::parse(read_text_file(hq), nullptr, false);
        if (!qcfg.is_object()) throw invalid_input(hq.string(), "not a JSON object");
      }
      const std::string algo = modelopt_quant_algo(qcfg);
      if (algo != "FP8" && algo != "NVFP4" && algo != "W4A16_NVFP4")
        throw unsupported(cfg_file, "modelopt quant_algo '" + algo + "' is not supported by the runtime (FP8, NVFP4, W4A16_NVFP4)");
      const std::string kv = modelopt_kv_cache_algo(qcfg);
      if (!kv.empty() && kv != "FP8")
        throw unsupported(cfg_file, "modelopt kv_cache_quant_algo '" + kv + "' is not supported by the runtime (FP8)");
      kv_scales = kv == "FP8";
    } else if (method != "gptq") {
      throw unsupported(cfg_file, "quant_method '" + method + "' is not supported by the runtime (compressed-tensors, gptq, awq, modelopt)");
    }
  }
  if (c.is_moe()) throw unsupported(dir.string(), "mixture-of-experts models are not supported by the runtime yet");
  HfReader r{std::make_shared<Checkpoint>(Checkpoint::open(dir)), qcfg, method};
  check_layer_tensors(r.ck->names(), "model.layers.", c.num_hidden_layers, cfg_file, "num_hidden_layers");
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
    if (kv_scales) {
      const KvScales kv = method == "modelopt" ? read_modelopt_kv_scales(*r.ck, "model.layers." + std::to_string(i))
                                               : read_compressed_tensors_kv_scales(*r.ck, p + "self_attn");
      w.k_scale.push_back(kv.k_scale);
      w.v_scale.push_back(kv.v_scale);
    }
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

}  // namespace

std::unique_ptr<Model> load_hf_model(const std::filesystem::path& dir) {
  try {
    return load_hf_model_checked(dir);
  } catch (const nlohmann::json::exception& e) {
    // A quantization_config (or hf_quant_config.json) value of the wrong JSON
    // type, read by one of the checkpoint-format readers.
    throw invalid_input((dir / "config.json").string(), std::string("malformed quantization configuration: ") + e.what());
  }
}

std::unique_ptr<Model> load_model(const std::string& model) {
  const std::filesystem::path p(model);
  if (is_file(p)) {
    if (p.extension() == ".gguf") return load_gguf_model(p);
    throw unsupported(model, "the runtime reads .gguf files and Hugging Face folders; this is neither");
  }
  ResolvedModel m = resolve_model(model);
  return load_hf_model(m.dir);
}

}  // namespace qf::rt
