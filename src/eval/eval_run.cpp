#include "eval/eval_run.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "checkpoint/lora_merge.h"
#include "core/error.h"
#include "core/text_input.h"
#include "formats/tokenizer/tokenizer.h"
#include "runtime/cpu/kernels.h"
#include "runtime/finite_weights.h"
#include "runtime/model.h"

namespace qf::eval {

namespace {

using json = nlohmann::ordered_json;

// JSON has no NaN or infinity (nlohmann writes them as null, silently): write
// null on purpose, so that the report in memory is the one on disk; the
// report's "problems" say which number was not finite and why.
json number(double v) { return std::isfinite(v) ? json(v) : json(); }

json lora_report(const rt::LoraLoad& l) {
  const char* mode = l.mode == rt::LoraLoad::Mode::Merge ? "merge" : l.mode == rt::LoraLoad::Mode::Forward ? "forward" : "auto";
  return {{"adapters", lora_provenance(l.adapters)}, {"mode", mode}};
}

}  // namespace

json eval_report(const EvalRequest& o, const EvalResult& r, const std::vector<std::string>& fails) {
  json j = {{"model", o.model},
            {"text", o.text},
            {"mode", r.mode},
            {"ctx", r.ctx},
            {"spans", r.spans},
            {"tokens_scored", r.tokens_scored},
            {"tokens_processed", r.tokens_processed},
            {"nll", number(r.nll_mean)},
            {"ppl", number(r.ppl)},
            {"ppl_stderr", number(r.ppl_stderr)},
            {"seconds", number(r.seconds)},
            {"tokens_per_s", number(r.seconds > 0 ? static_cast<double>(r.tokens_processed) / r.seconds : 0.0)},
            {"kv_dtype", o.kv_format().name()},
            {"kv_bytes_per_token", r.kv_bytes_per_token},
            {"device", r.device},
            {"device_bytes", r.device_bytes},
            {"simd", rt::simd_level_name(rt::simd_level())}};
  if (!o.lora.empty()) j["lora"] = lora_report(o.lora);
  const std::vector<std::string> problems = measurement_problems(r);
  j["valid"] = problems.empty();
  j["problems"] = problems;
  j["nonfinite_tokens"] = r.nonfinite_tokens;
  if (r.has_baseline) {
    j["baseline"] = {{"model", o.baseline},
                     {"nll", number(r.base_nll_mean)},
                     {"ppl", number(r.base_ppl)},
                     {"seconds", number(r.base_seconds)},
                     {"nonfinite_tokens", r.base_nonfinite_tokens}};
    j["ppl_delta"] = number(r.ppl_delta);
    j["ppl_ratio"] = number(r.ppl_ratio);
    j["kld"] = {{"mean", number(r.kld_mean)}, {"p99", number(r.kld_p99)}, {"max", number(r.kld_max)}};
    j["top1_agreement"] = number(r.top1_agreement);
    j["baseline"]["kv_dtype"] = rt::parse_kv_format(o.baseline_kv).name();
    if (!o.baseline_lora.empty()) j["baseline"]["lora"] = lora_report(o.baseline_lora);
    json buckets = json::array();
    for (const EvalResult::Bucket& b : r.by_position)
      buckets.push_back({{"from", b.from},
                         {"to", b.to},
                         {"tokens", b.tokens},
                         {"kld_mean", number(b.kld_mean)},
                         {"kld_p99", number(b.kld_p99)},
                         {"ppl", number(std::exp(b.nll_mean))},
                         {"base_ppl", number(std::exp(b.base_nll_mean))}});
    j["kld_by_position"] = buckets;
  }
  json gate = json::object();
  if (o.gate.max_ppl_delta) gate["max_ppl_delta"] = *o.gate.max_ppl_delta;
  if (o.gate.max_ppl_ratio) gate["max_ppl_ratio"] = *o.gate.max_ppl_ratio;
  if (o.gate.max_kld) gate["max_kld"] = *o.gate.max_kld;
  if (!gate.empty()) {
    gate["passed"] = fails.empty();
    gate["failures"] = fails;
    j["gate"] = gate;
  }
  return j;
}

std::optional<double> report_number(const json& report, std::initializer_list<const char*> keys) {
  const json* at = &report;
  for (const char* k : keys) {
    if (!at->is_object()) return std::nullopt;
    const auto it = at->find(k);
    if (it == at->end()) return std::nullopt;
    at = &*it;
  }
  if (!at->is_number()) return std::nullopt;
  return at->get<double>();
}

EvalRun run_eval(const EvalRequest& req, ThreadPool& pool, const std::function<void(int64_t, int64_t)>& progress) {
  if (req.gate.any() && req.baseline.empty())
    throw Error(ErrorKind::Usage, "--max-ppl-delta, --max-ppl-ratio and --max-kld need --baseline");
  PplOptions p = req.ppl;
  p.kv_dtype = req.kv_format();
  p.base_kv = rt::parse_kv_format(req.baseline_kv);
  p.device = device::resolve(req.device, "eval --device " + req.device);
  const std::string text = read_text_input(req.text);
  std::unique_ptr<rt::Model> model = rt::load_model(req.model, p.device, req.lora);
  std::unique_ptr<Tokenizer> tok = load_tokenizer(model->source());
  std::unique_ptr<rt::Model> base;
  // The cache against f16 on the same weights.
  const bool same = !req.baseline.empty() && req.baseline == req.model && req.lora.empty() && req.baseline_lora.empty();
  if (!req.baseline.empty() && !same) {
    base = rt::load_model(req.baseline, p.device, req.baseline_lora);
    std::unique_ptr<Tokenizer> btok = load_tokenizer(base->source());
    if (btok->vocab().tokens != tok->vocab().tokens)
      throw invalid_input(req.baseline, "its tokenizer differs from the evaluated model's; a baseline must share the vocabulary");
  }
  int64_t max_ctx = model->max_context();
  if (base && base->max_context() > 0) max_ctx = max_ctx > 0 ? std::min(max_ctx, base->max_context()) : base->max_context();
  // A vision-language model's image-and-text records: KL and perplexity
  // over the text given the image.
  const bool images = rt::jsonl_names_images(req.text);
  if (images && !model->config().vlm)
    throw invalid_input(req.text, "the records name images, but " + req.model + " is not a vision-language model");
  const std::optional<int32_t> bos = tok->bos_id() >= 0 ? std::optional<int32_t>(tok->bos_id()) : std::nullopt;
  std::vector<Span> spans = images ? image_text_spans(req.text, *tok, rt::make_image_sequencer(*model, model->source(), bos),
                                                      max_ctx, p)
                                   : make_spans(*tok, text, p, max_ctx, req.text);
  if (images && base) {
    // The baseline sees each image through its own vision side: a quantized
    // vision tower's rows are part of what is measured.
    const std::vector<Span> base_spans =
        image_text_spans(req.text, *tok, rt::make_image_sequencer(*base, base->source(), bos), max_ctx, p);
    for (size_t i = 0; i < spans.size(); ++i) {
      if (base_spans[i].tokens != spans[i].tokens)
        throw invalid_input(req.baseline, "the baseline lays out record " + std::to_string(i + 1) +
                                              "'s image in a different number of tokens than " + req.model +
                                              " (its vision config differs)");
      spans[i].base_mm = base_spans[i].mm;
    }
  }
  if (!req.kv_calibration.empty()) {
    PplOptions cp = p;
    cp.max_spans = 4;
    for (const Span& s : make_spans(*tok, read_text_input(req.kv_calibration), cp, max_ctx, req.kv_calibration))
      p.kv_calibration.push_back(s.tokens);
  }
  EvalRun run;
  const rt::Model* reference = same ? model.get() : base.get();
  run.result = evaluate(*model, reference, spans, p, pool, progress);
  if (images) run.result.mode = "image-text records";
  run.result.nonfinite_weight = rt::find_nonfinite_weight(*model, pool);
  if (reference) run.result.base_nonfinite_weight = same ? run.result.nonfinite_weight : rt::find_nonfinite_weight(*base, pool);
  run.failures = check_gate(req.gate, run.result);
  run.report = eval_report(req, run.result, run.failures);
  return run;
}

}  // namespace qf::eval
