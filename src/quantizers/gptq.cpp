#include "quantizers/gptq.h"

#include <Eigen/Cholesky>
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "core/thread_pool.h"
#include "quantizers/gptq_row.h"
#include "quantizers/hessian_update.h"

namespace qf {

namespace {

using RowMat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Stride = Eigen::OuterStride<>;

constexpr int64_t kHessianRowGrain = 16;  // rows of H per task (the upper triangle: earlier rows are longer)
constexpr int64_t kRowGrain = 16;         // weight rows per GPTQ task

std::string fmt_double(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// Hinv, the upper Cholesky factor of H^-1 (what the reference gets from
// cholesky -> cholesky_inverse -> cholesky(upper=True)), computed without
// forming H^-1: with J the reversal permutation and J H J = L L^T (Cholesky),
// H = M M^T with M = J L J upper triangular, so H^-1 = M^-T M^-1 and, by
// uniqueness of the Cholesky factor, Hinv = M^-1 = J L^-1 J. One Cholesky and
// one triangular inverse (~2n^3/3 flops instead of ~8n^3/3), the inverse
// split into fixed column chunks on the pool (deterministic).
// On entry A is the damped H; on success A's buffer read row-major holds Hinv:
// Hinv[i, j] = A.data()[i * n + j] for j >= i (entries below the diagonal are 0).
bool inverse_cholesky_upper(Eigen::MatrixXd& A, ThreadPool& pool) {
  const Eigen::Index n = A.rows();
  A.reverseInPlace();  // J H J
  {
    Eigen::LLT<Eigen::Ref<Eigen::MatrixXd>> llt(A);  // A's lower triangle := L
    if (llt.info() != Eigen::Success) return false;
  }
  for (Eigen::Index i = 0; i < n; ++i)
    if (!(A(i, i) > 0.0) || !std::isfinite(A(i, i))) return false;
  // B = L^-1, lower: column block [c0, c1) only has rows >= c0.
  Eigen::MatrixXd B = Eigen::MatrixXd::Zero(n, n);
  pool.parallel_for(n, 64, [&](const Chunk& ch) {
    const Eigen::Index c0 = ch.begin, w = ch.end - ch.begin;
    auto blk = B.block(c0, c0, n - c0, w);
    blk.topRows(w).setIdentity();
    A.bottomRightCorner(n - c0, n - c0).triangularView<Eigen::Lower>().solveInPlace(blk);
  });
  // Hinv[i, j] = B(n-1-i, n-1-j), stored row-major over A.
  double* u = A.data();
  for (Eigen::Index i = 0; i < n; ++i) {
    double* row = u + i * n;
    for (Eigen::Index j = 0; j < i; ++j) row[j] = 0.0;
    for (Eigen::Index j = i; j < n; ++j) {
      const double v = B(n - 1 - i, n - 1 - j);
      if (!std::isfinite(v)) return false;
      row[j] = v;
    }
    if (!(row[i] > 0.0)) return false;
  }
  return true;
}

double rtn_loss(const float* w, const QuantizedTensor& q) {
  std::vector<float> d = q.dequantize();
  double loss = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    const double e = static_cast<double>(w[i]) - d[i];
    loss += e * e;
  }
  return loss / 2;
}

}  // namespace

// ---- Hessian ------------------------------------------------------------------

HessianAccumulator::HessianAccumulator(int64_t cols) : cols_(cols) {
  if (cols <= 0) throw invalid_input("hessian", "column count must be positive, got " + std::to_string(cols));
  h_.assign(static_cast<size_t>(cols * cols), 0.0);
}

void HessianAccumulator::add(const float* x, int64_t n_rows, int64_t cols) { add_impl(x, n_rows, cols, nullptr); }

void HessianAccumulator::add(const float* x, int64_t n_rows, int64_t cols, ThreadPool& pool) {
  add_impl(x, n_rows, cols, &pool);
}

void HessianAccumulator::add_impl(const float* x, int64_t n_rows, int64_t cols, ThreadPool* pool) {
  if (cols != cols_)
    throw invalid_input("hessian", "activation rows have " + std::to_string(cols) + " columns, the layer has " +
                                       std::to_string(cols_));
  if (n_rows < 0) throw invalid_input("hessian", "negative row count");
  for (int64_t r = 0; r < n_rows;) {
    const int64_t take = std::min<int64_t>(n_rows - r, kChunk - static_cast<int64_t>(pending_rows_));
    pending_.insert(pending_.end(), x + r * cols, x + (r + take) * cols);
    pending_rows_ += static_cast<size_t>(take);
    r += take;
    if (static_cast<int64_t>(pending_rows_) == kChunk) flush(pool);
  }
}

void HessianAccumulator::flush(ThreadPool* pool) {
  if (pending_rows_ == 0) return;
  const int64_t m = static_cast<int64_t>(pending_rows_), n = cols_;
  const double keep = static_cast<double>(n_) / static_cast<double>(n_ + m);
  n_ += m;
  const double scale = 2.0 / static_cast<double>(n_);
  // Widened to double: every product of two activations is then exact
  // (quantizers/hessian_update.h), and H = keep * H + 2/N X^T X takes one
  // triangle, SIMD across columns, the same doubles at every level.
  std::vector<double> X(pending_.begin(), pending_.end());
  pending_.clear();
  pending_rows_ = 0;
  const SimdLevel level = simd_level();
  auto task = [&](const Chunk& ch) { hessian_update_rows(h_.data(), X.data(), m, n, keep, scale, ch.begin, ch.end, level); };
  if (pool) {
    pool->parallel_for(n, kHessianRowGrain, task);
  } else {
    for (const Chunk& ch : partition(n, kHessianRowGrain)) task(ch);
  }
  mirror_upper(h_.data(), n);  // exact symmetry
}

void HessianAccumulator::finish(ThreadPool* pool) { flush(pool); }

HessianAccumulator HessianAccumulator::from_matrix(int64_t cols, int64_t samples, std::vector<double> h) {
  HessianAccumulator a(cols);
  if (samples < 0 || h.size() != static_cast<size_t>(cols * cols))
    throw invalid_input("hessian", "a " + std::to_string(cols) + "-column Hessian needs " + std::to_string(cols * cols) +
                                       " values, got " + std::to_string(h.size()));
  a.h_ = std::move(h);
  a.n_ = samples;
  return a;
}

const std::vector<double>& HessianAccumulator::matrix() const {
  if (!finished())
    throw Error(ErrorKind::Internal, "hessian: matrix() read with " + std::to_string(pending_rows_) +
                                         " rows not yet applied; call finish() first");
  return h_;
}

// ---- GPTQ ---------------------------------------------------------------------

const char* actorder_name(GptqOptions::ActOrder a) {
  switch (a) {
    case GptqOptions::ActOrder::None: return "none";
    case GptqOptions::ActOrder::Static: return "static";
    case GptqOptions::ActOrder::Group: return "group";
    case GptqOptions::ActOrder::Weight: return "weight";
  }
  return "?";
}

const std::vector<double>& gptq_hessian(const HessianAccumulator& h, int64_t cols, const std::string& name) {
  if (h.cols() != cols)
    throw invalid_input(name, "Hessian has " + std::to_string(h.cols()) + " columns, the weight " + std::to_string(cols));
  if (h.samples() == 0) throw invalid_input(name, "Hessian has no calibration samples");
  return h.matrix();
}

GptqResult gptq_quantize(const float* w, int64_t rows, int64_t cols, const HessianAccumulator& h,
                         const QuantScheme& scheme, const GptqOptions& opts, const std::string& name) {
  return gptq_quantize(w, rows, cols, gptq_hessian(h, cols, name), scheme, opts, name);
}

void gptq_check(const float* w, int64_t rows, int64_t cols, const std::vector<double>& hessian,
                const QuantScheme& scheme, const GptqOptions& opts, const std::string& name) {
  scheme.validate(name, cols);
  if (rows <= 0 || cols <= 0)
    throw invalid_input(name, "empty weight [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  if (hessian.size() != static_cast<size_t>(cols * cols))
    throw invalid_input(name, "Hessian is not [" + std::to_string(cols) + ", " + std::to_string(cols) + "]");
  if (opts.block_size < 1) throw invalid_input(name, "GPTQ block_size must be >= 1");
  if (!(opts.dampening_frac >= 0.0) || !std::isfinite(opts.dampening_frac))
    throw invalid_input(name, "GPTQ dampening_frac must be a finite value >= 0");
  for (int64_t i = 0; i < rows * cols; ++i)
    if (!std::isfinite(w[i])) throw invalid_input(name, "weight has non-finite values");
}

GptqColumns gptq_columns(const std::vector<double>& hessian, int64_t cols, bool act_order) {
  GptqColumns c;
  for (double v : hessian)
    if (!std::isfinite(v)) {
      c.finite = false;
      return c;
    }
  c.diag.resize(static_cast<size_t>(cols));
  c.dead.assign(static_cast<size_t>(cols), 0);
  for (int64_t i = 0; i < cols; ++i) {
    c.diag[static_cast<size_t>(i)] = hessian[static_cast<size_t>(i * cols + i)];
    if (c.diag[static_cast<size_t>(i)] == 0.0) {
      c.dead[static_cast<size_t>(i)] = 1;
      c.diag[static_cast<size_t>(i)] = 1.0;
    }
  }
  c.perm.resize(static_cast<size_t>(cols));
  std::iota(c.perm.begin(), c.perm.end(), 0);
  if (act_order)
    std::stable_sort(c.perm.begin(), c.perm.end(),
                     [&](int64_t a, int64_t b) { return c.diag[static_cast<size_t>(a)] > c.diag[static_cast<size_t>(b)]; });
  for (double v : c.diag) {
    c.mean_diag += v;
    c.max_diag = std::max(c.max_diag, std::fabs(v));
  }
  c.mean_diag /= static_cast<double>(cols);
  return c;
}

GptqDamping gptq_damp(double dampening_frac, double max_diag, const std::function<bool(double, double)>& factor) {
  GptqDamping d;
  double first_frac = -1, last_frac = 0, first_floor = -1, last_floor = 0;
  const int kDampSteps = 5, kFloorSteps = 6;
  for (int attempt = 0; attempt < kDampSteps + kFloorSteps && !d.ok; ++attempt) {
    if (attempt > 0 && attempt < kDampSteps && dampening_frac == 0.0) continue;  // nothing to raise
    const double frac = dampening_frac * (1 + std::min(attempt, kDampSteps - 1));
    const double floor = attempt < kDampSteps ? 0.0 : 1e-6 * max_diag * std::pow(10.0, attempt - kDampSteps);
    if (attempt >= kDampSteps && floor == 0.0) break;  // max|diag| == 0 cannot happen (dead -> 1), kept for safety
    d.ok = factor(frac, floor);
    d.frac = frac;
    d.floor = floor;
    if (!d.ok) {
      ++d.failures;
      if (floor > 0) {
        if (first_floor < 0) first_floor = floor;
        last_floor = floor;
      } else {
        if (first_frac < 0) first_frac = frac;
        last_frac = frac;
      }
    }
  }
  auto range = [](double a, double b) { return a == b ? fmt_double(a) : fmt_double(a) + " to " + fmt_double(b); };
  d.tried = "dampening " + range(first_frac, last_frac);
  if (first_floor >= 0) d.tried += ", then diagonal floors " + range(first_floor, last_floor) + " on top";
  return d;
}

GptqResult gptq_rtn_fallback(QuantizedTensor q, const float* w, const std::string& name, const std::string& why) {
  GptqResult res;
  res.q = std::move(q);
  res.loss = rtn_loss(w, res.q);
  res.fallback = name + ": " + why + "; quantized with round-to-nearest instead of GPTQ";
  return res;
}

void gptq_note_damping(GptqResult& res, const GptqDamping& d, const std::string& name) {
  res.damp_used = d.frac;
  if (d.failures > 0)
    res.fallback = name + ": Cholesky of the damped Hessian failed (" + d.tried + "); succeeded with dampening " +
                   fmt_double(d.frac) + (d.floor > 0 ? " + diagonal floor " + fmt_double(d.floor) : "");
}

GptqResult gptq_quantize(const float* w, int64_t rows, int64_t cols, const std::vector<double>& hessian,
                         const QuantScheme& scheme, const GptqOptions& opts, const std::string& name) {
  using AO = GptqOptions::ActOrder;
  gptq_check(w, rows, cols, hessian, scheme, opts, name);

  const bool grouped = scheme.strategy == QuantStrategy::Group;
  const int64_t gs = grouped ? scheme.group_size : cols;
  const bool act_order = opts.actorder == AO::Group || opts.actorder == AO::Weight;
  const bool static_groups = grouped && (opts.actorder == AO::Static || opts.actorder == AO::Weight);
  const bool dynamic_groups = grouped && !static_groups;

  auto rtn_fallback = [&](const std::string& why) {
    return gptq_rtn_fallback(quantize_rtn(w, rows, cols, scheme, opts.observer, opts.mse), w, name, why);
  };
  const GptqColumns cc = gptq_columns(hessian, cols, act_order);
  if (!cc.finite) return rtn_fallback("the Hessian has non-finite entries");
  const std::vector<char>& dead = cc.dead;
  const std::vector<int64_t>& perm = cc.perm;

  GptqResult res;
  QuantizedTensor& out = res.q;
  out.scheme = scheme;
  out.rows = rows;
  out.cols = cols;
  out.q.assign(static_cast<size_t>(rows * cols), 0);
  const int64_t ng = out.n_groups();
  const size_t np = static_cast<size_t>(out.n_params());
  out.scales.assign(np, 0.0f);
  out.zeros.assign(np, 0);

  // Channel / tensor parameters: once, on the original weight (as the references).
  std::vector<GroupParams> fixed;  // per row (channel), one (tensor)
  if (scheme.strategy == QuantStrategy::Tensor) {
    fixed.push_back(fit_group(w, rows * cols, 1, scheme, opts.observer, opts.mse));
    out.scales[0] = fixed[0].scale;
    out.zeros[0] = fixed[0].zero;
  } else if (scheme.strategy == QuantStrategy::Channel) {
    fixed.resize(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      fixed[static_cast<size_t>(r)] = fit_group(w + r * cols, cols, 1, scheme, opts.observer, opts.mse);
      out.scales[static_cast<size_t>(r)] = fixed[static_cast<size_t>(r)].scale;
      out.zeros[static_cast<size_t>(r)] = fixed[static_cast<size_t>(r)].zero;
    }
  }

  // Working weight in double, dead columns zeroed.
  std::vector<double> W(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      W[static_cast<size_t>(r * cols + c)] = dead[static_cast<size_t>(c)] ? 0.0 : static_cast<double>(w[r * cols + c]);

  // Static groups: fitted before the loop on the unpermuted (zeroed) weight.
  if (static_groups) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < ng; ++g) {
        const GroupParams p = fit_group(W.data() + r * cols + g * gs, std::min(gs, cols - g * gs), 1, scheme, opts.observer, opts.mse);
        const size_t pi = static_cast<size_t>(out.param_index(r, g));
        out.scales[pi] = p.scale;
        out.zeros[pi] = p.zero;
      }
  }

  // Act-order permutation of the columns.
  if (act_order) {
    std::vector<double> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      double* wr = W.data() + r * cols;
      for (int64_t j = 0; j < cols; ++j) row[static_cast<size_t>(j)] = wr[perm[static_cast<size_t>(j)]];
      std::copy(row.begin(), row.end(), wr);
    }
  }

  // Damped inverse Cholesky with the robust fallbacks.
  ThreadPool& pool = opts.pool ? *opts.pool : ThreadPool::global();
  Eigen::MatrixXd A(cols, cols);
  const GptqDamping damping = gptq_damp(opts.dampening_frac, cc.max_diag, [&](double frac, double floor) {
    for (int64_t j = 0; j < cols; ++j) {
      const size_t pj = static_cast<size_t>(perm[static_cast<size_t>(j)]);
      const double* hrow = hessian.data() + pj * static_cast<size_t>(cols);  // H symmetric: row pj == column pj
      for (int64_t i = 0; i < cols; ++i) A(i, j) = hrow[perm[static_cast<size_t>(i)]];
      A(j, j) = cc.diag[pj] + frac * cc.mean_diag + floor;
    }
    return inverse_cholesky_upper(A, pool);
  });
  if (!damping.ok) {
    A.resize(0, 0);
    return rtn_fallback("Cholesky of the damped Hessian failed (tried " + damping.tried + ")");
  }
  gptq_note_damping(res, damping, name);
  const double* U = A.data();  // Hinv[i, j] = U[i * cols + j], j >= i

  // Group index (in the output numbering) used for processing column j.
  // dynamic: j / gs in processing order (None: identity; Group: g_idx[perm[j]] = j / gs);
  // static: the original column's group perm[j] / gs.
  if (grouped && opts.actorder == AO::Group) {
    out.g_idx.resize(static_cast<size_t>(cols));
    for (int64_t j = 0; j < cols; ++j) out.g_idx[static_cast<size_t>(perm[static_cast<size_t>(j)])] = static_cast<int32_t>(j / gs);
  }

  // Column loop, rows in independent fixed chunks. A dynamic group's refit
  // happens only at a block's first column: blocks split at group boundaries.
  const std::vector<Chunk> chunks = partition(rows, kRowGrain);
  std::vector<double> chunk_loss(chunks.size(), 0.0);
  const int64_t bs = opts.block_size;
  pool.parallel_for(rows, kRowGrain, [&](const Chunk& ch) {
    const int64_t nr = ch.end - ch.begin;
    std::vector<double> err(static_cast<size_t>(nr * std::min(bs, cols)));
    std::vector<GroupParams> cur(static_cast<size_t>(nr));
    double loss = 0;
    for (int64_t i1 = 0; i1 < cols;) {
      int64_t i2 = std::min(i1 + bs, cols);
      if (dynamic_groups) i2 = std::min(i2, (i1 / gs + 1) * gs);  // refits see every update so far
      const int64_t count = i2 - i1;
      for (int64_t rr = 0; rr < nr; ++rr) {
        const int64_t r = ch.begin + rr;
        double* wr = W.data() + r * cols;
        hd::GptqRowQuantizer rq{GroupParams{}, nullptr, nullptr, perm.data(), gs, scheme.qmax()};
        if (dynamic_groups) {
          if (i1 % gs == 0) {
            cur[static_cast<size_t>(rr)] = fit_group(wr + i1, std::min(gs, cols - i1), 1, scheme, opts.observer, opts.mse);
            const size_t pi = static_cast<size_t>(out.param_index(r, i1 / gs));
            out.scales[pi] = cur[static_cast<size_t>(rr)].scale;
            out.zeros[pi] = cur[static_cast<size_t>(rr)].zero;
          }
          rq.fixed = cur[static_cast<size_t>(rr)];
        } else if (static_groups) {
          rq.scales = out.scales.data() + r * ng;
          rq.zeros = out.zeros.data() + r * ng;
        } else {
          rq.fixed = fixed[scheme.strategy == QuantStrategy::Tensor ? 0 : static_cast<size_t>(r)];
        }
        hd::gptq_row_block(wr, 1, out.q.data() + r * cols, U, cols, err.data() + rr * count, 1, i1, i2, rq, &loss);
      }
      if (i2 < cols) {  // lazy update of the remaining columns
        Eigen::Map<RowMat, 0, Stride> Wb(W.data() + ch.begin * cols + i2, nr, cols - i2, Stride(cols));
        Eigen::Map<const RowMat> E(err.data(), nr, count);
        Eigen::Map<const RowMat, 0, Stride> Ub(U + i1 * cols + i2, count, cols - i2, Stride(cols));
        Wb.noalias() -= E * Ub;
      }
      i1 = i2;
    }
    chunk_loss[static_cast<size_t>(ch.index)] = loss;
  });
  res.loss = 0;
  for (double l : chunk_loss) res.loss += l;
  res.loss /= 2;
  return res;
}

}  // namespace qf
