#include "runtime/kv_cache.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "quantizers/distortion.h"
#include "test_util.h"

namespace qf::rt {
namespace {

using namespace qf::test;

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Max |decoded - stored| / max |stored| after storing 40 positions of 2 layers.
double roundtrip_error(KvDType t) {
  const KvShape s{2, 3, 16};
  KvCache c(s, t, 16, 8);
  const int32_t seq = c.add_sequence();
  c.reserve(seq, 40);
  const int64_t kv = s.n_kv_heads * s.head_dim;
  std::vector<std::vector<float>> ks, vs;
  for (int64_t p = 0; p < 40; ++p)
    for (int64_t l = 0; l < 2; ++l) {
      ks.push_back(randn(static_cast<size_t>(kv), static_cast<uint32_t>(p * 2 + l)));
      vs.push_back(randn(static_cast<size_t>(kv), static_cast<uint32_t>(1000 + p * 2 + l)));
      c.store(l, seq, p, ks.back().data(), vs.back().data());
    }
  Distortion dist;  // the shared measure, over every K and V element
  std::vector<float> out(16), kr(40 * 16), vc(40 * 16);
  for (int64_t l = 0; l < 2; ++l)
    for (int64_t h = 0; h < 3; ++h) {
      c.load_k_rows(l, seq, h, 0, 40, kr.data());
      c.load_v_cols(l, seq, h, 0, 40, vc.data());
      for (int64_t p = 0; p < 40; ++p) {
        const auto& k = ks[static_cast<size_t>(p * 2 + l)];
        const auto& v = vs[static_cast<size_t>(p * 2 + l)];
        c.load_k(l, seq, p, h, out.data());
        for (int64_t d = 0; d < 16; ++d) {
          EXPECT_EQ(out[d], kr[p * 16 + d]);
          dist.add(k[h * 16 + d], out[d]);
          dist.add(v[h * 16 + d], vc[d * 40 + p]);
        }
      }
    }
  return dist.max_abs_error() / dist.max_abs_original();  // NaN (a failed check) if any value is not finite
}

TEST(KvCache, RoundTripErrorByType) {
  const double f16 = roundtrip_error(KvDType::F16), i8 = roundtrip_error(KvDType::I8),
               f8 = roundtrip_error(KvDType::F8_E4M3);
  EXPECT_LT(f16, 1e-3);
  EXPECT_LT(i8, 1.5e-2);   // half a step of absmax/127 per head
  EXPECT_LT(f8, 7e-2);     // e4m3 keeps 3 mantissa bits
  EXPECT_GT(i8, f16);
  EXPECT_GT(f8, f16);
}

TEST(KvCache, PagingReservesBlocksAndReusesFreedOnes) {
  KvCache c({4, 2, 8}, KvDType::F16, 16, 5);
  EXPECT_EQ(c.bytes_per_token(), 4u * 2 * 16 * 2);
  const int32_t a = c.add_sequence(), b = c.add_sequence();
  c.reserve(a, 17);  // two blocks
  c.reserve(b, 16);  // one block
  EXPECT_EQ(c.blocks_in_use(), 3);
  EXPECT_EQ(c.bytes_reserved(), 3 * c.bytes_per_block());
  EXPECT_EQ(c.bytes_used(), 0u);
  std::vector<float> k(16, 1.f), v(16, 2.f);
  for (int64_t p = 0; p < 17; ++p)
    for (int64_t l = 0; l < 4; ++l) c.store(l, a, p, k.data(), v.data());
  EXPECT_EQ(c.length(a), 17);
  EXPECT_EQ(c.bytes_used(), 17 * c.bytes_per_token());
  c.reserve(a, 40);  // third block for a: pool now holds 4 of 5
  EXPECT_QF_ERROR(c.reserve(b, 40), ErrorKind::InvalidInput, "KV cache full");
  c.free_sequence(a);
  EXPECT_EQ(c.blocks_in_use(), 2);  // b got one more before the pool ran dry
  const int32_t d = c.add_sequence();
  EXPECT_EQ(d, a);  // the slot is reused
  c.reserve(d, 48);  // freed blocks are taken back
  EXPECT_EQ(c.blocks_in_use(), 5);
}

TEST(KvCache, Int8ScalesArePerPositionAndHead) {
  KvCache c({1, 2, 4}, KvDType::I8, 16, 1);
  const int32_t s = c.add_sequence();
  c.reserve(s, 2);
  std::vector<float> k = {1, -2, 3, 4, 100, 50, -25, 0}, v = k;
  c.store(0, s, 0, k.data(), v.data());
  std::vector<float> out(4);
  c.load_k(0, s, 0, 0, out.data());
  EXPECT_NEAR(out[3], 4.f, 1e-6);  // the head's absmax is exact
  EXPECT_NEAR(out[0], 1.f, 4.f / 127);
  c.load_k(0, s, 0, 1, out.data());
  EXPECT_NEAR(out[0], 100.f, 1e-4);
  EXPECT_NEAR(out[1], 50.f, 100.f / 127);
  EXPECT_EQ(c.bytes_per_token(), 2u * 8 + 2 * 2 * 4);
}

TEST(KvCache, F8ScalesAreApplied) {
  KvCache c({1, 1, 4}, KvDType::F8_E4M3, 16, 1);
  c.set_f8_scales(0, {0.01f}, {1.f});
  const int32_t s = c.add_sequence();
  c.reserve(s, 1);
  std::vector<float> k = {0.5f, 1.f, 2.f, 4.f}, v = {600.f, 1000.f, 0.25f, 1.f};
  c.store(0, s, 0, k.data(), v.data());
  std::vector<float> out(4);
  c.load_k(0, s, 0, 0, out.data());
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], k[i], k[i] * 0.07f);
  c.load_v(0, s, 0, 0, out.data());
  EXPECT_EQ(out[1], 448.f);  // e4m3 saturates at 448 with scale 1
  EXPECT_QF_ERROR(c.set_f8_scales(0, {0.f}, {1.f}), ErrorKind::InvalidInput, "positive");
  KvCache f16({1, 1, 4}, KvDType::F16, 16, 1);
  EXPECT_QF_ERROR(f16.set_f8_scales(0, {1.f}, {1.f}), ErrorKind::Usage, "f8 cache only");
}

TEST(KvCache, ParsesNames) {
  EXPECT_EQ(parse_kv_dtype("f16"), KvDType::F16);
  EXPECT_EQ(parse_kv_dtype("fp8"), KvDType::F8_E4M3);
  EXPECT_EQ(parse_kv_dtype("int8"), KvDType::I8);
  EXPECT_QF_ERROR(parse_kv_dtype("q4"), ErrorKind::Usage, "unknown KV-cache type");
}

}  // namespace
}  // namespace qf::rt
