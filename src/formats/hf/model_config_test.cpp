#include "formats/hf/model_config.h"

#include <gtest/gtest.h>

#include <cmath>

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
       "unsupported architecture 'gpt2' (model_type); supported: llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, qwen2_vl, qwen2_5_vl, llava, llava_next"},
      {"missing model_type", [](json& j) { j.erase("model_type"); }, ErrorKind::InvalidInput, "missing required key 'model_type'"},
      {"mlp_only_layers beyond the layers",
       [](json& j) { j["model_type"] = "qwen2_moe"; j["num_experts"] = 4; j["num_experts_per_tok"] = 2; j["moe_intermediate_size"] = 64;
                     j["mlp_only_layers"] = {1, 99}; },
       ErrorKind::InvalidInput, "'mlp_only_layers' names layer 99, beyond 'num_hidden_layers'"},
      {"mlp_only_layers not a list",
       [](json& j) { j["model_type"] = "qwen3_moe"; j["num_experts"] = 4; j["num_experts_per_tok"] = 2; j["moe_intermediate_size"] = 64;
                     j["mlp_only_layers"] = "1"; },
       ErrorKind::InvalidInput, "key 'mlp_only_layers' must be a list of layer indices"},
      {"more experts per token than experts",
       [](json& j) { j["model_type"] = "mixtral"; j["num_local_experts"] = 2; j["num_experts_per_tok"] = 3; },
       ErrorKind::InvalidInput, "num_experts_per_tok exceeds the number of experts"},
      {"missing hidden_size", [](json& j) { j.erase("hidden_size"); }, ErrorKind::InvalidInput, "missing required key 'hidden_size'"},
      {"string hidden_size", [](json& j) { j["hidden_size"] = "4096"; }, ErrorKind::InvalidInput, "'hidden_size' must be a positive integer, got \"4096\""},
      {"zero layers", [](json& j) { j["num_hidden_layers"] = 0; }, ErrorKind::InvalidInput, "'num_hidden_layers' must be a positive integer"},
      {"float heads", [](json& j) { j["num_attention_heads"] = 32.5; }, ErrorKind::InvalidInput, "'num_attention_heads'"},
      {"kv heads do not divide", [](json& j) { j["num_key_value_heads"] = 5; }, ErrorKind::InvalidInput,
       "'num_attention_heads' 32 is not a multiple of 'num_key_value_heads' 5"},
      {"hidden not divisible", [](json& j) { j["hidden_size"] = 4000; j["num_attention_heads"] = 48; j["num_key_value_heads"] = 8; },
       ErrorKind::InvalidInput, "'hidden_size' 4000 is not divisible by 'num_attention_heads' 48, and no 'head_dim' is given"},
      {"zero eps", [](json& j) { j["rms_norm_eps"] = 0; }, ErrorKind::InvalidInput, "'rms_norm_eps' is 0, must be a positive finite number"},
      {"negative eps", [](json& j) { j["rms_norm_eps"] = -1e-5; }, ErrorKind::InvalidInput, "'rms_norm_eps' is -1e-05"},
      {"zero theta", [](json& j) { j["rope_theta"] = 0.0; }, ErrorKind::InvalidInput, "'rope_theta' is 0, must be a positive finite number"},
      {"odd head_dim", [](json& j) { j["head_dim"] = 127; }, ErrorKind::InvalidInput, "'head_dim' is 127, must be even"},
      {"huge hidden", [](json& j) { j["hidden_size"] = int64_t{1} << 40; }, ErrorKind::InvalidInput,
       "'hidden_size' is 1099511627776, above the limit of 1048576"},
      {"huge vocabulary", [](json& j) { j["vocab_size"] = int64_t{1} << 30; }, ErrorKind::InvalidInput, "'vocab_size' is 1073741824, above the limit"},
      {"huge context", [](json& j) { j["max_position_embeddings"] = int64_t{1} << 33; }, ErrorKind::InvalidInput,
       "'max_position_embeddings' is 8589934592, must be between 0 and 2^32 - 1"},
      {"llama3 factors equal", [](json& j) { j["rope_scaling"]["high_freq_factor"] = 1.0; }, ErrorKind::InvalidInput,
       "'rope_scaling.high_freq_factor' must be greater than 'rope_scaling.low_freq_factor'"},
      {"llama3 zero original context", [](json& j) { j["rope_scaling"]["original_max_position_embeddings"] = 0; },
       ErrorKind::InvalidInput, "'rope_scaling.original_max_position_embeddings' must be a positive integer"},
      {"too many experts per token", [](json& j) { j["model_type"] = "mixtral"; j["num_local_experts"] = 2; j["num_experts_per_tok"] = 4; },
       ErrorKind::InvalidInput, "num_experts_per_tok exceeds the number of experts"},
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

// Every range message states the rule its check applies: a key that must be
// positive never says "non-negative" about a 0 it refuses.
TEST(ModelConfig, RangeMessagesStateTheRuleTheyCheck) {
  const auto qwen_moe = [](json& j) {
    j["model_type"] = "qwen2_moe";
    j["num_experts"] = 4;
    j["num_experts_per_tok"] = 2;
    j["moe_intermediate_size"] = 64;
  };
  const std::vector<BadConfig> cases = {
      {"decoder_sparse_step 0", [&](json& j) { qwen_moe(j); j["decoder_sparse_step"] = 0; }, ErrorKind::InvalidInput,
       "key 'decoder_sparse_step' must be a positive integer, got 0"},
      {"max_position_embeddings 0", [](json& j) { j["max_position_embeddings"] = 0; }, ErrorKind::InvalidInput,
       "key 'max_position_embeddings' must be a positive integer, got 0"},
      {"num_key_value_heads 0", [](json& j) { j["num_key_value_heads"] = 0; }, ErrorKind::InvalidInput,
       "key 'num_key_value_heads' must be a positive integer, got 0"},
      {"negative shared expert width", [&](json& j) { qwen_moe(j); j["shared_expert_intermediate_size"] = -1; },
       ErrorKind::InvalidInput, "key 'shared_expert_intermediate_size' must be a non-negative integer, got -1"},
      {"negative token id", [](json& j) { j["bos_token_id"] = -1; }, ErrorKind::InvalidInput,
       "key 'bos_token_id' must be a non-negative integer, got -1"},
      {"negative mlp_only_layers", [&](json& j) { qwen_moe(j); j["mlp_only_layers"] = {-1}; }, ErrorKind::InvalidInput,
       "key 'mlp_only_layers' must be a list of layer indices (integers from 0), got [-1]"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    json j = llama();
    c.edit(j);
    EXPECT_QF_ERROR(parse_model_config(j, "config.json"), c.kind, c.fragment);
  }
  // The same rules on a config built elsewhere (the GGUF loader's), named by the source's keys.
  ModelConfig m = parse_model_config([&] {
    json j = llama();
    qwen_moe(j);
    return j;
  }(), "c");
  ModelConfig step = m;
  step.decoder_sparse_step = 0;
  EXPECT_QF_ERROR(check_model_config(step, "m.gguf"), ErrorKind::InvalidInput,
                  "'decoder_sparse_step' is 0, must be a positive integer");
  ModelConfig shared = m;
  shared.shared_expert_intermediate_size = -3;
  EXPECT_QF_ERROR(check_model_config(shared, "m.gguf"), ErrorKind::InvalidInput,
                  "'shared_expert_intermediate_size' is -3, must be between 0 (no shared expert) and 1048576");
  ModelConfig per_tok = m;
  per_tok.num_experts_per_tok = 5;
  EXPECT_QF_ERROR(check_model_config(per_tok, "m.gguf", [](const std::string& k) { return "qwen2moe." + k; }),
                  ErrorKind::InvalidInput, "'qwen2moe.num_experts_per_tok' is 5, more than the 4 experts of 'qwen2moe.num_experts'");
}

TEST(ModelConfig, FileErrors) {
  test::TempDir dir;
  EXPECT_QF_ERROR(load_model_config(dir.path()), ErrorKind::NotFound, "no config.json");
  test::write_file(dir / "config.json", "{\"model_type\": \"llama\",");
  EXPECT_QF_ERROR(load_model_config(dir.path()), ErrorKind::InvalidInput, "config.json: not valid JSON");
  test::write_file(dir / "config.json", "[1, 2]");
  EXPECT_QF_ERROR(load_model_config(dir.path()), ErrorKind::InvalidInput, "must be a JSON object");
  // nlohmann reports a number out of double range as out_of_range, not parse_error.
  test::write_file(dir / "config.json", "{\"model_type\": \"llama\", \"rms_norm_eps\": 1e999}");
  EXPECT_QF_ERROR(load_model_config(dir.path()), ErrorKind::InvalidInput, "config.json: not valid JSON");
}

TEST(ModelConfig, CheckNamesTheSourcesKeys) {
  ModelConfig c;
  c.model_type = "llama";
  c.hidden_size = 32, c.num_hidden_layers = 1, c.num_attention_heads = 4, c.num_key_value_heads = 2;
  c.intermediate_size = 64, c.vocab_size = 16;
  auto gguf_key = [](const std::string& k) { return k == "rms_norm_eps" ? std::string("llama.attention.layer_norm_rms_epsilon") : "llama." + k; };
  ModelConfig ok = c;
  check_model_config(ok, "m.gguf", gguf_key);
  EXPECT_EQ(ok.head_dim, 8);  // derived: hidden_size / heads
  ModelConfig nan = c;
  nan.rms_norm_eps = std::nan("");
  EXPECT_QF_ERROR(check_model_config(nan, "m.gguf", gguf_key), ErrorKind::InvalidInput,
                  "m.gguf: 'llama.attention.layer_norm_rms_epsilon' is nan, must be a positive finite number");
  ModelConfig inf = c;
  inf.rope_theta = INFINITY;
  EXPECT_QF_ERROR(check_model_config(inf, "m.gguf"), ErrorKind::InvalidInput, "'rope_theta' is inf");
  ModelConfig zero_heads = c;
  zero_heads.num_attention_heads = 0;  // checked before hidden_size / heads is formed
  EXPECT_QF_ERROR(check_model_config(zero_heads, "m.gguf", gguf_key), ErrorKind::InvalidInput,
                  "'llama.num_attention_heads' is 0, must be a positive integer");
  ModelConfig zero_kv = c;
  zero_kv.num_key_value_heads = 0;
  EXPECT_QF_ERROR(check_model_config(zero_kv, "m.gguf"), ErrorKind::InvalidInput, "'num_key_value_heads' is 0");
}

TEST(ModelConfig, LayerTensorsMatchTheLayerCount) {
  const std::vector<std::string> names = {"model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight",
                                          "model.layers.1.self_attn.q_proj.weight", "model.layers.10x.junk", "model.norm.weight"};
  check_layer_tensors(names, "model.layers.", 2, "c.json", "num_hidden_layers");
  EXPECT_QF_ERROR(check_layer_tensors(names, "model.layers.", 3, "c.json", "num_hidden_layers"), ErrorKind::InvalidInput,
                  "c.json: 'num_hidden_layers' is 3, but there is no tensor for layer 2 ('model.layers.2.*')");
  EXPECT_QF_ERROR(check_layer_tensors(names, "model.layers.", 1, "c.json", "num_hidden_layers"), ErrorKind::InvalidInput,
                  "c.json: tensor 'model.layers.1.self_attn.q_proj.weight' belongs to layer 1, but 'num_hidden_layers' is 1");
  // A layer index too large for any integer type is still "beyond the count", not an overflow.
  EXPECT_QF_ERROR(check_layer_tensors({"blk.0.a", "blk.99999999999999999999999.a"}, "blk.", 1, "m.gguf", "llama.block_count"),
                  ErrorKind::InvalidInput, "belongs to layer");
}

}  // namespace
}  // namespace qf
