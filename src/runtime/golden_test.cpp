// The runtime against real outputs: stories260K (llama2.c's own greedy texts
// and reference perplexity) and the bundled fixture (its training report).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/io.h"
#include "eval/perplexity.h"
#include "formats/llama2c/llama2c_model.h"
#include "formats/tokenizer/tokenizer.h"
#include "runtime/cpu/kernels.h"
#include "runtime/generate.h"
#include "cache_values.h"
#include "reference_llama.h"
#include "test_util.h"

namespace qf::rt {
namespace {

using namespace qf::test;

std::filesystem::path stories_dir() { return shared_dir() / "models" / "stories260K"; }

class Stories : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(stories_dir() / "stories260K.bin")) return;
    dir_ = new TempDir();
    convert_llama2c_to_hf(stories_dir() / "stories260K.bin", stories_dir() / "tok512.bin", dir_->path() / "hf");
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (!dir_) GTEST_SKIP() << "../shared/models/stories260K is absent";
    model_ = load_model((dir_->path() / "hf").string());
    tok_ = load_tokenizer(dir_->path() / "hf");
  }
  std::string greedy(const std::string& prompt, int64_t n) {
    GenerateOptions o;
    o.max_new_tokens = n;
    std::string out;
    generate(*model_, *tok_, prompt, o, ThreadPool::global(), [&](const std::string& s) { out += s; });
    return out + "\n";  // llama2.c ends with a newline
  }
  static TempDir* dir_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tok_;
};
TempDir* Stories::dir_ = nullptr;

TEST_F(Stories, GreedyFromBosMatchesLlama2cByteForByte) {
  EXPECT_EQ(greedy("", 256), read_text_file(stories_dir() / "greedy_bos_n256.txt"));
}

TEST_F(Stories, GreedyFromPromptMatchesLlama2cByteForByte) {
  // llama2.c's -n 64 counts positions: BOS + prompt tokens + new tokens = 64 + 1.
  const int64_t prompt_tokens = static_cast<int64_t>(tok_->encode("Once upon a time", false).size());
  EXPECT_EQ(greedy("Once upon a time", 64 - prompt_tokens),
            read_text_file(stories_dir() / "greedy_once_upon_a_time_n64.txt"));
}

TEST_F(Stories, PerplexityMatchesReference) {
  eval::PplOptions o;
  o.mode = eval::PplMode::Lines;
  const auto spans = eval::make_spans(*tok_, read_text_file(stories_dir() / "ts_fragment.txt"), o, 512, "ts");
  const eval::EvalResult r = eval::evaluate(*model_, nullptr, spans, o, ThreadPool::global());
  // README: 15,507 predicted tokens, mean NLL 1.6854 nats, perplexity 5.395.
  EXPECT_EQ(r.tokens_scored, 15507);
  EXPECT_NEAR(r.nll_mean, 1.6854, 5e-4);
  EXPECT_NEAR(r.ppl, 5.395, 5e-3);
}

TEST_F(Stories, ConvertedTokenizerEncodesLikeLlama2c) {
  std::unique_ptr<Tokenizer> ref = load_tokenizer(stories_dir() / "tok512.bin");
  const std::string text = read_text_file(stories_dir() / "ts_fragment.txt");
  size_t b = 0, lines = 0;
  while (b < text.size()) {
    size_t e = text.find('\n', b);
    if (e == std::string::npos) e = text.size();
    const std::string line = text.substr(b, e - b);
    ASSERT_EQ(tok_->encode(line, true), ref->encode(line, true)) << line;
    ++lines;
    b = e + 1;
  }
  EXPECT_GT(lines, 10u);
}

std::filesystem::path fixture_dir() { return source_dir() / "tests" / "data" / "fixture-llama"; }

// The bundled trained models against their training reports: the dense
// fixture and the Mixtral-layout one.
class TrainedFixture : public ::testing::TestWithParam<const char*> {
 protected:
  std::filesystem::path dir() const { return source_dir() / "tests" / "data" / GetParam(); }
};

TEST_P(TrainedFixture, PerplexityMatchesTrainingReport) {
  auto report = nlohmann::json::parse(read_text_file(dir() / "training_report.json"));
  const auto& ev = report.at("eval").at("evaluation.txt");
  auto model = load_model(dir().string());
  auto tok = load_tokenizer(dir());
  eval::PplOptions o;  // the report's convention: <s> per line, 512-token windows, tail kept
  o.mode = eval::PplMode::Windows;
  o.ctx = 512;
  o.bos_per_line = true;
  o.keep_tail = true;
  const auto spans = eval::make_spans(*tok, read_text_file(source_dir() / "tests/data/text/evaluation.txt"), o, 0, "eval");
  const eval::EvalResult r = eval::evaluate(*model, nullptr, spans, o, ThreadPool::global());
  EXPECT_EQ(r.tokens_scored, ev.at("tokens_scored").get<int64_t>());
  EXPECT_NEAR(r.nll_mean, ev.at("loss").get<double>(), 2e-5);
}

TEST_P(TrainedFixture, GreedyTextMatchesTrainingReport) {
  auto report = nlohmann::json::parse(read_text_file(dir() / "training_report.json"));
  const std::string prompt = report.at("greedy_sample").at("prompt"), want = report.at("greedy_sample").at("text");
  auto model = load_model(dir().string());
  auto tok = load_tokenizer(dir());
  GenerateOptions o;
  o.max_new_tokens = static_cast<int64_t>(tok->encode(want, false).size());
  std::string got;
  generate(*model, *tok, prompt, o, ThreadPool::global(), [&](const std::string& s) { got += s; });
  EXPECT_EQ(got.substr(0, want.size()), want);
}

INSTANTIATE_TEST_SUITE_P(Models, TrainedFixture, ::testing::Values("fixture-llama", "fixture-mixtral"),
                         [](const auto& info) { return std::string(info.param).substr(8); });

const char* kSentence = "The President said that the Congress of the United States would meet in the spring.";

// Logits of one sequence on the fixture, with a given SIMD level and pool;
// `kv_out` receives what the cache holds after it.
std::vector<float> fixture_logits(SimdLevel level, ThreadPool& pool, reference::CacheValues* kv_out = nullptr,
                                  const std::string& text = kSentence) {
  static auto model = load_model(fixture_dir().string());
  static auto tok = load_tokenizer(fixture_dir());
  const SimdLevel saved = simd_level();
  set_simd_level(level);
  const auto ids = tok->encode(text, true);
  KvCache cache = model->make_cache(KvDType::F16, static_cast<int64_t>(ids.size()));
  Batch b;
  const int32_t s = cache.add_sequence();
  for (size_t i = 0; i < ids.size(); ++i) b.add(ids[i], s, static_cast<int64_t>(i), true);
  std::vector<float> logits;
  model->forward(b, cache, logits, pool);
  set_simd_level(saved);
  const ModelConfig& c = model->config();
  if (kv_out)
    *kv_out = cache_values(cache, s, c.num_hidden_layers, c.num_key_value_heads, c.head_dim, static_cast<int64_t>(ids.size()));
  return logits;
}

// The fixture's logits at every SIMD level the CPU has, scalar included,
// against the double-precision reference (tests/unit/reference_llama.h) with
// its bound: the f32 rounding of every operation propagated through the four
// layers, continuing from the f16 K/V the runtime cached (each element checked
// to be the f16 rounding of the exact value, or the half on the other side
// where the exact value is within its f32 error of a rounding boundary). Two
// levels may differ by more than their f32 noise where one K/V element
// rounds the other way: that is legitimate, and no fixed tolerance on their
// difference can allow it without also allowing real bugs.
TEST(Fixture, LogitsAtEverySimdLevelWithinReferenceBound) {
  ThreadPool pool(2);
  const auto cfg = nlohmann::json::parse(read_text_file(fixture_dir() / "config.json"));
  reference::Arch a;
  a.hidden = cfg.at("hidden_size"), a.layers = cfg.at("num_hidden_layers"), a.heads = cfg.at("num_attention_heads");
  a.kv_heads = cfg.at("num_key_value_heads"), a.head_dim = cfg.at("head_dim"), a.inter = cfg.at("intermediate_size");
  a.vocab = cfg.at("vocab_size"), a.eps = cfg.at("rms_norm_eps");
  const double theta = cfg.at("rope_theta");
  for (int64_t i = 0; i < a.head_dim / 2; ++i)
    a.inv_freq.push_back(std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(a.head_dim)));
  a.inv_freq_ulps = reference::rope_inv_freq_ulps(theta, a.head_dim, false);
  const reference::Weights w = reference::Weights::load(fixture_dir());
  const std::vector<int32_t> ids = load_tokenizer(fixture_dir())->encode(kSentence, true);
  for (SimdLevel l : {SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512}) {
    if (l > best_simd_level()) {
      std::printf("%s: not available on this CPU\n", simd_level_name(l));
      continue;
    }
    reference::CacheValues kv;
    const std::vector<float> got = fixture_logits(l, pool, &kv);
    reference::Options o;
    o.cache = &kv;
    const reference::Result ref = reference::forward(a, w, ids, o);
    EXPECT_EQ(ref.cache_errors, 0) << simd_level_name(l) << ": first " << ref.first_cache_error;
    const reference::Check c = reference::compare(got, ref);
    std::printf("%s: max |diff| %.3g, largest bound %.3g, max |logit| %.3g, worst %.3g of its bound\n",
                simd_level_name(l), c.max_diff, c.max_bound, c.max_abs, c.worst_ratio);
    EXPECT_LE(c.worst_ratio, 1.0) << simd_level_name(l) << ": max diff " << c.max_diff << ", largest bound " << c.max_bound;
    // A bound this small still sees a 1e-3 error of a scale, norm or
    // frequency (1e-4 to 1e-2 of max |logit|).
    EXPECT_LT(c.max_bound, 1e-4 * c.max_abs) << simd_level_name(l) << ": the bound is too loose to catch a bug";
  }
}

// The pool's size sets how the work is cut (rows per tile: 64, 24, 12 on
// this fixture's 256-wide matrices; query blocks per KV head: 2, 4, 6, of 16
// or more tokens), never a result. The long prompt (about 100 tokens) gives
// every pool size different query blocks.
TEST(Fixture, LogitsDoNotDependOnThreadCount) {
  ThreadPool one(1), two(2), three(3);
  std::string longer;
  for (int i = 0; i < 5; ++i) longer += std::string(i ? " " : "") + kSentence;
  for (const std::string& text : {std::string(kSentence), longer}) {
    const auto a = fixture_logits(simd_level(), one, nullptr, text);
    EXPECT_EQ(a, fixture_logits(simd_level(), two, nullptr, text)) << text.size() << " characters";
    EXPECT_EQ(a, fixture_logits(simd_level(), three, nullptr, text)) << text.size() << " characters";
  }
}

// Counts the rows a Linear multiplies.
class CountingLinear final : public Linear {
 public:
  explicit CountingLinear(std::shared_ptr<Linear> inner)
      : Linear(inner->in_features(), inner->out_features()), inner_(std::move(inner)) {}
  void forward(const float* x, int64_t n, float* y, ThreadPool& pool) const override {
    rows += n;
    inner_->forward(x, n, y, pool);
  }
  void decode_row(int64_t r, float* out) const override { inner_->decode_row(r, out); }
  uint64_t weight_bytes() const override { return inner_->weight_bytes(); }
  std::string format() const override { return inner_->format(); }
  std::vector<float> bias_values() const override { return inner_->bias_values(); }
  mutable int64_t rows = 0;

 private:
  std::shared_ptr<Linear> inner_;
};

// The last layer runs its attention output and MLP only for the tokens whose
// logits are wanted (every token's K/V still reach the cache): their logits
// are the floats of running every token, and the cache holds the same K/V.
// Two sequences share the batch, their tokens interleaved; the fixtures'
// Linears sum in one order whatever the batch (2, 16 or all rows).
TEST(Fixture, LastLayerRunsOnlyTheTokensWhoseLogitsAreWanted) {
  ThreadPool pool(2);
  for (const char* name : {"fixture-llama", "fixture-mixtral"}) {
    const auto dir = source_dir() / "tests" / "data" / name;
    auto model = load_model(dir.string());
    auto tok = load_tokenizer(dir);
    const ModelConfig& c = model->config();
    const int64_t last = c.num_hidden_layers - 1;
    auto o_proj = std::make_shared<CountingLinear>(model->mutable_layer(last).o);
    model->mutable_layer(last).o = o_proj;
    const std::vector<int32_t> texts[2] = {tok->encode(kSentence, true),
                                           tok->encode(std::string(kSentence) + " " + kSentence + " " + kSentence, true)};
    struct Entry {
      int32_t token, seq;
      int64_t pos;
    };
    std::vector<Entry> entries;
    for (size_t i = 0; i < texts[1].size(); ++i)
      for (int32_t s = 0; s < 2; ++s)
        if (i < texts[s].size()) entries.push_back({texts[s][i], s, static_cast<int64_t>(i)});
    struct Run {
      std::vector<float> logits;
      reference::CacheValues kv[2];
    };
    auto run = [&](const std::function<bool(size_t)>& want) {
      KvCache cache = model->make_cache(KvDType::F16, static_cast<int64_t>(entries.size()) + 32);
      const int32_t seqs[2] = {cache.add_sequence(), cache.add_sequence()};
      Batch b;
      for (size_t t = 0; t < entries.size(); ++t) b.add(entries[t].token, seqs[entries[t].seq], entries[t].pos, want(t));
      Run r;
      o_proj->rows = 0;
      model->forward(b, cache, r.logits, pool);
      for (int s = 0; s < 2; ++s)
        r.kv[s] = cache_values(cache, seqs[s], c.num_hidden_layers, c.num_key_value_heads, c.head_dim,
                               static_cast<int64_t>(texts[s].size()));
      return r;
    };
    const Run all = run([](size_t) { return true; });
    ASSERT_EQ(o_proj->rows, static_cast<int64_t>(entries.size())) << name;
    auto is_last = [&](size_t t) { return entries[t].pos + 1 == static_cast<int64_t>(texts[entries[t].seq].size()); };
    const std::function<bool(size_t)> patterns[] = {
        [&](size_t t) { return t % 5 == 0 || is_last(t); },  // 16 or more rows: the GEMM blocks
        is_last,                                             // 2 rows: the per-token products
        [](size_t) { return false; }};
    for (const auto& want : patterns) {
      const Run part = run(want);
      std::vector<float> expect;
      int64_t wanted = 0;
      for (size_t t = 0; t < entries.size(); ++t) {
        if (!want(t)) continue;
        ++wanted;
        expect.insert(expect.end(), all.logits.begin() + static_cast<std::ptrdiff_t>(t * c.vocab_size),
                      all.logits.begin() + static_cast<std::ptrdiff_t>((t + 1) * c.vocab_size));
      }
      EXPECT_EQ(o_proj->rows, wanted) << name << ": the last layer's o_proj ran on other rows";
      EXPECT_EQ(part.logits, expect) << name << ", " << wanted << " rows wanted";
      for (int s = 0; s < 2; ++s) {
        EXPECT_EQ(part.kv[s].k, all.kv[s].k) << name << ", sequence " << s;
        EXPECT_EQ(part.kv[s].v, all.kv[s].v) << name << ", sequence " << s;
      }
    }
  }
}

}  // namespace
}  // namespace qf::rt
