#include "core/tensor.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace qf {
namespace {

TEST(Tensor, ZerosRowsReshape) {
  Tensor t = Tensor::zeros(DType::F32, {4, 3});
  EXPECT_EQ(t.numel(), 12);
  EXPECT_EQ(t.nbytes(), 48u);
  float* p = t.mutable_data_as<float>();
  for (int i = 0; i < 12; ++i) p[i] = static_cast<float>(i);
  Tensor r = t.rows(1, 3);
  EXPECT_EQ(r.shape(), (Shape{2, 3}));
  EXPECT_EQ(r.data_as<float>(), p + 3);  // zero-copy
  EXPECT_EQ(r.data_as<float>()[5], 8.0f);
  Tensor flat = t.reshape({12});
  EXPECT_EQ(flat.data(), t.data());
  EXPECT_EQ(flat.dim(-1), 12);
  EXPECT_THROW(t.reshape({5}), Error);
  EXPECT_THROW(t.rows(3, 5), Error);
}

TEST(Tensor, ViewKeepsOwnerAliveAndIsReadOnly) {
  auto buf = std::make_shared<std::vector<uint16_t>>(std::vector<uint16_t>{0x3c00, 0xc000});  // f16 1.0, -2.0
  Tensor v = Tensor::view_of(buf, buf->data(), DType::F16, {2});
  std::weak_ptr<std::vector<uint16_t>> weak = buf;
  buf.reset();
  EXPECT_FALSE(weak.expired());
  EXPECT_EQ(v.to_f32_vector(), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_THROW(v.mutable_data(), Error);
  Tensor b = v.to(DType::BF16);
  EXPECT_EQ(b.data_as<uint16_t>()[0], 0x3f80);
  EXPECT_EQ(b.data_as<uint16_t>()[1], 0xc000);
}

TEST(Shape, NumelValidation) {
  EXPECT_EQ(shape_numel({}), 1);
  EXPECT_EQ(shape_numel({0, 5}), 0);
  EXPECT_QF_ERROR(shape_numel({-1, 2}), ErrorKind::InvalidInput, "negative dimension");
  EXPECT_QF_ERROR(shape_numel({1ll << 40, 1ll << 40}), ErrorKind::InvalidInput, "too many elements");
  EXPECT_EQ(shape_str({4096, 256}), "[4096, 256]");
}

}  // namespace
}  // namespace qf
