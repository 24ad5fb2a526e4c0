#include "eval/perplexity.h"

#include <gtest/gtest.h>

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

TEST(Gate, ReportsEachFailedBoundWithItsMargin) {
  EvalResult r;
  r.has_baseline = true;
  r.ppl_delta = 0.5, r.ppl_ratio = 1.05, r.kld_mean = 0.02;
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

}  // namespace
}  // namespace qf::eval
