// HF -> GGUF on the bundled fixture, checked through our runtime and reader.
#include "convert/hf_to_gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <set>

#include "calibration/imatrix_collect.h"
#include "calibration/quantize_model.h"
#include "core/io.h"
#include "eval/perplexity.h"
#include "formats/gguf/gguf.h"
#include "formats/gguf/imatrix.h"
#include "formats/llama2c/llama2c_model.h"
#include "formats/safetensors.h"
#include "formats/tokenizer/tokenizer.h"
#include "runtime/model.h"
#include "test_util.h"

namespace qf {
namespace {

using namespace qf::test;

std::filesystem::path fixture() { return source_dir() / "tests" / "data" / "fixture-llama"; }

TEST(HfToGguf, TensorNames) {
  EXPECT_EQ(gguf_tensor_name("model.embed_tokens.weight"), "token_embd.weight");
  EXPECT_EQ(gguf_tensor_name("lm_head.weight"), "output.weight");
  EXPECT_EQ(gguf_tensor_name("model.norm.weight"), "output_norm.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.11.self_attn.o_proj.weight"), "blk.11.attn_output.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.0.self_attn.k_proj.bias"), "blk.0.attn_k.bias");
  EXPECT_EQ(gguf_tensor_name("model.layers.3.self_attn.q_norm.weight"), "blk.3.attn_q_norm.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.2.post_attention_layernorm.weight"), "blk.2.ffn_norm.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.2.mlp.down_proj.weight"), "blk.2.ffn_down.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.2.block_sparse_moe.gate.weight"), "blk.2.ffn_gate_inp.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.2.mlp.gate.weight"), "blk.2.ffn_gate_inp.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.1.mlp.shared_expert_gate.weight"), "blk.1.ffn_gate_inp_shexp.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.1.mlp.shared_expert.down_proj.weight"), "blk.1.ffn_down_shexp.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.2.block_sparse_moe.experts.3.w1.weight"), "");
  EXPECT_EQ(gguf_expert_slab("model.layers.2.block_sparse_moe.experts.3.w1.weight").name, "blk.2.ffn_gate_exps.weight");
  EXPECT_EQ(gguf_expert_slab("model.layers.2.block_sparse_moe.experts.3.w3.weight").name, "blk.2.ffn_up_exps.weight");
  EXPECT_EQ(gguf_expert_slab("model.layers.2.block_sparse_moe.experts.3.w2.weight").name, "blk.2.ffn_down_exps.weight");
  EXPECT_EQ(gguf_expert_slab("model.layers.0.mlp.experts.17.down_proj.weight").name, "blk.0.ffn_down_exps.weight");
  EXPECT_EQ(gguf_expert_slab("model.layers.0.mlp.experts.17.down_proj.weight").expert, 17);
  EXPECT_EQ(gguf_expert_slab("model.layers.0.mlp.down_proj.weight").name, "");
}

// Converts the fixture once per preset for the whole suite.
class FixtureGguf : public ::testing::Test {
 protected:
  static std::filesystem::path convert(const std::string& preset, const std::string& imatrix = "") {
    static TempDir dir;
    const std::filesystem::path out = dir.path() / (preset + (imatrix.empty() ? "" : "-imatrix") + ".gguf");
    if (!std::filesystem::exists(out)) {
      GgufConvertOptions o;
      o.preset = preset;
      o.imatrix = imatrix;
      convert_hf_to_gguf(fixture(), out, o, ThreadPool::global());
    }
    return out;
  }
  static std::vector<eval::Span> spans(const Tokenizer& tok, int64_t n) {
    eval::PplOptions o;
    o.max_spans = n;
    return eval::make_spans(tok, read_text_file(source_dir() / "tests/data/text/evaluation.txt"), o, 0, "eval");
  }
  static eval::EvalResult compare(const std::filesystem::path& gguf, int64_t n_spans = 12) {
    static auto base = rt::load_model(fixture().string());
    static auto tok = load_tokenizer(fixture());
    auto m = rt::load_gguf_model(gguf);
    eval::PplOptions o;
    return eval::evaluate(*m, base.get(), spans(*tok, n_spans), o, ThreadPool::global());
  }
};

TEST_F(FixtureGguf, F16RunsExactlyLikeTheSafetensors) {
  // Same f16 values; q/k rows interleaved for llama.cpp and rotated as pairs by
  // the runtime. Only the summation order inside q.k changes.
  const eval::EvalResult r = compare(convert("F16"), 4);
  EXPECT_LT(r.kld_max, 1e-6);
  EXPECT_LT(std::fabs(r.ppl_delta), 1e-3);
  EXPECT_EQ(r.top1_agreement, 1.0);
}

TEST_F(FixtureGguf, MetadataAndTypesFollowLlamaCpp) {
  const GgufFile f = GgufFile::open(convert("Q4_K_M"));
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_u32("general.file_type"), 15u);
  EXPECT_EQ(f.get_u32("general.quantization_version"), 2u);
  EXPECT_EQ(f.get_u32("llama.block_count"), 4u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count_kv"), 4u);
  EXPECT_EQ(f.get_u32("llama.rope.dimension_count"), 32u);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
  std::map<std::string, uint32_t> type;
  for (const auto& t : f.tensors()) type[t.name] = t.type;
  EXPECT_EQ(type.at("output.weight"), ggml_type::Q6_K);
  EXPECT_EQ(type.at("token_embd.weight"), ggml_type::Q4_K);
  EXPECT_EQ(type.at("blk.0.attn_q.weight"), ggml_type::Q4_K);
  // use_more_bits(i, 4) holds for layers 2 and 3.
  EXPECT_EQ(type.at("blk.1.attn_v.weight"), ggml_type::Q4_K);
  EXPECT_EQ(type.at("blk.2.attn_v.weight"), ggml_type::Q6_K);
  EXPECT_EQ(type.at("blk.3.ffn_down.weight"), ggml_type::Q6_K);
  EXPECT_EQ(type.at("blk.0.attn_norm.weight"), ggml_type::F32);
  // The tokenizer read back from the GGUF encodes like the folder's.
  auto a = load_tokenizer(fixture());
  auto b = load_tokenizer(convert("Q4_K_M"));
  const std::string text = read_text_file(source_dir() / "tests/data/text/evaluation.txt").substr(0, 20000);
  EXPECT_EQ(a->encode(text, true), b->encode(text, true));
}

// KL divergence from the f16 model orders the presets. Perplexity does only
// between presets far apart: the paired noise of a perplexity ratio over N
// scored tokens is about sqrt(2 KLD / N) (the per-token log-likelihood ratio
// has mean square ~2 KLD), 0.3% for Q3_K_M over 8 windows, as large as the
// gap between neighbouring presets (Q3_K_M measures below Q4_K_M at every
// SIMD level). Q2_K against Q8_0 is a 4% gap, more than ten times its noise.
TEST_F(FixtureGguf, KlDivergenceGrowsAsBitsShrink) {
  const char* order[] = {"Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K"};
  double prev_kld = 0, first_ppl = 0, last_ppl = 0;
  for (const char* p : order) {
    const eval::EvalResult r = compare(convert(p), 8);
    std::printf("%-7s KLD %.6f ppl %.4f\n", p, r.kld_mean, r.ppl);
    EXPECT_GT(r.kld_mean, prev_kld) << p;
    prev_kld = r.kld_mean, last_ppl = r.ppl;
    if (first_ppl == 0) first_ppl = r.ppl;
  }
  EXPECT_GT(prev_kld, 0.01);  // Q2_K
  EXPECT_GT(last_ppl, first_ppl) << "Q2_K's perplexity is not above Q8_0's";
}

TEST_F(FixtureGguf, ImatrixImprovesLowBitPresets) {
  static TempDir dir;
  const auto im_path = dir.path() / "imatrix.gguf";
  {
    auto model = rt::load_model(fixture().string());
    auto tok = load_tokenizer(fixture());
    ImatrixOptions o;
    o.max_chunks = 16;
    o.dataset = "calibration.txt";
    const Imatrix m = compute_imatrix(*model, *tok, read_text_file(source_dir() / "tests/data/text/calibration.txt"), o,
                                      ThreadPool::global());
    EXPECT_EQ(m.entries.size(), 4u * 7);
    EXPECT_EQ(m.entries.at("blk.0.attn_q.weight").count, 16.f * 512);
    EXPECT_EQ(m.entries.at("blk.0.attn_q.weight").in_sum2, m.entries.at("blk.0.attn_v.weight").in_sum2);
    EXPECT_EQ(m.entries.at("blk.3.ffn_down.weight").in_sum2.size(), 768u);
    write_imatrix_gguf(m, im_path);
  }
  for (const char* p : {"Q2_K", "Q3_K_M"}) {
    const eval::EvalResult plain = compare(convert(p), 12), weighted = compare(convert(p, im_path.string()), 12);
    std::printf("%-7s KLD %.6f -> %.6f, ppl %.4f -> %.4f with the imatrix\n", p, plain.kld_mean, weighted.kld_mean,
                plain.ppl, weighted.ppl);
    EXPECT_LT(weighted.kld_mean, plain.kld_mean) << p;
    // Q2_K's perplexity gain is well above the noise of 12 chunks; Q3_K_M's
    // (0.1% over 40 chunks) is not, so it only has to stay within noise.
    if (std::string(p) == "Q2_K") {
      EXPECT_LT(weighted.ppl, plain.ppl * 0.995) << p;
    } else {
      EXPECT_LT(weighted.ppl, plain.ppl * 1.005) << p;
    }
  }
}

TEST_F(FixtureGguf, FailedConversionLeavesNoFile) {
  TempDir t;
  Imatrix bad;
  bad.entries["blk.0.attn_q.weight"] = {std::vector<float>(17, 1.f), 1.f, {}};  // wrong length
  bad.chunk_count = 1, bad.chunk_size = 512;
  write_imatrix_gguf(bad, t.path() / "bad.gguf");
  GgufConvertOptions o;
  o.preset = "Q4_K_M";
  o.imatrix = t.path() / "bad.gguf";
  EXPECT_QF_ERROR(convert_hf_to_gguf(fixture(), t.path() / "out.gguf", o, ThreadPool::global()), ErrorKind::InvalidInput,
                  "entry 'blk.0.attn_q.weight' has 17 values but the tensor's rows have 256");
  size_t files = 0;
  for (auto& e : std::filesystem::directory_iterator(t.path())) files += e.path().filename() != "bad.gguf";
  EXPECT_EQ(files, 0u);
  o.imatrix.clear();
  o.preset = "Q4_K_XL";
  EXPECT_QF_ERROR(convert_hf_to_gguf(fixture(), t.path() / "out.gguf", o, ThreadPool::global()), ErrorKind::Usage, "Q4_K_M");
}

TEST(HfToGguf, Stories260KConvertsWithFallbacks) {
  const auto st = shared_dir() / "models" / "stories260K";
  if (!std::filesystem::exists(st / "stories260K.bin")) GTEST_SKIP() << "../shared/models/stories260K is absent";
  TempDir t;
  convert_llama2c_to_hf(st / "stories260K.bin", st / "tok512.bin", t.path() / "hf");
  for (const char* preset : {"Q4_K_M", "Q8_0"}) {
    std::vector<std::string> notes;
    GgufConvertOptions o;
    o.preset = preset;
    o.note = [&](const std::string& s) { notes.push_back(s); };
    const auto out = t.path() / (std::string(preset) + ".gguf");
    convert_hf_to_gguf(t.path() / "hf", out, o, ThreadPool::global());
    // dim 64 and hidden 172 fit no k-quant block; 172 fits no 32-block either.
    bool down_f16 = false;
    for (const auto& n : notes) down_f16 |= n == "blk.4.ffn_down.weight: row length 172 is not a multiple of " +
                                                     std::string(preset == std::string("Q8_0") ? "32 (q8_0)" : "256 (q6_K)") + "; using f16";
    EXPECT_TRUE(down_f16) << preset << ": " << notes.size() << " notes";
    auto m = rt::load_gguf_model(out);
    auto tok = load_tokenizer(out);
    eval::PplOptions po;
    po.mode = eval::PplMode::Lines;
    const auto r = eval::evaluate(*m, nullptr, eval::make_spans(*tok, read_text_file(st / "ts_fragment.txt"), po, 512, "ts"),
                                  po, ThreadPool::global());
    EXPECT_EQ(r.tokens_scored, 15507);
    EXPECT_LT(r.ppl, 5.395 * (preset == std::string("Q8_0") ? 1.002 : 1.05)) << preset;
  }
}

// The mixture-of-experts architectures through GGUF: stacked expert tensors
// (ne = [cols, rows, experts]), the router kept in f32, qwen2moe's shared
// expert and its gate; the runtime reading the file back computes what it
// computes from the Hugging Face folder. (The tiny models have no tokenizer
// of their own: the fixture's is borrowed; only token ids are run here.)
class HfToGgufMoe : public ::testing::TestWithParam<const char*> {};

TEST_P(HfToGgufMoe, RoundTripsThroughTheRuntime) {
  const auto src = source_dir() / "tests" / "data" / "moe-tiny" / GetParam();
  if (!std::filesystem::exists(src / "model.safetensors")) GTEST_SKIP() << src << " is absent";
  TempDir t;
  std::filesystem::create_directories(t.path() / "hf");
  for (const char* f : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"})
    std::filesystem::copy_file(fixture() / f, t.path() / "hf" / f);
  nlohmann::json cfg = nlohmann::json::parse(read_text_file(src / "config.json"));
  if (!cfg.value("mlp_only_layers", nlohmann::json::array()).empty()) {
    // llama.cpp's qwen2moe has sparse layers only: converting this model is
    // refused, and its first (sparse) layer alone is converted instead.
    std::filesystem::copy(src, t.path() / "dense");
    EXPECT_QF_ERROR(convert_hf_to_gguf(t.path() / "dense", t.path() / "x.gguf", {}, ThreadPool::global()),
                    ErrorKind::Unsupported, "sparse layers only");
    EXPECT_FALSE(std::filesystem::exists(t.path() / "x.gguf"));
    cfg["num_hidden_layers"] = 1;
    cfg["mlp_only_layers"] = nlohmann::json::array();
  }
  write_file(t.path() / "hf" / "config.json", cfg.dump());
  {
    const Checkpoint ck = Checkpoint::open(src);
    SafetensorsWriter w(t.path() / "hf");
    for (const std::string& n : ck.names())
      if (n.rfind("model.layers.", 0) != 0 || std::stoll(n.substr(13)) < cfg["num_hidden_layers"].get<int64_t>())
        w.add(n, ck.tensor(n));
    w.set_metadata({{"format", "pt"}});
    w.finish();
  }
  auto hf = rt::load_hf_model(t.path() / "hf");
  const ModelConfig& c = hf->config();
  std::vector<int32_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back(static_cast<int32_t>(3 + (i * 37) % (c.vocab_size - 3)));
  auto logits_of = [&](const rt::Model& m) {
    rt::KvCache cache = m.make_cache(rt::KvDType::F16, static_cast<int64_t>(ids.size()));
    const int32_t seq = cache.add_sequence();
    rt::Batch b;
    for (size_t i = 0; i < ids.size(); ++i) b.add(ids[i], seq, static_cast<int64_t>(i), true);
    std::vector<float> out;
    m.forward(b, cache, out, ThreadPool::global());
    return out;
  };
  const std::vector<float> want = logits_of(*hf);
  for (const char* preset : {"F16", "Q8_0"}) {
    GgufConvertOptions o;
    o.preset = preset;
    const auto out = t.path() / (std::string(preset) + ".gguf");
    convert_hf_to_gguf(t.path() / "hf", out, o, ThreadPool::global());
    const GgufFile f = GgufFile::open(out);
    const std::string arch = f.get_string("general.architecture");
    EXPECT_EQ(f.get_u32(arch + ".expert_count"), static_cast<uint32_t>(c.num_experts));
    EXPECT_EQ(f.get_u32(arch + ".expert_used_count"), static_cast<uint32_t>(c.num_experts_per_tok));
    const GgufTensorInfo* exps = f.find_tensor("blk.0.ffn_down_exps.weight");
    ASSERT_NE(exps, nullptr);
    EXPECT_EQ(exps->dims, (std::vector<uint64_t>{static_cast<uint64_t>(c.moe_intermediate_size),
                                                 static_cast<uint64_t>(c.hidden_size), static_cast<uint64_t>(c.num_experts)}));
    EXPECT_EQ(f.find_tensor("blk.0.ffn_gate_inp.weight")->type, ggml_type::F32);
    EXPECT_EQ(f.find_tensor("blk.0.ffn_gate_exps.weight")->type, f.find_tensor("blk.0.ffn_up_exps.weight")->type);
    auto g = rt::load_gguf_model(out);
    EXPECT_EQ(g->config().model_type, c.model_type);
    EXPECT_EQ(g->parameter_count(), hf->parameter_count());
    const std::vector<float> got = logits_of(*g);
    ASSERT_EQ(got.size(), want.size());
    // F16: the same weights (the GGUF's llama q/k rows are permuted and rotated
    // as pairs, the same arithmetic); Q8_0: 8-bit weights, logits of order 1.
    const double bound = preset == std::string("F16") ? 1e-4 : 0.05;
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
    EXPECT_LE(worst, bound) << preset;
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, HfToGgufMoe, ::testing::Values("mixtral", "qwen2_moe", "qwen3_moe"));

// ---- checkpoints that contradict their config -------------------------------

// A copy of tests/data/moe-tiny/<arch> with the fixture's tokenizer, its
// config edited and its tensors dropped, replaced or added.
struct Contradiction {
  std::string what, arch;
  std::function<void(nlohmann::json&)> config;
  std::set<std::string> drop;
  std::map<std::string, Shape> reshape;           // replaced by zeros of this shape
  std::map<std::string, std::string> copy_as;     // new tensor name -> existing tensor copied under it
  ErrorKind kind;
  std::string fragment;
};

std::filesystem::path write_contradiction(const Contradiction& c, const std::filesystem::path& dir) {
  const auto src = source_dir() / "tests" / "data" / "moe-tiny" / c.arch;
  std::filesystem::create_directories(dir);
  for (const char* f : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"})
    std::filesystem::copy_file(fixture() / f, dir / f);
  nlohmann::json cfg = nlohmann::json::parse(read_text_file(src / "config.json"));
  if (c.config) c.config(cfg);
  write_file(dir / "config.json", cfg.dump());
  const int64_t layers = cfg["num_hidden_layers"].get<int64_t>();
  const Checkpoint ck = Checkpoint::open(src);
  SafetensorsWriter w(dir);
  for (const std::string& n : ck.names()) {
    if (c.drop.count(n) || (n.rfind("model.layers.", 0) == 0 && std::stoll(n.substr(13)) >= layers)) continue;
    if (auto r = c.reshape.find(n); r != c.reshape.end()) w.add(n, Tensor::zeros(ck.info(n).dtype, r->second));
    else w.add(n, ck.tensor(n));
  }
  for (const auto& [name, from] : c.copy_as) w.add(name, ck.tensor(from));
  w.set_metadata({{"format", "pt"}});
  w.finish();
  return dir;
}

// The message of the qf::Error `f` throws, checked for kind and fragment.
template <class F>
std::string error_of(F f, ErrorKind kind, const std::string& fragment) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected qf::Error containing '" << fragment << "'";
  return "";
}

// Every case once converted "successfully" into a GGUF file the runtime then
// refused (or, for the extra expert and the shared expert without a size,
// loaded while ignoring tensors). Now convert and the runtime's loader run
// the same check, with the same message, and convert writes nothing.
TEST(HfToGgufChecks, CheckpointsContradictingTheirConfigAreRefusedByConvertAndLoaderAlike) {
  // qwen2_moe's layer 1 is dense (mlp_only_layers [1]); GGUF takes sparse
  // layers only, so its cases keep layer 0.
  const auto one_sparse_layer = [](nlohmann::json& j) {
    j["num_hidden_layers"] = 1;
    j["mlp_only_layers"] = nlohmann::json::array();
  };
  const std::string L0 = "model.layers.0.block_sparse_moe.", L1 = "model.layers.1.block_sparse_moe.";
  const std::vector<Contradiction> cases = {
      {"router missing", "mixtral", {}, {L1 + "gate.weight"}, {}, {}, ErrorKind::NotFound,
       "tensor '" + L1 + "gate.weight' is missing (the router of sparse layer 1"},
      {"router with fewer rows than experts", "mixtral", {}, {}, {{L0 + "gate.weight", {3, 64}}}, {},
       ErrorKind::InvalidInput, "tensor '" + L0 + "gate.weight' has shape [3, 64], expected [4, 64]"},
      {"router with more rows than experts", "mixtral", {}, {}, {{L0 + "gate.weight", {5, 64}}}, {},
       ErrorKind::InvalidInput, "tensor '" + L0 + "gate.weight' has shape [5, 64], expected [4, 64]"},
      {"router transposed", "mixtral", {}, {}, {{L0 + "gate.weight", {64, 4}}}, {}, ErrorKind::InvalidInput,
       "has shape [64, 4], expected [4, 64]"},
      {"router 1-D", "mixtral", {}, {}, {{L0 + "gate.weight", {256}}}, {}, ErrorKind::InvalidInput,
       "has shape [256], expected [4, 64]"},
      {"expert matrix transposed", "mixtral", {}, {}, {{L0 + "experts.2.w2.weight", {96, 64}}}, {},
       ErrorKind::InvalidInput, "tensor '" + L0 + "experts.2.w2.weight' has shape [96, 64], expected [64, 96]"},
      {"a layer without experts", "mixtral", {},
       {L1 + "experts.0.w1.weight", L1 + "experts.0.w2.weight", L1 + "experts.0.w3.weight", L1 + "experts.1.w1.weight",
        L1 + "experts.1.w2.weight", L1 + "experts.1.w3.weight", L1 + "experts.2.w1.weight", L1 + "experts.2.w2.weight",
        L1 + "experts.2.w3.weight", L1 + "experts.3.w1.weight", L1 + "experts.3.w2.weight", L1 + "experts.3.w3.weight"},
       {}, {}, ErrorKind::NotFound, "tensor '" + L1 + "experts.0.w1.weight' is missing (expert 0 of sparse layer 1"},
      {"an expert beyond num_local_experts", "mixtral", {}, {}, {}, {{L0 + "experts.4.w1.weight", L0 + "experts.0.w1.weight"}},
       ErrorKind::InvalidInput,
       "tensor '" + L0 + "experts.4.w1.weight' belongs to expert 4, but 'num_local_experts' is 4 (experts 0 to 3)"},
      {"a dense MLP beside the experts", "mixtral", {}, {}, {}, {{"model.layers.0.mlp.up_proj.weight", L0 + "experts.0.w3.weight"}},
       ErrorKind::InvalidInput,
       "tensor 'model.layers.0.mlp.up_proj.weight' belongs to a dense MLP, but layer 0 is a mixture-of-experts layer"},
      {"mlp_only_layers [] over a dense layer", "qwen2_moe", [](nlohmann::json& j) { j["mlp_only_layers"] = nlohmann::json::array(); },
       {}, {}, {}, ErrorKind::NotFound, "tensor 'model.layers.1.mlp.gate.weight' is missing (the router of sparse layer 1"},
      {"shared expert tensors with shared_expert_intermediate_size 0", "qwen2_moe",
       [&](nlohmann::json& j) {
         one_sparse_layer(j);
         j["shared_expert_intermediate_size"] = 0;
       }, {}, {}, {},
       ErrorKind::InvalidInput,
       "tensor 'model.layers.0.mlp.shared_expert.down_proj.weight' belongs to a shared expert, but "
       "'shared_expert_intermediate_size' is 0 (no shared expert)"},
      {"an expert beyond num_experts (qwen)", "qwen2_moe", one_sparse_layer, {}, {}, {{"model.layers.0.mlp.experts.6.down_proj.weight", "model.layers.0.mlp.experts.0.down_proj.weight"}},
       ErrorKind::InvalidInput, "belongs to expert 6, but 'num_experts' is 6 (experts 0 to 5)"},
      {"shared expert gate of the wrong shape", "qwen2_moe", one_sparse_layer, {}, {{"model.layers.0.mlp.shared_expert_gate.weight", {2, 64}}}, {},
       ErrorKind::InvalidInput, "tensor 'model.layers.0.mlp.shared_expert_gate.weight' has shape [2, 64], expected [1, 64]"},
  };
  for (const Contradiction& c : cases) {
    SCOPED_TRACE(c.what);
    TempDir t;
    const auto dir = write_contradiction(c, t.path() / "hf");
    const auto out = t.path() / "out.gguf";
    const std::string by_convert =
        error_of([&] { convert_hf_to_gguf(dir, out, {}, ThreadPool::global()); }, c.kind, c.fragment);
    EXPECT_FALSE(std::filesystem::exists(out));
    const std::string by_loader = error_of([&] { rt::load_hf_model(dir); }, c.kind, c.fragment);
    EXPECT_EQ(by_convert, by_loader);
    // quantize (eval and imatrix too) reads the model through the same loader.
    QuantizeJob job;
    job.model = dir.string();
    job.recipe = source_dir() / "tests" / "data" / "recipes" / "fp8-dynamic.yaml";
    job.out = t.path() / "quantized";
    const std::string by_quantize =
        error_of([&] { quantize_model(job, ThreadPool::global(), [](const std::string&) {}); }, c.kind, c.fragment);
    EXPECT_EQ(by_quantize, by_loader);
    EXPECT_FALSE(std::filesystem::exists(job.out));
  }
}

}  // namespace
}  // namespace qf
