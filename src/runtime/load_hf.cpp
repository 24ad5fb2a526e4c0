// Hugging Face safetensors -> runtime Model, weights viewed in the mapping.
#include <algorithm>
#include <filesystem>
#include <iterator>
#include <memory>

#include "core/error.h"
#include "formats/hf/model_config.h"
#include "formats/hf/model_tensors.h"
#include "formats/hf/resolve.h"
#include "core/io.h"
#include "core/weight_residency.h"
#include "checkpoint/checkpoint_format.h"
#include "formats/safetensors.h"
#include "checkpoint/lora_merge.h"
#include "runtime/lora_linear.h"
#include "runtime/model.h"
#include "runtime/router_linears.h"

namespace qf::rt {
namespace {

struct HfReader {
  std::shared_ptr<Checkpoint> ck;

  Tensor get(const std::string& name) const {
    if (!ck->contains(name)) throw not_found(ck->files().front().path().parent_path().string(), "tensor '" + name + "' is missing");
    return ck->tensor(name);
  }
  const CheckpointFormat* format = nullptr;  // nullptr: not quantized
  nlohmann::json qcfg;                        // what the format reads with (CheckpointFormat::open)

  std::shared_ptr<Linear> linear(const std::string& prefix, bool bias) const {
    std::optional<Tensor> b;
    if (bias) b = get(prefix + ".bias");
    const Tensor* bp = b ? &*b : nullptr;
    if (format) {
      if (std::optional<ReadLinear> r = format->read_linear(*ck, prefix, qcfg)) {
        if (r->packed_kernel) return make_packed_linear(r->q, bp, prefix);
        return make_quantized_linear(r->q, r->act ? &*r->act : nullptr, bp, prefix);
      }
    }
    Tensor w = get(prefix + ".weight");
    return make_dense_linear(w, b ? &*b : nullptr, prefix + ".weight");
  }

  std::vector<float> vec(const std::string& name) const {
    Tensor t = get(name);
    if (!dtype_is_float(t.dtype()) || t.ndim() != 1)
      throw invalid_input(name, "expected a 1-D float tensor, got " + std::string(dtype_name(t.dtype())) + " " +
                                    shape_str(t.shape()));
    return t.to_f32_vector();
  }
};

// The bytes of the folder's .safetensors files (what reading the weights into
// memory costs); 0 when the folder cannot be listed (open reports why).
uint64_t safetensors_bytes(const std::filesystem::path& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code size_ec;
    if (it->path().extension() == ".safetensors" && it->is_regular_file(size_ec)) {
      const uintmax_t n = it->file_size(size_ec);
      if (!size_ec) total += n;
    }
  }
  return ec ? 0 : total;
}

std::unique_ptr<Model> load_hf_model_checked(const std::filesystem::path& dir, std::optional<FileResidency> chosen,
                                             const LoraLoad& lora) {
  ModelConfig c = load_model_config(dir);
  const CheckpointFormat* format = nullptr;
  OpenedConfig opened;  // the quantization_config as the format reads it; kv_scales: FP8 KV-cache scales stored
  const std::string cfg_file = (dir / "config.json").string();
  if (c.quantization_config) format = &open_checkpoint_format(dir, *c.quantization_config, cfg_file, &opened);
  const FileResidency residency = chosen ? *chosen : runtime_weight_residency(safetensors_bytes(dir));
  // Adapters merged into the weights (the checkpoint's overlay), or read
  // here and applied in the forward once the model is built. Tensors an
  // adapter replaces whole (modules_to_save) are set through the overlay
  // either way.
  const bool merge = !lora.empty() && (lora.mode == LoraLoad::Mode::Merge ||
                                       (lora.mode == LoraLoad::Mode::Auto && !c.quantization_config));
  HfReader r{std::make_shared<Checkpoint>(merge ? open_checkpoint_with_loras(dir, lora.adapters, residency)
                                                : Checkpoint::open(dir, residency)),
             format, opened.qcfg};
  if (!merge) apply_hf_tensor_naming(c, *r.ck);  // open_checkpoint_with_loras applies it
  std::vector<LoraAdapter> forward_adapters;
  if (!lora.empty() && !merge) {
    for (const LoraSpec& s : lora.adapters) forward_adapters.push_back(read_peft_adapter(s, c, *r.ck));
    std::vector<LoraAdapter> replacing;
    for (const LoraAdapter& a : forward_adapters)
      if (!a.replaced.empty()) {
        replacing.push_back(a);
        replacing.back().modules.clear();
      }
    if (!replacing.empty()) r.ck->set_overlay(lora_merge_overlay(std::move(replacing)));
  }
  // The checkpoint's tensors against the config, as `convert` checks them
  // too: a quantized format's Linears are read (and checked) by the format.
  check_hf_checkpoint(c, *r.ck, format == nullptr, dir.string(), cfg_file);
  ModelWeights w;
  w.embed = r.linear("model.embed_tokens", false);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights l;
    l.attn_norm = r.vec(p + "input_layernorm.weight");
    l.ffn_norm = r.vec(p + "post_attention_layernorm.weight");
    if (c.model_type == "qwen3" || c.model_type == "qwen3_moe") {
      l.q_norm = r.vec(p + "self_attn.q_norm.weight");
      l.k_norm = r.vec(p + "self_attn.k_norm.weight");
    }
    if (c.moe_layer(i)) l.moe.experts.resize(static_cast<size_t>(c.num_experts));
    for (const RouterLinear& rl : router_linears(c, i))  // unquantized in every format the runtime reads
      l.moe.*rl.member = make_dense_linear(r.get(p + rl.name + ".weight"), nullptr, p + rl.name + ".weight");
    for (const LayerLinearId& id : layer_linears(c, i))
      layer_linear(l, id) = r.linear(p + id.name, hf_linear_has_bias(c, static_cast<LinearRole>(id.slot)));
    w.layers.push_back(std::move(l));
    if (opened.kv_scales) {
      const KvScales kv = format->read_kv_scales(*r.ck, i);
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
  auto model = std::make_unique<Model>(std::move(c), std::move(w), dir);
  model->set_weights_residency(residency);
  if (!forward_adapters.empty()) apply_lora_forward(*model, forward_adapters, dir.string());
  return model;
}

}  // namespace

LoraLoad::Mode parse_lora_mode(const std::string& word, const std::string& flag) {
  if (word == "auto") return LoraLoad::Mode::Auto;
  if (word == "merge") return LoraLoad::Mode::Merge;
  if (word == "forward") return LoraLoad::Mode::Forward;
  throw Error(ErrorKind::Usage, flag + " " + printable_text(word) + ": expected auto, merge or forward");
}

std::unique_ptr<Model> load_hf_model(const std::filesystem::path& dir, std::optional<FileResidency> residency,
                                     const LoraLoad& lora) {
  try {
    return load_hf_model_checked(dir, residency, lora);
  } catch (const nlohmann::json::exception& e) {
    // A quantization_config (or hf_quant_config.json) value of the wrong JSON
    // type, read by one of the checkpoint-format readers.
    throw invalid_input((dir / "config.json").string(), std::string("malformed quantization configuration: ") + e.what());
  }
}

std::unique_ptr<Model> load_model(const std::string& model, device::Kind runs_on, const LoraLoad& lora) {
  const std::filesystem::path p(model);
  if (is_file(p)) {
    if (p.extension() == ".gguf") return load_gguf_model(p, runs_on, lora);
    throw unsupported(model, "the runtime reads .gguf files and Hugging Face folders; this is neither");
  }
  ResolvedModel m = resolve_model(model);
  return load_hf_model(m.dir, std::nullopt, lora);
}

}  // namespace qf::rt
