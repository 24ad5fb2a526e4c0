#include "calibration/quantize_plan.h"

#include <algorithm>

#include "core/error.h"
#include "checkpoint/checkpoint_format.h"
#include "checkpoint/compressed_tensors.h"
#include "quantizers/act_quant.h"
#include "quantizers/bnb4.h"
#include "quantizers/device_quantizers.h"
#include "quantizers/float_quant.h"
#include "quantizers/rtn.h"

namespace qf {
namespace {

// A group size must divide the Linear's columns. llm-compressor checks that
// early unless bypass_divisibility_checks; bypassed, compressed-tensors' group
// quantizer still raises for such a layer ("tensor column shape must be
// divisible by the given group_size"), so it cannot be quantized either way.
void check_divisible(const ModifierSpec& mod, const ModifierSpec::Group& g, const QuantScheme& w, const std::string& name,
                     int64_t cols) {
  if (!w.grouped() || cols % w.group_size == 0) return;
  const std::string what = "group_size " + std::to_string(w.group_size) + " does not divide the " + std::to_string(cols) +
                           " input columns of " + name;
  if (mod.bypass_divisibility_checks)
    throw unsupported(mod.bypass_where, "bypass_divisibility_checks: " + what +
                                            ": a group size that does not divide the columns cannot be quantized (no "
                                            "partial groups; compressed-tensors' quantizer refuses them too, after its "
                                            "bypassed check); ignore the module or choose a group size that divides it");
  throw invalid_input(g.where, what + " (choose a group size that divides it, use strategy: channel, or ignore the module)");
}

// Checks one Linear's scheme against its shape and the export format.
void check_linear(const ModifierSpec& mod, const ModifierSpec::Group& g, const std::string& name, int64_t rows,
                  int64_t cols, const CheckpointFormat& format, bool gptq) {
  const QuantScheme& w = g.weights;
  check_divisible(mod, g, w, name, cols);
  if (gptq && !w.is_int())
    throw unsupported(g.where, "GPTQModifier quantizes integer weights; use QuantizationModifier for " + w.describe() +
                                   (w.is_bnb4() ? " (bitsandbytes' NF4/FP4 are round-to-nearest only)" : ""));
  const ActivationScheme* a = g.input_activations ? &*g.input_activations : nullptr;
  LinearCheck c;
  c.name = name;
  c.rows = rows;
  c.cols = cols;
  c.weights = &w;
  c.act = a;
  c.actorder = g.act_order();
  c.scale_dtype_given = g.scale_dtype_set;
  c.where = g.where;
  format.check_linear(c);
  // A scheme's `format` names the compressed-tensors format of its group;
  // quantforge writes the one compressed-tensors infers (other exports are
  // their own formats), so another one would be silently ignored.
  if (!g.format.empty()) {
    const std::string inferred = compressed_tensors_format_of(w, a);
    if (g.format != inferred)
      throw unsupported(g.format_where, "format '" + g.format + "': this group is written as '" + inferred +
                                            "' (the format compressed-tensors infers for " + w.describe() +
                                            (a ? " / " + a->describe() : std::string(" weight-only")) +
                                            "); another format is not supported (remove the key)");
  }
}

// A Linear for SmoothQuant's search: RTN weights, inputs quantized with
// scales taken from each forward's own input.
class TrialLinear final : public rt::Linear {
 public:
  TrialLinear(QuantizedTensor q, std::optional<ActivationScheme> act, const std::vector<float>& bias, const std::string& name)
      : Linear(q.cols, q.rows), act_(std::move(act)), name_(name) {
    const std::optional<Tensor> bt = rt::bias_tensor(bias);
    inner_ = rt::make_quantized_linear(q, nullptr, bt ? &*bt : nullptr, name);
  }
  void forward(const float* x, int64_t n, float* y, ThreadPool& pool) const override {
    if (!act_) return inner_->forward(x, n, y, pool);
    std::vector<float> xq(x, x + n * in_);
    const auto [lo, hi] = std::minmax_element(xq.begin(), xq.end());
    const ActQuantParams p = calibrate_activation(*act_, xq.empty() ? 0.f : *lo, xq.empty() ? 0.f : *hi, name_);
    quantize_activations(p, xq.data(), n, in_);
    inner_->forward(xq.data(), n, y, pool);
  }
  void decode_row(int64_t r, float* out) const override { inner_->decode_row(r, out); }
  uint64_t weight_bytes() const override { return inner_->weight_bytes(); }
  std::string format() const override { return inner_->format(); }
  std::vector<float> bias_values() const override { return inner_->bias_values(); }

 private:
  std::optional<ActivationScheme> act_;
  std::string name_;
  std::unique_ptr<rt::Linear> inner_;
};

}  // namespace

DType plan_scale_dtype(const ModelConfig& c) {
  if (c.torch_dtype == "bfloat16") return DType::BF16;
  if (c.torch_dtype == "float32") return DType::F32;
  return DType::F16;
}

QuantizedTensor round_to_nearest(const float* w, int64_t rows, int64_t cols, const PlannedLinear& p,
                                 float nvfp4_global_amax, device::Kind where_to) {
  if (p.weights.is_fp8()) return quantize_fp8_on(where_to, w, rows, cols, p.weights);
  if (p.weights.is_nvfp4()) return quantize_nvfp4_on(where_to, w, rows, cols, p.weights, nvfp4_global_amax);
  if (p.weights.is_bnb4()) return quantize_bnb4(w, rows, cols, p.weights);  // the CPU reference on every device: one pass
  return quantize_rtn_on(where_to, w, rows, cols, p.weights, p.observer, p.mse);
}

std::shared_ptr<rt::Linear> plan_trial_linear(const QuantizePlan& plan, const std::string& name, const float* w,
                                              int64_t rows, int64_t cols, const std::vector<float>& bias) {
  auto it = plan.linears.find(name);
  if (it == plan.linears.end()) {
    const std::optional<Tensor> bt = rt::bias_tensor(bias);
    return rt::make_dense_linear(Tensor::from_f32(std::vector<float>(w, w + rows * cols), {rows, cols}),
                                 bt ? &*bt : nullptr, name);
  }
  const PlannedLinear& p = it->second;
  return std::make_shared<TrialLinear>(round_to_nearest(w, rows, cols, p), p.act, bias, name);
}


PlannedLinear planned_linear(const ModifierSpec::Group& g) {
  PlannedLinear p;
  p.weights = g.weights;
  p.act = g.input_activations;
  p.observer = g.range_observer();
  p.mse = g.mse;
  p.actorder = g.act_order();
  p.where = g.where;
  return p;
}

QuantizePlan make_quantize_plan(const Recipe& recipe, const rt::Model& model) {
  QuantizePlan plan;
  const ModifierSpec *quantizer = nullptr, *smoothquant = nullptr, *awq = nullptr;
  for (const ModifierSpec& m : recipe.modifiers) {
    if (m.is_smoothquant()) {
      if (smoothquant || awq || quantizer)
        throw unsupported(m.where, "SmoothQuantModifier must come first, once, before AWQModifier and the quantizer");
      if (!m.ignore.empty())
        throw unsupported(m.where, "SmoothQuantModifier.ignore is not supported (every layer's q/k/v and gate/up are smoothed)");
      smoothquant = &m;
    } else if (m.is_awq()) {
      if (awq || quantizer)
        throw unsupported(m.where, "AWQModifier must come once, before the quantizer (GPTQModifier or QuantizationModifier)");
      awq = &m;
    } else {
      if (quantizer && quantizer != awq)
        throw unsupported(m.where, "one quantization modifier per recipe (GPTQModifier or QuantizationModifier); found a second");
      quantizer = &m;
    }
  }
  if (!quantizer && awq && !awq->groups.empty()) quantizer = awq;  // AWQ then RTN in its scheme
  if (!quantizer)
    throw invalid_input(recipe.source, "the recipe quantizes nothing: add a GPTQModifier or QuantizationModifier (or give "
                                       "AWQModifier a scheme)");
  const ModifierSpec& mod = *quantizer;
  const bool gptq = mod.is_gptq();
  plan.quantizer = gptq ? QuantMethod::Gptq : QuantMethod::Rtn;
  plan.gptq.block_size = mod.block_size;
  plan.gptq.dampening_frac = mod.dampening_frac;
  if (smoothquant) {
    SmoothQuantOptions o;
    o.alpha = smoothquant->smoothing_strength;
    o.search = smoothquant->search_smoothing_strength;
    o.alpha_grid = smoothquant->smoothing_strength_grid;
    plan.smoothquant = o;
  }
  int64_t awq_group_size = 128;
  plan.format = &checkpoint_format(recipe.export_.format, recipe.export_.format_where);
  const CheckpointFormat& format = *plan.format;
  const ModelConfig& cfg = model.config();
  const DType sdt = plan_scale_dtype(cfg);

  std::map<std::string, ModifierSpec::Group> used_group;  // recipe groups that claim a Linear, resolved
  for (int64_t li = 0; li < cfg.num_hidden_layers; ++li) {
    const rt::LayerWeights& L = model.weights().layers[static_cast<size_t>(li)];
    for (const rt::LayerLinearId& e : rt::layer_linears(cfg, li)) {
      const std::string name = "model.layers." + std::to_string(li) + "." + e.name;
      const int64_t rows = rt::layer_linear(L, e)->out_features(), cols = rt::layer_linear(L, e)->in_features();
      std::optional<ModifierSpec::Group> g = scheme_for(mod, name);
      if (g && g->quantize_weights) {
        if (!g->scale_dtype_set) g->weights.scale_dtype = sdt;
        if (g->weights.is_bnb4()) {
          // bitsandbytes: round to nearest of the model's own weights only.
          if (smoothquant || awq)
            throw unsupported((smoothquant ? smoothquant : awq)->where,
                              std::string(smoothquant ? "SmoothQuantModifier" : "AWQModifier") + " with " +
                                  g->weights.describe() +
                                  ": bitsandbytes' NF4/FP4 quantize the model's weights as they are, by round to nearest "
                                  "(QuantizationModifier alone)");
          g->weights.double_quant = recipe.export_.double_quant;
        }
        check_linear(mod, *g, name, rows, cols, format, gptq);
        if (g->input_activations) {
          g->input_activations->validate(g->where);
          if (g->input_activations->needs_calibration()) plan.needs_activation_ranges = true;
        }
        plan.linears[name] = planned_linear(*g);
        used_group.emplace(g->name, *g);
      }
      // The scheme AWQ's search assumes: its own (legacy recipes), else the quantizer's.
      if (awq) {
        std::optional<ModifierSpec::Group> ag = awq->groups.empty() ? g : scheme_for(*awq, name);
        if (ag && ag->quantize_weights) {
          if (!ag->scale_dtype_set) ag->weights.scale_dtype = sdt;
          check_divisible(awq->groups.empty() ? mod : *awq, *ag, ag->weights, name, cols);
          awq_group_size = ag->weights.grouped() ? ag->weights.group_size : -1;
          plan.awq_linears[name] = planned_linear(*ag);
        }
      }
    }
  }
  if (plan.linears.empty()) throw invalid_input(recipe.source, "no Linear of the model matches the recipe's targets");
  // vLLM loads q/k/v as one qkv_proj and gate/up as one gate_up_proj with a
  // single NVFP4 global scale: each set is NVFP4 as a whole or not at all.
  for (int64_t li = 0; li < cfg.num_hidden_layers; ++li) {
    const std::string p = "model.layers." + std::to_string(li) + ".";
    for (const std::vector<std::string>& set : {std::vector<std::string>{"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"},
                                                std::vector<std::string>{"mlp.gate_proj", "mlp.up_proj"}}) {
      std::vector<std::string> fp4, other;
      const PlannedLinear* first = nullptr;
      for (const std::string& m : set) {
        auto it = plan.linears.find(p + m);
        const bool is_fp4 = it != plan.linears.end() && it->second.weights.is_nvfp4();
        (is_fp4 ? fp4 : other).push_back(m.substr(m.find('.') + 1));
        if (is_fp4 && !first) first = &it->second;
      }
      if (fp4.empty()) continue;
      if (!other.empty()) {
        auto list = [](const std::vector<std::string>& v) {
          std::string s;
          for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
          return s;
        };
        throw unsupported(first->where, p + set[0].substr(0, set[0].find('.')) + ": " + list(fp4) +
                                            (fp4.size() > 1 ? " are" : " is") + " NVFP4 but " + list(other) +
                                            (other.size() > 1 ? " are" : " is") +
                                            " not: vLLM fuses them into one Linear with one NVFP4 global scale "
                                            "(llm-compressor refuses this too); quantize all of them with NVFP4 or none");
      }
      plan.fused_nvfp4 = true;
    }
  }
  int64_t all = 0;  // the decoder Linears a quantizer may take (routers are never quantized)
  for (int64_t li = 0; li < cfg.num_hidden_layers; ++li) all += static_cast<int64_t>(rt::layer_linears(cfg, li).size());
  const int64_t n = static_cast<int64_t>(plan.linears.size());
  const std::string fname = format.name();
  if (format.one_scheme_per_model() && used_group.size() > 1)
    throw unsupported(recipe.source, "the " + fname + " format holds one scheme per model; export compressed-tensors for mixed schemes");
  if (format.every_linear_quantized() && n != all)
    throw unsupported(recipe.source, "the " + fname + " format expects every decoder Linear quantized; the recipe leaves " +
                                         std::to_string(all - n) +
                                         " in full precision (export compressed-tensors, which records them in ignore)");
  if (mod.kv_cache_scheme && !format.holds_kv_scales())
    throw unsupported(mod.where, "the " + fname + " format has no KV-cache scales; export compressed-tensors or modelopt");

  if (awq) {
    AwqOptions o;
    o.n_grid = static_cast<int>(awq->n_grid);
    o.duo_scaling = awq->duo_scaling;
    o.apply_clip = awq->apply_clip;
    if (!awq->awq_loss.empty()) o.loss = awq->awq_loss == "linear" ? AwqLoss::Linear : AwqLoss::Module;
    o.group_size = awq_group_size;
    plan.awq = o;
  }
  // The export config's groups: those that claim a Linear, in the recipe's order.
  for (const ModifierSpec::Group& mg : mod.groups) {
    const auto u = used_group.find(mg.name);
    if (u == used_group.end()) continue;
    const ModifierSpec::Group& g = u->second;
    ExportGroup eg;
    eg.targets = g.targets;
    eg.weights = g.weights;
    eg.act = g.input_activations;
    eg.actorder = g.act_order();
    eg.mse_observer = g.range_observer() == RangeObserver::Mse;
    eg.observer_kwargs = g.observer_kwargs;
    plan.export_config.groups.push_back(eg);
  }
  plan.export_config.by_gptq = gptq;
  plan.export_config.kv_cache = mod.kv_cache_scheme;
  plan.export_config.dampening_frac = mod.dampening_frac;
  plan.export_config.compute_dtype = recipe.export_.compute_dtype;

  std::vector<std::string> reasons;
  if (gptq) reasons.push_back("GPTQ");
  if (smoothquant) reasons.push_back("SmoothQuant");
  if (awq) reasons.push_back("AWQ");
  if (plan.needs_activation_ranges) reasons.push_back("static activation scales");
  if (mod.kv_cache_scheme) reasons.push_back("the KV-cache scheme");
  for (const ModifierSpec& m : recipe.modifiers)
    if (m.requires_calibration_data && reasons.empty()) reasons.push_back(m.kind + ".requires_calibration_data");
  plan.needs_calibration = !reasons.empty();
  for (size_t i = 0; i < reasons.size(); ++i) plan.calibration_reason += (i ? i + 1 == reasons.size() ? " and " : ", " : "") + reasons[i];
  if (smoothquant) plan.method += "smoothquant+";
  if (awq) plan.method += "awq+";
  plan.method += gptq ? "gptq" : "rtn";
  return plan;
}

}  // namespace qf
