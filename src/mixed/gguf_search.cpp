#include "mixed/gguf_search.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <set>

#include "calibration/imatrix_collect.h"
#include "checkpoint/lora_merge.h"
#include "convert/hf_to_gguf.h"
#include "core/error.h"
#include "core/io.h"
#include "core/text_input.h"
#include "formats/gguf/gguf.h"
#include "formats/gguf/imatrix.h"
#include "formats/hf/model_config.h"
#include "formats/safetensors.h"
#include "formats/tokenizer/tokenizer.h"
#include "mixed/gguf_linears.h"
#include "mixed/gguf_search_internal.h"
#include "eval/probe_kl.h"
#include "quantizers/gguf_mix.h"
#include "quantizers/kquants.h"
#include "quantizers/mix_knapsack.h"
#include "runtime/linear.h"

namespace qf::mixed {
namespace gt = ggml_type;
using detail::allocate;
using detail::budget_of;
using detail::check_budget;
using detail::kComputedFrom;
using detail::read_or_compute_imatrix;
namespace {

using Clock = std::chrono::steady_clock;
using detail::seconds_since;

uint64_t padded(uint64_t bytes) { return (bytes + kGgufDefaultAlignment - 1) / kGgufDefaultAlignment * kGgufDefaultAlignment; }

uint64_t tensor_bytes(uint32_t type, const std::vector<int64_t>& ne) {
  uint64_t rows = 1;
  for (size_t i = 1; i < ne.size(); ++i) rows *= static_cast<uint64_t>(ne[i]);
  return padded(kquants::row_size(type, ne[0]) * rows);
}

double bits_of(uint32_t type) {
  const GgmlTypeInfo* i = ggml_type_info(type);
  return 8.0 * i->type_size / i->block_size;
}

// The tensor's predicted KL divergence at weighted error `e`.
double predicted_kl(const GgufMixTensor& t, double e) { return e > 0 ? t.scale * std::pow(e, t.power) : 0; }

// The importance-weighted squared error of `type` on a row sample of every
// slab of the tensor, scaled to all rows.
double weighted_error(const TensorLinears& tl, const std::vector<float>& importance, uint32_t type, int64_t max_rows) {
  double total = 0;
  const size_t slabs = tl.embedding ? 1 : tl.slots.size();
  for (size_t e = 0; e < slabs; ++e) {
    const rt::Linear& l = **tl.slots[e];
    const int64_t rows = l.out_features(), cols = l.in_features();
    const int64_t stride = std::max<int64_t>(1, (rows + max_rows - 1) / max_rows);
    std::vector<float> x, y(static_cast<size_t>(cols));
    int64_t n = 0;
    for (int64_t r = 0; r < rows; r += stride, ++n) {
      x.resize(static_cast<size_t>((n + 1) * cols));
      l.decode_row(r, x.data() + n * cols);
    }
    const float* imp = importance.empty() ? nullptr : importance.data() + static_cast<int64_t>(e) * cols;
    const size_t rb = kquants::row_size(type, cols);
    std::vector<uint8_t> q(rb * static_cast<size_t>(n));
    kquants::quantize_rows(type, x.data(), q.data(), n, cols, imp);
    double err = 0;
    for (int64_t r = 0; r < n; ++r) {
      kquants::dequantize_row(type, q.data() + rb * static_cast<size_t>(r), y.data(), cols);
      const float* a = x.data() + r * cols;
      for (int64_t j = 0; j < cols; ++j) {
        const double d = static_cast<double>(a[j]) - y[static_cast<size_t>(j)];
        err += (imp ? imp[j] : 1.0) * d * d;
      }
    }
    total += err * static_cast<double>(rows) / static_cast<double>(n);
  }
  return total;
}

// The model with the tensor (every slab) stored as `type`, all rows.
rt::Model with_tensor_as(const rt::Model& base, const std::string& name, uint32_t type, const std::vector<float>& importance) {
  rt::Model m = base;
  const TensorLinears tl = tensor_linears(m, name);
  const size_t slabs = tl.embedding ? 1 : tl.slots.size();
  std::shared_ptr<rt::Linear> first;
  for (size_t e = 0; e < slabs; ++e) {
    const rt::Linear& l = **tl.slots[e];
    const int64_t rows = l.out_features(), cols = l.in_features();
    const std::vector<float> w = l.decode_all();
    const size_t rb = kquants::row_size(type, cols);
    auto data = std::make_shared<std::vector<uint8_t>>(rb * static_cast<size_t>(rows));
    const float* imp = importance.empty() ? nullptr : importance.data() + static_cast<int64_t>(e) * cols;
    kquants::quantize_rows(type, w.data(), data->data(), rows, cols, imp);
    const std::optional<Tensor> bias = rt::bias_tensor(l.bias_values());
    std::shared_ptr<rt::Linear> q = rt::make_block_linear(type, data->data(), rows, cols, data, bias ? &*bias : nullptr, name);
    *tl.slots[e] = q;
    if (!first) first = q;
  }
  if (tl.embedding)  // tied: the head is the same matrix
    for (size_t e = 1; e < tl.slots.size(); ++e) *tl.slots[e] = first;
  return m;
}


}  // namespace

const std::vector<uint32_t>& default_gguf_menu() {
  static const std::vector<uint32_t> menu = {gt::F16,  gt::BF16, gt::Q8_0, gt::Q6_K, gt::Q5_K, gt::Q5_1,
                                             gt::Q5_0, gt::Q4_K, gt::Q4_1, gt::Q4_0, gt::Q3_K, gt::Q2_K};
  return menu;
}

std::vector<uint32_t> parse_gguf_menu(const std::string& list, const std::string& flag) {
  std::vector<uint32_t> out;
  std::string cur;
  const auto flush = [&] {
    if (cur.empty()) return;
    const uint32_t t = gguf_mix::parse_tensor_type(cur, flag);
    if (t == gt::F32) throw Error(ErrorKind::Usage, flag + ": f32 is not offered (f16 holds an f16 or bf16 model's weights exactly)");
    if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
    cur.clear();
  };
  for (char ch : list) {
    if (ch == ',' || ch == ' ') flush();
    else cur += ch;
  }
  flush();
  if (out.empty()) throw Error(ErrorKind::Usage, flag + ": no type given");
  return out;
}

std::map<std::string, uint32_t> GgufMixPlan::types() const {
  std::map<std::string, uint32_t> m;
  for (const GgufMixTensor& t : tensors)
    if (t.searched) m[t.name] = t.candidates[static_cast<size_t>(t.chosen)].type;
  return m;
}

std::string GgufMixPlan::file_type_preset() const {
  std::map<uint32_t, uint64_t> by_type;
  for (const GgufMixTensor& t : tensors)
    if (t.searched) by_type[t.candidates[static_cast<size_t>(t.chosen)].type] += t.parameters;
  uint32_t top = gt::F16;
  uint64_t most = 0;
  for (const auto& [type, n] : by_type)
    if (n > most) most = n, top = type;
  std::string first;
  for (const gguf_mix::Preset& p : gguf_mix::presets()) {
    if (p.base_type != top) continue;
    if (p.name.size() > 2 && p.name.compare(p.name.size() - 2, 2, "_M") == 0) return p.name;
    if (first.empty()) first = p.name;
  }
  return first.empty() ? "F16" : first;
}

GgufMixPlan plan_gguf_mix(const std::filesystem::path& dir, const GgufMixOptions& opts, ThreadPool& pool) {
  const std::string where = dir.string();
  if (opts.calib_text.empty())
    throw Error(ErrorKind::Usage, "a size budget needs --calib TEXT: the text each tensor's sensitivity is measured on");
  const std::string text = read_text_input(opts.calib_text);
  const std::vector<uint32_t> menu = opts.types.empty() ? default_gguf_menu() : opts.types;
  const auto phase = [&](const std::string& what, int64_t done, int64_t total) {
    if (opts.progress) opts.progress(what, done, total);
  };

  ModelConfig c = load_model_config(dir);
  if (c.quantization_config) throw unsupported(where, "the checkpoint is already quantized (config.json has a quantization_config)");
  Checkpoint ck = open_checkpoint_with_loras(dir, opts.loras);
  const GgufLayout layout = gguf_layout(c, ck, where);
  const gguf_mix::ModelDesc md{gguf_arch(c, where), c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
                               c.num_experts};
  GgufMixPlan plan;
  plan.model = where;
  // The tensors in processing order; the presets' plans give the fixed ones' types.
  std::vector<gguf_mix::TensorDesc> descs = layout.descs;
  std::stable_sort(descs.begin(), descs.end(), [](const auto& a, const auto& b) { return gguf_mix::weight_name_less(a.name, b.name); });
  const std::vector<gguf_mix::TensorPlan> base_plan = gguf_mix::plan(gguf_mix::parse_preset("Q4_K_M"), md, descs, true);
  if (c.rope_scaling && c.rope_scaling->type == "llama3") plan.fixed_extra_bytes = padded(static_cast<uint64_t>(c.head_dim / 2) * 4);
  // Every type any tensor's error is needed for: the menu, and the presets' types.
  std::vector<std::vector<uint32_t>> preset_types;
  std::vector<std::string> preset_names;
  for (const gguf_mix::Preset& p : gguf_mix::presets()) {
    if (!ggml_type_info(p.base_type) || ggml_type_info(p.base_type)->block_size == 1) continue;
    std::vector<uint32_t> types;
    for (const gguf_mix::TensorPlan& tp : gguf_mix::plan(p, md, descs, true)) types.push_back(tp.type);
    preset_types.push_back(std::move(types));
    preset_names.push_back(p.name);
  }
  std::vector<std::map<uint32_t, double>> errors(descs.size());  // per tensor: type -> error
  std::vector<std::vector<float>> importance(descs.size());
  struct Job {
    size_t tensor;
    uint32_t type;
  };
  std::vector<Job> jobs;
  for (size_t i = 0; i < descs.size(); ++i) {
    const gguf_mix::TensorDesc& d = descs[i];
    GgufMixTensor t;
    t.name = d.name;
    t.parameters = detail::elements(d.ne);
    plan.parameters += t.parameters;
    t.searched = gguf_mix::allows_quantization(d);
    if (!t.searched) {
      const uint32_t type = base_plan[i].type;
      t.candidates.push_back({type, tensor_bytes(type, d.ne), 0, 0});
      plan.tensors.push_back(std::move(t));
      continue;
    }
    std::set<uint32_t> need;
    for (uint32_t m : menu) {
      std::string note;
      const uint32_t type = gguf_mix::shape_fallback(d, m, note);
      if (std::none_of(t.candidates.begin(), t.candidates.end(), [&](const GgufCandidate& x) { return x.type == type; }))
        t.candidates.push_back({type, tensor_bytes(type, d.ne), 0, 0});
      need.insert(type);
    }
    for (const auto& pt : preset_types) need.insert(pt[i]);
    for (uint32_t type : need) jobs.push_back({i, type});
    plan.tensors.push_back(std::move(t));
  }

  // The budget, checked before anything is computed.
  check_budget(plan, budget_of(plan, opts));
  std::unique_ptr<rt::Model> model = rt::load_hf_model(dir, std::nullopt, rt::LoraLoad{opts.loras, rt::LoraLoad::Mode::Merge});
  std::unique_ptr<Tokenizer> tok = load_tokenizer(dir);

  auto t0 = Clock::now();
  plan.imatrix_data = std::make_shared<Imatrix>(read_or_compute_imatrix(*model, *tok, text, opts, pool));
  const Imatrix& imatrix = *plan.imatrix_data;
  plan.imatrix = opts.imatrix.empty() ? kComputedFrom + opts.calib_text.string() : opts.imatrix.string();
  plan.seconds_imatrix = seconds_since(t0);

  // Each tensor's Linears and importance (none for the embedding, whose rows
  // are looked up, not multiplied).
  std::vector<TensorLinears> linears(descs.size());
  for (size_t i = 0; i < descs.size(); ++i) {
    if (!plan.tensors[i].searched) continue;
    linears[i] = tensor_linears(*model, descs[i].name);
    if (linears[i].embedding) continue;
    if (!imatrix.entries.count(descs[i].name) && opts.note)
      opts.note(descs[i].name + ": no importance data in the imatrix; its errors are unweighted");
    importance[i] = imatrix.importance(descs[i].name);
  }
  // Errors of every (tensor, type), in parallel over the pairs.
  t0 = Clock::now();
  std::vector<double> job_error(jobs.size());
  pool.parallel_for(static_cast<int64_t>(jobs.size()), 1, [&](const Chunk& ch) {
    for (int64_t j = ch.begin; j < ch.end; ++j) {
      const Job& job = jobs[static_cast<size_t>(j)];
      job_error[static_cast<size_t>(j)] = weighted_error(linears[job.tensor], importance[job.tensor], job.type, opts.max_sample_rows);
    }
  });
  for (size_t j = 0; j < jobs.size(); ++j) errors[jobs[j].tensor][jobs[j].type] = job_error[j];
  plan.seconds_errors = seconds_since(t0);

  // Probes: the measured KL with only this tensor quantized, at the lowest
  // type and at the type nearest 4.5 bits.
  t0 = Clock::now();
  eval::PplOptions po;
  po.mode = eval::PplMode::Windows;
  po.ctx = opts.ctx;
  po.max_spans = opts.probe_spans;
  eval::ProbeRunner runner(*model, eval::make_spans(*tok, text, po, model->max_context(), opts.calib_text.string()), pool);
  plan.probe_tokens = runner.tokens_scored();
  // Which tensors are probed: all, or per role a few layers evenly spread.
  std::map<std::string, std::vector<size_t>> by_role;  // role -> tensors in layer order
  int64_t n_searched = 0;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    if (!plan.tensors[i].searched) continue;
    ++n_searched;
    const std::string& name = plan.tensors[i].name;
    const bool in_block = name.rfind("blk.", 0) == 0;
    by_role[in_block ? name.substr(name.find('.', 4) + 1) : name].push_back(i);
  }
  std::vector<bool> probed(plan.tensors.size(), false);
  if (opts.max_probes <= 0 || n_searched <= opts.max_probes) {
    for (size_t i = 0; i < plan.tensors.size(); ++i) probed[i] = plan.tensors[i].searched;
  } else {
    const int64_t per_role = std::max<int64_t>(2, opts.max_probes / static_cast<int64_t>(by_role.size()));
    for (const auto& [role, ts] : by_role) {
      const auto n = static_cast<int64_t>(ts.size());
      if (n <= per_role) {
        for (size_t i : ts) probed[i] = true;
        continue;
      }
      for (int64_t k = 0; k < per_role; ++k) probed[ts[static_cast<size_t>(k * (n - 1) / (per_role - 1))]] = true;
    }
  }
  int64_t n_probed = 0, done = 0;
  for (bool b : probed) n_probed += b;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    GgufMixTensor& t = plan.tensors[i];
    if (!probed[i]) continue;
    std::vector<uint32_t> quantized;
    for (const GgufCandidate& cd : t.candidates)
      if (ggml_type_info(cd.type)->block_size > 1) quantized.push_back(cd.type);
    if (quantized.empty()) quantized.push_back(t.candidates.front().type);  // a float-only menu: nothing to fit
    const uint32_t low = *std::min_element(quantized.begin(), quantized.end(), [](uint32_t a, uint32_t b) { return bits_of(a) < bits_of(b); });
    const uint32_t mid = *std::min_element(quantized.begin(), quantized.end(), [](uint32_t a, uint32_t b) {
      return std::abs(bits_of(a) - 4.5) < std::abs(bits_of(b) - 4.5);
    });
    for (uint32_t type : mid == low ? std::vector<uint32_t>{mid} : std::vector<uint32_t>{mid, low}) {
      GgufMixTensor::Probe p;
      p.type = type;
      p.error = errors[i][type];
      p.measured_kl = runner.kl(with_tensor_as(*model, t.name, type, importance[i]), linears[i].first_layer);
      if (!std::isfinite(p.measured_kl))
        throw invalid_input(where, t.name + " stored as " + ggml_type_info(type)->name +
                                       " gives a non-finite KL divergence on the probe text; its sensitivity cannot be measured");
      t.probes.push_back(p);
    }
    // KL = scale * error^power through the probes (power 1 with one probe).
    const double floor_kl = 1e-12;
    const GgufMixTensor::Probe& a = t.probes.front();
    if (t.probes.size() == 2 && t.probes[1].error > a.error * 1.0001 && a.error > 0) {
      const GgufMixTensor::Probe& b = t.probes[1];
      const double p = std::log(std::max(b.measured_kl, floor_kl) / std::max(a.measured_kl, floor_kl)) / std::log(b.error / a.error);
      t.power = std::clamp(p, 0.5, 2.0);
    }
    t.scale = a.error > 0 ? std::max(a.measured_kl, floor_kl) / std::pow(a.error, t.power) : 0;
    phase("probes", ++done, n_probed);
  }
  // Unprobed tensors: log(scale) and power interpolated between the nearest
  // probed layers of the role.
  for (const auto& [role, ts] : by_role)
    for (size_t k = 0; k < ts.size(); ++k) {
      if (probed[ts[k]]) continue;
      size_t lo = k, hi = k;
      while (lo > 0 && !probed[ts[lo]]) --lo;
      while (hi + 1 < ts.size() && !probed[ts[hi]]) ++hi;
      const GgufMixTensor& a = plan.tensors[ts[lo]];
      const GgufMixTensor& b = plan.tensors[ts[hi]];
      const double f = hi == lo ? 0.0 : static_cast<double>(k - lo) / static_cast<double>(hi - lo);
      GgufMixTensor& t = plan.tensors[ts[k]];
      const double la = std::log(std::max(a.scale, 1e-300)), lb = std::log(std::max(b.scale, 1e-300));
      t.scale = std::exp(la + f * (lb - la));
      t.power = a.power + f * (b.power - a.power);
    }
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    GgufMixTensor& t = plan.tensors[i];
    if (!t.searched) continue;
    for (GgufCandidate& cd : t.candidates) {
      cd.error = errors[i][cd.type];
      cd.predicted_kl = predicted_kl(t, cd.error);
    }
  }
  plan.seconds_probes = seconds_since(t0);

  for (size_t k = 0; k < preset_types.size(); ++k) {
    uint64_t bytes = 0;
    double kl = 0;
    for (size_t i = 0; i < descs.size(); ++i) {
      const uint32_t type = preset_types[k][i];
      bytes += tensor_bytes(type, descs[i].ne);
      if (plan.tensors[i].searched) kl += predicted_kl(plan.tensors[i], errors[i][type]);
    }
    plan.presets.push_back({preset_names[k], bytes + plan.fixed_extra_bytes, kl});
  }
  allocate(plan, budget_of(plan, opts));
  return plan;
}

}  // namespace qf::mixed
