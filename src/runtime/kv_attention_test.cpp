// Attention over every KV-cache format on the fixture model: one batch scored
// at once gives each position the prediction a token-by-token decode makes
// (what quantforge eval measures is what decoding would see), and the
// formats' own products agree with decoding the stored vectors.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>

#include "core/thread_pool.h"
#include "runtime/kv_cache.h"
#include "runtime/kv_codec.h"
#include "runtime/model.h"
#include "test_util.h"

namespace qf::rt {
namespace {

std::unique_ptr<Model> fixture(const char* name = "fixture-llama") {
  return load_model((test::source_dir() / "tests" / "data" / name).string());
}

std::vector<int32_t> tokens(const Model& m, int64_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) t[static_cast<size_t>(j)] = static_cast<int32_t>((j * 131 + 7) % m.vocab_size());
  return t;
}

// Logits of every position: all in one batch, or one token per forward.
std::vector<float> logits(const Model& m, const KvFormat& f, const std::vector<int32_t>& toks, bool one_batch,
                          ThreadPool& pool) {
  const int64_t n = static_cast<int64_t>(toks.size()), V = m.vocab_size();
  KvCache cache = m.make_cache(f, n);
  m.calibrate_kv(cache, {std::vector<int32_t>(toks.begin(), toks.begin() + 64)}, pool);
  const int32_t seq = cache.add_sequence();
  std::vector<float> all, out;
  Batch b;
  if (one_batch) {
    for (int64_t j = 0; j < n; ++j) b.add(toks[static_cast<size_t>(j)], seq, j, true);
    m.forward(b, cache, all, pool);
    return all;
  }
  for (int64_t j = 0; j < n; ++j) {
    b.clear();
    b.add(toks[static_cast<size_t>(j)], seq, j, true);
    m.forward(b, cache, out, pool);
    all.insert(all.end(), out.begin(), out.begin() + V);
  }
  return all;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d;
}

// KIVI and llama.cpp's block types read the stored bytes per query in both
// cases: a batch and a token-by-token decode give the same floats, KIVI's
// f16 windows included (170 positions cross the first 128-token key flush and
// the start of the value window's slide; the block types need fewer).
TEST(KvAttention, BatchEqualsTokenByTokenDecode) {
  std::unique_ptr<Model> m = fixture();
  ThreadPool pool(2);
  for (const KvFormat& f : {KvFormat(KvDType::KIVI2), KvFormat(KvDType::Q4_0), parse_kv_format("q4_1", "", "", "none"),
                            parse_kv_format("f16", "q8_0", "iq4_nl")}) {
    const auto toks = tokens(*m, f.has_kivi() ? 170 : 80);
    const auto a = logits(*m, f, toks, true, pool), b = logits(*m, f, toks, false, pool);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(max_abs_diff(a, b), 0.0) << f.name();
  }
  // The rotated cache on the mixture-of-experts fixture (4 query heads per KV head).
  std::unique_ptr<Model> moe = fixture("fixture-mixtral");
  const KvFormat rot = parse_kv_format("q4_0", "", "", "hadamard");
  const auto toks = tokens(*moe, 80);
  EXPECT_EQ(max_abs_diff(logits(*moe, rot, toks, true, pool), logits(*moe, rot, toks, false, pool)), 0.0);
}

// The other formats decode a batch's visible positions to f32 once (the
// GEMM blocks' path) and, when decoding, read the stored bytes one query at a
// time: the same products of the same decoded values, summed in another
// order, so equal within f32 rounding of a 64-term sum (64 ulp of the sum of
// magnitudes, checked per score and per output element). (Through a model
// the two can still differ more: a last-bit difference in a later layer's
// input can move a stored element across a rounding boundary.)
TEST(KvAttention, WidenedAndDirectReadsAgree) {
  const int64_t hd = 64, n = 80;
  KvFormat rot(KvDType::NVFP4);
  rot.rotation = KvRotation::Hadamard;
  for (const KvFormat& f : {KvFormat(KvDType::NVFP4), KvFormat(KvDType::I8), KvFormat(KvDType::F8_E4M3),
                            KvFormat(KvDType::F16), parse_kv_format("turboquant_k3v4_nc", "", "", "none", 0),
                            parse_kv_format("turboquant_k8v4", "", "", "none", 0),
                            parse_kv_format("turboquant_3bit_nc", "", "", "none", 0), rot}) {
    KvCache c({1, 2, hd}, f, 16, 16);
    c.set_nvfp4_amax(0, 4.f, 4.f);
    const int32_t seq = c.add_sequence();
    c.reserve(seq, n);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> k(2 * hd), v(2 * hd);
    for (int64_t p = 0; p < n; ++p) {
      for (auto& x : k) x = nd(rng);
      for (auto& x : v) x = nd(rng);
      c.store(0, seq, p, k.data(), v.data());
    }
    std::vector<float> q(hd), rows(n * hd), cols(n * hd), s1(n), w(n), o1(hd, 0.f);
    for (auto& x : q) x = nd(rng);
    for (auto& x : w) x = std::fabs(nd(rng)) / n;
    c.rotate_query(0, q.data());
    c.key_scores(0, seq, 1, 0, n, q.data(), 1, n - 1, s1.data());
    c.load_k_rows(0, seq, 1, 0, n, rows.data());
    for (int64_t p = 0; p < n; ++p) {
      double mag = 0, sum = 0;
      for (int64_t d = 0; d < hd; ++d) sum += q[d] * rows[p * hd + d], mag += std::fabs(q[d] * rows[p * hd + d]);
      ASSERT_NEAR(s1[p], sum, 64 * 6e-8 * mag + 1e-30) << f.name() << " position " << p;
    }
    c.value_sum(0, seq, 1, 0, n, w.data(), 1, n - 1, o1.data());
    c.load_v_cols(0, seq, 1, 0, n, cols.data());
    for (int64_t d = 0; d < hd; ++d) {
      double sum = 0, mag = 0;
      for (int64_t p = 0; p < n; ++p) sum += w[p] * cols[d * n + p], mag += std::fabs(w[p] * cols[d * n + p]);
      ASSERT_NEAR(o1[d], sum, 128 * 6e-8 * mag + 1e-30) << f.name() << " element " << d;
    }
  }
}

// A quantized cache changes the logits, by more as the bits shrink, and
// rotation (same bytes per token) leaves a 4-bit cache closer to f16.
TEST(KvAttention, ErrorShrinksWithBits) {
  std::unique_ptr<Model> m = fixture();
  ThreadPool pool(2);
  const auto toks = tokens(*m, 192);
  const auto ref = logits(*m, KvDType::F16, toks, true, pool);
  auto err = [&](const KvFormat& f) { return max_abs_diff(ref, logits(*m, f, toks, true, pool)); };
  const double q8 = err(KvDType::Q8_0), q4 = err(KvDType::Q4_0);
  EXPECT_GT(q8, 0.0);
  EXPECT_LT(q8, q4);
  EXPECT_LT(err(KvDType::KIVI4), err(KvDType::KIVI2));
  KvFormat tq3 = parse_kv_format("turboquant_3bit_nc", "", "", "none", 0), tq8 = parse_kv_format("turboquant_k8v4", "", "", "none", 0);
  EXPECT_LT(err(tq8), err(tq3));
}

}  // namespace
}  // namespace qf::rt
