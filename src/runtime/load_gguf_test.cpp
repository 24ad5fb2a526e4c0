// The runtime's GGUF path: block Linear against dequantized weights, and the
// loader's errors on files that are valid GGUF but not a model it can run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <random>

#include "formats/gguf/gguf_writer.h"
#include "quantizers/kquants.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/q8_0_groups.h"
#include "runtime/model.h"
#include "test_util.h"

namespace qf::rt {
namespace {

using namespace qf::test;

// Few tokens take the block dot products with 8-bit activations, many the
// f32 GEMM on decoded tiles: both against the dequantized weights.
TEST(BlockLinear, MatchesDequantizedWeightsForEveryType) {
  for (const int64_t n : {int64_t{3}, int64_t{40}}) {
  const int64_t rows = 24, cols = 512;
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> w(static_cast<size_t>(rows * cols)), x(static_cast<size_t>(n * cols));
  for (auto& v : w) v = d(rng);
  for (auto& v : x) v = d(rng);
  for (uint32_t type : {ggml_type::Q4_0, ggml_type::Q4_1, ggml_type::Q5_0, ggml_type::Q5_1, ggml_type::Q8_0,
                        ggml_type::Q2_K, ggml_type::Q3_K, ggml_type::Q4_K, ggml_type::Q5_K, ggml_type::Q6_K}) {
    const size_t rb = kquants::row_size(type, cols);
    auto data = std::make_shared<std::vector<uint8_t>>(rb * rows);
    kquants::quantize_rows(type, w.data(), data->data(), rows, cols, nullptr);
    auto lin = make_block_linear(type, data->data(), rows, cols, data, nullptr, "w");
    std::vector<float> y(static_cast<size_t>(n * rows));
    ThreadPool pool(2);
    lin->forward(x.data(), n, y.data(), pool);
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      lin->decode_row(r, row.data());
      for (int64_t t = 0; t < n; ++t) {
        double exact = 0, mag = 0;
        for (int64_t j = 0; j < cols; ++j) {
          exact += static_cast<double>(row[j]) * x[t * cols + j];
          mag += std::fabs(row[j] * x[t * cols + j]);
        }
        // With few tokens the activations are quantized to 8 bits per block,
        // as llama.cpp does; with many they stay f32 (f32 rounding only).
        EXPECT_NEAR(y[t * rows + r], exact, (n < 16 ? 0.01 : 1e-5) * mag) << ggml_type_info(type)->name << " row " << r << " n=" << n;
      }
    }
    EXPECT_EQ(lin->weight_bytes(), rb * rows);
    EXPECT_EQ(lin->format(), ggml_type_info(type)->name);
  }
  }
  EXPECT_QF_ERROR(make_block_linear(ggml_type::Q4_K, nullptr, 1, 100, nullptr, nullptr, "blk.0.ffn_down.weight"),
                  ErrorKind::InvalidInput, "blk.0.ffn_down.weight: row length 100 is not a multiple of the q4_K block size 256");
}

// A minimal llama GGUF: 1 layer, hidden 32, 2 heads, vocab 16, f32 weights.
// `u32` replaces (or adds) UINT32 keys after "<arch>.", `eps` the epsilon.
void write_tiny(const std::filesystem::path& p, const std::string& arch, bool drop_q,
                std::map<std::string, uint32_t> u32 = {}, float eps = 1e-5f) {
  GgufWriter w(p);
  w.add_string("general.architecture", arch);
  std::map<std::string, uint32_t> keys = {{"embedding_length", 32}, {"block_count", 1}, {"attention.head_count", 2},
                                          {"feed_forward_length", 64}, {"context_length", 64}};
  for (const auto& [k, v] : u32) keys[k] = v;
  for (const auto& [k, v] : keys) w.add_u32(arch + "." + k, v);
  w.add_f32(arch + ".attention.layer_norm_rms_epsilon", eps);
  auto add = [&](const std::string& name, std::vector<uint64_t> dims) {
    uint64_t n = 1;
    for (auto v : dims) n *= v;
    std::vector<float> data(n, 0.01f);
    w.add_tensor(name, ggml_type::F32, dims, data.data(), data.size() * 4);
  };
  add("token_embd.weight", {32, 16});
  add("output_norm.weight", {32});
  add("blk.0.attn_norm.weight", {32});
  add("blk.0.ffn_norm.weight", {32});
  if (!drop_q) add("blk.0.attn_q.weight", {32, 32});
  add("blk.0.attn_k.weight", {32, 32});
  add("blk.0.attn_v.weight", {32, 32});
  add("blk.0.attn_output.weight", {32, 32});
  add("blk.0.ffn_gate.weight", {32, 64});
  add("blk.0.ffn_up.weight", {32, 64});
  add("blk.0.ffn_down.weight", {64, 32});
  w.finish();
}

TEST(LoadGguf, TinyModelLoadsAndBadOnesFailClearly) {
  TempDir t;
  write_tiny(t.path() / "ok.gguf", "llama", false);
  auto m = load_gguf_model(t.path() / "ok.gguf");
  EXPECT_EQ(m->config().vocab_size, 16);
  EXPECT_TRUE(m->config().tie_word_embeddings);
  EXPECT_EQ(m->config().num_key_value_heads, 2);
  write_tiny(t.path() / "gpt2.gguf", "gpt2", false);
  EXPECT_QF_ERROR(load_gguf_model(t.path() / "gpt2.gguf"), ErrorKind::Unsupported, "general.architecture 'gpt2'");
  write_tiny(t.path() / "noq.gguf", "llama", true);
  EXPECT_QF_ERROR(load_gguf_model(t.path() / "noq.gguf"), ErrorKind::NotFound, "tensor 'blk.0.attn_q.weight' is missing");
  write_file(t.path() / "junk.gguf", "GGUF\x03");
  EXPECT_QF_ERROR(load_model((t.path() / "junk.gguf").string()), ErrorKind::InvalidInput, "junk.gguf");
  write_file(t.path() / "x.bin", "abc");
  EXPECT_QF_ERROR(load_model((t.path() / "x.bin").string()), ErrorKind::Unsupported, "neither");
}

// Hyper-parameters the runtime divides by or sizes buffers with: each broken
// one is InvalidInput naming the GGUF key (head_count 0 was a SIGFPE).
TEST(LoadGguf, HyperParametersAreValidated) {
  TempDir t;
  struct Case {
    std::map<std::string, uint32_t> u32;
    float eps;
    ErrorKind kind;
    const char* fragment;
  };
  const Case cases[] = {
      {{{"attention.head_count", 0}}, 1e-5f, ErrorKind::InvalidInput, "'llama.attention.head_count' is 0, must be a positive integer"},
      {{{"attention.head_count_kv", 0}}, 1e-5f, ErrorKind::InvalidInput, "'llama.attention.head_count_kv' is 0"},
      {{{"block_count", 0}}, 1e-5f, ErrorKind::InvalidInput, "'llama.block_count' is 0"},
      {{{"embedding_length", 0}}, 1e-5f, ErrorKind::InvalidInput, "'llama.embedding_length' is 0"},
      {{{"feed_forward_length", 0}}, 1e-5f, ErrorKind::InvalidInput, "'llama.feed_forward_length' is 0"},
      {{{"attention.head_count", 3}}, 1e-5f, ErrorKind::InvalidInput,
       "'llama.embedding_length' 32 is not divisible by 'llama.attention.head_count' 3"},
      {{{"attention.head_count", 4}, {"attention.head_count_kv", 3}}, 1e-5f, ErrorKind::InvalidInput,
       "'llama.attention.head_count' 4 is not a multiple of 'llama.attention.head_count_kv' 3"},
      {{{"attention.key_length", 0}}, 1e-5f, ErrorKind::InvalidInput, "'llama.attention.key_length' is 0"},
      {{{"attention.key_length", 15}}, 1e-5f, ErrorKind::InvalidInput, "'llama.attention.key_length' is 15, must be even"},
      {{{"rope.dimension_count", 0}}, 1e-5f, ErrorKind::InvalidInput, "'llama.rope.dimension_count' is 0"},
      {{{"rope.dimension_count", 8}}, 1e-5f, ErrorKind::Unsupported, "(partial RoPE)"},
      {{{"attention.value_length", 8}}, 1e-5f, ErrorKind::Unsupported, "'llama.attention.value_length' 8 differs from the key length 16"},
      {{{"block_count", 2}}, 1e-5f, ErrorKind::InvalidInput, "'llama.block_count' is 2, but there is no tensor for layer 1"},
      {{}, -1e-5f, ErrorKind::InvalidInput, "'llama.attention.layer_norm_rms_epsilon' is -1e-05, must be a positive finite number"},
      {{}, 0.0f, ErrorKind::InvalidInput, "'llama.attention.layer_norm_rms_epsilon' is 0"},
      {{}, INFINITY, ErrorKind::InvalidInput, "'llama.attention.layer_norm_rms_epsilon' is inf"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fragment);
    write_tiny(t.path() / "bad.gguf", "llama", false, c.u32, c.eps);
    EXPECT_QF_ERROR(load_gguf_model(t.path() / "bad.gguf"), c.kind, "bad.gguf: ");
    EXPECT_QF_ERROR(load_gguf_model(t.path() / "bad.gguf"), c.kind, c.fragment);
  }
}

// A llama GGUF whose Linears are all Q8_0 (hidden 64, 2 heads, ff 128, vocab
// 48), with an output tensor or tied to the embedding table.
void write_q8_0_model(const std::filesystem::path& p, bool tied) {
  GgufWriter w(p);
  w.add_string("general.architecture", "llama");
  for (const auto& [k, v] : std::map<std::string, uint32_t>{{"embedding_length", 64}, {"block_count", 2},
                                                            {"attention.head_count", 2}, {"feed_forward_length", 128},
                                                            {"context_length", 64}})
    w.add_u32("llama." + k, v);
  w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  std::mt19937 rng(9);
  std::normal_distribution<float> g(0.0f, 0.2f);
  auto add = [&](const std::string& name, uint64_t cols, uint64_t rows) {
    std::vector<float> x(cols * rows);
    for (auto& v : x) v = rows == 1 ? 1.0f + 0.1f * g(rng) : g(rng);
    if (rows == 1) return w.add_tensor(name, ggml_type::F32, {cols}, x.data(), x.size() * 4);
    std::vector<uint8_t> q(kquants::row_size(ggml_type::Q8_0, static_cast<int64_t>(cols)) * rows);
    kquants::quantize_rows(ggml_type::Q8_0, x.data(), q.data(), static_cast<int64_t>(rows), static_cast<int64_t>(cols), nullptr);
    w.add_tensor(name, ggml_type::Q8_0, {cols, rows}, q.data(), q.size());
  };
  add("token_embd.weight", 64, 48);
  add("output_norm.weight", 64, 1);
  if (!tied) add("output.weight", 64, 48);
  for (int l = 0; l < 2; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    add(b + "attn_norm.weight", 64, 1);
    add(b + "ffn_norm.weight", 64, 1);
    for (const char* n : {"attn_q", "attn_k", "attn_v", "attn_output"}) add(b + n + ".weight", 64, 64);
    add(b + "ffn_gate.weight", 64, 128);
    add(b + "ffn_up.weight", 64, 128);
    add(b + "ffn_down.weight", 128, 64);
  }
  w.finish();
}

// Logits of a 20-token prompt (the GEMM path) then 3 decode steps.
std::vector<float> run_tokens(const Model& m) {
  ThreadPool pool(2);
  KvCache cache = m.make_cache(KvDType::F16, 32);
  const int32_t s = cache.add_sequence();
  std::vector<float> all, logits;
  Batch b;
  for (int i = 0; i < 20; ++i) b.add((i * 7) % 48, s, i, true);
  m.forward(b, cache, logits, pool);
  all = logits;
  for (int i = 20; i < 23; ++i) {
    b.clear();
    b.add((i * 5) % 48, s, i, true);
    m.forward(b, cache, logits, pool);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

// Loaded for the CPU and read into memory, Q8_0 weights are regrouped where
// the CPU has the groups' kernel (device_form None); for the device, or
// mapped, they stay as stored. The logits are the same floats either way.
TEST(LoadGguf, Q8_0RegroupingForTheCpuChangesNoResult) {
  const char* saved = std::getenv("QF_WEIGHTS");
  const std::string keep = saved ? saved : "";
  TempDir t;
  for (bool tied : {false, true}) {
    const auto file = t.path() / (tied ? "tied.gguf" : "q8.gguf");
    write_q8_0_model(file, tied);
    setenv("QF_WEIGHTS", "memory", 1);
    auto cpu = load_gguf_model(file, device::Kind::Cpu);
    auto dev = load_gguf_model(file, device::Kind::Host);
    setenv("QF_WEIGHTS", "map", 1);
    auto mapped = load_gguf_model(file, device::Kind::Cpu);
    const auto regrouped = q8_0_groups_fast() ? DeviceWeightForm::Kind::None : DeviceWeightForm::Kind::GgufBlocks;
    EXPECT_EQ(cpu->weights().layers[1].q->device_form().kind, regrouped);
    EXPECT_EQ(cpu->weights().lm_head->device_form().kind, regrouped);
    // The embedding table is only read by rows unless the head shares it.
    EXPECT_EQ(cpu->weights().embed->device_form().kind, tied ? regrouped : DeviceWeightForm::Kind::GgufBlocks);
    EXPECT_EQ(dev->weights().layers[1].q->device_form().kind, DeviceWeightForm::Kind::GgufBlocks);
    EXPECT_EQ(mapped->weights().layers[1].q->device_form().kind, DeviceWeightForm::Kind::GgufBlocks);
    const std::vector<float> a = run_tokens(*cpu), b = run_tokens(*dev), c = run_tokens(*mapped);
    ASSERT_EQ(a.size(), size_t{23 * 48});
    EXPECT_EQ(a, b) << (tied ? "tied" : "untied");
    EXPECT_EQ(a, c) << (tied ? "tied" : "untied");
  }
  if (saved) setenv("QF_WEIGHTS", keep.c_str(), 1);
  else unsetenv("QF_WEIGHTS");
}

}  // namespace
}  // namespace qf::rt
