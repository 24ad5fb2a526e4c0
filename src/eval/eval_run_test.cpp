// run_eval on hostile models: a NaN router (finite logits, since top-k
// routing never picks a NaN score) and an lm_head large enough that the
// perplexity is infinite; and the report of such a measurement, which JSON
// can only hold with nulls.
#include "eval/eval_run.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>


#include "core/io.h"
#include "modified_model.h"
#include "test_util.h"

namespace qf::eval {
namespace {

using namespace qf::test;
namespace fs = std::filesystem;

// The first few KB of the bundled evaluation text: enough for one short chunk.
fs::path short_text(const TempDir& t) {
  const std::string all = read_text_file(source_dir() / "tests/data/text/evaluation.txt");
  write_file(t / "eval.txt", all.substr(0, 4000));
  return t / "eval.txt";
}

EvalRequest request(const fs::path& model, const fs::path& text, const fs::path& baseline) {
  EvalRequest req;
  req.model = model.string();
  req.text = text.string();
  req.baseline = baseline.string();
  req.ppl.ctx = 64;
  req.ppl.max_spans = 1;
  return req;
}

bool mentions(const std::vector<std::string>& lines, const std::string& what) {
  for (const std::string& l : lines)
    if (l.find(what) != std::string::npos) return true;
  return false;
}

TEST(EvalRun, ANanRouterMakesTheMeasurementInvalidInTheModelAndInTheBaseline) {
  TempDir t;
  const fs::path moe = source_dir() / "tests/data/fixture-mixtral", nan = t / "nan-router";
  copy_model_changing(moe, nan, "model.layers.0.block_sparse_moe.gate.weight",
                      [](std::vector<float>& v) { v.assign(v.size(), std::numeric_limits<float>::quiet_NaN()); });
  const fs::path text = short_text(t);
  for (const bool in_baseline : {false, true}) {
    EvalRequest req = in_baseline ? request(moe, text, nan) : request(nan, text, moe);
    req.gate.max_kld = 5.0;  // generous: only validity can fail it
    const EvalRun run = run_eval(req, ThreadPool::global());
    // Where the routing hides the NaN (at the SIMD levels every logit stays
    // finite; at the scalar level the NaN reaches the logits), the logits
    // alone would pass the gate ...
    if (run.result.nonfinite_tokens + run.result.base_nonfinite_tokens == 0) {
      EvalResult logits_only = run.result;
      logits_only.nonfinite_weight.clear(), logits_only.base_nonfinite_weight.clear();
      EXPECT_TRUE(measurement_problems(logits_only).empty());
      EXPECT_TRUE(check_gate(req.gate, logits_only).empty());
    }
    // ... but at every level the weight walk finds it, and the gate does not pass.
    const std::string& bad = in_baseline ? run.result.base_nonfinite_weight : run.result.nonfinite_weight;
    EXPECT_EQ(bad, "model.layers.0.block_sparse_moe.gate.weight [0, 0] is nan");
    ASSERT_FALSE(run.failures.empty());
    EXPECT_NE(run.failures[0].find("not valid"), std::string::npos) << run.failures[0];
    EXPECT_FALSE(run.report["valid"].get<bool>());
    EXPECT_TRUE(mentions(run.report["problems"], in_baseline ? "the baseline has a non-finite weight" : "the evaluated model has a non-finite weight"))
        << run.report["problems"].dump();
    EXPECT_FALSE(run.report["gate"]["passed"].get<bool>());
  }
  // Without a gate nothing fails, but the report says the measurement is invalid.
  const EvalRun ungated = run_eval(request(nan, text, ""), ThreadPool::global());
  EXPECT_TRUE(ungated.failures.empty());
  EXPECT_FALSE(ungated.report["valid"].get<bool>());
  EXPECT_FALSE(measurement_problems(ungated.result).empty());
}

TEST(EvalRun, AnExpertWeightThatIsInfiniteIsFoundToo) {
  TempDir t;
  const fs::path moe = source_dir() / "tests/data/fixture-mixtral", inf = t / "inf-expert";
  copy_model_changing(moe, inf, "model.layers.2.block_sparse_moe.experts.5.w2.weight",
                      [](std::vector<float>& v) { v[3 * 256 + 7] = std::numeric_limits<float>::infinity(); });
  const EvalRun run = run_eval(request(inf, short_text(t), ""), ThreadPool::global());
  EXPECT_EQ(run.result.nonfinite_weight, "model.layers.2.block_sparse_moe.experts.5.w2.weight [3, 7] is inf");
  EXPECT_FALSE(run.report["valid"].get<bool>());
}

TEST(EvalRun, AnInfinitePerplexityFailsTheGateAndIsNullInTheReport) {
  TempDir t;
  const fs::path dense = source_dir() / "tests/data/fixture-llama", big = t / "big-head";
  // Finite weights whose logits are so far apart that exp(mean NLL) overflows.
  copy_model_changing(dense, big, "lm_head.weight", [](std::vector<float>& v) {
    float m = 0;
    for (float x : v) m = std::max(m, std::fabs(x));
    for (float& x : v) x *= 6e4f / m;
  });
  EvalRequest req = request(big, short_text(t), dense);
  req.gate.max_ppl_ratio = 2.0;
  const EvalRun run = run_eval(req, ThreadPool::global());
  EXPECT_TRUE(std::isinf(run.result.ppl));
  EXPECT_EQ(run.result.nonfinite_weight, "");
  ASSERT_FALSE(run.failures.empty());
  EXPECT_NE(run.failures[0].find("the perplexity is infinite"), std::string::npos) << run.failures[0];
  // What is written is what is read back: null, never a number.
  const nlohmann::ordered_json back = nlohmann::ordered_json::parse(run.report.dump());
  EXPECT_EQ(back, run.report);
  EXPECT_TRUE(back["ppl"].is_null());
  EXPECT_TRUE(back["ppl_ratio"].is_null());
  EXPECT_FALSE(report_number(back, {"ppl"}));
  EXPECT_FALSE(report_number(back, {"ppl_ratio"}));
  EXPECT_TRUE(report_number(back, {"baseline", "ppl"}));
  EXPECT_FALSE(back["valid"].get<bool>());
}

TEST(EvalReport, NonFiniteNumbersAreNullAndReadBackAsMissing) {
  EvalResult r;
  r.mode = "chunks";
  r.tokens_scored = 10;
  r.nll_mean = std::numeric_limits<double>::quiet_NaN();
  r.ppl = std::numeric_limits<double>::infinity();
  r.has_baseline = true;
  r.base_ppl = 12.5;
  r.kld_mean = -std::numeric_limits<double>::infinity();
  r.kld_p99 = 0.25;
  EvalRequest req;
  req.gate.max_kld = 0.1;
  const nlohmann::ordered_json j = eval_report(req, r, check_gate(req.gate, r));
  for (const char* k : {"nll", "ppl"}) EXPECT_TRUE(j[k].is_null()) << k;
  EXPECT_TRUE(j["kld"]["mean"].is_null());
  EXPECT_EQ(report_number(j, {"kld", "p99"}), 0.25);
  EXPECT_EQ(report_number(j, {"baseline", "ppl"}), 12.5);
  EXPECT_FALSE(report_number(j, {"kld", "mean"}));
  EXPECT_FALSE(report_number(j, {"no", "such"}));
  EXPECT_FALSE(j["valid"].get<bool>());
  EXPECT_TRUE(mentions(j["problems"], "the perplexity is infinite"));
  EXPECT_FALSE(j["gate"]["passed"].get<bool>());
}

}  // namespace
}  // namespace qf::eval
