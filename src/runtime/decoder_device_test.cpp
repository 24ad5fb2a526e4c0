// The device decoder (runtime/device_runtime.h) against the independent
// double-precision reference (tests/unit/reference_llama.h) on the tiny
// models of every architecture variant the runtime claims, within the same
// per-logit bound the CPU runtime meets: prefill, the last row alone, a
// decode step at a time, and inputs longer than one pass through a layer.
// The cache must hold the f16 rounding of the exact K/V, as the CPU
// runtime's does. The cuda build runs the same cases where a GPU is usable.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "device/device.h"
#include "runtime/device_runtime.h"
#include "runtime/model.h"
#include "reference_llama.h"
#include "test_util.h"
#include "tiny_llama.h"

namespace qf {
namespace {

namespace reference = test::reference;
using test::tiny::Spec;

const std::vector<int32_t> kTokens = {3, 17, 42, 5, 63, 0, 28, 28, 9, 51, 33, 12, 40, 2};

reference::CacheValues cached(const rt::DeviceDecoder& d, const Spec& s) {
  reference::CacheValues cv;
  const size_t kvd = static_cast<size_t>(s.kv_dim()), n = static_cast<size_t>(d.position());
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::vector<float> k = d.cached_k(l), v = d.cached_v(l);
    EXPECT_EQ(k.size(), n * kvd);
    EXPECT_EQ(v.size(), n * kvd);
    cv.k.emplace_back(), cv.v.emplace_back();
    for (size_t p = 0; p < n && (p + 1) * kvd <= std::min(k.size(), v.size()); ++p) {
      cv.k.back().emplace_back(k.begin() + static_cast<std::ptrdiff_t>(p * kvd), k.begin() + static_cast<std::ptrdiff_t>((p + 1) * kvd));
      cv.v.back().emplace_back(v.begin() + static_cast<std::ptrdiff_t>(p * kvd), v.begin() + static_cast<std::ptrdiff_t>((p + 1) * kvd));
    }
  }
  return cv;
}

void expect_within_bound(const std::vector<float>& got, const Spec& s, const reference::Weights& w,
                         const rt::DeviceDecoder& d, const std::string& what, size_t first_row = 0) {
  const reference::CacheValues cv = cached(d, s);
  reference::Options o;
  o.cache = &cv;
  const std::vector<int32_t> tokens(kTokens.begin(), kTokens.begin() + d.position());
  const reference::Result ref = reference::forward(test::tiny::ref_arch(s), w, tokens, o);
  EXPECT_EQ(ref.cache_errors, 0) << what << ": the cache holds values f16 rounding cannot explain, first "
                                 << ref.first_cache_error;
  const reference::Check c = reference::compare(got, ref, first_row);
  EXPECT_TRUE(c.size_ok) << what << ": " << got.size() << " logits";
  EXPECT_LE(c.worst_ratio, 1.0) << what << ": |device - reference| reaches " << c.worst_ratio
                                << " times its bound (max diff " << c.max_diff << ", largest bound " << c.max_bound
                                << ", max |logit| " << c.max_abs << ")";
  // A bound this tight still catches a 1e-3 error on any scale, norm or frequency.
  EXPECT_LT(c.max_bound, 1e-4 * std::max(1.0, c.max_abs)) << what << ": the bound is too loose to catch a bug";
}

void check_variant(device::Kind kind, const Spec& s) {
  SCOPED_TRACE(std::string(device::kind_name(kind)) + " " + s.model_type);
  test::TempDir dir;
  test::tiny::write_model(s, dir.path());
  const std::unique_ptr<rt::Model> m = rt::load_hf_model(dir.path());
  const reference::Weights w = reference::Weights::load(dir.path());
  const int64_t n = static_cast<int64_t>(kTokens.size());
  const std::vector<uint8_t> all(kTokens.size(), 1);

  // 1. Prefill in one pass.
  std::unique_ptr<rt::DeviceDecoder> d = rt::make_device_decoder(kind, *m, n);
  std::vector<float> logits;
  d->forward(kTokens.data(), n, all.data(), logits);
  EXPECT_EQ(d->position(), n);
  expect_within_bound(logits, s, w, *d, "prefill");

  // 2. The last row alone.
  d->reset();
  std::vector<uint8_t> last(kTokens.size(), 0);
  last.back() = 1;
  d->forward(kTokens.data(), n, last.data(), logits);
  expect_within_bound(logits, s, w, *d, "the last row alone", kTokens.size() - 1);

  // 3. One token at a time on one cache.
  d->reset();
  std::vector<float> steps, one;
  for (int64_t t = 0; t < n; ++t) {
    d->forward(kTokens.data() + t, 1, all.data(), one);
    steps.insert(steps.end(), one.begin(), one.end());
  }
  expect_within_bound(steps, s, w, *d, "decode");

  // 4. Passes of 5 tokens (queries at an offset into the cache), then 3 more.
  std::unique_ptr<rt::DeviceDecoder> p = rt::make_device_decoder(kind, *m, n, 5);
  std::vector<float> chunked, rest;
  p->forward(kTokens.data(), n - 3, all.data(), chunked);
  p->forward(kTokens.data() + n - 3, 3, all.data(), rest);
  chunked.insert(chunked.end(), rest.begin(), rest.end());
  expect_within_bound(chunked, s, w, *p, "passes of 5 tokens");

  // Beyond the capacity and outside the vocabulary: clear errors.
  EXPECT_THROW(p->forward(kTokens.data(), 1, all.data(), one), Error);
  p->reset();
  const int32_t bad = static_cast<int32_t>(s.vocab);
  EXPECT_THROW(p->forward(&bad, 1, all.data(), one), Error);
}

std::vector<Spec> variants() {
  std::vector<Spec> v;
  Spec s;
  v.push_back(s);  // llama, default RoPE, GQA 4/2
  s.theta = 500.0, s.rope_type = "llama3", s.rope_factor = 8.0, s.original_max_pos = 32, s.seed = 11;
  v.push_back(s);
  s = Spec();
  s.attention_bias = true, s.mlp_bias = true, s.seed = 2, s.dtype = DType::F16;
  v.push_back(s);
  s = Spec();
  s.model_type = "mistral", s.sliding_window = 5, s.seed = 4, s.dtype = DType::BF16;
  v.push_back(s);
  s = Spec();
  s.model_type = "qwen2", s.sliding_window = 4, s.use_sliding_window = true, s.max_window_layers = 1, s.seed = 6;
  v.push_back(s);
  s = Spec();
  s.model_type = "qwen3", s.hidden = 32, s.head_dim = 16, s.write_head_dim = true, s.inter = 48, s.theta = 1000.0;
  s.seed = 7, s.tie = true;
  v.push_back(s);
  return v;
}

TEST(DeviceDecoder, HostBuildMeetsTheReferenceBound) {
  for (const Spec& s : variants()) check_variant(device::Kind::Host, s);
}

TEST(DeviceDecoder, CudaBuildMeetsTheReferenceBound) {
  std::string why;
  if (!device::cuda_usable(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  for (const Spec& s : variants()) check_variant(device::Kind::Cuda, s);
}

TEST(DeviceDecoder, MemoryEstimateCoversWeightsAndCache) {
  test::TempDir dir;
  Spec s;
  s.dtype = DType::F16;
  test::tiny::write_model(s, dir.path());
  const std::unique_ptr<rt::Model> m = rt::load_hf_model(dir.path());
  std::unique_ptr<rt::DeviceDecoder> d = rt::make_device_decoder(device::Kind::Host, *m, 64);
  // f16 weights stay 2 bytes each on the device.
  const uint64_t linear_bytes = 2 * static_cast<uint64_t>(s.layers * (2 * s.hidden * s.q_dim() + 2 * s.hidden * s.kv_dim() +
                                                                       3 * s.hidden * s.inter) +
                                                          s.vocab * s.hidden);
  EXPECT_GE(d->weight_bytes_per_token(), linear_bytes);
  EXPECT_LT(d->weight_bytes_per_token(), linear_bytes + 64 * 1024);
  EXPECT_EQ(d->kv_bytes_per_token(), static_cast<uint64_t>(s.layers * s.kv_dim() * 2 * 4));
  EXPECT_GE(rt::device_decoder_bytes(*m, 64), linear_bytes + 64 * d->kv_bytes_per_token());
  EXPECT_THROW(rt::make_device_decoder(device::Kind::Host, *m, 65), Error);  // beyond max_position_embeddings
  EXPECT_THROW(rt::make_device_decoder(device::Kind::Cpu, *m, 8), Error);
  EXPECT_GT(rt::device_read_bandwidth(device::Kind::Host, 1 << 20), 0.0);
}

}  // namespace
}  // namespace qf
