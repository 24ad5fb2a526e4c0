// Quantized Hugging Face checkpoints of every exported format, built from the
// fixture model, load into the runtime and give exactly the logits of the same
// quantized model assembled in memory.
#include <cmath>
#include <functional>
#include <set>

#include <gtest/gtest.h>

#include "core/io.h"
#include "checkpoint/awq_format.h"
#include "checkpoint/compressed_tensors.h"
#include "checkpoint/modelopt_format.h"
#include "formats/safetensors.h"
#include "quantizers/rtn.h"
#include "runtime/model.h"
#include "test_util.h"

namespace qf {
namespace {

using json = nlohmann::json;

std::filesystem::path fixture() { return test::source_dir() / "tests" / "data" / "fixture-llama"; }

ThreadPool& pool() {
  static ThreadPool p(2);
  return p;
}

std::vector<float> logits_of(const rt::Model& m, rt::KvDType kv) {
  rt::KvCache cache = m.make_cache(kv, 64);
  const int32_t seq = cache.add_sequence();
  rt::Batch b;
  const int32_t toks[] = {1, 345, 17, 2048, 99, 7, 4000, 12};
  for (int i = 0; i < 8; ++i) b.add(toks[i], seq, i, true);
  std::vector<float> logits;
  m.forward(b, cache, logits, pool());
  return logits;
}

// FP8 E4M3 codes of w with per-row (channel) or one (tensor) scale amax / 448 in `dt`.
QuantizedTensor fp8_by_hand(const std::vector<float>& w, int64_t rows, int64_t cols, QuantStrategy st, DType dt) {
  QuantizedTensor q;
  q.scheme = QuantScheme::fp8(st, dt);
  q.rows = rows, q.cols = cols;
  q.q.resize(w.size());
  const int64_t n = st == QuantStrategy::Tensor ? 1 : rows;
  for (int64_t g = 0; g < n; ++g) {
    const int64_t r0 = st == QuantStrategy::Tensor ? 0 : g, r1 = st == QuantStrategy::Tensor ? rows : g + 1;
    float amax = 0;
    for (int64_t i = r0 * cols; i < r1 * cols; ++i) amax = std::max(amax, std::fabs(w[i]));
    float s = amax / 448.f;
    if (dt == DType::F16) s = f16_to_f32(f32_to_f16(s));
    q.scales.push_back(s);
    for (int64_t i = r0 * cols; i < r1 * cols; ++i) q.q[i] = f32_to_f8e4m3(w[i] / s);
  }
  return q;
}

// NVFP4 with a power-of-two global scale (its reciprocal is exact).
QuantizedTensor nvfp4_by_hand(const std::vector<float>& w, int64_t rows, int64_t cols) {
  QuantizedTensor q;
  q.scheme = QuantScheme::nvfp4();
  q.rows = rows, q.cols = cols;
  float amax = 0;
  for (float v : w) amax = std::max(amax, std::fabs(v));
  q.global_scale = std::exp2(std::floor(std::log2(448.f * 6.f / amax)));
  q.q.resize(w.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 16; ++b) {
      float bm = 0;
      for (int64_t c = 0; c < 16; ++c) bm = std::max(bm, std::fabs(w[r * cols + b * 16 + c]));
      float s = f8e4m3_to_f32(f32_to_f8e4m3(q.global_scale * bm / 6.f));
      if (s == 0) s = 1;
      q.scales.push_back(s);
      for (int64_t c = 0; c < 16; ++c) q.q[r * cols + b * 16 + c] = f32_to_e2m1(w[r * cols + b * 16 + c] * q.global_scale / s);
    }
  return q;
}

struct Quantized {
  QuantizedTensor q;
  std::optional<ActQuantParams> act;
};

// Which of a layer's Linears a format quantizes and how; nullopt leaves it dense.
using QuantizeFn = std::function<std::optional<Quantized>(const std::string& name, const std::vector<float>& w, int64_t rows,
                                                          int64_t cols)>;
using WriteFn = std::function<void(SafetensorsWriter&, const std::string& prefix, const Quantized&)>;

const char* kSlots[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                        "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

// Writes the quantized checkpoint into `dir` (config.json gets `qcfg`; extra
// files as given), and returns the reference model: the dense fixture with the
// same Linears replaced in memory.
std::unique_ptr<rt::Model> build(const std::filesystem::path& dir, const QuantizeFn& quantize, const WriteFn& write,
                                 const json& qcfg, const std::optional<KvScales>& kv,
                                 const std::function<void(SafetensorsWriter&, int64_t layer, const KvScales&)>& write_kv) {
  const auto ck = Checkpoint::open(fixture());
  auto ref = rt::load_hf_model(fixture());
  const int64_t L = ref->config().num_hidden_layers;
  {
    SafetensorsWriter w(dir);
    std::set<std::string> done;
    for (int64_t l = 0; l < L; ++l) {
      rt::LayerWeights& lw = ref->mutable_layer(l);
      std::shared_ptr<rt::Linear>* slots[] = {&lw.q, &lw.k, &lw.v, &lw.o, &lw.gate, &lw.up, &lw.down};
      for (int s = 0; s < 7; ++s) {
        const std::string prefix = "model.layers." + std::to_string(l) + "." + kSlots[s];
        const Tensor t = ck.tensor(prefix + ".weight");
        const auto wv = t.to_f32_vector();
        const auto qz = quantize(prefix, wv, t.shape()[0], t.shape()[1]);
        if (!qz) continue;
        write(w, prefix, *qz);
        done.insert(prefix + ".weight");
        *slots[s] = rt::make_quantized_linear(qz->q, qz->act ? &*qz->act : nullptr, nullptr, prefix);
      }
      if (kv) write_kv(w, l, *kv);
    }
    for (const auto& name : ck.names())
      if (!done.count(name)) w.add(name, ck.tensor(name));
    w.finish();
  }
  json cfg = json::parse(read_text_file(fixture() / "config.json"));
  cfg["quantization_config"] = qcfg;
  test::write_file(dir / "config.json", cfg.dump(2));
  if (kv) {
    ref->mutable_weights().k_scale.assign(static_cast<size_t>(L), kv->k_scale);
    ref->mutable_weights().v_scale.assign(static_cast<size_t>(L), kv->v_scale);
  }
  return ref;
}

void expect_same_logits(const std::filesystem::path& dir, const rt::Model& ref, bool kv, const std::string& what) {
  const auto m = rt::load_hf_model(dir);
  EXPECT_EQ(m->weights().k_scale, ref.weights().k_scale) << what;
  EXPECT_EQ(m->weights().v_scale, ref.weights().v_scale) << what;
  const rt::KvDType kt = kv ? rt::KvDType::F8_E4M3 : rt::KvDType::F16;
  const auto want = logits_of(ref, kt);
  const auto got = logits_of(*m, kt);
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_EQ(got, want) << what;
  for (const auto& l : m->weights().layers) EXPECT_NE(l.q->format(), "f16") << what;
}

const WriteFn kCtWrite = [](SafetensorsWriter& w, const std::string& p, const Quantized& z) {
  add_compressed_tensors_linear(w, p, z.q, z.act ? &*z.act : nullptr);
};
const auto kCtKv = [](SafetensorsWriter& w, int64_t l, const KvScales& kv) {
  add_compressed_tensors_kv_scales(w, "model.layers." + std::to_string(l) + ".self_attn", kv, DType::F16);
};

json ct_config(const std::vector<CompressedTensorsGroup>& groups, bool kv) {
  return compressed_tensors_config(groups, {"lm_head"}, kCompressedTensorsVersion,
                                   kv ? std::optional<ActivationScheme>(ActivationScheme::fp8_tensor_static()) : std::nullopt);
}

TEST(LoadHfQuantized, CompressedTensorsEveryFormat) {
  const KvScales kv{0.03125f, 0.0625f};
  const auto int4 = QuantScheme::make(4, false, QuantStrategy::Group, 32);
  const auto int8 = QuantScheme::make(8, true, QuantStrategy::Channel);
  struct Case {
    const char* name;
    QuantizeFn quantize;
    std::vector<CompressedTensorsGroup> groups;
    bool kv;
  };
  std::vector<Case> cases;
  {
    CompressedTensorsGroup g;
    g.scheme = int4;
    cases.push_back({"pack-quantized", [&](const std::string&, const std::vector<float>& w, int64_t r, int64_t c) {
                       return std::optional<Quantized>(Quantized{quantize_rtn(w.data(), r, c, int4), std::nullopt});
                     }, {g}, false});
  }
  {
    CompressedTensorsGroup g;
    g.scheme = int8;
    g.input_activations = ActivationScheme::int8_token();
    cases.push_back({"int-quantized", [&](const std::string&, const std::vector<float>& w, int64_t r, int64_t c) {
                       ActQuantParams a{ActivationScheme::int8_token(), 0, 0, 0};
                       return std::optional<Quantized>(Quantized{quantize_rtn(w.data(), r, c, int8), a});
                     }, {g}, false});
  }
  {
    CompressedTensorsGroup g;
    g.scheme = QuantScheme::fp8(QuantStrategy::Channel, DType::F16);
    g.input_activations = ActivationScheme::fp8_token();
    cases.push_back({"float-quantized", [&](const std::string&, const std::vector<float>& w, int64_t r, int64_t c) {
                       ActQuantParams a{ActivationScheme::fp8_token(), 0, 0, 0};
                       return std::optional<Quantized>(Quantized{fp8_by_hand(w, r, c, QuantStrategy::Channel, DType::F16), a});
                     }, {g}, true});
  }
  {
    CompressedTensorsGroup g;
    g.scheme = QuantScheme::nvfp4();
    g.input_activations = ActivationScheme::nvfp4();
    cases.push_back({"nvfp4-pack-quantized", [&](const std::string&, const std::vector<float>& w, int64_t r, int64_t c) {
                       ActQuantParams a{ActivationScheme::nvfp4(), 0, 0, 448.f * 6.f / 8.f};
                       return std::optional<Quantized>(Quantized{nvfp4_by_hand(w, r, c), a});
                     }, {g}, true});
  }
  {
    // Attention int4 weight-only, MLP FP8 with static input scales, layer 3's down_proj left dense.
    CompressedTensorsGroup a, m;
    a.scheme = int4;
    a.targets = {"re:.*self_attn.*"};
    m.scheme = QuantScheme::fp8(QuantStrategy::Tensor, DType::F16);
    m.input_activations = ActivationScheme::fp8_tensor_static();
    m.targets = {"re:.*mlp.*"};
    cases.push_back({"mixed-precision", [&](const std::string& name, const std::vector<float>& w, int64_t r, int64_t c) {
                       if (name == "model.layers.3.mlp.down_proj") return std::optional<Quantized>();
                       if (name.find("self_attn") != std::string::npos)
                         return std::optional<Quantized>(Quantized{quantize_rtn(w.data(), r, c, int4), std::nullopt});
                       ActQuantParams p{ActivationScheme::fp8_tensor_static(), f16_to_f32(f32_to_f16(0.02f)), 0, 0};
                       return std::optional<Quantized>(Quantized{fp8_by_hand(w, r, c, QuantStrategy::Tensor, DType::F16), p});
                     }, {a, m}, true});
  }
  for (const auto& c : cases) {
    test::TempDir d;
    const json qcfg = ct_config(c.groups, c.kv);
    EXPECT_EQ(qcfg["format"], c.name);
    const auto ref = build(d.path(), c.quantize, kCtWrite, qcfg, c.kv ? std::optional<KvScales>(kv) : std::nullopt, kCtKv);
    expect_same_logits(d.path(), *ref, c.kv, c.name);
  }
}

TEST(LoadHfQuantized, AutoAwqGemm) {
  test::TempDir d;
  const auto s = QuantScheme::make(4, false, QuantStrategy::Group, 64);
  const auto ref = build(
      d.path(),
      [&](const std::string&, const std::vector<float>& w, int64_t r, int64_t c) {
        return std::optional<Quantized>(Quantized{quantize_rtn(w.data(), r, c, s), std::nullopt});
      },
      [](SafetensorsWriter& w, const std::string& p, const Quantized& z) { add_awq_linear(w, p, z.q); },
      awq_quantization_config(s, {"lm_head"}), std::nullopt, nullptr);
  expect_same_logits(d.path(), *ref, false, "awq");
}

TEST(LoadHfQuantized, ModeloptFp8AndNvfp4) {
  const KvScales kv{0.03125f, 0.0625f};
  const auto write = [](SafetensorsWriter& w, const std::string& p, const Quantized& z) {
    add_modelopt_linear(w, p, z.q, z.act ? &*z.act : nullptr);
  };
  const auto write_kv = [](SafetensorsWriter& w, int64_t l, const KvScales& k) {
    add_modelopt_kv_scales(w, "model.layers." + std::to_string(l), k);
  };
  for (const char* algo : {"FP8", "NVFP4"}) {
    for (bool hf_file : {true, false}) {
      test::TempDir d;
      const json hf = modelopt_hf_quant_config(algo, std::string("FP8"), std::string(algo) == "NVFP4" ? std::optional<int>(16) : std::nullopt,
                                               {"lm_head"});
      const auto ref = build(
          d.path(),
          [&](const std::string&, const std::vector<float>& w, int64_t r, int64_t c) {
            if (std::string(algo) == "FP8")
              return std::optional<Quantized>(Quantized{fp8_by_hand(w, r, c, QuantStrategy::Tensor, DType::F32),
                                                        ActQuantParams{ActivationScheme::fp8_tensor_static(), 0.02f, 0, 0}});
            return std::optional<Quantized>(
                Quantized{nvfp4_by_hand(w, r, c), ActQuantParams{ActivationScheme::nvfp4(), 0, 0, 512.f}});
          },
          write, modelopt_config_block(hf), kv, write_kv);
      if (hf_file) test::write_file(d / "hf_quant_config.json", hf.dump(2));
      expect_same_logits(d.path(), *ref, true, std::string(algo) + (hf_file ? " hf_quant_config.json" : " config.json"));
    }
  }
}

TEST(LoadHfQuantized, UnsupportedVariantsNameFileAndValue) {
  const auto write_cfg = [](const std::filesystem::path& dir, const json& q) {
    json cfg = json::parse(read_text_file(fixture() / "config.json"));
    cfg["quantization_config"] = q;
    test::write_file(dir / "config.json", cfg.dump());
    std::filesystem::copy_file(fixture() / "model.safetensors", dir / "model.safetensors");
  };
  struct Case {
    json q;
    const char* fragment;
  };
  const std::vector<Case> cases = {
      {{{"quant_method", "compressed-tensors"}, {"format", "marlin-24"}}, "marlin-24"},
      {{{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128}, {"version", "gemv"}}, "gemv"},
      {{{"quant_method", "modelopt"}, {"quant_algo", "W4A8_AWQ"}}, "W4A8_AWQ"},
      {{{"quant_method", "hqq"}}, "hqq"},
  };
  for (const auto& c : cases) {
    test::TempDir d;
    write_cfg(d.path(), c.q);
    EXPECT_QF_ERROR(rt::load_hf_model(d.path()), ErrorKind::Unsupported, c.fragment);
  }
  test::TempDir d;
  write_cfg(d.path(), {{"quant_method", "compressed-tensors"}, {"format", "marlin-24"}});
  EXPECT_QF_ERROR(rt::load_hf_model(d.path()), ErrorKind::Unsupported, "config.json");
}

}  // namespace
}  // namespace qf
