#include "checkpoint/awq_format.h"

#include <gtest/gtest.h>

#include "quantized_tensor_util.h"
#include "test_util.h"

namespace qf {
namespace {

using json = nlohmann::json;

std::string name_of(size_t i) {
  std::string s = "model.layers.";
  s += std::to_string(i);
  s += ".mlp.up_proj";
  return s;
}

TEST(AwqFormat, RoundTripAsymmetricAndSymmetric) {
  test::TempDir d;
  std::vector<QuantizedTensor> qs;
  uint32_t seed = 1;
  for (bool sym : {false, true})
    for (int64_t g : {16, 32, 64}) qs.push_back(random_qt(QuantScheme::make(4, sym, QuantStrategy::Group, g), 24, 64, false, seed++));
  {
    SafetensorsWriter w(d.path());
    for (size_t i = 0; i < qs.size(); ++i) add_awq_linear(w, name_of(i), qs[i]);
    w.finish();
  }
  const auto ck = Checkpoint::open(d.path());
  for (size_t i = 0; i < qs.size(); ++i) {
    const json cfg = awq_quantization_config(qs[i].scheme, {"lm_head"});
    const auto back = read_awq_linear(ck, name_of(i), cfg);
    expect_same(qs[i], back, qs[i].scheme.describe());
    EXPECT_EQ(back.dequantize(), qs[i].dequantize());
  }
}

// 8 outputs x 8 inputs, one group of 8: code q[n][k] = (n + k) % 16 and zero z[n] = n.
TEST(AwqFormat, HandBuiltNibblePositions) {
  test::TempDir d;
  QuantizedTensor q = random_qt(QuantScheme::make(4, false, QuantStrategy::Group, 8), 8, 8, false, 3);
  for (int n = 0; n < 8; ++n)
    for (int k = 0; k < 8; ++k) q.q[n * 8 + k] = static_cast<uint8_t>((n + k) % 16);
  for (int n = 0; n < 8; ++n) q.zeros[n] = n;
  for (int n = 0; n < 8; ++n) q.scales[n] = 0.5f + n;  // exact in f16
  {
    SafetensorsWriter w(d.path());
    add_awq_linear(w, "m", q);
    w.finish();
  }
  const auto ck = Checkpoint::open(d.path());
  const auto qw = ck.tensor("m.qweight");
  EXPECT_EQ(qw.dtype(), DType::I32);
  EXPECT_EQ(qw.shape(), (Shape{8, 1}));
  // Row k: nibble slots hold outputs 0,2,4,6,1,3,5,7, i.e. values k, k+2, k+4, k+6, k+1, k+3, k+5, k+7.
  EXPECT_EQ(static_cast<uint32_t>(qw.data_as<int32_t>()[0]), 0x75316420u);
  EXPECT_EQ(static_cast<uint32_t>(qw.data_as<int32_t>()[1]), 0x86427531u);
  EXPECT_EQ(static_cast<uint32_t>(qw.data_as<int32_t>()[7]), 0xECA8DB97u);
  const auto qz = ck.tensor("m.qzeros");
  EXPECT_EQ(qz.shape(), (Shape{1, 1}));
  EXPECT_EQ(static_cast<uint32_t>(qz.data_as<int32_t>()[0]), 0x75316420u);
  const auto sc = ck.tensor("m.scales");
  EXPECT_EQ(sc.dtype(), DType::F16);
  EXPECT_EQ(sc.shape(), (Shape{1, 8}));
  EXPECT_EQ(sc.to_f32_vector()[3], 3.5f);
}

TEST(AwqFormat, ConfigAndUnsupportedSchemes) {
  const json c = awq_quantization_config(QuantScheme::make(4, false, QuantStrategy::Group, 128), {"lm_head"});
  EXPECT_EQ(c, json::parse(R"({"quant_method": "awq", "zero_point": true, "group_size": 128, "bits": 4,
                               "version": "gemm", "modules_to_not_convert": ["lm_head"]})"));
  EXPECT_EQ(awq_quantization_config(QuantScheme::make(4, true, QuantStrategy::Group, 64), {})["zero_point"], false);
  EXPECT_QF_ERROR(awq_quantization_config(QuantScheme::make(8, false, QuantStrategy::Group, 64), {}), ErrorKind::Unsupported, "4-bit");
  EXPECT_QF_ERROR(awq_quantization_config(QuantScheme::make(4, false, QuantStrategy::Channel), {}), ErrorKind::Unsupported, "group");
  // AutoAWQ's own quant_config.json keys.
  const auto s = awq_scheme_from_config(json{{"w_bit", 4}, {"q_group_size", 32}, {"zero_point", true}, {"version", "GEMM"}});
  EXPECT_EQ(s.group_size, 32);
  EXPECT_FALSE(s.symmetric);
  EXPECT_QF_ERROR(awq_scheme_from_config(json{{"bits", 4}, {"group_size", 128}, {"version", "gemv"}}), ErrorKind::Unsupported, "gemv");
  EXPECT_QF_ERROR(awq_scheme_from_config(json{{"bits", 3}, {"group_size", 128}}), ErrorKind::Unsupported, "3-bit");

  test::TempDir d;
  SafetensorsWriter w(d.path());
  auto perm = random_qt(QuantScheme::make(4, false, QuantStrategy::Group, 16), 8, 32, true, 4);
  EXPECT_QF_ERROR(add_awq_linear(w, "p", perm), ErrorKind::Unsupported, "g_idx");
  auto odd = random_qt(QuantScheme::make(4, false, QuantStrategy::Group, 16), 12, 32, false, 5);
  EXPECT_QF_ERROR(add_awq_linear(w, "o", odd), ErrorKind::Unsupported, "12 outputs");
  auto bf = random_qt(QuantScheme::make(4, false, QuantStrategy::Group, 16, DType::F32), 8, 32, false, 6);
  bf.scales[0] = 0.1f;
  EXPECT_QF_ERROR(add_awq_linear(w, "b", bf), ErrorKind::InvalidInput, "not exactly representable in f16");
  auto i8 = random_qt(QuantScheme::make(8, false, QuantStrategy::Group, 16), 8, 32, false, 7);
  EXPECT_QF_ERROR(add_awq_linear(w, "i", i8), ErrorKind::Unsupported, "4-bit");
}

TEST(AwqFormat, ReaderNamesTheBadTensor) {
  test::TempDir d;
  const auto q = random_qt(QuantScheme::make(4, false, QuantStrategy::Group, 16), 8, 32, false, 9);
  const auto sy = random_qt(QuantScheme::make(4, false, QuantStrategy::Group, 16), 8, 32, false, 10, 9);  // zeros >= 9
  {
    SafetensorsWriter w(d.path());
    add_awq_linear(w, "ok", q);
    add_awq_linear(w, "zs", sy);
    std::vector<int64_t> wide(32, 0);
    w.add("bad.qweight", DType::I64, {32, 1}, wide.data(), wide.size() * 8);
    std::vector<int32_t> qw(32, 0), qz(2, 0);
    w.add("shp.qweight", DType::I32, {32, 1}, qw.data(), qw.size() * 4);
    w.add("shp.qzeros", DType::I32, {2, 1}, qz.data(), qz.size() * 4);
    std::vector<uint16_t> sc(16, 0x3c00);
    w.add("shp.scales", DType::F16, {8, 2}, sc.data(), sc.size() * 2);
    w.finish();
  }
  const auto ck = Checkpoint::open(d.path());
  const json cfg = awq_quantization_config(q.scheme, {});
  EXPECT_QF_ERROR(read_awq_linear(ck, "bad", cfg), ErrorKind::InvalidInput, "bad.qweight: dtype is I64");
  EXPECT_QF_ERROR(read_awq_linear(ck, "shp", cfg), ErrorKind::InvalidInput, "shp.scales: shape is [8, 2]");
  EXPECT_QF_ERROR(read_awq_linear(ck, "none", cfg), ErrorKind::NotFound, "none.qweight");
  json sym = cfg;
  sym["zero_point"] = false;
  EXPECT_QF_ERROR(read_awq_linear(ck, "zs", sym), ErrorKind::InvalidInput, "zs.qzeros: zero_point is false");
}

}  // namespace
}  // namespace qf
