// AWQ (calibration/smoothing.h, awq_layer): the scale search of each
// mapping and the clip search; docs/smoothing.md describes both.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "calibration/smoothing_internal.h"
#include "core/error.h"
#include "runtime/cpu/kernels.h"

namespace qf {
using namespace smoothing_detail;
namespace {

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

// How a mapping scores its candidates: by running the inspected module with
// the candidate weights in the layer's slots (`module`), or from the Gram
// matrix G = sum_x x x^T of the balance Linears' common input over `tokens`
// calibration rows: the sum over the balance Linears of |dW x|^2 over every
// input x (gram_quadratic), per output element, which is the mean squared
// change of their outputs without running them. For a Linear inspected
// alone (v_proj -> o_proj, up_proj -> down_proj) the two are the same
// number up to rounding.
struct CandidateLoss {
  LossFn module;
  const std::vector<float>* gram = nullptr;
  int64_t tokens = 0;
};

// `applied` (when given) receives the scales folded into the layer (empty:
// none, the identity won or nothing is quantized).
SmoothingReport::Entry search_mapping(rt::Model& model, int64_t li, Mapping m, int64_t expert,
                                      const std::vector<double>& x_mean, const FakeQuantFn& fake_quant,
                                      const AwqOptions& o, const CandidateLoss& scoring, ThreadPool& pool,
                                      std::vector<float>* applied = nullptr) {
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
    double gram_sum = 0;
    int64_t gram_rows = 0;
    for (Balance& b : bal) {
      std::vector<float> ws = b.w;
      if (!s.empty())
        for (int64_t r = 0; r < b.rows; ++r)
          for (int64_t j = 0; j < b.cols; ++j) ws[static_cast<size_t>(r * b.cols + j)] *= s[static_cast<size_t>(j)];
      std::vector<float> q = fake_quant(b.target.name, ws.data(), b.rows, b.cols);
      if (first) b.quantized = !q.empty();
      gram_rows += b.rows;
      if (q.empty()) {
        *b.target.lin = saved[static_cast<size_t>(&b - bal.data())];
        continue;  // unquantized: its outputs do not change
      }
      if (static_cast<int64_t>(q.size()) != b.rows * b.cols)
        throw invalid_input(b.target.name, "fake quantizer returned " + std::to_string(q.size()) + " values, expected " +
                                             std::to_string(b.rows * b.cols));
      if (!s.empty())
        for (int64_t r = 0; r < b.rows; ++r)
          for (int64_t j = 0; j < b.cols; ++j) q[static_cast<size_t>(r * b.cols + j)] /= s[static_cast<size_t>(j)];
      if (scoring.gram) {
        for (size_t i = 0; i < q.size(); ++i) q[i] -= b.w[i];  // the weight change
        gram_sum += gram_quadratic(q.data(), b.rows, b.cols, scoring.gram->data(), pool);
        continue;
      }
      *b.target.lin = dense_f32(q, b.rows, b.cols, b.bias, b.target.name);
    }
    if (scoring.gram)
      return gram_rows > 0 && scoring.tokens > 0
                 ? gram_sum / (static_cast<double>(gram_rows) * static_cast<double>(scoring.tokens))
                 : 0.0;
    const double l = scoring.module();
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
  if (applied) *applied = best_s;
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
  // On the CPU the mean over the samples of (x_k . d_k)^2 of group k is
  // d_k^T G_k d_k / T with G_k = sum_t x_k x_k^T, the group's g x g block
  // of the samples' Gram matrix: made once, then each shrink step costs one
  // product per group instead of one per sampled token.
  std::vector<float> gk;
  if (!device_err) {
    gk.resize(static_cast<size_t>(ng * g * g));
    pool.parallel_for(ng, 1, [&](const Chunk& ch) {
      std::vector<float> xt(static_cast<size_t>(g * T));  // the group's columns of the samples, transposed
      for (int64_t k = ch.begin; k < ch.end; ++k) {
        for (int64_t t = 0; t < T; ++t)
          for (int64_t j = 0; j < g; ++j) xt[static_cast<size_t>(j * T + t)] = xs[static_cast<size_t>(t * cols + k * g + j)];
        rt::gemm_tile_f32(xt.data(), g, T, xt.data(), g, T, gk.data() + k * g * g, g);
      }
    });
  }
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
    for (size_t i = 0; i < q.size(); ++i) q[i] -= w[i];  // d, the weight change
    constexpr int64_t kRows = 16;
    pool.parallel_for(rows, kRows, [&](const Chunk& ch) {
      const int64_t n = ch.end - ch.begin;
      std::vector<float> e(static_cast<size_t>(n * g));
      for (int64_t k = 0; k < ng; ++k) {
        const float* dk = q.data() + ch.begin * cols + k * g;
        rt::gemm_tile_f32(dk, n, cols, gk.data() + k * g * g, g, g, e.data(), g);  // d_k G_k (G_k symmetric)
        for (int64_t r = 0; r < n; ++r) {
          double quad = 0;
          for (int64_t j = 0; j < g; ++j) quad += static_cast<double>(e[static_cast<size_t>(r * g + j)]) * dk[r * cols + j];
          const double err = quad / static_cast<double>(T);
          const size_t i = static_cast<size_t>((ch.begin + r) * ng + k);
          if (err < min_err[i]) min_err[i] = err, best_max[i] = maxv[i];
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

namespace {

using Slot = rt::LinearObserver::Slot;
constexpr Slot kQ = rt::LinearObserver::Q, kO = rt::LinearObserver::O, kGate = rt::LinearObserver::Gate,
               kDown = rt::LinearObserver::Down;
constexpr Mapping kMappings[] = {Mapping::AttnNormToQKV, Mapping::VToO, Mapping::FfnNormToGateUp, Mapping::UpToDown};

// Adds a search's line and entry to the report.
void record(SmoothingReport& rep, int64_t li, SmoothingReport::Entry e) {
  rep.lines.push_back(layer_prefix(li) + e.what +
                      (e.ratio >= 0 ? fmt(": ratio %.2f", e.ratio) : std::string(": no scaling")) +
                      fmt(", loss %.6g -> %.6g", e.loss_before, e.loss_after));
  rep.entries.push_back(std::move(e));
}

// Row-major rows of width s.size() divided column-wise by s (a fold's
// scales reaching inputs captured before it); nothing when s is empty.
void divide_columns(std::vector<float>& rows, const std::vector<float>& s) {
  if (s.empty()) return;
  const size_t w = s.size();
  for (size_t i = 0; i < rows.size(); ++i) rows[i] /= s[i % w];
}

// The clip search over a layer's Linears but q_proj and k_proj; `in` gives
// each slot's samples (on the CPU) and `device_err` (when set) computes the
// errors where the samples stay.
struct ClipSlot {
  std::shared_ptr<rt::Linear>* lin;
  std::string name;
  const std::vector<float>* in;
  rt::LayerInput input;
};

void clip_slots(const std::vector<ClipSlot>& slots, int64_t T, const FakeQuantFn& fake_quant, const AwqOptions& o,
                ThreadPool& pool, SmoothingReport& rep, rt::DeviceSmoothingEval* dev, int64_t step) {
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

// AWQ on the CPU: one pass over the calibration set gives every mapping's
// statistics, the inspected modules' reference outputs, the Gram matrices
// the Linear -> Linear mappings (with loss: linear, every mapping) score
// their candidates with, and the clip search's samples. The folds are exact
// in float arithmetic, so what the pass saw holds for the layer as each
// fold leaves it, but for the inputs a fold divides: the captured rows
// they reach (clip samples, an MoE layer's MLP inputs) are divided by the
// same scales.
SmoothingReport awq_layer_cpu(rt::Model& model, int64_t li, const CalibSet& cs, const FakeQuantFn& fake_quant,
                              const AwqOptions& o, ThreadPool& pool) {
  const ModelConfig& c = model.config();
  const int64_t h = c.hidden_size;
  const bool sparse = model.weights().layers[static_cast<size_t>(li)].sparse();
  const bool linear = o.loss.value_or(AwqLoss::Linear) == AwqLoss::Linear;
  const int64_t step = std::max<int64_t>(1, cs.n / std::max<int64_t>(1, o.clip_n_sample_tokens));
  std::vector<Slot> keep;
  if (o.apply_clip) keep = sparse ? std::vector<Slot>{kQ, kO} : std::vector<Slot>{kQ, kO, kGate, kDown};
  std::vector<Slot> grams;
  if (mapping_applies(model, Mapping::VToO)) grams.push_back(kO);
  if (!sparse) grams.push_back(kDown);
  if (linear) grams.push_back(kQ), grams.push_back(kGate);
  Capture cap(keep, step, grams, &pool);
  LayerRun run = run_blocks(model, li, cs, pool, &cap);
  cap.finish();

  SmoothingReport rep;
  std::vector<float> s_q, s_o, s_gate, s_down;  // the scales folded into each input so far
  for (Mapping m : kMappings) {
    if (!mapping_applies(model, m)) continue;
    if (sparse && m == Mapping::UpToDown) {
      // One search per expert, on the rows it reads (the MLP inputs as the
      // layer is now), its down projection alone, scored from the Gram
      // matrix of its input. Scaling one expert changes no other expert's
      // inputs, so the pass serves them all.
      divide_columns(run.mlp_in, s_gate);
      s_gate.clear();  // run.mlp_in is now the MLP input of the folded layer
      for (int64_t e : layer_experts(c)) {
        const ExpertRows er = expert_rows(model, li, e, run.mlp_in, cap.routing, o.moe_calibrate_all_experts, pool);
        if (er.n == 0) {
          rep.lines.push_back(layer_prefix(li) + expert_label(e) + " " + mapping_name(m) +
                              ": no calibration token reaches it, not scaled");
          continue;
        }
        Capture::Stat st;
        Capture::add(st, er.down_in.data(), er.n, er.width, 0);
        HessianAccumulator acc(er.width);
        acc.add(er.down_in.data(), er.n, er.width, pool);
        acc.finish(&pool);
        const std::vector<float> g = gram_of(acc);
        record(rep, li, search_mapping(model, li, m, e, mean_abs(st), fake_quant, o, CandidateLoss{{}, &g, er.n}, pool));
      }
      continue;
    }
    const Capture::Stat& st = m == Mapping::AttnNormToQKV     ? cap.q
                              : m == Mapping::VToO            ? cap.o
                              : m == Mapping::FfnNormToGateUp ? cap.gate
                                                              : cap.down;
    CandidateLoss scoring;
    std::vector<float> g;
    if (st.gram) {  // Linear -> Linear mappings, and every mapping with loss: linear
      g = gram_of(*st.gram);
      scoring.gram = &g, scoring.tokens = cs.n;
    } else if (m == Mapping::AttnNormToQKV) {
      scoring.module = [&] { return mse(run_attention(model, li, cs, pool), run.attn_out); };
    } else {  // FfnNormToGateUp: the MLP (routing included) on its captured input
      scoring.module = [&] {
        std::vector<float> out(static_cast<size_t>(cs.n * h));
        for (size_t bi = 0; bi < cs.batches.size(); ++bi)
          model.mlp_block(li, run.mlp_in.data() + cs.offset[bi] * h, static_cast<int64_t>(cs.batches[bi].size()),
                          out.data() + cs.offset[bi] * h, pool);
        return mse(out, run.mlp_out);
      };
    }
    std::vector<float> applied;
    record(rep, li, search_mapping(model, li, m, rt::kNoExpert, mean_abs(st), fake_quant, o, scoring, pool, &applied));
    (m == Mapping::AttnNormToQKV ? s_q : m == Mapping::VToO ? s_o : m == Mapping::FfnNormToGateUp ? s_gate : s_down) =
        std::move(applied);
  }
  if (!o.apply_clip) return rep;

  // The clip samples as the folded layer reads them.
  divide_columns(cap.q.rows, s_q);
  divide_columns(cap.o.rows, s_o);
  divide_columns(cap.gate.rows, s_gate);
  divide_columns(cap.down.rows, s_down);
  const int64_t T = (cs.n + step - 1) / step;  // tokens 0, step, 2 step, ...
  rt::LayerWeights& L = model.mutable_layer(li);
  const std::string p = layer_prefix(li);
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
    divide_columns(run.mlp_in, s_gate);
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
  clip_slots(slots, T, fake_quant, o, pool, rep, nullptr, step);
  return rep;
}

// AWQ on a device (dense layers): the statistics and the inspected module's
// reference outputs stay on the device, each mapping's candidates re-upload
// the Linears they change and cost one block's forward there.
SmoothingReport awq_layer_device(rt::Model& model, int64_t li, const LayerCalib& calib, const CalibSet& cs,
                                 const FakeQuantFn& fake_quant, const AwqOptions& o, ThreadPool& pool) {
  std::unique_ptr<rt::DeviceSmoothingEval> dev = device_eval(o.device, model, calib, cs, "awq");
  SmoothingReport rep;
  for (Mapping m : kMappings) {
    if (!mapping_applies(model, m)) continue;
    const rt::LayerInput input = m == Mapping::AttnNormToQKV ? rt::LayerInput::Attention
                                 : m == Mapping::VToO        ? rt::LayerInput::O
                                 : m == Mapping::FfnNormToGateUp ? rt::LayerInput::Mlp
                                                                 : rt::LayerInput::Down;
    dev->load(li);
    dev->run_reference();
    const std::vector<double> sum = dev->abs_sum(input);
    std::vector<double> x_mean(sum.size());
    for (size_t j = 0; j < x_mean.size(); ++j) x_mean[j] = sum[j] / static_cast<double>(dev->tokens());
    const rt::SmoothingBlock block = m == Mapping::AttnNormToQKV ? rt::SmoothingBlock::Attention
                                     : m == Mapping::VToO        ? rt::SmoothingBlock::O
                                     : m == Mapping::FfnNormToGateUp ? rt::SmoothingBlock::Mlp
                                                                     : rt::SmoothingBlock::Down;
    CandidateLoss scoring;
    scoring.module = [&, m, block] {
      for (int index : balance_indices(m)) dev->load_linear(index);
      return dev->loss(block);
    };
    record(rep, li, search_mapping(model, li, m, rt::kNoExpert, x_mean, fake_quant, o, scoring, pool));
  }
  if (!o.apply_clip) return rep;
  const int64_t step = std::max<int64_t>(1, cs.n / std::max<int64_t>(1, o.clip_n_sample_tokens));
  const int64_t T = (cs.n + step - 1) / step;
  // The sampled inputs of the folded layer stay on the device, where the clip errors are computed.
  dev->load(li);
  dev->run_reference();
  rt::LayerWeights& L = model.mutable_layer(li);
  const std::string p = layer_prefix(li);
  static const std::vector<float> kNone;
  const std::vector<ClipSlot> slots = {{&L.v, p + "self_attn.v_proj", &kNone, rt::LayerInput::Attention},
                                       {&L.o, p + "self_attn.o_proj", &kNone, rt::LayerInput::O},
                                       {&L.gate, p + "mlp.gate_proj", &kNone, rt::LayerInput::Mlp},
                                       {&L.up, p + "mlp.up_proj", &kNone, rt::LayerInput::Mlp},
                                       {&L.down, p + "mlp.down_proj", &kNone, rt::LayerInput::Down}};
  clip_slots(slots, T, fake_quant, o, pool, rep, dev.get(), step);
  return rep;
}

}  // namespace

SmoothingReport awq_layer(rt::Model& model, int64_t li, const LayerCalib& calib, const FakeQuantFn& fake_quant,
                          const AwqOptions& o, ThreadPool& pool) {
  if (o.n_grid < 1) throw invalid_input("awq", "n_grid must be at least 1");
  const ModelConfig& c = model.config();
  if (o.device != device::Kind::Cpu && c.is_moe())
    throw unsupported("awq --device " + std::string(device::kind_name(o.device)),
                      "mixture-of-experts layers are smoothed on the CPU only");
  if (o.device != device::Kind::Cpu && o.loss == AwqLoss::Linear)  // explicitly
    throw unsupported("awq --device " + std::string(device::kind_name(o.device)),
                      "loss: linear runs on the CPU only (the device scores the inspected modules)");
  const CalibSet cs = make_calib_set(model, calib);
  if (o.device != device::Kind::Cpu) return awq_layer_device(model, li, calib, cs, fake_quant, o, pool);
  return awq_layer_cpu(model, li, cs, fake_quant, o, pool);
}

}  // namespace qf
