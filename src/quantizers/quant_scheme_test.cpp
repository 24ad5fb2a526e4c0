#include "quantizers/quant_scheme.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"

namespace qf {
namespace {

// Expects `fn` to throw qf::Error of kind InvalidInput whose message names `where` and contains `needle`.
template <class F>
void expect_invalid(F fn, const std::string& where, const std::string& needle) {
  try {
    fn();
    FAIL() << "no exception; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    const std::string msg = e.what();
    EXPECT_NE(msg.find(where), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

TEST(QuantScheme, DescribeAndNames) {
  EXPECT_EQ(QuantScheme::make(4, true, QuantStrategy::Group, 128).describe(), "int4 sym g128");
  EXPECT_EQ(QuantScheme::make(3, false, QuantStrategy::Group, 64).describe(), "int3 asym g64");
  EXPECT_EQ(QuantScheme::make(8, false, QuantStrategy::Channel).describe(), "int8 asym channel");
  EXPECT_EQ(QuantScheme::make(8, true, QuantStrategy::Tensor).describe(), "int8 sym tensor");
  EXPECT_STREQ(strategy_name(QuantStrategy::Tensor), "tensor");
  EXPECT_STREQ(strategy_name(QuantStrategy::Channel), "channel");
  EXPECT_STREQ(strategy_name(QuantStrategy::Group), "group");
  EXPECT_EQ(QuantScheme::make(4, true, QuantStrategy::Group).qmax(), 15);
  EXPECT_EQ(QuantScheme::make(4, true, QuantStrategy::Group).sym_zero(), 8);
  EXPECT_EQ(QuantScheme::make(8, true, QuantStrategy::Group).qmax(), 255);
  EXPECT_EQ(QuantScheme::make(8, true, QuantStrategy::Group).sym_zero(), 128);
  EXPECT_EQ(QuantScheme::make(2, true, QuantStrategy::Group).qmax(), 3);
  EXPECT_EQ(QuantScheme::make(2, true, QuantStrategy::Group).sym_zero(), 2);
}

TEST(QuantScheme, ValidateErrors) {
  expect_invalid([] { QuantScheme::make(1, true, QuantStrategy::Channel).validate("layer.a"); }, "layer.a", "2..8");
  expect_invalid([] { QuantScheme::make(9, true, QuantStrategy::Channel).validate("layer.b"); }, "layer.b", "2..8");
  expect_invalid([] { QuantScheme::make(4, true, QuantStrategy::Group, 0).validate("layer.c"); }, "layer.c", "group_size");
  expect_invalid([] { QuantScheme::make(4, true, QuantStrategy::Group, 128).validate("layer.d", 100); }, "layer.d", "divide");
  expect_invalid([] { QuantScheme::make(4, true, QuantStrategy::Group, 128, DType::F8_E4M3).validate("layer.e"); }, "layer.e",
                 "f16, bf16 or f32");
  EXPECT_NO_THROW(QuantScheme::make(4, true, QuantStrategy::Group, 128).validate("ok", 256));
  EXPECT_NO_THROW(QuantScheme::make(4, true, QuantStrategy::Group, 128).validate("ok"));  // cols unknown
  EXPECT_NO_THROW(QuantScheme::make(2, false, QuantStrategy::Channel, 0).validate("ok", 100));  // group size ignored
  EXPECT_NO_THROW(QuantScheme::make(8, true, QuantStrategy::Tensor, 128, DType::BF16).validate("ok", 100));
  EXPECT_NO_THROW(QuantScheme::make(8, true, QuantStrategy::Tensor, 128, DType::F32).validate("ok", 100));
}

TEST(QuantScheme, GroupsAndParamIndex) {
  QuantizedTensor t;
  t.rows = 3;
  t.cols = 10;
  t.scheme = QuantScheme::make(4, true, QuantStrategy::Group, 4);
  EXPECT_EQ(t.n_groups(), 3);  // ceil(10 / 4)
  EXPECT_EQ(t.group_of(0), 0);
  EXPECT_EQ(t.group_of(3), 0);
  EXPECT_EQ(t.group_of(4), 1);
  EXPECT_EQ(t.group_of(9), 2);
  EXPECT_EQ(t.param_index(0, 0), 0);
  EXPECT_EQ(t.param_index(2, 1), 7);
  t.g_idx = {2, 2, 1, 0, 0, 1, 2, 0, 1, 1};
  EXPECT_EQ(t.group_of(0), 2);
  EXPECT_EQ(t.group_of(3), 0);
  EXPECT_EQ(t.group_of(9), 1);

  t.scheme.strategy = QuantStrategy::Channel;
  EXPECT_EQ(t.n_groups(), 1);
  EXPECT_EQ(t.group_of(7), 0);
  EXPECT_EQ(t.param_index(2, 0), 2);

  t.scheme.strategy = QuantStrategy::Tensor;
  EXPECT_EQ(t.n_groups(), 1);
  EXPECT_EQ(t.param_index(0, 0), 0);
  EXPECT_EQ(t.param_index(2, 0), 0);
}

// 2 x 4, int4 asym g2: w = (q - z) * s.
QuantizedTensor hand_built() {
  QuantizedTensor t;
  t.scheme = QuantScheme::make(4, false, QuantStrategy::Group, 2);
  t.rows = 2;
  t.cols = 4;
  t.q = {0, 15, 3, 5, /**/ 7, 8, 9, 1};
  t.scales = {0.5f, 0.25f, /**/ 2.0f, 1.0f};
  t.zeros = {1, 4, /**/ 8, 0};
  return t;
}

TEST(QuantScheme, DequantizeHandBuilt) {
  QuantizedTensor t = hand_built();
  EXPECT_NO_THROW(t.validate("hand"));
  const std::vector<float> want = {(0 - 1) * 0.5f, (15 - 1) * 0.5f, (3 - 4) * 0.25f, (5 - 4) * 0.25f,
                                   (7 - 8) * 2.0f, (8 - 8) * 2.0f,  (9 - 0) * 1.0f,  (1 - 0) * 1.0f};
  EXPECT_EQ(t.dequantize(), want);
  std::vector<float> row(4);
  t.dequantize_row(1, row.data());
  EXPECT_EQ(row, std::vector<float>(want.begin() + 4, want.end()));

  // g_idx reorders the column -> group map.
  t.g_idx = {1, 0, 0, 1};
  EXPECT_NO_THROW(t.validate("hand"));
  const std::vector<float> want_g = {(0 - 4) * 0.25f, (15 - 1) * 0.5f, (3 - 1) * 0.5f, (5 - 4) * 0.25f,
                                     (7 - 0) * 1.0f,  (8 - 8) * 2.0f,  (9 - 8) * 2.0f, (1 - 0) * 1.0f};
  EXPECT_EQ(t.dequantize(), want_g);

  // Tensor strategy: one shared (scale, zero).
  QuantizedTensor u;
  u.scheme = QuantScheme::make(8, true, QuantStrategy::Tensor);
  u.rows = 2;
  u.cols = 2;
  u.q = {128, 0, 255, 130};
  u.scales = {0.5f};
  u.zeros = {128};
  EXPECT_NO_THROW(u.validate("tensor"));
  EXPECT_EQ(u.dequantize(), (std::vector<float>{0.0f, -64.0f, 63.5f, 1.0f}));
}

TEST(QuantScheme, TensorValidateErrors) {
  expect_invalid([] { auto t = hand_built(); t.q.pop_back(); t.validate("w1"); }, "w1", "sizes");
  expect_invalid([] { auto t = hand_built(); t.scales.push_back(1); t.validate("w2"); }, "w2", "sizes");
  expect_invalid([] { auto t = hand_built(); t.q[3] = 16; t.validate("w3"); }, "w3", "code 16");
  expect_invalid([] { auto t = hand_built(); t.zeros[1] = -1; t.validate("w4"); }, "w4", "zero point");
  expect_invalid([] { auto t = hand_built(); t.zeros[1] = 16; t.validate("w5"); }, "w5", "zero point");
  expect_invalid([] { auto t = hand_built(); t.g_idx = {0, 1, 2, 0}; t.validate("w6"); }, "w6", "g_idx entry 2");
  expect_invalid([] { auto t = hand_built(); t.g_idx = {0, 1}; t.validate("w7"); }, "w7", "one entry per");
  expect_invalid([] { auto t = hand_built(); t.scheme.group_size = 3; t.validate("w8"); }, "w8", "divide");
  expect_invalid([] { auto t = hand_built(); t.scheme.bits = 9; t.validate("w9"); }, "w9", "2..8");
}

}  // namespace
}  // namespace qf
