// Text generation: prefill the prompt, then sample one token at a time,
// stopping after max_new_tokens or at EOS (or BOS, which llama2.c-style
// models emit between documents).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "formats/tokenizer/tokenizer.h"
#include "runtime/model.h"
#include "runtime/sampler.h"

namespace qf::rt {

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  SamplerOptions sampler;
  KvFormat kv_dtype = KvDType::F16;
};

struct GenerateResult {
  std::vector<int32_t> prompt;  // BOS included
  std::vector<int32_t> generated;
  bool stopped = false;          // ended at EOS/BOS before max_new_tokens
  double prefill_seconds = 0, decode_seconds = 0;
};

// `on_text` receives the text as it becomes final: first the prompt, then each
// continuation piece (bytes of an incomplete UTF-8 character are held back).
// Like llama2.c, the leading space the tokenizer adds is not printed.
GenerateResult generate(const Model& model, const Tokenizer& tok, const std::string& prompt,
                        const GenerateOptions& opts, ThreadPool& pool,
                        const std::function<void(const std::string&)>& on_text);

}  // namespace qf::rt
