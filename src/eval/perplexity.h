// Perplexity and comparison against a baseline model.
//
// The text is cut into spans the model reads from scratch (a fresh KV cache
// each); inside a span, the logits at position j predict token j + 1 and
// positions first_scored .. size-2 are scored. Three conventions:
//   chunks  llama.cpp's llama-perplexity: the whole text tokenized with BOS,
//           non-overlapping chunks of ctx (default 512), the first token of
//           each chunk replaced by BOS, only the second half scored
//           (first_scored = ctx / 2);
//   windows the GPTQ/AWQ papers': the joined text tokenized once, non-
//           overlapping windows of ctx (default 2048), every token after the
//           first of each window scored; the tail shorter than ctx is dropped
//           unless keep_tail (then kept when it has 2 tokens or more);
//   lines   each non-empty line on its own, BOS + tokens, in windows of at
//           most ctx (default 512) that overlap by one token, so that every
//           token after BOS is predicted exactly once.
// bos_per_line (windows only) tokenizes each non-empty line with BOS and
// joins the token streams instead of tokenizing the text once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "device/device.h"
#include "formats/tokenizer/tokenizer.h"
#include "runtime/model.h"
#include "runtime/vision/multimodal_prompt.h"

namespace qf::eval {

enum class PplMode { Chunks, Windows, Lines };
const char* ppl_mode_name(PplMode m);
PplMode parse_ppl_mode(const std::string& s);

struct PplOptions {
  PplMode mode = PplMode::Chunks;
  int64_t ctx = 0;          // 0: the mode's default
  bool bos_per_line = false;
  bool keep_tail = false;
  int64_t max_spans = 0;    // 0: all
  rt::KvFormat kv_dtype = rt::KvDType::F16;
  // The baseline's cache: f16, so that --kv-dtype X against the same model
  // measures the cache's own error.
  rt::KvFormat base_kv = rt::KvDType::F16;
  // Token sequences an NVFP4 cache's global scales are calibrated on (the
  // absolute maxima of each layer's keys and values); empty: the first spans.
  std::vector<std::vector<int32_t>> kv_calibration;
  int64_t position_bucket = 512;  // KL by position within the span, in buckets of this many
  // Where the forward passes run: the CPU runtime, or the device decoder
  // (runtime/device_runtime.h; f16 KV cache only). Scoring stays on the CPU.
  device::Kind device = device::Kind::Cpu;
};

struct Span {
  std::vector<int32_t> tokens;
  int64_t first_scored = 0;
  // An image-and-text record's image rows and positions (nullptr: text).
  std::shared_ptr<const rt::MultimodalInputs> mm = nullptr;
  // The same image through the baseline's own vision side, when it differs
  // from the evaluated model's (a quantized vision tower); nullptr: mm.
  std::shared_ptr<const rt::MultimodalInputs> base_mm = nullptr;
  int64_t scored() const { return static_cast<int64_t>(tokens.size()) - 1 - first_scored; }
};

int64_t default_ctx(PplMode m);

// The spans of a jsonl file of a vision-language model's records: one per
// record, {"image": PATH, "text": ...} (PATH relative to the file's folder)
// laid out by `image` and scored on the text tokens after the image (the
// first prediction is the first text token's), or {"text": ...} with BOS
// (when the vocabulary has one) scored from the first token. InvalidInput
// naming FILE:LINE for a record without text or a span longer than
// max_context (> 0); when no record scores a token.
std::vector<Span> image_text_spans(const std::filesystem::path& file, const Tokenizer& tok,
                                   const rt::ImageSequencer& image, int64_t max_context, const PplOptions& o);

// Cuts the text into spans. Spans that would score no token (a chunk of 2 or
// 3 tokens scores only its second half) are left out. Throws InvalidInput
// when no span scores a token (a text shorter than one chunk or window, a ctx
// too small for the mode) and when ctx exceeds max_context (> 0).
std::vector<Span> make_spans(const Tokenizer& tok, const std::string& text, const PplOptions& o,
                             int64_t max_context, const std::string& where);

struct EvalResult {
  std::string mode;
  int64_t ctx = 0, spans = 0, tokens_scored = 0, tokens_processed = 0;
  double nll_mean = 0, ppl = 0, ppl_stderr = 0;
  double seconds = 0;  // forward time of the evaluated model
  std::string device = "cpu";  // where the forward passes ran
  uint64_t device_bytes = 0;   // device memory the decoders need at most (0 on the CPU)
  // With a baseline:
  bool has_baseline = false;
  double base_nll_mean = 0, base_ppl = 0, ppl_delta = 0, ppl_ratio = 0;
  double kld_mean = 0, kld_p99 = 0, kld_max = 0, top1_agreement = 0;
  double base_seconds = 0;
  // KL and NLL of the scored tokens by position in their span, [from, to).
  struct Bucket {
    int64_t from = 0, to = 0, tokens = 0;
    double kld_mean = 0, kld_p99 = 0, nll_mean = 0, base_nll_mean = 0;
  };
  std::vector<Bucket> by_position;
  uint64_t kv_bytes_per_token = 0, base_kv_bytes_per_token = 0;
  // Scored positions whose logits hold a NaN or an infinity (model, baseline).
  int64_t nonfinite_tokens = 0, base_nonfinite_tokens = 0;
  // The first NaN or infinite weight of the model and of the baseline
  // (rt::find_nonfinite_weight), "" when every weight is finite or the
  // weights were not checked. Such a weight can leave every logit finite (a
  // NaN router loses every top-k comparison, so its experts are simply never
  // chosen), so finite logits alone do not make a measurement valid.
  std::string nonfinite_weight, base_nonfinite_weight;
};

// Why the numbers of `r` mean nothing, one sentence each: a non-finite
// weight in the model or the baseline, non-finite logits, a non-finite
// perplexity, KL divergence or ratio, no token scored. Empty when the
// measurement is valid. A gate never passes an invalid measurement.
std::vector<std::string> measurement_problems(const EvalResult& r);

// Scores the spans with `model` and, when given, `baseline` on the same
// tokens: KL(baseline || model) per scored token, its mean, 99th percentile
// and maximum, and how often both models' top-1 tokens agree. Non-finite
// logits are counted, and NaN propagates into the results (never clamped to
// a harmless-looking number); InvalidInput when no token is scored. With
// o.device host or cuda the model (and baseline) run on the device decoder:
// Unsupported for a KV cache other than f16, Io when the device's memory
// cannot hold both decoders (device_decoder_bytes).
EvalResult evaluate(const rt::Model& model, const rt::Model* baseline, const std::vector<Span>& spans,
                    const PplOptions& o, ThreadPool& pool, const std::function<void(int64_t, int64_t)>& progress = {});

// Bounds a CI job sets; a failed bound is reported with the measured value.
struct Gate {
  std::optional<double> max_ppl_delta, max_ppl_ratio, max_kld;
  bool any() const { return max_ppl_delta || max_ppl_ratio || max_kld; }
};
// Messages of the failed bounds (empty when the gate passes). An invalid
// measurement (measurement_problems) fails every gate. Bounds on the
// baseline comparison need a baseline (Usage error otherwise).
std::vector<std::string> check_gate(const Gate& g, const EvalResult& r);

}  // namespace qf::eval
