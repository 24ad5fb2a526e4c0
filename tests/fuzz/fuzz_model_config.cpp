// Fuzz target: config.json of a Hugging Face model folder. The input is
// written as config.json beside a fixed, valid one-layer checkpoint (hidden
// 8, 2 heads of 4, 1 KV head, intermediate 16, vocabulary 16, f32, untied),
// then parsed and validated (ModelConfig), inspected, and loaded by the
// runtime, which checks the config (layer count included) against the
// tensors and reads quantization_config.
#include "inspect/hf_inspect.h"
#include "formats/hf/model_config.h"
#include "fuzz_tiny_llama.h"
#include "fuzz_util.h"
#include "runtime/model.h"

namespace {

const std::filesystem::path& model_dir() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path d = qf::fuzz::scratch_dir() / "model_config";
    qf::fuzz::write_tiny_llama_weights(d);
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
