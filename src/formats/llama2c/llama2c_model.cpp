#include "formats/llama2c/llama2c_model.h"

#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io.h"
#include "formats/safetensors.h"
#include "formats/tokenizer/tokenizer.h"

namespace qf {
namespace {

uint64_t expected_floats(const Llama2cHeader& h) {
  const uint64_t d = static_cast<uint64_t>(h.dim), f = static_cast<uint64_t>(h.hidden_dim);
  const uint64_t L = static_cast<uint64_t>(h.n_layers), v = static_cast<uint64_t>(h.vocab_size);
  const uint64_t kv = d / static_cast<uint64_t>(h.n_heads) * static_cast<uint64_t>(h.n_kv_heads);
  const uint64_t hd = d / static_cast<uint64_t>(h.n_heads);
  uint64_t n = v * d;                        // token embedding
  n += L * (d + d * d + 2 * kv * d + d * d); // rms_att, wq, wk, wv, wo
  n += L * (d + 3 * f * d);                  // rms_ffn, w1, w2, w3
  n += d;                                    // rms_final
  n += static_cast<uint64_t>(h.seq_len) * hd;  // freq_cis_real + freq_cis_imag (hd/2 each)
  if (!h.shared_classifier) n += v * d;
  return n;
}

}  // namespace

Llama2cHeader read_llama2c_header(const std::filesystem::path& bin) {
  auto file = MappedFile::open(bin);
  const std::string where = bin.string();
  if (file->size() < 28) throw invalid_input(where, "too short for a llama2.c checkpoint header (28 bytes)");
  int32_t v[7];
  std::memcpy(v, file->data(), sizeof v);
  auto bad = [&](const std::string& what) {
    return invalid_input(where, what + " (header: dim " + std::to_string(v[0]) + ", hidden_dim " + std::to_string(v[1]) +
                                    ", n_layers " + std::to_string(v[2]) + ", n_heads " + std::to_string(v[3]) +
                                    ", n_kv_heads " + std::to_string(v[4]) + ", vocab " + std::to_string(v[5]) +
                                    ", seq_len " + std::to_string(v[6]) + "); not a llama2.c checkpoint?");
  };
  // Checked before the vocabulary's sign is taken off: -INT32_MIN does not exist.
  const int32_t lim = 1 << 20;
  for (int32_t x : v)
    if (x == 0 || x > lim || x < -lim) throw bad("header values must be non-zero and below 2^20");
  const Llama2cHeader h{v[0], v[1], v[2], v[3], v[4], v[5] < 0 ? -v[5] : v[5], v[6], v[5] > 0};
  if (h.dim < 0 || h.hidden_dim < 0 || h.n_layers < 0 || h.n_heads < 0 || h.n_kv_heads < 0 || h.seq_len < 0)
    throw bad("negative dimension");
  if (h.dim % h.n_heads != 0 || (h.dim / h.n_heads) % 2 != 0) throw bad("dim must be n_heads x an even head size");
  if (h.n_heads % h.n_kv_heads != 0) throw bad("n_heads must be a multiple of n_kv_heads");
  // With every value below 2^20 the float count stays below 2^63, but four
  // bytes each can wrap 64 bits: compare counts, not byte sizes.
  const uint64_t floats = expected_floats(h);
  if (floats != (file->size() - 28) / 4 || (file->size() - 28) % 4 != 0)
    throw bad("file has " + std::to_string(file->size()) + " bytes but the header implies 28 + 4 x " +
              std::to_string(floats));
  return h;
}

void convert_llama2c_to_hf(const std::filesystem::path& bin, const std::filesystem::path& tokenizer,
                           const std::filesystem::path& out_dir) {
  const Llama2cHeader h = read_llama2c_header(bin);
  Vocab vocab = vocab_from_llama2c(tokenizer);
  if (static_cast<int64_t>(vocab.tokens.size()) != h.vocab_size)
    throw invalid_input(tokenizer.string(), "has " + std::to_string(vocab.tokens.size()) + " tokens but " +
                                                bin.string() + " has a vocabulary of " + std::to_string(h.vocab_size));
  auto file = MappedFile::open(bin);
  const float* p = reinterpret_cast<const float*>(file->data() + 28);
  const int64_t d = h.dim, f = h.hidden_dim, L = h.n_layers, hd = d / h.n_heads, kv = hd * h.n_kv_heads;
  auto take = [&](int64_t n) {
    const float* r = p;
    p += n;
    return r;
  };
  const float* emb = take(h.vocab_size * d);
  const float* rms_att = take(L * d);
  const float* wq = take(L * d * d);
  const float* wk = take(L * kv * d);
  const float* wv = take(L * kv * d);
  const float* wo = take(L * d * d);
  const float* rms_ffn = take(L * d);
  const float* w1 = take(L * f * d);
  const float* w2 = take(L * d * f);
  const float* w3 = take(L * f * d);
  const float* rms_final = take(d);
  take(static_cast<int64_t>(h.seq_len) * hd);
  const float* wcls = h.shared_classifier ? nullptr : take(h.vocab_size * d);

  // llama2.c rotates pairs (2i, 2i+1) of each head; HF rotates (i, i + hd/2).
  auto permuted = [&](const float* w, int64_t heads) {
    std::vector<float> out(static_cast<size_t>(heads * hd * d));
    for (int64_t hh = 0; hh < heads; ++hh)
      for (int64_t i = 0; i < hd / 2; ++i)
        for (int64_t half = 0; half < 2; ++half) {
          const float* src = w + (hh * hd + 2 * i + half) * d;
          std::memcpy(out.data() + (hh * hd + half * (hd / 2) + i) * d, src, static_cast<size_t>(d) * 4);
        }
    return out;
  };

  StagingDir stage(out_dir);
  {
    SafetensorsWriter w(stage.path(), "model");
    w.set_metadata({{"format", "pt"}});
    auto add = [&](const std::string& name, const float* data, Shape shape) {
      w.add(name, DType::F32, shape, data, static_cast<size_t>(shape_numel(shape)) * 4);
    };
    add("model.embed_tokens.weight", emb, {h.vocab_size, d});
    for (int64_t l = 0; l < L; ++l) {
      const std::string pre = "model.layers." + std::to_string(l) + ".";
      add(pre + "input_layernorm.weight", rms_att + l * d, {d});
      std::vector<float> q = permuted(wq + l * d * d, h.n_heads), k = permuted(wk + l * kv * d, h.n_kv_heads);
      add(pre + "self_attn.q_proj.weight", q.data(), {d, d});
      add(pre + "self_attn.k_proj.weight", k.data(), {kv, d});
      add(pre + "self_attn.v_proj.weight", wv + l * kv * d, {kv, d});
      add(pre + "self_attn.o_proj.weight", wo + l * d * d, {d, d});
      add(pre + "post_attention_layernorm.weight", rms_ffn + l * d, {d});
      add(pre + "mlp.gate_proj.weight", w1 + l * f * d, {f, d});
      add(pre + "mlp.down_proj.weight", w2 + l * d * f, {d, f});
      add(pre + "mlp.up_proj.weight", w3 + l * f * d, {f, d});
    }
    add("model.norm.weight", rms_final, {d});
    if (wcls) add("lm_head.weight", wcls, {h.vocab_size, d});
    w.finish();
  }
  nlohmann::ordered_json cfg = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_size", d},
      {"intermediate_size", f},
      {"num_hidden_layers", L},
      {"num_attention_heads", h.n_heads},
      {"num_key_value_heads", h.n_kv_heads},
      {"head_dim", hd},
      {"vocab_size", h.vocab_size},
      {"max_position_embeddings", h.seq_len},
      {"rms_norm_eps", 1e-5},
      {"rope_theta", 10000.0},
      {"rope_scaling", nullptr},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"tie_word_embeddings", h.shared_classifier},
      {"bos_token_id", vocab.bos_id},
      {"eos_token_id", vocab.eos_id},
      {"torch_dtype", "float32"},
      {"transformers_version", "4.44.0"},
  };
  write_file_atomic(stage.path() / "config.json", cfg.dump(2) + "\n");
  nlohmann::ordered_json gen = {{"bos_token_id", vocab.bos_id}, {"eos_token_id", vocab.eos_id}};
  write_file_atomic(stage.path() / "generation_config.json", gen.dump(2) + "\n");
  write_hf_tokenizer(vocab, stage.path(), h.seq_len);
  stage.commit();
}

}  // namespace qf
