#include "formats/hf/model_config.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace qf {
namespace {

using nlohmann::json;

json llama() {
  return json::parse(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": [128001, 128008]})");
}

TEST(ModelConfig, Llama3) {
  ModelConfig c = parse_model_config(llama(), "config.json");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_EQ(c.intermediate_size, 14336);
  ASSERT_TRUE(c.rope_scaling);
  EXPECT_EQ(c.rope_scaling->type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, 8.0);
  EXPECT_EQ(*c.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(*c.eos_token_id, 128001);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.sliding_window);
}

TEST(ModelConfig, Qwen2BiasAndWindowOnlyWhenEnabled) {
  json j = llama();
  j["model_type"] = "qwen2";
  j.erase("rope_scaling");
  j["sliding_window"] = 4096;
  j["use_sliding_window"] = false;
  ModelConfig c = parse_model_config(j, "c");
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.sliding_window);
  j["use_sliding_window"] = true;
  EXPECT_EQ(*parse_model_config(j, "c").sliding_window, 4096);
}

TEST(ModelConfig, MistralWindowAndQwen3HeadDim) {
  json j = llama();
  j["model_type"] = "mistral";
  j["sliding_window"] = 4096;
  EXPECT_EQ(*parse_model_config(j, "c").sliding_window, 4096);
  j["model_type"] = "qwen3";
  j["head_dim"] = 256;  // qwen3: head_dim independent of hidden/heads
  ModelConfig c = parse_model_config(j, "c");
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.q_dim(), 32 * 256);
}

TEST(ModelConfig, YarnKeepsEveryField) {
  json j = llama();
  j["rope_scaling"] = json::parse(R"({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                                      "beta_fast": 32, "beta_slow": 1, "attention_factor": 0.1, "extra": "kept"})");
  ModelConfig c = parse_model_config(j, "c");
  EXPECT_EQ(c.rope_scaling->type, "yarn");
  EXPECT_DOUBLE_EQ(*c.rope_scaling->beta_fast, 32);
  EXPECT_DOUBLE_EQ(*c.rope_scaling->attention_factor, 0.1);
  EXPECT_EQ(c.rope_scaling->raw["extra"], "kept");
}

TEST(ModelConfig, MoeFields) {
  json j = llama();
  j["model_type"] = "qwen3_moe";
  j["num_experts"] = 128;
  j["num_experts_per_tok"] = 8;
  j["moe_intermediate_size"] = 768;
  ModelConfig c = parse_model_config(j, "c");
  EXPECT_TRUE(c.is_moe());
  EXPECT_EQ(c.moe_intermediate_size, 768);
  j["model_type"] = "mixtral";
  j["num_local_experts"] = 8;
  j["num_experts_per_tok"] = 2;
  EXPECT_EQ(parse_model_config(j, "c").num_experts, 8);
}

TEST(ModelConfig, KeepsQuantizationConfig) {
  json j = llama();
  j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}};
  EXPECT_EQ((*parse_model_config(j, "c").quantization_config)["bits"], 4);
}

// The malformed corpus: each config gets one clear error naming the key.
struct BadConfig {
  const char* what;
  std::function<void(json&)> edit;
  ErrorKind kind;
  const char* fragment;
};

TEST(ModelConfig, MalformedCorpus) {
  std::vector<BadConfig> cases = {
      {"unsupported architecture", [](json& j) { j["model_type"] = "gpt2"; }, ErrorKind::Unsupported,
       "unsupported architecture 'gpt2' (model_type); supported: llama, mistral, qwen2, qwen3, mixtral, qwen3_moe"},
      {"missing model_type", [](json& j) { j.erase("model_type"); }, ErrorKind::InvalidInput, "missing required key 'model_type'"},
      {"missing hidden_size", [](json& j) { j.erase("hidden_size"); }, ErrorKind::InvalidInput, "missing required key 'hidden_size'"},
      {"string hidden_size", [](json& j) { j["hidden_size"] = "4096"; }, ErrorKind::InvalidInput, "'hidden_size' must be a positive integer, got \"4096\""},
      {"zero layers", [](json& j) { j["num_hidden_layers"] = 0; }, ErrorKind::InvalidInput, "'num_hidden_layers' must be a positive integer"},
      {"float heads", [](json& j) { j["num_attention_heads"] = 32.5; }, ErrorKind::InvalidInput, "'num_attention_heads'"},
      {"kv heads do not divide", [](json& j) { j["num_key_value_heads"] = 5; }, ErrorKind::InvalidInput, "not a multiple of num_key_value_heads 5"},
      {"hidden not divisible", [](json& j) { j["hidden_size"] = 4000; j["num_attention_heads"] = 48; j["num_key_value_heads"] = 8; },
       ErrorKind::InvalidInput, "not divisible by num_attention_heads"},
      {"rope_scaling not object", [](json& j) { j["rope_scaling"] = 8; }, ErrorKind::InvalidInput, "'rope_scaling' must be an object"},
      {"llama3 scaling incomplete", [](json& j) { j["rope_scaling"].erase("low_freq_factor"); }, ErrorKind::InvalidInput, "llama3 scaling needs"},
      {"tie as string", [](json& j) { j["tie_word_embeddings"] = "false"; }, ErrorKind::InvalidInput, "'tie_word_embeddings' must be true or false"},
      {"quantization_config list", [](json& j) { j["quantization_config"] = json::array(); }, ErrorKind::InvalidInput, "'quantization_config' must be an object"},
      {"moe without experts", [](json& j) { j["model_type"] = "mixtral"; }, ErrorKind::InvalidInput, "missing required key 'num_local_experts'"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    json j = llama();
    c.edit(j);
    EXPECT_QF_ERROR(parse_model_config(j, "dir/config.json"), c.kind, "dir/config.json: ");
    EXPECT_QF_ERROR(parse_model_config(j, "dir/config.json"), c.kind, c.fragment);
  }
}

TEST(ModelConfig, FileErrors) {
  test::TempDir dir;
  EXPECT_QF_ERROR(load_model_config(dir.path()), ErrorKind::NotFound, "no config.json");
  test::write_file(dir / "config.json", "{\"model_type\": \"llama\",");
  EXPECT_QF_ERROR(load_model_config(dir.path()), ErrorKind::InvalidInput, "config.json: not valid JSON");
  test::write_file(dir / "config.json", "[1, 2]");
  EXPECT_QF_ERROR(load_model_config(dir.path()), ErrorKind::InvalidInput, "must be a JSON object");
}

}  // namespace
}  // namespace qf
