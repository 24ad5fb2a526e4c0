#include "mixed/gguf_search.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/thread_pool.h"
#include "eval/perplexity.h"
#include "formats/gguf/gguf.h"
#include "formats/tokenizer/tokenizer.h"
#include "mixed/gguf_linears.h"
#include "eval/probe_kl.h"
#include "quantizers/kquants.h"
#include "runtime/linear.h"
#include "runtime/model.h"
#include "test_util.h"

namespace qf::mixed {
namespace {
using namespace qf::test;

const std::filesystem::path kFixture = source_dir() / "tests/data/fixture-llama";
const std::filesystem::path kCalib = source_dir() / "tests/data/text/calibration.txt";

std::vector<eval::Span> spans(const rt::Model& m, int64_t n, int64_t ctx) {
  std::unique_ptr<Tokenizer> tok = load_tokenizer(kFixture);
  eval::PplOptions o;
  o.mode = eval::PplMode::Windows;
  o.ctx = ctx;
  o.max_spans = n;
  return eval::make_spans(*tok, read_text_file(kCalib), o, m.max_context(), "calibration.txt");
}

// The model with one tensor's Linear replaced by its Q2_K copy.
rt::Model with_q2k(const rt::Model& base, const std::string& name) {
  rt::Model m = base;
  const TensorLinears tl = tensor_linears(m, name);
  const rt::Linear& l = **tl.slots[0];
  const std::vector<float> w = l.decode_all();
  const size_t rb = kquants::row_size(ggml_type::Q2_K, l.in_features());
  auto data = std::make_shared<std::vector<uint8_t>>(rb * static_cast<size_t>(l.out_features()));
  kquants::quantize_rows(ggml_type::Q2_K, w.data(), data->data(), l.out_features(), l.in_features(), nullptr);
  *tl.slots[0] = rt::make_block_linear(ggml_type::Q2_K, data->data(), l.out_features(), l.in_features(), data, nullptr, name);
  return m;
}

TEST(MixedProbe, KlFromStoredLayerInputsEqualsTheFullEvaluation) {
  ThreadPool pool(2);
  const std::unique_ptr<rt::Model> base = rt::load_hf_model(kFixture);
  const std::vector<eval::Span> sp = spans(*base, 2, 128);
  eval::ProbeRunner runner(*base, sp, pool);
  EXPECT_EQ(runner.tokens_scored(), 2 * 127);
  EXPECT_EQ(runner.kl(*base, 0), 0.0);
  for (const std::string name : {"blk.2.ffn_down.weight", "output.weight", "token_embd.weight"}) {
    const rt::Model m = with_q2k(*base, name);
    const TensorLinears tl = tensor_linears(const_cast<rt::Model&>(m), name);
    const double from_layer = runner.kl(m, tl.first_layer), from_start = runner.kl(m, 0);
    eval::PplOptions o;
    o.mode = eval::PplMode::Windows;
    const eval::EvalResult r = eval::evaluate(m, base.get(), sp, o, pool);
    ASSERT_EQ(r.tokens_scored, runner.tokens_scored());
    EXPECT_GT(from_layer, 1e-5) << name;
    // Same floats up to the order of the sums (f32 log-softmax against evaluate's).
    EXPECT_NEAR(from_layer, from_start, 1e-9 + 1e-6 * from_start) << name;
    EXPECT_NEAR(from_layer, r.kld_mean, 1e-4 * r.kld_mean) << name;
  }
}

TEST(MixedProbe, TensorLinearsNameTheRuntimeMatrices) {
  std::unique_ptr<rt::Model> m = rt::load_hf_model(kFixture);
  rt::ModelWeights& w = m->mutable_weights();
  EXPECT_EQ(tensor_linears(*m, "blk.1.attn_v.weight").slots.front(), &w.layers[1].v);
  EXPECT_EQ(tensor_linears(*m, "blk.3.ffn_down.weight").first_layer, 3);
  EXPECT_EQ(tensor_linears(*m, "output.weight").first_layer, 4);
  EXPECT_TRUE(tensor_linears(*m, "token_embd.weight").embedding);
  EXPECT_QF_ERROR(tensor_linears(*m, "blk.4.attn_q.weight"), ErrorKind::Unsupported, "no matrix");
  EXPECT_QF_ERROR(tensor_linears(*m, "blk.0.ffn_gate_exps.weight"), ErrorKind::Unsupported, "no matrix");
}

TEST(MixedGguf, ExactPlanFitsAndBeatsEveryPresetUnderTheSameModel) {
  ThreadPool pool(2);
  GgufMixOptions o;
  o.target_bpw = 4.8;
  o.calib_text = kCalib;
  o.probe_spans = 1;
  o.ctx = 128;
  o.imatrix_chunks = 4;
  const GgufMixPlan p = plan_gguf_mix(kFixture, o, pool);
  EXPECT_LE(p.bytes, p.budget_bytes);
  EXPECT_LE(p.bits_per_weight(), 4.8);
  EXPECT_GT(p.bits_per_weight(), 4.7);  // the budget is used
  EXPECT_TRUE(p.exact);
  EXPECT_LE(p.predicted_kl, p.lagrangian_kl + 1e-15);
  EXPECT_LE(p.lagrangian_bytes, p.budget_bytes);
  uint64_t bytes = 0;
  double kl = 0;
  for (const GgufMixTensor& t : p.tensors) {
    const GgufCandidate& c = t.candidates[static_cast<size_t>(t.chosen)];
    bytes += c.bytes;
    kl += c.predicted_kl;
    if (!t.searched) continue;
    EXPECT_EQ(t.probes.size(), 2u) << t.name;
    for (const GgufCandidate& cd : t.candidates)
      EXPECT_EQ(kquants::row_size(cd.type, 256) > 0 && cd.bytes % 32 == 0, true) << t.name;
  }
  EXPECT_EQ(bytes, p.bytes);
  EXPECT_NEAR(kl, p.predicted_kl, 1e-12);
  // At each preset's size the exact optimum predicts no more than the preset.
  ASSERT_FALSE(p.presets.empty());
  for (const GgufMixPoint& q : p.presets) {
    double best = INFINITY;
    for (const GgufMixPoint& c : p.curve)
      if (c.bytes <= q.bytes) best = std::min(best, c.predicted_kl);
    if (std::isfinite(best)) {
      EXPECT_LE(best, q.predicted_kl * (1 + 1e-12)) << q.name;
    }
  }
  for (size_t i = 1; i < p.curve.size(); ++i) EXPECT_LE(p.curve[i].predicted_kl, p.curve[i - 1].predicted_kl * (1 + 1e-12));
}

TEST(MixedGguf, MenuParsingAndFloatOnlyMenu) {
  EXPECT_EQ(parse_gguf_menu("q4_K, Q6_K,q4_k", "--types"), (std::vector<uint32_t>{ggml_type::Q4_K, ggml_type::Q6_K}));
  EXPECT_QF_ERROR(parse_gguf_menu("f32", "--types"), ErrorKind::Usage, "f32 is not offered");
  EXPECT_QF_ERROR(parse_gguf_menu(" , ", "--types"), ErrorKind::Usage, "no type given");
  ThreadPool pool(2);
  GgufMixOptions o;
  o.target_bpw = 16.5;
  o.types = {ggml_type::F16};
  o.calib_text = kCalib;
  o.probe_spans = 1;
  o.ctx = 64;
  o.imatrix_chunks = 1;
  const GgufMixPlan p = plan_gguf_mix(kFixture, o, pool);
  EXPECT_EQ(p.predicted_kl, 0.0);  // f16 holds the f16 model exactly
  for (const auto& [name, type] : p.types()) EXPECT_EQ(type, ggml_type::F16) << name;
  EXPECT_EQ(p.file_type_preset(), "F16");
}

}  // namespace
}  // namespace qf::mixed
