#include "calibration/smoothing.h"
#include "calibration/smoothing_internal.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include "calibration/calibration_data.h"
#include "core/tensor.h"
#include "formats/tokenizer/tokenizer.h"
#include "quantizers/rtn.h"
#include "runtime/cpu/kernels.h"
#include "cache_values.h"
#include "reference_llama.h"
#include "test_util.h"

namespace qf {
namespace {

using namespace qf::test;

std::filesystem::path fixture() { return source_dir() / "tests" / "data" / "fixture-llama"; }

std::shared_ptr<rt::Linear> random_linear(std::mt19937& rng, int64_t rows, int64_t cols, bool bias,
                                          const std::string& name) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const float a = std::sqrt(3.0f / static_cast<float>(cols));
  Tensor w = Tensor::zeros(DType::F32, {rows, cols});
  for (int64_t i = 0; i < rows * cols; ++i) w.mutable_data_as<float>()[i] = a * u(rng);
  if (!bias) return rt::make_dense_linear(w, nullptr, name);
  Tensor b = Tensor::zeros(DType::F32, {rows});
  for (int64_t i = 0; i < rows; ++i) b.mutable_data_as<float>()[i] = 0.5f * u(rng);
  return rt::make_dense_linear(w, &b, name);
}

// A small model with random weights, built in memory.
std::unique_ptr<rt::Model> tiny_model(const std::string& type, int64_t heads, int64_t kv_heads, uint32_t seed) {
  ModelConfig c;
  c.model_type = type;
  c.hidden_size = 64, c.num_hidden_layers = 2, c.num_attention_heads = heads, c.num_key_value_heads = kv_heads;
  c.head_dim = 16, c.intermediate_size = 96, c.vocab_size = 64, c.max_position_embeddings = 128;
  c.rms_norm_eps = 1e-6;
  const bool qkv_bias = type == "qwen2";
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  rt::ModelWeights w;
  w.embed = random_linear(rng, c.vocab_size, c.hidden_size, false, "embed");
  w.lm_head = random_linear(rng, c.vocab_size, c.hidden_size, false, "lm_head");
  w.final_norm.assign(static_cast<size_t>(c.hidden_size), 1.0f);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    rt::LayerWeights L;
    L.attn_norm.resize(static_cast<size_t>(c.hidden_size)), L.ffn_norm.resize(L.attn_norm.size());
    for (float& v : L.attn_norm) v = 1.0f + 0.3f * u(rng);
    for (float& v : L.ffn_norm) v = 1.0f + 0.3f * u(rng);
    L.q = random_linear(rng, c.q_dim(), c.hidden_size, qkv_bias, "q");
    L.k = random_linear(rng, c.kv_dim(), c.hidden_size, qkv_bias, "k");
    L.v = random_linear(rng, c.kv_dim(), c.hidden_size, qkv_bias, "v");
    L.o = random_linear(rng, c.hidden_size, c.q_dim(), false, "o");
    L.gate = random_linear(rng, c.intermediate_size, c.hidden_size, false, "gate");
    L.up = random_linear(rng, c.intermediate_size, c.hidden_size, false, "up");
    L.down = random_linear(rng, c.hidden_size, c.intermediate_size, false, "down");
    w.layers.push_back(std::move(L));
  }
  return std::make_unique<rt::Model>(c, std::move(w), "memory");
}

// Logits of one sequence; `kv_out` receives what the cache holds after it.
std::vector<float> logits_of(const rt::Model& m, const std::vector<int32_t>& toks, ThreadPool& pool,
                             reference::CacheValues* kv_out = nullptr) {
  rt::KvCache cache = m.make_cache(rt::KvDType::F16, static_cast<int64_t>(toks.size()));
  const int32_t seq = cache.add_sequence();
  rt::Batch b;
  for (size_t i = 0; i < toks.size(); ++i) b.add(toks[i], seq, static_cast<int64_t>(i), true);
  std::vector<float> logits;
  m.forward(b, cache, logits, pool);
  const ModelConfig& c = m.config();
  if (kv_out)
    *kv_out = cache_values(cache, seq, c.num_hidden_layers, c.num_key_value_heads, c.head_dim,
                           static_cast<int64_t>(toks.size()));
  return logits;
}

// The test reference (tests/unit/reference_llama.h) for a model built in
// memory by tiny_model (its config is the test's own) or the fixture (rope
// scaling none).
reference::Arch ref_arch(const rt::Model& m) {
  const ModelConfig& c = m.config();
  reference::Arch a;
  a.hidden = c.hidden_size, a.layers = c.num_hidden_layers, a.heads = c.num_attention_heads;
  a.kv_heads = c.num_key_value_heads, a.head_dim = c.head_dim, a.inter = c.intermediate_size, a.vocab = c.vocab_size;
  a.eps = c.rms_norm_eps;
  for (int64_t i = 0; i < a.head_dim / 2; ++i)
    a.inv_freq.push_back(std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(a.head_dim)));
  a.inv_freq_ulps = reference::rope_inv_freq_ulps(c.rope_theta, a.head_dim, false);
  return a;
}

// The model's current weights under their Hugging Face names.
reference::Weights ref_weights(const rt::Model& m) {
  const rt::ModelWeights& W = m.weights();
  reference::Weights w;
  w.set("model.embed_tokens.weight", W.embed->decode_all());
  w.set("lm_head.weight", W.lm_head->decode_all());
  w.set("model.norm.weight", W.final_norm);
  for (size_t l = 0; l < W.layers.size(); ++l) {
    const rt::LayerWeights& L = W.layers[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    w.set(p + "input_layernorm.weight", L.attn_norm);
    w.set(p + "post_attention_layernorm.weight", L.ffn_norm);
    const std::pair<const char*, const rt::Linear*> lins[] = {
        {"self_attn.q_proj", L.q.get()}, {"self_attn.k_proj", L.k.get()},  {"self_attn.v_proj", L.v.get()},
        {"self_attn.o_proj", L.o.get()}, {"mlp.gate_proj", L.gate.get()}, {"mlp.up_proj", L.up.get()},
        {"mlp.down_proj", L.down.get()}};
    for (const auto& [name, lin] : lins) {
      w.set(p + name + ".weight", lin->decode_all());
      if (!lin->bias_values().empty()) w.set(p + name + ".bias", lin->bias_values());
    }
  }
  return w;
}

// The fold is an identity: the reference on the folded weights, in exact
// arithmetic without a K/V cache, gives the logits of the original weights
// within the effect of the fold's own f32 rounding of the stored values.
// Every value of a folded layer (`prefix`: all layers, or "model.layers.N.")
// went through at most two f32 roundings, 2u relative; the reference's Monte
// Carlo samples propagate that through the layers. Returns the worst
// |folded - original| / bound over the logits (above 1: not an identity).
double fold_identity_ratio(const rt::Model& m, const reference::Weights& original, const std::vector<int32_t>& toks,
                           const std::string& prefix) {
  reference::Weights folded = ref_weights(m);
  for (const auto& [name, values] : folded.t)
    if (name.rfind(prefix, 0) == 0) folded.rel_err[name] = 2 * reference::kU32;
  reference::Options exact;
  exact.f32_noise = false;
  const reference::Result want = reference::forward(ref_arch(m), original, toks, exact);
  const reference::Result got = reference::forward(ref_arch(m), folded, toks, exact);
  double worst = 0;
  for (size_t t = 0; t < want.logits.size(); ++t)
    for (size_t j = 0; j < want.logits[t].size(); ++j) {
      const double d = std::fabs(want.logits[t][j] - got.logits[t][j]), bound = got.bound[t][j];
      worst = std::max(worst, bound > 0 ? d / bound : (d > 0 ? INFINITY : 0.0));
    }
  std::printf("  fold identity: worst %.3g of the bound from the fold's own rounding\n", worst);
  return worst;
}

// The runtime's logits (with what its cache held) against the reference on
// the same weights, within the reference's bound.
void expect_runtime_within_bound(const rt::Model& m, const std::vector<float>& got, const reference::CacheValues& kv,
                                 const std::vector<int32_t>& toks, const std::string& what) {
  reference::Options o;
  o.cache = &kv;
  const reference::Result ref = reference::forward(ref_arch(m), ref_weights(m), toks, o);
  EXPECT_EQ(ref.cache_errors, 0) << what << ": first " << ref.first_cache_error;
  const reference::Check c = reference::compare(got, ref);
  EXPECT_LE(c.worst_ratio, 1.0) << what << ": max diff " << c.max_diff << ", largest bound " << c.max_bound;
  std::printf("  %s: max diff %.3g, largest bound %.3g (max |logit| %.3g), worst %.3g of its bound\n", what.c_str(),
              c.max_diff, c.max_bound, c.max_abs, c.worst_ratio);
}

std::vector<float> random_scales(std::mt19937& rng, int64_t n) {
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  std::vector<float> s(static_cast<size_t>(n));
  for (float& v : s) v = std::exp(u(rng));
  return s;
}

const Mapping kAll[] = {Mapping::AttnNormToQKV, Mapping::VToO, Mapping::FfnNormToGateUp, Mapping::UpToDown};

// Folding scales into norms and Linears changes no logit in exact arithmetic.
// Three checks per model, against the double-precision reference
// (tests/unit/reference_llama.h):
//  1. the runtime on the original weights is within the reference's bound
//     (f32 rounding of every operation, the f16 K/V the runtime cached);
//  2. the runtime on the folded weights likewise;
//  3. the fold is an identity (fold_identity_ratio). This is where a wrong
//     fold shows: a scale off by 1e-3, or one channel left out, moves the
//     logits by thousands of times that bound (about 1e-7 of max |logit|).
// The scales are general (any positive value): 1 and 2 take the f16 rounding
// of the folded V (which differs from that of the original V) from the cache.
TEST(Smoothing, FoldingKeepsLogitsOnEveryMapping) {
  ThreadPool pool(2);
  struct Case {
    std::string type;
    int64_t heads, kv;
  };
  for (const Case& cs : {Case{"llama", 4, 4}, Case{"qwen2", 4, 4}, Case{"qwen2", 4, 2}}) {
    SCOPED_TRACE(cs.type + " " + std::to_string(cs.heads) + "/" + std::to_string(cs.kv));
    auto m = tiny_model(cs.type, cs.heads, cs.kv, 7);
    std::vector<int32_t> toks;
    for (int i = 0; i < 40; ++i) toks.push_back((i * 37 + 5) % 64);
    reference::CacheValues kv;
    const std::vector<float> before = logits_of(*m, toks, pool, &kv);
    expect_runtime_within_bound(*m, before, kv, toks, "original weights");
    const reference::Weights original = ref_weights(*m);
    std::mt19937 rng(11);
    int applied = 0;
    for (int64_t li = 0; li < m->config().num_hidden_layers; ++li)
      for (Mapping mp : kAll) {
        if (!mapping_applies(*m, mp)) {
          EXPECT_EQ(mp, Mapping::VToO);
          EXPECT_QF_ERROR(apply_smoothing_scales(*m, li, mp, random_scales(rng, mapping_width(*m, mp))),
                          ErrorKind::InvalidInput, "grouped-query");
          continue;
        }
        apply_smoothing_scales(*m, li, mp, random_scales(rng, mapping_width(*m, mp)));
        ++applied;
      }
    EXPECT_EQ(applied, cs.heads == cs.kv ? 8 : 6);
    if (cs.type == "qwen2") {
      EXPECT_FALSE(m->weights().layers[0].v->bias_values().empty());
    }
    const std::vector<float> after = logits_of(*m, toks, pool, &kv);
    expect_runtime_within_bound(*m, after, kv, toks, "folded weights");
    EXPECT_LE(fold_identity_ratio(*m, original, toks, "model.layers."), 1.0) << "the folded weights compute other logits";
  }
  auto m = tiny_model("llama", 4, 4, 1);
  EXPECT_QF_ERROR(apply_smoothing_scales(*m, 0, Mapping::UpToDown, std::vector<float>(3, 1.0f)), ErrorKind::InvalidInput,
                  "expected 96 scales");
  std::vector<float> bad(64, 1.0f);
  bad[5] = 0;
  EXPECT_QF_ERROR(apply_smoothing_scales(*m, 0, Mapping::AttnNormToQKV, bad), ErrorKind::InvalidInput, "positive");
}

// ---- the fixture: calibration set and layer inputs ----------------------------

struct FixtureCalib {
  std::vector<std::vector<int32_t>> samples;
  std::vector<std::vector<float>> inputs;  // entering layer `li`
  LayerCalib calib() const {
    LayerCalib c;
    c.samples = &samples;
    c.input = [this](size_t s) { return inputs[s]; };
    return c;
  }
};

// The inputs of layer li for the given samples (float model).
FixtureCalib layer_inputs(const rt::Model& m, int64_t li, std::vector<std::vector<int32_t>> samples, ThreadPool& pool) {
  FixtureCalib fc;
  fc.samples = std::move(samples);
  const int64_t h = m.config().hidden_size;
  for (const auto& s : fc.samples) {
    rt::KvCache cache = m.make_cache(rt::KvDType::F16, static_cast<int64_t>(s.size()));
    const int32_t seq = cache.add_sequence();
    rt::Batch b;
    for (size_t j = 0; j < s.size(); ++j) b.add(s[j], seq, static_cast<int64_t>(j), false);
    m.check_batch(b, cache);
    std::vector<float> x(s.size() * static_cast<size_t>(h));
    m.embed(b, x.data());
    for (int64_t l = 0; l < li; ++l) m.forward_layer(l, b, x.data(), cache, pool);
    fc.inputs.push_back(std::move(x));
  }
  return fc;
}

FixtureCalib fixture_calib(const rt::Model& m, int64_t li, int64_t n, int64_t len, ThreadPool& pool) {
  auto tok = load_tokenizer(fixture());
  CalibrationOptions o;
  o.num_samples = n, o.seq_len = len, o.seed = 1;
  return layer_inputs(m, li, load_calibration(source_dir() / "tests/data/text/calibration.txt", *tok, o), pool);
}

// Layer li's output on every sample, concatenated.
std::vector<float> layer_output(const rt::Model& m, int64_t li, const FixtureCalib& fc, ThreadPool& pool) {
  std::vector<float> out;
  for (size_t s = 0; s < fc.samples.size(); ++s) {
    const auto& toks = fc.samples[s];
    rt::KvCache cache = m.make_cache(rt::KvDType::F16, static_cast<int64_t>(toks.size()));
    const int32_t seq = cache.add_sequence();
    rt::Batch b;
    for (size_t j = 0; j < toks.size(); ++j) b.add(toks[j], seq, static_cast<int64_t>(j), false);
    cache.reserve(seq, static_cast<int64_t>(toks.size()));
    std::vector<float> x = fc.inputs[s];
    m.forward_layer(li, b, x.data(), cache, pool);
    out.insert(out.end(), x.begin(), x.end());
  }
  return out;
}

// A fold is exact in real arithmetic, so a layer's outputs before and after
// it differ by the runtime's rounding alone: f32 noise of ~1e-6 of their
// scale, and K/V elements whose f16 rounding goes the other way, each by one
// f16 step (2^-10 relative), which moves the attention outputs that read
// them by about as much. The mean square of the change is therefore at most
// about (2^-10)^2 of the outputs' mean square; measured: 1e-13 of it.
constexpr double kFoldMseFraction = 1.0 / (1024.0 * 1024.0);

double mse(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return s / static_cast<double>(a.size());
}

std::vector<float> decode(const rt::Linear& l) {
  std::vector<float> w(static_cast<size_t>(l.out_features() * l.in_features()));
  for (int64_t r = 0; r < l.out_features(); ++r) l.decode_row(r, w.data() + r * l.in_features());
  return w;
}

Tensor f32_tensor(const std::vector<float>& v, Shape shape) {
  Tensor t = Tensor::zeros(DType::F32, std::move(shape));
  std::copy(v.begin(), v.end(), t.mutable_data_as<float>());
  return t;
}

// Replaces every Linear of layer li by make(name, W, rows, cols, bias).
void replace_layer_linears(rt::Model& m, int64_t li, const TrialLinearFn& make) {
  rt::LayerWeights& L = m.mutable_layer(li);
  for (auto* lin : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) {
    const std::vector<float> w = decode(**lin);
    *lin = make("x", w.data(), (*lin)->out_features(), (*lin)->in_features(), (*lin)->bias_values());
  }
}

const QuantScheme kW4 = QuantScheme::make(4, true, QuantStrategy::Group, 128, DType::F16);

std::vector<float> rtn_w4(const std::string&, const float* w, int64_t rows, int64_t cols) {
  return quantize_rtn(w, rows, cols, kW4).dequantize();
}

std::shared_ptr<rt::Linear> w4_dense(const std::string& name, const float* w, int64_t rows, int64_t cols,
                                     const std::vector<float>& bias) {
  const std::vector<float> q = rtn_w4(name, w, rows, cols);
  Tensor t = f32_tensor(q, {rows, cols});
  if (bias.empty()) return rt::make_dense_linear(t, nullptr, name);
  Tensor b = f32_tensor(bias, {rows});
  return rt::make_dense_linear(t, &b, name);
}

// The Gram-matrix loss of a weight change d is the sum over the inputs x of
// |d x|^2, the squared change of the Linear's outputs: checked against
// running the inputs, in double. (f32 products and a Gram matrix summed in
// f32 chunks: a relative error far below the search's differences.)
TEST(Smoothing, GramLossIsTheSquaredOutputChange) {
  ThreadPool pool(2);
  const int64_t n = 700, rows = 37, cols = 96;
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * cols)), d(static_cast<size_t>(rows * cols));
  for (float& v : x) v = g(rng) * (1.0f + static_cast<float>(rng() % 4));
  for (float& v : d) v = g(rng) * 0.01f;
  HessianAccumulator h(cols);
  h.add(x.data(), n, cols, pool);
  h.finish(&pool);
  const std::vector<float> gram = smoothing_detail::gram_of(h);
  double want = 0;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double p = 0;
      for (int64_t c = 0; c < cols; ++c)
        p += static_cast<double>(x[static_cast<size_t>(t * cols + c)]) * d[static_cast<size_t>(r * cols + c)];
      want += p * p;
    }
  const double got = smoothing_detail::gram_quadratic(d.data(), rows, cols, gram.data(), pool);
  EXPECT_NEAR(got / want, 1.0, 1e-4);
}

TEST(Smoothing, AwqLowersW4LayerError) {
  for (const AwqLoss loss : {AwqLoss::Linear, AwqLoss::Module}) {
    SCOPED_TRACE(loss == AwqLoss::Linear ? "loss: linear" : "loss: module");
    ThreadPool pool(2);
    const int64_t li = 1;
    auto m = rt::load_hf_model(fixture());
    const FixtureCalib fc = fixture_calib(*m, li, 16, 128, pool);
    const std::vector<float> ref = layer_output(*m, li, fc, pool);

    // Plain RTN of the untouched layer.
    auto plain = rt::load_hf_model(fixture());
    replace_layer_linears(*plain, li, w4_dense);
    const double mse_rtn = mse(layer_output(*plain, li, fc, pool), ref);

    AwqOptions o;
    o.group_size = 128;
    o.apply_clip = false;
    o.loss = loss;
    auto scaled = rt::load_hf_model(fixture());
    const SmoothingReport r1 = awq_layer(*scaled, li, fc.calib(), rtn_w4, o, pool);
    // Scaling alone changes the layer only by rounding.
    EXPECT_LT(mse(layer_output(*scaled, li, fc, pool), ref), kFoldMseFraction * mse(ref, std::vector<float>(ref.size(), 0.0f)));
    replace_layer_linears(*scaled, li, w4_dense);
    const double mse_scaled = mse(layer_output(*scaled, li, fc, pool), ref);

    o.apply_clip = true;
    const SmoothingReport r2 = awq_layer(*m, li, fc.calib(), rtn_w4, o, pool);
    replace_layer_linears(*m, li, w4_dense);
    const double mse_awq = mse(layer_output(*m, li, fc, pool), ref);

    for (const auto& l : r2.lines) std::printf("  %s\n", l.c_str());
    std::printf("  layer %lld output MSE, w4 g128 RTN: %.6g, AWQ scales: %.6g, AWQ scales + clip: %.6g\n",
                static_cast<long long>(li), mse_rtn, mse_scaled, mse_awq);
    ASSERT_EQ(r1.entries.size(), 3u);  // GQA: no v_proj -> o_proj
    for (const auto& e : r1.entries) EXPECT_LE(e.loss_after, e.loss_before) << e.what;
    EXPECT_LT(mse_scaled, mse_rtn);
    EXPECT_LT(mse_awq, mse_rtn);
    EXPECT_EQ(r2.lines.size(), 3u + 5u);
  }
}

TEST(Smoothing, AwqIsThreadCountIndependentAndSkipsUnquantized) {
  const int64_t li = 0;
  ThreadPool p1(1), p2(2);
  auto a = rt::load_hf_model(fixture()), b = rt::load_hf_model(fixture());
  const FixtureCalib fc = fixture_calib(*a, li, 4, 64, p1);
  AwqOptions o;
  o.n_grid = 5;
  o.clip_n_sample_tokens = 64;
  // Only the MLP is quantized: the attention mappings are left alone.
  FakeQuantFn fq = [](const std::string& name, const float* w, int64_t rows, int64_t cols) {
    if (name.find("mlp.") == std::string::npos) return std::vector<float>{};
    return rtn_w4(name, w, rows, cols);
  };
  const SmoothingReport r = awq_layer(*a, li, fc.calib(), fq, o, p1);
  awq_layer(*b, li, fc.calib(), fq, o, p2);
  EXPECT_EQ(r.entries[0].ratio, -1);
  EXPECT_EQ(a->weights().layers[0].q->format(), "f16");  // untouched
  EXPECT_EQ(a->weights().layers[0].down->format(), "f32");
  const rt::LayerWeights &la = a->weights().layers[0], &lb = b->weights().layers[0];
  EXPECT_EQ(la.ffn_norm, lb.ffn_norm);
  for (auto p : {&rt::LayerWeights::gate, &rt::LayerWeights::up, &rt::LayerWeights::down})
    EXPECT_EQ(decode(*(la.*p)), decode(*(lb.*p)));
}

TEST(Smoothing, AwqSearchesAllFourMappingsWithoutGqa) {
  ThreadPool pool(2);
  auto m = tiny_model("llama", 4, 4, 9);
  std::vector<std::vector<int32_t>> samples;
  for (int s = 0; s < 4; ++s) {
    samples.emplace_back();
    for (int i = 0; i < 48; ++i) samples.back().push_back((i * (7 + 2 * s) + s) % 64);
  }
  const FixtureCalib fc = layer_inputs(*m, 1, samples, pool);
  const std::vector<float> ref = layer_output(*m, 1, fc, pool);
  const QuantScheme w3 = QuantScheme::make(3, true, QuantStrategy::Group, 32, DType::F32);
  FakeQuantFn fq = [&](const std::string&, const float* w, int64_t rows, int64_t cols) {
    return quantize_rtn(w, rows, cols, w3).dequantize();
  };
  AwqOptions o;
  o.group_size = 32;
  o.apply_clip = false;
  const SmoothingReport r = awq_layer(*m, 1, fc.calib(), fq, o, pool);
  ASSERT_EQ(r.entries.size(), 4u);
  EXPECT_EQ(r.entries[1].what, "v_proj->o_proj");
  for (const auto& e : r.entries) {
    EXPECT_LE(e.loss_after, e.loss_before) << e.what;
    EXPECT_GT(e.loss_before, 0) << e.what;
  }
  // Only the folds happened: the float layer is unchanged but for rounding.
  EXPECT_LT(mse(layer_output(*m, 1, fc, pool), ref), kFoldMseFraction * mse(ref, std::vector<float>(ref.size(), 0.0f)));
  o.group_size = 48;  // does not divide 64
  EXPECT_QF_ERROR(awq_layer(*m, 1, fc.calib(), fq, o, pool), ErrorKind::InvalidInput, "does not divide");
}

// ---- SmoothQuant ------------------------------------------------------------

std::shared_ptr<rt::Linear> w8a8(const std::string& name, const float* w, int64_t rows, int64_t cols,
                                 const std::vector<float>& bias) {
  const QuantScheme s = QuantScheme::make(8, true, QuantStrategy::Channel, 0, DType::F32);
  const QuantizedTensor q = quantize_rtn(w, rows, cols, s);
  ActQuantParams act;
  act.scheme = ActivationScheme::int8_token();
  if (bias.empty()) return rt::make_quantized_linear(q, &act, nullptr, name);
  Tensor b = f32_tensor(bias, {rows});
  return rt::make_quantized_linear(q, &act, &b, name);
}

TEST(Smoothing, SmoothQuantFoldsExactlyAndHelpsW8A8) {
  ThreadPool pool(2);
  const int64_t li = 1;
  auto m = rt::load_hf_model(fixture());
  const FixtureCalib fc = fixture_calib(*m, li, 8, 128, pool);
  const std::vector<float> ref = layer_output(*m, li, fc, pool);
  const reference::Weights original = ref_weights(*m);

  auto plain = rt::load_hf_model(fixture());
  replace_layer_linears(*plain, li, w8a8);
  const double mse_plain = mse(layer_output(*plain, li, fc, pool), ref);

  SmoothQuantOptions o;
  o.alpha = 0.5;
  smoothquant_layer(*m, li, fc.calib(), o, {}, pool);
  // The fold is an identity on the logits (the first 16 tokens of a sample:
  // the reference's cost grows with their number), and changes the layer's
  // outputs only by rounding.
  const std::vector<int32_t> prefix(fc.samples[0].begin(), fc.samples[0].begin() + 16);
  EXPECT_LE(fold_identity_ratio(*m, original, prefix, "model.layers." + std::to_string(li) + "."), 1.0);
  EXPECT_LT(mse(layer_output(*m, li, fc, pool), ref), kFoldMseFraction * mse(ref, std::vector<float>(ref.size(), 0.0f)));
  replace_layer_linears(*m, li, w8a8);
  const double mse_05 = mse(layer_output(*m, li, fc, pool), ref);

  o.search = true;
  auto s = rt::load_hf_model(fixture());
  const SmoothingReport r = smoothquant_layer(*s, li, fc.calib(), o, w8a8, pool);
  ASSERT_EQ(r.entries.size(), 1u);
  replace_layer_linears(*s, li, w8a8);
  const double mse_search = mse(layer_output(*s, li, fc, pool), ref);
  std::printf("  %s\n", r.lines[0].c_str());
  std::printf("  layer %lld output MSE, W8A8: unsmoothed %.6g, alpha 0.5 %.6g, searched alpha %.2f %.6g\n",
              static_cast<long long>(li), mse_plain, mse_05, r.entries[0].ratio, mse_search);
  EXPECT_LT(mse_05, mse_plain);
  EXPECT_LE(mse_search, mse_05 * (1 + 1e-9));
  EXPECT_NEAR(r.entries[0].loss_after, mse_search, 1e-6 * mse_search + 1e-12);
}

// ---- mixture-of-experts layers -----------------------------------------------

std::filesystem::path moe_tiny(const std::string& arch) { return source_dir() / "tests" / "data" / "moe-tiny" / arch; }

// Token-slots per expert of every sparse layer.
struct SlotCounter : rt::LinearObserver {
  std::map<int64_t, std::vector<int64_t>> slots;
  void observe(int64_t, Slot, const float*, int64_t, int64_t) override {}
  void observe_routing(int64_t layer, const int32_t* e, const float*, int64_t n, int64_t k) override {
    for (int64_t i = 0; i < n * k; ++i) {
      auto& s = slots[layer];
      if (s.size() <= static_cast<size_t>(e[i])) s.resize(static_cast<size_t>(e[i]) + 1);
      ++s[static_cast<size_t>(e[i])];
    }
  }
};

std::vector<float> moe_logits(const rt::Model& m, const std::vector<int32_t>& toks, ThreadPool& pool, SlotCounter* obs) {
  rt::KvCache cache = m.make_cache(rt::KvDType::F16, static_cast<int64_t>(toks.size()));
  const int32_t seq = cache.add_sequence();
  rt::Batch b;
  for (size_t i = 0; i < toks.size(); ++i) b.add(toks[i], seq, static_cast<int64_t>(i), true);
  std::vector<float> logits;
  m.forward(b, cache, logits, pool, obs);
  return logits;
}

// The largest |a - b| over max(1, max |a|).
double relative_max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 1, d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(a[i])));
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return d / scale;
}

std::vector<int32_t> moe_tokens(int64_t vocab, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab)));
  return t;
}

int64_t expert_width(const rt::Model& m, int64_t li, int64_t e) {
  const rt::MoeWeights& moe = m.weights().layers[static_cast<size_t>(li)].moe;
  return (e == rt::kSharedExpert ? moe.shared : moe.experts[static_cast<size_t>(e)]).down->in_features();
}

class SmoothingMoe : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(moe_tiny(GetParam()) / "model.safetensors"))
      GTEST_SKIP() << moe_tiny(GetParam()) << " is absent";
    model_ = rt::load_hf_model(moe_tiny(GetParam()));
  }
  std::vector<int64_t> experts() const {
    std::vector<int64_t> e;
    for (int64_t i = 0; i < model_->config().num_experts; ++i) e.push_back(i);
    if (model_->config().shared_expert_intermediate_size > 0) e.push_back(rt::kSharedExpert);
    return e;
  }
  std::unique_ptr<rt::Model> model_;
};

// Folding scales into a sparse layer keeps its function: the post-attention
// norm's scales reach the router (and the shared-expert gate) as well as
// every expert, so every token goes to the same experts, and each expert's
// up -> down fold is its own. In exact arithmetic nothing changes; the
// runtime differs by the f32 rounding of the folded weights and the f16 K/V
// values of later layers that round the other way: moe_test.cpp's bound of
// 1e-3 of the logit scale covers that. A router left unscaled moves tokens
// to other experts and logits by their own order (checked below, so the
// test can fail).
TEST_P(SmoothingMoe, FoldingKeepsLogitsAndRouting) {
  ThreadPool pool(2);
  const ModelConfig& c = model_->config();
  const std::vector<int32_t> toks = moe_tokens(c.vocab_size, 64, 3);
  SlotCounter before_slots, after_slots;
  const std::vector<float> before = moe_logits(*model_, toks, pool, &before_slots);
  std::vector<std::shared_ptr<rt::Linear>> routers;
  std::mt19937 rng(5);
  int folds = 0;
  for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
    routers.push_back(model_->weights().layers[static_cast<size_t>(li)].moe.router);
    apply_smoothing_scales(*model_, li, Mapping::AttnNormToQKV, random_scales(rng, c.hidden_size));
    apply_smoothing_scales(*model_, li, Mapping::FfnNormToGateUp, random_scales(rng, c.hidden_size));
    ++folds;
    if (!c.moe_layer(li)) {
      apply_smoothing_scales(*model_, li, Mapping::UpToDown, random_scales(rng, c.intermediate_size));
      continue;
    }
    for (int64_t e : experts()) {
      apply_smoothing_scales(*model_, li, Mapping::UpToDown, random_scales(rng, expert_width(*model_, li, e)), e);
      ++folds;
    }
  }
  const std::vector<float> after = moe_logits(*model_, toks, pool, &after_slots);
  const double d = relative_max_diff(before, after);
  std::printf("  %d MLP folds: logits differ by %.3g of their scale\n", folds, d);
  EXPECT_EQ(before_slots.slots, after_slots.slots) << "the folded router routes otherwise";
  EXPECT_LE(d, 1e-3);

  // The same folds with each router put back unscaled.
  for (int64_t li = 0; li < c.num_hidden_layers; ++li)
    if (c.moe_layer(li)) model_->mutable_layer(li).moe.router = routers[static_cast<size_t>(li)];
  SlotCounter unscaled_slots;
  const std::vector<float> unscaled = moe_logits(*model_, toks, pool, &unscaled_slots);
  EXPECT_TRUE(unscaled_slots.slots != before_slots.slots || relative_max_diff(before, unscaled) > 1e-3)
      << "an unscaled router went unnoticed";
}

TEST_P(SmoothingMoe, ASparseUpToDownFoldNamesOneExpert) {
  const ModelConfig& c = model_->config();
  int64_t sparse = -1, dense = -1;
  for (int64_t li = 0; li < c.num_hidden_layers; ++li) (c.moe_layer(li) ? sparse : dense) = li;
  ASSERT_GE(sparse, 0);
  const std::vector<float> s(static_cast<size_t>(expert_width(*model_, sparse, 0)), 1.0f);
  EXPECT_QF_ERROR(apply_smoothing_scales(*model_, sparse, Mapping::UpToDown, s), ErrorKind::InvalidInput,
                  "needs one of its experts (0 to " + std::to_string(c.num_experts - 1));
  EXPECT_QF_ERROR(apply_smoothing_scales(*model_, sparse, Mapping::UpToDown, s), ErrorKind::InvalidInput,
                  "no expert was given");
  EXPECT_QF_ERROR(apply_smoothing_scales(*model_, sparse, Mapping::UpToDown, s, c.num_experts), ErrorKind::InvalidInput,
                  "expert " + std::to_string(c.num_experts) + " was given");
  if (c.shared_expert_intermediate_size == 0)
    EXPECT_QF_ERROR(apply_smoothing_scales(*model_, sparse, Mapping::UpToDown, s, rt::kSharedExpert),
                    ErrorKind::InvalidInput, "the shared expert was given, which this layer has not");
  EXPECT_QF_ERROR(apply_smoothing_scales(*model_, sparse, Mapping::UpToDown, std::vector<float>(3, 1.0f), 0),
                  ErrorKind::InvalidInput, "expected " + std::to_string(s.size()) + " scales");
  EXPECT_QF_ERROR(apply_smoothing_scales(*model_, sparse, Mapping::FfnNormToGateUp,
                                         std::vector<float>(static_cast<size_t>(c.hidden_size), 1.0f), 0),
                  ErrorKind::InvalidInput, "only a sparse layer's up -> down");
  if (dense >= 0)
    EXPECT_QF_ERROR(apply_smoothing_scales(*model_, dense, Mapping::UpToDown,
                                           std::vector<float>(static_cast<size_t>(c.intermediate_size), 1.0f), 0),
                    ErrorKind::InvalidInput, "only a sparse layer's up -> down");
}

std::vector<std::vector<int32_t>> moe_samples(int64_t vocab, int n, int len, uint32_t seed) {
  std::vector<std::vector<int32_t>> s;
  for (int i = 0; i < n; ++i) s.push_back(moe_tokens(vocab, len, seed + static_cast<uint32_t>(i)));
  return s;
}

// W4 g16 (the tiny models' widths: 64, 48, 80, 128).
std::vector<float> rtn_w4_g16(const std::string&, const float* w, int64_t rows, int64_t cols) {
  return quantize_rtn(w, rows, cols, QuantScheme::make(4, true, QuantStrategy::Group, 16, DType::F32)).dequantize();
}

// AWQ on a sparse layer: the norm -> router/experts search, one up -> down
// search per expert the calibration reaches, a line for each it does not,
// and the clip search on every expert's Linears; the float layer is
// unchanged but for rounding, and no search makes its module worse.
TEST_P(SmoothingMoe, AwqSearchesEveryExpertTheCalibrationReaches) {
  ThreadPool pool(2);
  const ModelConfig& c = model_->config();
  const int64_t li = 0;
  ASSERT_TRUE(c.moe_layer(li));
  const FixtureCalib fc = layer_inputs(*model_, li, moe_samples(c.vocab_size, 4, 48, 21), pool);
  const std::vector<float> ref = layer_output(*model_, li, fc, pool);
  AwqOptions o;
  o.group_size = 16;
  o.n_grid = 10;
  const SmoothingReport r = awq_layer(*model_, li, fc.calib(), rtn_w4_g16, o, pool);
  for (const auto& l : r.lines) std::printf("  %s\n", l.c_str());
  ASSERT_GE(r.entries.size(), 2u);
  EXPECT_EQ(r.entries[0].what, "input_layernorm->q,k,v");
  EXPECT_EQ(r.entries[1].what, "post_attention_layernorm->router,experts' gate,up");
  size_t searched = 0, unreached = 0, clipped = 0;
  for (int64_t e : experts()) {
    const std::string label = (e == rt::kSharedExpert ? std::string("shared expert") : "expert " + std::to_string(e)) +
                              " up_proj->down_proj";
    bool found = false;
    for (const auto& en : r.entries) found = found || en.what == label;
    searched += found;
    for (const auto& l : r.lines) unreached += l.find(label + ": no calibration token reaches it") != std::string::npos;
  }
  for (const rt::LayerLinearId& id : rt::layer_linears(c, li))
    for (const auto& l : r.lines) clipped += id.expert != rt::kNoExpert && l.rfind("model.layers.0." + id.name + ": clip", 0) == 0;
  EXPECT_EQ(searched + unreached, experts().size());
  EXPECT_GT(searched, 0u);
  EXPECT_EQ(clipped, 3 * searched) << "each reached expert's three Linears are clipped";
  size_t improved = 0;
  for (const auto& e : r.entries) {
    EXPECT_LE(e.loss_after, e.loss_before) << e.what;
    EXPECT_GT(e.loss_before, 0) << e.what;
    improved += e.what.find("up_proj->down_proj") != std::string::npos && e.loss_after < e.loss_before;
  }
  EXPECT_GT(improved, 0u) << "no expert's up -> down search beat leaving it unscaled";
  // Scales and clipping only: the float layer (its clipped weights aside) is
  // close to the original. Clipping changes weights, so compare a run with
  // the clip off for the rounding-only bound.
  auto scaled = rt::load_hf_model(moe_tiny(GetParam()));
  o.apply_clip = false;
  awq_layer(*scaled, li, fc.calib(), rtn_w4_g16, o, pool);
  EXPECT_LT(mse(layer_output(*scaled, li, fc, pool), ref), kFoldMseFraction * mse(ref, std::vector<float>(ref.size(), 0.0f)));
}

// Two tokens reach at most 2k experts; with moe_calibrate_all_experts every
// expert's search sees both.
TEST_P(SmoothingMoe, AwqReportsUnreachedExpertsAndSearchesAllWhenAsked) {
  ThreadPool pool(2);
  const ModelConfig& c = model_->config();
  const FixtureCalib fc = layer_inputs(*model_, 0, moe_samples(c.vocab_size, 1, 2, 8), pool);
  AwqOptions o;
  o.group_size = 16, o.n_grid = 4, o.apply_clip = false;
  auto count = [&](const SmoothingReport& r) {
    std::pair<size_t, size_t> n{0, 0};  // searched experts, unreached ones
    for (const auto& e : r.entries) n.first += e.what.find("up_proj->down_proj") != std::string::npos;
    for (const auto& l : r.lines) n.second += l.find("no calibration token reaches it") != std::string::npos;
    return n;
  };
  const auto routed = count(awq_layer(*model_, 0, fc.calib(), rtn_w4_g16, o, pool));
  EXPECT_EQ(routed.first + routed.second, experts().size());
  if (2 * c.num_experts_per_tok < c.num_experts) {
    EXPECT_GT(routed.second, 0u);  // two tokens cannot reach them all
  }
  EXPECT_LE(routed.first, static_cast<size_t>(2 * c.num_experts_per_tok) + (experts().size() - c.num_experts));
  auto all = rt::load_hf_model(moe_tiny(GetParam()));
  o.moe_calibrate_all_experts = true;
  const auto every = count(awq_layer(*all, 0, fc.calib(), rtn_w4_g16, o, pool));
  EXPECT_EQ(every.first, experts().size());
  EXPECT_EQ(every.second, 0u);
}

// SmoothQuant on a sparse layer folds exactly (the router compensated) and
// its alpha search, over the layer with every expert in W8A8, does no worse
// than leaving the layer unsmoothed.
TEST_P(SmoothingMoe, SmoothQuantFoldsIntoTheRouterAndExperts) {
  ThreadPool pool(2);
  const ModelConfig& c = model_->config();
  const int64_t li = 0;
  const FixtureCalib fc = layer_inputs(*model_, li, moe_samples(c.vocab_size, 3, 48, 31), pool);
  const std::vector<float> ref = layer_output(*model_, li, fc, pool);
  const std::vector<float> router = model_->weights().layers[li].moe.router->decode_all();
  SmoothQuantOptions o;
  o.alpha = 0.5;
  smoothquant_layer(*model_, li, fc.calib(), o, {}, pool);
  EXPECT_NE(model_->weights().layers[li].moe.router->decode_all(), router) << "the router was not scaled";
  EXPECT_LT(mse(layer_output(*model_, li, fc, pool), ref), kFoldMseFraction * mse(ref, std::vector<float>(ref.size(), 0.0f)));
  auto s = rt::load_hf_model(moe_tiny(GetParam()));
  o.search = true;
  const SmoothingReport r = smoothquant_layer(*s, li, fc.calib(), o, w8a8, pool);
  ASSERT_EQ(r.entries.size(), 1u);
  std::printf("  %s\n", r.lines[0].c_str());
  EXPECT_TRUE(std::isfinite(r.entries[0].loss_after));
  EXPECT_LE(r.entries[0].loss_after, r.entries[0].loss_before);
}

INSTANTIATE_TEST_SUITE_P(Architectures, SmoothingMoe, ::testing::Values("mixtral", "qwen2_moe", "qwen3_moe"));

}  // namespace
}  // namespace qf
