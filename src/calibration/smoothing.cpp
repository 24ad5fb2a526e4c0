#include "calibration/smoothing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "calibration/smoothing_internal.h"
#include "core/error.h"
#include "core/tensor.h"
#include "runtime/cpu/kernels.h"
#include "runtime/device_runtime.h"
#include "runtime/router_linears.h"

namespace qf {
using namespace smoothing_detail;

const char* mapping_name(Mapping m) {
  switch (m) {
    case Mapping::AttnNormToQKV: return "input_layernorm->q,k,v";
    case Mapping::VToO: return "v_proj->o_proj";
    case Mapping::FfnNormToGateUp: return "post_attention_layernorm->gate,up";
    case Mapping::UpToDown: return "up_proj->down_proj";
  }
  return "?";
}

bool mapping_applies(const rt::Model& model, Mapping m) {
  if (m != Mapping::VToO) return true;
  return model.config().q_dim() == model.config().kv_dim();
}

int64_t mapping_width(const rt::Model& model, Mapping m) {
  const ModelConfig& c = model.config();
  switch (m) {
    case Mapping::AttnNormToQKV:
    case Mapping::FfnNormToGateUp: return c.hidden_size;
    case Mapping::VToO: return c.kv_dim();
    case Mapping::UpToDown: return c.intermediate_size;
  }
  return 0;
}

void apply_smoothing_scales(rt::Model& model, int64_t li, Mapping which, const std::vector<float>& s, int64_t expert) {
  const ModelConfig& c = model.config();
  std::string where = layer_prefix(li) + mapping_name(which);
  if (li < 0 || li >= c.num_hidden_layers) throw invalid_input(where, "no such layer");
  if (!mapping_applies(model, which))
    throw invalid_input(where, "v_proj -> o_proj needs v_proj and o_proj of the same shape (no grouped-query attention)");
  rt::LayerWeights& L = model.mutable_layer(li);
  const bool per_expert = L.sparse() && which == Mapping::UpToDown;
  if (per_expert) {
    const bool known = (expert >= 0 && expert < c.num_experts) || (expert == rt::kSharedExpert && L.moe.shared.gate);
    if (!known) {
      const std::string got = expert == rt::kNoExpert       ? "no expert was given"
                              : expert == rt::kSharedExpert ? "the shared expert was given, which this layer has not"
                                                            : "expert " + std::to_string(expert) + " was given";
      throw invalid_input(where, "a sparse layer's up -> down mapping needs one of its experts (0 to " +
                                     std::to_string(c.num_experts - 1) +
                                     (L.moe.shared.gate ? ", or the shared expert); " : "); ") + got);
    }
    where = layer_prefix(li) + expert_label(expert) + " " + mapping_name(which);
  } else if (expert != rt::kNoExpert) {
    throw invalid_input(where, "only a sparse layer's up -> down mapping takes an expert");
  }
  const std::vector<BalanceLinear> bal = balance_slots(c, L, li, which, expert);
  const int64_t width = (*bal.front().lin)->in_features();
  if (static_cast<int64_t>(s.size()) != width)
    throw invalid_input(where, "expected " + std::to_string(width) + " scales, got " + std::to_string(s.size()));
  for (float v : s)
    if (!(v > 0 && std::isfinite(v))) throw invalid_input(where, "scales must be positive and finite");
  auto scale_cols = [&](std::shared_ptr<rt::Linear>& lin, const std::string& name) {
    std::vector<float> w = lin->decode_all();
    const int64_t rows = lin->out_features(), cols = lin->in_features();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) w[static_cast<size_t>(r * cols + j)] *= s[static_cast<size_t>(j)];
    lin = dense_f32(w, rows, cols, lin->bias_values(), name);
  };
  auto scale_rows = [&](std::shared_ptr<rt::Linear>& lin, const std::string& name) {
    std::vector<float> w = lin->decode_all(), b = lin->bias_values();
    const int64_t rows = lin->out_features(), cols = lin->in_features();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) w[static_cast<size_t>(r * cols + j)] /= s[static_cast<size_t>(r)];
    for (size_t r = 0; r < b.size(); ++r) b[r] /= s[r];
    lin = dense_f32(w, rows, cols, b, name);
  };
  switch (which) {
    case Mapping::AttnNormToQKV:
      for (size_t j = 0; j < s.size(); ++j) L.attn_norm[j] /= s[j];
      break;
    case Mapping::FfnNormToGateUp:
      for (size_t j = 0; j < s.size(); ++j) L.ffn_norm[j] /= s[j];
      break;
    case Mapping::VToO:
    case Mapping::UpToDown: {
      const BalanceLinear prev = previous_slot(c, L, li, which, expert);
      scale_rows(*prev.lin, prev.name);
      break;
    }
  }
  for (const BalanceLinear& b : bal) scale_cols(*b.lin, b.name);
}

SmoothingReport smoothquant_layer(rt::Model& model, int64_t li, const LayerCalib& calib, const SmoothQuantOptions& o,
                                  const TrialLinearFn& trial, ThreadPool& pool) {
  if (o.search && !trial) throw invalid_input("smoothquant", "the alpha search needs a trial quantizer");
  if (o.search && o.alpha_grid.empty()) throw invalid_input("smoothquant", "empty alpha grid");
  const ModelConfig& c = model.config();
  if (o.device != device::Kind::Cpu && c.is_moe())
    throw unsupported("smoothquant --device " + std::string(device::kind_name(o.device)),
                      "mixture-of-experts layers are smoothed on the CPU only");
  const CalibSet cs = make_calib_set(model, calib);
  // act_max of the q/k/v and gate/up inputs, and (searching) the float
  // layer's output as the reference, on the CPU or the device.
  std::vector<double> act_attn, act_mlp;
  std::unique_ptr<rt::DeviceSmoothingEval> dev;
  if (o.device != device::Kind::Cpu) {
    dev = device_eval(o.device, model, calib, cs, "smoothquant");
    dev->load(li);
    dev->run_reference();
    act_attn = dev->abs_max(rt::LayerInput::Attention), act_mlp = dev->abs_max(rt::LayerInput::Mlp);
  } else {
    Capture cap({}, 1);
    run_blocks(model, li, cs, pool, &cap);
    act_attn = std::move(cap.q.abs_max), act_mlp = std::move(cap.gate.abs_max);
  }
  const rt::LayerWeights base = model.mutable_layer(li);
  const std::string p = layer_prefix(li);
  // w_max over the rows of each mapping's balance Linears.
  auto w_max = [&](const std::vector<const rt::Linear*>& lins) {
    const int64_t cols = lins.front()->in_features();
    std::vector<double> m(static_cast<size_t>(cols), 0.0);
    for (const rt::Linear* l : lins) {
      const std::vector<float> w = l->decode_all();
      for (int64_t r = 0; r < l->out_features(); ++r)
        for (int64_t j = 0; j < cols; ++j)
          m[static_cast<size_t>(j)] = std::max(m[static_cast<size_t>(j)], std::fabs(static_cast<double>(w[static_cast<size_t>(r * cols + j)])));
    }
    for (double& v : m) v = std::max(v, 1e-5);
    return m;
  };
  const std::vector<double> wm_attn = w_max({base.q.get(), base.k.get(), base.v.get()});
  // A sparse layer's: over every expert's gate and up (the router and the
  // shared-expert gate are scaled too but stay in float).
  std::vector<const rt::Linear*> mlp_in_linears;
  for (const rt::LayerLinearId& id : rt::layer_linears(c, li))
    if (id.slot == rt::LinearObserver::Gate || id.slot == rt::LinearObserver::Up)
      mlp_in_linears.push_back(rt::layer_linear(base, id).get());
  const std::vector<double> wm_mlp = w_max(mlp_in_linears);
  auto scales = [](const std::vector<double>& act, const std::vector<double>& wm, double a) {
    std::vector<float> s(act.size());
    for (size_t j = 0; j < s.size(); ++j)
      s[j] = static_cast<float>(std::max(std::pow(act[j], a) / std::pow(wm[j], 1.0 - a), 1e-5));
    return s;
  };
  auto smooth = [&](double a) {
    apply_smoothing_scales(model, li, Mapping::AttnNormToQKV, scales(act_attn, wm_attn, a));
    apply_smoothing_scales(model, li, Mapping::FfnNormToGateUp, scales(act_mlp, wm_mlp, a));
  };
  SmoothingReport rep;
  double alpha = o.alpha;
  if (o.search) {
    const std::vector<float> reference = dev ? std::vector<float>{} : run_layer(model, li, cs, pool);
    // The layer with every Linear replaced by its trial form (nullptr: kept).
    auto trial_loss = [&]() {
      rt::LayerWeights& L = model.mutable_layer(li);
      const rt::LayerWeights smoothed = L;
      for (const rt::LayerLinearId& id : rt::layer_linears(c, li)) {
        std::shared_ptr<rt::Linear>& lin = rt::layer_linear(L, id);
        const std::vector<float> w = lin->decode_all();
        std::shared_ptr<rt::Linear> t = trial(p + id.name, w.data(), lin->out_features(), lin->in_features(), lin->bias_values());
        if (t) lin = std::move(t);
      }
      double loss = 0;
      if (dev) {
        dev->load(li);
        loss = dev->loss(rt::SmoothingBlock::Layer);
      } else {
        loss = mse(run_layer(model, li, cs, pool), reference);
      }
      L = smoothed;
      return loss;
    };
    const double none = trial_loss();
    double best = std::numeric_limits<double>::infinity();
    std::string losses;
    for (double a : o.alpha_grid) {
      smooth(a);
      const double l = trial_loss();
      model.mutable_layer(li) = base;
      losses += fmt(" %.2f:%.4g", a, l);
      if (l < best) best = l, alpha = a;
    }
    rep.entries.push_back({"smoothquant alpha", alpha, none, best});
    rep.lines.push_back(p + "smoothquant: alpha " + fmt("%.2f", alpha) + fmt(", layer loss %.6g unsmoothed -> %.6g", none, best) +
                        " (alpha:loss" + losses + ")");
  } else {
    rep.entries.push_back({"smoothquant alpha", alpha, 0, 0});
    rep.lines.push_back(p + "smoothquant: alpha " + fmt("%.2f", alpha));
  }
  smooth(alpha);
  return rep;
}

}  // namespace qf
