#include "eval/perplexity.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "core/io.h"
#include "runtime/linear.h"

#include "test_util.h"

namespace qf::eval {
namespace {

using namespace qf::test;

// A byte-level "llama" vocabulary: every character is its byte token, so
// token counts are easy to reason about.
std::unique_ptr<Tokenizer> byte_tokenizer() {
  Vocab v;
  v.model = "llama";
  v.pre = "default";
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.types = {TokenType::Unknown, TokenType::Control, TokenType::Control};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    v.tokens.push_back(buf);
    v.types.push_back(TokenType::Byte);
  }
  v.scores.assign(v.tokens.size(), 0.f);
  v.unk_id = 0, v.bos_id = 1, v.eos_id = 2;
  v.add_bos = true;
  v.add_space_prefix = false;
  return make_tokenizer(v);
}

TEST(Spans, ChunksReplaceTheFirstTokenWithBosAndScoreTheSecondHalf) {
  auto tok = byte_tokenizer();
  PplOptions o;
  o.ctx = 8;
  const auto spans = make_spans(*tok, std::string(20, 'a'), o, 0, "t");  // BOS + 20 bytes = 21 tokens
  ASSERT_EQ(spans.size(), 2u);
  for (const auto& s : spans) {
    EXPECT_EQ(s.tokens.size(), 8u);
    EXPECT_EQ(s.tokens[0], 1);
    EXPECT_EQ(s.first_scored, 4);
    EXPECT_EQ(s.scored(), 3);  // positions 4, 5, 6 predict 5, 6, 7
  }
  EXPECT_EQ(spans[1].tokens[1], 'a' + 3);
}

TEST(Spans, WindowsScoreEveryTokenAfterTheFirstAndDropTheTail) {
  auto tok = byte_tokenizer();
  PplOptions o;
  o.mode = PplMode::Windows;
  o.ctx = 8;
  auto spans = make_spans(*tok, std::string(20, 'a'), o, 0, "t");
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].tokens[0], 1);
  EXPECT_EQ(spans[1].tokens[0], 'a' + 3);  // only the text's own BOS
  EXPECT_EQ(spans[0].scored(), 7);
  o.keep_tail = true;
  spans = make_spans(*tok, std::string(20, 'a'), o, 0, "t");
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[2].tokens.size(), 5u);
  o.bos_per_line = true;
  spans = make_spans(*tok, "abc\n\ndef\n", o, 0, "t");  // <s>abc<s>def = 8 tokens
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].tokens[4], 1);
}

TEST(Spans, LinesOverlapByOneTokenSoEveryTokenIsPredictedOnce) {
  auto tok = byte_tokenizer();
  PplOptions o;
  o.mode = PplMode::Lines;
  o.ctx = 4;
  const auto spans = make_spans(*tok, "abcdefg\n\nxy\n", o, 0, "t");  // 8 tokens, then 3
  int64_t scored = 0;
  for (const auto& s : spans) scored += s.scored();
  EXPECT_EQ(scored, 7 + 2);
  EXPECT_EQ(spans[0].tokens.back(), spans[1].tokens.front());
}

TEST(Spans, ErrorsNameTheProblem) {
  auto tok = byte_tokenizer();
  PplOptions o;
  EXPECT_QF_ERROR(make_spans(*tok, "shorttext", o, 0, "eval.txt"), ErrorKind::InvalidInput,
                  "eval.txt: the text has 10 tokens, fewer than one chunk of 512");
  o.ctx = 4096;
  EXPECT_QF_ERROR(make_spans(*tok, std::string(5000, 'x'), o, 2048, "eval.txt"), ErrorKind::InvalidInput,
                  "context 4096 exceeds the model's maximum of 2048");
  o.ctx = 1;
  EXPECT_QF_ERROR(make_spans(*tok, "abc", o, 0, "t"), ErrorKind::Usage, "--ctx must be at least 2");
  EXPECT_QF_ERROR(parse_ppl_mode("strided"), ErrorKind::Usage, "unknown --ppl-mode");
}

// A valid measurement: tokens scored, every number finite.
EvalResult valid_result() {
  EvalResult r;
  r.has_baseline = true;
  r.tokens_scored = 100;
  r.ppl = 10.5, r.base_ppl = 10.0, r.nll_mean = std::log(10.5), r.base_nll_mean = std::log(10.0);
  r.ppl_delta = 0.5, r.ppl_ratio = 1.05, r.kld_mean = 0.02;
  return r;
}

TEST(Gate, ReportsEachFailedBoundWithItsMargin) {
  EvalResult r = valid_result();
  Gate g;
  g.max_ppl_delta = 1.0;
  g.max_ppl_ratio = 1.10;
  g.max_kld = 0.05;
  EXPECT_TRUE(check_gate(g, r).empty());
  g.max_ppl_delta = 0.25;
  g.max_kld = 0.01;
  const auto f = check_gate(g, r);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0], "perplexity delta 0.5000 exceeds --max-ppl-delta 0.2500 by 0.2500");
  EXPECT_EQ(f[1], "mean KL divergence 0.020000 exceeds --max-kld 0.010000 by 0.010000");
  r.has_baseline = false;
  EXPECT_QF_ERROR(check_gate(g, r), ErrorKind::Usage, "need --baseline");
}

TEST(Gate, NeverPassesAnInvalidMeasurement) {
  Gate g;
  g.max_kld = 1.0;  // generous: only the validity check can fail it
  EXPECT_TRUE(check_gate(g, valid_result()).empty());
  EXPECT_TRUE(measurement_problems(valid_result()).empty());
  struct Case {
    const char* what;
    void (*spoil)(EvalResult&);
    const char* expect;
  };
  const Case cases[] = {
      {"non-finite logits", [](EvalResult& r) { r.nonfinite_tokens = 3; }, "3 of 100 scored tokens have NaN or infinite logits in the evaluated model"},
      {"baseline logits", [](EvalResult& r) { r.base_nonfinite_tokens = 100; }, "100 of 100 scored tokens have NaN or infinite logits in the baseline"},
      {"NaN KL", [](EvalResult& r) { r.kld_mean = std::numeric_limits<double>::quiet_NaN(); }, "the mean KL divergence is nan"},
      {"Inf ppl", [](EvalResult& r) { r.ppl = std::numeric_limits<double>::infinity(); }, "the perplexity is infinite"},
      {"no tokens", [](EvalResult& r) { r.tokens_scored = 0; }, "no token was scored"},
  };
  for (const Case& c : cases) {
    EvalResult r = valid_result();
    c.spoil(r);
    const auto f = check_gate(g, r);
    ASSERT_EQ(f.size(), 1u) << c.what;
    EXPECT_NE(f[0].find("the measurement is not valid"), std::string::npos) << f[0];
    EXPECT_NE(f[0].find(c.expect), std::string::npos) << c.what << ": " << f[0];
  }
}

TEST(Spans, AChunkTooShortToScoreIsAnError) {
  auto tok = byte_tokenizer();
  PplOptions o;
  o.ctx = 2;  // a chunk scores its second half: position 1 predicts nothing inside a 2-token chunk
  EXPECT_QF_ERROR(make_spans(*tok, std::string(100, 'x'), o, 0, "eval.txt"), ErrorKind::InvalidInput,
                  "--ctx 2 leaves no token to score in chunks mode");
  o.ctx = 3;  // scores one token per chunk
  const auto spans = make_spans(*tok, std::string(100, 'x'), o, 0, "eval.txt");
  ASSERT_FALSE(spans.empty());
  EXPECT_EQ(spans[0].scored(), 1);
}

// One NaN in one weight: every logit after it is NaN. The comparison must say
// so, not clamp NaN KL values to 0 and pass a gate.
TEST(Evaluate, NonFiniteLogitsPoisonTheResultAndFailTheGate) {
  const auto dir = source_dir() / "tests/data/fixture-llama";
  auto base = rt::load_model(dir.string());
  auto broken = rt::load_model(dir.string());
  auto tok = load_tokenizer(dir);
  rt::LayerWeights& L = broken->mutable_layer(1);
  std::vector<float> w = L.down->decode_all();
  w[3 * static_cast<size_t>(L.down->in_features()) + 5] = std::numeric_limits<float>::quiet_NaN();
  L.down = rt::make_dense_linear(Tensor::from_f32(w, {L.down->out_features(), L.down->in_features()}), nullptr, "down");
  PplOptions o;
  o.ctx = 64;
  o.max_spans = 2;
  const auto spans = make_spans(*tok, read_text_file(source_dir() / "tests/data/text/evaluation.txt"), o, 0, "eval");
  const EvalResult ok = evaluate(*base, base.get(), spans, o, ThreadPool::global());
  EXPECT_TRUE(measurement_problems(ok).empty());
  EXPECT_EQ(ok.nonfinite_tokens, 0);
  EXPECT_EQ(ok.kld_mean, 0.0);

  const EvalResult r = evaluate(*broken, base.get(), spans, o, ThreadPool::global());
  EXPECT_EQ(r.tokens_scored, 62);  // 2 chunks x positions 32..62 (the last one predicts nothing inside the chunk)
  EXPECT_EQ(r.nonfinite_tokens, r.tokens_scored);
  EXPECT_EQ(r.base_nonfinite_tokens, 0);
  EXPECT_TRUE(std::isnan(r.kld_mean)) << r.kld_mean;
  EXPECT_TRUE(std::isnan(r.ppl)) << r.ppl;
  EXPECT_EQ(r.top1_agreement, 0.0);
  Gate g;
  g.max_kld = 0.05;
  g.max_ppl_ratio = 1e9;
  ASSERT_EQ(check_gate(g, r).size(), 1u);

  const EvalResult rb = evaluate(*base, broken.get(), spans, o, ThreadPool::global());
  EXPECT_EQ(rb.base_nonfinite_tokens, rb.tokens_scored);
  EXPECT_FALSE(check_gate(g, rb).empty());
}

}  // namespace
}  // namespace qf::eval
