#include "eval/kv_sweep.h"

#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "eval/bench.h"
#include "eval/eval_run.h"

namespace qf::eval {

KvSweepResult kv_sweep(const rt::Model& model, const std::vector<Span>& spans, const KvSweepOptions& o,
                       ThreadPool& pool, const std::function<void(int64_t, int64_t)>& progress) {
  const std::vector<rt::KvFormat> formats =
      o.formats.empty() ? rt::kv_sweep_formats(model.config().num_hidden_layers) : o.formats;
  if (o.max_kld && !(*o.max_kld >= 0 && std::isfinite(*o.max_kld)))
    throw Error(ErrorKind::Usage, "--max-kld must be a finite number >= 0");
  KvSweepResult r;
  int64_t ctx = 0;
  for (const Span& s : spans) ctx = std::max<int64_t>(ctx, static_cast<int64_t>(s.tokens.size()));
  r.head_dim = model.config().head_dim;
  for (size_t i = 0; i < formats.size(); ++i) {
    KvSweepRow row;
    row.format = formats[i];
    try {
      const rt::KvCache c = model.make_cache(formats[i], 64);
      row.bytes_per_token = c.bytes_per_token();
      row.bytes_per_sequence = c.bytes_per_sequence();
    } catch (const Error& e) {  // a format this model cannot hold is reported, not measured
      if (e.kind() != ErrorKind::Usage && e.kind() != ErrorKind::Unsupported) throw;
      r.skipped.push_back({formats[i].name(), e.what()});
      if (progress) progress(static_cast<int64_t>(i + 1), static_cast<int64_t>(formats.size()));
      continue;
    }
    PplOptions p = o.ppl;
    p.kv_dtype = formats[i];
    p.base_kv = rt::KvDType::F16;
    row.eval = evaluate(model, &model, spans, p, pool);
    const std::vector<std::string> bad = measurement_problems(row.eval);
    for (const std::string& b : bad) r.problems.push_back(formats[i].name() + ": " + b);
    row.tokens_per_gib = 1024.0 * 1024.0 * 1024.0 / static_cast<double>(row.bytes_per_token);
    if (o.decode_tokens > 0 && ctx > o.decode_tokens) {
      BenchOptions b;
      b.prompt = ctx - o.decode_tokens, b.gen = o.decode_tokens, b.kv_dtype = formats[i];
      const BenchResult br = run_bench(model, b, pool);
      row.decode_tokens_per_s = br.decode_tokens_per_s;
      row.prefill_tokens_per_s = br.prefill_tokens_per_s;
    }
    r.rows.push_back(std::move(row));
    if (progress) progress(static_cast<int64_t>(i + 1), static_cast<int64_t>(formats.size()));
  }
  r.f16_bytes_per_token = model.make_cache(rt::KvDType::F16, 64).bytes_per_token();
  if (o.max_kld) {
    for (size_t i = 0; i < r.rows.size(); ++i) {
      const KvSweepRow& x = r.rows[i];
      if (!measurement_problems(x.eval).empty() || !(x.eval.kld_mean <= *o.max_kld)) continue;
      if (r.best < 0) {
        r.best = static_cast<int>(i);
        continue;
      }
      const KvSweepRow& b = r.rows[static_cast<size_t>(r.best)];
      if (x.bytes_per_token < b.bytes_per_token ||
          (x.bytes_per_token == b.bytes_per_token && x.eval.kld_mean < b.eval.kld_mean))
        r.best = static_cast<int>(i);
    }
  }
  return r;
}

namespace {
nlohmann::ordered_json num(double v) { return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(); }
}  // namespace

nlohmann::ordered_json kv_sweep_report(const std::string& model_arg, const std::string& text, const KvSweepOptions& o,
                                       const KvSweepResult& r) {
  using json = nlohmann::ordered_json;
  json rows = json::array();
  for (const KvSweepRow& x : r.rows) {
    json by_pos = json::array();
    for (const EvalResult::Bucket& b : x.eval.by_position)
      by_pos.push_back({{"from", b.from}, {"to", b.to}, {"kld_mean", num(b.kld_mean)}, {"kld_p99", num(b.kld_p99)}});
    rows.push_back({{"kv_dtype", x.format.name()},
                    {"k", rt::kv_dtype_name(x.format.k)},
                    {"v", rt::kv_dtype_name(x.format.v)},
                    {"kv_bytes_per_token", x.bytes_per_token},
                    {"kv_bytes_per_sequence", x.bytes_per_sequence},
                    {"tokens_per_gib", x.tokens_per_gib},
                    {"ppl", num(x.eval.ppl)},
                    {"kld", {{"mean", num(x.eval.kld_mean)}, {"p99", num(x.eval.kld_p99)}, {"max", num(x.eval.kld_max)}}},
                    {"top1_agreement", num(x.eval.top1_agreement)},
                    {"kld_by_position", by_pos},
                    {"decode_tokens_per_s", x.decode_tokens_per_s},
                    {"prefill_tokens_per_s", x.prefill_tokens_per_s},
                    {"valid", measurement_problems(x.eval).empty()},
                    {"vllm", x.format.vllm_flag()},
                    {"llama_cpp", x.format.llama_cpp_flags(r.head_dim)}});
  }
  if (r.rows.empty()) throw invalid_input(model_arg, "kv-sweep: this model can hold none of the formats asked for");
  const EvalResult& first = r.rows.front().eval;
  json j = {{"kv_sweep", true},
            {"model", model_arg},
            {"text", text},
            {"mode", first.mode},
            {"ctx", first.ctx},
            {"spans", first.spans},
            {"tokens_scored", first.tokens_scored},
            {"baseline", {{"model", model_arg}, {"kv_dtype", "f16"}, {"ppl", num(first.base_ppl)}}},
            {"f16_bytes_per_token", r.f16_bytes_per_token},
            {"rows", rows}};
  if (o.max_kld) {
    j["max_kld"] = *o.max_kld;
    j["best"] = r.best >= 0 ? json(r.rows[static_cast<size_t>(r.best)].format.name()) : json();
  }
  j["problems"] = r.problems;
  json skipped = json::array();
  for (const auto& [name, why] : r.skipped) skipped.push_back({{"kv_dtype", name}, {"why", why}});
  j["skipped"] = skipped;
  return j;
}

std::string kv_sweep_table(const KvSweepResult& r, const KvSweepOptions& o) {
  std::string s;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%-30s %9s %12s %11s %11s %10s %10s\n", "kv cache", "B/token", "tokens/GiB",
                "KLD mean", "KLD p99", "ppl", "decode t/s");
  s += buf;
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const KvSweepRow& x = r.rows[i];
    std::snprintf(buf, sizeof buf, "%-30s %9llu %12.0f %11.6f %11.6f %10.4f %10.1f%s\n", x.format.name().c_str(),
                  static_cast<unsigned long long>(x.bytes_per_token), x.tokens_per_gib, x.eval.kld_mean,
                  x.eval.kld_p99, x.eval.ppl, x.decode_tokens_per_s, static_cast<int>(i) == r.best ? "  <- smallest within the bound" : "");
    s += buf;
  }
  for (const auto& [name, why] : r.skipped) s += "skipped " + name + ": " + why + "\n";
  if (o.max_kld) {
    if (r.best < 0) {
      std::snprintf(buf, sizeof buf, "no format keeps the mean KL divergence within %g\n", *o.max_kld);
      s += buf;
    } else {
      const KvSweepRow& b = r.rows[static_cast<size_t>(r.best)];
      std::snprintf(buf, sizeof buf, "smallest within mean KLD %g: %s, %llu bytes per token\n", *o.max_kld,
                    b.format.name().c_str(), static_cast<unsigned long long>(b.bytes_per_token));
      s += buf;
      s += "  vLLM:      " + (b.format.vllm_flag().empty() ? std::string("(no such cache)") : b.format.vllm_flag()) + "\n";
      const std::string lc = b.format.llama_cpp_flags(r.head_dim);
      s += "  llama.cpp: " + (lc.empty() ? std::string("(no such cache)") : lc) + "\n";
    }
  }
  return s;
}

}  // namespace qf::eval
