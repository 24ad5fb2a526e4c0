// Vision-language configs: the language model's fields wherever the config
// keeps them, the vision parts, multimodal RoPE, and the two tensor namings.
#include <gtest/gtest.h>

#include "formats/hf/model_config.h"
#include "formats/hf/model_tensors.h"
#include "formats/tensor_naming.h"
#include "test_util.h"

namespace qf {
namespace {

using nlohmann::json;

// Qwen2-VL-2B-Instruct's config as transformers before 4.52 wrote it.
json qwen2_vl() {
  return json::parse(R"({"architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl",
    "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
    "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_sliding_window": false,
    "sliding_window": 32768, "max_window_layers": 28, "bos_token_id": 151643, "eos_token_id": 151645,
    "vision_start_token_id": 151652, "vision_end_token_id": 151653, "vision_token_id": 151654,
    "image_token_id": 151655, "video_token_id": 151656,
    "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16, "in_chans": 3,
                      "hidden_size": 1536, "patch_size": 14, "spatial_merge_size": 2, "spatial_patch_size": 14,
                      "temporal_patch_size": 2},
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}})");
}

// The same as transformers 4.52 on writes it: the language model in text_config.
json qwen2_vl_current() {
  json j = qwen2_vl();
  json t = json::object();
  for (const char* k : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                        "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta",
                        "tie_word_embeddings", "use_sliding_window", "sliding_window", "max_window_layers",
                        "image_token_id", "vision_start_token_id", "vision_end_token_id"}) {
    t[k] = j[k];
    j.erase(k);
  }
  t["model_type"] = "qwen2_vl_text";
  t["rope_scaling"] = {{"rope_type", "default"}, {"type", "default"}, {"mrope_section", {16, 24, 24}}};
  j.erase("rope_scaling");
  j["text_config"] = t;
  return j;
}

// llava-1.5-7b-hf's: text_config names only what differs from LlamaConfig's defaults.
json llava() {
  return json::parse(R"({"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
    "ignore_index": -100, "image_token_index": 32000, "projector_hidden_act": "gelu", "pad_token_id": 32001,
    "text_config": {"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096, "model_type": "llama",
                    "rms_norm_eps": 1e-05, "torch_dtype": "float16", "vocab_size": 32064},
    "torch_dtype": "float16", "vision_feature_layer": -2, "vision_feature_select_strategy": "default",
    "vision_config": {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096, "model_type": "clip_vision_model",
                      "num_attention_heads": 16, "num_hidden_layers": 24, "patch_size": 14, "projection_dim": 768}})");
}

TEST(VisionLanguageConfig, Qwen2VlLanguageModelAndSections) {
  for (const json& j : {qwen2_vl(), qwen2_vl_current()}) {
    ModelConfig c = parse_model_config(j, "config.json");
    EXPECT_EQ(c.model_type, "qwen2");
    ASSERT_TRUE(c.vlm);
    EXPECT_EQ(c.vlm->model_type, "qwen2_vl");
    EXPECT_EQ(c.hidden_size, 1536);
    EXPECT_EQ(c.head_dim, 128);
    EXPECT_EQ(c.num_key_value_heads, 2);
    EXPECT_TRUE(c.attention_bias);  // Qwen2's q/k/v biases
    EXPECT_TRUE(c.tie_word_embeddings);
    EXPECT_FALSE(c.rope_scaling);  // mrope: ordinary frequencies, sections per position
    EXPECT_EQ(c.vlm->mrope_section, (std::vector<int64_t>{16, 24, 24}));
    EXPECT_EQ(c.vlm->image_token_id, 151655);
    EXPECT_EQ(c.vlm->vision_start_token_id, 151652);
    EXPECT_EQ(c.vlm->vision["embed_dim"], 1280);
    EXPECT_EQ(c.torch_dtype, "bfloat16");
    EXPECT_EQ(c.architectures, std::vector<std::string>{"Qwen2VLForConditionalGeneration"});
    EXPECT_EQ(c.raw, j);  // written back as it was
  }
}

TEST(VisionLanguageConfig, LlavaFillsTextDefaults) {
  ModelConfig c = parse_model_config(llava(), "config.json");
  EXPECT_EQ(c.model_type, "llama");
  ASSERT_TRUE(c.vlm);
  EXPECT_EQ(c.vlm->model_type, "llava");
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.intermediate_size, 11008);
  EXPECT_EQ(c.num_key_value_heads, 32);
  EXPECT_EQ(c.vocab_size, 32064);
  EXPECT_EQ(c.max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.vlm->image_token_id, 32000);
  EXPECT_TRUE(c.vlm->mrope_section.empty());
  json next = llava();
  next["model_type"] = "llava_next";
  next["text_config"] = {{"model_type", "mistral"}, {"vocab_size", 32064}};
  ModelConfig n = parse_model_config(next, "config.json");
  EXPECT_EQ(n.model_type, "mistral");
  EXPECT_EQ(n.num_key_value_heads, 8);
  EXPECT_EQ(n.intermediate_size, 14336);
}

TEST(VisionLanguageConfig, ErrorsNameTheKey) {
  json j = qwen2_vl();
  j["rope_scaling"]["mrope_section"] = {16, 24, 16};
  EXPECT_QF_ERROR(parse_model_config(j, "m/config.json"), ErrorKind::InvalidInput, "mrope_section sums to 56, but head_dim / 2 is 64");
  j = qwen2_vl();
  j.erase("rope_scaling");
  EXPECT_QF_ERROR(parse_model_config(j, "m/config.json"), ErrorKind::InvalidInput, "needs rope_scaling.mrope_section");
  j = qwen2_vl();
  j.erase("vision_config");
  EXPECT_QF_ERROR(parse_model_config(j, "m/config.json"), ErrorKind::InvalidInput, "needs a 'vision_config' object");
  j = qwen2_vl();
  j["image_token_id"] = 200000;
  EXPECT_QF_ERROR(parse_model_config(j, "m/config.json"), ErrorKind::InvalidInput, "image token 200000 is outside the vocabulary");
  j = llava();
  j["text_config"]["model_type"] = "gemma";
  EXPECT_QF_ERROR(parse_model_config(j, "m/config.json"), ErrorKind::Unsupported, "text_config.model_type 'gemma'");
  j = llava();
  j.erase("image_token_index");
  EXPECT_QF_ERROR(parse_model_config(j, "m/config.json"), ErrorKind::InvalidInput, "needs 'image_token_index'");
  j = llava();
  j["text_config"]["hidden_size"] = "big";
  EXPECT_QF_ERROR(parse_model_config(j, "m/config.json"), ErrorKind::InvalidInput, "m/config.json: text_config: key 'hidden_size'");
}

TEST(VisionLanguageConfig, TensorNamingBothTransformersSpellings) {
  const ModelConfig q = parse_model_config(qwen2_vl(), "config.json");
  const ModelConfig l = parse_model_config(llava(), "config.json");
  struct Case {
    const ModelConfig* c;
    std::vector<std::string> stored;
    std::vector<std::string> working;
  };
  const std::vector<Case> cases = {
      {&q, {"model.layers.0.mlp.up_proj.weight", "visual.blocks.0.attn.qkv.weight", "lm_head.weight"},
       {"model.layers.0.mlp.up_proj.weight", "visual.blocks.0.attn.qkv.weight", "lm_head.weight"}},
      {&q, {"model.language_model.layers.0.mlp.up_proj.weight", "model.language_model.embed_tokens.weight",
            "model.visual.blocks.0.attn.qkv.weight", "model.visual.merger.mlp.0.bias", "lm_head.weight"},
       {"model.layers.0.mlp.up_proj.weight", "model.embed_tokens.weight", "visual.blocks.0.attn.qkv.weight",
        "visual.merger.mlp.0.bias", "lm_head.weight"}},
      {&l, {"language_model.model.layers.1.self_attn.q_proj.weight", "language_model.lm_head.weight",
            "vision_tower.vision_model.post_layernorm.bias", "multi_modal_projector.linear_1.weight"},
       {"model.layers.1.self_attn.q_proj.weight", "lm_head.weight", "vision_tower.vision_model.post_layernorm.bias",
        "multi_modal_projector.linear_1.weight"}},
      {&l, {"model.language_model.layers.1.self_attn.q_proj.weight", "lm_head.weight", "model.image_newline",
            "model.vision_tower.vision_model.post_layernorm.bias", "model.multi_modal_projector.linear_1.weight"},
       {"model.layers.1.self_attn.q_proj.weight", "lm_head.weight", "image_newline",
        "vision_tower.vision_model.post_layernorm.bias", "multi_modal_projector.linear_1.weight"}},
  };
  for (const Case& k : cases) {
    const TensorNaming n = hf_tensor_naming(*k.c, k.stored);
    for (size_t i = 0; i < k.stored.size(); ++i) {
      SCOPED_TRACE(k.stored[i]);
      EXPECT_EQ(n.to_working(k.stored[i]), k.working[i]);
      EXPECT_EQ(n.to_stored(k.working[i]), k.stored[i]);
    }
  }
  EXPECT_TRUE(is_vision_tensor("visual.merger.mlp.2.weight"));
  EXPECT_TRUE(is_vision_tensor("image_newline"));
  EXPECT_FALSE(is_vision_tensor("model.layers.0.mlp.up_proj.weight"));
  // A text model's checkpoint is read as stored.
  ModelConfig text = q;
  text.vlm.reset();
  EXPECT_TRUE(hf_tensor_naming(text, {"model.language_model.x"}).identity());
}

}  // namespace
}  // namespace qf
