// What the smoothing searches share (calibration/smoothing.h): the mappings'
// Linears, the calibration set in batches, one layer's run with a capture of
// its Linears' inputs, an expert's rows, and small helpers. Internal to
// calibration/ (smoothing.cpp: folding and SmoothQuant; awq.cpp: AWQ).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "calibration/smoothing.h"
#include "core/thread_pool.h"
#include "quantizers/gptq.h"
#include "runtime/device_runtime.h"
#include "runtime/model.h"

namespace qf::smoothing_detail {

std::string layer_prefix(int64_t li);

std::shared_ptr<rt::Linear> dense_f32(const std::vector<float>& w, int64_t rows, int64_t cols,
                                      const std::vector<float>& bias, const std::string& name);

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
                                         int64_t expert);

// The Linear before a Linear -> Linear mapping: v_proj, up_proj or an expert's up.
BalanceLinear previous_slot(const ModelConfig& c, rt::LayerWeights& L, int64_t li, Mapping m, int64_t expert);

// A sparse layer's experts in forward order (the shared expert last).
std::vector<int64_t> layer_experts(const ModelConfig& c);

std::string expert_label(int64_t e);

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

CalibSet make_calib_set(const rt::Model& model, const LayerCalib& calib);

// A cache holding the K/V of one batch.
rt::KvCache batch_cache(const rt::Model& model, const rt::Batch& b);

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
    // With a Gram matrix asked for: 2/n sum x x^T over every row (GPTQ's
    // Hessian accumulator; finished by Capture::finish).
    std::optional<HessianAccumulator> gram;
  };
  // keep: the slots whose rows are kept (Q, O, Gate, Down), every step-th
  // token; grams: the slots whose inputs' Gram matrices are summed (on `pool`).
  Capture(std::vector<Slot> keep, int64_t step, std::vector<Slot> grams = {}, ThreadPool* pool = nullptr)
      : keep_(std::move(keep)), grams_(std::move(grams)), step_(std::max<int64_t>(1, step)), pool_(pool) {}
  void observe(int64_t, Slot slot, const float* x, int64_t n, int64_t in) override {
    if (slot == LmHead || input_of(slot) != slot) return;
    Stat* st = slot == Q ? &q : slot == O ? &o : slot == Gate ? &gate : &down;
    add(*st, x, n, in, kept(slot) ? step_ : 0, offset);
    if (gram_of(slot)) add_gram(*st, x, n, in);
  }
  void observe_moe_input(int64_t, const float* xn, int64_t n, int64_t hidden) override {
    add(gate, xn, n, hidden, kept(Gate) ? step_ : 0, offset);
    if (gram_of(Gate)) add_gram(gate, xn, n, hidden);
  }
  // Applies every Gram matrix's last rows (call after the pass).
  void finish() {
    for (Stat* st : {&q, &o, &gate, &down})
      if (st->gram) st->gram->finish(pool_);
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
  bool gram_of(Slot s) const { return std::find(grams_.begin(), grams_.end(), s) != grams_.end(); }
  void add_gram(Stat& st, const float* x, int64_t n, int64_t in) {
    if (!st.gram) st.gram.emplace(in);
    if (pool_) st.gram->add(x, n, in, *pool_);
    else st.gram->add(x, n, in);
  }
  std::vector<Slot> keep_, grams_;
  int64_t step_;
  ThreadPool* pool_;
};

// Runs the layer's two blocks on every batch: attn_out = attention_block(x),
// mlp_in = ffn_norm(x + attn_out), mlp_out = mlp_block(mlp_in), all [n, hidden].
struct LayerRun {
  std::vector<float> attn_out, mlp_in, mlp_out;
};

LayerRun run_blocks(const rt::Model& model, int64_t li, const CalibSet& cs, ThreadPool& pool, Capture* cap);

// Attention block outputs only.
std::vector<float> run_attention(const rt::Model& model, int64_t li, const CalibSet& cs, ThreadPool& pool);

// The whole decoder layer (with residuals) on every batch.
std::vector<float> run_layer(const rt::Model& model, int64_t li, const CalibSet& cs, ThreadPool& pool);

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
                       const std::vector<int32_t>& routing, bool all, ThreadPool& pool);

// Per-channel mean of |x| over the rows a Stat saw.
std::vector<double> mean_abs(const Capture::Stat& st);

// Every `step`-th of n rows of width `in` (the clip search's samples).
std::vector<float> every_nth_row(const std::vector<float>& rows, int64_t in, int64_t step);

double mse(const std::vector<float>& a, const std::vector<float>& b);

std::string fmt(const char* f, double a, double b = 0, double c = 0);

int64_t group_cols(int64_t group_size, int64_t cols, const std::string& name);

// The layer's Linears (kLayerLinears indices) a mapping's search changes.
std::vector<int> balance_indices(Mapping m);

// The device evaluation of a layer's smoothing searches, its inputs uploaded.
std::unique_ptr<rt::DeviceSmoothingEval> device_eval(device::Kind kind, const rt::Model& model,
                                                     const LayerCalib& calib, const CalibSet& cs, const char* what);

// The Gram matrix sum_t x_t x_t^T of a finished accumulator (2/n sum x x^T
// over n rows), in f32 for the loss products below.
std::vector<float> gram_of(const HessianAccumulator& h);

// sum_r d_r^T G d_r over the rows of a weight change d [rows, cols], G the
// symmetric [cols, cols] Gram matrix of a Linear's inputs: the sum over the
// inputs x of |d x|^2, the squared change of the Linear's outputs, without
// running the inputs. Products by the runtime's f32 GEMM tiles, rows in
// fixed chunks on the pool, summed in double in chunk order.
double gram_quadratic(const float* d, int64_t rows, int64_t cols, const float* g, ThreadPool& pool);

}  // namespace qf::smoothing_detail
