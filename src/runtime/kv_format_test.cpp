#include "runtime/kv_format.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "test_util.h"

namespace qf::rt {
namespace {

TEST(KvFormat, ParsesTypesPresetsAndSides) {
  EXPECT_EQ(parse_kv_dtype("fp8"), KvDType::F8_E4M3);
  EXPECT_EQ(parse_kv_dtype("iq4_nl"), KvDType::IQ4_NL);
  EXPECT_QF_ERROR(parse_kv_dtype("q4"), ErrorKind::Usage, "unknown KV-cache type");
  EXPECT_QF_ERROR(parse_kv_dtype("tq_k3_nc"), ErrorKind::Usage, "turboquant_k3v4_nc");  // presets only
  const KvFormat mixed = parse_kv_format("f16", "q8_0", "q4_0");
  EXPECT_EQ(mixed.k, KvDType::Q8_0);
  EXPECT_EQ(mixed.v, KvDType::Q4_0);
  EXPECT_EQ(mixed.name(), "k=q8_0,v=q4_0");
  EXPECT_EQ(mixed.llama_cpp_flags(128), "-ctk q8_0 -ctv q4_0 -fa (b4748; later builds: LLAMA_ATTN_ROT_DISABLE=1)");
  EXPECT_EQ(mixed.vllm_flag(), "");
  const KvFormat tq = parse_kv_format("turboquant_k3v4_nc");
  EXPECT_EQ(tq.k, KvDType::TQ_K3_NC);
  EXPECT_EQ(tq.v, KvDType::TQ_V4);
  EXPECT_EQ(tq.vllm_flag(), "--kv-cache-dtype turboquant_k3v4_nc");
  EXPECT_EQ(tq.llama_cpp_flags(128), "");
  EXPECT_QF_ERROR(parse_kv_format("turboquant_k8v4", "q4_0"), ErrorKind::Usage, "sets both sides");
  EXPECT_QF_ERROR(parse_kv_format("q4_0", "", "", "random"), ErrorKind::Usage, "--kv-rotation");
  const KvFormat rot = parse_kv_format("q4_0", "", "", "hadamard");
  EXPECT_EQ(rot.name(), "q4_0+hadamard");
  EXPECT_EQ(rot.llama_cpp_flags(32), "");  // llama.cpp rotates heads divisible by 64 only
  EXPECT_EQ(rot.llama_cpp_flags(128), "-ctk q4_0 -ctv q4_0 -fa (a build from April 2026 on: it rotates)");
  EXPECT_QF_ERROR(parse_kv_format("kivi2", "", "", "hadamard"), ErrorKind::Usage, "not for kivi2");
  EXPECT_QF_ERROR(parse_kv_format("nvfp4", "", "", "hadamard"), ErrorKind::Usage, "not for nvfp4");
  EXPECT_QF_ERROR(parse_kv_format("f16", "", "", "hadamard"), ErrorKind::Usage, "quantized caches only");
  EXPECT_EQ(parse_kv_format("f16", "", "q4_0", "hadamard").name(), "k=f16,v=q4_0+hadamard");
}

// Every name the sweep prints reads back as the same format (kv-sweep --types).
TEST(KvFormat, NamesReadBack) {
  for (const KvFormat& f : kv_sweep_formats(4)) EXPECT_EQ(parse_kv_format_name(f.name()), f) << f.name();
  EXPECT_EQ(parse_kv_format_name("k=q8_0,v=q4_0+hadamard").v, KvDType::Q4_0);
  EXPECT_QF_ERROR(parse_kv_format_name("q4_0+fast"), ErrorKind::Usage, "+fast");
  EXPECT_QF_ERROR(parse_kv_format_name("k=q8_0"), ErrorKind::Usage, "k=TYPE,v=TYPE");
  EXPECT_EQ(parse_kv_format("turboquant_k8v4", "", "", "none", 0).vllm_flag(), "");  // no vLLM flag for other edges
}

// vLLM's boundary rule: the first and last min(2, layers / 2) layers stay
// uncompressed, so a 4-layer model keeps them all and a 3-layer one its middle.
TEST(KvFormat, TurboQuantKeepsEdgeLayersAsVllm) {
  const KvFormat tq = parse_kv_format("turboquant_4bit_nc");
  for (int64_t l = 0; l < 4; ++l) EXPECT_EQ(tq.k_at(l, 4), KvDType::F16) << l;
  EXPECT_EQ(tq.k_at(0, 3), KvDType::F16);
  EXPECT_EQ(tq.k_at(1, 3), KvDType::TQ_K4_NC);
  EXPECT_EQ(tq.v_at(2, 3), KvDType::F16);
  for (int64_t l = 0; l < 32; ++l) EXPECT_EQ(tq.v_at(l, 32), l < 2 || l >= 30 ? KvDType::F16 : KvDType::TQ_V4) << l;
  KvFormat all = tq;
  all.keep_f16_edge = 0;  // --kv-f16-edge-layers 0
  EXPECT_EQ(all.k_at(0, 4), KvDType::TQ_K4_NC);
  EXPECT_EQ(all.name(), "turboquant_4bit_nc+edge0");
}

TEST(KvFormat, SweepCoversEveryType) {
  const std::vector<KvFormat> all = kv_sweep_formats();
  auto has = [&](KvDType t) {
    for (const KvFormat& f : all)
      if (f.k == t || f.v == t) return true;
    return false;
  };
  for (KvDType t : {KvDType::F16, KvDType::F8_E4M3, KvDType::I8, KvDType::Q8_0, KvDType::Q4_0, KvDType::Q4_1,
                    KvDType::Q5_0, KvDType::Q5_1, KvDType::IQ4_NL, KvDType::NVFP4, KvDType::KIVI2, KvDType::KIVI4,
                    KvDType::TQ_K8, KvDType::TQ_K4_NC, KvDType::TQ_K3_NC, KvDType::TQ_V4, KvDType::TQ_V3})
    EXPECT_TRUE(has(t)) << kv_dtype_name(t);
  EXPECT_EQ(all.front(), KvFormat(KvDType::F16));
}

}  // namespace
}  // namespace qf::rt
