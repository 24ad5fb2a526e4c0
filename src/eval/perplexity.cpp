#include "eval/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>

#include "core/error.h"
#include "runtime/cpu/kernels.h"
#include "runtime/device_runtime.h"
#include "runtime/sampler.h"

namespace qf::eval {

const char* ppl_mode_name(PplMode m) {
  switch (m) {
    case PplMode::Chunks: return "chunks";
    case PplMode::Windows: return "windows";
    case PplMode::Lines: return "lines";
  }
  return "?";
}

PplMode parse_ppl_mode(const std::string& s) {
  if (s == "chunks") return PplMode::Chunks;
  if (s == "windows") return PplMode::Windows;
  if (s == "lines") return PplMode::Lines;
  throw Error(ErrorKind::Usage, "unknown --ppl-mode '" + s + "' (expected chunks, windows or lines)");
}

int64_t default_ctx(PplMode m) { return m == PplMode::Windows ? 2048 : 512; }

namespace {

std::vector<std::string> nonempty_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t b = 0;
  while (b <= text.size()) {
    size_t e = text.find('\n', b);
    if (e == std::string::npos) e = text.size();
    std::string line = text.substr(b, e - b);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) lines.push_back(std::move(line));
    b = e + 1;
  }
  return lines;
}

}  // namespace

std::vector<Span> make_spans(const Tokenizer& tok, const std::string& text, const PplOptions& o,
                             int64_t max_context, const std::string& where) {
  const int64_t ctx = o.ctx > 0 ? o.ctx : default_ctx(o.mode);
  if (ctx < 2) throw Error(ErrorKind::Usage, "--ctx must be at least 2");
  if (max_context > 0 && ctx > max_context)
    throw invalid_input(where, "context " + std::to_string(ctx) + " exceeds the model's maximum of " +
                                   std::to_string(max_context) + " positions (lower --ctx)");
  const bool bos = tok.bos_id() >= 0;
  std::vector<Span> spans;
  if (o.mode == PplMode::Lines) {
    for (const std::string& line : nonempty_lines(text)) {
      std::vector<int32_t> ids = tok.encode(line, bos);
      // Consecutive windows share one token, so every token after BOS is
      // predicted exactly once.
      for (size_t b = 0; b + 1 < ids.size(); b += static_cast<size_t>(ctx - 1))
        spans.push_back({std::vector<int32_t>(ids.begin() + static_cast<std::ptrdiff_t>(b),
                                              ids.begin() + static_cast<std::ptrdiff_t>(std::min(ids.size(), b + static_cast<size_t>(ctx)))),
                         0});
    }
  } else {
    std::vector<int32_t> ids;
    if (o.bos_per_line) {
      if (o.mode != PplMode::Windows) throw Error(ErrorKind::Usage, "--bos-per-line applies to --ppl-mode windows");
      for (const std::string& line : nonempty_lines(text)) {
        std::vector<int32_t> l = tok.encode(line, bos);
        ids.insert(ids.end(), l.begin(), l.end());
      }
    } else {
      ids = tok.encode(text, bos);
    }
    const size_t n = ids.size(), c = static_cast<size_t>(ctx);
    for (size_t b = 0; b + c <= n; b += c) {
      Span s{std::vector<int32_t>(ids.begin() + static_cast<std::ptrdiff_t>(b), ids.begin() + static_cast<std::ptrdiff_t>(b + c)),
             o.mode == PplMode::Chunks ? ctx / 2 : 0};
      if (o.mode == PplMode::Chunks && bos) s.tokens[0] = tok.bos_id();
      spans.push_back(std::move(s));
    }
    if (o.mode == PplMode::Windows && o.keep_tail && n % c >= 2)
      spans.push_back({std::vector<int32_t>(ids.end() - static_cast<std::ptrdiff_t>(n % c), ids.end()), 0});
    if (spans.empty())
      throw invalid_input(where, "the text has " + std::to_string(n) + " tokens, fewer than one " +
                                     (o.mode == PplMode::Chunks ? "chunk" : "window") + " of " + std::to_string(ctx) +
                                     " (use a longer text or a smaller --ctx)");
  }
  if (spans.empty()) throw invalid_input(where, "the text has no line with at least 2 tokens");
  // A chunk scores its second half only; with ctx 2 that is nothing.
  std::erase_if(spans, [](const Span& s) { return s.scored() <= 0; });
  if (spans.empty())
    throw invalid_input(where, "--ctx " + std::to_string(ctx) + " leaves no token to score in " + ppl_mode_name(o.mode) +
                                   " mode (chunks score the second half of each chunk; use --ctx 4 or more)");
  if (o.max_spans > 0 && static_cast<int64_t>(spans.size()) > o.max_spans) spans.resize(static_cast<size_t>(o.max_spans));
  return spans;
}

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool all_finite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}

// The logits a span scores (rows first_scored .. size-2), by the CPU runtime
// or, when `dev` is given, by the device decoder; returns the seconds taken.
// calib: the per-layer K/V maxima an NVFP4 cache's global scales come from
// (computed once per evaluation).
double run_span(const rt::Model& m, rt::DeviceDecoder* dev, const Span& s, const rt::MultimodalInputs* mm,
                const rt::KvFormat& kv, const std::vector<std::pair<float, float>>& calib, ThreadPool& pool,
                std::vector<float>& logits, uint64_t* kv_bytes_per_token) {
  if (dev && mm) throw unsupported("eval", "image-and-text records run on the CPU only (--device cpu)");
  if (dev) {
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    std::vector<uint8_t> want(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) want[static_cast<size_t>(j)] = j >= s.first_scored && j + 1 < n;
    auto t0 = std::chrono::steady_clock::now();
    dev->reset();
    dev->forward(s.tokens.data(), n, want.data(), logits);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  rt::KvCache cache = m.make_cache(kv, static_cast<int64_t>(s.tokens.size()));
  if (cache.needs_calibration()) cache.set_nvfp4_amax(calib);
  *kv_bytes_per_token = cache.bytes_per_token();
  const int32_t seq = cache.add_sequence();
  rt::Batch b;
  const int64_t n = static_cast<int64_t>(s.tokens.size());
  rt::add_sequence(b, s.tokens, seq, mm, s.first_scored, n - 1);
  auto t0 = std::chrono::steady_clock::now();
  m.forward(b, cache, logits, pool);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

EvalResult evaluate(const rt::Model& model, const rt::Model* baseline, const std::vector<Span>& spans,
                    const PplOptions& o, ThreadPool& pool, const std::function<void(int64_t, int64_t)>& progress) {
  const int64_t V = model.vocab_size();
  if (baseline && baseline->vocab_size() != V)
    throw invalid_input("--baseline", "vocabulary sizes differ: " + std::to_string(V) + " vs " +
                                          std::to_string(baseline->vocab_size()));
  EvalResult r;
  r.mode = ppl_mode_name(o.mode);
  r.ctx = o.ctx > 0 ? o.ctx : default_ctx(o.mode);
  r.spans = static_cast<int64_t>(spans.size());
  r.has_baseline = baseline != nullptr;
  r.device = device::kind_name(o.device);
  std::vector<double> nll, base_nll, kld;
  std::vector<uint8_t> top1, bad, base_bad;
  std::vector<float> logits, base_logits;
  std::unique_ptr<rt::DeviceDecoder> dev, base_dev;
  std::vector<int64_t> position;  // of each scored token in its span
  // NVFP4's global scales, calibrated once (default: on the first spans).
  std::vector<std::pair<float, float>> calib, base_calib;
  {
    std::vector<std::vector<int32_t>> samples = o.kv_calibration;
    for (size_t i = 0; o.kv_calibration.empty() && i < spans.size() && i < 4; ++i) samples.push_back(spans[i].tokens);
    auto nvfp4 = [](const rt::KvFormat& f) { return f.k == rt::KvDType::NVFP4 || f.v == rt::KvDType::NVFP4; };
    if (nvfp4(o.kv_dtype)) calib = model.kv_amax(samples, pool);
    if (baseline && nvfp4(o.base_kv)) base_calib = baseline->kv_amax(samples, pool);
  }
  if (o.device != device::Kind::Cpu) {
    const std::string where = std::string("eval --device ") + device::kind_name(o.device);
    if (o.kv_dtype != rt::KvDType::F16 || (baseline && o.base_kv != rt::KvDType::F16))
      throw unsupported(where, std::string("the device decoder keeps an f16 KV cache; --kv-dtype ") +
                                   o.kv_dtype.name() + " runs on the CPU only for now");
    int64_t longest = 1;
    for (const Span& s : spans) longest = std::max(longest, static_cast<int64_t>(s.tokens.size()));
    const uint64_t need =
        rt::device_decoder_bytes(model, longest) + (baseline ? rt::device_decoder_bytes(*baseline, longest) : 0);
    r.device_bytes = need;
    device::require_device_memory(o.device, need, where);
    dev = rt::make_device_decoder(o.device, model, longest);
    if (baseline) base_dev = rt::make_device_decoder(o.device, *baseline, longest);
  }
  for (size_t si = 0; si < spans.size(); ++si) {
    const Span& s = spans[si];
    r.seconds += run_span(model, dev.get(), s, s.mm.get(), o.kv_dtype, calib, pool, logits, &r.kv_bytes_per_token);
    if (baseline)
      r.base_seconds += run_span(*baseline, base_dev.get(), s, s.base_mm ? s.base_mm.get() : s.mm.get(), o.base_kv,
                                 base_calib, pool, base_logits, &r.base_kv_bytes_per_token);
    for (int64_t k = 0; k < s.scored(); ++k) position.push_back(s.first_scored + k);
    r.tokens_processed += static_cast<int64_t>(s.tokens.size());
    // Per scored token, independently (so any thread count gives the same
    // numbers): NLL, and against the baseline KL and top-1 agreement.
    const int64_t m = s.scored();
    const size_t base = nll.size();
    nll.resize(base + static_cast<size_t>(m));
    bad.resize(base + static_cast<size_t>(m));
    if (baseline) {
      base_bad.resize(base + static_cast<size_t>(m));
      base_nll.resize(base + static_cast<size_t>(m));
      kld.resize(base + static_cast<size_t>(m));
      top1.resize(base + static_cast<size_t>(m));
    }
    pool.parallel_for(m, 16, [&](const Chunk& c) {
      for (int64_t k = c.begin; k < c.end; ++k) {
        const size_t at = base + static_cast<size_t>(k);
        const int32_t target = s.tokens[static_cast<size_t>(s.first_scored + k + 1)];
        const float* lm = logits.data() + k * V;
        // The SIMD reductions may drop a NaN (max of NaN and x is x), so
        // finiteness is checked on the logits themselves.
        bad[at] = !all_finite(lm, V);
        const double lse = rt::logsumexp(lm, V);
        nll[at] = bad[at] ? kNaN : lse - lm[target];
        if (!baseline) continue;
        const float* lb = base_logits.data() + k * V;
        base_bad[at] = !all_finite(lb, V);
        const double blse = rt::logsumexp(lb, V);
        base_nll[at] = base_bad[at] ? kNaN : blse - lb[target];
        // Rounding can make a tiny KL negative: clamp that to 0, but keep NaN.
        const double kl = bad[at] || base_bad[at] ? kNaN : rt::kl_divergence(lb, blse, lm, lse, V);
        kld[at] = kl < 0.0 ? 0.0 : kl;
        top1[at] = !bad[at] && !base_bad[at] && rt::argmax(lm, V) == rt::argmax(lb, V);
      }
    });
    if (progress) progress(static_cast<int64_t>(si + 1), static_cast<int64_t>(spans.size()));
  }
  auto mean = [](const std::vector<double>& v) {
    double s = 0.0;
    for (double x : v) s += x;
    return v.empty() ? 0.0 : s / static_cast<double>(v.size());
  };
  r.tokens_scored = static_cast<int64_t>(nll.size());
  if (r.tokens_scored == 0) throw invalid_input("eval", "no token was scored; the perplexity would be meaningless");
  for (uint8_t b : bad) r.nonfinite_tokens += b;
  for (uint8_t b : base_bad) r.base_nonfinite_tokens += b;
  r.nll_mean = mean(nll);
  r.ppl = std::exp(r.nll_mean);
  if (nll.size() > 1) {
    double var = 0.0;
    for (double x : nll) var += (x - r.nll_mean) * (x - r.nll_mean);
    var /= static_cast<double>(nll.size() - 1);
    r.ppl_stderr = r.ppl * std::sqrt(var / static_cast<double>(nll.size()));
  }
  if (baseline) {
    r.base_nll_mean = mean(base_nll);
    r.base_ppl = std::exp(r.base_nll_mean);
    r.ppl_delta = r.ppl - r.base_ppl;
    r.ppl_ratio = r.ppl / r.base_ppl;
    r.kld_mean = mean(kld);
    std::vector<double> sorted = kld;
    if (std::any_of(sorted.begin(), sorted.end(), [](double x) { return std::isnan(x); })) {
      r.kld_max = r.kld_p99 = kNaN;  // and kld_mean is NaN already
      sorted.clear();
    }
    std::sort(sorted.begin(), sorted.end());
    if (!sorted.empty()) {
      r.kld_max = sorted.back();
      const size_t idx = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(sorted.size()))) - 1;
      r.kld_p99 = sorted[std::min(idx, sorted.size() - 1)];
    }
    // By position: the same measures over each bucket's tokens.
    const int64_t bw = std::max<int64_t>(1, o.position_bucket);
    int64_t top = 0;
    for (int64_t p : position) top = std::max(top, p);
    for (int64_t from = 0; from <= top; from += bw) {
      EvalResult::Bucket bk;
      bk.from = from, bk.to = from + bw;
      std::vector<double> ks;
      double nsum = 0, bsum = 0;
      for (size_t i = 0; i < position.size(); ++i)
        if (position[i] >= bk.from && position[i] < bk.to) ks.push_back(kld[i]), nsum += nll[i], bsum += base_nll[i];
      if (ks.empty()) continue;
      bk.tokens = static_cast<int64_t>(ks.size());
      bk.kld_mean = mean(ks);
      bk.nll_mean = nsum / static_cast<double>(ks.size());
      bk.base_nll_mean = bsum / static_cast<double>(ks.size());
      if (std::any_of(ks.begin(), ks.end(), [](double x) { return std::isnan(x); })) {
        bk.kld_p99 = kNaN;
      } else {
        std::sort(ks.begin(), ks.end());
        bk.kld_p99 = ks[std::min(ks.size() - 1, static_cast<size_t>(std::ceil(0.99 * static_cast<double>(ks.size()))) - 1)];
      }
      r.by_position.push_back(bk);
    }
    int64_t agree = 0;
    for (uint8_t a : top1) agree += a;
    r.top1_agreement = kld.empty() ? 0.0 : static_cast<double>(agree) / static_cast<double>(kld.size());
  }
  return r;
}

std::vector<std::string> measurement_problems(const EvalResult& r) {
  std::vector<std::string> p;
  auto count = [&](int64_t n, const char* who) {
    p.push_back(std::to_string(n) + " of " + std::to_string(r.tokens_scored) + " scored tokens have NaN or infinite logits in the " + who);
  };
  if (!r.nonfinite_weight.empty()) p.push_back("the evaluated model has a non-finite weight: " + r.nonfinite_weight);
  if (!r.base_nonfinite_weight.empty()) p.push_back("the baseline has a non-finite weight: " + r.base_nonfinite_weight);
  if (r.tokens_scored <= 0) p.push_back("no token was scored");
  if (r.nonfinite_tokens > 0) count(r.nonfinite_tokens, "evaluated model");
  if (r.base_nonfinite_tokens > 0) count(r.base_nonfinite_tokens, "baseline");
  auto finite = [&](double v, const char* what) {
    if (!std::isfinite(v)) p.push_back(std::string(what) + " is " + (std::isnan(v) ? "nan" : "infinite"));
  };
  finite(r.nll_mean, "the mean NLL");
  finite(r.ppl, "the perplexity");
  if (r.has_baseline) {
    finite(r.base_ppl, "the baseline perplexity");
    finite(r.ppl_ratio, "the perplexity ratio");
    finite(r.kld_mean, "the mean KL divergence");
  }
  return p;
}

std::vector<std::string> check_gate(const Gate& g, const EvalResult& r) {
  if (g.any() && !r.has_baseline)
    throw Error(ErrorKind::Usage, "--max-ppl-delta, --max-ppl-ratio and --max-kld need --baseline");
  std::vector<std::string> fails;
  if (!g.any()) return fails;
  const std::vector<std::string> problems = measurement_problems(r);
  if (!problems.empty()) {
    std::string msg = "the measurement is not valid, so no bound can pass: ";
    for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    fails.push_back(msg);
    return fails;
  }
  char buf[256];
  if (g.max_ppl_delta && r.ppl_delta > *g.max_ppl_delta) {
    std::snprintf(buf, sizeof buf, "perplexity delta %.4f exceeds --max-ppl-delta %.4f by %.4f", r.ppl_delta,
                  *g.max_ppl_delta, r.ppl_delta - *g.max_ppl_delta);
    fails.push_back(buf);
  }
  if (g.max_ppl_ratio && r.ppl_ratio > *g.max_ppl_ratio) {
    std::snprintf(buf, sizeof buf, "perplexity ratio %.5f exceeds --max-ppl-ratio %.5f by %.5f", r.ppl_ratio,
                  *g.max_ppl_ratio, r.ppl_ratio - *g.max_ppl_ratio);
    fails.push_back(buf);
  }
  if (g.max_kld && r.kld_mean > *g.max_kld) {
    std::snprintf(buf, sizeof buf, "mean KL divergence %.6f exceeds --max-kld %.6f by %.6f", r.kld_mean, *g.max_kld,
                  r.kld_mean - *g.max_kld);
    fails.push_back(buf);
  }
  return fails;
}

}  // namespace qf::eval
