// The unmerged LoRA forward against the merge, and GGUF adapters (written by
// convert/gguf_lora) against the PEFT adapter they came from.
#include "runtime/lora_linear.h"

#include <cmath>

#include <gtest/gtest.h>

#include "checkpoint/lora_merge.h"
#include "convert/gguf_lora.h"
#include "convert/hf_to_gguf.h"
#include "formats/gguf/gguf.h"
#include "runtime/model.h"
#include "test_util.h"

namespace qf::rt {
namespace {

namespace fs = std::filesystem;
const fs::path kBase = test::source_dir() / "tests/data/fixture-llama";
const fs::path kAdapters = test::source_dir() / "tests/data/lora-llama";

// The fixture with every tensor widened to f32 (exactly), so a merge rounds
// to f32 rather than f16 and merged and unmerged differ by summation order only.
const fs::path& f32_base() {
  static test::TempDir dir;
  static const fs::path p = [] {
    const fs::path out = dir / "f32";
    fs::create_directories(out);
    for (const auto& e : fs::directory_iterator(kBase))
      if (e.is_regular_file() && e.path().extension() != ".safetensors") fs::copy_file(e.path(), out / e.path().filename());
    const Checkpoint ck = Checkpoint::open(kBase);
    SafetensorsWriter w(out);
    for (const std::string& n : ck.names()) w.add(n, ck.tensor(n).to(DType::F32));
    w.finish();
    return out;
  }();
  return p;
}

// Logits of a 24-token prompt (the GEMM path) then 4 decode steps.
std::vector<float> run_tokens(const Model& m) {
  ThreadPool pool(2);
  KvCache cache = m.make_cache(KvDType::F16, 32);
  const int32_t s = cache.add_sequence();
  std::vector<float> all, logits;
  Batch b;
  for (int i = 0; i < 24; ++i) b.add(1 + (i * 37) % 4000, s, i, true);
  m.forward(b, cache, logits, pool);
  all = logits;
  for (int i = 24; i < 28; ++i) {
    b.clear();
    b.add(1 + (i * 53) % 4000, s, i, true);
    m.forward(b, cache, logits, pool);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d;
}

// The tolerance for two f32 computations of the same logits that differ in
// summation order only (the adapter's product added to x W^T, or folded into
// W first). A dot product of n terms summed in f32 typically carries
// sqrt(n) * 2^-24 of the sum of its terms' magnitudes: 1.7e-6 for the
// fixture's widest (768). Seven products a layer over four layers, each
// error carried on by the residual stream and grown by the layers after it
// (measured: 1e-5 to 4e-5 of the largest logit), stay below 2e-4 of the
// largest logit. An adapter's own effect is over 50 times larger (checked,
// so the comparison cannot pass by comparing two unadapted models).
constexpr double kOrderTolerance = 2e-4;

TEST(LoraForward, EqualsTheMergedModelUpToSummationOrder) {
  for (const char* which : {"lora", "dora", "rslora-patterns"}) {
    const std::vector<LoraSpec> specs = {{kAdapters / which, 0.8}};
    const std::vector<float> merged = run_tokens(*load_hf_model(f32_base(), std::nullopt, {specs, LoraLoad::Mode::Merge}));
    const std::vector<float> forward = run_tokens(*load_hf_model(f32_base(), std::nullopt, {specs, LoraLoad::Mode::Forward}));
    const std::vector<float> base = run_tokens(*load_hf_model(f32_base()));
    double scale = 0;
    for (float v : merged) scale = std::max(scale, std::fabs(static_cast<double>(v)));
    EXPECT_LE(max_abs_diff(merged, forward), kOrderTolerance * scale) << which;
    EXPECT_GT(max_abs_diff(merged, base), 50 * kOrderTolerance * scale) << which << ": the adapter changes nothing";
  }
}

TEST(LoraForward, AppliesOnAQuantizedStoredFormToo) {
  // Auto on a GGUF base is the forward; Merge is refused with a reason.
  test::TempDir tmp;
  GgufConvertOptions g;
  g.preset = "Q8_0";
  ThreadPool pool(2);
  convert_hf_to_gguf(kBase, tmp / "q8.gguf", g, pool);
  write_gguf_lora({kAdapters / "lora"}, kBase, tmp / "a.gguf", DType::F16);
  EXPECT_QF_ERROR(load_model((tmp / "q8.gguf").string(), device::Kind::Cpu, {{{tmp / "a.gguf"}}, LoraLoad::Mode::Merge}),
                  ErrorKind::Unsupported, "not merged into a GGUF model");
  EXPECT_QF_ERROR(load_model((tmp / "q8.gguf").string(), device::Kind::Cpu, {{{kAdapters / "lora"}}, LoraLoad::Mode::Auto}),
                  ErrorKind::Unsupported, "--to gguf-lora");
  const auto m = load_model((tmp / "q8.gguf").string(), device::Kind::Cpu, {{{tmp / "a.gguf"}}, LoraLoad::Mode::Auto});
  EXPECT_NE(m->weights().layers[0].q->format().find("LoRA r8"), std::string::npos) << m->weights().layers[0].q->format();
}

TEST(GgufLora, FileHoldsLlamaCppsKeysShapesAndPermutedRows) {
  test::TempDir tmp;
  const GgufLoraResult r = write_gguf_lora({kAdapters / "lora"}, kBase, tmp / "a.gguf", DType::F32);
  EXPECT_EQ(r.rescaled, 0);  // plain LoRA: alpha / r is every module's scale
  const GgufFile f = GgufFile::open(tmp / "a.gguf");
  EXPECT_EQ(f.get_string("general.type"), "adapter");
  EXPECT_EQ(f.get_string("adapter.type"), "lora");
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_FLOAT_EQ(f.get_f32("adapter.lora.alpha"), 16.0f);
  EXPECT_EQ(f.tensors().size(), 4u * 7u * 2u);
  const ModelConfig c = load_model_config(kBase);
  const LoraAdapter peft = read_peft_adapter({kAdapters / "lora"}, c, Checkpoint::open(kBase));
  for (const LoraModule& m : peft.modules) {
    const std::string g = gguf_tensor_name(m.module + ".weight");
    const GgufTensorInfo* a = f.find_tensor(g + ".lora_a");
    const GgufTensorInfo* b = f.find_tensor(g + ".lora_b");
    ASSERT_TRUE(a && b) << g;
    const int64_t r8 = m.rank(), in = m.a.dim(1), out = m.b.dim(0);
    EXPECT_EQ(a->dims, (std::vector<uint64_t>{static_cast<uint64_t>(in), static_cast<uint64_t>(r8)})) << g;
    EXPECT_EQ(b->dims, (std::vector<uint64_t>{static_cast<uint64_t>(r8), static_cast<uint64_t>(out)})) << g;
    EXPECT_EQ(0, std::memcmp(f.tensor_data(*a), m.a.data(), m.a.nbytes())) << g;
    // lora_b's rows in the base GGUF's order: q/k rows interleaved per head.
    const int64_t heads = g.find(".attn_q.") != std::string::npos   ? c.num_attention_heads
                          : g.find(".attn_k.") != std::string::npos ? c.num_key_value_heads
                                                                    : 0;
    const float* got = reinterpret_cast<const float*>(f.tensor_data(*b));
    const float* want = m.b.data_as<float>();
    for (int64_t row = 0; row < out; ++row) {
      const int64_t hd = heads ? out / heads : 1, k = row % hd;
      const int64_t from = heads ? (row / hd) * hd + (k % 2) * (hd / 2) + k / 2 : row;
      ASSERT_EQ(0, std::memcmp(got + row * r8, want + from * r8, static_cast<size_t>(r8) * 4)) << g << " row " << row;
    }
  }
}

TEST(GgufLora, RefusesWhatLlamaCppAdaptersCannotHold) {
  test::TempDir tmp;
  EXPECT_QF_ERROR(write_gguf_lora({kAdapters / "dora"}, kBase, tmp / "d.gguf", DType::F16), ErrorKind::Unsupported, "DoRA");
  EXPECT_QF_ERROR(write_gguf_lora({kAdapters / "rslora-patterns"}, kBase, tmp / "p.gguf", DType::F16),
                  ErrorKind::Unsupported, "lm_head.weight");
  EXPECT_FALSE(fs::exists(tmp / "d.gguf"));
  EXPECT_FALSE(fs::exists(tmp / "p.gguf"));
}

TEST(GgufLora, OnAGgufBaseRunsAsThePeftAdapterOnTheHfBase) {
  test::TempDir tmp;
  GgufConvertOptions g;
  g.preset = "F32";
  ThreadPool pool(2);
  convert_hf_to_gguf(f32_base(), tmp / "base.gguf", g, pool);
  // A scale through the spec: folded into lora_b for llama.cpp, and read back.
  const GgufLoraResult r = write_gguf_lora({kAdapters / "lora", 0.5}, f32_base(), tmp / "a.gguf", DType::F32);
  EXPECT_EQ(r.rescaled, 4 * 7);
  const std::vector<float> hf =
      run_tokens(*load_hf_model(f32_base(), std::nullopt, {{{kAdapters / "lora", 0.5}}, LoraLoad::Mode::Forward}));
  const std::vector<float> gguf = run_tokens(*load_model((tmp / "base.gguf").string(), device::Kind::Cpu, {{{tmp / "a.gguf"}}}));
  const std::vector<float> plain = run_tokens(*load_model((tmp / "base.gguf").string()));
  double scale = 0;
  for (float v : hf) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  EXPECT_LE(max_abs_diff(hf, gguf), kOrderTolerance * scale);
  EXPECT_GT(max_abs_diff(plain, gguf), 50 * kOrderTolerance * scale);
}

}  // namespace
}  // namespace qf::rt
