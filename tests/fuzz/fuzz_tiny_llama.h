// Shared by the fuzz targets that need a model folder: the weights of a
// fixed, valid one-layer Llama (hidden 8, 2 heads of 4, 1 KV head,
// intermediate 16, vocabulary 16, f32, untied), written as
// DIR/model.safetensors.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "formats/safetensors.h"

namespace qf::fuzz {

inline void write_tiny_llama_weights(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  qf::SafetensorsWriter w(dir, "model");
  auto add = [&](const std::string& name, qf::Shape shape) {
    std::vector<float> v(static_cast<size_t>(qf::shape_numel(shape)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i % 7) + 0.5f;
    w.add(name, qf::Tensor::from_f32(v, shape));
  };
  add("model.embed_tokens.weight", {16, 8});
  const std::string p = "model.layers.0.";
  add(p + "input_layernorm.weight", {8});
  add(p + "post_attention_layernorm.weight", {8});
  add(p + "self_attn.q_proj.weight", {8, 8});
  add(p + "self_attn.k_proj.weight", {4, 8});
  add(p + "self_attn.v_proj.weight", {4, 8});
  add(p + "self_attn.o_proj.weight", {8, 8});
  add(p + "mlp.gate_proj.weight", {16, 8});
  add(p + "mlp.up_proj.weight", {16, 8});
  add(p + "mlp.down_proj.weight", {8, 16});
  add("model.norm.weight", {8});
  add("lm_head.weight", {16, 8});
  w.finish();
}

}  // namespace qf::fuzz
