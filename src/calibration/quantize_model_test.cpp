// quantize on the bundled fixture: GPTQ against RTN by KL divergence from the
// f16 model, both export formats through the runtime, determinism, failures.
#include "calibration/quantize_model.h"

#include <gtest/gtest.h>

#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/io.h"
#include "eval/perplexity.h"
#include "formats/tokenizer/tokenizer.h"
#include "runtime/model.h"
#include "quantized_fixture.h"
#include "test_util.h"

namespace qf {
namespace {

using namespace qf::test;

std::filesystem::path fixture() { return source_dir() / "tests" / "data" / "fixture-llama"; }
std::filesystem::path recipe(const std::string& name) { return source_dir() / "tests" / "data" / "recipes" / (name + ".yaml"); }
std::filesystem::path calib() { return source_dir() / "tests" / "data" / "text" / "calibration.txt"; }

class Quantize : public ::testing::Test {
 protected:
  static TempDir& dir() {
    static TempDir d;
    return d;
  }
  static std::filesystem::path run(const std::string& name, int threads = 0) {
    const auto out = dir().path() / (name + "-t" + std::to_string(threads));
    if (!std::filesystem::exists(out)) {
      ThreadPool pool(threads);
      quantize_model(quantize_job(fixture().string(), recipe(name), out, calib()), threads ? pool : ThreadPool::global(),
                     [](const std::string&) {});
    }
    return out;
  }
  static eval::EvalResult compare(const std::filesystem::path& model) {
    static auto base = rt::load_model(fixture().string());
    static auto tok = load_tokenizer(fixture());
    auto m = rt::load_model(model.string());
    eval::PplOptions o;
    o.max_spans = 10;
    const auto spans = eval::make_spans(*tok, read_text_file(source_dir() / "tests/data/text/evaluation.txt"), o, 0, "eval");
    return eval::evaluate(*m, base.get(), spans, o, ThreadPool::global());
  }
};

TEST_F(Quantize, GptqHasSmallerKlThanRtnAtFourBits) {
  const auto gptq = compare(run("w4-gptq")), rtn = compare(run("w4-rtn"));
  std::printf("W4 g128: GPTQ KLD %.6f ppl %.4f | RTN KLD %.6f ppl %.4f\n", gptq.kld_mean, gptq.ppl, rtn.kld_mean, rtn.ppl);
  EXPECT_LT(gptq.kld_mean, 0.8 * rtn.kld_mean);
}

TEST_F(Quantize, GptqHasMuchSmallerKlAndDeltaAtThreeBits) {
  const auto gptq = compare(run("w3-gptq")), rtn = compare(run("w3-rtn"));
  std::printf("W3 g128: GPTQ KLD %.6f delta %+.4f | RTN KLD %.6f delta %+.4f\n", gptq.kld_mean, gptq.ppl_delta,
              rtn.kld_mean, rtn.ppl_delta);
  EXPECT_LT(gptq.kld_mean, 0.7 * rtn.kld_mean);
  EXPECT_LT(gptq.ppl_delta, 0.7 * rtn.ppl_delta);
}

TEST_F(Quantize, GptqCheckpointFormatRunsLikeCompressedTensors) {
  const auto ct = compare(run("w4-gptq")), g = compare(run("w4-gptq-gptqfmt"));
  EXPECT_TRUE(std::filesystem::exists(run("w4-gptq-gptqfmt") / "quantize_config.json"));
  // Same algorithm and data; the GPTQ format writes f16 scales too.
  EXPECT_NEAR(g.kld_mean, ct.kld_mean, 0.2 * ct.kld_mean);
}

TEST_F(Quantize, OutputBytesDoNotDependOnThreadCount) {
  const std::string a = read_text_file(run("w4-gptq", 1) / "model.safetensors");
  const std::string b = read_text_file(run("w4-gptq", 2) / "model.safetensors");
  EXPECT_EQ(a.size(), b.size());
  EXPECT_TRUE(a == b);
  EXPECT_TRUE(std::filesystem::exists(run("w4-gptq", 2) / "quantforge_manifest.json"));
  EXPECT_TRUE(std::filesystem::exists(run("w4-gptq", 2) / "recipe.yaml"));
}

// The report's timing and memory sections: every stage timed, each phase's
// operation count as its formula gives it for the fixture's shapes (so a
// phase that was not counted, or counted twice, fails), rates consistent
// with the counts, the machine's peak at its level, the memory terms
// summing to the prediction and the activations term exact.
TEST_F(Quantize, ReportHasStageTimesPhaseRatesAndTheMemoryEstimate) {
  const auto report = nlohmann::json::parse(read_text_file(run("w4-gptq") / "quantization_report.json"));
  const double tokens = report.at("calibration").at("tokens").get<double>();
  ASSERT_GT(tokens, 0);
  const auto& t = report.at("timing");
  for (const char* stage : {"load", "plan", "data", "layers", "export"}) EXPECT_GE(t.at("stages").at(stage).get<double>(), 0) << stage;
  EXPECT_GT(t.at("stages").at("layers").get<double>(), 0);
  // Fixture: hidden 256, q 256, k/v 128, MLP 768, 4 layers.
  const double linear_params = 256.0 * 256 + 2 * 128.0 * 256 + 256.0 * 256 + 2 * 768.0 * 256 + 256.0 * 768;
  const double linears = 2 * linear_params * tokens * 4 / 1e9;
  const auto& ph = t.at("phases");
  for (const char* pass : {"forward", "propagate"}) {
    const double g = ph.at(pass).at("gflop").get<double>();
    EXPECT_GT(g, linears) << pass;         // the Linears, plus attention
    EXPECT_LT(g, 1.1 * linears) << pass;  // attention over 256-token samples is a few percent
  }
  EXPECT_DOUBLE_EQ(ph.at("forward").at("gflop").get<double>(), ph.at("propagate").at("gflop").get<double>());
  // Hessians: n * in * (in + 1) per distinct input (q/k/v, o, gate/up, down).
  const double hessian = tokens * 4 * (3 * 256.0 * 257 + 768.0 * 769) / 1e9;
  EXPECT_NEAR(ph.at("hessian").at("gflop").get<double>(), hessian, 1e-9 * hessian);
  EXPECT_GT(ph.at("solve").at("gflop").get<double>(), 0);
  for (const char* phase : {"forward", "hessian", "solve", "propagate"}) {
    const auto& p = ph.at(phase);
    const double sec = p.at("seconds").get<double>();
    ASSERT_GT(sec, 0) << phase;
    EXPECT_NEAR(p.at("gflops").get<double>(), p.at("gflop").get<double>() / sec, 1e-9 * p.at("gflops").get<double>()) << phase;
  }
  const auto& peak = t.at("peak_gflops").at(t.at("simd_level").get<std::string>());
  EXPECT_GT(peak.at("f32").get<double>(), 0);
  EXPECT_GT(peak.at("f64").get<double>(), 0);

  const auto& m = report.at("memory");
  uint64_t sum = 0;
  for (const char* term : {"activations_bytes", "layer_weights_bytes", "layer_output_bytes", "forward_bytes", "solve_bytes",
                           "search_bytes", "fixed_bytes"})
    sum += m.at(term).get<uint64_t>();
  EXPECT_EQ(m.at("predicted_peak_bytes").get<uint64_t>(), sum);
  EXPECT_EQ(m.at("activations_bytes").get<uint64_t>(), static_cast<uint64_t>(tokens) * 256 * 4);
  EXPECT_EQ(m.at("layer_weights_bytes").get<uint64_t>(), static_cast<uint64_t>(linear_params) * 2);  // f16
  EXPECT_GT(m.at("measured_peak_rss_bytes").get<uint64_t>(), 0u);
}

TEST_F(Quantize, FailuresLeaveNothingUnderTheOutputName) {
  TempDir t;
  EXPECT_QF_ERROR(quantize_model(quantize_job(fixture().string(), recipe("bad-group"), t.path() / "out", calib()), ThreadPool::global(),
                                 [](const std::string&) {}),
                  ErrorKind::InvalidInput, "bad-group.yaml:7:9: group_size 96 does not divide the 256 input columns");
  EXPECT_QF_ERROR(quantize_model(quantize_job(fixture().string(), recipe("w4-gptq"), t.path() / "out", t.path() / "missing.txt"),
                                 ThreadPool::global(), [](const std::string&) {}),
                  ErrorKind::NotFound, "missing.txt");
  size_t entries = 0;
  for (auto& e : std::filesystem::directory_iterator(t.path())) entries += (void(e), 1);
  EXPECT_EQ(entries, 0u);
}

}  // namespace
}  // namespace qf
