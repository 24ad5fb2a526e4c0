// GGUF -> runtime Model, weights used in place from the mapping.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>

#include "core/error.h"
#include "core/weight_residency.h"
#include "formats/gguf/gguf.h"
#include "quantizers/kquants.h"
#include "convert/gguf_lora.h"
#include "runtime/lora_linear.h"
#include "runtime/model.h"

namespace qf::rt {
namespace {

struct GgufReader {
  std::shared_ptr<GgufFile> f;
  std::string where;

  const GgufTensorInfo& info(const std::string& name) const {
    const GgufTensorInfo* t = f->find_tensor(name);
    if (!t) throw not_found(where, "tensor '" + name + "' is missing");
    return *t;
  }
  bool has(const std::string& name) const { return f->find_tensor(name) != nullptr; }
  std::shared_ptr<const void> owner() const { return std::shared_ptr<const void>(f, f.get()); }

  static DType float_dtype(uint32_t type) {
    return type == ggml_type::F32 ? DType::F32 : type == ggml_type::F16 ? DType::F16 : DType::BF16;
  }
  static bool is_float(uint32_t type) {
    return type == ggml_type::F32 || type == ggml_type::F16 || type == ggml_type::BF16;
  }
  Tensor float_tensor(const GgufTensorInfo& t) const {
    Shape shape;
    for (auto it = t.dims.rbegin(); it != t.dims.rend(); ++it) shape.push_back(static_cast<int64_t>(*it));
    return Tensor::view_of(owner(), f->tensor_data(t), float_dtype(t.type), shape);
  }
  std::vector<float> vec(const std::string& name, int64_t n) const {
    const GgufTensorInfo& t = info(name);
    if (!is_float(t.type) || t.numel() != static_cast<uint64_t>(n))
      throw invalid_input(where, "tensor '" + name + "' should hold " + std::to_string(n) + " float values");
    return float_tensor(t).to_f32_vector();
  }
  std::shared_ptr<Linear> linear(const std::string& base, int64_t rows, int64_t cols, bool bias,
                                 bool multiplied = true) const {
    const std::string name = base + ".weight";
    const GgufTensorInfo& t = info(name);
    if (t.dims.size() != 2 || t.dims[0] != static_cast<uint64_t>(cols) || t.dims[1] != static_cast<uint64_t>(rows))
      throw invalid_input(where, "tensor '" + name + "' should have ne = [" + std::to_string(cols) + ", " +
                                     std::to_string(rows) + "]");
    std::optional<Tensor> b;
    if (bias || has(base + ".bias")) {
      const GgufTensorInfo& bi = info(base + ".bias");
      if (!is_float(bi.type)) throw invalid_input(where, "tensor '" + base + ".bias' is not a float tensor");
      b = float_tensor(bi);
    }
    if (is_float(t.type)) return make_dense_linear(float_tensor(t), b ? &*b : nullptr, name);
    return make_block_linear(t.type, f->tensor_data(t), rows, cols, owner(), b ? &*b : nullptr, name,
                             multiplied ? f->writable_tensor_data(t) : nullptr);
  }
  // A [rows, cols] Linear over `data` (rows of the tensor's type), viewed in place.
  std::shared_ptr<Linear> view(const GgufTensorInfo& t, const uint8_t* data, int64_t rows, int64_t cols,
                               const std::string& name) const {
    if (is_float(t.type))
      return make_dense_linear(Tensor::view_of(owner(), data, float_dtype(t.type), {rows, cols}), nullptr, name);
    uint8_t* writable = f->writable_tensor_data(t);
    return make_block_linear(t.type, data, rows, cols, owner(), nullptr, name,
                             writable ? writable + (data - f->tensor_data(t)) : nullptr);
  }
  // Expert e of a stacked expert tensor (ne = [cols, rows, experts]).
  std::shared_ptr<Linear> expert(const std::string& base, int64_t e, int64_t experts, int64_t rows, int64_t cols) const {
    const std::string name = base + ".weight";
    const GgufTensorInfo& t = info(name);
    if (t.dims.size() != 3 || t.dims[0] != static_cast<uint64_t>(cols) || t.dims[1] != static_cast<uint64_t>(rows) ||
        t.dims[2] != static_cast<uint64_t>(experts))
      throw invalid_input(where, "tensor '" + name + "' should have ne = [" + std::to_string(cols) + ", " + std::to_string(rows) +
                                     ", " + std::to_string(experts) + "]");
    const size_t row_bytes = is_float(t.type) ? static_cast<size_t>(cols) * dtype_size(float_dtype(t.type))
                                              : kquants::row_size(t.type, cols);
    const auto* data = static_cast<const uint8_t*>(f->tensor_data(t)) + static_cast<size_t>(e * rows) * row_bytes;
    return view(t, data, rows, cols, name + " expert " + std::to_string(e));
  }
  // A [1, cols] Linear stored as ne = [cols] or [cols, 1] (qwen2moe's shared-expert gate).
  std::shared_ptr<Linear> row_vector(const std::string& base, int64_t cols) const {
    const std::string name = base + ".weight";
    const GgufTensorInfo& t = info(name);
    if (t.dims.empty() || t.dims.size() > 2 || t.dims[0] != static_cast<uint64_t>(cols) || (t.dims.size() == 2 && t.dims[1] != 1))
      throw invalid_input(where, "tensor '" + name + "' should have ne = [" + std::to_string(cols) + "] or [" +
                                     std::to_string(cols) + ", 1]");
    return view(t, static_cast<const uint8_t*>(f->tensor_data(t)), 1, cols, name);
  }
};

}  // namespace

ModelConfig gguf_model_config(const GgufFile& f) {
  const std::string where = f.path().string();
  const std::string arch = f.get_string("general.architecture");
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && arch != "mistral" && arch != "qwen2moe" && arch != "qwen3moe" &&
      arch != "qwen2vl")
    throw unsupported(where, "general.architecture '" + arch +
                                 "' is not supported by the runtime (llama, mistral, qwen2, qwen3, qwen2moe, qwen3moe, qwen2vl)");
  auto key = [&](const std::string& k) { return arch + "." + k; };
  ModelConfig c;
  // qwen2vl: Qwen2-VL's language model, a Qwen2 whose multimodal RoPE turns
  // text (equal positions in every section) as ordinary RoPE does.
  c.model_type = arch == "mistral" ? "llama" : arch == "qwen2moe" ? "qwen2_moe" : arch == "qwen3moe" ? "qwen3_moe"
               : arch == "qwen2vl" ? "qwen2" : arch;
  c.hidden_size = f.get_u32(key("embedding_length"));
  c.num_hidden_layers = f.get_u32(key("block_count"));
  c.num_attention_heads = f.get_u32(key("attention.head_count"));
  c.num_key_value_heads = f.has(key("attention.head_count_kv")) ? f.get_u32(key("attention.head_count_kv")) : c.num_attention_heads;
  // 0 when absent: check_model_config derives embedding_length / head_count (and checks that it divides).
  c.head_dim = f.has(key("attention.key_length")) ? f.get_u32(key("attention.key_length")) : 0;
  if (f.has(key("attention.key_length")) && c.head_dim == 0)
    throw invalid_input(where, "'" + key("attention.key_length") + "' is 0, must be a positive integer");
  c.intermediate_size = f.get_u32(key("feed_forward_length"));
  c.max_position_embeddings = f.has(key("context_length")) ? f.get_u32(key("context_length")) : 0;
  c.rope_theta = f.has(key("rope.freq_base")) ? f.get_f32(key("rope.freq_base")) : 10000.0;
  c.rms_norm_eps = f.get_f32(key("attention.layer_norm_rms_epsilon"));
  if (f.has(key("attention.sliding_window"))) c.sliding_window = f.get_u32(key("attention.sliding_window"));
  const bool sparse = arch == "qwen2moe" || arch == "qwen3moe" || (f.has(key("expert_count")) && f.get_u32(key("expert_count")) > 0);
  if (sparse) {
    // llama.cpp's MoE graphs: softmax over the experts, top expert_used_count,
    // renormalised for llama (Mixtral) and qwen3moe, not for qwen2moe; every
    // layer sparse.
    if (arch == "llama") c.model_type = "mixtral";
    c.num_experts = f.get_u32(key("expert_count"));
    c.num_experts_per_tok = f.get_u32(key("expert_used_count"));
    c.moe_intermediate_size = arch == "llama" ? c.intermediate_size : f.get_u32(key("expert_feed_forward_length"));
    if (f.has(key("expert_shared_feed_forward_length")))
      c.shared_expert_intermediate_size = f.get_u32(key("expert_shared_feed_forward_length"));
    else if (arch == "qwen2moe")
      throw not_found(where, "key '" + key("expert_shared_feed_forward_length") + "' is missing");
    c.decoder_sparse_step = 1;
    c.norm_topk_prob = arch != "qwen2moe";
  }
  if (f.has(key("rope.scaling.type"))) {
    const std::string t = f.get_string(key("rope.scaling.type"));
    if (t == "linear") {
      RopeScaling s;
      s.type = "linear";
      s.factor = f.get_f32(key("rope.scaling.factor"));
      c.rope_scaling = s;
    } else if (t != "none") {
      throw unsupported(where, "rope.scaling.type '" + t + "' is not supported by the runtime");
    }
  }
  const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
  if (!emb) throw not_found(where, "tensor 'token_embd.weight' is missing");
  if (emb->dims.size() != 2)
    throw invalid_input(where, "tensor 'token_embd.weight' should have 2 dims, ne = [" + key("embedding_length") + ", vocab]");
  c.vocab_size = static_cast<int64_t>(std::min<uint64_t>(emb->dims[1], uint64_t{1} << 62));
  c.tie_word_embeddings = !f.find_tensor("output.weight");
  c.torch_dtype = "gguf";

  static const std::map<std::string, std::string> kGgufKeys = {
      {"hidden_size", "embedding_length"},
      {"num_hidden_layers", "block_count"},
      {"num_attention_heads", "attention.head_count"},
      {"num_key_value_heads", "attention.head_count_kv"},
      {"head_dim", "attention.key_length"},
      {"intermediate_size", "feed_forward_length"},
      {"max_position_embeddings", "context_length"},
      {"rope_theta", "rope.freq_base"},
      {"rms_norm_eps", "attention.layer_norm_rms_epsilon"},
      {"sliding_window", "attention.sliding_window"},
      {"rope_scaling.factor", "rope.scaling.factor"},
      {"num_experts", "expert_count"},
      {"num_local_experts", "expert_count"},
      {"num_experts_per_tok", "expert_used_count"},
      {"moe_intermediate_size", "expert_feed_forward_length"}};
  check_model_config(c, where, [&](const std::string& k) {
    if (k == "vocab_size") return std::string("token_embd.weight ne[1] (vocabulary size)");
    auto it = kGgufKeys.find(k);
    return it == kGgufKeys.end() ? k : key(it->second);
  });
  if (emb->dims[0] != static_cast<uint64_t>(c.hidden_size))
    throw invalid_input(where, "tensor 'token_embd.weight' should have ne = [" + std::to_string(c.hidden_size) + ", vocab]");
  // The runtime rotates and attends over head_dim for both K and V.
  if (f.has(key("attention.value_length")) && f.get_u32(key("attention.value_length")) != static_cast<uint64_t>(c.head_dim))
    throw unsupported(where, "'" + key("attention.value_length") + "' " + std::to_string(f.get_u32(key("attention.value_length"))) +
                                 " differs from the key length " + std::to_string(c.head_dim) + ", which the runtime does not support");
  if (f.has(key("rope.dimension_count"))) {
    const uint32_t rd = f.get_u32(key("rope.dimension_count"));
    if (rd == 0 || rd % 2 != 0 || rd > c.head_dim)
      throw invalid_input(where, "'" + key("rope.dimension_count") + "' is " + std::to_string(rd) +
                                     ", must be even and between 2 and the head size " + std::to_string(c.head_dim));
    if (rd != c.head_dim)
      throw unsupported(where, "'" + key("rope.dimension_count") + "' " + std::to_string(rd) + " is below the head size " +
                                   std::to_string(c.head_dim) + " (partial RoPE), which the runtime does not support");
  }
  std::vector<std::string> names;
  names.reserve(f.tensors().size());
  for (const GgufTensorInfo& t : f.tensors()) names.push_back(t.name);
  check_layer_tensors(names, "blk.", c.num_hidden_layers, where, key("block_count"));
  return c;
}

std::unique_ptr<Model> load_gguf_model(const std::filesystem::path& file, device::Kind runs_on, const LoraLoad& lora) {
  if (!lora.empty() && lora.mode == LoraLoad::Mode::Merge)
    throw unsupported(file.string(), "a LoRA adapter is not merged into a GGUF model (its weights are quantized or "
                                     "converted); apply it in the forward (--lora-mode forward or auto), or merge "
                                     "into the Hugging Face model before converting");
  std::error_code ec;
  const uintmax_t bytes = std::filesystem::file_size(file, ec);  // an error here is reported by open
  const FileResidency residency = runtime_weight_residency(ec ? 0 : static_cast<uint64_t>(bytes));
  // Writable (when read into memory) until the block Linears have regrouped
  // what they regroup, for the CPU only.
  const MemorySeal seal = runs_on == device::Kind::Cpu ? MemorySeal::Unsealed : MemorySeal::Sealed;
  GgufReader r{std::make_shared<GgufFile>(GgufFile::open(file, residency, seal)), file.string()};
  const GgufFile& f = *r.f;
  ModelConfig c = gguf_model_config(f);
  const std::string arch = f.get_string("general.architecture");

  ModelWeights w;
  // The embedding table is only read a row at a time, unless the head shares it.
  w.embed = r.linear("token_embd", c.vocab_size, c.hidden_size, false, c.tie_word_embeddings);
  const bool qkv_bias = arch == "qwen2" || arch == "qwen2moe" || arch == "qwen2vl";
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerWeights l;
    l.attn_norm = r.vec(p + "attn_norm.weight", c.hidden_size);
    l.ffn_norm = r.vec(p + "ffn_norm.weight", c.hidden_size);
    if (arch == "qwen3" || arch == "qwen3moe") {
      l.q_norm = r.vec(p + "attn_q_norm.weight", c.head_dim);
      l.k_norm = r.vec(p + "attn_k_norm.weight", c.head_dim);
    }
    l.q = r.linear(p + "attn_q", c.q_dim(), c.hidden_size, qkv_bias);
    l.k = r.linear(p + "attn_k", c.kv_dim(), c.hidden_size, qkv_bias);
    l.v = r.linear(p + "attn_v", c.kv_dim(), c.hidden_size, qkv_bias);
    l.o = r.linear(p + "attn_output", c.hidden_size, c.q_dim(), false);
    if (c.moe_layer(i)) {
      const int64_t E = c.num_experts, ff = c.moe_intermediate_size, h = c.hidden_size;
      l.moe.router = r.linear(p + "ffn_gate_inp", E, h, false);
      for (int64_t e = 0; e < E; ++e)
        l.moe.experts.push_back({r.expert(p + "ffn_gate_exps", e, E, ff, h), r.expert(p + "ffn_up_exps", e, E, ff, h),
                                 r.expert(p + "ffn_down_exps", e, E, h, ff)});
      if (c.shared_expert_intermediate_size > 0) {
        const int64_t sf = c.shared_expert_intermediate_size;
        l.moe.shared = {r.linear(p + "ffn_gate_shexp", sf, h, false), r.linear(p + "ffn_up_shexp", sf, h, false),
                        r.linear(p + "ffn_down_shexp", h, sf, false)};
        l.moe.shared_gate = r.row_vector(p + "ffn_gate_inp_shexp", h);
      }
    } else {
      l.gate = r.linear(p + "ffn_gate", c.intermediate_size, c.hidden_size, false);
      l.up = r.linear(p + "ffn_up", c.intermediate_size, c.hidden_size, false);
      l.down = r.linear(p + "ffn_down", c.hidden_size, c.intermediate_size, false);
    }
    w.layers.push_back(std::move(l));
  }
  w.final_norm = r.vec("output_norm.weight", c.hidden_size);
  w.lm_head = c.tie_word_embeddings ? w.embed : r.linear("output", c.vocab_size, c.hidden_size, false);
  // llama.cpp's LLAMA RoPE mode rotates adjacent pairs; qwen2/qwen3 use NEOX (halves).
  w.rope_interleaved = arch == "llama" || arch == "mistral";
  if (r.has("rope_freqs.weight")) {
    w.rope_freq_factors = r.vec("rope_freqs.weight", c.head_dim / 2);
    for (size_t i = 0; i < w.rope_freq_factors.size(); ++i)  // the runtime divides the RoPE frequencies by them
      if (!(w.rope_freq_factors[i] > 0) || !std::isfinite(w.rope_freq_factors[i]))
        throw invalid_input(r.where, "tensor 'rope_freqs.weight' value " + std::to_string(i) + " is " +
                                         std::to_string(w.rope_freq_factors[i]) + ", must be positive and finite");
  }
  r.f->mapping()->seal();
  auto model = std::make_unique<Model>(std::move(c), std::move(w), file);
  model->set_weights_residency(residency);
  if (!lora.empty()) {
    std::vector<LoraAdapter> adapters;
    for (const LoraSpec& s : lora.adapters) adapters.push_back(read_gguf_lora(s, model->config(), arch));
    apply_lora_forward(*model, adapters, file.string());
  }
  return model;
}

}  // namespace qf::rt
