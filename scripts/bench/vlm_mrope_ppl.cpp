// Text perplexity of a llama.cpp model (include/llama.h), scored the way
// llama-perplexity scores it (chunks of CTX tokens, the first token of each a
// BOS when the vocabulary adds one, the second half of each chunk scored),
// but with the positions a "qwen2vl" model reads: four per token (temporal,
// height, width: the token's index; the fourth section 0), as
// llama-qwen2vl-cli feeds text. llama-perplexity gives such a model one
// position per token, so its number for a qwen2vl file is not this one.
// Built by scripts/bench/vlm_llama_cpp_check.sh against a llama.cpp tree; not
// part of quantforge's build.
//
//   vlm_mrope_ppl MODEL.gguf TEXT CTX CHUNKS THREADS
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s MODEL.gguf TEXT CTX CHUNKS THREADS\n", argv[0]);
    return 2;
  }
  const int n_ctx = std::atoi(argv[3]), max_chunks = std::atoi(argv[4]), threads = std::atoi(argv[5]);
  std::ifstream in(argv[2], std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();

  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) return 1;
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = n_ctx;
  cp.n_batch = n_ctx;
  cp.n_ubatch = n_ctx;
  cp.n_threads = cp.n_threads_batch = threads;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) return 1;
  const llama_vocab* vocab = llama_model_get_vocab(model);
  char arch[64] = {0};
  llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch);
  const bool mrope = std::strcmp(arch, "qwen2vl") == 0;
  const bool add_bos = llama_vocab_get_add_bos(vocab);

  std::vector<llama_token> tokens(text.size() + 16);
  const int n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), tokens.data(),
                               static_cast<int32_t>(tokens.size()), add_bos, false);
  if (n < 0) return 1;
  tokens.resize(n);
  const int n_vocab = llama_vocab_n_tokens(vocab);
  const int chunks = std::min(max_chunks, n / n_ctx);
  double nll = 0;
  long count = 0;
  std::vector<llama_token> batch_tokens(n_ctx);
  std::vector<llama_pos> pos(static_cast<size_t>(n_ctx) * (mrope ? 4 : 1), 0);
  std::vector<int8_t> logits(n_ctx, 1);
  for (int c = 0; c < chunks; ++c) {
    const int start = c * n_ctx;
    std::copy(tokens.begin() + start, tokens.begin() + start + n_ctx, batch_tokens.begin());
    if (add_bos) batch_tokens[0] = llama_vocab_bos(vocab);
    for (int j = 0; j < n_ctx; ++j)
      for (int s = 0; s < (mrope ? 3 : 1); ++s) pos[static_cast<size_t>(s) * n_ctx + j] = j;
    llama_kv_cache_clear(ctx);
    llama_batch batch = {n_ctx, batch_tokens.data(), nullptr, pos.data(), nullptr, nullptr, logits.data()};
    if (llama_decode(ctx, batch)) return 1;
    for (int j = n_ctx / 2; j < n_ctx - 1; ++j) {
      const float* l = llama_get_logits_ith(ctx, j);
      double mx = l[0];
      for (int v = 1; v < n_vocab; ++v) mx = std::max<double>(mx, l[v]);
      double sum = 0;
      for (int v = 0; v < n_vocab; ++v) sum += std::exp(l[v] - mx);
      nll += std::log(sum) + mx - l[tokens[start + j + 1]];
      ++count;
    }
  }
  std::printf("arch %s, %s positions, %d chunks of %d: PPL = %.4f\n", arch, mrope ? "4 (M-RoPE)" : "1", chunks, n_ctx,
              std::exp(nll / static_cast<double>(count)));
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
