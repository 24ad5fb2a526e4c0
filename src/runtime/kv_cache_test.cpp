#include "runtime/kv_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "core/error.h"
#include "core/dtype.h"
#include "formats/gguf/gguf.h"
#include "quantizers/kquants.h"
#include "runtime/kv_codec.h"
#include "runtime/model.h"
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


// ---- the per-vector formats ---------------------------------------------------

struct Bound {
  KvDType t;
  int64_t group;     // elements sharing a scale
  double of_amax;    // error bound as a share of the group's max |x| (symmetric types)
  double of_range;   // or of its max - min (asymmetric types)
};

// Each type's worst case from its step: half a step where rounding is to
// nearest, a whole step where a code saturates (q4_0/q5_0: the positive end
// of a block whose largest magnitude is negative), plus the f16/e4m3 rounding
// of the stored scale (1/1024 and 1/16 relative).
const Bound kBounds[] = {
    {KvDType::Q8_0, 32, 0.5 / 127 * 1.002 + 1e-3, 0},
    {KvDType::Q4_0, 32, 1.0 / 8 * 1.002, 0},
    {KvDType::Q5_0, 32, 1.0 / 16 * 1.002, 0},
    {KvDType::Q4_1, 32, 0, 0.5 / 15 * 1.002 + 1e-3},
    {KvDType::Q5_1, 32, 0, 0.5 / 31 * 1.002 + 1e-3},
    // iq4_nl: the widest gap between levels is 24 of 127 (half: 12), and the
    // far end of the table reaches 113 of 127 (14 short).
    {KvDType::IQ4_NL, 32, 14.0 / 113 * 1.05, 0},
    // nvfp4: the top e2m1 gap is 2 of 6 (half: 1/6 of the block scale's
    // reach), the e4m3 block scale within 1/16.
    {KvDType::NVFP4, 16, 1.0 / 6 * (1 + 1.0 / 16) + 1e-3, 0},
    {KvDType::KIVI4, 32, 0, 0.5 / 15 * 1.01 + 2e-3},
    {KvDType::KIVI2, 32, 0, 0.5 / 3 * 1.01 + 2e-3},
    {KvDType::TQ_V4, 64, 0, 0.5 / 15 * 1.01 + 2e-3},
    {KvDType::TQ_V3, 64, 0, 0.5 / 7 * 1.01 + 2e-3},
    {KvDType::TQ_K8, 64, 1.0 / 16 * 1.001, 0},  // e4m3: 3 mantissa bits
    {KvDType::I8, 64, 0.5 / 127 * 1.001, 0},
    {KvDType::F16, 64, 1.0 / 2048, 0},
};

TEST(KvCodec, RoundTripWithinEachTypesStep) {
  const int64_t hd = 64;
  for (const Bound& b : kBounds) {
    for (uint32_t seed = 0; seed < 40; ++seed) {
      std::vector<float> x = randn(hd, 100 + seed), y(hd);
      if (seed % 5 == 1) x[seed % hd] *= 20.f;   // an outlier channel
      if (seed % 5 == 2) for (float& v : x) v = std::fabs(v) + 0.5f;  // one-signed
      std::vector<uint8_t> bytes(kv_vector_bytes(b.t, hd));
      // nvfp4's global scale as Model Optimizer calibrates it: 448 * 6 / amax.
      float amax = 0;
      for (float v : x) amax = std::max(amax, std::fabs(v));
      const float param = b.t == KvDType::NVFP4 ? 448.f * 6.f / amax : 1.f;
      kv_encode(b.t, x.data(), hd, param, bytes.data());
      kv_decode(b.t, bytes.data(), hd, param, y.data());
      for (int64_t g = 0; g < hd; g += b.group) {
        float gmax = 0, lo = INFINITY, hi = -INFINITY;
        for (int64_t i = g; i < g + b.group; ++i) {
          gmax = std::max(gmax, std::fabs(x[i]));
          lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
        }
        const double bound = b.of_amax * gmax + b.of_range * (hi - lo);
        for (int64_t i = g; i < g + b.group; ++i)
          ASSERT_LE(std::fabs(static_cast<double>(y[i]) - x[i]), bound)
              << kv_dtype_name(b.t) << " seed " << seed << " element " << i;
      }
    }
  }
}

// TurboQuant keys: the paper's bound on the MSE of a unit vector,
// (sqrt(3) pi / 2) 4^-b, holds on average over Gaussian keys.
TEST(KvCodec, TurboQuantKeysWithinThePapersMseBound) {
  const int64_t hd = 128;
  for (KvDType t : {KvDType::TQ_K3_NC, KvDType::TQ_K4_NC}) {
    const int bits = t == KvDType::TQ_K3_NC ? 3 : 4;
    double mse = 0;
    const int n = 200;
    for (int s = 0; s < n; ++s) {
      std::vector<float> x = randn(hd, 7000 + s), y(hd);
      std::vector<uint8_t> bytes(kv_vector_bytes(t, hd));
      kv_encode(t, x.data(), hd, 1.f, bytes.data());
      kv_decode(t, bytes.data(), hd, 1.f, y.data());
      double e = 0, n2 = 0;
      for (int64_t i = 0; i < hd; ++i) e += (y[i] - x[i]) * (y[i] - x[i]), n2 += x[i] * x[i];
      mse += e / n2;
    }
    mse /= n;
    EXPECT_LT(mse, std::sqrt(3.0) * M_PI / 2 * std::pow(4.0, -bits)) << kv_dtype_name(t);
    EXPECT_GT(mse, 0.0);
  }
}

// vLLM solves Lloyd-Max for N(0, 1/d) at run time; for d = 128 and 3 bits its
// centroids times sqrt(128) are +-0.2449836, 0.7556455, 1.3431800, 2.1503495.
TEST(KvCodec, TurboQuantCodebookIsVllms) {
  const std::vector<float>& c = turboquant_centroids(128, 3);
  ASSERT_EQ(c.size(), 8u);
  const double want[] = {-2.1503495, -1.3431800, -0.7556455, -0.2449836, 0.2449836, 0.7556455, 1.3431800, 2.1503495};
  for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(c[i] * std::sqrt(128.0), want[i], 2e-6) << i;
  const std::vector<float>& m = turboquant_midpoints(128, 3);
  ASSERT_EQ(m.size(), 7u);
  EXPECT_EQ(m[3], (c[3] + c[4]) / 2.f);
  EXPECT_EQ(turboquant_centroids(128, 4).size(), 16u);
}

// Bytes per token of the presets as vLLM computes its slots: key = ceil(D
// bits / 8) + 2 (FP8: D), value = ceil(D bits / 8) + 4, the slot rounded up
// to even, per KV head and compressed layer; the edge layers at 2 bytes per
// element for K and V.
TEST(KvCache, TurboQuantBytesPerTokenAreVllms) {
  struct P {
    const char* name;
    int kbits, vbits;
  };
  for (const P& p : {P{"turboquant_k8v4", 8, 4}, P{"turboquant_4bit_nc", 4, 4}, P{"turboquant_k3v4_nc", 3, 4},
                     P{"turboquant_3bit_nc", 3, 3}}) {
    for (int64_t hd : {64, 128}) {
      const int64_t layers = 10, heads = 8;
      const KvCache c({layers, heads, hd}, parse_kv_format(p.name), 16, 1);
      const int64_t key = p.kbits == 8 ? hd : (hd * p.kbits + 7) / 8 + 2, value = (hd * p.vbits + 7) / 8 + 4;
      const int64_t slot = (key + value + 1) / 2 * 2;
      const int64_t edge = 2 * 2;  // min(2, 10 / 2) at each end
      EXPECT_EQ(c.bytes_per_token(), static_cast<uint64_t>((layers - edge) * heads * slot + edge * heads * hd * 2 * 2))
          << p.name << " head_dim " << hd;
    }
  }
  // A 128-dim 3-bit key and 4-bit value: 50 + 68 bytes.
  EXPECT_EQ(kv_vector_bytes(KvDType::TQ_K3_NC, 128) + kv_vector_bytes(KvDType::TQ_V4, 128), 118u);
}

// Bytes per token of the other formats from their layouts.
TEST(KvCache, BytesPerTokenFollowTheLayouts) {
  const int64_t L = 3, H = 2, hd = 64;
  auto bpt = [&](const KvFormat& f) { return KvCache({L, H, hd}, f, 32, 1).bytes_per_token(); };
  EXPECT_EQ(bpt(KvDType::Q8_0), static_cast<uint64_t>(L * 2 * H * (hd / 32) * 34));
  EXPECT_EQ(bpt(KvDType::Q4_0), static_cast<uint64_t>(L * 2 * H * (hd / 32) * 18));
  EXPECT_EQ(bpt(KvDType::Q5_1), static_cast<uint64_t>(L * 2 * H * (hd / 32) * 24));
  EXPECT_EQ(bpt(KvDType::IQ4_NL), static_cast<uint64_t>(L * 2 * H * (hd / 32) * 18));
  EXPECT_EQ(bpt(KvDType::NVFP4), static_cast<uint64_t>(L * 2 * H * (hd / 2 + hd / 16)));   // 4.5 bits
  EXPECT_EQ(bpt(KvDType::KIVI2), static_cast<uint64_t>(L * 2 * H * (hd / 4 + hd / 32 * 4)));  // 3 bits
  EXPECT_EQ(bpt(parse_kv_format("f16", "q8_0", "q4_0")), static_cast<uint64_t>(L * H * (hd / 32) * (34 + 18)));
  const KvCache kivi({L, H, hd}, KvDType::KIVI4, 32, 1);
  EXPECT_EQ(kivi.bytes_per_sequence(), static_cast<uint64_t>(2 * 128 * L * H * hd * 2));
  EXPECT_QF_ERROR(KvCache({L, H, 48}, KvDType::Q4_0, 32, 1), ErrorKind::Usage, "multiple of 32");
  EXPECT_QF_ERROR(KvCache({L, H, hd}, KvDType::KIVI2, 16, 1), ErrorKind::Usage, "multiple of 32 positions");
}

// K and V rows the fixture model really produces (after RoPE), stored in the
// cache: every llama.cpp block type's bytes equal those of the row converter
// llama.cpp's cache copy calls (quantize_row_*_ref: kquants::quantize_rows
// for the legacy types, quantize_row_iq4_nl_ref for IQ4_NL; both
// byte-identical to ggml, KQuant.BytesMatchLlamaCppGolden and
// KQuant.Iq4NlBytesMatchLlamaCppGolden).
class KvRows : public LinearObserver {
 public:
  void observe(int64_t, Slot, const float*, int64_t, int64_t) override {}
  void observe_kv(int64_t layer, const float* k, const float* v, int64_t n, int64_t kv_dim) override {
    if (layer != 1) return;
    ks.insert(ks.end(), k, k + n * kv_dim);
    vs.insert(vs.end(), v, v + n * kv_dim);
  }
  std::vector<float> ks, vs;
};

TEST(KvCache, BlockTypesStoreTheBytesOfGgmlsRowConverters) {
  const auto dir = test::source_dir() / "tests" / "data" / "fixture-llama";
  std::unique_ptr<Model> m = load_model(dir.string());
  ThreadPool pool(2);
  const int64_t n = 96;
  Batch b;
  KvCache f16 = m->make_cache(KvDType::F16, n);
  const int32_t s0 = f16.add_sequence();
  for (int64_t j = 0; j < n; ++j) b.add(static_cast<int32_t>((j * 37 + 5) % m->vocab_size()), s0, j, false);
  KvRows rows;
  std::vector<float> logits;
  m->forward(b, f16, logits, pool, &rows);
  const int64_t H = m->config().num_key_value_heads, hd = m->config().head_dim, kvd = H * hd;
  ASSERT_EQ(static_cast<int64_t>(rows.ks.size()), n * kvd);
  for (KvDType t : {KvDType::Q8_0, KvDType::Q4_0, KvDType::Q4_1, KvDType::Q5_0, KvDType::Q5_1, KvDType::IQ4_NL}) {
    KvCache c = m->make_cache(t, n);
    const int32_t seq = c.add_sequence();
    c.reserve(seq, n);
    for (int64_t p = 0; p < n; ++p) c.store(1, seq, p, rows.ks.data() + p * kvd, rows.vs.data() + p * kvd);
    const uint32_t gt = t == KvDType::Q8_0 ? ggml_type::Q8_0 : t == KvDType::Q4_0 ? ggml_type::Q4_0
                      : t == KvDType::Q4_1 ? ggml_type::Q4_1 : t == KvDType::Q5_0 ? ggml_type::Q5_0
                      : t == KvDType::Q5_1 ? ggml_type::Q5_1 : ggml_type::IQ4_NL;
    const size_t rs = kquants::row_size(gt, hd);
    std::vector<uint8_t> want(rs);
    int64_t differing = 0;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t h = 0; h < H; ++h)
        for (int which = 0; which < 2; ++which) {
          const float* x = (which == 0 ? rows.ks : rows.vs).data() + p * kvd + h * hd;
          if (gt == ggml_type::IQ4_NL) kquants::quantize_row_iq4_nl_ref(x, want.data(), hd);
          else kquants::quantize_rows(gt, x, want.data(), 1, hd, nullptr);
          differing += std::memcmp(want.data(), c.stored(1, which, seq, p, h), rs) != 0;
        }
    EXPECT_EQ(differing, 0) << kv_dtype_name(t);
  }
}

// KIVI: a query at position t reads keys at positions >= 128 floor(t / 128)
// and values at positions >= t - 128 as their exact f16 copies, the others
// quantized (keys per channel over 32 tokens).
TEST(KvCache, KiviReadsTheNewestPositionsInF16) {
  const int64_t hd = 32, n = 300;
  KvCache c({1, 1, hd}, KvDType::KIVI2, 32, 16);
  const int32_t seq = c.add_sequence();
  c.reserve(seq, n);
  std::vector<std::vector<float>> ks, vs;
  for (int64_t p = 0; p < n; ++p) {
    ks.push_back(randn(hd, static_cast<uint32_t>(p))), vs.push_back(randn(hd, static_cast<uint32_t>(5000 + p)));
    c.store(0, seq, p, ks.back().data(), vs.back().data());
  }
  std::vector<float> out(hd);
  const int64_t t = 299;
  for (int64_t p : {0, 100, 255, 256, 299}) {
    c.load_k(0, seq, p, 0, out.data(), t);
    const bool exact = p >= 256;
    double err = 0;
    for (int64_t d = 0; d < hd; ++d) err = std::max(err, std::fabs(static_cast<double>(out[d]) - ks[p][d]));
    if (exact) EXPECT_LE(err, 4e-3) << "key " << p;  // f16 rounding of |x| < 4
    else EXPECT_GT(err, 1e-2) << "key " << p;         // 2-bit codes
  }
  for (int64_t p : {0, 170, 171, 299}) {
    c.load_v(0, seq, p, 0, out.data(), t);
    double err = 0;
    for (int64_t d = 0; d < hd; ++d) err = std::max(err, std::fabs(static_cast<double>(out[d]) - vs[p][d]));
    if (p >= t - 128) EXPECT_LE(err, 4e-3) << "value " << p;
    else EXPECT_GT(err, 1e-2) << "value " << p;
  }
  // The key group statistics: per channel over positions [0, 32).
  for (int64_t d = 0; d < hd; ++d) {
    float lo = INFINITY, hi = -INFINITY;
    for (int64_t p = 0; p < 32; ++p) lo = std::min(lo, ks[p][d]), hi = std::max(hi, ks[p][d]);
    for (int64_t p = 0; p < 32; ++p) {
      c.load_k(0, seq, p, 0, out.data(), t);
      EXPECT_LE(std::fabs(out[d] - ks[p][d]), (hi - lo) / 3 * 0.51 + 4e-3) << d << " " << p;
    }
  }
  c.begin_batch(seq, n);  // the next batch starts at 300: keys from 256, values from 172 kept
  EXPECT_EQ(c.bytes_reserved(), c.bytes_per_block() * 10 + ((n - 256) + (n - 172)) * hd * 2);
}

// llama.cpp's rotation spreads an outlier channel over the head: the 4-bit
// error of outlier-heavy rows drops, and what load_k returns is in the
// model's basis again.
TEST(KvCache, HadamardRotationLowersTheErrorOfOutlierRows) {
  const int64_t hd = 64;
  auto error = [&](KvRotation r) {
    KvFormat f(KvDType::Q4_0);
    f.rotation = r;
    KvCache c({1, 1, hd}, f, 16, 4);
    const int32_t seq = c.add_sequence();
    c.reserve(seq, 64);
    Distortion dist;
    std::vector<float> out(hd);
    for (int64_t p = 0; p < 64; ++p) {
      std::vector<float> k = randn(hd, static_cast<uint32_t>(900 + p));
      k[3] *= 30.f, k[40] *= -25.f;
      c.store(0, seq, p, k.data(), k.data());
      c.load_k(0, seq, p, 0, out.data());
      dist.add(k, out);
    }
    return dist.relative_rmse();
  };
  const double plain = error(KvRotation::None), rotated = error(KvRotation::Hadamard);
  EXPECT_LT(rotated, 0.6 * plain) << rotated << " vs " << plain;
}

}  // namespace
}  // namespace qf::rt
