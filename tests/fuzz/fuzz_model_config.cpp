// Fuzz target: config.json of a Hugging Face model folder. The input is
// written as config.json beside a fixed, valid one-layer checkpoint (hidden
// 8, 2 heads of 4, 1 KV head, intermediate 16, vocabulary 16, f32, untied),
// then parsed and validated (ModelConfig), inspected, and loaded by the
// runtime, which checks the config (layer count included) against the
// tensors and reads quantization_config.
#include "inspect/hf_inspect.h"
#include "formats/hf/model_config.h"
#include "formats/safetensors.h"
#include "fuzz_util.h"
#include "runtime/model.h"

namespace {

const std::filesystem::path& model_dir() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path d = qf::fuzz::scratch_dir() / "model_config";
    std::filesystem::create_directories(d);
    qf::SafetensorsWriter w(d, "model");
    auto add = [&](const std::string& name, qf::Shape shape) {
      std::vector<float> v(static_cast<size_t>(qf::shape_numel(shape)));
      for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i % 7) + 0.5f;
      w.add(name, qf::Tensor::from_f32(v, shape));
    };
    add("model.embed_tokens.weight", {16, 8});
    const std::string p = "model.layers.0.";
    add(p + "input_layernorm.weight", {8});
    add(p + "post_attention_layernorm.weight", {8});
    add(p + "self_attn.q_proj.weight", {8, 8});
    add(p + "self_attn.k_proj.weight", {4, 8});
    add(p + "self_attn.v_proj.weight", {4, 8});
    add(p + "self_attn.o_proj.weight", {8, 8});
    add(p + "mlp.gate_proj.weight", {16, 8});
    add(p + "mlp.up_proj.weight", {16, 8});
    add(p + "mlp.down_proj.weight", {8, 16});
    add("model.norm.weight", {8});
    add("lm_head.weight", {16, 8});
    w.finish();
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::filesystem::path dir = model_dir();
  qf::fuzz::write_file("model_config/config.json", data, size);
  bool parsed = false;
  qf::fuzz::run([&] {
    const qf::ModelConfig c = qf::load_model_config(dir);
    if (c.head_dim <= 0 || c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads != 0)
      qf::fuzz::fail("check_model_config let an inconsistent config through");
    parsed = true;
  });
  if (!parsed) return 0;
  qf::fuzz::run([&] {
    const nlohmann::json info = qf::inspect_model(dir.string(), "main");
    qf::format_inspect_report(info);
  });
  qf::fuzz::run([&] { qf::rt::load_hf_model(dir); });
  return 0;
}
