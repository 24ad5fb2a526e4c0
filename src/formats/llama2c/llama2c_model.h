// llama2.c legacy checkpoints (the tinyllamas, stories*.bin): reading and
// conversion to a Hugging Face Llama folder.
//
// Header: 7 little-endian int32 (dim, hidden_dim, n_layers, n_heads,
// n_kv_heads, vocab_size, seq_len); a negative vocab_size means a separate
// classifier follows the weights. Then float32 arrays: token embedding,
// rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3 (layer after layer), rms_final,
// the legacy RoPE tables (seq_len * head_dim / 2 floats twice, skipped), and
// wcls when not shared.
#pragma once

#include <cstdint>
#include <filesystem>

namespace qf {

struct Llama2cHeader {
  int32_t dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, vocab_size = 0, seq_len = 0;
  bool shared_classifier = true;
};

// Reads and validates the header against the file size.
Llama2cHeader read_llama2c_header(const std::filesystem::path& bin);

// Writes DIR with model.safetensors (float32, Hugging Face names; wq/wk rows
// permuted per head from llama2.c's interleaved RoPE pairs to HF's
// rotate-half layout), config.json, generation_config.json and the tokenizer
// files from the llama2.c tokenizer. DIR appears only when complete.
void convert_llama2c_to_hf(const std::filesystem::path& bin, const std::filesystem::path& tokenizer,
                           const std::filesystem::path& out_dir);

}  // namespace qf
