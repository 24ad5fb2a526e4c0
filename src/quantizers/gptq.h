// GPTQ (Frantar et al. 2022) into the canonical QuantizedTensor, following
// the reference IST-DASLab/gptq gptq.py `fasterquant` and llm-compressor's
// gptq_quantize.py (where they differ, the modes below say which one we follow).
//
// Algorithm, as the reference:
//   1. dead columns (diag(H) == 0): H[i,i] = 1, W[:,i] = 0;
//   2. act-order (ActOrder::Group / Weight): perm = stable argsort of diag(H),
//      descending; W columns and H rows/columns are permuted;
//   3. damping: H += dampening_frac * mean(diag(H)) * I;
//   4. Hinv = upper Cholesky factor of H^-1, in double with Eigen: the
//      reference's cholesky -> cholesky_inverse -> upper cholesky chain is
//      computed as J L^-1 J with J H J = L L^T (J the reversal permutation),
//      the same factor (it is unique) for ~4x fewer flops;
//   5. columns in lazy blocks of block_size: q = quant(w); err = (w - q) / Hinv[i,i];
//      W[:, i:i2] -= err * Hinv[i, i:i2]; loss += (w - q)^2 / Hinv[i,i]^2 / 2;
//      after the block W[:, i2:] -= Err * Hinv[i1:i2, i2:];
//   6. un-permutation of the codes.
// Quantizer parameters:
//   - channel / tensor strategies: fitted once on the (unpermuted, un-zeroed)
//     W before the loop, as both references do;
//   - group strategy, ActOrder::None and ::Group (non-static): refitted on the
//     current, error-updated columns at each group boundary (in processing
//     order), as IST-DASLab gptq.py / AutoGPTQ. Blocks are split at group
//     boundaries so that a refit sees every update made so far: identical to
//     the reference when block_size is a multiple of group_size (128/128 by
//     default); when it is not, the reference refits on columns that miss the
//     current block's updates, we do not (a deliberate fix);
//   - ActOrder::Static and ::Weight: static groups, fitted before the loop on
//     the unpermuted W (after dead-column zeroing), IST-DASLab --static-groups.
// ActOrder mapping to the peers:
//   None   : no reordering, dynamic groups                 (gptq.py default; AutoGPTQ desc_act=False)
//   Static : no reordering, static groups                  (gptq.py --static-groups)
//   Group  : act-order, dynamic groups in permuted order, g_idx written with
//            g_idx[perm[j]] = j / group_size               (gptq.py --act-order; AutoGPTQ desc_act=True;
//                                                           llm-compressor actorder "group"/"dynamic")
//   Weight : act-order for the error updates, static groups on the original
//            columns, identity group map, no g_idx         (gptq.py --act-order --static-groups;
//                                                           llm-compressor actorder "weight"/"static")
// For channel/tensor strategies Static == None and Group == Weight (no groups).
//
// Robustness (never NaN, never a crash): if the Cholesky chain fails (or
// yields a non-finite or non-positive factor), dampening is raised in
// +dampening_frac steps (4 more tries), then a diagonal floor of
// 1e-6 * max|diag(H)| * 10^k (k = 0..5) is added on top; if all fail, the
// layer is quantized with RTN (same scheme and observer). `fallback` says
// which of these happened, naming the layer; it is empty when the first
// attempt succeeded.
//
// Determinism: rows are independent once Hinv is known, so the work is split
// into fixed chunks of rows on a ThreadPool; results are bit-identical for
// any thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "quantizers/quant_scheme.h"
#include "quantizers/rtn.h"

namespace qf {

class ThreadPool;

// The damping schedule's outcome (gptq_damp below).
struct GptqDamping {
  bool ok = false;
  double frac = 0, floor = 0;  // of the successful (else last) attempt
  int failures = 0;
  std::string tried;  // "dampening 0.01 to 0.05, then diagonal floors ... on top"
};

// What GPTQ derives from a Hessian before its column loop: Hinv, the upper
// Cholesky factor of the damped, permuted H^-1 (row-major, cols x cols), and
// how the damping went.
struct GptqFactor {
  bool act_order = false;
  double dampening_frac = 0;
  int64_t cols = 0;
  GptqDamping damping;
  std::unique_ptr<double[]> hinv;  // cols x cols; null when damping.ok is false
};

// One Hessian's factor, kept for the next Linear that shares the Hessian
// (q/k/v read one input, gate/up another): the O(cols^3) factorization runs
// once per Hessian and setting instead of once per Linear. Safe to use from
// several threads. Whoever hands it to gptq_quantize must give the same
// Hessian with it every time (HessianAccumulator::factor_cache does).
class GptqFactorCache {
 public:
  // The factor for these settings: the kept one when it matches, else the
  // one make() returns, which is then kept (make runs under the cache's
  // lock, so two Linears never factor the same Hessian at once).
  std::shared_ptr<const GptqFactor> get(bool act_order, double dampening_frac, int64_t cols,
                                        const std::function<std::shared_ptr<const GptqFactor>()>& make);
  void clear();

 private:
  std::mutex mu_;
  std::shared_ptr<const GptqFactor> factor_;
};

// Running Hessian H = 2/n * sum_x x x^T over calibration rows x (the input
// activations of one Linear, one row per token), accumulated in the
// reference's running form: H *= n/(n+m); n += m; H += 2/n X^T X, one chunk
// of m rows at a time, each chunk's sums in f32 and H in double
// (quantizers/hessian_update.h). Rows are applied in fixed chunks of kChunk
// rows of the global row sequence (pending rows are buffered), so the
// result is bit-identical however the rows are split into add() calls and
// whatever the thread count.
// Note: the references count samples per sequence (batch entries), not per
// token; GPTQ's result does not depend on H's scale, only its reported loss.
class HessianAccumulator {
 public:
  static constexpr int64_t kChunk = 256;

  explicit HessianAccumulator(int64_t cols);
  // A finished accumulator holding a Hessian computed elsewhere (the
  // device's): h is [cols * cols] symmetric, 2/N sum x x^T over `samples`
  // rows. InvalidInput when the sizes disagree.
  static HessianAccumulator from_matrix(int64_t cols, int64_t samples, std::vector<double> h);
  // x: [n_rows, cols] row-major f32. `cols` must equal cols() (else InvalidInput).
  void add(const float* x, int64_t n_rows, int64_t cols);
  void add(const float* x, int64_t n_rows, int64_t cols, ThreadPool& pool);
  int64_t cols() const { return cols_; }
  int64_t samples() const { return n_ + static_cast<int64_t>(pending_rows_); }
  // Applies the pending rows as a final (shorter) chunk. Call it once all rows
  // are added; adding more afterwards is allowed (the next chunk starts there,
  // so the result is not bit-identical to adding every row before finish()).
  void finish(ThreadPool* pool = nullptr);
  bool finished() const { return finished_; }
  // [cols * cols], symmetric (row-major == column-major). Only after finish()
  // (a pure read: several threads may read one accumulator at once).
  const std::vector<double>& matrix() const;
  // Where GPTQ keeps the damped factor of this Hessian for the next Linear
  // that reads the same input (GptqOptions::factor_cache). Adding rows
  // empties it.
  GptqFactorCache* factor_cache() const { return cache_.p.get(); }

 private:
  // A copy gets a cache of its own: it may be given other rows.
  struct CacheSlot {
    std::shared_ptr<GptqFactorCache> p = std::make_shared<GptqFactorCache>();
    CacheSlot() = default;
    CacheSlot(const CacheSlot&) {}
    CacheSlot& operator=(const CacheSlot&) {
      p = std::make_shared<GptqFactorCache>();
      return *this;
    }
    CacheSlot(CacheSlot&&) = default;
    CacheSlot& operator=(CacheSlot&&) = default;
  };
  void add_impl(const float* x, int64_t n_rows, int64_t cols, ThreadPool* pool);
  void apply(const float* x, int64_t m, ThreadPool* pool);  // one chunk of m rows
  void flush(ThreadPool* pool);
  int64_t cols_;
  int64_t n_ = 0;
  std::vector<double> h_;
  std::vector<float> pending_;  // [pending_rows_ * cols]
  size_t pending_rows_ = 0;
  bool finished_ = true;  // no rows applied since the last finish() (H symmetric)
  CacheSlot cache_;
};

struct GptqOptions {
  int64_t block_size = 128;
  double dampening_frac = 0.01;
  enum class ActOrder { None, Static, Group, Weight };  // see the header comment
  ActOrder actorder = ActOrder::None;
  RangeObserver observer = RangeObserver::MinMax;
  MseOptions mse;              // the mse observer's settings (each group is fitted on its own)
  ThreadPool* pool = nullptr;  // nullptr: ThreadPool::global() (do not call from inside one of its tasks)
  // Where the factor of this Linear's Hessian is looked up and kept
  // (nullptr: computed for this call alone). The CPU reference only.
  GptqFactorCache* factor_cache = nullptr;
};
const char* actorder_name(GptqOptions::ActOrder a);  // "none", "static", "group", "weight"

struct GptqResult {
  QuantizedTensor q;
  double loss = 0;       // sum (w - q)^2 / Hinv[i,i]^2 / 2 over all weights, as the reference reports
                         // (RTN fallback: sum (w - q)^2 / 2)
  double damp_used = 0;  // the dampening fraction of mean(diag(H)) finally used (0 after an RTN fallback)
  std::string fallback;  // non-empty: which robust fallback happened, naming the layer
  // Floating-point operations of the solve: the factor (n^3/3 for the
  // Cholesky and n^3/3 for the triangular inverse per attempt, 0 when a
  // cached factor was used) and the column loop (2 per update of a weight).
  double flops = 0;
};

// w: row-major [rows, cols] f32 (not modified). h: the accumulated Hessian
// (h.cols() == cols, at least one sample). name: the layer, for messages.
// Throws qf::Error (InvalidInput) for bad shapes or an invalid scheme.
// `h` must be finished (HessianAccumulator::finish).
GptqResult gptq_quantize(const float* w, int64_t rows, int64_t cols, const HessianAccumulator& h,
                         const QuantScheme& scheme, const GptqOptions& opts, const std::string& name);
// The same with the Hessian given directly ([cols * cols] symmetric, double).
GptqResult gptq_quantize(const float* w, int64_t rows, int64_t cols, const std::vector<double>& hessian,
                         const QuantScheme& scheme, const GptqOptions& opts, const std::string& name);

// ---- the steps the CPU reference and the device version (gptq_device.cpp) share

// The accumulated matrix, checked against the weight's columns and for at
// least one sample (InvalidInput naming `name`).
const std::vector<double>& gptq_hessian(const HessianAccumulator& h, int64_t cols, const std::string& name);

// The argument checks of gptq_quantize (InvalidInput naming `name`).
void gptq_check(const float* w, int64_t rows, int64_t cols, const std::vector<double>& hessian,
                const QuantScheme& scheme, const GptqOptions& opts, const std::string& name);

// Per-column bookkeeping: diag(H) with dead columns (diag 0) set to 1, the
// dead flags, the processing order (act-order: stable argsort of diag,
// descending; else identity), mean(diag) and max|diag|. `finite` is false
// when H has a non-finite entry (then nothing else is filled in).
struct GptqColumns {
  std::vector<double> diag;
  std::vector<char> dead;
  std::vector<int64_t> perm;
  double mean_diag = 0, max_diag = 0;
  bool finite = true;
};
GptqColumns gptq_columns(const std::vector<double>& hessian, int64_t cols, bool act_order);

// The damping schedule (the header comment's robustness paragraph): calls
// factor(frac, floor), which factors H + (frac * mean(diag) + floor) I and
// says whether that worked, until it does or the schedule ends.
GptqDamping gptq_damp(double dampening_frac, double max_diag, const std::function<bool(double, double)>& factor);

// The result of falling back to RTN (`q`, already quantized) for `why`.
GptqResult gptq_rtn_fallback(QuantizedTensor q, const float* w, const std::string& name, const std::string& why);
// Fills res.damp_used and res.fallback from a successful schedule.
void gptq_note_damping(GptqResult& res, const GptqDamping& d, const std::string& name);

}  // namespace qf
