#include "checkpoint/gptq_format.h"

#include <random>

#include <gtest/gtest.h>

#include "checkpoint/pack.h"
#include "quantized_tensor_util.h"
#include "test_util.h"

namespace qf {
namespace {

using json = nlohmann::json;

// random_qt(..., 1) throughout: zero points in [1, qmax], since GPTQ v1 cannot store 0.

TEST(GptqFormat, RoundTripBitsSymmetryGroupsAndGIdx) {
  int n = 0;
  for (int bits : {2, 3, 4, 8})
    for (bool sym : {true, false})
      for (int variant = 0; variant < 3; ++variant) {  // group, group + act-order g_idx, channel
        const QuantStrategy st = variant == 2 ? QuantStrategy::Channel : QuantStrategy::Group;
        const auto q = random_qt(QuantScheme::make(bits, sym, st, 16), 32, 64, variant == 1, 100 + n++, 1);
        const std::string what = q.scheme.describe() + (variant == 1 ? " act-order" : "");
        test::TempDir d;
        {
          SafetensorsWriter w(d.path());
          add_gptq_linear(w, "model.layers.0.self_attn.o_proj", q);
          w.finish();
        }
        const auto ck = Checkpoint::open(d.path());
        const json cfg = gptq_quantize_config(q.scheme, variant == 1);
        const auto back = read_gptq_linear(ck, "model.layers.0.self_attn.o_proj", cfg);
        expect_same(q, back, what);
        const int64_t G = st == QuantStrategy::Channel ? 1 : 4;
        EXPECT_EQ(ck.info("model.layers.0.self_attn.o_proj.qweight").shape, (Shape{64 * bits / 32, 32})) << what;
        EXPECT_EQ(ck.info("model.layers.0.self_attn.o_proj.qzeros").shape, (Shape{G, 32 * bits / 32})) << what;
        EXPECT_EQ(ck.info("model.layers.0.self_attn.o_proj.scales").shape, (Shape{G, 32})) << what;
        EXPECT_EQ(ck.info("model.layers.0.self_attn.o_proj.scales").dtype, DType::F16) << what;
        EXPECT_EQ(ck.info("model.layers.0.self_attn.o_proj.g_idx").shape, (Shape{64})) << what;
      }
}

TEST(GptqFormat, HandComputedWords) {
  test::TempDir d;
  // 4-bit symmetric, 8 outputs x 8 inputs, one group: q[n][k] = k.
  QuantizedTensor s = random_qt(QuantScheme::make(4, true, QuantStrategy::Group, 8), 8, 8, false, 1, 1);
  for (int n = 0; n < 8; ++n)
    for (int k = 0; k < 8; ++k) s.q[n * 8 + k] = static_cast<uint8_t>(k);
  // 4-bit asymmetric: z[n] = n + 1 is stored as n; q[n][k] = n.
  QuantizedTensor a = random_qt(QuantScheme::make(4, false, QuantStrategy::Channel), 8, 8, false, 2, 1);
  for (int n = 0; n < 8; ++n) {
    a.zeros[n] = n + 1;
    for (int k = 0; k < 8; ++k) a.q[n * 8 + k] = static_cast<uint8_t>(n);
  }
  // 8-bit symmetric: zero 128 stored as 127 = 0x7F per byte.
  QuantizedTensor e = random_qt(QuantScheme::make(8, true, QuantStrategy::Group, 4), 4, 8, false, 3, 1);
  {
    SafetensorsWriter w(d.path());
    add_gptq_linear(w, "s", s);
    add_gptq_linear(w, "a", a);
    add_gptq_linear(w, "e", e);
    w.finish();
  }
  const auto ck = Checkpoint::open(d.path());
  auto word = [&](const std::string& name, size_t i) { return static_cast<uint32_t>(ck.tensor(name).data_as<int32_t>()[i]); };
  ASSERT_EQ(ck.info("s.qweight").shape, (Shape{1, 8}));
  for (size_t n = 0; n < 8; ++n) EXPECT_EQ(word("s.qweight", n), 0x76543210u) << n;
  EXPECT_EQ(word("s.qzeros", 0), 0x77777777u);
  for (size_t n = 0; n < 8; ++n) EXPECT_EQ(word("a.qweight", n), 0x11111111u * n) << n;
  EXPECT_EQ(word("a.qzeros", 0), 0x76543210u);
  EXPECT_EQ(ck.info("e.qzeros").shape, (Shape{2, 1}));
  EXPECT_EQ(word("e.qzeros", 0), 0x7F7F7F7Fu);
  EXPECT_EQ(word("e.qzeros", 1), 0x7F7F7F7Fu);
  const auto g = ck.tensor("e.g_idx");
  for (int k = 0; k < 8; ++k) EXPECT_EQ(g.data_as<int32_t>()[k], k / 4);
  const auto sc = ck.tensor("a.scales");
  EXPECT_EQ(sc.shape(), (Shape{1, 8}));
  for (int n = 0; n < 8; ++n) EXPECT_EQ(f16_to_f32(sc.data_as<uint16_t>()[n]), a.scales[n]);
}

// Each qweight column is the packed input stream of one output row (3-bit: 32 values in 3 words).
TEST(GptqFormat, ThreeBitColumnsArePackedInputRows) {
  test::TempDir d;
  const auto q = random_qt(QuantScheme::make(3, false, QuantStrategy::Group, 32), 32, 64, false, 4, 1);
  {
    SafetensorsWriter w(d.path());
    add_gptq_linear(w, "x", q);
    w.finish();
  }
  const auto ck = Checkpoint::open(d.path());
  const auto qw = ck.tensor("x.qweight");
  ASSERT_EQ(qw.shape(), (Shape{6, 32}));
  for (int64_t n = 0; n < 32; ++n) {
    const auto row = pack_int32_rows(q.q.data() + n * 64, 1, 64, 3);
    for (int64_t k = 0; k < 6; ++k) EXPECT_EQ(qw.data_as<int32_t>()[k * 32 + n], row[static_cast<size_t>(k)]);
  }
}

TEST(GptqFormat, ZeroPointZeroCannotBeStoredInV1) {
  test::TempDir d;
  auto q = random_qt(QuantScheme::make(4, false, QuantStrategy::Group, 16), 8, 32, false, 5, 1);
  q.zeros[3] = 0;
  SafetensorsWriter w(d.path());
  EXPECT_QF_ERROR(add_gptq_linear(w, "x", q), ErrorKind::InvalidInput, "zero point 0 at row 1 group 1 cannot be stored in GPTQ v1");
}

// A stored all-ones field decodes as 2^bits in vLLM/AutoGPTQ/ExLlama: the reader refuses it.
TEST(GptqFormat, ReaderRefusesWrappedZeroAndBadTensors) {
  test::TempDir d;
  const auto q = random_qt(QuantScheme::make(4, false, QuantStrategy::Group, 16), 8, 32, false, 6, 1);
  {
    SafetensorsWriter w(d.path());
    add_gptq_linear(w, "ok", q);
    const auto rows = pack_int32_rows(q.q.data(), 8, 32, 4);
    std::vector<int32_t> qweight(4 * 8);
    for (int n = 0; n < 8; ++n)
      for (int k = 0; k < 4; ++k) qweight[k * 8 + n] = rows[n * 4 + k];
    std::vector<int32_t> qzeros = {static_cast<int32_t>(0x1234567Fu), 0x11111111};
    std::vector<uint16_t> sc(16, 0x3c00);
    std::vector<int32_t> g_idx(32);
    for (int k = 0; k < 32; ++k) g_idx[k] = k / 16;
    w.add("wrap.qweight", DType::I32, {4, 8}, qweight.data(), qweight.size() * 4);
    w.add("wrap.qzeros", DType::I32, {2, 1}, qzeros.data(), qzeros.size() * 4);
    w.add("wrap.scales", DType::F16, {2, 8}, sc.data(), sc.size() * 2);
    w.add("wrap.g_idx", DType::I32, {32}, g_idx.data(), g_idx.size() * 4);
    // Same, but scales with the wrong shape.
    w.add("shape.qweight", DType::I32, {4, 8}, qweight.data(), qweight.size() * 4);
    w.add("shape.qzeros", DType::I32, {2, 1}, qzeros.data(), qzeros.size() * 4);
    w.add("shape.scales", DType::F16, {1, 16}, sc.data(), sc.size() * 2);
    w.finish();
  }
  const auto ck = Checkpoint::open(d.path());
  const json cfg = gptq_quantize_config(q.scheme, false);
  EXPECT_QF_ERROR(read_gptq_linear(ck, "wrap", cfg), ErrorKind::InvalidInput,
                  "wrap.qzeros: stored zero point field 15 at group 0 column 0 decodes as 16");
  EXPECT_QF_ERROR(read_gptq_linear(ck, "shape", cfg), ErrorKind::InvalidInput, "shape.scales: shape is [1, 16], expected [2, 8]");
  EXPECT_QF_ERROR(read_gptq_linear(ck, "none", cfg), ErrorKind::NotFound, "none.qweight");
  // The asymmetric checkpoint read as symmetric: zero points disagree with 2^(bits-1).
  json sym = cfg;
  sym["sym"] = true;
  EXPECT_QF_ERROR(read_gptq_linear(ck, "ok", sym), ErrorKind::InvalidInput, "sym is true but the zero point");
}

TEST(GptqFormat, WriterRefusesWhatGptqCannotHold) {
  test::TempDir d;
  SafetensorsWriter w(d.path());
  EXPECT_QF_ERROR(add_gptq_linear(w, "t", random_qt(QuantScheme::make(4, true, QuantStrategy::Tensor), 8, 32, false, 7, 1)),
                  ErrorKind::Unsupported, "no per-tensor strategy");
  EXPECT_QF_ERROR(add_gptq_linear(w, "f", random_qt(QuantScheme::make(5, true, QuantStrategy::Group, 16), 32, 32, false, 8, 1)),
                  ErrorKind::Unsupported, "2, 3, 4 or 8 bits, not 5");
  EXPECT_QF_ERROR(add_gptq_linear(w, "k", random_qt(QuantScheme::make(3, true, QuantStrategy::Group, 16), 32, 48, false, 9, 1)),
                  ErrorKind::InvalidInput, "multiples of 32");
  auto bf = random_qt(QuantScheme::make(4, true, QuantStrategy::Group, 16), 8, 32, false, 10, 1);
  bf.scheme.scale_dtype = DType::BF16;
  bf.scales[2] = bf16_to_f32(f32_to_bf16(1e-30f));  // below f16's range
  EXPECT_QF_ERROR(add_gptq_linear(w, "b", bf), ErrorKind::InvalidInput, "not exactly representable in f16");
  auto badsym = random_qt(QuantScheme::make(4, true, QuantStrategy::Group, 16), 8, 32, false, 11, 1);
  badsym.zeros[0] = 3;
  EXPECT_QF_ERROR(add_gptq_linear(w, "s", badsym), ErrorKind::InvalidInput, "symmetric scheme with zero point 3");
}

TEST(GptqFormat, QuantizeConfigFields) {
  GptqConfigExtras x;
  x.quantizer = "quantforge:0.1.0";
  const json got = gptq_quantize_config(QuantScheme::make(4, true, QuantStrategy::Group, 128), true, x);
  const json want = json::parse(R"({
    "bits": 4, "group_size": 128, "desc_act": true, "sym": true, "lm_head": false,
    "quant_method": "gptq", "checkpoint_format": "gptq", "pack_dtype": "int32",
    "damp_percent": 0.01, "static_groups": false, "true_sequential": true,
    "meta": {"quantizer": ["quantforge:0.1.0"], "damp_percent": 0.01, "static_groups": false, "true_sequential": true}
  })");
  EXPECT_EQ(got, want) << got.dump(2);
  const json ch = gptq_quantize_config(QuantScheme::make(8, false, QuantStrategy::Channel), false);
  EXPECT_EQ(ch["group_size"], -1);
  EXPECT_EQ(ch["sym"], false);
  bool v2 = true;
  const auto s = gptq_scheme_from_config(ch, &v2);
  EXPECT_EQ(s.strategy, QuantStrategy::Channel);
  EXPECT_EQ(s.bits, 8);
  EXPECT_FALSE(s.symmetric);
  EXPECT_FALSE(v2);
  // AutoGPTQ-era configs without checkpoint_format, GPTQModel's "format" key, and refusals.
  EXPECT_EQ(gptq_scheme_from_config(json{{"bits", 4}, {"group_size", 128}}).group_size, 128);
  gptq_scheme_from_config(json{{"bits", 4}, {"group_size", 128}, {"format", "gptq_v2"}}, &v2);
  EXPECT_TRUE(v2);
  EXPECT_QF_ERROR(gptq_scheme_from_config(json{{"bits", 4}, {"group_size", 128}, {"checkpoint_format", "marlin"}}),
                  ErrorKind::Unsupported, "marlin");
  EXPECT_QF_ERROR(gptq_scheme_from_config(json{{"bits", 6}, {"group_size", 128}}), ErrorKind::Unsupported, "bits 6");
  EXPECT_QF_ERROR(gptq_scheme_from_config(json{{"bits", 4}, {"group_size", 128}, {"quant_method", "awq"}}),
                  ErrorKind::Unsupported, "quant_method");
  EXPECT_QF_ERROR(gptq_quantize_config(QuantScheme::make(4, true, QuantStrategy::Tensor), false), ErrorKind::Unsupported, "per-tensor");
}

// GPTQModel's gptq_v2 stores zero points without the -1.
TEST(GptqFormat, ReadsV2ZeroPoints) {
  test::TempDir v1dir, v2dir;
  const auto q = random_qt(QuantScheme::make(2, false, QuantStrategy::Group, 16), 16, 32, false, 12, 1);
  {
    SafetensorsWriter w(v1dir.path());
    add_gptq_linear(w, "x", q);
    w.finish();
  }
  const auto v1 = Checkpoint::open(v1dir.path());
  {
    SafetensorsWriter w(v2dir.path());
    for (const char* t : {"x.qweight", "x.scales", "x.g_idx"}) w.add(t, v1.tensor(t));
    std::vector<uint8_t> zm(2 * 16);  // [G, N], z itself (z <= 3 fits in 2 bits)
    for (int n = 0; n < 16; ++n)
      for (int g = 0; g < 2; ++g) zm[g * 16 + n] = static_cast<uint8_t>(q.zeros[n * 2 + g]);
    const auto qz = pack_int32_rows(zm.data(), 2, 16, 2);
    w.add("x.qzeros", DType::I32, {2, 1}, qz.data(), qz.size() * 4);
    w.finish();
  }
  json cfg = gptq_quantize_config(q.scheme, false);
  cfg["checkpoint_format"] = "gptq_v2";
  expect_same(q, read_gptq_linear(Checkpoint::open(v2dir.path()), "x", cfg), "v2");
  expect_same(q, read_gptq_linear(v1, "x", gptq_quantize_config(q.scheme, false)), "v1");
}

}  // namespace
}  // namespace qf
