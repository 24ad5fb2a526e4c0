#include "runtime/generate.h"

#include <chrono>

#include "core/error.h"
#include "formats/tokenizer/tokenizer_impl.h"

namespace qf::rt {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Length of the longest prefix of s that does not end inside a UTF-8 character.
size_t complete_utf8(const std::string& s) {
  const size_t n = s.size();
  for (size_t i = n, back = 0; i > 0 && back < 4; --i, ++back) {
    const unsigned char c = static_cast<unsigned char>(s[i - 1]);
    if ((c & 0xC0) != 0x80) return n - (i - 1) >= tok::utf8_len(c) ? n : i - 1;
  }
  return n;
}

// Streams decode(ids) as it grows.
class TextStream {
 public:
  TextStream(const Tokenizer& tok, const std::function<void(const std::string&)>& out) : tok_(tok), out_(out) {}
  void push(int32_t id) {
    ids_.push_back(id);
    const std::string text = tok_.decode(ids_);
    const size_t ready = complete_utf8(text);
    if (ready > printed_ && text.compare(0, printed_, shown_) == 0) {
      out_(text.substr(printed_, ready - printed_));
      shown_ = text.substr(0, ready);
      printed_ = ready;
    }
  }

 private:
  const Tokenizer& tok_;
  const std::function<void(const std::string&)>& out_;
  std::vector<int32_t> ids_;
  std::string shown_;
  size_t printed_ = 0;
};

}  // namespace

GenerateResult generate(const Model& model, const Tokenizer& tok, const std::string& prompt,
                        const GenerateOptions& opts, ThreadPool& pool,
                        const std::function<void(const std::string&)>& on_text) {
  if (opts.max_new_tokens < 0) throw Error(ErrorKind::Usage, "-n must be >= 0");
  GenerateResult r;
  r.prompt = tok.encode(prompt, tok.bos_id() >= 0);
  if (r.prompt.empty()) throw invalid_input("generate", "the prompt is empty and the vocabulary has no BOS token");
  const int64_t total = static_cast<int64_t>(r.prompt.size()) + opts.max_new_tokens;
  if (model.max_context() > 0 && total > model.max_context())
    throw invalid_input("generate", "prompt (" + std::to_string(r.prompt.size()) + " tokens) plus -n " +
                                        std::to_string(opts.max_new_tokens) + " exceeds the model's context of " +
                                        std::to_string(model.max_context()));
  Sampler sampler(opts.sampler);
  KvCache cache = model.make_cache(opts.kv_dtype, total);
  model.calibrate_kv(cache, {r.prompt}, pool);  // NVFP4: global scales from the prompt's keys and values
  const int32_t seq = cache.add_sequence();
  TextStream stream(tok, on_text);
  for (size_t i = 0; i < r.prompt.size(); ++i)
    if (r.prompt[i] != tok.bos_id()) stream.push(r.prompt[i]);
  if (opts.max_new_tokens == 0) return r;

  std::vector<float> logits;
  Batch b;
  for (size_t i = 0; i < r.prompt.size(); ++i) b.add(r.prompt[i], seq, static_cast<int64_t>(i), i + 1 == r.prompt.size());
  auto t0 = std::chrono::steady_clock::now();
  model.forward(b, cache, logits, pool);
  r.prefill_seconds = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  int64_t pos = static_cast<int64_t>(r.prompt.size());
  for (int64_t i = 0; i < opts.max_new_tokens; ++i) {
    const int32_t next = sampler.sample(logits.data(), model.vocab_size());
    if (next == tok.eos_id() || next == tok.bos_id()) {
      r.stopped = true;
      break;
    }
    r.generated.push_back(next);
    stream.push(next);
    if (i + 1 == opts.max_new_tokens) break;
    b.clear();
    b.add(next, seq, pos++, true);
    model.forward(b, cache, logits, pool);
  }
  r.decode_seconds = seconds_since(t0);
  return r;
}

}  // namespace qf::rt
