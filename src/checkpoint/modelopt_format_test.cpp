#include "checkpoint/modelopt_format.h"

#include <gtest/gtest.h>

#include "quantized_tensor_util.h"
#include "test_util.h"

namespace qf {
namespace {

using json = nlohmann::json;

TEST(ModeloptFormat, RoundTripFp8AndNvfp4) {
  test::TempDir d;
  const auto f8 = random_float_qt(QuantScheme::fp8(QuantStrategy::Tensor, DType::F32), 6, 32, 1);
  const ActQuantParams fa{ActivationScheme::fp8_tensor_static(), 0.0371f, 0, 0};
  auto n4 = random_float_qt(QuantScheme::nvfp4(), 5, 64, 2);
  n4.global_scale = 1024.0f;  // reciprocal exact
  const ActQuantParams na{ActivationScheme::nvfp4(), 0, 0, 256.0f};
  auto w4 = random_float_qt(QuantScheme::nvfp4(), 3, 32, 3);
  {
    SafetensorsWriter w(d.path());
    add_modelopt_linear(w, "f", f8, &fa);
    add_modelopt_linear(w, "n", n4, &na);
    add_modelopt_linear(w, "w", w4, nullptr);
    add_modelopt_kv_scales(w, "model.layers.0", KvScales{0.5f, 0.25f});
    w.finish();
  }
  const auto ck = Checkpoint::open(d.path());
  const json fp8cfg = modelopt_hf_quant_config("FP8", "FP8", std::nullopt, {"lm_head"});
  const auto f = read_modelopt_linear(ck, "f", fp8cfg);
  expect_same(f8, f.q, "fp8");
  ASSERT_TRUE(f.act.has_value());
  EXPECT_EQ(f.act->scale, fa.scale);
  EXPECT_FALSE(f.act->scheme.dynamic);
  // The config.json block reads the same.
  expect_same(f8, read_modelopt_linear(ck, "f", modelopt_config_block(fp8cfg)).q, "fp8 block");

  const auto n = read_modelopt_linear(ck, "n", modelopt_hf_quant_config("NVFP4", std::nullopt, 16, {}));
  expect_same(n4, n.q, "nvfp4");
  ASSERT_TRUE(n.act.has_value());
  EXPECT_TRUE(n.act->scheme.is_nvfp4());
  EXPECT_EQ(n.act->global_scale, 256.0f);
  const auto wo = read_modelopt_linear(ck, "w", modelopt_hf_quant_config("W4A16_NVFP4", std::nullopt, 16, {}));
  EXPECT_EQ(wo.q.q, w4.q);
  EXPECT_EQ(wo.q.scales, w4.scales);
  EXPECT_FALSE(wo.act.has_value());
  // A reciprocal that is not exact moves by at most one ulp.
  EXPECT_NEAR(wo.q.global_scale, w4.global_scale, w4.global_scale * 1.2e-7f);

  // Layout: scalars, dtypes, packing, reciprocal convention.
  EXPECT_EQ(ck.info("f.weight").dtype, DType::F8_E4M3);
  EXPECT_EQ(ck.info("f.weight_scale").dtype, DType::F32);
  EXPECT_EQ(ck.info("f.weight_scale").shape, Shape{});
  EXPECT_EQ(ck.info("f.input_scale").shape, Shape{});
  EXPECT_EQ(ck.info("n.weight").dtype, DType::U8);
  EXPECT_EQ(ck.info("n.weight").shape, (Shape{5, 32}));
  EXPECT_EQ(ck.tensor("n.weight").data_as<uint8_t>()[0], static_cast<uint8_t>(n4.q[0] | (n4.q[1] << 4)));
  EXPECT_EQ(ck.info("n.weight_scale").dtype, DType::F8_E4M3);
  EXPECT_EQ(ck.info("n.weight_scale").shape, (Shape{5, 4}));
  EXPECT_EQ(ck.tensor("n.weight_scale_2").to_f32_vector()[0], 1.0f / 1024.0f);
  EXPECT_EQ(ck.tensor("n.input_scale").to_f32_vector()[0], 1.0f / 256.0f);
  EXPECT_FALSE(ck.contains("w.input_scale"));
  EXPECT_EQ(ck.info("model.layers.0.self_attn.k_proj.k_scale").shape, Shape{});
  const KvScales kv = read_modelopt_kv_scales(ck, "model.layers.0");
  EXPECT_EQ(kv.k_scale, 0.5f);
  EXPECT_EQ(kv.v_scale, 0.25f);
}

// modelopt 0.33's Hugging Face export: calibrated FP8 KV scales amax / 448
// are raised to at least 1 (postprocess_state_dict, clamp_(min=1.0)).
TEST(ModeloptFormat, Fp8KvScalesAreAtLeastOne) {
  const KvScales small = modelopt_fp8_kv_scales({0.0312f, 0.999f});
  EXPECT_EQ(small.k_scale, 1.0f);
  EXPECT_EQ(small.v_scale, 1.0f);
  const KvScales large = modelopt_fp8_kv_scales({1.5f, 1.0f});
  EXPECT_EQ(large.k_scale, 1.5f);
  EXPECT_EQ(large.v_scale, 1.0f);
}

TEST(ModeloptFormat, ConfigsFieldForField) {
  const json hf = modelopt_hf_quant_config("NVFP4", "FP8", 16, {"lm_head"}, "0.33.0");
  EXPECT_EQ(hf, json::parse(R"({"producer": {"name": "modelopt", "version": "0.33.0"},
    "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16, "exclude_modules": ["lm_head"]}})"));
  EXPECT_EQ(modelopt_config_block(hf), json::parse(R"({
    "config_groups": {"group_0": {
      "input_activations": {"dynamic": false, "num_bits": 4, "type": "float", "group_size": 16},
      "weights": {"dynamic": false, "num_bits": 4, "type": "float", "group_size": 16},
      "targets": ["Linear"]}},
    "ignore": ["lm_head"], "quant_algo": "NVFP4",
    "kv_cache_scheme": {"dynamic": false, "num_bits": 8, "type": "float"},
    "producer": {"name": "modelopt", "version": "0.33.0"}, "quant_method": "modelopt"})"));
  const json fp8 = modelopt_hf_quant_config("FP8", std::nullopt, std::nullopt, {});
  EXPECT_EQ(fp8["quantization"], json::parse(R"({"quant_algo": "FP8", "kv_cache_quant_algo": null, "exclude_modules": []})"));
  const json blk = modelopt_config_block(fp8);
  EXPECT_EQ(blk["config_groups"]["group_0"]["weights"], json::parse(R"({"dynamic": false, "num_bits": 8, "type": "float"})"));
  EXPECT_FALSE(blk.contains("kv_cache_scheme"));
  EXPECT_EQ(modelopt_kv_cache_algo(fp8), "");
  EXPECT_EQ(modelopt_kv_cache_algo(modelopt_config_block(hf)), "FP8");
  EXPECT_QF_ERROR(modelopt_hf_quant_config("W4A16_AWQ", std::nullopt, 128, {}), ErrorKind::Unsupported, "W4A16_AWQ");
  EXPECT_QF_ERROR(modelopt_hf_quant_config("FP8", "NVFP4", std::nullopt, {}), ErrorKind::Unsupported, "kv_cache_quant_algo");
}

TEST(ModeloptFormat, UnsupportedAndCorruptInputs) {
  test::TempDir d;
  const auto ch = random_float_qt(QuantScheme::fp8(QuantStrategy::Channel, DType::F32), 4, 32, 4);
  const auto f8 = random_float_qt(QuantScheme::fp8(QuantStrategy::Tensor, DType::F32), 4, 32, 5);
  const auto i4 = random_qt(QuantScheme::make(4, true, QuantStrategy::Group, 16), 4, 32, false, 6);
  const ActQuantParams fa{ActivationScheme::fp8_tensor_static(), 0.5f, 0, 0};
  const ActQuantParams ft{ActivationScheme::fp8_token(), 0, 0, 0};
  {
    SafetensorsWriter w(d.path());
    EXPECT_QF_ERROR(add_modelopt_linear(w, "c", ch, &fa), ErrorKind::Unsupported, "per-tensor");
    EXPECT_QF_ERROR(add_modelopt_linear(w, "t", f8, &ft), ErrorKind::Unsupported, "static per-tensor");
    EXPECT_QF_ERROR(add_modelopt_linear(w, "o", f8, nullptr), ErrorKind::Unsupported, "none");
    EXPECT_QF_ERROR(add_modelopt_linear(w, "i", i4, nullptr), ErrorKind::Unsupported, "FP8 or NVFP4");
    add_modelopt_linear(w, "ok", f8, &fa);
    // Scale stored as f16 [2]; weight stored as I8.
    w.add("bs.weight", DType::F8_E4M3, {4, 32}, f8.q.data(), f8.q.size());
    const uint16_t h[2] = {0x3c00, 0x3c00};
    w.add("bs.weight_scale", DType::F16, {2}, h, sizeof h);
    w.add("bw.weight", DType::I8, {4, 32}, f8.q.data(), f8.q.size());
    w.finish();
  }
  const auto ck = Checkpoint::open(d.path());
  const json cfg = modelopt_hf_quant_config("FP8", std::nullopt, std::nullopt, {});
  EXPECT_QF_ERROR(read_modelopt_linear(ck, "bs", cfg), ErrorKind::InvalidInput, "bs.weight_scale: dtype is F16");
  EXPECT_QF_ERROR(read_modelopt_linear(ck, "bw", cfg), ErrorKind::InvalidInput, "bw.weight: dtype is I8");
  EXPECT_QF_ERROR(read_modelopt_linear(ck, "no", cfg), ErrorKind::NotFound, "no.weight");
  EXPECT_QF_ERROR(read_modelopt_linear(ck, "ok", json{{"quantization", {{"quant_algo", "W8A8_SQ_PER_CHANNEL"}}}}),
                  ErrorKind::Unsupported, "W8A8_SQ_PER_CHANNEL");
  EXPECT_QF_ERROR(read_modelopt_linear(ck, "ok", modelopt_hf_quant_config("NVFP4", std::nullopt, 16, {})),
                  ErrorKind::InvalidInput, "ok.weight");
}

}  // namespace
}  // namespace qf
