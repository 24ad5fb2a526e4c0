#include "quantizers/gptq.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "core/thread_pool.h"
#include "quantizers/cholesky_f64.h"
#include "quantizers/gemm_f64.h"
#include "quantizers/gptq_row.h"
#include "quantizers/gptq_row_cpu.h"
#include "quantizers/hessian_update.h"

namespace qf {

namespace {

constexpr int64_t kHessianRowGrain = 24;  // rows of H per task (the upper triangle: earlier rows are longer)
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
// one triangular inverse (~2n^3/3 flops instead of ~8n^3/3), both blocked on
// the SIMD kernels of gemm_f64 and the pool (quantizers/cholesky_f64.h).
// On entry `a` holds J H J (the damped, permuted H with its rows and
// columns reversed; only the lower triangle is read), n x n row-major; on
// success it holds Hinv row-major: Hinv[i, j] = a[i * n + j] for j >= i
// (entries below the diagonal are 0). Everything happens in `a`: the
// factor, its inverse and the reversal need no second n x n buffer.
bool inverse_cholesky_upper(double* a, int64_t n, ThreadPool& pool) {
  const SimdLevel level = simd_level();
  if (!cholesky_lower_f64(a, n, n, level, &pool)) return false;
  invert_lower_f64(a, n, n, level, &pool);  // B = L^-1, lower, over L
  // Hinv[i, j] = B[n-1-i, n-1-j]: reversing B's elements makes it upper.
  std::reverse(a, a + n * n);
  for (int64_t i = 0; i < n; ++i) {
    const double* row = a + i * n;
    for (int64_t j = i; j < n; ++j)
      if (!std::isfinite(row[j])) return false;
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
  if (n_rows == 0) return;
  finished_ = false;
  cache_.p->clear();
  for (int64_t r = 0; r < n_rows;) {
    if (pending_rows_ == 0 && n_rows - r >= kChunk) {  // a whole chunk straight from the caller's rows
      apply(x + r * cols, kChunk, pool);
      r += kChunk;
      continue;
    }
    const int64_t take = std::min<int64_t>(n_rows - r, kChunk - static_cast<int64_t>(pending_rows_));
    pending_.insert(pending_.end(), x + r * cols, x + (r + take) * cols);
    pending_rows_ += static_cast<size_t>(take);
    r += take;
    if (static_cast<int64_t>(pending_rows_) == kChunk) flush(pool);
  }
}

void HessianAccumulator::apply(const float* x, int64_t m, ThreadPool* pool) {
  const int64_t n = cols_;
  const double keep = static_cast<double>(n_) / static_cast<double>(n_ + m);
  n_ += m;
  const double scale = 2.0 / static_cast<double>(n_);
  // H = keep * H + 2/N X^T X on one triangle: each chunk's sums in f32,
  // SIMD across columns, the same doubles at every level (hessian_update.h).
  const SimdLevel level = simd_level();
  auto task = [&](const Chunk& ch) { hessian_update_rows(h_.data(), x, m, n, n, keep, scale, ch.begin, ch.end, level); };
  if (pool) {
    pool->parallel_for(n, kHessianRowGrain, task);
  } else {
    for (const Chunk& ch : partition(n, kHessianRowGrain)) task(ch);
  }
}

void HessianAccumulator::flush(ThreadPool* pool) {
  if (pending_rows_ == 0) return;
  apply(pending_.data(), static_cast<int64_t>(pending_rows_), pool);
  pending_.clear();
  pending_rows_ = 0;
}

void HessianAccumulator::finish(ThreadPool* pool) {
  flush(pool);
  if (!finished_) mirror_upper(h_.data(), cols_);  // exact symmetry
  finished_ = true;
}

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
    throw Error(ErrorKind::Internal, "hessian: matrix() read with rows added since the last finish() (" +
                                         std::to_string(pending_rows_) + " not yet applied); call finish() first");
  return h_;
}

// ---- GPTQ ---------------------------------------------------------------------

std::shared_ptr<const GptqFactor> GptqFactorCache::get(bool act_order, double dampening_frac, int64_t cols,
                                                       const std::function<std::shared_ptr<const GptqFactor>()>& make) {
  std::lock_guard<std::mutex> lock(mu_);
  if (factor_ && factor_->act_order == act_order && factor_->dampening_frac == dampening_frac && factor_->cols == cols)
    return factor_;
  factor_.reset();  // freed before the next one is made
  factor_ = make();
  return factor_;
}

void GptqFactorCache::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  factor_.reset();
}

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

  // Damped inverse Cholesky with the robust fallbacks; a factor another
  // Linear already computed from the same Hessian and settings is reused.
  ThreadPool& pool = opts.pool ? *opts.pool : ThreadPool::global();
  double factor_flops = 0;
  const auto make_factor = [&] {
    auto f = std::make_shared<GptqFactor>();
    f->act_order = act_order, f->dampening_frac = opts.dampening_frac, f->cols = cols;
    // J A J of the damped, permuted H: the lower triangle only (the
    // factorization reads no more), no zero-fill of the rest.
    std::unique_ptr<double[]> a;
    f->damping = gptq_damp(opts.dampening_frac, cc.max_diag, [&](double frac, double floor) {
      factor_flops += 2.0 * static_cast<double>(cols) * static_cast<double>(cols) * static_cast<double>(cols) / 3.0;
      if (!a) a.reset(new double[static_cast<size_t>(cols * cols)]);
      for (int64_t i = 0; i < cols; ++i) {
        const size_t pi = static_cast<size_t>(perm[static_cast<size_t>(cols - 1 - i)]);
        const double* hrow = hessian.data() + pi * static_cast<size_t>(cols);
        double* arow = a.get() + i * cols;
        for (int64_t j = 0; j < i; ++j) arow[j] = hrow[perm[static_cast<size_t>(cols - 1 - j)]];
        arow[i] = cc.diag[pi] + frac * cc.mean_diag + floor;
      }
      return inverse_cholesky_upper(a.get(), cols, pool);
    });
    if (f->damping.ok) f->hinv = std::move(a);
    return std::shared_ptr<const GptqFactor>(std::move(f));
  };
  const std::shared_ptr<const GptqFactor> factor =
      opts.factor_cache ? opts.factor_cache->get(act_order, opts.dampening_frac, cols, make_factor) : make_factor();
  if (!factor->damping.ok) return rtn_fallback("Cholesky of the damped Hessian failed (tried " + factor->damping.tried + ")");
  gptq_note_damping(res, factor->damping, name);
  res.flops = factor_flops;
  const double* U = factor->hinv.get();  // Hinv[i, j] = U[i * cols + j], j >= i

  // Group index (in the output numbering) used for processing column j.
  // dynamic: j / gs in processing order (None: identity; Group: g_idx[perm[j]] = j / gs);
  // static: the original column's group perm[j] / gs.
  if (grouped && opts.actorder == AO::Group) {
    out.g_idx.resize(static_cast<size_t>(cols));
    for (int64_t j = 0; j < cols; ++j) out.g_idx[static_cast<size_t>(perm[static_cast<size_t>(j)])] = static_cast<int32_t>(j / gs);
  }

  // Column loop, block by block: the block's columns row by row (rows are
  // independent: fixed chunks on the pool), then the lazy update of every
  // later column as one product on the SIMD kernels (gemm_f64). A dynamic
  // group's refit happens only at a block's first column: blocks split at
  // group boundaries.
  const std::vector<Chunk> chunks = partition(rows, kRowGrain);
  std::vector<double> chunk_loss(chunks.size(), 0.0);
  const int64_t bs = opts.block_size;
  std::vector<double> err(static_cast<size_t>(rows * std::min(bs, cols)));
  std::vector<GroupParams> cur(static_cast<size_t>(rows));
  const SimdLevel level = simd_level();
  for (int64_t i1 = 0; i1 < cols;) {
    int64_t i2 = std::min(i1 + bs, cols);
    if (dynamic_groups) i2 = std::min(i2, (i1 / gs + 1) * gs);  // refits see every update so far
    const int64_t count = i2 - i1;
    const int width = gptq_rows_width(level);
    pool.parallel_for(rows, kRowGrain, [&](const Chunk& ch) {
      double* loss = &chunk_loss[static_cast<size_t>(ch.index)];  // summed in column order, as one chain per chunk
      // Each row's quantizer for this block (a dynamic group is refitted at its first column).
      auto row_params = [&](int64_t r) -> const GroupParams* {
        double* wr = W.data() + r * cols;
        if (dynamic_groups) {
          if (i1 % gs == 0) {
            cur[static_cast<size_t>(r)] = fit_group(wr + i1, std::min(gs, cols - i1), 1, scheme, opts.observer, opts.mse);
            const size_t pi = static_cast<size_t>(out.param_index(r, i1 / gs));
            out.scales[pi] = cur[static_cast<size_t>(r)].scale;
            out.zeros[pi] = cur[static_cast<size_t>(r)].zero;
          }
          return &cur[static_cast<size_t>(r)];
        }
        if (static_groups) return nullptr;
        return &fixed[scheme.strategy == QuantStrategy::Tensor ? 0 : static_cast<size_t>(r)];
      };
      for (int64_t r = ch.begin; r < ch.end;) {
        if (width > 0) {  // `width` rows at once, each run as the row loop below runs it
          GptqRows g;
          g.n = static_cast<int>(std::min<int64_t>(width, ch.end - r));
          g.per_group = static_groups;
          for (int k = 0; k < g.n; ++k) {
            const int64_t rk = r + k;
            const GroupParams* gp = row_params(rk);
            g.w[k] = W.data() + rk * cols;
            g.q[k] = out.q.data() + rk * cols;
            g.err[k] = err.data() + rk * count;
            g.scale[k] = gp ? &gp->scale : out.scales.data() + rk * ng;
            g.zero[k] = gp ? &gp->zero : out.zeros.data() + rk * ng;
          }
          gptq_rows_block(g, U, cols, i1, i2, perm.data(), gs, scheme.qmax(), level);
          for (int k = 0; k < g.n; ++k)  // the loss, row by row in column order
            for (int64_t i = 0; i < count; ++i) {
              const double e = g.err[k][i];
              *loss = hd::mul_add_unfused(e, e, *loss);
            }
          r += g.n;
          continue;
        }
        hd::GptqRowQuantizer rq{GroupParams{}, nullptr, nullptr, perm.data(), gs, scheme.qmax()};
        if (const GroupParams* gp = row_params(r)) {
          rq.fixed = *gp;
        } else {
          rq.scales = out.scales.data() + r * ng;
          rq.zeros = out.zeros.data() + r * ng;
        }
        hd::gptq_row_block(W.data() + r * cols, 1, out.q.data() + r * cols, U, cols, err.data() + r * count, 1, i1, i2,
                           rq, loss);
        ++r;
      }
    });
    res.flops += static_cast<double>(rows) * static_cast<double>(count) * static_cast<double>(count - 1);
    if (i2 < cols) {  // W[:, i2:] -= Err U[i1:i2, i2:]
      res.flops += 2.0 * static_cast<double>(rows) * static_cast<double>(count) * static_cast<double>(cols - i2);
      GemmF64 g;
      g.m = rows, g.n = cols - i2, g.k = count;
      g.a = err.data(), g.lda = count;
      g.b = U + i1 * cols + i2, g.ldb = cols;
      g.c = W.data() + i2, g.ldc = cols;
      gemm_f64(g, level, &pool);
    }
    i1 = i2;
  }
  res.loss = 0;
  for (double l : chunk_loss) res.loss += l;
  res.loss /= 2;
  return res;
}

}  // namespace qf
