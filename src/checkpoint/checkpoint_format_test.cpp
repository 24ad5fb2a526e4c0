#include "checkpoint/checkpoint_format.h"

#include <random>

#include <gtest/gtest.h>

#include "core/io.h"
#include "quantized_tensor_util.h"
#include "test_util.h"

namespace qf {
namespace {

using json = nlohmann::json;

TEST(CheckpointFormat, RegistryFindsEachFormatByItsName) {
  std::vector<std::string> names;
  for (const CheckpointFormat* f : checkpoint_formats()) {
    names.push_back(f->name());
    EXPECT_EQ(find_checkpoint_format(f->name()), f);
    EXPECT_EQ(&checkpoint_format(f->name(), "r.yaml:1:1"), f);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"compressed-tensors", "gptq", "awq", "modelopt", "bitsandbytes"}));
  EXPECT_EQ(checkpoint_format_names(), "compressed-tensors, gptq, awq, modelopt, bitsandbytes");
  EXPECT_EQ(std::string(checkpoint_format("", "r.yaml:1:1").name()), "compressed-tensors");  // the default
  EXPECT_EQ(find_checkpoint_format(""), nullptr);  // a checkpoint without quant_method is not quantized by any
  EXPECT_EQ(find_checkpoint_format("GPTQ"), nullptr);
  EXPECT_QF_ERROR(checkpoint_format("gtpq", "r.yaml:9:11"), ErrorKind::InvalidInput,
                  "r.yaml:9:11: export.format: unknown format 'gtpq' (did you mean 'gptq'?)");
  EXPECT_QF_ERROR(checkpoint_format("safetensors", "r.yaml:9:11"), ErrorKind::InvalidInput,
                  "unknown format 'safetensors' (compressed-tensors, gptq, awq, modelopt, bitsandbytes)");
}

TEST(CheckpointFormat, CapabilitiesAndLinearChecks) {
  const CheckpointFormat& ct = checkpoint_format("compressed-tensors", "");
  const CheckpointFormat& gptq = checkpoint_format("gptq", "");
  const CheckpointFormat& awq = checkpoint_format("awq", "");
  const CheckpointFormat& mo = checkpoint_format("modelopt", "");
  EXPECT_FALSE(ct.one_scheme_per_model());
  EXPECT_TRUE(gptq.one_scheme_per_model() && awq.one_scheme_per_model() && mo.one_scheme_per_model());
  EXPECT_TRUE(gptq.every_linear_quantized() && awq.every_linear_quantized());
  EXPECT_FALSE(ct.every_linear_quantized() || mo.every_linear_quantized());
  EXPECT_TRUE(ct.holds_kv_scales() && mo.holds_kv_scales());
  EXPECT_FALSE(gptq.holds_kv_scales() || awq.holds_kv_scales());

  const QuantScheme w4 = QuantScheme::make(4, true, QuantStrategy::Group, 128);
  const QuantScheme fp8 = QuantScheme::fp8(QuantStrategy::Tensor);
  const QuantScheme nvfp4 = QuantScheme::nvfp4();
  const ActivationScheme fp8_static = ActivationScheme::fp8_tensor_static();
  auto check = [](const CheckpointFormat& f, const QuantScheme& w, const ActivationScheme* a, int64_t rows = 256,
                  GptqOptions::ActOrder ao = GptqOptions::ActOrder::None) {
    LinearCheck c;
    c.name = "model.layers.0.mlp.down_proj";
    c.rows = rows;
    c.cols = 512;
    c.weights = &w;
    c.act = a;
    c.actorder = ao;
    c.where = "r.yaml:3:5";
    f.check_linear(c);
  };
  EXPECT_NO_THROW(check(ct, w4, nullptr));
  EXPECT_NO_THROW(check(ct, fp8, &fp8_static));
  EXPECT_NO_THROW(check(gptq, w4, nullptr));
  EXPECT_NO_THROW(check(awq, w4, nullptr));
  EXPECT_NO_THROW(check(mo, fp8, &fp8_static));
  EXPECT_NO_THROW(check(mo, nvfp4, nullptr));
  EXPECT_QF_ERROR(check(gptq, w4, &fp8_static), ErrorKind::Unsupported, "r.yaml:3:5: the gptq format holds weight-only");
  EXPECT_QF_ERROR(check(gptq, fp8, nullptr), ErrorKind::Unsupported, "holds integer weights");
  EXPECT_QF_ERROR(check(gptq, QuantScheme::make(5, true, QuantStrategy::Group, 128), nullptr), ErrorKind::Unsupported,
                  "2, 3, 4 or 8 bits");
  EXPECT_QF_ERROR(check(gptq, QuantScheme::make(4, false, QuantStrategy::Group, 128), nullptr), ErrorKind::Unsupported,
                  "asymmetric GPTQ");
  EXPECT_QF_ERROR(check(awq, w4, nullptr, 260), ErrorKind::Unsupported, "260 output rows: AWQ packs 8 per int32");
  EXPECT_QF_ERROR(check(awq, w4, nullptr, 256, GptqOptions::ActOrder::Group), ErrorKind::Unsupported, "no g_idx");
  EXPECT_QF_ERROR(check(awq, QuantScheme::make(8, true, QuantStrategy::Channel), nullptr), ErrorKind::Unsupported,
                  "4-bit group quantization");
  EXPECT_QF_ERROR(check(mo, w4, nullptr), ErrorKind::Unsupported, "the modelopt format holds FP8");
  EXPECT_QF_ERROR(check(mo, fp8, nullptr), ErrorKind::Unsupported, "fp8 tensor weight-only");
}

// modelopt stores the reciprocal of an NVFP4 global scale; a power of two
// makes that exact, so the read-back can be compared bit for bit.
QuantizedTensor nvfp4_power_of_two_global(QuantizedTensor q) {
  q.global_scale = 1024.0f;
  return q;
}

// Each format through the interface alone: the Linear and the KV-cache scales
// written, the config written, the checkpoint opened, and read back equal.
TEST(CheckpointFormat, EveryFormatReadsBackWhatItWrote) {
  struct Case {
    const char* format;
    QuantizedTensor q;
    bool act;  // static FP8 input quantizer
  };
  const std::vector<Case> cases = {
      {"compressed-tensors", random_qt(QuantScheme::make(4, false, QuantStrategy::Group, 16), 32, 64, false, 7), false},
      {"compressed-tensors", random_float_qt(QuantScheme::fp8(QuantStrategy::Tensor, DType::F16), 32, 64, 8), true},
      {"gptq", random_qt(QuantScheme::make(4, true, QuantStrategy::Group, 16), 32, 64, true, 9, 1), false},
      {"awq", random_qt(QuantScheme::make(4, false, QuantStrategy::Group, 16), 32, 64, false, 10), false},
      {"modelopt", nvfp4_power_of_two_global(random_float_qt(QuantScheme::nvfp4(), 32, 64, 11)), false},
      {"modelopt", random_float_qt(QuantScheme::fp8(QuantStrategy::Tensor, DType::F32), 32, 64, 12), true},
  };
  for (const Case& c : cases) {
    const CheckpointFormat& f = checkpoint_format(c.format, "");
    const std::string what = std::string(c.format) + " " + c.q.scheme.describe();
    test::TempDir d;
    std::optional<ActQuantParams> act;
    ExportGroup g;
    g.targets = {"Linear"};
    g.weights = c.q.scheme;
    g.actorder = c.q.g_idx.empty() ? GptqOptions::ActOrder::None : GptqOptions::ActOrder::Group;
    if (c.act) {
      act = ActQuantParams{ActivationScheme::fp8_tensor_static(), 0.125f};
      g.act = act->scheme;
    }
    ExportConfig ec;
    ec.groups = {g};
    ec.ignore = {"lm_head"};
    if (f.holds_kv_scales()) ec.kv_cache = g.act;
    const std::string prefix = "model.layers.0.self_attn.o_proj";
    {
      SafetensorsWriter w(d.path());
      f.add_linear(w, prefix, c.q, act ? &*act : nullptr);
      if (ec.kv_cache) f.add_kv_scales(w, 0, KvScales{2.0f, 0.5f}, DType::F16);
      w.finish();
    }
    nlohmann::ordered_json config = {{"model_type", "llama"}};
    f.write_config(ec, config, d.path());
    ASSERT_TRUE(config.contains("quantization_config")) << what;
    EXPECT_EQ(find_checkpoint_format(config["quantization_config"].value("quant_method", "")), &f) << what;
    write_file_atomic(d / "config.json", config.dump(2));

    const OpenedConfig o = f.open(d.path(), json(config["quantization_config"]), "config.json");
    EXPECT_EQ(o.kv_scales, ec.kv_cache.has_value()) << what;
    const auto ck = Checkpoint::open(d.path());
    const std::optional<ReadLinear> back = f.read_linear(ck, prefix, o.qcfg);
    ASSERT_TRUE(back.has_value()) << what;
    expect_same(c.q, back->q, what);
    EXPECT_EQ(back->act.has_value(), act.has_value()) << what;
    if (act && back->act) {
      EXPECT_EQ(back->act->scale, act->scale) << what;
    }
    EXPECT_EQ(back->packed_kernel, std::string(c.format) == "gptq") << what;
    EXPECT_FALSE(f.read_linear(ck, "model.layers.0.mlp.down_proj", o.qcfg).has_value()) << what;  // not stored quantized
    if (o.kv_scales) {
      const KvScales kv = f.read_kv_scales(ck, 0);
      EXPECT_EQ(kv.k_scale, 2.0f) << what;
      // modelopt raises calibrated scales below 1 to 1 (its export's rule).
      EXPECT_EQ(kv.v_scale, std::string(c.format) == "modelopt" ? 1.0f : 0.5f) << what;
    }
    EXPECT_FALSE(f.describe(o.qcfg).empty()) << what;
  }
}

}  // namespace
}  // namespace qf
