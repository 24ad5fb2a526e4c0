// Fuzz target: the resume state of an interrupted `quantize`
// (calibration/resume_state.h). A fixed one-layer model (hidden 8, 2 heads of
// 4, 1 KV head, intermediate 16, vocabulary 16) has its layer saved once, with
// q_proj quantized (RTN, 4 bits, groups of 4, asymmetric) and the rest dense:
// that is the valid state the input then damages. The first input byte picks
// how, the rest is the payload:
//   0: state.json is the payload (the valid layer file beside it);
//   1: the layer file is the payload, and state.json records its SHA-256 (as
//      a state written by a faulty tool would), so restore_layer reads it;
//   2: the valid layer file with the payload applied as patches, each three
//      bytes (offset low, offset high, value), its SHA-256 recorded likewise;
//   3: the same patches, the state.json left with the valid file's SHA-256:
//      the checksum must catch the damage, and a resumed state never holds
//      the damaged layer.
// Then a ResumeState is opened with --resume and every layer it reports as
// done is restored into the model.
#include "calibration/resume_state.h"
#include "core/sha256.h"
#include "fuzz_tiny_llama.h"
#include "fuzz_util.h"
#include "quantizers/rtn.h"
#include "runtime/linear.h"
#include "runtime/model.h"

namespace {

namespace fs = std::filesystem;

struct Fixture {
  fs::path model_dir, out, state_dir;
  std::unique_ptr<qf::rt::Model> model;
  std::string layer_bytes, state_json;
};

std::string read_bytes(const fs::path& p) {
  std::FILE* f = std::fopen(p.c_str(), "rb");
  if (!f) qf::fuzz::fail("cannot read " + p.string());
  std::string s;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  std::fclose(f);
  return s;
}

const nlohmann::ordered_json& fingerprint() {
  static const nlohmann::ordered_json fp = {{"fuzz", "resume_state"}};
  return fp;
}

Fixture& fixture() {
  static Fixture fx = [] {
    Fixture f;
    f.model_dir = qf::fuzz::scratch_dir() / "resume_model";
    qf::fuzz::write_tiny_llama_weights(f.model_dir);
    const std::string p = "model.layers.0.";
    std::FILE* c = std::fopen((f.model_dir / "config.json").c_str(), "wb");
    const std::string cfg =
        R"({"model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 16, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 64, "tie_word_embeddings": false})";
    std::fwrite(cfg.data(), 1, cfg.size(), c);
    std::fclose(c);
    f.model = qf::rt::load_hf_model(f.model_dir);

    // The valid state: layer 0 saved with q_proj quantized.
    f.out = qf::fuzz::scratch_dir() / "resume_out";
    f.state_dir = qf::ResumeState::folder_for(f.out);
    std::vector<float> q(64);
    for (size_t i = 0; i < q.size(); ++i) q[i] = 0.1f * static_cast<float>(static_cast<int>(i % 11) - 5);
    qf::QuantizedLinearResult r;
    r.name = p + "self_attn.q_proj";
    r.q = qf::quantize_rtn(q.data(), 8, 8, qf::QuantScheme::make(4, false, qf::QuantStrategy::Group, 4));
    r.error = 0.01;
    {
      qf::ResumeState s(f.out, fingerprint(), false, [](const std::string&) {});
      std::vector<qf::QuantizedLinearResult> done;
      done.push_back(std::move(r));
      s.save_layer(f.model->config(), 0, f.model->weights().layers[0], std::move(done), 0.5, std::nullopt);
      s.finish();
      f.layer_bytes = read_bytes(f.state_dir / "layer-00000.safetensors");
      f.state_json = read_bytes(f.state_dir / "state.json");
      s.remove();  // the fixture keeps the bytes, not the folder
    }
    return f;
  }();
  return fx;
}

// state.json for one finished layer whose file has this SHA-256.
std::string state_for(const std::string& sha) {
  nlohmann::ordered_json j = {{"format", "quantforge-resume"}, {"version", 3}, {"fingerprint", fingerprint()},
                              {"layers_done", 1},
                              {"layers", {{{"file", "layer-00000.safetensors"}, {"sha256", sha}}}}};
  return j.dump(2);
}

void put(const fs::path& p, const std::string& bytes) {
  std::FILE* f = std::fopen(p.c_str(), "wb");
  if (!f) qf::fuzz::fail("cannot write " + p.string());
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) qf::fuzz::fail("short write");
  std::fclose(f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Fixture& fx = fixture();
  if (size == 0) return 0;
  const int mode = data[0] % 4;
  const std::string payload(reinterpret_cast<const char*>(data + 1), size - 1);
  std::string layer = fx.layer_bytes, state = fx.state_json;
  if (mode == 0) {
    state = payload;
  } else if (mode == 1) {
    layer = payload;
    state = state_for(qf::sha256_hex(layer));
  } else {
    for (size_t i = 0; i + 3 <= payload.size(); i += 3) {
      const size_t at = (static_cast<uint8_t>(payload[i]) | static_cast<size_t>(static_cast<uint8_t>(payload[i + 1])) << 8);
      if (!layer.empty()) layer[at % layer.size()] = payload[i + 2];
    }
    if (mode == 2) state = state_for(qf::sha256_hex(layer));
  }
  std::error_code ec;
  fs::remove_all(fx.state_dir, ec);
  fs::create_directories(fx.state_dir);
  put(fx.state_dir / "state.json", state);
  put(fx.state_dir / "layer-00000.safetensors", layer);

  qf::fuzz::run([&] {
    qf::ResumeState s(fx.out, fingerprint(), true, [](const std::string&) {});
    if (s.layers_done() > 1) qf::fuzz::fail("more finished layers than there are layer files");
    if (mode == 3 && s.layers_done() > 0 && layer != fx.layer_bytes)
      qf::fuzz::fail("a layer file that does not match its checksum was kept");
    for (int64_t li = 0; li < std::min<int64_t>(s.layers_done(), fx.model->config().num_hidden_layers); ++li) {
      qf::rt::LayerWeights L = fx.model->weights().layers[static_cast<size_t>(li)];
      const qf::SavedLayer saved = s.restore_layer(fx.model->config(), li, L);
      for (const qf::QuantizedLinearResult& d : saved.done)
        if (d.q.rows <= 0 || d.q.cols <= 0) qf::fuzz::fail("a restored Linear has an empty shape");
    }
  });
  fs::remove_all(fx.state_dir, ec);
  return 0;
}
