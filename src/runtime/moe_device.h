// The sparse MLP of a mixture-of-experts layer on the device: Model::moe_block
// (runtime/moe_block.cpp) written against the device layer, for device
// sources only. layer_engine_device.h includes this file at its end: its
// DeviceLayer holds a sparse layer's DeviceMoe, upload_layer uploads it and
// LayerEngine::mlp_block hands a sparse layer to moe_block.
//
// The computation is the CPU's:
//   - routing: the router Linear (on the device, in f32), then one functor per token
//     (RouteRows): softmax over all experts in f32 (the maximum first, the
//     sum in double), the top k (ties to the lower index), renormalised to
//     sum 1 when the config's norm_topk_prob says so (always for mixtral);
//   - the choices come to the host (n x k indices: the GEMM sizes depend on
//     them), where each expert's rows are listed in token order;
//   - each expert with rows runs once, in expert order: its rows gathered
//     (GatherRows), gate and up through LayerEngine::linear (the same path
//     as the dense Linears: stored forms decoded, inputs quantized as the
//     Linear says), SwiGLU, down, and its outputs scaled by the routing
//     weights and added into the token rows (ScatterAddScaled). Within one
//     expert every row is a different token, so the additions do not race,
//     and each token's outputs add up in expert order, as on the CPU, whatever
//     the thread count or the batch;
//   - qwen2_moe's shared expert: + sigmoid(shared_expert_gate(x)) *
//     shared_expert(x) over every token, after the routed experts.
// A calibration capture (LayerCapture::moe_inputs) keeps each pass's MLP
// input and routing on the host, what the CPU pipeline's observer keeps
// (observe_moe_input, observe_routing), and expert_inputs runs one expert's
// gate/up on given rows for its statistics (CPU: sequential.cpp's
// expert_stats).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/layer_engine_device.h"

namespace qf::QF_DEV_NS::layer_engine {

// One token's routing: p [experts] holds its router logits and becomes their
// softmax (as rt::softmax: the maximum subtracted, the sum in double, each
// value times the f32 inverse of the sum); choice/weight [k] the top k, each
// the largest not yet taken, ties to the lower index (Model::moe_block's
// loop), renormalised by their f32 sum in choice order when `norm`.
struct RouteRows {
  float* probs;
  int32_t* choice;
  float* weight;
  int64_t experts, k;
  bool norm;
  QF_HD void operator()(int64_t t) const {
    float* p = probs + t * experts;
    float mx = p[0];
    for (int64_t i = 1; i < experts; ++i) mx = mx < p[i] ? p[i] : mx;  // std::max(mx, p[i])
    double sum = 0.0;
    for (int64_t i = 0; i < experts; ++i) {
      p[i] = hd::exp_f32(p[i] - mx);
      sum += p[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < experts; ++i) p[i] *= inv;
    int32_t* ch = choice + t * k;
    float* w = weight + t * k;
    float total = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      int32_t best = -1;
      for (int32_t e = 0; e < static_cast<int32_t>(experts); ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken = taken || ch[i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      ch[j] = best, w[j] = p[best], total += p[best];
    }
    if (norm)
      for (int64_t j = 0; j < k; ++j) w[j] /= total;
  }
};

// out[rows[i]] += y[i] * w[i], rows of `dim`: one index per element. The
// rows of one call are distinct tokens.
struct ScatterAddScaled {
  float* out;
  const float* y;
  const int64_t* rows;
  const float* w;
  int64_t dim;
  QF_HD void operator()(int64_t idx) const {
    const int64_t i = idx / dim;
    out[rows[i] * dim + idx % dim] += y[idx] * w[i];
  }
};

// out[t] += sigmoid(g[t]) * y[t], rows of `dim`: qwen2_moe's gated shared expert.
struct AddSigmoidGated {
  float* out;
  const float* y;
  const float* g;
  int64_t dim;
  QF_HD void operator()(int64_t idx) const {
    const float s = 1.0f / (1.0f + hd::exp_f32(-g[idx / dim]));
    out[idx] += s * y[idx];
  }
};

struct FillZero {
  float* x;
  QF_HD void operator()(int64_t i) const { x[i] = 0.0f; }
};

// One SwiGLU expert on the device.
struct DeviceExpert {
  DeviceLinear gate, up, down;
  uint64_t bytes() const { return gate.bytes() + up.bytes() + down.bytes(); }
};

// The buffers of the MoE block, shared by the sparse layers one engine runs
// (the decoder's layers, the layer pass's loaded layer).
struct MoeScratch {
  dvec<float> logits;          // [n, experts]: router logits, then probabilities
  dvec<int32_t> choice;        // [n, k]
  dvec<float> weight;          // [n, k]
  dvec<int64_t> rows;          // [n * k]: each expert's rows in token order, experts in order
  dvec<float> row_w;           // their routing weights
  dvec<float> xe, ge, ue, ye;  // one expert's rows: input, gate, up, output
  dvec<float> sg;              // [n]: the shared expert's gate
  std::vector<int32_t> host_choice;
  std::vector<float> host_weight;
  // A capture's (LayerCapture::moe_inputs): the MLP input [rows, hidden] and
  // routing [rows, k] of every pass since the owner last cleared them.
  std::vector<float> kept_x;
  std::vector<int32_t> kept_choice;
  // Only the routing is wanted (a capturing run whose output is not kept):
  // the experts are not run and the block's output is zero.
  bool route_only = false;
};

struct DeviceMoe {
  DeviceLinear router;           // [experts, hidden]
  std::vector<DeviceExpert> experts;
  DeviceExpert shared;           // qwen2_moe's (has_shared)
  DeviceLinear shared_gate;      // [1, hidden]
  bool has_shared = false;
  int64_t k = 0;                 // experts per token
  bool norm_topk = false;
  std::shared_ptr<MoeScratch> scratch;  // set by the owner (attach_moe); made on first use otherwise

  // Weight bytes one token reads: the router, the shared expert and its gate,
  // and k of the experts' average size (Model::bytes_per_token's rule).
  uint64_t bytes_per_token() const {
    uint64_t routed = 0;
    for (const DeviceExpert& e : experts) routed += e.bytes();
    const uint64_t b = router.bytes() + shared_gate.bytes() + (has_shared ? shared.bytes() : 0);
    return experts.empty() ? b : b + routed * static_cast<uint64_t>(k) / static_cast<uint64_t>(experts.size());
  }
  DeviceExpert& expert(int64_t e) {
    if (e == rt::kSharedExpert && has_shared) return shared;
    if (e < 0 || e >= static_cast<int64_t>(experts.size()))
      throw Error(ErrorKind::Internal, "device MoE: no expert " + std::to_string(e));
    return experts[static_cast<size_t>(e)];
  }
};

// Sparse layer `li`'s router and experts (its current weights), each Linear
// in the form upload_linear keeps it.
inline std::shared_ptr<DeviceMoe> upload_moe(const rt::Model& m, int64_t li) {
  const ModelConfig& c = m.config();
  const rt::LayerWeights& L = m.weights().layers[static_cast<size_t>(li)];
  const std::string p = "model.layers." + std::to_string(li) + ".";
  auto d = std::make_shared<DeviceMoe>();
  d->k = c.num_experts_per_tok, d->norm_topk = c.norm_topk_prob;
  // The router and the shared expert's gate stay in f32 under bf16 compute,
  // as the CPU's bf16 forward leaves them (it rounds the quantizable
  // Linears, rt::layer_linears, of which they are not).
  d->router = upload_linear(*L.moe.router, p + rt::moe_module_prefix(c) + "gate");
  d->router.keep_f32 = true;
  d->experts.resize(L.moe.experts.size());
  d->has_shared = L.moe.shared.gate != nullptr;
  if (L.moe.shared_gate) {
    d->shared_gate = upload_linear(*L.moe.shared_gate, p + "mlp.shared_expert_gate");
    d->shared_gate.keep_f32 = true;
  }
  for (const rt::LayerLinearId& id : rt::layer_linears(c, li)) {
    if (id.expert == rt::kNoExpert) continue;
    DeviceExpert& e = d->expert(id.expert);
    DeviceLinear& slot = id.slot == rt::LinearObserver::Gate ? e.gate : id.slot == rt::LinearObserver::Up ? e.up : e.down;
    slot = upload_linear(*rt::layer_linear(L, id), p + id.name);
  }
  return d;
}

// Makes the engine ready for a layer's MoE block: room in its widening
// scratch for every Linear, and `scratch` as the block's buffers.
inline void attach_moe(LayerEngine& e, DeviceLayer& d, const std::shared_ptr<MoeScratch>& scratch) {
  if (!d.moe) return;
  DeviceMoe& m = *d.moe;
  m.scratch = scratch;
  e.reserve_widened(m.router);
  e.reserve_widened(m.shared_gate);
  const auto reserve = [&](const DeviceExpert& x) {
    e.reserve_widened(x.gate), e.reserve_widened(x.up), e.reserve_widened(x.down);
  };
  for (const DeviceExpert& x : m.experts) reserve(x);
  if (m.has_shared) reserve(m.shared);
}

namespace moe_detail {
inline MoeScratch& scratch_of(DeviceMoe& m) {
  if (!m.scratch) m.scratch = std::make_shared<MoeScratch>();
  return *m.scratch;
}
}  // namespace moe_detail

// Expert `ex` on m rows x [m, hidden] (device): gate and up, SwiGLU, then,
// with y, down into y [m, hidden]. `cap` sees x as the input of its gate/up
// (LayerInput::Mlp) and down's input (LayerInput::Down), as the CPU
// pipeline's expert statistics take them.
inline void run_expert(LayerEngine& e, MoeScratch& s, DeviceExpert& ex, const float* x, int64_t m, float* y, Capture* cap) {
  const int64_t h = ex.gate.in, ff = ex.gate.out;
  fit(s.ge, m * ff), fit(s.ue, m * ff);
  if (cap) cap->input(rt::LayerInput::Mlp, x, m, h);
  e.linear(ex.gate, x, m, raw(s.ge));
  e.linear(ex.up, x, m, raw(s.ue));
  for_each_index(m * ff, Swiglu{raw(s.ge), raw(s.ue)});
  if (cap) cap->input(rt::LayerInput::Down, raw(s.ge), m, ff);
  if (y) e.linear(ex.down, raw(s.ge), m, y);
}

// Expert `expert` (rt::kSharedExpert: the shared one) of `moe` on n rows x
// [n, hidden] on the device, in pieces of at most `pass` rows, measuring
// its inputs in `cap` (the layer pass's expert statistics).
inline void expert_inputs(LayerEngine& e, DeviceMoe& moe, int64_t expert, const float* x, int64_t n, int64_t pass,
                          Capture& cap) {
  DeviceExpert& ex = moe.expert(expert);
  MoeScratch& s = moe_detail::scratch_of(moe);
  for (int64_t t0 = 0; t0 < n; t0 += pass) {
    const int64_t m = n - t0 < pass ? n - t0 : pass;
    run_expert(e, s, ex, x + t0 * ex.gate.in, m, nullptr, &cap);
  }
}

// The engine's y := the sparse MLP of the n normed rows in its xn
// (Model::moe_block). A capture may keep the MLP input and routing
// (LayerCapture::moe_inputs); the per-input statistics of the dense block
// (square sums, |x| statistics) are not taken here.
inline void moe_block(LayerEngine& e, DeviceMoe& moe, int64_t n, Capture* cap) {
  MoeScratch& s = moe_detail::scratch_of(moe);
  if (cap && (cap->what.square_sums || cap->what.abs_stats))
    throw Error(ErrorKind::Internal, "device MoE block: square sums and |x| statistics are not taken in a sparse layer");
  const int64_t h = moe.router.in, ne = moe.router.out, k = moe.k;
  const float* xn = e.xn();
  float* out = e.y();
  fit(s.logits, n * ne), fit(s.choice, n * k), fit(s.weight, n * k);
  e.linear(moe.router, xn, n, raw(s.logits));
  for_each_index(n, RouteRows{raw(s.logits), raw(s.choice), raw(s.weight), ne, k, moe.norm_topk});
  s.host_choice.resize(static_cast<size_t>(n * k)), s.host_weight.resize(s.host_choice.size());
  download(raw(s.choice), n * k, s.host_choice.data());
  download(raw(s.weight), n * k, s.host_weight.data());
  if (cap && cap->what.moe_inputs) {
    const size_t at = s.kept_x.size();
    s.kept_x.resize(at + static_cast<size_t>(n * h));
    download(xn, n * h, s.kept_x.data() + at);
    s.kept_choice.insert(s.kept_choice.end(), s.host_choice.begin(), s.host_choice.end());
  }
  for_each_index(n * h, FillZero{out});
  if (s.route_only) return;

  // Each expert's rows in token order, the experts one after another.
  std::vector<int64_t> start(static_cast<size_t>(ne + 1), 0);
  for (int32_t c : s.host_choice) ++start[static_cast<size_t>(c) + 1];
  for (int64_t i = 0; i < ne; ++i) start[static_cast<size_t>(i + 1)] += start[static_cast<size_t>(i)];
  std::vector<int64_t> rows(static_cast<size_t>(n * k)), fill(start.begin(), start.end() - 1);
  std::vector<float> row_w(rows.size());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const size_t c = static_cast<size_t>(t * k + j);
      const size_t at = static_cast<size_t>(fill[static_cast<size_t>(s.host_choice[c])]++);
      rows[at] = t, row_w[at] = s.host_weight[c];
    }
  assign(s.rows, rows.data(), n * k);
  assign(s.row_w, row_w.data(), n * k);
  fit(s.xe, n * h), fit(s.ye, n * h);
  for (int64_t x = 0; x < ne; ++x) {
    const int64_t r0 = start[static_cast<size_t>(x)], me = start[static_cast<size_t>(x + 1)] - r0;
    if (me == 0) continue;
    for_each_index(me * h, GatherRows{xn, raw(s.rows) + r0, raw(s.xe), h});
    run_expert(e, s, moe.experts[static_cast<size_t>(x)], raw(s.xe), me, raw(s.ye), nullptr);
    for_each_index(me * h, ScatterAddScaled{out, raw(s.ye), raw(s.rows) + r0, raw(s.row_w) + r0, h});
  }
  if (moe.has_shared) {  // qwen2_moe: + sigmoid(shared_expert_gate(x)) * shared_expert(x)
    fit(s.sg, n);
    e.linear(moe.shared_gate, xn, n, raw(s.sg));
    run_expert(e, s, moe.shared, xn, n, raw(s.ye), nullptr);
    for_each_index(n * h, AddSigmoidGated{out, raw(s.ye), raw(s.sg), h});
  }
}

}  // namespace qf::QF_DEV_NS::layer_engine
