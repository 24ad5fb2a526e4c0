#include "checkpoint/bitsandbytes_format.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "checkpoint/checkpoint_format.h"
#include "quantizers/bnb4.h"
#include "runtime/linear.h"
#include "test_util.h"

namespace qf {
namespace {

using json = nlohmann::json;

std::vector<float> random_weights(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.03f);
  std::vector<float> w(static_cast<size_t>(n));
  for (float& v : w) v = nd(rng);
  return w;
}

std::string tensor_text(const Checkpoint& ck, const std::string& name) {
  const Tensor t = ck.tensor(name);
  return std::string(reinterpret_cast<const char*>(t.data()), static_cast<size_t>(t.numel()));
}

TEST(BitsandbytesFormat, PythonFloatRepr) {
  EXPECT_EQ(python_float_repr(0.0), "0.0");
  EXPECT_EQ(python_float_repr(1.0), "1.0");
  EXPECT_EQ(python_float_repr(0.1), "0.1");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(0.00001), "1e-05");
  EXPECT_EQ(python_float_repr(-0.000123), "-0.000123");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(123.5), "123.5");
  EXPECT_EQ(python_float_repr(static_cast<double>(0.0123f)), "0.012299999594688416");  // repr(float(torch.tensor(0.0123)))
}

TEST(BitsandbytesFormat, LayoutAndRoundTrip) {
  test::TempDir d;
  const int64_t rows = 48, cols = 96;  // 4608 weights: 72 blocks
  const auto w = random_weights(rows * cols, 5);
  const QuantizedTensor nf4 = quantize_bnb4(w.data(), rows, cols, QuantScheme::bnb4(QuantType::Nf4, false, DType::F16));
  const QuantizedTensor fp4 = quantize_bnb4(w.data(), rows, cols, QuantScheme::bnb4(QuantType::Fp4, true, DType::BF16));
  {
    SafetensorsWriter wr(d.path());
    add_bnb4_linear(wr, "a", nf4);
    add_bnb4_linear(wr, "b", fp4);
    wr.finish();
  }
  const auto ck = Checkpoint::open(d.path());
  // NF4 without double quantization.
  EXPECT_EQ(ck.info("a.weight").dtype, DType::U8);
  EXPECT_EQ(ck.info("a.weight").shape, (Shape{rows * cols / 2, 1}));
  EXPECT_EQ(ck.info("a.weight.absmax").dtype, DType::F32);
  EXPECT_EQ(ck.info("a.weight.absmax").shape, (Shape{72}));
  EXPECT_EQ(ck.info("a.weight.quant_map").shape, (Shape{16}));
  EXPECT_FALSE(ck.contains("a.weight.nested_absmax"));
  EXPECT_EQ(tensor_text(ck, "a.weight.quant_state.bitsandbytes__nf4"),
            "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float16\", \"shape\": [48, 96]}");
  const uint8_t* pa = ck.tensor("a.weight").data_as<uint8_t>();
  EXPECT_EQ(pa[0], static_cast<uint8_t>(nf4.q[0] << 4 | nf4.q[1]));
  // FP4 with double quantization.
  EXPECT_EQ(ck.info("b.weight.absmax").dtype, DType::U8);
  EXPECT_EQ(ck.info("b.weight.absmax").shape, (Shape{72}));
  EXPECT_EQ(ck.info("b.weight.nested_absmax").dtype, DType::F32);
  EXPECT_EQ(ck.info("b.weight.nested_absmax").shape, (Shape{1}));
  EXPECT_EQ(ck.info("b.weight.nested_quant_map").shape, (Shape{256}));
  EXPECT_EQ(tensor_text(ck, "b.weight.quant_state.bitsandbytes__fp4"),
            "{\"quant_type\": \"fp4\", \"blocksize\": 64, \"dtype\": \"bfloat16\", \"shape\": [48, 96], "
            "\"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": " +
                python_float_repr(fp4.absmax_offset) + "}");
  const json st = json::parse(tensor_text(ck, "b.weight.quant_state.bitsandbytes__fp4"));
  EXPECT_EQ(static_cast<float>(st["nested_offset"].get<double>()), fp4.absmax_offset);

  for (const auto& [name, q] : {std::pair<std::string, const QuantizedTensor*>{"a", &nf4}, {"b", &fp4}}) {
    const auto r = read_bnb4_linear(ck, name);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->q, q->q);
    EXPECT_EQ(r->scales, q->scales);
    EXPECT_EQ(r->scheme.describe(), q->scheme.describe());
    EXPECT_EQ(r->scheme.scale_dtype, q->scheme.scale_dtype);
  }
  EXPECT_FALSE(read_bnb4_linear(ck, "missing").has_value());

  // The runtime's decoded rows are bitsandbytes' dequantize_4bit of the stored
  // bytes, computed here from the raw tensors: the absmax decoded with the
  // stored nested map, then round_to(dtype, table[nibble] * absmax).
  const auto b_codes = ck.tensor("b.weight.absmax").data_as<uint8_t>();
  const float* nmap = ck.tensor("b.weight.nested_quant_map").data_as<float>();
  const float nabs = ck.tensor("b.weight.nested_absmax").data_as<float>()[0];
  const float* qmap_b = ck.tensor("b.weight.quant_map").data_as<float>();
  const float* qmap_a = ck.tensor("a.weight.quant_map").data_as<float>();
  const float* abs_a = ck.tensor("a.weight.absmax").data_as<float>();
  const uint8_t* pb = ck.tensor("b.weight").data_as<uint8_t>();
  const auto la = rt::make_quantized_linear(*read_bnb4_linear(ck, "a"), nullptr, nullptr, "a");
  const auto lb = rt::make_quantized_linear(*read_bnb4_linear(ck, "b"), nullptr, nullptr, "b");
  std::vector<float> ra(static_cast<size_t>(cols)), rb(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    la->decode_row(r, ra.data());
    lb->decode_row(r, rb.data());
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t e = r * cols + c;
      const uint8_t ca = e % 2 ? pa[e / 2] & 15 : pa[e / 2] >> 4;
      const uint8_t cb = e % 2 ? pb[e / 2] & 15 : pb[e / 2] >> 4;
      const float va = f16_to_f32(f32_to_f16(qmap_a[ca] * abs_a[e / 64]));
      float absb = nmap[b_codes[e / 64]] * nabs;
      absb += static_cast<float>(st["nested_offset"].get<double>());
      const float vb = bf16_to_f32(f32_to_bf16(qmap_b[cb] * absb));
      ASSERT_EQ(ra[static_cast<size_t>(c)], va) << r << "," << c;
      ASSERT_EQ(rb[static_cast<size_t>(c)], vb) << r << "," << c;
    }
  }
  EXPECT_EQ(la->format(), "nf4 b64");
  EXPECT_EQ(lb->format(), "fp4 b64 dq");
}

TEST(BitsandbytesFormat, ConfigAndChecks) {
  const CheckpointFormat& f = checkpoint_format("bitsandbytes", "");
  const QuantScheme nf4 = QuantScheme::bnb4(QuantType::Nf4, true, DType::F16);
  const json c = bnb_quantization_config(nf4, {"lm_head"}, "bfloat16");
  EXPECT_EQ(c.dump(),
            "{\"_load_in_4bit\":true,\"_load_in_8bit\":false,\"bnb_4bit_compute_dtype\":\"bfloat16\","
            "\"bnb_4bit_quant_storage\":\"uint8\",\"bnb_4bit_quant_type\":\"nf4\",\"bnb_4bit_use_double_quant\":true,"
            "\"llm_int8_enable_fp32_cpu_offload\":false,\"llm_int8_has_fp16_weight\":false,"
            "\"llm_int8_skip_modules\":[\"lm_head\"],\"llm_int8_threshold\":6.0,\"load_in_4bit\":true,"
            "\"load_in_8bit\":false,\"quant_method\":\"bitsandbytes\"}");
  EXPECT_EQ(f.describe(c), "bitsandbytes: nf4, double quant, compute bfloat16");
  EXPECT_TRUE(f.one_scheme_per_model());
  EXPECT_FALSE(f.holds_kv_scales());
  LinearCheck lc;
  lc.weights = &nf4;
  lc.where = "r.yaml:3:7";
  EXPECT_NO_THROW(f.check_linear(lc));
  const QuantScheme w4 = QuantScheme::make(4, true, QuantStrategy::Group, 128);
  lc.weights = &w4;
  EXPECT_QF_ERROR(f.check_linear(lc), ErrorKind::Unsupported, "r.yaml:3:7: the bitsandbytes format holds the NF4 and FP4");
  // The other formats refuse NF4.
  lc.weights = &nf4;
  for (const char* other : {"compressed-tensors", "gptq", "awq", "modelopt"})
    EXPECT_THROW(checkpoint_format(other, "").check_linear(lc), Error) << other;
  // open(): 8-bit and other storages are refused.
  EXPECT_QF_ERROR(f.open("", json{{"quant_method", "bitsandbytes"}, {"load_in_8bit", true}}, "config.json"),
                  ErrorKind::Unsupported, "config.json: bitsandbytes LLM.int8");
  EXPECT_QF_ERROR(f.open("", json{{"load_in_4bit", true}, {"bnb_4bit_quant_storage", "bfloat16"}}, "config.json"),
                  ErrorKind::Unsupported, "bnb_4bit_quant_storage 'bfloat16'");
  EXPECT_NO_THROW(f.open("", c, "config.json"));
}

}  // namespace
}  // namespace qf
