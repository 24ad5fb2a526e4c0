// compressed-tensors int-quantized, float-quantized, naive-quantized and
// nvfp4-pack-quantized: round trips, byte layouts, configs, corrupt inputs.
#include <gtest/gtest.h>

#include "checkpoint/compressed_tensors.h"
#include "quantized_tensor_util.h"
#include "test_util.h"

namespace qf {
namespace {

using json = nlohmann::json;

// A config group as compressed_tensors_config writes it, for the reader.
json group_json(const QuantScheme& s, const ActivationScheme* act, bool actorder = false) {
  CompressedTensorsGroup g;
  g.scheme = s;
  g.actorder_group = actorder;
  if (act) g.input_activations = *act;
  return compressed_tensors_config({g}, {})["config_groups"]["group_0"];
}

void expect_same_act(const std::optional<ActQuantParams>& a, const ActQuantParams* b, const std::string& what) {
  ASSERT_EQ(a.has_value(), b != nullptr) << what;
  if (!b) return;
  EXPECT_EQ(a->scheme.type, b->scheme.type) << what;
  EXPECT_EQ(a->scheme.bits, b->scheme.bits) << what;
  EXPECT_EQ(a->scheme.symmetric, b->scheme.symmetric) << what;
  EXPECT_EQ(a->scheme.strategy, b->scheme.strategy) << what;
  EXPECT_EQ(a->scheme.group_size, b->scheme.group_size) << what;
  EXPECT_EQ(a->scheme.dynamic, b->scheme.dynamic) << what;
  EXPECT_EQ(a->scale, b->scale) << what;
  EXPECT_EQ(a->zero_point, b->zero_point) << what;
  EXPECT_EQ(a->global_scale, b->global_scale) << what;
}

TEST(CompressedTensorsFormats, FormatFollowsCompressedTensorsRules) {
  const auto w4 = QuantScheme::make(4, true, QuantStrategy::Group, 128);
  const auto w8 = QuantScheme::make(8, true, QuantStrategy::Channel);
  const auto i8 = ActivationScheme::int8_token();
  const auto f8 = ActivationScheme::fp8_token();
  const auto fp4 = ActivationScheme::nvfp4();
  EXPECT_EQ(compressed_tensors_format_of(w4, nullptr), "pack-quantized");
  EXPECT_EQ(compressed_tensors_format_of(w8, nullptr), "pack-quantized");
  EXPECT_EQ(compressed_tensors_format_of(w8, &i8), "int-quantized");
  EXPECT_EQ(compressed_tensors_format_of(w4, &f8), "int-quantized");  // W4AFP8: int_quantized precedes pack_quantized
  EXPECT_EQ(compressed_tensors_format_of(QuantScheme::fp8(QuantStrategy::Tensor), &f8), "float-quantized");
  EXPECT_EQ(compressed_tensors_format_of(QuantScheme::fp8(QuantStrategy::Channel), nullptr), "naive-quantized");
  EXPECT_EQ(compressed_tensors_format_of(QuantScheme::nvfp4(), &fp4), "nvfp4-pack-quantized");
  EXPECT_EQ(compressed_tensors_format_of(QuantScheme::nvfp4(), nullptr), "nvfp4-pack-quantized");
}

TEST(CompressedTensorsFormats, RoundTripEveryFormatAndStrategy) {
  test::TempDir d;
  struct Case {
    QuantizedTensor q;
    std::optional<ActQuantParams> act;
    bool actorder = false;
    std::string prefix, format;
  };
  std::vector<Case> cases;
  uint32_t seed = 100;
  const DType dts[] = {DType::F16, DType::BF16, DType::F32};
  // Integer weights with int8 activations (int-quantized), every strategy, both symmetries.
  for (int bits : {4, 8})
    for (bool sym : {true, false})
      for (QuantStrategy st : {QuantStrategy::Tensor, QuantStrategy::Channel, QuantStrategy::Group})
        for (int a = 0; a < 3; ++a) {
          Case c;
          const bool perm = st == QuantStrategy::Group && a == 1;
          c.q = random_qt(QuantScheme::make(bits, sym, st, 16, dts[seed % 3]), 7, 48, perm, seed);
          c.actorder = perm;
          ActQuantParams p;
          p.scheme = a == 0 ? ActivationScheme::int8_token() : ActivationScheme::int8_tensor_static();
          if (a == 2) p.scheme.symmetric = false, p.zero_point = -17;
          if (a != 0) p.scale = f16_to_f32(f32_to_f16(0.0123f * (1 + seed % 5)));
          if (c.q.scheme.scale_dtype == DType::BF16) p.scale = bf16_to_f32(f32_to_bf16(p.scale));
          c.act = p;
          c.format = "int-quantized";
          cases.push_back(c);
          ++seed;
        }
  // FP8 weights: float-quantized with token-dynamic or tensor-static activations, naive without.
  for (QuantStrategy st : {QuantStrategy::Tensor, QuantStrategy::Channel, QuantStrategy::Group})
    for (int a = 0; a < 3; ++a) {
      Case c;
      c.q = random_float_qt(QuantScheme::fp8(st, dts[seed % 3], 16), 5, 32, seed);
      if (a < 2) {
        ActQuantParams p;
        p.scheme = a == 0 ? ActivationScheme::fp8_token() : ActivationScheme::fp8_tensor_static();
        if (a == 1) p.scale = 0.25f;
        c.act = p;
      }
      c.format = a < 2 ? "float-quantized" : "naive-quantized";
      cases.push_back(c);
      ++seed;
    }
  // NVFP4: W4A4 and weight-only.
  for (int a = 0; a < 2; ++a) {
    Case c;
    c.q = random_float_qt(QuantScheme::nvfp4(), 6, 64, seed++);
    if (a == 0) {
      ActQuantParams p;
      p.scheme = ActivationScheme::nvfp4();
      p.global_scale = 1234.5f;
      c.act = p;
    }
    c.format = "nvfp4-pack-quantized";
    cases.push_back(c);
  }
  for (size_t i = 0; i < cases.size(); ++i) cases[i].prefix = "model.layers." + std::to_string(i) + ".mlp.up_proj";
  {
    SafetensorsWriter w(d.path());
    for (const auto& c : cases) add_compressed_tensors_linear(w, c.prefix, c.q, c.act ? &*c.act : nullptr);
    w.finish();
  }
  const auto ck = Checkpoint::open(d.path());
  for (const auto& c : cases) {
    const std::string what = c.prefix + " " + c.q.scheme.describe() + (c.act ? " / " + c.act->scheme.describe() : "");
    const ActivationScheme* as = c.act ? &c.act->scheme : nullptr;
    EXPECT_EQ(compressed_tensors_format_of(c.q.scheme, as), c.format) << what;
    const json g = group_json(c.q.scheme, as, c.actorder);
    EXPECT_EQ(g["format"], c.format) << what;
    // The group's own format wins over the top-level one.
    const auto back = read_compressed_tensors_any(ck, c.prefix, g, "mixed-precision");
    expect_same(c.q, back.q, what);
    expect_same_act(back.act, c.act ? &*c.act : nullptr, what);
    EXPECT_EQ(back.q.dequantize(), c.q.dequantize()) << what;
    // Without a group format the top-level one is used.
    json g2 = g;
    g2.erase("format");
    expect_same(c.q, read_compressed_tensors_any(ck, c.prefix, g2, c.format).q, what);
    const bool static_scale = c.act && !c.act->scheme.dynamic && !c.act->scheme.is_nvfp4();
    EXPECT_EQ(ck.contains(c.prefix + ".input_scale"), static_scale) << what;
    EXPECT_EQ(ck.contains(c.prefix + ".input_zero_point"), static_scale && !c.act->scheme.symmetric) << what;
    EXPECT_EQ(ck.contains(c.prefix + ".input_global_scale"), c.act && c.act->scheme.is_nvfp4()) << what;
    EXPECT_EQ(ck.contains(c.prefix + ".weight_zero_point"), !c.q.scheme.symmetric) << what;
    EXPECT_EQ(ck.contains(c.prefix + ".weight_g_idx"), c.actorder) << what;
    EXPECT_FALSE(ck.contains(c.prefix + ".weight_shape")) << what;
  }
}

// The exact tensors of each format, checked against hand-computed bytes.
TEST(CompressedTensorsFormats, HandComputedLayouts) {
  test::TempDir d;
  // int8 asymmetric channel W8A8 with static asymmetric input.
  QuantizedTensor i8 = random_qt(QuantScheme::make(8, false, QuantStrategy::Channel, 128, DType::BF16), 2, 4, false, 1);
  i8.q = {0, 128, 255, 1, 10, 20, 30, 40};
  i8.zeros = {128, 100};
  ActQuantParams ia{ActivationScheme::int8_tensor_static(), 0.5f, 0, 0};
  ia.scheme.symmetric = false;
  ia.zero_point = -3;
  // FP8 tensor with static input.
  QuantizedTensor f8 = random_float_qt(QuantScheme::fp8(QuantStrategy::Tensor, DType::F16), 2, 4, 2);
  f8.q = {0x00, 0x38, 0xb8, 0x7e, 0x01, 0x02, 0x03, 0x04};  // 0, 1, -1, 448, ...
  f8.scales = {0.5f};
  ActQuantParams fa{ActivationScheme::fp8_tensor_static(), 0.125f, 0, 0};
  // NVFP4, 1 x 32, with input global scale.
  QuantizedTensor n4 = random_float_qt(QuantScheme::nvfp4(), 1, 32, 3);
  for (int c = 0; c < 32; ++c) n4.q[c] = static_cast<uint8_t>(c % 16);
  n4.scales = {2.0f, 0.5f};
  n4.global_scale = 100.0f;
  ActQuantParams na{ActivationScheme::nvfp4(), 0, 0, 50.0f};
  {
    SafetensorsWriter w(d.path());
    add_compressed_tensors_linear(w, "i", i8, &ia);
    add_compressed_tensors_linear(w, "f", f8, &fa);
    add_compressed_tensors_linear(w, "n", n4, &na);
    add_compressed_tensors_kv_scales(w, "model.layers.0.self_attn", KvScales{0.25f, 0.75f}, DType::BF16);
    w.finish();
  }
  const auto ck = Checkpoint::open(d.path());
  const auto iw = ck.tensor("i.weight");
  EXPECT_EQ(iw.dtype(), DType::I8);
  EXPECT_EQ(iw.shape(), (Shape{2, 4}));
  const int8_t want_iw[8] = {-128, 0, 127, -127, -118, -108, -98, -88};
  for (int k = 0; k < 8; ++k) EXPECT_EQ(iw.data_as<int8_t>()[k], want_iw[k]) << k;
  EXPECT_EQ(ck.info("i.weight_scale").shape, (Shape{2, 1}));
  EXPECT_EQ(ck.info("i.weight_scale").dtype, DType::BF16);
  const auto iz = ck.tensor("i.weight_zero_point");
  EXPECT_EQ(iz.dtype(), DType::I8);
  EXPECT_EQ(iz.shape(), (Shape{2, 1}));
  EXPECT_EQ(iz.data_as<int8_t>()[0], 0);
  EXPECT_EQ(iz.data_as<int8_t>()[1], -28);
  EXPECT_EQ(ck.info("i.input_scale").shape, (Shape{1}));
  EXPECT_EQ(ck.info("i.input_scale").dtype, DType::BF16);  // the model dtype
  EXPECT_EQ(ck.tensor("i.input_scale").to_f32_vector()[0], 0.5f);
  EXPECT_EQ(ck.info("i.input_zero_point").dtype, DType::I8);
  EXPECT_EQ(ck.tensor("i.input_zero_point").data_as<int8_t>()[0], -3);

  const auto fw = ck.tensor("f.weight");
  EXPECT_EQ(fw.dtype(), DType::F8_E4M3);
  EXPECT_EQ(fw.shape(), (Shape{2, 4}));
  EXPECT_EQ(fw.data_as<uint8_t>()[3], 0x7e);
  EXPECT_EQ(ck.info("f.weight_scale").shape, (Shape{1}));
  EXPECT_EQ(ck.info("f.weight_scale").dtype, DType::F16);
  EXPECT_EQ(ck.info("f.input_scale").dtype, DType::F16);
  EXPECT_FALSE(ck.contains("f.weight_zero_point"));

  const auto np = ck.tensor("n.weight_packed");
  EXPECT_EQ(np.dtype(), DType::U8);
  EXPECT_EQ(np.shape(), (Shape{1, 16}));
  EXPECT_EQ(np.data_as<uint8_t>()[0], 0x10);  // element 0 low nibble, element 1 high
  EXPECT_EQ(np.data_as<uint8_t>()[7], 0xfe);
  const auto ns = ck.tensor("n.weight_scale");
  EXPECT_EQ(ns.dtype(), DType::F8_E4M3);
  EXPECT_EQ(ns.shape(), (Shape{1, 2}));
  EXPECT_EQ(ns.data_as<uint8_t>()[0], 0x40);  // 2.0
  EXPECT_EQ(ns.data_as<uint8_t>()[1], 0x30);  // 0.5
  EXPECT_EQ(ck.info("n.weight_global_scale").dtype, DType::F32);
  EXPECT_EQ(ck.info("n.weight_global_scale").shape, (Shape{1}));
  EXPECT_EQ(ck.tensor("n.weight_global_scale").to_f32_vector()[0], 100.0f);
  EXPECT_EQ(ck.info("n.input_global_scale").dtype, DType::F32);
  EXPECT_EQ(ck.tensor("n.input_global_scale").to_f32_vector()[0], 50.0f);
  EXPECT_FALSE(ck.contains("n.input_scale"));

  EXPECT_EQ(ck.info("model.layers.0.self_attn.k_scale").dtype, DType::BF16);
  EXPECT_EQ(ck.info("model.layers.0.self_attn.k_scale").shape, (Shape{1}));
  const KvScales kv = read_compressed_tensors_kv_scales(ck, "model.layers.0.self_attn");
  EXPECT_EQ(kv.k_scale, 0.25f);
  EXPECT_EQ(kv.v_scale, 0.75f);
}

// QuantizationArgs as compressed-tensors' presets serialize them.
TEST(CompressedTensorsFormats, PresetConfigsFieldForField) {
  const json fp8_static_in = json::parse(R"({"num_bits": 8, "type": "float", "symmetric": true, "group_size": null,
    "strategy": "tensor", "block_structure": null, "dynamic": false, "actorder": null, "scale_dtype": null,
    "zp_dtype": null, "observer": "static_minmax", "observer_kwargs": {}})");
  const json kv = json::parse(R"({"num_bits": 8, "type": "float", "symmetric": true, "group_size": null,
    "strategy": "tensor", "block_structure": null, "dynamic": false, "actorder": null, "scale_dtype": null,
    "zp_dtype": null, "observer": "memoryless_minmax", "observer_kwargs": {}})");
  auto weights = [](int bits, const char* type, const char* strategy, json gs, json scale_dtype) {
    return json{{"num_bits", bits},         {"type", type},          {"symmetric", true},
                {"group_size", gs},         {"strategy", strategy},  {"block_structure", nullptr},
                {"dynamic", false},         {"actorder", nullptr},   {"scale_dtype", scale_dtype},
                {"zp_dtype", nullptr},      {"observer", "memoryless_minmax"}, {"observer_kwargs", json::object()}};
  };
  auto token = [](const char* type) {
    return json{{"num_bits", 8},          {"type", type},         {"symmetric", true},      {"group_size", nullptr},
                {"strategy", "token"},    {"block_structure", nullptr}, {"dynamic", true},  {"actorder", nullptr},
                {"scale_dtype", nullptr}, {"zp_dtype", nullptr},  {"observer", nullptr},    {"observer_kwargs", json::object()}};
  };
  struct Preset {
    const char* name;
    QuantScheme w;
    std::optional<ActivationScheme> a;
    json want_w, want_a;
    const char* format;
  };
  const json nvfp4_in = json::parse(R"({"num_bits": 4, "type": "float", "symmetric": true, "group_size": 16,
    "strategy": "tensor_group", "block_structure": null, "dynamic": "local", "actorder": null,
    "scale_dtype": "torch.float8_e4m3fn", "zp_dtype": null, "observer": "static_minmax", "observer_kwargs": {}})");
  const json nvfp4_w = weights(4, "float", "tensor_group", 16, "torch.float8_e4m3fn");
  const std::vector<Preset> presets = {
      {"W8A8", QuantScheme::make(8, true, QuantStrategy::Channel), ActivationScheme::int8_token(),
       weights(8, "int", "channel", nullptr, nullptr), token("int"), "int-quantized"},
      {"FP8", QuantScheme::fp8(QuantStrategy::Tensor, DType::BF16), ActivationScheme::fp8_tensor_static(),
       weights(8, "float", "tensor", nullptr, nullptr), fp8_static_in, "float-quantized"},
      {"FP8_DYNAMIC", QuantScheme::fp8(QuantStrategy::Channel, DType::BF16), ActivationScheme::fp8_token(),
       weights(8, "float", "channel", nullptr, nullptr), token("float"), "float-quantized"},
      {"NVFP4", QuantScheme::nvfp4(), ActivationScheme::nvfp4(), nvfp4_w, nvfp4_in, "nvfp4-pack-quantized"},
      {"NVFP4A16", QuantScheme::nvfp4(), std::nullopt, nvfp4_w, nullptr, "nvfp4-pack-quantized"},
  };
  for (const auto& p : presets) {
    CompressedTensorsGroup g;
    g.scheme = p.w;
    g.input_activations = p.a;
    const json c = compressed_tensors_config({g}, {"lm_head"}, kCompressedTensorsVersion, ActivationScheme::fp8_tensor_static());
    const json want = {{"config_groups",
                        {{"group_0",
                          {{"targets", {"Linear"}},
                           {"weights", p.want_w},
                           {"input_activations", p.want_a},
                           {"output_activations", nullptr},
                           {"format", p.format}}}}},
                       {"format", p.format},
                       {"global_compression_ratio", nullptr},
                       {"ignore", {"lm_head"}},
                       {"kv_cache_scheme", kv},
                       {"quant_method", "compressed-tensors"},
                       {"quantization_status", "compressed"},
                       {"sparsity_config", json::object()},
                       {"transform_config", json::object()},
                       {"version", "0.18.0"}};
    EXPECT_EQ(c, want) << p.name << "\n" << c.dump(2);
    // The args parse back.
    const auto s = compressed_tensors_scheme_from_args(c["config_groups"]["group_0"]["weights"]);
    EXPECT_EQ(s.type, p.w.type) << p.name;
    EXPECT_EQ(s.strategy, p.w.strategy) << p.name;
    if (p.a) {
      const auto a = compressed_tensors_activation_from_args(c["config_groups"]["group_0"]["input_activations"]);
      EXPECT_EQ(a.describe(), p.a->describe()) << p.name;
    }
  }
}

TEST(CompressedTensorsFormats, MixedPrecisionAndFormatChecks) {
  CompressedTensorsGroup a, b;
  a.scheme = QuantScheme::make(4, true, QuantStrategy::Group, 128);
  b.scheme = QuantScheme::fp8(QuantStrategy::Channel, DType::BF16);
  b.input_activations = ActivationScheme::fp8_token();
  b.targets = {"re:.*down_proj"};
  const json c = compressed_tensors_config({a, b}, {});
  EXPECT_EQ(c["format"], "mixed-precision");
  EXPECT_EQ(c["config_groups"]["group_0"]["format"], "pack-quantized");
  EXPECT_EQ(c["config_groups"]["group_1"]["format"], "float-quantized");
  EXPECT_EQ(c["kv_cache_scheme"], nullptr);
  // Two groups of one format: that format.
  CompressedTensorsGroup a2 = a;
  a2.targets = {"lm_head"};
  EXPECT_EQ(compressed_tensors_config({a, a2}, {})["format"], "pack-quantized");
  // An explicit format that cannot hold the scheme.
  CompressedTensorsGroup bad = a;
  bad.format = "float-quantized";
  EXPECT_QF_ERROR(compressed_tensors_config({bad}, {}), ErrorKind::InvalidInput, "does not hold");
  // FP8 weight-only may be called float-quantized (same tensors as naive).
  CompressedTensorsGroup fw;
  fw.scheme = QuantScheme::fp8(QuantStrategy::Tensor);
  fw.format = "float-quantized";
  EXPECT_EQ(compressed_tensors_config({fw}, {})["format"], "float-quantized");
  EXPECT_QF_ERROR(compressed_tensors_config({a}, {}, kCompressedTensorsVersion, ActivationScheme::fp8_token()),
                  ErrorKind::Unsupported, "kv_cache_scheme");
}

TEST(CompressedTensorsFormats, ArgsParsing) {
  EXPECT_TRUE(compressed_tensors_scheme_from_args(json{{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"}}).is_fp8());
  EXPECT_TRUE(compressed_tensors_scheme_from_args(
                  json{{"num_bits", 4}, {"type", "float"}, {"strategy", "tensor_group"}, {"group_size", 16}})
                  .is_nvfp4());
  EXPECT_QF_ERROR(compressed_tensors_scheme_from_args(json{{"num_bits", 4}, {"type", "float"}, {"group_size", 32}}),
                  ErrorKind::Unsupported, "NVFP4");
  EXPECT_QF_ERROR(compressed_tensors_scheme_from_args(
                      json{{"num_bits", 8}, {"type", "float"}, {"strategy", "block"}, {"block_structure", {128, 128}}}),
                  ErrorKind::Unsupported, "'block'");
  EXPECT_QF_ERROR(compressed_tensors_scheme_from_args(json{{"num_bits", 8}, {"type", "mx"}}), ErrorKind::InvalidInput,
                  "type: expected 'int' or 'float', got 'mx'");
  EXPECT_QF_ERROR(compressed_tensors_activation_from_args(json{{"num_bits", 8}, {"strategy", "token"}, {"dynamic", false}}),
                  ErrorKind::InvalidInput, "per-token activation scales are dynamic");
  EXPECT_QF_ERROR(compressed_tensors_activation_from_args(json{{"num_bits", 4}, {"type", "int"}, {"strategy", "token"}, {"dynamic", true}}),
                  ErrorKind::Unsupported, "num_bits: integer activations are quantized to 8 bits only");
  // kv_cache_scheme: FP8 per-tensor static only.
  EXPECT_NO_THROW(compressed_tensors_activation_from_args(
      json{{"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}, {"dynamic", false}}, true));
  EXPECT_QF_ERROR(compressed_tensors_activation_from_args(json{{"num_bits", 8}, {"type", "int"}, {"strategy", "tensor"}}, true),
                  ErrorKind::Unsupported, "kv_cache_scheme args: only FP8 E4M3 KV caches");
  const auto a = compressed_tensors_activation_from_args(json{{"num_bits", 8}, {"type", "int"}, {"symmetric", false}, {"dynamic", false}});
  EXPECT_EQ(a.strategy, QuantStrategy::Tensor);  // inferred: no group_size
  EXPECT_FALSE(a.symmetric);
  EXPECT_FALSE(a.dynamic);
}

TEST(CompressedTensorsFormats, ReaderNamesTheBadTensor) {
  test::TempDir d;
  const auto f8 = random_float_qt(QuantScheme::fp8(QuantStrategy::Channel, DType::F16), 4, 32, 9);
  const auto n4 = random_float_qt(QuantScheme::nvfp4(), 4, 32, 10);
  const auto i8 = random_qt(QuantScheme::make(8, true, QuantStrategy::Channel), 4, 32, false, 11);
  const ActQuantParams fs{ActivationScheme::fp8_tensor_static(), 0.5f, 0, 0};
  {
    SafetensorsWriter w(d.path());
    add_compressed_tensors_linear(w, "f8", f8, &fs);
    add_compressed_tensors_linear(w, "n4", n4);
    // FP8 weight stored as U8.
    w.add("u8.weight", DType::U8, {4, 32}, f8.q.data(), f8.q.size());
    std::vector<uint16_t> sc(4, 0x3c00);
    w.add("u8.weight_scale", DType::F16, {4, 1}, sc.data(), sc.size() * 2);
    // Scale of the wrong shape.
    w.add("shp.weight", DType::F8_E4M3, {4, 32}, f8.q.data(), f8.q.size());
    w.add("shp.weight_scale", DType::F16, {1, 4}, sc.data(), sc.size() * 2);
    // NVFP4 without a global scale, and with a block scale of the wrong dtype.
    std::vector<uint8_t> packed(4 * 16, 0x11);
    w.add("ng.weight_packed", DType::U8, {4, 16}, packed.data(), packed.size());
    std::vector<uint8_t> bs(4 * 2, 0x38);
    w.add("ng.weight_scale", DType::F8_E4M3, {4, 2}, bs.data(), bs.size());
    w.add("nd.weight_packed", DType::U8, {4, 16}, packed.data(), packed.size());
    w.add("nd.weight_scale", DType::U8, {4, 2}, bs.data(), bs.size());
    // int8 weight stored as I32; int-quantized without input_scale.
    std::vector<int32_t> wide(4 * 32, 1);
    w.add("i32.weight", DType::I32, {4, 32}, wide.data(), wide.size() * 4);
    std::vector<int8_t> w8(4 * 32, 3);
    w.add("noin.weight", DType::I8, {4, 32}, w8.data(), w8.size());
    w.add("noin.weight_scale", DType::F16, {4, 1}, sc.data(), sc.size() * 2);
    w.finish();
  }
  const auto ck = Checkpoint::open(d.path());
  const ActivationScheme fst = ActivationScheme::fp8_tensor_static();
  const ActivationScheme ist = ActivationScheme::int8_tensor_static();
  const json gf = group_json(f8.scheme, &fst);
  const json gn = group_json(n4.scheme, nullptr);
  const json gi = group_json(i8.scheme, &ist);
  EXPECT_NO_THROW(read_compressed_tensors_any(ck, "f8", gf, ""));
  EXPECT_QF_ERROR(read_compressed_tensors_any(ck, "u8", gf, ""), ErrorKind::InvalidInput, "u8.weight: dtype is U8, expected F8_E4M3");
  EXPECT_QF_ERROR(read_compressed_tensors_any(ck, "shp", gf, ""), ErrorKind::InvalidInput, "shp.weight_scale: shape is [1, 4]");
  EXPECT_QF_ERROR(read_compressed_tensors_any(ck, "ng", gn, ""), ErrorKind::NotFound, "ng.weight_global_scale");
  EXPECT_QF_ERROR(read_compressed_tensors_any(ck, "nd", gn, ""), ErrorKind::InvalidInput, "nd.weight_scale: dtype is U8");
  EXPECT_QF_ERROR(read_compressed_tensors_any(ck, "i32", gi, ""), ErrorKind::InvalidInput, "i32.weight: dtype is I32");
  EXPECT_QF_ERROR(read_compressed_tensors_any(ck, "noin", gi, ""), ErrorKind::NotFound, "noin.input_scale");
  EXPECT_QF_ERROR(read_compressed_tensors_any(ck, "missing", gf, ""), ErrorKind::NotFound, "missing.weight");
  // Formats: unknown, or mixed-precision without a group format.
  json g = gf;
  g["format"] = "marlin-24";
  EXPECT_QF_ERROR(read_compressed_tensors_any(ck, "f8", g, ""), ErrorKind::Unsupported, "marlin-24");
  g.erase("format");
  EXPECT_QF_ERROR(read_compressed_tensors_any(ck, "f8", g, "mixed-precision"), ErrorKind::InvalidInput, "names none");
  // NVFP4 activations on FP8 weights.
  const ActQuantParams na{ActivationScheme::nvfp4(), 0, 0, 10.f};
  test::TempDir d2;
  SafetensorsWriter w2(d2.path());
  EXPECT_QF_ERROR(add_compressed_tensors_linear(w2, "x", f8, &na), ErrorKind::Unsupported, "NVFP4 activations");
  // A block scale that is not an e4m3 value.
  auto bad = n4;
  bad.scales[0] = 0.3f;
  EXPECT_QF_ERROR(add_compressed_tensors_linear(w2, "y", bad), ErrorKind::InvalidInput, "not an e4m3 value");
}

}  // namespace
}  // namespace qf
