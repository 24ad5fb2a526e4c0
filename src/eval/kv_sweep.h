// The KV-cache sweep: every cache format on one model and text, each scored
// against the same model with an f16 cache (so the numbers are the cache's
// own error), with its bytes per token, the tokens a GiB holds, and its
// decode speed at long context; and the smallest format within a KL bound,
// with the engine flags that select it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/thread_pool.h"
#include "eval/perplexity.h"
#include "runtime/kv_format.h"
#include "runtime/model.h"

namespace qf::eval {

struct KvSweepOptions {
  PplOptions ppl;                   // the spans' convention; kv_dtype is set per format
  std::vector<rt::KvFormat> formats;  // empty: rt::kv_sweep_formats(the model's layers)
  std::optional<double> max_kld;    // the bound the answer must meet (mean KL)
  int64_t decode_tokens = 32;       // decode timing: this many tokens after a prompt of ctx - decode_tokens
};

struct KvSweepRow {
  rt::KvFormat format;
  uint64_t bytes_per_token = 0, bytes_per_sequence = 0;
  double tokens_per_gib = 0;        // 2^30 / bytes_per_token (per-sequence windows aside)
  EvalResult eval;                  // against the same model with an f16 cache
  double decode_tokens_per_s = 0;   // at long context; 0 when not measured
  double prefill_tokens_per_s = 0;
};

struct KvSweepResult {
  std::vector<KvSweepRow> rows;
  int best = -1;                    // the smallest bytes per token within max_kld (-1: none or no bound)
  std::vector<std::string> problems;  // formats whose measurement is not valid, one sentence each
  uint64_t f16_bytes_per_token = 0;   // the reference cache's
  int64_t head_dim = 0;
  // Formats this model cannot hold (head size, query heads per KV head),
  // each with the reason; the others are measured.
  std::vector<std::pair<std::string, std::string>> skipped;
};

KvSweepResult kv_sweep(const rt::Model& model, const std::vector<Span>& spans, const KvSweepOptions& o,
                       ThreadPool& pool, const std::function<void(int64_t, int64_t)>& progress = {});

// The JSON `kv-sweep --json` writes (and `quantforge report` charts).
nlohmann::ordered_json kv_sweep_report(const std::string& model_arg, const std::string& text,
                                       const KvSweepOptions& o, const KvSweepResult& r);

// The table `kv-sweep` prints.
std::string kv_sweep_table(const KvSweepResult& r, const KvSweepOptions& o);

}  // namespace qf::eval
