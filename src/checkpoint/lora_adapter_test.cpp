// PEFT adapters: PEFT's matching rules, the reader's refusals, and the merge
// against W + s B A computed here in double from the files.
#include "checkpoint/lora_adapter.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>

#include <gtest/gtest.h>

#include "checkpoint/lora_merge.h"
#include "core/f16.h"
#include "formats/hf/model_config.h"
#include "test_util.h"

namespace qf {
namespace {

namespace fs = std::filesystem;
const fs::path kBase = test::source_dir() / "tests/data/fixture-llama";
const fs::path kAdapters = test::source_dir() / "tests/data/lora-llama";

TEST(LoraSpec, ScaleAfterTheLastColonWhenItIsANumber) {
  EXPECT_EQ(parse_lora_spec("a/b").path, "a/b");
  EXPECT_EQ(parse_lora_spec("a/b").scale, 1.0);
  const LoraSpec s = parse_lora_spec("a/b:0.5");
  EXPECT_EQ(s.path, "a/b");
  EXPECT_EQ(s.scale, 0.5);
  EXPECT_EQ(parse_lora_spec("c:/x:y").path, "c:/x:y");  // not a number: the whole is the path
  EXPECT_EQ(parse_lora_spec("a:-1").scale, -1.0);
  EXPECT_QF_ERROR(parse_lora_spec("a:inf"), ErrorKind::Usage, "finite");
  EXPECT_QF_ERROR(parse_lora_spec(":2"), ErrorKind::Usage, "no adapter folder");
}

TEST(PeftMatching, ListTargetsAreExactNamesOrDottedSuffixes) {
  const nlohmann::json c = {{"target_modules", {"q_proj", "mlp.down_proj"}}};
  EXPECT_TRUE(peft_targets(c, "model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(peft_targets(c, "model.layers.3.mlp.down_proj"));
  EXPECT_FALSE(peft_targets(c, "model.layers.0.self_attn.xq_proj"));  // a suffix, but not after a dot
  EXPECT_FALSE(peft_targets(c, "lm_head"));
  EXPECT_TRUE(peft_targets({{"target_modules", {"lm_head"}}}, "lm_head"));  // the exact name
}

TEST(PeftMatching, StringTargetsMatchTheWholeName) {
  const nlohmann::json c = {{"target_modules", R"(.*\.(q_proj|v_proj))"}};
  EXPECT_TRUE(peft_targets(c, "model.layers.0.self_attn.q_proj"));
  EXPECT_FALSE(peft_targets(c, "model.layers.0.self_attn.q_proj_x"));  // re.fullmatch, not re.match
  EXPECT_FALSE(peft_targets({{"target_modules", "q_proj"}}, "model.layers.0.self_attn.q_proj"));
  const nlohmann::json all = {{"target_modules", "all-linear"}};
  EXPECT_TRUE(peft_targets(all, "model.layers.1.mlp.up_proj"));
  EXPECT_FALSE(peft_targets(all, "lm_head"));  // PEFT leaves the output layer out
}

TEST(PeftMatching, LayersToTransformUseTheLastLayerIndexOfThePattern) {
  nlohmann::json c = {{"target_modules", {"q_proj"}}, {"layers_to_transform", {0, 2}}};
  EXPECT_TRUE(peft_targets(c, "model.layers.2.self_attn.q_proj"));
  EXPECT_FALSE(peft_targets(c, "model.layers.1.self_attn.q_proj"));
  c["layers_to_transform"] = 1;  // an int selects one layer
  EXPECT_TRUE(peft_targets(c, "model.layers.1.self_attn.q_proj"));
  c["layers_pattern"] = "blocks";  // no "blocks.N." in the name: not selected
  EXPECT_FALSE(peft_targets(c, "model.layers.1.self_attn.q_proj"));
  c["layers_pattern"] = "layers";
  EXPECT_TRUE(peft_targets(c, "model.layers.1.self_attn.q_proj"));
  EXPECT_FALSE(peft_targets(c, "model.layers.11.self_attn.q_proj"));
  c["exclude_modules"] = {"q_proj"};
  EXPECT_FALSE(peft_targets(c, "model.layers.1.self_attn.q_proj"));
}

TEST(PeftMatching, PatternKeysMatchADottedSuffixInTheirOrder) {
  nlohmann::json p = nlohmann::json::parse(R"({"layers.1.self_attn.q_proj": 32, "q_proj": 4})");
  EXPECT_EQ(peft_pattern_key(p, "model.layers.1.self_attn.q_proj"), "layers.1.self_attn.q_proj");
  EXPECT_EQ(peft_pattern_key(p, "model.layers.11.self_attn.q_proj"), "q_proj");  // "1.self" would need a dot before
  EXPECT_EQ(peft_pattern_key(p, "model.layers.0.self_attn.k_proj"), "");
  EXPECT_EQ(peft_pattern_key(nlohmann::json::parse(R"({"lm_head": 2})"), "lm_head"), "lm_head");
}

ModelConfig base_config() { return load_model_config(kBase); }

// A copy of an adapter folder with its config changed.
fs::path copy_adapter(const test::TempDir& tmp, const std::string& which,
                      const std::function<void(nlohmann::json&)>& change) {
  const fs::path dst = tmp / which;
  fs::remove_all(dst);
  fs::create_directories(dst);
  fs::copy_file(kAdapters / which / "adapter_model.safetensors", dst / "adapter_model.safetensors");
  nlohmann::json c = nlohmann::json::parse(std::ifstream(kAdapters / which / "adapter_config.json"));
  change(c);
  test::write_file(dst / "adapter_config.json", c.dump());
  return dst;
}

TEST(PeftAdapter, RefusesWhatItCannotHonour) {
  const ModelConfig c = base_config();
  const Checkpoint ck = Checkpoint::open(kBase);
  test::TempDir tmp;
  fs::create_directories(tmp / "pickled");
  test::write_file(tmp / "pickled/adapter_config.json", "{}");
  test::write_file(tmp / "pickled/adapter_model.bin", "not read");
  EXPECT_QF_ERROR(read_peft_adapter({tmp / "pickled"}, c, ck), ErrorKind::Unsupported, "pickled");
  EXPECT_QF_ERROR(read_peft_adapter({tmp / "absent"}, c, ck), ErrorKind::NotFound, "no such adapter folder");
  EXPECT_QF_ERROR(read_peft_adapter({copy_adapter(tmp, "lora", [](auto& j) { j["lora_bias"] = true; })}, c, ck),
                  ErrorKind::Unsupported, "'lora_bias'");
  EXPECT_QF_ERROR(read_peft_adapter({copy_adapter(tmp, "lora", [](auto& j) { j["peft_type"] = "IA3"; })}, c, ck),
                  ErrorKind::Unsupported, "peft_type");
  // Values of the wrong JSON type: one InvalidInput naming adapter_config.json.
  EXPECT_QF_ERROR(read_peft_adapter({copy_adapter(tmp, "lora", [](auto& j) { j["target_modules"] = {1, 2}; })}, c, ck),
                  ErrorKind::InvalidInput, "adapter_config.json: a value has the wrong type");
  EXPECT_QF_ERROR(read_peft_adapter({copy_adapter(tmp, "lora", [](auto& j) { j["use_dora"] = "yes"; })}, c, ck),
                  ErrorKind::InvalidInput, "wrong type");
  EXPECT_QF_ERROR(read_peft_adapter({copy_adapter(tmp, "lora", [](auto& j) { j["r"] = 1e30; })}, c, ck),
                  ErrorKind::InvalidInput, "from 1 to 2^20");
  // The file adapts k_proj, which the changed config no longer selects.
  EXPECT_QF_ERROR(read_peft_adapter({copy_adapter(tmp, "lora", [](auto& j) {
                                      j["target_modules"] = {"q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
                                    })},
                                    c, ck),
                  ErrorKind::InvalidInput, "do not select");
  // A module the config selects but the file lacks.
  EXPECT_QF_ERROR(read_peft_adapter({copy_adapter(tmp, "lora", [](auto& j) { j["target_modules"].push_back("lm_head"); })},
                                    c, ck),
                  ErrorKind::InvalidInput, "'lm_head' is selected");
  EXPECT_QF_ERROR(read_peft_adapter({copy_adapter(tmp, "lora", [](auto& j) { j["r"] = 4; })}, c, ck),
                  ErrorKind::InvalidInput, "rank 4");
  EXPECT_QF_ERROR(read_peft_adapter({copy_adapter(tmp, "dora", [](auto& j) { j["use_dora"] = false; })}, c, ck),
                  ErrorKind::InvalidInput, "use_dora is false");
}

TEST(PeftAdapter, ReadsPerModuleRanksAlphasAndReplacements) {
  const ModelConfig c = base_config();
  const Checkpoint ck = Checkpoint::open(kBase);
  const LoraAdapter a = read_peft_adapter({kAdapters / "rslora-patterns", 2.0}, c, ck);
  const nlohmann::json& cfg = a.config;
  ASSERT_TRUE(cfg.value("use_rslora", false));
  ASSERT_FALSE(a.modules.empty());
  bool saw_pattern_alpha = false, saw_pattern_rank = false;
  for (const LoraModule& m : a.modules) {
    EXPECT_EQ(m.module.find("model.layers.3."), std::string::npos) << "layers_to_transform excludes layer 3";
    const std::string rk = peft_pattern_key(cfg["rank_pattern"], m.module);
    const std::string ak = peft_pattern_key(cfg["alpha_pattern"], m.module);
    const double r = rk.empty() ? cfg["r"].get<double>() : cfg["rank_pattern"][rk].get<double>();
    const double alpha = ak.empty() ? cfg["lora_alpha"].get<double>() : cfg["alpha_pattern"][ak].get<double>();
    saw_pattern_rank |= !rk.empty();
    saw_pattern_alpha |= !ak.empty();
    EXPECT_EQ(m.rank(), static_cast<int64_t>(r)) << m.module;
    EXPECT_FLOAT_EQ(m.scale, static_cast<float>(alpha / std::sqrt(r) * 2.0)) << m.module;
  }
  EXPECT_TRUE(saw_pattern_rank);
  EXPECT_TRUE(saw_pattern_alpha);
  ASSERT_EQ(a.replaced.size(), 1u);
  EXPECT_EQ(a.replaced[0].tensor, "lm_head.weight");
}

// ULPs of f16 between a merged value and the double reference.
double f16_ulps(uint16_t got, double want) {
  const double g = f16_to_f32(got);
  const double mag = std::max(std::fabs(want), 6.103515625e-05);  // the smallest normal's spacing below it
  const double ulp = std::ldexp(1.0, std::ilogb(mag) - 10);
  return std::fabs(g - want) / ulp;
}

// Every merged tensor against W + s B A (DoRA: then m / ||row||) in double,
// straight from the files; one rounding to f16 allows half an ulp, and the
// f32 arithmetic before it a little more.
void expect_merge_matches(const std::vector<LoraSpec>& specs) {
  const ModelConfig c = base_config();
  Checkpoint ck = open_checkpoint_with_loras(kBase, specs);
  const Checkpoint plain = Checkpoint::open(kBase);
  std::vector<LoraAdapter> adapters;
  for (const LoraSpec& s : specs) adapters.push_back(read_peft_adapter(s, c, plain));
  int checked = 0;
  for (const std::string& name : ck.names()) {
    const Tensor merged = ck.tensor(name);
    const Tensor stored = plain.tensor(name);
    ASSERT_EQ(merged.dtype(), stored.dtype());
    ASSERT_EQ(merged.shape(), stored.shape());
    std::vector<double> w;
    for (float v : stored.to_f32_vector()) w.push_back(v);
    const int64_t out = stored.dim(0), in = stored.numel() / out;
    bool touched = false;
    for (const LoraAdapter& a : adapters) {
      for (const LoraReplacement& r : a.replaced)
        if (r.tensor == name) {
          const std::vector<float> v = r.value.to_f32_vector();
          w.assign(v.begin(), v.end());
          touched = true;
        }
      for (const LoraModule& m : a.modules) {
        if (m.module + ".weight" != name) continue;
        touched = true;
        const std::vector<float> A = m.a.to_f32_vector(), B = m.b.to_f32_vector();
        const int64_t r = m.rank();
        for (int64_t i = 0; i < out; ++i) {
          double ss = 0;
          for (int64_t j = 0; j < in; ++j) {
            double d = 0;
            for (int64_t k = 0; k < r; ++k) d += static_cast<double>(B[i * r + k]) * A[k * in + j];
            w[i * in + j] += m.scale * d;
            ss += w[i * in + j] * w[i * in + j];
          }
          if (!m.magnitude.empty())
            for (int64_t j = 0; j < in; ++j) w[i * in + j] *= m.magnitude[i] / std::sqrt(ss);
        }
      }
    }
    const uint16_t* got = merged.data_as<uint16_t>();
    if (!touched) {
      EXPECT_EQ(0, std::memcmp(merged.data(), stored.data(), stored.nbytes())) << name << " changed";
      continue;
    }
    double worst = 0;
    size_t changed = 0;
    for (size_t e = 0; e < w.size(); ++e) {
      worst = std::max(worst, f16_ulps(got[e], w[e]));
      changed += got[e] != stored.data_as<uint16_t>()[e];
    }
    EXPECT_LE(worst, 1.0) << name;
    EXPECT_GT(changed, w.size() / 4) << name << ": the adapter should change most weights";
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

TEST(LoraMerge, EqualsTheProductComputedFromTheFiles) { expect_merge_matches({{kAdapters / "lora"}}); }
TEST(LoraMerge, DoraRenormalisesRows) { expect_merge_matches({{kAdapters / "dora"}}); }
TEST(LoraMerge, RsloraPatternsAndModulesToSave) { expect_merge_matches({{kAdapters / "rslora-patterns", 0.5}}); }
TEST(LoraMerge, SeveralAdaptersApplyInOrder) {
  expect_merge_matches({{kAdapters / "lora"}, {kAdapters / "dora", 0.7}});
}

TEST(LoraMerge, RefusesAQuantizedBase) {
  test::TempDir tmp;
  fs::copy(kBase, tmp / "q");
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(tmp / "q/config.json"));
  cfg["quantization_config"] = {{"quant_method", "gptq"}};
  test::write_file(tmp / "q/config.json", cfg.dump());
  EXPECT_QF_ERROR(open_checkpoint_with_loras(tmp / "q", {{kAdapters / "lora"}}), ErrorKind::Unsupported, "quantized");
}

}  // namespace
}  // namespace qf
