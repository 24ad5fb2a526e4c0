#include "calibration/smoothing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"
#include "core/tensor.h"
#include "runtime/cpu/kernels.h"
#include "runtime/device_runtime.h"

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

std::vector<BalanceLinear> balance_slots(rt::LayerWeights& L, int64_t li, Mapping m) {
  const std::string p = layer_prefix(li);
  switch (m) {
    case Mapping::AttnNormToQKV:
      return {{&L.q, p + "self_attn.q_proj"}, {&L.k, p + "self_attn.k_proj"}, {&L.v, p + "self_attn.v_proj"}};
    case Mapping::VToO: return {{&L.o, p + "self_attn.o_proj"}};
    case Mapping::FfnNormToGateUp: return {{&L.gate, p + "mlp.gate_proj"}, {&L.up, p + "mlp.up_proj"}};
    case Mapping::UpToDown: return {{&L.down, p + "mlp.down_proj"}};
  }
  return {};
}

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
// themselves, every `step`-th token.
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
    const bool keep_rows = std::find(keep_.begin(), keep_.end(), slot) != keep_.end();
    if (st->in == 0) st->in = in, st->abs_sum.assign(static_cast<size_t>(in), 0.0), st->abs_max.assign(static_cast<size_t>(in), 0.0);
    for (int64_t t = 0; t < n; ++t) {
      const float* r = x + t * in;
      for (int64_t j = 0; j < in; ++j) {
        const double a = std::fabs(static_cast<double>(r[j]));
        st->abs_sum[static_cast<size_t>(j)] += a;
        st->abs_max[static_cast<size_t>(j)] = std::max(st->abs_max[static_cast<size_t>(j)], a);
      }
      if (keep_rows && (offset + t) % step_ == 0) st->rows.insert(st->rows.end(), r, r + in);
    }
    st->count += n;
  }
  int64_t offset = 0;  // global index of the batch's first token
  Stat q, o, gate, down;

 private:
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

SmoothingReport::Entry search_mapping(rt::Model& model, int64_t li, Mapping m, const std::vector<double>& x_mean,
                                      const FakeQuantFn& fake_quant, const AwqOptions& o, const LossFn& module_loss,
                                      ThreadPool& pool) {
  rt::LayerWeights& L = model.mutable_layer(li);
  const int64_t width = mapping_width(model, m);
  std::vector<Balance> bal;
  for (const BalanceLinear& s : balance_slots(L, li, m)) {
    Balance b{s, (*s.lin)->decode_all(), (*s.lin)->bias_values(), (*s.lin)->out_features(), (*s.lin)->in_features(), false};
    bal.push_back(std::move(b));
  }
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
  e.what = mapping_name(m);
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
  if (!best_s.empty()) apply_smoothing_scales(model, li, m, best_s);
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

void apply_smoothing_scales(rt::Model& model, int64_t li, Mapping which, const std::vector<float>& s) {
  const std::string where = layer_prefix(li) + mapping_name(which);
  if (li < 0 || li >= model.config().num_hidden_layers) throw invalid_input(where, "no such layer");
  if (!mapping_applies(model, which))
    throw invalid_input(where, "v_proj -> o_proj needs v_proj and o_proj of the same shape (no grouped-query attention)");
  if (static_cast<int64_t>(s.size()) != mapping_width(model, which))
    throw invalid_input(where, "expected " + std::to_string(mapping_width(model, which)) + " scales, got " +
                                   std::to_string(s.size()));
  for (float v : s)
    if (!(v > 0 && std::isfinite(v))) throw invalid_input(where, "scales must be positive and finite");
  rt::LayerWeights& L = model.mutable_layer(li);
  const std::string p = layer_prefix(li);
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
      scale_cols(L.q, p + "self_attn.q_proj"), scale_cols(L.k, p + "self_attn.k_proj");
      scale_cols(L.v, p + "self_attn.v_proj");
      break;
    case Mapping::VToO:
      scale_rows(L.v, p + "self_attn.v_proj"), scale_cols(L.o, p + "self_attn.o_proj");
      break;
    case Mapping::FfnNormToGateUp:
      for (size_t j = 0; j < s.size(); ++j) L.ffn_norm[j] /= s[j];
      scale_cols(L.gate, p + "mlp.gate_proj"), scale_cols(L.up, p + "mlp.up_proj");
      break;
    case Mapping::UpToDown:
      scale_rows(L.up, p + "mlp.up_proj"), scale_cols(L.down, p + "mlp.down_proj");
      break;
  }
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
  const CalibSet cs = make_calib_set(model, calib);
  const int64_t h = model.config().hidden_size;
  std::unique_ptr<rt::DeviceSmoothingEval> dev;
  if (o.device != device::Kind::Cpu) dev = device_eval(o.device, model, calib, cs, "awq");
  SmoothingReport rep;
  for (Mapping m : {Mapping::AttnNormToQKV, Mapping::VToO, Mapping::FfnNormToGateUp, Mapping::UpToDown}) {
    if (!mapping_applies(model, m)) continue;
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
      x_mean.resize(st.abs_sum.size());
      for (size_t j = 0; j < x_mean.size(); ++j) x_mean[j] = st.abs_sum[j] / static_cast<double>(st.count);
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
    SmoothingReport::Entry e = search_mapping(model, li, m, x_mean, fake_quant, o, loss, pool);
    rep.lines.push_back(layer_prefix(li) + e.what +
                        (e.ratio >= 0 ? fmt(": ratio %.2f", e.ratio) : std::string(": no scaling")) +
                        fmt(", loss %.6g -> %.6g", e.loss_before, e.loss_after));
    rep.entries.push_back(std::move(e));
  }
  if (o.apply_clip) {
    const int64_t step = std::max<int64_t>(1, cs.n / std::max<int64_t>(1, o.clip_n_sample_tokens));
    const int64_t T = (cs.n + step - 1) / step;  // tokens 0, step, 2 step, ...
    // The sampled inputs of the scaled layer: every step-th token's row, on
    // the CPU or kept on the device, where the clip errors are computed.
    Capture cap({rt::LinearObserver::Q, rt::LinearObserver::O, rt::LinearObserver::Gate, rt::LinearObserver::Down},
                step);
    if (dev) {
      dev->load(li);
      dev->run_reference();
    } else {
      run_blocks(model, li, cs, pool, &cap);
    }
    rt::LayerWeights& L = model.mutable_layer(li);
    const std::string p = layer_prefix(li);
    struct ClipSlot {
      std::shared_ptr<rt::Linear>* lin;
      std::string name;
      const std::vector<float>* in;
      rt::LayerInput input;
    };
    const ClipSlot slots[] = {{&L.v, p + "self_attn.v_proj", &cap.q.rows, rt::LayerInput::Attention},
                              {&L.o, p + "self_attn.o_proj", &cap.o.rows, rt::LayerInput::O},
                              {&L.gate, p + "mlp.gate_proj", &cap.gate.rows, rt::LayerInput::Mlp},
                              {&L.up, p + "mlp.up_proj", &cap.gate.rows, rt::LayerInput::Mlp},
                              {&L.down, p + "mlp.down_proj", &cap.down.rows, rt::LayerInput::Down}};
    for (const ClipSlot& c : slots) {
      double shrink = 1;
      ClipErrFn device_err;
      if (dev) {
        const rt::Linear& lin = **c.lin;
        const int64_t rows = lin.out_features(), cols = lin.in_features(), g = group_cols(o.group_size, cols, c.name);
        device_err = [&, rows, cols, g](const std::vector<float>& d) {
          return dev->clip_errors(c.input, step, d.data(), rows, cols, g);
        };
      }
      if (clip_linear(*c.lin, c.name, *c.in, T, fake_quant, o, pool, &shrink, device_err))
        rep.lines.push_back(c.name + fmt(": clip, mean max_val / amax %.4f", shrink));
    }
  }
  return rep;
}

SmoothingReport smoothquant_layer(rt::Model& model, int64_t li, const LayerCalib& calib, const SmoothQuantOptions& o,
                                  const TrialLinearFn& trial, ThreadPool& pool) {
  if (o.search && !trial) throw invalid_input("smoothquant", "the alpha search needs a trial quantizer");
  if (o.search && o.alpha_grid.empty()) throw invalid_input("smoothquant", "empty alpha grid");
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
  auto w_max = [&](std::initializer_list<const rt::Linear*> lins) {
    const int64_t cols = (*lins.begin())->in_features();
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
  const std::vector<double> wm_mlp = w_max({base.gate.get(), base.up.get()});
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
      for (const rt::LayerLinear& e : rt::kLayerLinears) {
        std::shared_ptr<rt::Linear>& lin = L.*e.member;
        const std::vector<float> w = lin->decode_all();
        std::shared_ptr<rt::Linear> t = trial(p + e.name, w.data(), lin->out_features(), lin->in_features(), lin->bias_values());
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
