#include <algorithm>
#include <cmath>
#include <cstdio>

#include "calibration/smoothing_internal.h"
#include "core/error.h"
#include "core/tensor.h"
#include "runtime/cpu/kernels.h"
#include "runtime/router_linears.h"

namespace qf::smoothing_detail {

std::string layer_prefix(int64_t li) { return "model.layers." + std::to_string(li) + "."; }

std::shared_ptr<rt::Linear> dense_f32(const std::vector<float>& w, int64_t rows, int64_t cols,
                                      const std::vector<float>& bias, const std::string& name) {
  const std::optional<Tensor> b = rt::bias_tensor(bias);
  return rt::make_dense_linear(Tensor::from_f32(w, {rows, cols}), b ? &*b : nullptr, name);
}

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
    rt::add_sequence(b, toks, seq, calib.multimodal ? &(*calib.multimodal)[s] : nullptr);
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

std::string fmt(const char* f, double a, double b, double c) {
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

std::vector<float> gram_of(const HessianAccumulator& h) {
  const std::vector<double>& m = h.matrix();
  const double scale = static_cast<double>(h.samples()) / 2.0;
  std::vector<float> g(m.size());
  for (size_t i = 0; i < m.size(); ++i) g[i] = static_cast<float>(m[i] * scale);
  return g;
}

double gram_quadratic(const float* d, int64_t rows, int64_t cols, const float* g, ThreadPool& pool) {
  constexpr int64_t kRows = 24;
  const std::vector<Chunk> chunks = partition(rows, kRows);
  std::vector<double> part(chunks.size(), 0.0);
  pool.parallel_for(rows, kRows, [&](const Chunk& ch) {
    const int64_t n = ch.end - ch.begin;
    std::vector<float> e(static_cast<size_t>(n * cols));
    rt::gemm_tile_f32(d + ch.begin * cols, n, cols, g, cols, cols, e.data(), cols);  // e = d G (G symmetric)
    double s = 0;
    for (int64_t i = 0; i < n * cols; ++i) s += static_cast<double>(e[static_cast<size_t>(i)]) * d[ch.begin * cols + i];
    part[static_cast<size_t>(ch.index)] = s;
  });
  double total = 0;
  for (double p : part) total += p;
  return total;
}

}  // namespace qf::smoothing_detail
