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

std::vector<float> logits_of(const rt::Model& m, const std::vector<int32_t>& toks, ThreadPool& pool) {
  rt::KvCache cache = m.make_cache(rt::KvDType::F16, static_cast<int64_t>(toks.size()));
  const int32_t seq = cache.add_sequence();
  rt::Batch b;
  for (size_t i = 0; i < toks.size(); ++i) b.add(toks[i], seq, static_cast<int64_t>(i), true);
  std::vector<float> logits;
  m.forward(b, cache, logits, pool);
  return logits;
}

// max |a - b| / max |a|
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i])), m = std::max(m, std::fabs(static_cast<double>(a[i])));
  return d / m;
}

std::vector<float> random_scales(std::mt19937& rng, int64_t n) {
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  std::vector<float> s(static_cast<size_t>(n));
  for (float& v : s) v = std::exp(u(rng));
  return s;
}

const Mapping kAll[] = {Mapping::AttnNormToQKV, Mapping::VToO, Mapping::FfnNormToGateUp, Mapping::UpToDown};

TEST(Smoothing, FoldingKeepsLogitsOnEveryMapping) {
  ThreadPool pool(2);
  struct Case {
    std::string type;
    int64_t heads, kv;
  };
  for (const Case& cs : {Case{"llama", 4, 4}, Case{"qwen2", 4, 4}, Case{"qwen2", 4, 2}}) {
    auto m = tiny_model(cs.type, cs.heads, cs.kv, 7);
    std::vector<int32_t> toks;
    for (int i = 0; i < 40; ++i) toks.push_back((i * 37 + 5) % 64);
    const std::vector<float> before = logits_of(*m, toks, pool);
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
        std::vector<float> sc = random_scales(rng, mapping_width(*m, mp));
        // v_proj's output goes through the f16 KV cache: V / s rounds to f16
        // differently from V (2^-11 relative), which alone moves the logits by
        // ~5e-4. Powers of two keep that rounding exact, so the fold itself
        // is what is checked (VToOWithAnyScales checks general scales).
        if (mp == Mapping::VToO)
          for (float& v : sc) v = std::exp2(std::round(std::log2(v)));
        apply_smoothing_scales(*m, li, mp, sc);
        ++applied;
      }
    EXPECT_EQ(applied, cs.heads == cs.kv ? 8 : 6) << cs.type;
    if (cs.type == "qwen2") {
      EXPECT_FALSE(m->weights().layers[0].v->bias_values().empty());
    }
    const std::vector<float> after = logits_of(*m, toks, pool);
    EXPECT_LT(rel_diff(before, after), 1e-4) << cs.type << " " << cs.heads << "/" << cs.kv;
  }
  auto m = tiny_model("llama", 4, 4, 1);
  EXPECT_QF_ERROR(apply_smoothing_scales(*m, 0, Mapping::UpToDown, std::vector<float>(3, 1.0f)), ErrorKind::InvalidInput,
                  "expected 96 scales");
  std::vector<float> bad(64, 1.0f);
  bad[5] = 0;
  EXPECT_QF_ERROR(apply_smoothing_scales(*m, 0, Mapping::AttnNormToQKV, bad), ErrorKind::InvalidInput, "positive");
}

TEST(Smoothing, VToOWithAnyScales) {
  ThreadPool pool(2);
  auto m = tiny_model("qwen2", 4, 4, 3);
  std::vector<int32_t> toks;
  for (int i = 0; i < 40; ++i) toks.push_back((i * 13 + 1) % 64);
  const std::vector<float> before = logits_of(*m, toks, pool);
  std::mt19937 rng(5);
  for (int64_t li = 0; li < 2; ++li) apply_smoothing_scales(*m, li, Mapping::VToO, random_scales(rng, 64));
  // Within the f16 rounding of the cached V (see above).
  EXPECT_LT(rel_diff(before, logits_of(*m, toks, pool)), 3e-3);
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
  // Scaling alone is exact in float.
  EXPECT_LT(mse(layer_output(*scaled, li, fc, pool), ref), 1e-9);
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
  // Only the folds happened: the float layer is unchanged.
  EXPECT_LT(mse(layer_output(*m, 1, fc, pool), ref), 1e-6 * mse(ref, std::vector<float>(ref.size(), 0.0f)));
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
  const std::vector<float> logits0 = logits_of(*m, fc.samples[0], pool);

  auto plain = rt::load_hf_model(fixture());
  replace_layer_linears(*plain, li, w8a8);
  const double mse_plain = mse(layer_output(*plain, li, fc, pool), ref);

  SmoothQuantOptions o;
  o.alpha = 0.5;
  smoothquant_layer(*m, li, fc.calib(), o, {}, pool);
  EXPECT_LT(rel_diff(logits0, logits_of(*m, fc.samples[0], pool)), 1e-4);
  EXPECT_LT(mse(layer_output(*m, li, fc, pool), ref), 1e-9);
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
