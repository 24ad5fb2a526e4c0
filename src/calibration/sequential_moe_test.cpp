// The calibration pipeline on mixture-of-experts models: every expert's
// statistics come from the tokens the router sends it (or every token), one
// expert at a time, and an expert no token reaches is reported, not skipped.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "calibration/sequential.h"
#include "quantizers/gptq.h"
#include "runtime/model.h"
#include "moe_cases.h"
#include "test_util.h"

namespace qf {
namespace {

std::filesystem::path tiny(const char* arch) { return test::source_dir() / "tests" / "data" / "moe-tiny" / arch; }

using test::random_samples;

// Per (layer, expert): the rows the forward routes to the expert, as its
// gate reads them, accumulated into Hessians the way the pipeline does.
struct ExpertRows : rt::LinearObserver {
  std::map<std::pair<int64_t, int64_t>, HessianAccumulator> in;
  void observe(int64_t, Slot, const float*, int64_t, int64_t) override {}
  void observe_expert(int64_t layer, int64_t e, Slot slot, const float* x, int64_t n, int64_t width) override {
    if (slot != Gate) return;
    in.try_emplace({layer, e}, width).first->second.add(x, n, width);
  }
};

struct Seen {
  int64_t tokens;
  bool hessian;
  int64_t hessian_samples;
  std::string note;
  double damp_scale;
};

std::map<std::string, Seen> record(rt::Model& model, const std::vector<std::vector<int32_t>>& samples, bool all) {
  std::map<std::string, Seen> seen;
  SequentialOptions o;
  o.moe_calibrate_all_experts = all;
  run_sequential(model, samples, [&](const LinearToQuantize& in) -> std::optional<QuantizedLinearResult> {
    EXPECT_TRUE(seen.emplace(in.name, Seen{in.expert_tokens, in.hessian != nullptr,
                                           in.hessian ? in.hessian->samples() : 0, in.note, in.dampening_scale})
                    .second)
        << in.name << " quantized twice";
    return std::nullopt;  // the model stays as it is
  }, ThreadPool::global(), {}, o);
  return seen;
}

class SequentialMoe : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(tiny(GetParam()) / "model.safetensors")) GTEST_SKIP() << tiny(GetParam()) << " is absent";
    model_ = rt::load_hf_model(tiny(GetParam()));
  }
  std::unique_ptr<rt::Model> model_;
};

TEST_P(SequentialMoe, EachExpertsHessianComesFromTheTokensRoutedToIt) {
  const ModelConfig& c = model_->config();
  const auto samples = random_samples(c.vocab_size, 3, 40, 11);
  // The forward's own routing and gathered rows (the model is not changed by the pipeline below).
  ExpertRows rows;
  for (const auto& s : samples) {
    rt::KvCache cache = model_->make_cache(rt::KvDType::F16, static_cast<int64_t>(s.size()));
    const int32_t seq = cache.add_sequence();
    rt::Batch b;
    for (size_t j = 0; j < s.size(); ++j) b.add(s[j], seq, static_cast<int64_t>(j), false);
    std::vector<float> logits;
    model_->forward(b, cache, logits, ThreadPool::global(), &rows);
  }
  const std::map<std::string, Seen> seen = record(*model_, samples, false);
  int64_t total = 0;
  for (const auto& s : samples) total += static_cast<int64_t>(s.size());
  for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
    int64_t slots = 0;
    for (const rt::LayerLinearId& id : rt::layer_linears(c, li)) {
      const std::string name = "model.layers." + std::to_string(li) + "." + id.name;
      ASSERT_TRUE(seen.count(name)) << name << " was never handed to the quantizer";
      const Seen& s = seen.at(name);
      ASSERT_TRUE(s.hessian || s.tokens == 0) << name;
      if (id.expert == rt::kNoExpert) {
        EXPECT_EQ(s.tokens, -1) << name;
        EXPECT_EQ(s.hessian_samples, total) << name;
        continue;
      }
      EXPECT_EQ(s.hessian_samples, s.tokens) << name;
      if (id.expert == rt::kSharedExpert) {
        EXPECT_EQ(s.tokens, total) << name;
      }
      if (id.slot != rt::LinearObserver::Gate) continue;
      if (id.expert >= 0) slots += s.tokens;
      auto it = rows.in.find({li, id.expert});
      if (s.tokens == 0) {
        EXPECT_TRUE(it == rows.in.end()) << name;
        continue;
      }
      ASSERT_TRUE(it != rows.in.end()) << name;
      it->second.finish();
      EXPECT_EQ(it->second.samples(), s.tokens) << name;
    }
    if (c.moe_layer(li)) {
      EXPECT_EQ(slots, total * c.num_experts_per_tok) << "layer " << li;
    }
  }
}

TEST_P(SequentialMoe, EveryExpertsStatisticsSeeEveryTokenWhenAsked) {
  const ModelConfig& c = model_->config();
  const auto samples = random_samples(c.vocab_size, 2, 64, 5);  // more tokens than any input width
  const std::map<std::string, Seen> seen = record(*model_, samples, true);
  for (int64_t li = 0; li < c.num_hidden_layers; ++li)
    for (const rt::LayerLinearId& id : rt::layer_linears(c, li))
      if (id.expert != rt::kNoExpert) {
        const Seen& s = seen.at("model.layers." + std::to_string(li) + "." + id.name);
        EXPECT_EQ(s.tokens, 128);
        EXPECT_EQ(s.hessian_samples, 128);
        EXPECT_TRUE(s.note.empty()) << s.note;
      }
}

TEST_P(SequentialMoe, AnExpertNoTokenReachesHasNoHessianAndANote) {
  const ModelConfig& c = model_->config();
  // One token reaches k of the experts of each sparse layer.
  const auto samples = random_samples(c.vocab_size, 1, 1, 3);
  ASSERT_LT(c.num_experts_per_tok, c.num_experts);
  const std::map<std::string, Seen> seen = record(*model_, samples, false);
  int unreached = 0, few = 0;
  for (int64_t li = 0; li < c.num_hidden_layers; ++li)
    for (const rt::LayerLinearId& id : rt::layer_linears(c, li)) {
      if (id.expert < 0) continue;
      const Seen& s = seen.at("model.layers." + std::to_string(li) + "." + id.name);
      if (s.tokens == 0) {
        ++unreached;
        EXPECT_FALSE(s.hessian);
        EXPECT_NE(s.note.find("no calibration token reached this expert"), std::string::npos) << s.note;
      } else {
        ++few;  // 1 token, below every input width here
        EXPECT_EQ(s.damp_scale, 10.0);
        EXPECT_NE(s.note.find("dampening raised tenfold"), std::string::npos) << s.note;
      }
    }
  EXPECT_GT(unreached, 0);
  EXPECT_GT(few, 0);
}

INSTANTIATE_TEST_SUITE_P(Architectures, SequentialMoe, ::testing::Values("mixtral", "qwen2_moe", "qwen3_moe"));

}  // namespace
}  // namespace qf
