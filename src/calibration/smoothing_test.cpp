#include "calibration/smoothing.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
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

TEST(Smoothing, AwqLowersW4LayerError) {
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

}  // namespace
}  // namespace qf
