// Independent correctness test of the CPU runtime's forward pass for every
// architecture variant it claims (llama with default / linear / llama3 RoPE,
// attention and MLP biases, mistral sliding window, qwen2 biases and upper-layer
// sliding window, qwen3 per-head q/k RMSNorm, tied embeddings, f32/f16/bf16
// weights, f16/f8/int8 KV cache).
//
// The reference (tests/unit/reference_llama.h) is written from the Hugging
// Face transformers semantics only: double precision, full recomputation of
// every position (no KV cache), and no runtime code; with each logit it
// computes a bound on the runtime's f32 error, so every comparison below holds
// at every SIMD level. It reads the weights back from the safetensors file the
// test wrote (so it sees the same f16/bf16 rounding as the runtime) and takes
// every architecture parameter from the test's own Spec, never from the
// runtime's parsed ModelConfig.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "formats/safetensors.h"
#include "runtime/model.h"
#include "cache_values.h"
#include "reference_llama.h"
#include "test_util.h"
#include "tiny_llama.h"

namespace qf {
namespace {

namespace fs = std::filesystem;

namespace reference = test::reference;
using Vec = reference::Vec;
using test::tiny::json;
using test::tiny::Rng;
using test::tiny::Spec;
using test::tiny::ref_arch;
using test::tiny::write_model;

// ---- the reference (tests/unit/reference_llama.h) ---------------------------

// Logits of one sequence at positions 0..T-1 with the bound on the runtime's
// f32 result, continuing from what the runtime cached for that sequence (the
// f16 K/V); result.cache_errors counts cached elements f16 rounding cannot
// explain.
reference::Result reference_logits(const Spec& s, const reference::Weights& w, const std::vector<int32_t>& tokens,
                                   const reference::CacheValues& cache) {
  reference::Options o;
  o.cache = &cache;
  return reference::forward(ref_arch(s), w, tokens, o);
}

// ---- the runtime ------------------------------------------------------------

ThreadPool& pool() {
  static ThreadPool p(2);
  return p;
}

// What one sequence left in a cache, for the reference (reference_llama.h, 1.).
reference::CacheValues cached(const rt::Model& m, const rt::KvCache& cache, int32_t seq, size_t positions) {
  const ModelConfig& c = m.config();
  return test::cache_values(cache, seq, c.num_hidden_layers, c.num_key_value_heads, c.head_dim,
                            static_cast<int64_t>(positions));
}

// Logits [tokens.size() * vocab] of one sequence run as one prefill batch;
// `kv_out` receives what the cache holds after it.
std::vector<float> run_prefill(const rt::Model& m, const std::vector<int32_t>& tokens,
                               rt::KvDType kv = rt::KvDType::F16, reference::CacheValues* kv_out = nullptr) {
  rt::KvCache cache = m.make_cache(kv, m.max_context());
  const int32_t seq = cache.add_sequence();
  rt::Batch b;
  for (size_t i = 0; i < tokens.size(); ++i) b.add(tokens[i], seq, static_cast<int64_t>(i), true);
  std::vector<float> logits;
  m.forward(b, cache, logits, pool());
  if (kv_out) *kv_out = cached(m, cache, seq, tokens.size());
  return logits;
}

// The same, one token per forward call on one cache.
std::vector<float> run_decode(const rt::Model& m, const std::vector<int32_t>& tokens, reference::CacheValues* kv_out) {
  rt::KvCache cache = m.make_cache(rt::KvDType::F16, m.max_context());
  const int32_t seq = cache.add_sequence();
  std::vector<float> all, logits;
  for (size_t i = 0; i < tokens.size(); ++i) {
    rt::Batch b;
    b.add(tokens[i], seq, static_cast<int64_t>(i), true);
    m.forward(b, cache, logits, pool());
    all.insert(all.end(), logits.begin(), logits.end());
  }
  *kv_out = cached(m, cache, seq, tokens.size());
  return all;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

const std::vector<int32_t> kTokensA = {3, 17, 42, 5, 63, 0, 28, 28, 9, 51, 33, 12};
const std::vector<int32_t> kTokensB = {60, 1, 1, 22, 47, 8, 35, 14, 50};

// Expects the runtime's cache to hold the f16 rounding of the exact K/V, and
// every runtime logit within the reference's bound (tests/unit/reference_llama.h:
// the f32 rounding of every operation propagated through the layers, which
// holds at every SIMD level and thread count). `first_row` compares `got`
// with the reference's rows from there on.
reference::Check expect_within_bound(const std::vector<float>& got, const reference::Result& ref, const std::string& what,
                                     size_t first_row = 0) {
  EXPECT_EQ(ref.cache_errors, 0) << what << ": the K/V cache holds values f16 rounding cannot explain, first "
                                 << ref.first_cache_error;
  const reference::Check c = reference::compare(got, ref, first_row);
  EXPECT_TRUE(c.size_ok) << what << ": " << got.size() << " logits";
  EXPECT_LE(c.worst_ratio, 1.0) << what << ": |runtime - reference| reaches " << c.worst_ratio
                                << " times its bound (max diff " << c.max_diff << ", largest bound " << c.max_bound
                                << ", max |logit| " << c.max_abs << ")";
  // The bound must stay below the effect of a real bug (a factor 1 + 1e-3 on
  // a scale, norm or frequency, a dropped term), which moves logits by 1e-4
  // to 1e-2 of max |logit|; a runaway bound would hide one. (It is about
  // 2e-5 of max |logit| here.)
  EXPECT_LT(c.max_bound, 1e-4 * std::max(1.0, c.max_abs)) << what << ": the bound is too loose to catch a bug";
  return c;
}

// Prefill, decode, the last token alone and two interleaved sequences, each
// against the reference within its bound.
void check_variant(const Spec& s, const std::vector<int32_t>& tokens = kTokensA) {
  test::TempDir dir;
  write_model(s, dir.path());
  std::unique_ptr<rt::Model> m = rt::load_hf_model(dir.path());
  const reference::Weights w = reference::Weights::load(dir.path());

  // 1. Prefill.
  reference::CacheValues kv;
  const std::vector<float> pre = run_prefill(*m, tokens, rt::KvDType::F16, &kv);
  const reference::Check cp = expect_within_bound(pre, reference_logits(s, w, tokens, kv), "prefill");

  // 2. Only the last position wanting logits gives that row alone.
  {
    rt::KvCache cache = m->make_cache(rt::KvDType::F16, m->max_context());
    const int32_t seq = cache.add_sequence();
    rt::Batch b;
    for (size_t i = 0; i < tokens.size(); ++i) b.add(tokens[i], seq, static_cast<int64_t>(i), i + 1 == tokens.size());
    std::vector<float> last;
    m->forward(b, cache, last, pool());
    expect_within_bound(last, reference_logits(s, w, tokens, cached(*m, cache, seq, tokens.size())),
                        "want_logits on the last token only", tokens.size() - 1);
  }

  // 3. Incremental decode on one cache.
  const std::vector<float> dec = run_decode(*m, tokens, &kv);
  const reference::Check cd = expect_within_bound(dec, reference_logits(s, w, tokens, kv), "decode");

  // 4. Two sequences interleaved in one batch give each sequence's own logits.
  {
    const std::vector<float> alone_b = run_prefill(*m, kTokensB, rt::KvDType::F16, &kv);
    expect_within_bound(alone_b, reference_logits(s, w, kTokensB, kv), "sequence B alone");
    rt::KvCache cache = m->make_cache(rt::KvDType::F16, 2 * m->max_context());
    const int32_t sa = cache.add_sequence(), sb = cache.add_sequence();
    rt::Batch b;
    std::vector<std::pair<int, size_t>> order;  // (sequence 0/1, index)
    for (size_t i = 0; i < std::max(tokens.size(), kTokensB.size()); ++i) {
      if (i < kTokensB.size()) b.add(kTokensB[i], sb, static_cast<int64_t>(i), true), order.push_back({1, i});
      if (i < tokens.size()) b.add(tokens[i], sa, static_cast<int64_t>(i), true), order.push_back({0, i});
    }
    std::vector<float> both;
    m->forward(b, cache, both, pool());
    EXPECT_EQ(both.size(), (tokens.size() + kTokensB.size()) * static_cast<size_t>(s.vocab));
    std::vector<float> got_a, got_b;
    for (size_t r = 0; r < order.size() && (r + 1) * static_cast<size_t>(s.vocab) <= both.size(); ++r) {
      auto row = both.begin() + static_cast<std::ptrdiff_t>(r * static_cast<size_t>(s.vocab));
      (order[r].first == 0 ? got_a : got_b).insert((order[r].first == 0 ? got_a : got_b).end(), row, row + s.vocab);
    }
    expect_within_bound(got_a, reference_logits(s, w, tokens, cached(*m, cache, sa, tokens.size())),
                        "sequence A in a shared batch");
    expect_within_bound(got_b, reference_logits(s, w, kTokensB, cached(*m, cache, sb, kTokensB.size())),
                        "sequence B in a shared batch");

    // Continuing both sequences by one decode step each in one batch.
    rt::Batch next;
    next.add(7, sa, static_cast<int64_t>(tokens.size()), true);
    next.add(7, sb, static_cast<int64_t>(kTokensB.size()), true);
    std::vector<float> step;
    m->forward(next, cache, step, pool());
    step.resize(2 * static_cast<size_t>(s.vocab), NAN);  // a short result fails below instead of overrunning
    std::vector<int32_t> ta = tokens, tb = kTokensB;
    ta.push_back(7), tb.push_back(7);
    expect_within_bound(std::vector<float>(step.begin(), step.begin() + s.vocab),
                        reference_logits(s, w, ta, cached(*m, cache, sa, ta.size())),
                        "decode step of sequence A in a shared batch", ta.size() - 1);
    expect_within_bound(std::vector<float>(step.begin() + s.vocab, step.end()),
                        reference_logits(s, w, tb, cached(*m, cache, sb, tb.size())),
                        "decode step of sequence B in a shared batch", tb.size() - 1);
  }
  if (std::getenv("QF_ARCH_VERBOSE"))
    std::printf("  [%s] max|ref| %.3f  prefill: max diff %.3g, largest bound %.3g, worst %.3g of its bound; "
                "decode: worst %.3g\n",
                ::testing::UnitTest::GetInstance()->current_test_info()->name(), cp.max_abs, cp.max_diff,
                cp.max_bound, cp.worst_ratio, cd.worst_ratio);
}

// ---- variants ---------------------------------------------------------------

// hidden 64, 4 heads, 2 KV heads, head_dim 16; rope_theta and rms_norm_eps
// left out of config.json: the HF defaults 10000 and 1e-6 apply.
TEST(ModelArch, LlamaDefaultRope) {
  Spec s;
  check_variant(s);
}

TEST(ModelArch, LlamaLinearRope) {
  Spec s;
  s.theta = 100.0, s.eps = 1e-5;
  s.rope_type = "linear", s.rope_factor = 4.0;
  check_variant(s);
}

// theta 500, head_dim 16: wavelengths 6.3, 13.7, 29.8, 64.8, ... against
// original context 32 / high 4 (8) and / low 1 (32): one kept, two smoothed,
// five divided by the factor.
TEST(ModelArch, LlamaLlama3Rope) {
  Spec s;
  s.theta = 500.0;
  s.rope_type = "llama3", s.rope_factor = 8.0, s.low_freq_factor = 1.0, s.high_freq_factor = 4.0;
  s.original_max_pos = 32;
  check_variant(s);
}

TEST(ModelArch, LlamaAttentionAndMlpBias) {
  Spec s;
  s.attention_bias = true, s.mlp_bias = true;
  s.seed = 2;
  check_variant(s);
}

// hidden 32 with head_dim 16 given explicitly: q_dim 64 != hidden.
TEST(ModelArch, LlamaExplicitHeadDim) {
  Spec s;
  s.hidden = 32, s.head_dim = 16, s.write_head_dim = true, s.inter = 48;
  s.seed = 3;
  check_variant(s);
}

TEST(ModelArch, MistralSlidingWindow) {
  Spec s;
  s.model_type = "mistral";
  s.sliding_window = 5;
  s.seed = 4;
  check_variant(s);
}

// A window wider than the sequence changes nothing.
TEST(ModelArch, MistralWideWindowIsFullAttention) {
  Spec s;
  s.model_type = "mistral";
  s.sliding_window = 64;
  s.seed = 4;
  check_variant(s);
}

// qwen2: q/k/v biases, no o bias. sliding_window is set (as in the released
// configs) but use_sliding_window is false: every layer attends fully.
TEST(ModelArch, Qwen2Biases) {
  Spec s;
  s.model_type = "qwen2";
  s.sliding_window = 3, s.use_sliding_window = false, s.max_window_layers = 1;
  s.seed = 5;
  check_variant(s);
}

// use_sliding_window with max_window_layers 1: layer 0 full, layer 1 windowed.
TEST(ModelArch, Qwen2SlidingWindowUpperLayers) {
  Spec s;
  s.model_type = "qwen2";
  s.sliding_window = 4, s.use_sliding_window = true, s.max_window_layers = 1;
  s.seed = 6;
  check_variant(s);
}

// use_sliding_window with no max_window_layers key: transformers' Qwen2Config
// default max_window_layers = 28 applies, so both layers of this 2-layer model
// attend fully. DISABLED: the runtime windows every layer when the key is
// absent (Model::window treats a missing max_window_layers as 0). Enable once
// model_config.cpp defaults max_window_layers to 28 for qwen2/qwen3.
TEST(ModelArch, Qwen2SlidingWindowDefaultMaxWindowLayers) {
  Spec s;
  s.model_type = "qwen2";
  s.sliding_window = 4, s.use_sliding_window = true;
  s.seed = 16;
  check_variant(s);
}

// qwen3: per-head RMSNorm of q and k before RoPE; head_dim 16 with hidden 32.
TEST(ModelArch, Qwen3QkNorm) {
  Spec s;
  s.model_type = "qwen3";
  s.hidden = 32, s.head_dim = 16, s.write_head_dim = true, s.inter = 48;
  s.theta = 1000.0;
  s.seed = 7;
  check_variant(s);
}

TEST(ModelArch, Qwen3SlidingWindowUpperLayers) {
  Spec s;
  s.model_type = "qwen3";
  s.hidden = 32, s.head_dim = 16, s.write_head_dim = true, s.inter = 48;
  s.sliding_window = 3, s.use_sliding_window = true, s.max_window_layers = 1;
  s.seed = 8;
  check_variant(s);
}

// Embeddings of RMS ~6e-4: the first norm's eps (1e-6 when config.json has
// no rms_norm_eps, 1e-5 when it says so) changes its output by 2x and more.
TEST(ModelArch, RmsNormEpsDefaultAndExplicit) {
  Spec s;
  s.embed_scale = 1e-3;
  s.seed = 15;
  {
    SCOPED_TRACE("rms_norm_eps absent");
    check_variant(s);
  }
  s.eps = 1e-5;
  SCOPED_TRACE("rms_norm_eps 1e-5");
  check_variant(s);
}

// No lm_head.weight in the file; logits use the embedding.
TEST(ModelArch, TiedEmbeddings) {
  Spec s;
  s.tie = true;
  s.seed = 9;
  check_variant(s);
}

TEST(ModelArch, LlamaF16Weights) {
  Spec s;
  s.dtype = DType::F16;
  s.seed = 10;
  check_variant(s);
}

TEST(ModelArch, LlamaBf16Weights) {
  Spec s;
  s.dtype = DType::BF16;
  s.seed = 11;
  check_variant(s);
}

TEST(ModelArch, Qwen2Bf16Weights) {
  Spec s;
  s.model_type = "qwen2";
  s.dtype = DType::BF16;
  s.seed = 12;
  check_variant(s);
}

TEST(ModelArch, Qwen3F16WeightsTied) {
  Spec s;
  s.model_type = "qwen3";
  s.hidden = 32, s.head_dim = 8, s.write_head_dim = true, s.inter = 48;
  s.dtype = DType::F16, s.tie = true;
  s.seed = 13;
  check_variant(s);
}

// hidden 32, 4 heads: head_dim 8 derived from hidden / heads.
TEST(ModelArch, MistralHeadDim8F16) {
  Spec s;
  s.model_type = "mistral";
  s.hidden = 32, s.head_dim = 8, s.inter = 48;
  s.sliding_window = 5;
  s.dtype = DType::F16;
  s.seed = 14;
  check_variant(s);
}

// 40 positions: the KV cache spans three 16-position blocks and the attention
// splits the queries into several blocks, with and without a window.
TEST(ModelArch, LongerSequenceAcrossKvBlocks) {
  std::vector<int32_t> toks;
  Rng r(99);
  for (int i = 0; i < 40; ++i) toks.push_back(static_cast<int32_t>((r.next() + 1.0) * 32.0) % 64);
  for (int variant = 0; variant < 3; ++variant) {
    Spec s;
    s.seed = 20 + static_cast<uint32_t>(variant);
    if (variant == 1) s.model_type = "mistral", s.sliding_window = 7;
    if (variant == 2) s.rope_type = "llama3", s.theta = 500.0, s.rope_factor = 8.0, s.original_max_pos = 32;
    SCOPED_TRACE("variant " + std::to_string(variant));
    check_variant(s, toks);
  }
}

// ---- KV cache types ---------------------------------------------------------

// f8 (e4m3, scale 1) and int8 (per position and head absmax) caches against
// the f16 cache on the same model, as max abs logit difference over the f16
// logits' range (max - min). Measured: int8 0.0066 (llama) / 0.0041 (qwen3),
// f8 0.016 / 0.020; bounds 0.02 and 0.05, about 2.5-3x those.
TEST(ModelArch, QuantizedKvCacheStaysCloseToF16) {
  struct Case {
    const char* name;
    Spec s;
  };
  std::vector<Case> cases;
  {
    Spec s;
    s.seed = 30;
    cases.push_back({"llama", s});
    s.model_type = "qwen3", s.hidden = 32, s.head_dim = 16, s.write_head_dim = true, s.inter = 48, s.seed = 31;
    cases.push_back({"qwen3", s});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    test::TempDir dir;
    write_model(c.s, dir.path());
    auto m = rt::load_hf_model(dir.path());
    const std::vector<float> f16 = run_prefill(*m, kTokensA, rt::KvDType::F16);
    const auto [mn, mx] = std::minmax_element(f16.begin(), f16.end());
    const double range = static_cast<double>(*mx - *mn);
    ASSERT_GT(range, 1.0);
    const double d8 = max_diff(run_prefill(*m, kTokensA, rt::KvDType::I8), f16) / range;
    const double df8 = max_diff(run_prefill(*m, kTokensA, rt::KvDType::F8_E4M3), f16) / range;
    if (std::getenv("QF_ARCH_VERBOSE")) std::printf("  [%s] kv int8 %.4g  f8 %.4g (of range %.3f)\n", c.name, d8, df8, range);
    EXPECT_LT(d8, 0.02) << "int8 KV cache";
    EXPECT_LT(df8, 0.05) << "f8 KV cache";
    EXPECT_GT(d8, 0.0) << "the int8 cache must actually quantize";
    EXPECT_GT(df8, 0.0) << "the f8 cache must actually quantize";
  }
}

// ---- errors -----------------------------------------------------------------

TEST(ModelArch, MixtureOfExpertsConfigOverADenseCheckpointNamesTheRouter) {
  test::TempDir dir;
  Spec s;
  json c = config_json(s);
  c["model_type"] = "mixtral";
  c["num_local_experts"] = 4;
  c["num_experts_per_tok"] = 2;
  write_model(s, dir.path(), {}, {}, c);
  EXPECT_QF_ERROR(rt::load_hf_model(dir.path()), ErrorKind::NotFound, "model.layers.0.block_sparse_moe.gate.weight");
}

TEST(ModelArch, UnsupportedRopeScalingIsUnsupported) {
  for (const char* type : {"yarn", "dynamic", "longrope"}) {
    SCOPED_TRACE(type);
    test::TempDir dir;
    Spec s;
    json c = config_json(s);
    c["rope_scaling"] = {{"rope_type", type}, {"factor", 4.0}, {"original_max_position_embeddings", 32}};
    write_model(s, dir.path(), {}, {}, c);
    EXPECT_QF_ERROR(rt::load_hf_model(dir.path()), ErrorKind::Unsupported, type);
  }
}

TEST(ModelArch, UnsupportedModelTypeIsUnsupported) {
  test::TempDir dir;
  Spec s;
  json c = config_json(s);
  c["model_type"] = "gemma";
  write_model(s, dir.path(), {}, {}, c);
  EXPECT_QF_ERROR(rt::load_hf_model(dir.path()), ErrorKind::Unsupported, "gemma");
}

TEST(ModelArch, MissingTensorIsNotFoundNamingIt) {
  struct Case {
    std::string model_type, tensor;
  };
  const std::vector<Case> cases = {
      {"llama", "model.layers.1.mlp.up_proj.weight"},
      {"llama", "model.norm.weight"},
      {"llama", "lm_head.weight"},
      {"qwen2", "model.layers.0.self_attn.k_proj.bias"},
      {"qwen3", "model.layers.1.self_attn.k_norm.weight"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.tensor);
    test::TempDir dir;
    Spec s;
    s.model_type = c.model_type;
    write_model(s, dir.path(), {c.tensor});
    EXPECT_QF_ERROR(rt::load_hf_model(dir.path()), ErrorKind::NotFound, c.tensor);
  }
}

TEST(ModelArch, WrongShapeIsInvalidInputNamingTheTensor) {
  struct Case {
    std::string model_type, tensor;
    Shape shape;
    std::string fragment = "";  // what the message must contain (default: the tensor's name)
  };
  const std::vector<Case> cases = {
      {"llama", "model.layers.0.self_attn.q_proj.weight", {64, 48}},
      {"llama", "model.layers.1.self_attn.q_proj.weight", {48, 64}},
      {"llama", "model.layers.1.self_attn.o_proj.weight", {64, 48}},
      {"llama", "model.layers.0.mlp.down_proj.weight", {96, 64}},
      {"llama", "model.layers.0.input_layernorm.weight", {32}},
      {"llama", "lm_head.weight", {63, 64}},
      // make_dense_linear names the weight, not the bias, in this message:
      // "...v_proj.weight: bias shape [16] does not match weight [32, 64]".
      {"qwen2", "model.layers.0.self_attn.v_proj.bias", {16}, "model.layers.0.self_attn.v_proj"},
      {"qwen3", "model.layers.0.self_attn.q_norm.weight", {8}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.tensor);
    test::TempDir dir;
    Spec s;
    s.model_type = c.model_type;
    write_model(s, dir.path(), {}, {{c.tensor, c.shape}});
    EXPECT_QF_ERROR(rt::load_hf_model(dir.path()), ErrorKind::InvalidInput, c.fragment.empty() ? c.tensor : c.fragment);
  }
}

TEST(ModelArch, PositionsAndTokensOutOfRangeAreInvalidInput) {
  test::TempDir dir;
  Spec s;
  write_model(s, dir.path());
  auto m = rt::load_hf_model(dir.path());
  EXPECT_EQ(m->max_context(), 64);
  rt::KvCache cache = m->make_cache(rt::KvDType::F16, 2 * m->max_context());
  const int32_t seq = cache.add_sequence();
  std::vector<float> logits;
  {
    rt::Batch b;
    b.add(1, seq, 64, true);
    EXPECT_QF_ERROR(m->forward(b, cache, logits, pool()), ErrorKind::InvalidInput, "position 64");
  }
  {
    rt::Batch b;
    b.add(1, seq, 0, true);
    b.add(2, seq, 1000, true);
    EXPECT_QF_ERROR(m->forward(b, cache, logits, pool()), ErrorKind::InvalidInput, "position 1000");
  }
  {
    rt::Batch b;
    b.add(1, seq, -1, true);
    EXPECT_QF_ERROR(m->forward(b, cache, logits, pool()), ErrorKind::InvalidInput, "position -1");
  }
  {
    rt::Batch b;
    b.add(64, seq, 0, true);
    EXPECT_QF_ERROR(m->forward(b, cache, logits, pool()), ErrorKind::InvalidInput, "token id 64");
  }
  EXPECT_EQ(cache.length(seq), 0) << "a rejected batch stores nothing";
  // The last valid position runs (positions 0..63 in one prefill).
  std::vector<int32_t> toks;
  for (int i = 0; i < 64; ++i) toks.push_back((i * 37 + 5) % 64);
  rt::Batch b;
  for (int i = 0; i < 64; ++i) b.add(toks[static_cast<size_t>(i)], seq, i, i == 63);
  m->forward(b, cache, logits, pool());
  ASSERT_EQ(logits.size(), 64u);
  const reference::Weights w = reference::Weights::load(dir.path());
  expect_within_bound(logits, reference_logits(s, w, toks, cached(*m, cache, seq, toks.size())), "position 63",
                      toks.size() - 1);
}

}  // namespace
}  // namespace qf
