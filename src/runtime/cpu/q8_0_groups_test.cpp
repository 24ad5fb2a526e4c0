// Q8_0 row groups (cpu/q8_0_groups.h): the documented layout, the round trip
// back to rows, and both dot products against the row dot product's
// reference, bit for bit; then a block Linear regrouped in place against the
// same Linear on rows.
#include "runtime/cpu/q8_0_groups.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "formats/gguf/gguf.h"
#include "quantizers/kquants.h"
#include "runtime/linear.h"
#include "simd_level_fixture.h"

namespace qf::rt {
namespace {

constexpr size_t kBlock = 34;

// `rows` Q8_0 rows of `blocks` blocks: quantized normal weights, with one
// row of raw codes that reach -128 and 127 (a file may hold -128, which
// quantization never writes) and one all-zero row.
std::vector<uint8_t> q8_rows(int64_t rows, int64_t blocks, std::mt19937& rng) {
  const int64_t k = blocks * 32;
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(rows * k));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < k; ++i) w[static_cast<size_t>(r * k + i)] = r == 2 ? 0.0f : g(rng) * (1.0f + 0.3f * (r % 5));
  std::vector<uint8_t> q(static_cast<size_t>(rows * blocks) * kBlock);
  kquants::quantize_rows(ggml_type::Q8_0, w.data(), q.data(), rows, k, nullptr);
  std::uniform_int_distribution<int> code(-128, 127);
  uint8_t* raw = q.data() + static_cast<size_t>(5 % rows * blocks) * kBlock;
  for (int64_t b = 0; b < blocks; ++b) {
    for (int i = 0; i < 32; ++i) raw[b * kBlock + 2 + i] = static_cast<uint8_t>(static_cast<int8_t>(i == 0 ? -128 : i == 1 ? 127 : code(rng)));
  }
  return q;
}

std::vector<uint8_t> activation_row(int64_t blocks, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(blocks * 32));
  for (auto& v : x) v = g(rng);
  x[0] = 40.0f;  // a block whose codes reach the 127 end
  std::vector<uint8_t> a(static_cast<size_t>(blocks) * kBlock);
  kquants::quantize_activation(ggml_type::Q8_0, x.data(), a.data(), blocks * 32);
  return a;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(Q8_0Groups, LayoutIsTheDocumentedOneAndUnpacksToTheRows) {
  std::mt19937 rng(3);
  for (int64_t blocks : {1, 3, 8, 13, 64}) {
    const std::vector<uint8_t> rows = q8_rows(16, blocks, rng);
    std::vector<uint8_t> group = rows, scratch;
    q8_0_group_pack(group.data(), blocks, scratch);
    ASSERT_EQ(group.size(), rows.size());
    const uint8_t* scales = group.data() + static_cast<size_t>(blocks) * 512;
    for (int r = 0; r < 16; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = rows.data() + static_cast<size_t>(r * blocks + b) * kBlock;
        EXPECT_EQ(std::memcmp(scales + (b * 16 + r) * 2, blk, 2), 0) << "scale of row " << r << " block " << b;
        for (int i = 0; i < 32; ++i) {
          const uint8_t want = static_cast<uint8_t>(static_cast<int8_t>(blk[2 + i]) + 128);
          ASSERT_EQ(group[static_cast<size_t>(b * 512 + (i / 4) * 64 + r * 4 + i % 4)], want)
              << "blocks " << blocks << " row " << r << " block " << b << " element " << i;
        }
      }
      std::vector<uint8_t> back(static_cast<size_t>(blocks) * kBlock);
      q8_0_group_unpack_row(group.data(), blocks, r, back.data());
      EXPECT_EQ(std::memcmp(back.data(), rows.data() + static_cast<size_t>(r * blocks) * kBlock, back.size()), 0)
          << "blocks " << blocks << " row " << r;
    }
  }
}

TEST(Q8_0Groups, ActivationOffsetsAreTheCodeSums) {
  std::mt19937 rng(4);
  const std::vector<uint8_t> a = activation_row(5, rng);
  Q8_0GroupActivation ga;
  q8_0_group_activation(a.data(), 5, ga);
  ASSERT_EQ(ga.d.size(), 5u);
  for (int64_t b = 0; b < 5; ++b) {
    int32_t s = 0;
    for (int i = 0; i < 32; ++i) s += static_cast<int8_t>(a[static_cast<size_t>(b) * kBlock + 2 + i]);
    EXPECT_EQ(ga.offset[static_cast<size_t>(b)], 128 * s);
    uint16_t h;
    std::memcpy(&h, a.data() + static_cast<size_t>(b) * kBlock, 2);
    EXPECT_EQ(bits(ga.d[static_cast<size_t>(b)]), bits(f16_to_f32(h)));
  }
}

// Every row of `count` groups against the row layout's reference dot product.
void expect_groups_match_rows(int64_t count, int64_t blocks, bool kernel, std::mt19937& rng) {
  const std::vector<uint8_t> rows = q8_rows(16 * count, blocks, rng);
  const std::vector<uint8_t> act = activation_row(blocks, rng);
  std::vector<uint8_t> groups = rows, scratch;
  const size_t group_bytes = static_cast<size_t>(16 * blocks) * kBlock;
  for (int64_t g = 0; g < count; ++g) q8_0_group_pack(groups.data() + g * group_bytes, blocks, scratch);
  Q8_0GroupActivation ga;
  q8_0_group_activation(act.data(), blocks, ga);
  std::vector<float> out(static_cast<size_t>(16 * count));
  if (kernel) {
    q8_0_groups_dot(groups.data(), count, blocks, ga, out.data());
  } else {
    for (int64_t g = 0; g < count; ++g) q8_0_group_dot_ref(groups.data() + g * group_bytes, blocks, ga, out.data() + 16 * g);
  }
  for (int64_t r = 0; r < 16 * count; ++r) {
    const float want = kquants::vec_dot_ref(ggml_type::Q8_0, blocks * 32, rows.data() + static_cast<size_t>(r * blocks) * kBlock, act.data());
    EXPECT_EQ(bits(out[static_cast<size_t>(r)]), bits(want))
        << (kernel ? "kernel" : "reference") << ", groups " << count << ", blocks " << blocks << ", row " << r << ": "
        << out[static_cast<size_t>(r)] << " vs " << want;
  }
}

TEST(Q8_0Groups, ReferenceGivesTheRowDotProductsFloats) {
  std::mt19937 rng(5);
  for (int64_t blocks : {1, 7, 8, 13, 64}) expect_groups_match_rows(1, blocks, false, rng);
}

TEST(Q8_0Groups, VnniKernelGivesTheRowDotProductsFloats) {
  test::ScopedSimdLevel level(best_simd_level());
  if (!q8_0_groups_fast()) GTEST_SKIP() << "this CPU has no AVX-512 VNNI kernel for the groups (best level "
                                        << simd_level_name(best_simd_level()) << ")";
  std::mt19937 rng(6);
  for (int64_t count : {1, 2, 3})
    for (int64_t blocks : {1, 7, 8, 13, 64}) expect_groups_match_rows(count, blocks, true, rng);
}

TEST(Q8_0Groups, BelowTheKernelsLevelTheDotIsTheReference) {
  test::ScopedSimdLevel level(SimdLevel::Avx2 <= best_simd_level() ? SimdLevel::Avx2 : SimdLevel::Scalar);
  EXPECT_FALSE(q8_0_groups_fast());
  std::mt19937 rng(7);
  expect_groups_match_rows(3, 13, true, rng);
}

// A regrouped Linear of 40 rows (two groups and 8 rows left as rows), with a
// bias, against the same weights left as rows: every forward path and
// decode_row give the same floats.
TEST(Q8_0Groups, RegroupedLinearMatchesTheRowLayout) {
  test::ScopedSimdLevel level(best_simd_level());
  const int64_t rows = 40, blocks = 13, cols = blocks * 32;
  std::mt19937 rng(8);
  const std::vector<uint8_t> q = q8_rows(rows, blocks, rng);
  auto plain = std::make_shared<std::vector<uint8_t>>(q);
  auto packed = std::make_shared<std::vector<uint8_t>>(q);
  std::vector<float> bias(static_cast<size_t>(rows));
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.25f * static_cast<float>(i) - 3.0f;
  const Tensor b = Tensor::from_f32(bias, {rows});
  auto ref = make_block_linear(ggml_type::Q8_0, plain->data(), rows, cols, plain, &b, "w");
  auto grp = make_block_linear(ggml_type::Q8_0, packed->data(), rows, cols, packed, &b, "w", packed->data());
  const bool regrouped = *packed != q;
  EXPECT_EQ(regrouped, q8_0_groups_fast());
  EXPECT_EQ(grp->device_form().kind, regrouped ? DeviceWeightForm::Kind::None : DeviceWeightForm::Kind::GgufBlocks);
  EXPECT_EQ(grp->weight_bytes(), ref->weight_bytes());
  EXPECT_EQ(grp->format(), "q8_0");
  std::vector<float> row_a(static_cast<size_t>(cols)), row_b(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    ref->decode_row(r, row_a.data());
    grp->decode_row(r, row_b.data());
    EXPECT_EQ(row_a, row_b) << "row " << r;
  }
  ThreadPool pool(2);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (int64_t n : {1, 3, 20}) {  // decode, a short batch, the GEMM path of the current level
    std::vector<float> x(static_cast<size_t>(n * cols));
    for (auto& v : x) v = g(rng);
    std::vector<float> ya(static_cast<size_t>(n * rows)), yb(ya.size(), -1.0f);
    ref->forward(x.data(), n, ya.data(), pool);
    grp->forward(x.data(), n, yb.data(), pool);
    for (size_t i = 0; i < ya.size(); ++i) EXPECT_EQ(bits(ya[i]), bits(yb[i])) << "n " << n << " output " << i;
  }
  if (!regrouped) GTEST_SKIP() << "no VNNI kernel on this CPU: the weights stayed rows (compared above all the same)";
}

}  // namespace
}  // namespace qf::rt
