#include "quantizers/gguf_mix.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "formats/gguf/gguf.h"
#include "test_util.h"

using namespace qf::test;
using namespace qf::gguf_mix;
namespace gt = qf::ggml_type;

namespace {

// A Llama-style tensor list, deliberately in reverse order (plan() must sort).
std::vector<TensorDesc> llama_layout(int n_layer, int64_t dim, int64_t ff, int64_t kv_dim, int64_t vocab,
                                     bool with_output = true) {
  std::vector<TensorDesc> t;
  t.push_back({"token_embd.weight", {dim, vocab}});
  t.push_back({"output_norm.weight", {dim}});
  if (with_output) t.push_back({"output.weight", {dim, vocab}});
  for (int i = 0; i < n_layer; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    t.push_back({b + "attn_norm.weight", {dim}});
    t.push_back({b + "attn_q.weight", {dim, dim}});
    t.push_back({b + "attn_k.weight", {dim, kv_dim}});
    t.push_back({b + "attn_v.weight", {dim, kv_dim}});
    t.push_back({b + "attn_output.weight", {dim, dim}});
    t.push_back({b + "ffn_norm.weight", {dim}});
    t.push_back({b + "ffn_gate.weight", {dim, ff}});
    t.push_back({b + "ffn_up.weight", {dim, ff}});
    t.push_back({b + "ffn_down.weight", {ff, dim}});
  }
  std::reverse(t.begin(), t.end());
  return t;
}

std::map<std::string, TensorPlan> by_name(const std::vector<TensorPlan>& plans) {
  std::map<std::string, TensorPlan> m;
  for (const auto& p : plans) m[p.name] = p;
  return m;
}

std::string layer_name(int i, const std::string& what) { return "blk." + std::to_string(i) + "." + what + ".weight"; }

// Layers whose `what` tensor got `type`.
std::vector<int> layers_with(const std::map<std::string, TensorPlan>& m, int n_layer, const std::string& what,
                             uint32_t type) {
  std::vector<int> out;
  for (int i = 0; i < n_layer; ++i)
    if (m.at(layer_name(i, what)).type == type) out.push_back(i);
  return out;
}

const ModelDesc kLlama7B{"llama", 32, 32, 32, 0};

}  // namespace

TEST(GgufMix, PresetsParseCaseInsensitiveWithAliases) {
  EXPECT_EQ(parse_preset("q4_k_m").name, "Q4_K_M");
  EXPECT_EQ(parse_preset("Q4_K_M").ftype, 15u);
  EXPECT_EQ(parse_preset("Q4_K").name, "Q4_K_M");
  EXPECT_EQ(parse_preset("q3_k").name, "Q3_K_M");
  EXPECT_EQ(parse_preset("Q5_K").name, "Q5_K_M");
  EXPECT_EQ(parse_preset("bf16").ftype, 32u);
  EXPECT_EQ(parse_preset("bf16").base_type, gt::BF16);
  EXPECT_EQ(parse_preset("f32").ftype, 0u);
  EXPECT_EQ(parse_preset("Q8_0").ftype, 7u);
  EXPECT_EQ(parse_preset("Q5_0").ftype, 8u);
  EXPECT_EQ(parse_preset("Q5_1").base_type, gt::Q5_1);
  EXPECT_EQ(parse_preset("Q2_K").ftype, 10u);
  EXPECT_EQ(parse_preset("Q3_K_L").ftype, 13u);
  EXPECT_EQ(parse_preset("Q6_K").ftype, 18u);
  EXPECT_EQ(presets().size(), 17u);
  EXPECT_QF_ERROR(parse_preset("Q4_K_X"), qf::ErrorKind::Usage, "Q4_K_M");
  EXPECT_QF_ERROR(parse_preset("IQ2_XS"), qf::ErrorKind::Usage, "IQ2_XS");
}

TEST(GgufMix, SortedTensorOrderFollowsWeightNameComparer) {
  const auto order = sorted_tensor_order({"blk.10.attn_q.weight", "blk.2.ffn_up.weight", "token_embd.weight",
                                          "blk.2.attn_k.weight", "output.weight", "blk.0.attn_v.weight",
                                          "output_norm.weight"});
  const std::vector<std::string> want = {"output.weight",        "output_norm.weight",  "token_embd.weight",
                                         "blk.0.attn_v.weight",  "blk.2.attn_k.weight", "blk.2.ffn_up.weight",
                                         "blk.10.attn_q.weight"};
  EXPECT_EQ(order, want);
  EXPECT_TRUE(weight_name_less("blk.2.x", "blk.10.x"));
  EXPECT_FALSE(weight_name_less("blk.10.x", "blk.2.x"));
}

TEST(GgufMix, Llama7BQ4KM) {
  const auto plans = plan(parse_preset("Q4_K_M"), kLlama7B, llama_layout(32, 4096, 11008, 4096, 32000), false);
  ASSERT_EQ(plans.size(), 3u + 32u * 9u);
  // Processing order: non-block tensors first, then block 0, 1, ..., 10 after 9.
  EXPECT_EQ(plans[0].name, "output.weight");
  EXPECT_EQ(plans[1].name, "output_norm.weight");
  EXPECT_EQ(plans[2].name, "token_embd.weight");
  EXPECT_EQ(plans[3].name, "blk.0.attn_k.weight");
  EXPECT_EQ(plans[3 + 9 * 10].name, "blk.10.attn_k.weight");

  const auto m = by_name(plans);
  // use_more_bits(i, 32): i < 4 || i >= 28 || (i - 4) % 3 == 2.
  const std::vector<int> more = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31};
  EXPECT_EQ(layers_with(m, 32, "attn_v", gt::Q6_K), more);
  EXPECT_EQ(layers_with(m, 32, "ffn_down", gt::Q6_K), more);
  EXPECT_EQ(layers_with(m, 32, "attn_v", gt::Q4_K).size(), 16u);
  EXPECT_EQ(layers_with(m, 32, "ffn_down", gt::Q4_K).size(), 16u);
  EXPECT_EQ(layers_with(m, 32, "attn_q", gt::Q4_K).size(), 32u);
  EXPECT_EQ(layers_with(m, 32, "attn_k", gt::Q4_K).size(), 32u);
  EXPECT_EQ(layers_with(m, 32, "attn_output", gt::Q4_K).size(), 32u);
  EXPECT_EQ(layers_with(m, 32, "ffn_gate", gt::Q4_K).size(), 32u);
  EXPECT_EQ(layers_with(m, 32, "ffn_up", gt::Q4_K).size(), 32u);
  EXPECT_EQ(m.at("output.weight").type, gt::Q6_K);
  EXPECT_EQ(m.at("token_embd.weight").type, gt::Q4_K);
  EXPECT_TRUE(m.at("token_embd.weight").quantized);
  EXPECT_EQ(m.at("output_norm.weight").type, gt::F32);
  EXPECT_FALSE(m.at("output_norm.weight").quantized);
  EXPECT_EQ(m.at("blk.5.ffn_norm.weight").type, gt::F32);
  for (const auto& p : plans) EXPECT_TRUE(p.note.empty()) << p.name << ": " << p.note;
}

TEST(GgufMix, Q3KM) {
  const auto m = by_name(plan(parse_preset("Q3_K_M"), kLlama7B, llama_layout(32, 4096, 11008, 4096, 32000), false));
  EXPECT_EQ(layers_with(m, 32, "attn_v", gt::Q5_K), (std::vector<int>{0, 1}));
  EXPECT_EQ(layers_with(m, 32, "attn_v", gt::Q4_K).size(), 30u);
  EXPECT_EQ(layers_with(m, 32, "ffn_down", gt::Q5_K), (std::vector<int>{0, 1}));  // n/16 = 2
  EXPECT_EQ(layers_with(m, 32, "ffn_down", gt::Q4_K).size(), 30u);
  EXPECT_EQ(layers_with(m, 32, "attn_output", gt::Q4_K).size(), 32u);
  EXPECT_EQ(layers_with(m, 32, "attn_q", gt::Q3_K).size(), 32u);
  EXPECT_EQ(layers_with(m, 32, "ffn_up", gt::Q3_K).size(), 32u);
  EXPECT_EQ(m.at("output.weight").type, gt::Q6_K);
  EXPECT_EQ(m.at("token_embd.weight").type, gt::Q3_K);
}

TEST(GgufMix, Q3KSAndQ3KL) {
  const auto s = by_name(plan(parse_preset("Q3_K_S"), kLlama7B, llama_layout(32, 4096, 11008, 4096, 32000), false));
  EXPECT_EQ(layers_with(s, 32, "attn_v", gt::Q3_K).size(), 32u);
  EXPECT_EQ(layers_with(s, 32, "ffn_down", gt::Q3_K).size(), 32u);
  EXPECT_EQ(s.at("output.weight").type, gt::Q6_K);
  const auto l = by_name(plan(parse_preset("Q3_K_L"), kLlama7B, llama_layout(32, 4096, 11008, 4096, 32000), false));
  EXPECT_EQ(layers_with(l, 32, "attn_v", gt::Q5_K).size(), 32u);
  EXPECT_EQ(layers_with(l, 32, "ffn_down", gt::Q5_K).size(), 32u);
  EXPECT_EQ(layers_with(l, 32, "attn_output", gt::Q5_K).size(), 32u);
  EXPECT_EQ(layers_with(l, 32, "attn_q", gt::Q3_K).size(), 32u);
}

TEST(GgufMix, Q2KWithAndWithoutGqa) {
  const ModelDesc gqa{"llama", 32, 32, 8, 0};  // n_gqa = 4
  const auto a = by_name(plan(parse_preset("Q2_K"), gqa, llama_layout(32, 4096, 14336, 1024, 32000), false));
  EXPECT_EQ(layers_with(a, 32, "attn_v", gt::Q4_K).size(), 32u);
  EXPECT_EQ(layers_with(a, 32, "ffn_down", gt::Q3_K).size(), 32u);
  EXPECT_EQ(layers_with(a, 32, "attn_output", gt::Q3_K).size(), 32u);
  EXPECT_EQ(layers_with(a, 32, "attn_q", gt::Q2_K).size(), 32u);
  EXPECT_EQ(a.at("token_embd.weight").type, gt::Q2_K);
  EXPECT_EQ(a.at("output.weight").type, gt::Q6_K);

  const ModelDesc gqa2{"llama", 32, 32, 16, 0};  // n_gqa = 2
  const auto b = by_name(plan(parse_preset("Q2_K"), gqa2, llama_layout(32, 4096, 11008, 2048, 32000), false));
  EXPECT_EQ(layers_with(b, 32, "attn_v", gt::Q3_K).size(), 32u);
  const auto c = by_name(plan(parse_preset("Q2_K"), kLlama7B, llama_layout(32, 4096, 11008, 4096, 32000), false));
  EXPECT_EQ(layers_with(c, 32, "attn_v", gt::Q3_K).size(), 32u);
}

TEST(GgufMix, Q4KS) {
  const auto m = by_name(plan(parse_preset("Q4_K_S"), kLlama7B, llama_layout(32, 4096, 11008, 4096, 32000), false));
  EXPECT_EQ(layers_with(m, 32, "attn_v", gt::Q5_K), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(layers_with(m, 32, "ffn_down", gt::Q5_K), (std::vector<int>{0, 1, 2, 3}));  // n/8 = 4
  EXPECT_EQ(layers_with(m, 32, "attn_v", gt::Q4_K).size(), 28u);
  EXPECT_EQ(layers_with(m, 32, "attn_output", gt::Q4_K).size(), 32u);
  EXPECT_EQ(m.at("output.weight").type, gt::Q6_K);
}

TEST(GgufMix, Q5KMAndQ5KSAndQ6K) {
  const auto m = by_name(plan(parse_preset("Q5_K_M"), kLlama7B, llama_layout(32, 4096, 11008, 4096, 32000), false));
  const std::vector<int> more = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31};
  EXPECT_EQ(layers_with(m, 32, "attn_v", gt::Q6_K), more);
  EXPECT_EQ(layers_with(m, 32, "ffn_down", gt::Q6_K), more);
  EXPECT_EQ(layers_with(m, 32, "attn_v", gt::Q5_K).size(), 16u);
  EXPECT_EQ(layers_with(m, 32, "attn_output", gt::Q5_K).size(), 32u);
  EXPECT_EQ(m.at("token_embd.weight").type, gt::Q5_K);
  EXPECT_EQ(m.at("output.weight").type, gt::Q6_K);

  const auto s = by_name(plan(parse_preset("Q5_K_S"), kLlama7B, llama_layout(32, 4096, 11008, 4096, 32000), false));
  EXPECT_EQ(layers_with(s, 32, "attn_v", gt::Q5_K).size(), 32u);
  EXPECT_EQ(layers_with(s, 32, "ffn_down", gt::Q5_K).size(), 32u);
  EXPECT_EQ(s.at("output.weight").type, gt::Q6_K);

  const auto q6 = by_name(plan(parse_preset("Q6_K"), kLlama7B, llama_layout(32, 4096, 11008, 4096, 32000), false));
  EXPECT_EQ(layers_with(q6, 32, "ffn_down", gt::Q6_K).size(), 32u);
  EXPECT_EQ(q6.at("output.weight").type, gt::Q6_K);
}

TEST(GgufMix, Q8_0OutputStaysQ8_0) {
  const auto m = by_name(plan(parse_preset("Q8_0"), kLlama7B, llama_layout(32, 4096, 11008, 4096, 32000), true));
  EXPECT_EQ(m.at("output.weight").type, gt::Q8_0);
  EXPECT_EQ(m.at("token_embd.weight").type, gt::Q8_0);
  EXPECT_EQ(layers_with(m, 32, "attn_v", gt::Q8_0).size(), 32u);
  EXPECT_EQ(layers_with(m, 32, "ffn_down", gt::Q8_0).size(), 32u);  // no Q4_0/Q5_0-style imatrix rule
}

TEST(GgufMix, LegacyQ4_0OutputAndImatrixFfnDown) {
  const auto no_im = by_name(plan(parse_preset("Q4_0"), kLlama7B, llama_layout(32, 4096, 11008, 4096, 32000), false));
  EXPECT_EQ(layers_with(no_im, 32, "ffn_down", gt::Q4_0).size(), 32u);
  EXPECT_EQ(no_im.at("output.weight").type, gt::Q6_K);
  EXPECT_EQ(no_im.at("token_embd.weight").type, gt::Q4_0);

  const auto im = by_name(plan(parse_preset("Q4_0"), kLlama7B, llama_layout(32, 4096, 11008, 4096, 32000), true));
  EXPECT_EQ(layers_with(im, 32, "ffn_down", gt::Q4_1), (std::vector<int>{0, 1, 2, 3}));  // i < n/8
  EXPECT_EQ(layers_with(im, 32, "ffn_down", gt::Q4_0).size(), 28u);
  EXPECT_EQ(layers_with(im, 32, "attn_v", gt::Q4_0).size(), 32u);

  const auto q5 = by_name(plan(parse_preset("Q5_0"), kLlama7B, llama_layout(32, 4096, 11008, 4096, 32000), true));
  EXPECT_EQ(layers_with(q5, 32, "ffn_down", gt::Q5_1), (std::vector<int>{0, 1, 2, 3}));
  const auto q41 = by_name(plan(parse_preset("Q4_1"), kLlama7B, llama_layout(32, 4096, 11008, 4096, 32000), true));
  EXPECT_EQ(layers_with(q41, 32, "ffn_down", gt::Q4_1).size(), 32u);
}

TEST(GgufMix, TiedEmbeddingsTreatTokenEmbdAsOutput) {
  const auto m =
      by_name(plan(parse_preset("Q4_K_M"), kLlama7B, llama_layout(32, 4096, 11008, 4096, 32000, false), false));
  EXPECT_EQ(m.count("output.weight"), 0u);
  EXPECT_EQ(m.at("token_embd.weight").type, gt::Q6_K);
  const auto q8 =
      by_name(plan(parse_preset("Q8_0"), kLlama7B, llama_layout(32, 4096, 11008, 4096, 32000, false), false));
  EXPECT_EQ(q8.at("token_embd.weight").type, gt::Q8_0);
}

TEST(GgufMix, FloatPresets) {
  for (const char* name : {"F32", "F16", "BF16"}) {
    const Preset& p = parse_preset(name);
    const auto m = by_name(plan(p, kLlama7B, llama_layout(4, 256, 512, 256, 1000), false));
    EXPECT_EQ(m.at("output.weight").type, p.base_type) << name;
    EXPECT_EQ(m.at("token_embd.weight").type, p.base_type) << name;
    EXPECT_EQ(m.at("blk.3.attn_v.weight").type, p.base_type) << name;
    EXPECT_EQ(m.at("blk.0.ffn_down.weight").type, p.base_type) << name;
    EXPECT_EQ(m.at("blk.0.attn_norm.weight").type, gt::F32) << name;
    EXPECT_FALSE(m.at("blk.0.ffn_down.weight").quantized);
  }
}

TEST(GgufMix, Stories260KShapesFallBack) {
  // dim 64, hidden 172, 5 layers, 8 heads, 4 kv heads, vocab 512.
  const ModelDesc m{"llama", 5, 8, 4, 0};
  const auto plans = plan(parse_preset("Q4_K_M"), m, llama_layout(5, 64, 172, 32, 512), false);
  const auto p = by_name(plans);
  // output: 64 % 256 != 0 -> Q8_0 directly (llama.cpp's output rule).
  EXPECT_EQ(p.at("output.weight").type, gt::Q8_0);
  EXPECT_NE(p.at("output.weight").note.find("using q8_0"), std::string::npos) << p.at("output.weight").note;
  // every k-quant falls back: Q4_K -> Q5_0 for rows of 64.
  EXPECT_EQ(p.at("token_embd.weight").type, gt::Q5_0);
  EXPECT_EQ(p.at("token_embd.weight").note,
            "token_embd.weight: row length 64 is not a multiple of 256 (q4_K); using q5_0");
  EXPECT_EQ(layers_with(p, 5, "attn_q", gt::Q5_0).size(), 5u);
  EXPECT_EQ(layers_with(p, 5, "ffn_up", gt::Q5_0).size(), 5u);
  // attn_v: use_more_bits(i, 5) holds for i = 2 and 4 -> Q6_K -> Q8_0.
  EXPECT_EQ(layers_with(p, 5, "attn_v", gt::Q8_0), (std::vector<int>{2, 4}));
  EXPECT_EQ(layers_with(p, 5, "attn_v", gt::Q5_0), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(p.at("blk.2.attn_v.weight").note,
            "blk.2.attn_v.weight: row length 64 is not a multiple of 256 (q6_K); using q8_0");
  // ffn_down rows of 172: neither 256 nor 32 divides them -> F16.
  EXPECT_EQ(layers_with(p, 5, "ffn_down", gt::F16).size(), 5u);
  EXPECT_EQ(p.at("blk.2.ffn_down.weight").note,  // use_more_bits(2, 5): Q6_K -> Q8_0 -> F16
            "blk.2.ffn_down.weight: row length 172 is not a multiple of 256 (q6_K); using f16");
  EXPECT_EQ(p.at("blk.1.ffn_down.weight").note,
            "blk.1.ffn_down.weight: row length 172 is not a multiple of 256 (q4_K); using f16");
  EXPECT_FALSE(p.at("blk.1.ffn_down.weight").quantized);
  EXPECT_EQ(p.at("blk.0.attn_norm.weight").note, "");

  // Q3_K -> Q4_0, Q5_K -> Q5_1.
  const auto q3 = by_name(plan(parse_preset("Q3_K_S"), m, llama_layout(5, 64, 172, 32, 512), false));
  EXPECT_EQ(q3.at("blk.0.attn_q.weight").type, gt::Q4_0);
  const auto q5 = by_name(plan(parse_preset("Q5_K_S"), m, llama_layout(5, 64, 172, 32, 512), false));
  EXPECT_EQ(q5.at("blk.0.attn_q.weight").type, gt::Q5_1);
  EXPECT_EQ(q5.at("blk.0.ffn_down.weight").type, gt::F16);

  // Legacy types have no fallback in llama.cpp (it aborts): here a row of 172 stays F16, with a note.
  const auto q8 = by_name(plan(parse_preset("Q8_0"), m, llama_layout(5, 64, 172, 32, 512), false));
  EXPECT_EQ(q8.at("blk.0.attn_q.weight").type, gt::Q8_0);
  EXPECT_EQ(q8.at("blk.0.ffn_down.weight").type, gt::F16);
  EXPECT_EQ(q8.at("blk.0.ffn_down.weight").note,
            "blk.0.ffn_down.weight: row length 172 is not a multiple of 32 (q8_0); using f16");
}

TEST(GgufMix, MoEUsesLayerFromName) {
  const ModelDesc moe{"llama", 8, 32, 8, 8};
  std::vector<TensorDesc> t;
  for (int i = 7; i >= 0; --i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    t.push_back({b + "ffn_down_exps.weight", {14336, 4096, 8}});
    t.push_back({b + "ffn_down_shexp.weight", {14336, 4096}});
    t.push_back({b + "ffn_gate_inp.weight", {4096, 8}});
    t.push_back({b + "attn_v.weight", {4096, 1024}});
    t.push_back({b + "attn_k.weight", {4096, 1024}});
    t.push_back({b + "attn_output.weight", {4096, 4096}});
  }
  t.push_back({"output.weight", {4096, 32000}});
  const auto m = by_name(plan(parse_preset("Q4_K_M"), moe, t, false));
  // use_more_bits(i, 8): i < 1 || i >= 7 || (i - 1) % 3 == 2 -> 0, 3, 6, 7; both ffn_down tensors of a layer agree.
  EXPECT_EQ(layers_with(m, 8, "ffn_down_exps", gt::Q6_K), (std::vector<int>{0, 3, 6, 7}));
  EXPECT_EQ(layers_with(m, 8, "ffn_down_shexp", gt::Q6_K), (std::vector<int>{0, 3, 6, 7}));
  EXPECT_EQ(layers_with(m, 8, "attn_v", gt::Q8_0).size(), 8u);       // 8 experts
  EXPECT_EQ(layers_with(m, 8, "attn_k", gt::Q8_0).size(), 8u);
  EXPECT_EQ(layers_with(m, 8, "attn_output", gt::Q5_K).size(), 8u);
  EXPECT_EQ(layers_with(m, 8, "ffn_gate_inp", gt::F32).size(), 8u);  // never quantized
  EXPECT_TRUE(m.at("blk.0.ffn_down_exps.weight").quantized);

  std::vector<TensorDesc> bad = {{"blk.9.ffn_down_exps.weight", {256, 256, 8}}};
  EXPECT_QF_ERROR(plan(parse_preset("Q4_K_M"), moe, bad, false), qf::ErrorKind::InvalidInput,
                  "blk.9.ffn_down_exps.weight");
}

TEST(GgufMix, SeventyBAndFalcon) {
  const ModelDesc l70{"llama", 80, 64, 8, 0};
  const auto m = by_name(plan(parse_preset("Q4_K_M"), l70, llama_layout(80, 8192, 28672, 1024, 32000), false));
  // attn_v: Q6_K where use_more_bits(i, 80), Q4_K -> Q5_K elsewhere (70B rule).
  EXPECT_EQ(layers_with(m, 80, "attn_v", gt::Q4_K).size(), 0u);
  EXPECT_EQ(m.at("blk.11.attn_v.weight").type, gt::Q5_K);  // (11 - 10) % 3 != 2
  EXPECT_EQ(m.at("blk.12.attn_v.weight").type, gt::Q6_K);
  EXPECT_EQ(m.at("blk.11.ffn_down.weight").type, gt::Q4_K);

  const ModelDesc falcon{"falcon", 32, 71, 1, 0};
  const auto f = by_name(plan(parse_preset("Q4_K_M"), falcon, llama_layout(32, 4096, 16384, 64, 65024), false));
  EXPECT_EQ(f.at("output.weight").type, gt::Q8_0);
  EXPECT_EQ(f.at("output.weight").note, "");  // Falcon's rule, not a shape fallback
  EXPECT_EQ(f.at("blk.0.ffn_down.weight").type, gt::Q6_K);   // i < n/16
  EXPECT_EQ(f.at("blk.2.ffn_down.weight").type, gt::Q5_K);   // use_more_bits
  EXPECT_EQ(f.at("blk.4.ffn_down.weight").type, gt::Q4_K);
}

TEST(GgufMix, RejectsBadDescriptions) {
  const Preset& p = parse_preset("Q4_K_M");
  EXPECT_QF_ERROR(plan(p, ModelDesc{"llama", 0, 1, 1, 0}, {}, false), qf::ErrorKind::InvalidInput, "n_layer");
  EXPECT_QF_ERROR(plan(p, kLlama7B, {{"a.weight", {256, 256}}, {"a.weight", {256, 256}}}, false),
                  qf::ErrorKind::InvalidInput, "duplicate");
  EXPECT_QF_ERROR(plan(p, kLlama7B, {{"a.weight", {256, 0}}}, false), qf::ErrorKind::InvalidInput, "a.weight");
  EXPECT_QF_ERROR(plan(p, kLlama7B, {{"a.weight", {}}}, false), qf::ErrorKind::InvalidInput, "a.weight");
}

TEST(GgufMix, NonQuantizedTensorsFollowConverter) {
  const std::vector<TensorDesc> t = {{"blk.0.attn_q.bias", {4096}},
                                     {"blk.0.attn_q.weight", {4096, 4096}},
                                     {"blk.0.attn_q_norm.weight", {128}},
                                     {"rope_freqs.weight", {64}},
                                     {"blk.0.x.weight", {4096, 1}},  // ggml_n_dims == 1
                                     {"position_embd.weight", {4096, 2048}},
                                     {"blk.0.altup_proj.weight", {256, 256}}};
  const auto m = by_name(plan(parse_preset("Q4_K_M"), kLlama7B, t, false));
  EXPECT_EQ(m.at("blk.0.attn_q.bias").type, gt::F32);
  EXPECT_EQ(m.at("blk.0.attn_q.weight").type, gt::Q4_K);
  EXPECT_EQ(m.at("blk.0.attn_q_norm.weight").type, gt::F32);
  EXPECT_EQ(m.at("rope_freqs.weight").type, gt::F32);
  EXPECT_EQ(m.at("blk.0.x.weight").type, gt::F32);
  EXPECT_EQ(m.at("position_embd.weight").type, gt::F32);
  EXPECT_EQ(m.at("blk.0.altup_proj.weight").type, gt::F16);
  const auto b = by_name(plan(parse_preset("BF16"), kLlama7B, t, false));
  EXPECT_EQ(b.at("blk.0.altup_proj.weight").type, gt::BF16);
  EXPECT_EQ(b.at("position_embd.weight").type, gt::F32);
}

// llama-quantize's --output-tensor-type / --token-embedding-type: set last by
// exact name for any preset, the output type through the output rule (so a
// tied token_embd takes it too, with the row-length fallback), and refused
// when its block does not divide an overridden tensor's rows.
TEST(GgufMix, OutputAndTokenEmbeddingTypeOverrides) {
  const Preset& q4 = parse_preset("Q4_K_M");
  TypeOverrides ov;
  ov.output = gt::F16, ov.token_embd = gt::Q8_0;
  auto m = by_name(plan(q4, kLlama7B, llama_layout(32, 4096, 11008, 4096, 32000), false, ov));
  EXPECT_EQ(m.at("output.weight").type, gt::F16);
  EXPECT_FALSE(m.at("output.weight").quantized);
  EXPECT_EQ(m.at("token_embd.weight").type, gt::Q8_0);
  EXPECT_EQ(m.at("blk.0.attn_v.weight").type, gt::Q6_K);  // the rest as without overrides
  EXPECT_EQ(m.at("blk.1.attn_q.weight").type, gt::Q4_K);

  // Tied embeddings: token_embd follows the output override, its own wins.
  TypeOverrides out_only;
  out_only.output = gt::Q5_K;
  m = by_name(plan(q4, kLlama7B, llama_layout(32, 4096, 11008, 4096, 32000, false), false, out_only));
  EXPECT_EQ(m.at("token_embd.weight").type, gt::Q5_K);
  m = by_name(plan(q4, kLlama7B, llama_layout(32, 4096, 11008, 4096, 32000, false), false, ov));
  EXPECT_EQ(m.at("token_embd.weight").type, gt::Q8_0);

  // Float presets take them as well; the layers stay float.
  m = by_name(plan(parse_preset("F16"), kLlama7B, llama_layout(2, 4096, 11008, 4096, 32000), false, out_only));
  EXPECT_EQ(m.at("output.weight").type, gt::Q5_K);
  EXPECT_EQ(m.at("token_embd.weight").type, gt::F16);
  EXPECT_EQ(m.at("blk.0.attn_q.weight").type, gt::F16);

  // Tied embeddings under a float preset: the output rule is not consulted
  // and token_embd keeps the preset's type (as llama-quantize).
  m = by_name(plan(parse_preset("F16"), kLlama7B, llama_layout(2, 4096, 11008, 4096, 32000, false), false, out_only));
  EXPECT_EQ(m.at("token_embd.weight").type, gt::F16);
  // Tied embeddings of rows of 288 (stories260K's width) take the output
  // override through the row-length fallback (q5_K -> q5_1).
  const ModelDesc small{"llama", 2, 6, 6, 0};
  m = by_name(plan(q4, small, llama_layout(2, 288, 768, 288, 512, false), false, out_only));
  EXPECT_EQ(m.at("token_embd.weight").type, gt::Q5_1);
  EXPECT_NE(m.at("token_embd.weight").note.find("using q5_1"), std::string::npos) << m.at("token_embd.weight").note;

  // A k-quant type set by name on rows of 288: refused, for either flag.
  TypeOverrides k;
  k.token_embd = gt::Q4_K;
  EXPECT_QF_ERROR(plan(q4, small, llama_layout(2, 288, 768, 288, 512), false, k), qf::ErrorKind::InvalidInput,
                  "--token-embedding-type q4_K: the row length 288 is not a multiple of its block size 256");
  EXPECT_QF_ERROR(plan(q4, small, llama_layout(2, 288, 768, 288, 512), false, out_only), qf::ErrorKind::InvalidInput,
                  "--output-tensor-type q5_K: the row length 288 is not a multiple of its block size 256");

  // Per-tensor types (a size budget's allocation): set last by exact name,
  // the preset's fallback note dropped, the same row-length rule; refused for
  // a tensor the model lacks and for one llama.cpp never quantizes.
  TypeOverrides per;
  per.tensors = {{"blk.1.ffn_down.weight", gt::Q2_K}, {"token_embd.weight", gt::Q6_K}, {"output.weight", gt::Q5_0}};
  m = by_name(plan(q4, kLlama7B, llama_layout(32, 4096, 11008, 4096, 32000), false, per));
  EXPECT_EQ(m.at("blk.1.ffn_down.weight").type, gt::Q2_K);
  EXPECT_EQ(m.at("token_embd.weight").type, gt::Q6_K);
  EXPECT_EQ(m.at("output.weight").type, gt::Q5_0);
  EXPECT_EQ(m.at("blk.5.ffn_down.weight").type, gt::Q4_K);  // the rest as the preset says
  TypeOverrides fb;
  fb.tensors = {{"blk.0.attn_q.weight", gt::Q4_0}};  // rows of 288: the preset's q4_K falls back to q5_0 with a note
  EXPECT_FALSE(by_name(plan(q4, small, llama_layout(2, 288, 768, 288, 512), false)).at("blk.0.attn_q.weight").note.empty());
  m = by_name(plan(q4, small, llama_layout(2, 288, 768, 288, 512), false, fb));
  EXPECT_EQ(m.at("blk.0.attn_q.weight").type, gt::Q4_0);
  EXPECT_TRUE(m.at("blk.0.attn_q.weight").note.empty());
  fb.tensors = {{"blk.0.attn_q.weight", gt::Q4_K}};
  EXPECT_QF_ERROR(plan(q4, small, llama_layout(2, 288, 768, 288, 512), false, fb), qf::ErrorKind::InvalidInput,
                  "the per-tensor type q4_K: the row length 288 is not a multiple of its block size 256");
  fb.tensors = {{"blk.9.ffn_down.weight", gt::Q4_0}};
  EXPECT_QF_ERROR(plan(q4, small, llama_layout(2, 288, 768, 288, 512), false, fb), qf::ErrorKind::InvalidInput,
                  "blk.9.ffn_down.weight: a per-tensor type for a tensor the model does not have");
  fb.tensors = {{"blk.0.attn_norm.weight", gt::Q8_0}};
  EXPECT_QF_ERROR(plan(q4, small, llama_layout(2, 288, 768, 288, 512), false, fb), qf::ErrorKind::InvalidInput,
                  "a per-tensor type for a tensor llama.cpp never quantizes");

  EXPECT_EQ(parse_tensor_type("Q6_k", "--output-tensor-type"), gt::Q6_K);
  EXPECT_EQ(parse_tensor_type("bf16", "--output-tensor-type"), gt::BF16);
  EXPECT_QF_ERROR(parse_tensor_type("iq4_xs", "--output-tensor-type"), qf::ErrorKind::Usage,
                  "--output-tensor-type: unknown tensor type 'iq4_xs' (one of f32 f16 bf16 q8_0 q6_K");
}
