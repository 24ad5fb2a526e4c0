#include "calibration/smoothing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"
#include "core/tensor.h"
#include "runtime/cpu/kernels.h"
#include "runtime/device_runtime.h"
#include "runtime/router_linears.h"

namespace qf {
namespace {

std::string layer_prefix(int64_t li) { return "model.layers." + std::to_string(li) + "."; }

std::shared_ptr<rt::Linear> dense_f32(const std::vector<float>& w, int64_t rows, int64_t cols,
                                      const std::vector<float>& bias, const std::string& name) {
  const std::optional<Tensor> b = rt::bias_tensor(bias);
  return rt::make_dense_linear(Tensor::from_f32(w, {rows, cols}), b ? &*b : nullptr, name);
}

// A balance Linear of a mapping: its slot in the layer and its module name.
struct BalanceLinear {
  std::shared_ptr<rt::Linear>* lin;
  std::string name;
};

// The Linears a mapping balances (their input columns take s) and, for
// VToO and UpToDown, the one before them (its output rows take 1 / s). In a
// sparse layer the MLP mappings reach the router, the shared-expert gate and
// the experts (UpToDown: one expert's, `expert`).
std::vector<BalanceLinear> balance_slots(const ModelConfig& c, rt::LayerWeights& L, int64_t li, Mapping m,
                                         int64_t expert) {
  const std::string p = layer_prefix(li);
  if (L.sparse() && (m == Mapping::FfnNormToGateUp || m == Mapping::UpToDown)) {
    std::vector<BalanceLinear> r;
    if (m == Mapping::FfnNormToGateUp)
      for (const rt::RouterLinear& rl : rt::router_linears(c, li)) r.push_back({&(L.moe.*rl.member), p + rl.name});
    for (const rt::LayerLinearId& id : rt::layer_linears(c, li)) {
      if (id.expert == rt::kNoExpert) continue;
      const bool take = m == Mapping::FfnNormToGateUp
                            ? id.slot == rt::LinearObserver::Gate || id.slot == rt::LinearObserver::Up
                            : id.slot == rt::LinearObserver::Down && id.expert == expert;
      if (take) r.push_back({&rt::layer_linear(L, id), p + id.name});
    }
    return r;
  }
  switch (m) {
    case Mapping::AttnNormToQKV:
      return {{&L.q, p + "self_attn.q_proj"}, {&L.k, p + "self_attn.k_proj"}, {&L.v, p + "self_attn.v_proj"}};
    case Mapping::VToO: return {{&L.o, p + "self_attn.o_proj"}};
    case Mapping::FfnNormToGateUp: return {{&L.gate, p + "mlp.gate_proj"}, {&L.up, p + "mlp.up_proj"}};
    case Mapping::UpToDown: return {{&L.down, p + "mlp.down_proj"}};
  }
  return {};
}

// The Linear before a Linear -> Linear mapping: v_proj, up_proj or an expert's up.
BalanceLinear previous_slot(const ModelConfig& c, rt::LayerWeights& L, int64_t li, Mapping m, int64_t expert) {
  const std::string p = layer_prefix(li);
  if (m == Mapping::VToO) return {&L.v, p + "self_attn.v_proj"};
  if (!L.sparse()) return {&L.up, p + "mlp.up_proj"};
  for (const rt::LayerLinearId& id : rt::layer_linears(c, li))
    if (id.expert == expert && id.slot == rt::LinearObserver::Up) return {&rt::layer_linear(L, id), p + id.name};
  throw Error(ErrorKind::Internal, "previous_slot: no up projection of expert " + std::to_string(expert));
}

// A sparse layer's experts in forward order (the shared expert last).
std::vector<int64_t> layer_experts(const ModelConfig& c) {
  std::vector<int64_t> e;
  for (int64_t i = 0; i < c.num_experts; ++i) e.push_back(i);
  if (c.shared_expert_intermediate_size > 0) e.push_back(rt::kSharedExpert);
  return e;
}

std::string expert_label(int64_t e) { return e == rt::kSharedExpert ? "shared expert" : "expert " + std::to_string(e); }

// ---- calibration batches ----------------------------------------------------

// The calibration sequences split into batches of whole sequences (about
// kBatchTokens tokens each), with the layer inputs of all tokens concatenated.
constexpr int64_t kBatchTokens = 2048;

struct CalibSet {
  std::vector<rt::Batch> batches;
  std::vector<int64_t> offset;  // first token of each batch
  int64_t n = 0;                // tokens in all
  std::vector<float> x;         // [n, hidden] layer inputs
};

CalibSet make_calib_set(const rt::Model& model, const LayerCalib& calib) {
  if (!calib.samples || calib.samples->empty()) throw invalid_input("smoothing", "no calibration samples");
  if (!calib.input) throw invalid_input("smoothing", "no layer input function");
  const int64_t h = model.config().hidden_size;
  CalibSet cs;
  for (size_t s = 0; s < calib.samples->size(); ++s) {
    const auto& toks = (*calib.samples)[s];
    const int64_t len = static_cast<int64_t>(toks.size());
    if (cs.batches.empty() || static_cast<int64_t>(cs.batches.back().size()) + len > kBatchTokens) {
      cs.batches.emplace_back();
      cs.offset.push_back(cs.n);
    }
    rt::Batch& b = cs.batches.back();
    int32_t seq = 0;
    if (!b.seq.empty()) seq = b.seq.back() + 1;
    for (int64_t j = 0; j < len; ++j) b.add(toks[static_cast<size_t>(j)], seq, j, false);
    std::vector<float> xi = calib.input(s);
    if (static_cast<int64_t>(xi.size()) != len * h)
      throw invalid_input("smoothing", "layer input of sample " + std::to_string(s) + " has " +
                                           std::to_string(xi.size()) + " values, expected " + std::to_string(len * h));
    cs.x.insert(cs.x.end(), xi.begin(), xi.end());
    cs.n += len;
  }
  return cs;
}

// A cache holding the K/V of one batch.
rt::KvCache batch_cache(const rt::Model& model, const rt::Batch& b) {
  int64_t seqs = b.seq.empty() ? 0 : b.seq.back() + 1;
  std::vector<int64_t> len(static_cast<size_t>(seqs), 0);
  for (size_t t = 0; t < b.size(); ++t) len[static_cast<size_t>(b.seq[t])] = b.pos[t] + 1;
  int64_t blocks_tokens = 0;
  for (int64_t l : len) blocks_tokens += (l + 15) / 16 * 16;
  rt::KvCache cache = model.make_cache(rt::KvDType::F16, blocks_tokens, 16);
  for (int64_t s = 0; s < seqs; ++s) {
    const int32_t id = cache.add_sequence();
    cache.reserve(id, len[static_cast<size_t>(s)]);
  }
  return cache;
}

// Sees the inputs of a layer's Linears over all batches: per-channel mean and
// max of |x| for the q, o, gate and down inputs, and (when asked) the rows
// themselves, every `step`-th token. In a sparse layer the MLP input (what
// the router and every expert read) counts as the gate input, and the
// router's choices are kept (expert_rows gathers an expert's inputs).
class Capture final : public rt::LinearObserver {
 public:
  struct Stat {
    std::vector<double> abs_sum, abs_max;
    std::vector<float> rows;  // kept rows, [kept, in]
    int64_t in = 0, count = 0;
  };
  // keep: the slots whose rows are kept (Q, O, Gate, Down).
  Capture(std::vector<Slot> keep, int64_t step) : keep_(std::move(keep)), step_(std::max<int64_t>(1, step)) {}
  void observe(int64_t, Slot slot, const float* x, int64_t n, int64_t in) override {
    if (slot == LmHead || input_of(slot) != slot) return;
    Stat* st = slot == Q ? &q : slot == O ? &o : slot == Gate ? &gate : &down;
    add(*st, x, n, in, kept(slot) ? step_ : 0, offset);
  }
  void observe_moe_input(int64_t, const float* xn, int64_t n, int64_t hidden) override {
    add(gate, xn, n, hidden, kept(Gate) ? step_ : 0, offset);
  }
  void observe_routing(int64_t, const int32_t* experts, const float*, int64_t n, int64_t k) override {
    routing.insert(routing.end(), experts, experts + n * k);  // batches come in token order
  }
  // Adds n rows; keep_step > 0 keeps the rows of every keep_step-th token
  // (global index), -1 keeps them all, 0 none.
  static void add(Stat& st, const float* x, int64_t n, int64_t in, int64_t keep_step, int64_t offset = 0) {
    if (st.in == 0) st.in = in, st.abs_sum.assign(static_cast<size_t>(in), 0.0), st.abs_max.assign(static_cast<size_t>(in), 0.0);
    for (int64_t t = 0; t < n; ++t) {
      const float* r = x + t * in;
      for (int64_t j = 0; j < in; ++j) {
        const double a = std::fabs(static_cast<double>(r[j]));
        st.abs_sum[static_cast<size_t>(j)] += a;
        st.abs_max[static_cast<size_t>(j)] = std::max(st.abs_max[static_cast<size_t>(j)], a);
      }
      if (keep_step < 0 || (keep_step > 0 && (offset + t) % keep_step == 0)) st.rows.insert(st.rows.end(), r, r + in);
    }
    st.count += n;
  }
  int64_t offset = 0;  // global index of the batch's first token
  Stat q, o, gate, down;
  std::vector<int32_t> routing;  // sparse layers: every token's k experts, in token order

 private:
  bool kept(Slot s) const { return std::find(keep_.begin(), keep_.end(), s) != keep_.end(); }
  std::vector<Slot> keep_;
  int64_t step_;
};

// Runs the layer's two blocks on every batch: attn_out = attention_block(x),
// mlp_in = ffn_norm(x + attn_out), mlp_out = mlp_block(mlp_in), all [n, hidden].
struct LayerRun {
  std::vector<float> attn_out, mlp_in, mlp_out;
};

LayerRun run_blocks(const rt::Model& model, int64_t li, const CalibSet& cs, ThreadPool& pool, Capture* cap) {
  const int64_t h = model.config().hidden_size;
  LayerRun r;
  r.attn_out.resize(static_cast<size_t>(cs.n * h)), r.mlp_in.resize(r.attn_out.size()), r.mlp_out.resize(r.attn_out.size());
  std::vector<float> res;
  for (size_t bi = 0; bi < cs.batches.size(); ++bi) {
    const rt::Batch& b = cs.batches[bi];
    const int64_t off = cs.offset[bi], n = static_cast<int64_t>(b.size());
    if (cap) cap->offset = off;
    rt::KvCache cache = batch_cache(model, b);
    const float* x = cs.x.data() + off * h;
    float* a = r.attn_out.data() + off * h;
    model.attention_block(li, b, x, a, cache, pool, cap);
    res.resize(static_cast<size_t>(n * h));
    for (int64_t i = 0; i < n * h; ++i) res[static_cast<size_t>(i)] = x[i] + a[i];
    model.ffn_norm(li, res.data(), n, r.mlp_in.data() + off * h);
    model.mlp_block(li, r.mlp_in.data() + off * h, n, r.mlp_out.data() + off * h, pool, cap);
  }
  return r;
}

// Attention block outputs only.
std::vector<float> run_attention(const rt::Model& model, int64_t li, const CalibSet& cs, ThreadPool& pool) {
  const int64_t h = model.config().hidden_size;
  std::vector<float> out(static_cast<size_t>(cs.n * h));
  for (size_t bi = 0; bi < cs.batches.size(); ++bi) {
    rt::KvCache cache = batch_cache(model, cs.batches[bi]);
    model.attention_block(li, cs.batches[bi], cs.x.data() + cs.offset[bi] * h, out.data() + cs.offset[bi] * h, cache,
                          pool);
  }
  return out;
}

// The whole decoder layer (with residuals) on every batch.
std::vector<float> run_layer(const rt::Model& model, int64_t li, const CalibSet& cs, ThreadPool& pool) {
  const int64_t h = model.config().hidden_size;
  std::vector<float> x = cs.x;
  for (size_t bi = 0; bi < cs.batches.size(); ++bi) {
    rt::KvCache cache = batch_cache(model, cs.batches[bi]);
    model.forward_layer(li, cs.batches[bi], x.data() + cs.offset[bi] * h, cache, pool);
  }
  return x;
}

// The inputs of one expert of sparse layer li: the MLP-input rows it reads
// (the tokens the router sent to it, in token order; every token for the
// shared expert or with `all`) and its down projection's input for them.
struct ExpertRows {
  std::vector<float> in, down_in;  // [n, hidden], [n, width]
  int64_t n = 0, width = 0;        // width: the expert's intermediate size
};

// Routed expert e of a sparse layer's MoeWeights (const or not), or its shared expert.
template <typename Moe>
auto& expert_of(Moe& moe, int64_t e) {
  return e == rt::kSharedExpert ? moe.shared : moe.experts[static_cast<size_t>(e)];
}

ExpertRows expert_rows(const rt::Model& model, int64_t li, int64_t e, const std::vector<float>& mlp_in,
                       const std::vector<int32_t>& routing, bool all, ThreadPool& pool) {
  const ModelConfig& c = model.config();
  const rt::ExpertWeights& ew = expert_of(model.weights().layers[static_cast<size_t>(li)].moe, e);
  const int64_t h = c.hidden_size, k = c.num_experts_per_tok, tokens = static_cast<int64_t>(mlp_in.size()) / h;
  if (!all && e != rt::kSharedExpert && static_cast<int64_t>(routing.size()) != tokens * k)
    throw Error(ErrorKind::Internal, "expert_rows: the routing of " + std::to_string(routing.size() / static_cast<size_t>(k)) +
                                         " tokens for " + std::to_string(tokens) + " inputs");
  ExpertRows r;
  for (int64_t t = 0; t < tokens; ++t) {
    bool take = all || e == rt::kSharedExpert;
    for (int64_t j = 0; j < k && !take; ++j) take = routing[static_cast<size_t>(t * k + j)] == e;
    if (!take) continue;
    r.in.insert(r.in.end(), mlp_in.begin() + t * h, mlp_in.begin() + (t + 1) * h);
    ++r.n;
  }
  const int64_t ff = ew.gate->out_features();
  r.width = ff;
  r.down_in.resize(static_cast<size_t>(r.n * ff));
  if (r.n == 0) return r;
  std::vector<float> u(r.down_in.size());
  ew.gate->forward(r.in.data(), r.n, r.down_in.data(), pool);
  ew.up->forward(r.in.data(), r.n, u.data(), pool);
  for (int64_t t = 0; t < r.n; ++t) rt::swiglu(r.down_in.data() + t * ff, u.data() + t * ff, ff);
  return r;
}

// Per-channel mean of |x| over the rows a Stat saw.
std::vector<double> mean_abs(const Capture::Stat& st) {
  std::vector<double> m(st.abs_sum.size());
  for (size_t j = 0; j < m.size(); ++j) m[j] = st.abs_sum[j] / static_cast<double>(st.count);
  return m;
}

// Every `step`-th of n rows of width `in` (the clip search's samples).
std::vector<float> every_nth_row(const std::vector<float>& rows, int64_t in, int64_t step) {
  std::vector<float> out;
  const int64_t n = static_cast<int64_t>(rows.size()) / in;
  for (int64_t t = 0; t < n; t += step) out.insert(out.end(), rows.begin() + t * in, rows.begin() + (t + 1) * in);
  return out;
}

double mse(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    s += d * d;
  }
  return a.empty() ? 0.0 : s / static_cast<double>(a.size());
}

std::string fmt(const char* f, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a, b, c);
  return buf;
}

int64_t group_cols(int64_t group_size, int64_t cols, const std::string& name) {
  if (group_size <= 0 || group_size >= cols) return cols;
  if (cols % group_size != 0)
    throw invalid_input(name, "group size " + std::to_string(group_size) + " does not divide " + std::to_string(cols) +
                                  " input columns");
  return group_size;
}

// ---- AWQ --------------------------------------------------------------------

struct Balance {
  BalanceLinear target;
  std::vector<float> w, bias;  // the float weight of the search's starting point
  int64_t rows = 0, cols = 0;
  bool quantized = false;
};

// The inspected module's loss (mean squared difference from its float
// output) for the current state of the layer.
using LossFn = std::function<double()>;

SmoothingReport::Entry search_mapping(rt::Model& model, int64_t li, Mapping m, int64_t expert,
                                      const std::vector<double>& x_mean, const FakeQuantFn& fake_quant,
                                      const AwqOptions& o, const LossFn& module_loss, ThreadPool& pool) {
  rt::LayerWeights& L = model.mutable_layer(li);
  std::vector<Balance> bal;
  for (const BalanceLinear& s : balance_slots(model.config(), L, li, m, expert)) {
    Balance b{s, (*s.lin)->decode_all(), (*s.lin)->bias_values(), (*s.lin)->out_features(), (*s.lin)->in_features(), false};
    bal.push_back(std::move(b));
  }
  const int64_t width = bal.front().cols;
  if (static_cast<int64_t>(x_mean.size()) != width)
    throw Error(ErrorKind::Internal, "search_mapping: " + std::to_string(x_mean.size()) + " input means for " +
                                         std::to_string(width) + " columns");
  std::vector<std::shared_ptr<rt::Linear>> saved;
  for (const Balance& b : bal) saved.push_back(*b.target.lin);

  // Loss with the balance Linears replaced by fake_quant(W * s) / s (s empty: s = 1).
  auto loss = [&](const std::vector<float>& s, bool first) {
    for (Balance& b : bal) {
      std::vector<float> ws = b.w;
      if (!s.empty())
        for (int64_t r = 0; r < b.rows; ++r)
          for (int64_t j = 0; j < b.cols; ++j) ws[static_cast<size_t>(r * b.cols + j)] *= s[static_cast<size_t>(j)];
      std::vector<float> q = fake_quant(b.target.name, ws.data(), b.rows, b.cols);
      if (first) b.quantized = !q.empty();
      if (q.empty()) {
        *b.target.lin = saved[static_cast<size_t>(&b - bal.data())];
        continue;
      }
      if (static_cast<int64_t>(q.size()) != b.rows * b.cols)
        throw invalid_input(b.target.name, "fake quantizer returned " + std::to_string(q.size()) + " values, expected " +
                                             std::to_string(b.rows * b.cols));
      if (!s.empty())
        for (int64_t r = 0; r < b.rows; ++r)
          for (int64_t j = 0; j < b.cols; ++j) q[static_cast<size_t>(r * b.cols + j)] /= s[static_cast<size_t>(j)];
      *b.target.lin = dense_f32(q, b.rows, b.cols, b.bias, b.target.name);
    }
    const double l = module_loss();
    for (size_t i = 0; i < bal.size(); ++i) *bal[i].target.lin = saved[i];
    return l;
  };

  SmoothingReport::Entry e;
  e.what = expert != rt::kNoExpert                           ? expert_label(expert) + " " + mapping_name(m)
           : L.sparse() && m == Mapping::FfnNormToGateUp ? "post_attention_layernorm->router,experts' gate,up"
                                                          : mapping_name(m);
  e.loss_before = loss({}, true);
  bool any = false;
  for (const Balance& b : bal) any = any || b.quantized;
  if (!any) {
    e.loss_after = e.loss_before;
    return e;
  }
  // w_mean: |W| normalised by its group's max, averaged over all balance rows.
  std::vector<double> w_mean(static_cast<size_t>(width), 0.0);
  int64_t total_rows = 0;
  for (const Balance& b : bal) {
    const int64_t g = group_cols(o.group_size, b.cols, b.target.name);
    for (int64_t r = 0; r < b.rows; ++r)
      for (int64_t g0 = 0; g0 < b.cols; g0 += g) {
        const float* wr = b.w.data() + r * b.cols + g0;
        float amax = 0;
        for (int64_t j = 0; j < g; ++j) amax = std::max(amax, std::fabs(wr[j]));
        for (int64_t j = 0; j < g; ++j)
          w_mean[static_cast<size_t>(g0 + j)] += std::fabs(wr[j]) / (static_cast<double>(amax) + 1e-6);
      }
    total_rows += b.rows;
  }
  for (double& v : w_mean) v /= static_cast<double>(total_rows);

  double best = o.include_identity ? e.loss_before : std::numeric_limits<double>::infinity();
  std::vector<float> best_s;
  for (int i = 0; i < o.n_grid; ++i) {
    const double r = static_cast<double>(i) / o.n_grid;
    std::vector<double> sd(static_cast<size_t>(width));
    for (int64_t j = 0; j < width; ++j) {
      const double xm = x_mean[static_cast<size_t>(j)];
      double v = o.duo_scaling ? std::pow(xm, r) / (std::pow(w_mean[static_cast<size_t>(j)], 1.0 - r) + 1e-4)
                               : std::pow(xm, r);
      sd[static_cast<size_t>(j)] = std::max(v, 1e-4);
    }
    const double mx = *std::max_element(sd.begin(), sd.end()), mn = *std::min_element(sd.begin(), sd.end());
    const double norm = std::sqrt(mx * mn);
    std::vector<float> s(static_cast<size_t>(width));
    for (int64_t j = 0; j < width; ++j) {
      const float v = static_cast<float>(sd[static_cast<size_t>(j)] / norm);
      s[static_cast<size_t>(j)] = std::isfinite(v) && v > 0 ? v : 1.0f;
    }
    const double l = loss(s, false);
    if (l < best) best = l, best_s = std::move(s), e.ratio = r;
  }
  e.loss_after = best;
  if (!best_s.empty()) apply_smoothing_scales(model, li, m, best_s, expert);
  (void)pool;
  return e;
}

// AutoAWQ's _compute_best_clip for one Linear: the per-(row, group) clamp
// max_val = amax * (1 - i / n_grid) minimising the mean over the sampled
// tokens of the squared change of the group's partial dot product.
// The squared partial products' means err[r * ng + k] of a weight change
// d [rows, cols] over the sampled tokens, computed elsewhere (the device).
using ClipErrFn = std::function<std::vector<double>(const std::vector<float>& d)>;

// xs: the sampled tokens' input rows [T, cols] for the CPU; with `device_err`
// they stay where device_err reads them and T is given.
bool clip_linear(std::shared_ptr<rt::Linear>& lin, const std::string& name, const std::vector<float>& xs, int64_t T,
                 const FakeQuantFn& fake_quant, const AwqOptions& o, ThreadPool& pool, double* mean_shrink,
                 const ClipErrFn& device_err = {}) {
  const int64_t rows = lin->out_features(), cols = lin->in_features();
  if (!device_err) T = static_cast<int64_t>(xs.size()) / cols;
  if (T == 0) return false;
  const int64_t g = group_cols(o.group_size, cols, name), ng = cols / g;
  const std::vector<float> w = lin->decode_all();
  std::vector<float> amax(static_cast<size_t>(rows * ng), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < ng; ++k) {
      float a = 0;
      for (int64_t j = 0; j < g; ++j) a = std::max(a, std::fabs(w[static_cast<size_t>(r * cols + k * g + j)]));
      amax[static_cast<size_t>(r * ng + k)] = a;
    }
  std::vector<float> best_max = amax;
  std::vector<double> min_err(amax.size(), std::numeric_limits<double>::infinity());
  const int64_t steps = static_cast<int64_t>(o.clip_max_shrink * static_cast<double>(o.clip_n_grid));
  std::vector<float> wc(w.size());
  for (int64_t i_s = 0; i_s < steps; ++i_s) {
    const float f = 1.0f - static_cast<float>(i_s) / static_cast<float>(o.clip_n_grid);
    std::vector<float> maxv(amax.size());
    for (size_t i = 0; i < amax.size(); ++i) maxv[i] = amax[i] * f;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const float m = maxv[static_cast<size_t>(r * ng + c / g)];
        wc[static_cast<size_t>(r * cols + c)] = std::clamp(w[static_cast<size_t>(r * cols + c)], -m, m);
      }
    std::vector<float> q = fake_quant(name, wc.data(), rows, cols);
    if (q.empty()) return false;  // not quantized: nothing to clip for
    if (static_cast<int64_t>(q.size()) != rows * cols)
      throw invalid_input(name, "fake quantizer returned " + std::to_string(q.size()) + " values");
    if (device_err) {
      std::vector<float> d(q.size());
      for (size_t i = 0; i < d.size(); ++i) d[i] = q[i] - w[i];
      const std::vector<double> err = device_err(d);
      for (size_t i = 0; i < amax.size(); ++i)
        if (err[i] < min_err[i]) min_err[i] = err[i], best_max[i] = maxv[i];
      continue;
    }
    pool.parallel_for(rows, 4, [&](const Chunk& ch) {
      std::vector<float> d(static_cast<size_t>(cols));
      std::vector<double> err(static_cast<size_t>(ng));
      for (int64_t r = ch.begin; r < ch.end; ++r) {
        for (int64_t c = 0; c < cols; ++c)
          d[static_cast<size_t>(c)] = q[static_cast<size_t>(r * cols + c)] - w[static_cast<size_t>(r * cols + c)];
        std::fill(err.begin(), err.end(), 0.0);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t k = 0; k < ng; ++k) {
            const double p = rt::dot_f32(xs.data() + t * cols + k * g, d.data() + k * g, g);
            err[static_cast<size_t>(k)] += p * p;
          }
        for (int64_t k = 0; k < ng; ++k) {
          const double e = err[static_cast<size_t>(k)] / static_cast<double>(T);
          const size_t i = static_cast<size_t>(r * ng + k);
          if (e < min_err[i]) min_err[i] = e, best_max[i] = maxv[i];
        }
      }
    });
  }
  std::vector<float> wn = w;
  double shrink = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float m = best_max[static_cast<size_t>(r * ng + c / g)];
      wn[static_cast<size_t>(r * cols + c)] = std::clamp(w[static_cast<size_t>(r * cols + c)], -m, m);
    }
  for (size_t i = 0; i < amax.size(); ++i) shrink += amax[i] > 0 ? best_max[i] / amax[i] : 1.0;
  *mean_shrink = shrink / static_cast<double>(amax.size());
  lin = dense_f32(wn, rows, cols, lin->bias_values(), name);
  return true;
}

}  // namespace

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

namespace {

// The layer's Linears (kLayerLinears indices) a mapping's search changes.
std::vector<int> balance_indices(Mapping m) {
  switch (m) {
    case Mapping::AttnNormToQKV: return {0, 1, 2};
    case Mapping::VToO: return {3};
    case Mapping::FfnNormToGateUp: return {4, 5};
    case Mapping::UpToDown: return {6};
  }
  return {};
}

// The device evaluation of a layer's smoothing searches, its inputs uploaded.
std::unique_ptr<rt::DeviceSmoothingEval> device_eval(device::Kind kind, const rt::Model& model,
                                                     const LayerCalib& calib, const CalibSet& cs, const char* what) {
  std::vector<int64_t> lengths;
  for (const auto& sm : *calib.samples) lengths.push_back(static_cast<int64_t>(sm.size()));
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  device::require_device_memory(kind, rt::device_smoothing_eval_bytes(model, cs.n, longest),
                                std::string(what) + " --device " + device::kind_name(kind));
  std::unique_ptr<rt::DeviceSmoothingEval> dev = rt::make_device_smoothing_eval(kind, model, longest);
  dev->set_inputs(lengths, cs.x.data());
  return dev;
}

}  // namespace

SmoothingReport awq_layer(rt::Model& model, int64_t li, const LayerCalib& calib, const FakeQuantFn& fake_quant,
                          const AwqOptions& o, ThreadPool& pool) {
  if (o.n_grid < 1) throw invalid_input("awq", "n_grid must be at least 1");
  const ModelConfig& c = model.config();
  if (o.device != device::Kind::Cpu && c.is_moe())
    throw unsupported("awq --device " + std::string(device::kind_name(o.device)),
                      "mixture-of-experts layers are smoothed on the CPU only");
  const CalibSet cs = make_calib_set(model, calib);
  const int64_t h = c.hidden_size;
  const bool sparse = model.weights().layers[static_cast<size_t>(li)].sparse();
  std::unique_ptr<rt::DeviceSmoothingEval> dev;
  if (o.device != device::Kind::Cpu) dev = device_eval(o.device, model, calib, cs, "awq");
  SmoothingReport rep;
  auto record = [&](SmoothingReport::Entry e) {
    rep.lines.push_back(layer_prefix(li) + e.what +
                        (e.ratio >= 0 ? fmt(": ratio %.2f", e.ratio) : std::string(": no scaling")) +
                        fmt(", loss %.6g -> %.6g", e.loss_before, e.loss_after));
    rep.entries.push_back(std::move(e));
  };
  for (Mapping m : {Mapping::AttnNormToQKV, Mapping::VToO, Mapping::FfnNormToGateUp, Mapping::UpToDown}) {
    if (!mapping_applies(model, m)) continue;
    if (sparse && m == Mapping::UpToDown) {
      // One search per expert, on the rows it reads, its down projection
      // alone inspected. Scaling one expert changes no other expert's
      // inputs, so one pass gives them all.
      Capture cap({}, 1);
      const LayerRun run = run_blocks(model, li, cs, pool, &cap);
      rt::LayerWeights& L = model.mutable_layer(li);
      for (int64_t e : layer_experts(c)) {
        const ExpertRows er = expert_rows(model, li, e, run.mlp_in, cap.routing, o.moe_calibrate_all_experts, pool);
        if (er.n == 0) {
          rep.lines.push_back(layer_prefix(li) + expert_label(e) + " " + mapping_name(m) +
                              ": no calibration token reaches it, not scaled");
          continue;
        }
        std::shared_ptr<rt::Linear>& down = expert_of(L.moe, e).down;
        Capture::Stat st;
        Capture::add(st, er.down_in.data(), er.n, er.width, 0);
        std::vector<float> ref(static_cast<size_t>(er.n * h));
        down->forward(er.down_in.data(), er.n, ref.data(), pool);
        // `down` is the layer's slot: each candidate's replacement is the one run.
        const LossFn loss = [&] {
          std::vector<float> out(ref.size());
          down->forward(er.down_in.data(), er.n, out.data(), pool);
          return mse(out, ref);
        };
        record(search_mapping(model, li, m, e, mean_abs(st), fake_quant, o, loss, pool));
      }
      continue;
    }
    const rt::LayerInput input = m == Mapping::AttnNormToQKV ? rt::LayerInput::Attention
                                 : m == Mapping::VToO        ? rt::LayerInput::O
                                 : m == Mapping::FfnNormToGateUp ? rt::LayerInput::Mlp
                                                                 : rt::LayerInput::Down;
    // Statistics and module inputs of the layer as the previous mappings
    // left it, and the inspected module's loss for a candidate: on the
    // device (statistics and reference outputs stay there; each candidate
    // re-uploads the Linears it changed and costs one block's forward), or
    // on the CPU, where o_proj and down_proj are inspected alone on their
    // inputs, kept whole.
    std::vector<double> x_mean;
    LossFn loss;
    Capture cap(m == Mapping::VToO       ? std::vector<rt::LinearObserver::Slot>{rt::LinearObserver::O}
                : m == Mapping::UpToDown ? std::vector<rt::LinearObserver::Slot>{rt::LinearObserver::Down}
                                         : std::vector<rt::LinearObserver::Slot>{},
                1);
    LayerRun run;
    const std::vector<float>& lin_in = m == Mapping::VToO ? cap.o.rows : cap.down.rows;
    const rt::LayerWeights& L = model.mutable_layer(li);
    if (dev) {
      dev->load(li);
      dev->run_reference();
      const std::vector<double> sum = dev->abs_sum(input);
      x_mean.resize(sum.size());
      for (size_t j = 0; j < x_mean.size(); ++j) x_mean[j] = sum[j] / static_cast<double>(dev->tokens());
      const rt::SmoothingBlock block = m == Mapping::AttnNormToQKV ? rt::SmoothingBlock::Attention
                                       : m == Mapping::VToO        ? rt::SmoothingBlock::O
                                       : m == Mapping::FfnNormToGateUp ? rt::SmoothingBlock::Mlp
                                                                       : rt::SmoothingBlock::Down;
      loss = [&, m, block] {
        for (int index : balance_indices(m)) dev->load_linear(index);
        return dev->loss(block);
      };
    } else {
      run = run_blocks(model, li, cs, pool, &cap);
      const Capture::Stat& st = m == Mapping::AttnNormToQKV     ? cap.q
                                : m == Mapping::VToO            ? cap.o
                                : m == Mapping::FfnNormToGateUp ? cap.gate
                                                                : cap.down;
      x_mean = mean_abs(st);
      switch (m) {
        case Mapping::AttnNormToQKV:
          loss = [&] { return mse(run_attention(model, li, cs, pool), run.attn_out); };
          break;
        case Mapping::VToO:
        case Mapping::UpToDown:  // the scaled Linear alone on its captured input, against the block's output
          // `last` refers to the layer's slot, so each candidate's replacement Linear is the one run.
          loss = [&, &last = m == Mapping::VToO ? L.o : L.down, &ref = m == Mapping::VToO ? run.attn_out : run.mlp_out] {
            std::vector<float> out(static_cast<size_t>(cs.n * h));
            last->forward(lin_in.data(), cs.n, out.data(), pool);
            return mse(out, ref);
          };
          break;
        case Mapping::FfnNormToGateUp:
          loss = [&] {
            std::vector<float> out(static_cast<size_t>(cs.n * h));
            for (size_t bi = 0; bi < cs.batches.size(); ++bi)
              model.mlp_block(li, run.mlp_in.data() + cs.offset[bi] * h, static_cast<int64_t>(cs.batches[bi].size()),
                              out.data() + cs.offset[bi] * h, pool);
            return mse(out, run.mlp_out);
          };
          break;
      }
    }
    record(search_mapping(model, li, m, rt::kNoExpert, x_mean, fake_quant, o, loss, pool));
  }
  if (o.apply_clip) {
    const int64_t step = std::max<int64_t>(1, cs.n / std::max<int64_t>(1, o.clip_n_sample_tokens));
    const int64_t T = (cs.n + step - 1) / step;  // tokens 0, step, 2 step, ...
    // The sampled inputs of the scaled layer: every step-th token's row, on
    // the CPU or kept on the device, where the clip errors are computed.
    // (A sparse layer's experts take their rows from expert_rows below.)
    Capture cap(sparse ? std::vector<rt::LinearObserver::Slot>{rt::LinearObserver::Q, rt::LinearObserver::O}
                       : std::vector<rt::LinearObserver::Slot>{rt::LinearObserver::Q, rt::LinearObserver::O,
                                                               rt::LinearObserver::Gate, rt::LinearObserver::Down},
                step);
    LayerRun run;
    if (dev) {
      dev->load(li);
      dev->run_reference();
    } else {
      run = run_blocks(model, li, cs, pool, &cap);
    }
    rt::LayerWeights& L = model.mutable_layer(li);
    const std::string p = layer_prefix(li);
    struct ClipSlot {
      std::shared_ptr<rt::Linear>* lin;
      std::string name;
      const std::vector<float>* in;
      rt::LayerInput input;
    };
    std::vector<ClipSlot> slots = {{&L.v, p + "self_attn.v_proj", &cap.q.rows, rt::LayerInput::Attention},
                                   {&L.o, p + "self_attn.o_proj", &cap.o.rows, rt::LayerInput::O}};
    if (!sparse) {
      slots.push_back({&L.gate, p + "mlp.gate_proj", &cap.gate.rows, rt::LayerInput::Mlp});
      slots.push_back({&L.up, p + "mlp.up_proj", &cap.gate.rows, rt::LayerInput::Mlp});
      slots.push_back({&L.down, p + "mlp.down_proj", &cap.down.rows, rt::LayerInput::Down});
    }
    // Sparse layers: each expert's Linears on samples of the rows it reads
    // (every n / clip_n_sample_tokens-th), all taken before any is clipped.
    std::vector<std::vector<float>> expert_samples;
    if (sparse) {
      const std::vector<int64_t> experts = layer_experts(c);
      expert_samples.reserve(2 * experts.size());
      for (int64_t e : experts) {
        const ExpertRows er = expert_rows(model, li, e, run.mlp_in, cap.routing, o.moe_calibrate_all_experts, pool);
        const int64_t es = std::max<int64_t>(1, er.n / std::max<int64_t>(1, o.clip_n_sample_tokens));
        expert_samples.push_back(every_nth_row(er.in, h, es));
        expert_samples.push_back(every_nth_row(er.down_in, er.width, es));
        const std::vector<float>* in = &expert_samples[expert_samples.size() - 2];
        const std::vector<float>* down_in = &expert_samples.back();
        for (const rt::LayerLinearId& id : rt::layer_linears(c, li))
          if (id.expert == e)
            slots.push_back({&rt::layer_linear(L, id), p + id.name, id.slot == rt::LinearObserver::Down ? down_in : in,
                             rt::LayerInput::Mlp});
      }
    }
    for (const ClipSlot& cl : slots) {
      double shrink = 1;
      ClipErrFn device_err;
      if (dev) {
        const rt::Linear& lin = **cl.lin;
        const int64_t rows = lin.out_features(), cols = lin.in_features(), g = group_cols(o.group_size, cols, cl.name);
        device_err = [&, rows, cols, g](const std::vector<float>& d) {
          return dev->clip_errors(cl.input, step, d.data(), rows, cols, g);
        };
      }
      if (clip_linear(*cl.lin, cl.name, *cl.in, T, fake_quant, o, pool, &shrink, device_err))
        rep.lines.push_back(cl.name + fmt(": clip, mean max_val / amax %.4f", shrink));
    }
  }
  return rep;
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
