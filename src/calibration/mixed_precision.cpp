#include "calibration/mixed_precision.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>

#include "calibration/quantize_plan.h"
#include "checkpoint/compressed_tensors.h"
#include "core/error.h"
#include "eval/perplexity.h"
#include "eval/probe_kl.h"
#include "quantizers/act_quant.h"

namespace qf {
namespace {

using Slot = rt::LinearObserver::Slot;

// Which fused set a Linear belongs to, within its layer.
std::string set_key(const rt::LayerLinearId& id) {
  if (id.expert >= 0) return "experts";
  const bool shared = id.expert == rt::kSharedExpert;
  switch (id.slot) {
    case Slot::Q:
    case Slot::K:
    case Slot::V: return "qkv";
    case Slot::O: return "o";
    case Slot::Gate:
    case Slot::Up: return shared ? "shared_gate_up" : "gate_up";
    default: return shared ? "shared_down" : "down";
  }
}

size_t common_prefix(const std::vector<std::string>& v) {
  size_t n = v[0].size();
  for (const auto& s : v) {
    size_t i = 0;
    while (i < n && i < s.size() && s[i] == v[0][i]) ++i;
    n = i;
  }
  return n;
}

size_t common_suffix(const std::vector<std::string>& v, size_t prefix) {
  size_t n = v[0].size() - prefix;
  for (const auto& s : v) {
    size_t i = 0;
    while (i < n && i < s.size() - prefix && s[s.size() - 1 - i] == v[0][v[0].size() - 1 - i]) ++i;
    n = i;
  }
  return n;
}

std::string regex_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

// "model.layers.0.self_attn.{q,k,v}_proj" (sep ",") or the regex form (sep "|").
std::string members_pattern(const std::vector<std::string>& modules, bool regex) {
  auto esc = [&](const std::string& s) { return regex ? regex_escape(s) : s; };
  if (modules.size() == 1) return esc(modules[0]);
  const size_t pre = common_prefix(modules);
  const size_t suf = common_suffix(modules, pre);
  std::string mid;
  for (size_t i = 0; i < modules.size(); ++i) {
    if (i) mid += regex ? '|' : ',';
    mid += esc(modules[i].substr(pre, modules[i].size() - pre - suf));
  }
  const std::string& m0 = modules[0];
  std::string out = esc(m0.substr(0, pre));
  out += regex ? '(' : '{';
  out += mid;
  out += regex ? ')' : '}';
  out += esc(m0.substr(m0.size() - suf));
  return out;
}

// A preset's group with the scale dtype resolved to the model's.
ModifierSpec::Group resolved_preset(const std::string& scheme, DType model_dtype, const std::string& where = "") {
  ModifierSpec::Group g = preset_group(scheme, {}, "", where);
  if (!g.scale_dtype_set) g.weights.scale_dtype = model_dtype;
  return g;
}

// Per Linear input: sum of squares per column, range, token count.
struct InputStats {
  std::vector<double> sumsq;
  float lo = 0, hi = 0;
  int64_t n = 0;
  void add(const float* x, int64_t rows, int64_t in) {
    if (sumsq.empty()) sumsq.assign(static_cast<size_t>(in), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < in; ++j) {
        const float v = x[r * in + j];
        sumsq[static_cast<size_t>(j)] += static_cast<double>(v) * v;
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
    n += rows;
  }
};

// Collects InputStats keyed by (layer, expert, input slot).
class StatsObserver final : public rt::LinearObserver {
 public:
  using Key = std::tuple<int64_t, int64_t, int>;
  void observe(int64_t layer, Slot slot, const float* x, int64_t n, int64_t in) override {
    if (input_of(slot) == slot && slot != LmHead) stats[{layer, rt::kNoExpert, slot}].add(x, n, in);
  }
  void observe_expert(int64_t layer, int64_t expert, Slot slot, const float* x, int64_t n, int64_t in) override {
    stats[{layer, expert, slot}].add(x, n, in);
  }
  static Key key(int64_t layer, const rt::LayerLinearId& id) {
    return {layer, id.expert, static_cast<int>(rt::LinearObserver::input_of(id.slot))};
  }
  std::map<Key, InputStats> stats;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

}  // namespace

std::vector<MixedItem> mixed_items(const rt::Model& model, const ModifierSpec& quantizer) {
  ModifierSpec any = quantizer;  // which Linears the quantizer's targets and ignore select
  ModifierSpec::Group g;
  g.targets = quantizer.targets;
  any.groups = {g};
  const ModelConfig& cfg = model.config();
  std::vector<MixedItem> items;
  for (int64_t li = 0; li < cfg.num_hidden_layers; ++li) {
    std::vector<std::string> keys;
    std::vector<MixedItem> layer_items;
    const rt::LayerWeights& L = model.weights().layers[static_cast<size_t>(li)];
    for (const rt::LayerLinearId& id : rt::layer_linears(cfg, li)) {
      const std::string name = "model.layers." + std::to_string(li) + "." + id.name;
      if (!scheme_for(any, name)) continue;
      const std::string k = set_key(id);
      auto it = std::find(keys.begin(), keys.end(), k);
      if (it == keys.end()) {
        keys.push_back(k);
        layer_items.emplace_back();
        layer_items.back().layer = li;
        it = keys.end() - 1;
      }
      MixedItem& item = layer_items[static_cast<size_t>(it - keys.begin())];
      item.ids.push_back(id);
      item.modules.push_back(name);
      const rt::Linear& l = *rt::layer_linear(L, id);
      item.weights += static_cast<uint64_t>(l.out_features()) * static_cast<uint64_t>(l.in_features());
    }
    for (size_t i = 0; i < layer_items.size(); ++i) {
      MixedItem& item = layer_items[i];
      item.name = keys[i] == "experts" ? "model.layers." + std::to_string(li) + "." + rt::moe_module_prefix(cfg) + "experts"
                                       : members_pattern(item.modules, false);
      items.push_back(std::move(item));
    }
  }
  return items;
}

std::vector<std::vector<uint64_t>> mixed_item_bytes(const rt::Model& model, const std::vector<MixedItem>& items,
                                                    const std::vector<std::string>& schemes) {
  const DType dt = plan_scale_dtype(model.config());
  std::vector<ModifierSpec::Group> gs;
  for (const std::string& s : schemes) gs.push_back(resolved_preset(s, dt));
  std::vector<std::vector<uint64_t>> out(items.size(), std::vector<uint64_t>(schemes.size(), 0));
  for (size_t i = 0; i < items.size(); ++i)
    for (size_t k = 0; k < items[i].ids.size(); ++k) {
      const rt::Linear& l = *rt::layer_linear(model.weights().layers[static_cast<size_t>(items[i].layer)], items[i].ids[k]);
      for (size_t s = 0; s < gs.size(); ++s) {
        const ModifierSpec::Group& g = gs[s];
        out[i][s] += g.quantize_weights
                         ? compressed_tensors_linear_bytes(g.weights, g.input_activations ? &*g.input_activations : nullptr,
                                                           l.out_features(), l.in_features())
                         : static_cast<uint64_t>(l.out_features()) * static_cast<uint64_t>(l.in_features()) * dtype_size(dt);
      }
    }
  return out;
}

std::string mixed_item_target(const MixedItem& item) {
  std::string t = "re:^";
  t += members_pattern(item.modules, true);
  t += '$';
  return t;
}

std::vector<ModifierSpec::Group> mixed_groups(const std::vector<MixedItem>& items, const std::vector<std::string>& schemes,
                                              const std::vector<std::string>& scheme_where, const std::vector<int>& choice) {
  std::vector<ModifierSpec::Group> groups;
  for (size_t s = 0; s < schemes.size(); ++s) {
    std::vector<std::string> targets;
    for (size_t i = 0; i < items.size(); ++i)
      if (choice[i] == static_cast<int>(s)) targets.push_back(mixed_item_target(items[i]));
    if (targets.empty()) continue;
    groups.push_back(preset_group(schemes[s], targets, "group_" + std::to_string(groups.size()),
                                  s < scheme_where.size() ? scheme_where[s] : ""));
  }
  return groups;
}

void check_mixed_groups(const rt::Model& model, const ModifierSpec& quantizer, const std::vector<MixedItem>& items,
                        const std::vector<std::string>& schemes, const std::vector<int>& choice) {
  std::map<std::string, int> want;  // module -> scheme index
  for (size_t i = 0; i < items.size(); ++i)
    for (const std::string& m : items[i].modules) want[m] = choice[i];
  const ModelConfig& cfg = model.config();
  for (int64_t li = 0; li < cfg.num_hidden_layers; ++li)
    for (const rt::LayerLinearId& id : rt::layer_linears(cfg, li)) {
      const std::string name = "model.layers." + std::to_string(li) + "." + id.name;
      int matched = 0;
      for (const ModifierSpec::Group& g : quantizer.groups)
        for (const std::string& t : g.targets)
          if (recipe_matches(t, name)) {
            ++matched;
            break;
          }
      const std::optional<ModifierSpec::Group> g = scheme_for(quantizer, name);
      const auto w = want.find(name);
      if (w == want.end()) {
        if (g) throw Error(ErrorKind::Internal, name + ": quantized by the mixed-precision groups but not searched");
        continue;
      }
      if (matched != 1)
        throw Error(ErrorKind::Internal, name + ": matched by " + std::to_string(matched) +
                                             " mixed-precision groups (expected exactly one)");
      const ModifierSpec::Group e = preset_group(schemes[static_cast<size_t>(w->second)], {}, "", "");
      const bool same = !g ? !e.quantize_weights
                           : e.quantize_weights && g->weights.describe() == e.weights.describe() &&
                                 g->input_activations.has_value() == e.input_activations.has_value() &&
                                 (!e.input_activations || g->input_activations->describe() == e.input_activations->describe());
      if (!same)
        throw Error(ErrorKind::Internal, name + ": the mixed-precision groups give it another scheme than " +
                                             schemes[static_cast<size_t>(w->second)]);
    }
}

MixedPrecisionResult search_mixed_precision(const rt::Model& model, const ModifierSpec& quantizer,
                                            const MixedPrecisionSpec& spec, const std::vector<std::vector<int32_t>>& windows,
                                            ThreadPool& pool, const std::function<void(const std::string&)>& log) {
  const auto t0 = std::chrono::steady_clock::now();
  MixedPrecisionResult r;
  r.schemes = spec.schemes;
  r.items = mixed_items(model, quantizer);
  if (r.items.empty())
    throw invalid_input(quantizer.where, quantizer.kind + ": no Linear of the model matches its targets (mixed_precision has nothing to allocate)");
  const size_t S = spec.schemes.size(), I = r.items.size();
  const DType dt = plan_scale_dtype(model.config());
  std::vector<ModifierSpec::Group> gs;
  for (size_t s = 0; s < S; ++s) gs.push_back(resolved_preset(spec.schemes[s], dt, spec.scheme_where[s]));
  const std::vector<std::vector<uint64_t>> bytes = mixed_item_bytes(model, r.items, spec.schemes);

  // The budget, and whether the smallest choice fits it.
  for (const MixedItem& it : r.items) r.weights += it.weights;
  r.budget = spec.target_bytes ? spec.target_bytes
                               : static_cast<uint64_t>(std::floor(spec.target_bits * static_cast<double>(r.weights) / 8.0));
  uint64_t least = 0;
  for (size_t i = 0; i < I; ++i) least += *std::min_element(bytes[i].begin(), bytes[i].end());
  if (least > r.budget) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%.4f bits per weight (%llu bytes)", 8.0 * static_cast<double>(least) / static_cast<double>(r.weights),
                  static_cast<unsigned long long>(least));
    throw invalid_input(spec.target_where, std::string("mixed_precision: the budget (") + std::to_string(r.budget) +
                                               " bytes over the " + std::to_string(r.weights) +
                                               " targeted weights) is below the smallest of the schemes: they need at least " +
                                               buf + "; raise the target or add a smaller scheme");
  }

  // The probe scheme: the quantized candidate with the fewest bytes.
  int probe = -1;
  uint64_t probe_bytes = UINT64_MAX;
  for (size_t s = 0; s < S; ++s) {
    uint64_t b = 0;
    for (size_t i = 0; i < I; ++i) b += bytes[i][s];
    if (gs[s].quantize_weights && b < probe_bytes) probe = static_cast<int>(s), probe_bytes = b;
  }

  // Input statistics and the probes' spans: the first probe_samples windows.
  std::vector<eval::Span> spans;
  for (const auto& w : windows) {
    if (static_cast<int64_t>(spans.size()) >= spec.probe_samples) break;
    if (w.size() < 2) continue;
    spans.push_back(eval::Span{w, 0});
  }
  if (spans.empty()) throw invalid_input(spec.where, "mixed_precision: the calibration data has no window of 2 tokens or more");
  // One baseline pass gathers the input statistics and what every probe is
  // compared with.
  for (const eval::Span& sp : spans) r.probe_tokens += static_cast<int64_t>(sp.tokens.size());
  r.probe_windows = static_cast<int64_t>(spans.size());
  StatsObserver obs;
  const eval::ProbeRunner runner(model, spans, pool, &obs);

  // Which items are probed: all, or probe_items spread evenly.
  std::vector<bool> probed(I, spec.probe_items == 0 || spec.probe_items >= static_cast<int64_t>(I));
  if (!probed[0] || I == 0)
    for (int64_t k = 0; k < spec.probe_items; ++k) probed[static_cast<size_t>(k * static_cast<int64_t>(I) / spec.probe_items)] = true;

  r.proxy.assign(I, std::vector<double>(S, 0.0));
  r.probe_scheme.assign(I, -1);
  r.probe_kl.assign(I, 0.0);
  r.factor.assign(I, 0.0);
  for (size_t i = 0; i < I; ++i) {
    const MixedItem& item = r.items[i];
    const rt::LayerWeights& L = model.weights().layers[static_cast<size_t>(item.layer)];
    std::vector<std::vector<float>> w;
    float amax = 0;  // the fused set's largest |w| (NVFP4 global scales of q/k/v and gate/up)
    for (const rt::LayerLinearId& id : item.ids) {
      w.push_back(rt::layer_linear(L, id)->decode_all());
      for (float v : w.back()) amax = std::max(amax, std::fabs(v));
    }
    const bool fused_amax = item.ids.size() > 1 && item.ids[0].expert < 0;
    // Each member's input second moments, E[x_j^2] (0 without statistics).
    std::vector<std::vector<double>> h(item.ids.size());
    for (size_t k = 0; k < item.ids.size(); ++k) {
      const auto st = obs.stats.find(StatsObserver::key(item.layer, item.ids[k]));
      h[k].assign(static_cast<size_t>(rt::layer_linear(L, item.ids[k])->in_features()), 0.0);
      if (st != obs.stats.end() && st->second.n > 0)
        for (size_t j = 0; j < h[k].size(); ++j) h[k][j] = st->second.sumsq[j] / static_cast<double>(st->second.n);
    }
    rt::Model trial = model;
    for (size_t s = 0; s < S; ++s) {
      if (!gs[s].quantize_weights) continue;
      const PlannedLinear p = planned_linear(gs[s]);
      const bool do_probe = probed[i] && static_cast<int>(s) == probe;
      for (size_t k = 0; k < item.ids.size(); ++k) {
        const rt::LayerLinearId& id = item.ids[k];
        const std::shared_ptr<rt::Linear>& orig = rt::layer_linear(L, id);
        const int64_t rows = orig->out_features(), cols = orig->in_features();
        const QuantizedTensor q = round_to_nearest(w[k].data(), rows, cols, p, fused_amax ? amax : -1.f);
        const auto st = obs.stats.find(StatsObserver::key(item.layer, id));
        std::vector<float> row(static_cast<size_t>(cols));
        double err = 0;
        for (int64_t rr = 0; rr < rows; ++rr) {
          q.dequantize_row(rr, row.data());
          for (int64_t j = 0; j < cols; ++j) {
            const double d = static_cast<double>(w[k][static_cast<size_t>(rr * cols + j)]) - row[static_cast<size_t>(j)];
            err += h[k][static_cast<size_t>(j)] * d * d;
          }
        }
        r.proxy[i][s] += err;
        if (do_probe) {
          std::optional<ActQuantParams> act;
          if (p.act) {
            const float lo = st != obs.stats.end() ? st->second.lo : 0.f, hi = st != obs.stats.end() ? st->second.hi : 0.f;
            act = calibrate_activation(*p.act, lo, hi, item.modules[k]);
          }
          const std::optional<Tensor> bias = rt::bias_tensor(orig->bias_values());
          rt::layer_linear(trial.mutable_layer(item.layer), id) =
              rt::make_quantized_linear(q, act ? &*act : nullptr, bias ? &*bias : nullptr, item.modules[k]);
        }
      }
      if (do_probe) {
        const double kl = runner.kl(trial, item.layer);  // the trial differs from the item's layer on
        r.probe_scheme[i] = static_cast<int>(s);
        r.probe_kl[i] = std::isfinite(kl) ? std::max(0.0, kl) : 0.0;
        r.factor[i] = r.proxy[i][s] > 0 ? r.probe_kl[i] / r.proxy[i][s] : 0.0;
        if (!std::isfinite(kl))
          throw invalid_input(item.name, "mixed_precision: the probe's KL divergence is not finite");
      }
    }
    if (log && probed[i] && probe >= 0) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "mixed precision: probe %zu/%zu %s in %s: KL %.6g", i + 1, I, item.name.c_str(),
                    spec.schemes[static_cast<size_t>(probe)].c_str(), r.probe_kl[i]);
      log(buf);
    }
  }
  std::vector<double> measured;
  for (size_t i = 0; i < I; ++i)
    if (r.probe_scheme[i] >= 0) measured.push_back(r.factor[i]);
  const double fallback = median(measured);
  for (size_t i = 0; i < I; ++i)
    if (r.probe_scheme[i] < 0) r.factor[i] = fallback;

  r.options.resize(I);
  for (size_t i = 0; i < I; ++i) {
    r.options[i].name = r.items[i].name;
    for (size_t s = 0; s < S; ++s) {
      double cost = r.factor[i] * r.proxy[i][s];
      if (!std::isfinite(cost) || cost < 0) cost = 0;
      r.options[i].options.push_back(mixed::Option{bytes[i][s], cost});
    }
  }
  r.exact = mixed::solve_exact(r.options, r.budget);
  r.lagrangian = mixed::solve_lagrangian(r.options, r.budget);
  r.groups = mixed_groups(r.items, spec.schemes, spec.scheme_where, r.exact.choice);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

nlohmann::ordered_json MixedPrecisionResult::json(const MixedPrecisionSpec& spec) const {
  nlohmann::ordered_json j;
  if (spec.target_bytes) j["target_size_bytes"] = spec.target_bytes;
  else j["target_bits"] = spec.target_bits;
  j["schemes"] = schemes;
  j["targeted_weights"] = weights;
  j["budget_bytes"] = budget;
  j["bytes"] = exact.bytes;
  j["bits_per_weight"] = weights ? 8.0 * static_cast<double>(exact.bytes) / static_cast<double>(weights) : 0.0;
  j["predicted_kld"] = exact.cost;
  j["exact"] = exact.exact;
  nlohmann::ordered_json lag;
  lag["bytes"] = lagrangian.bytes;
  lag["predicted_kld"] = lagrangian.cost;
  lag["lambda"] = lagrangian.lambda;
  j["lagrangian"] = lag;
  nlohmann::ordered_json counts = nlohmann::ordered_json::object();
  for (size_t s = 0; s < schemes.size(); ++s) {
    int64_t c = 0;
    for (int ch : exact.choice) c += ch == static_cast<int>(s);
    counts[schemes[s]] = c;
  }
  j["items_per_scheme"] = counts;
  j["probe_windows"] = probe_windows;
  j["probe_tokens"] = probe_tokens;
  j["seconds"] = seconds;
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (size_t i = 0; i < items.size(); ++i) {
    const int c = exact.choice[i];
    nlohmann::ordered_json e;
    e["item"] = items[i].name;
    e["modules"] = items[i].modules;
    e["target"] = mixed_item_target(items[i]);
    e["scheme"] = schemes[static_cast<size_t>(c)];
    e["bytes"] = options[i].options[static_cast<size_t>(c)].bytes;
    e["predicted_kld"] = options[i].options[static_cast<size_t>(c)].cost;
    if (lagrangian.feasible) e["lagrangian_scheme"] = schemes[static_cast<size_t>(lagrangian.choice[i])];
    if (probe_scheme[i] >= 0) {
      e["probe"] = {{"scheme", schemes[static_cast<size_t>(probe_scheme[i])]},
                    {"measured_kld", probe_kl[i]},
                    {"proxy", proxy[i][static_cast<size_t>(probe_scheme[i])]},
                    {"factor", factor[i]}};
    } else {
      e["probe"] = nullptr;
    }
    nlohmann::ordered_json opts = nlohmann::ordered_json::object();
    for (size_t s = 0; s < schemes.size(); ++s)
      opts[schemes[s]] = {{"bytes", options[i].options[s].bytes}, {"predicted_kld", options[i].options[s].cost}};
    e["options"] = opts;
    arr.push_back(e);
  }
  j["items"] = arr;
  return j;
}

std::string MixedPrecisionResult::table() const {
  std::string out;
  char buf[512];
  size_t w = 4;
  for (const MixedItem& it : items) w = std::max(w, it.name.size());
  std::snprintf(buf, sizeof buf, "%-*s  %-12s %12s %14s %7s\n", static_cast<int>(w), "item", "scheme", "bytes",
                "predicted KL", "share");
  out += buf;
  for (size_t i = 0; i < items.size(); ++i) {
    const int c = exact.choice[i];
    const mixed::Option& o = options[i].options[static_cast<size_t>(c)];
    std::snprintf(buf, sizeof buf, "%-*s  %-12s %12llu %14.6g %6.1f%%\n", static_cast<int>(w), items[i].name.c_str(),
                  schemes[static_cast<size_t>(c)].c_str(), static_cast<unsigned long long>(o.bytes), o.cost,
                  exact.cost > 0 ? 100.0 * o.cost / exact.cost : 0.0);
    out += buf;
  }
  std::snprintf(buf, sizeof buf,
                "total: %llu of %llu bytes (%.4f bits per weight over %llu weights), predicted KL %.6g%s\n",
                static_cast<unsigned long long>(exact.bytes), static_cast<unsigned long long>(budget),
                weights ? 8.0 * static_cast<double>(exact.bytes) / static_cast<double>(weights) : 0.0,
                static_cast<unsigned long long>(weights), exact.cost, exact.exact ? "" : " (table coarsened)");
  out += buf;
  if (lagrangian.feasible) {
    std::snprintf(buf, sizeof buf, "lagrangian bisection: %llu bytes, predicted KL %.6g (%+.2f%% vs exact)\n",
                  static_cast<unsigned long long>(lagrangian.bytes), lagrangian.cost,
                  exact.cost > 0 ? 100.0 * (lagrangian.cost - exact.cost) / exact.cost : 0.0);
    out += buf;
  }
  return out;
}

}  // namespace qf
