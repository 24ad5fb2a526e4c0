// GPTQ on the device: the algorithm of gptq.h with the same shared steps
// (gptq_check, gptq_columns, gptq_damp: cheap per-column bookkeeping on the
// host) and the heavy ones on the device:
//   - H permuted, damped and reversed (J H J) by one functor per element;
//   - Cholesky (potrf, lower) and L^-1 (trsm against I), then
//     Hinv[i, j] = L^-1[n-1-i, n-1-j] (upper), as inverse_cholesky_upper;
//   - the column loop: the working weight is column-major (rows x cols,
//     leading dimension rows), so neighbouring indices touch neighbouring
//     rows. Within a block each column is quantized by one index per row
//     (QuantColumn) and the block's later columns updated by one index per
//     (column, row) (UpdateBlock): the arithmetic of the shared
//     hd::gptq_row_block, spread over rows x columns instead of one thread
//     per row, and the lazy update of the columns after a block
//     is one GEMM: W[:, i2:] -= Err * Hinv[i1:i2, i2:], with Hinv row-major
//     read as its column-major transpose (op T, leading dimension cols).
// In double, as the CPU reference. Observers: min-max and mse (each group's
// own search, quantizers/mse_search.h), not mse with the tensor strategy.
#include <cmath>

#include "core/error.h"
#include "device/blas.h"
#include "device/exec.h"
#include "quantizers/device_quantizers.h"
#include "quantizers/gptq_row.h"
#include "quantizers/mse_search.h"

namespace qf::QF_DEV_NS {

namespace {

// Column j (processing order) of the working weight: original column perm[j]
// of w, zero when dead.
struct LoadWeight {
  const float* w;
  const int64_t* perm;
  const char* dead;
  double* W;
  int64_t rows, cols;
  QF_HD void operator()(int64_t i) const {
    const int64_t j = i / rows, r = i % rows, c = perm[j];
    W[i] = dead[c] ? 0.0 : static_cast<double>(w[r * cols + c]);
  }
};

// A := J P^T (H + add I) P J, column-major n x n, P the processing order.
struct DampedReversed {
  const double* H;
  const double* diag;  // diag(H), dead columns 1
  const int64_t* perm;
  double* A;
  int64_t n;
  double add;
  QF_HD void operator()(int64_t idx) const {
    const int64_t i = idx % n, j = idx / n;          // A(i, j)
    const int64_t pi = perm[n - 1 - i], pj = perm[n - 1 - j];
    A[idx] = i == j ? diag[pj] + add : H[pj * n + pi];
  }
};

struct BadPivot {
  const double* A;
  int64_t n;
  QF_HD bool operator()(int64_t i) const {
    const double v = A[i * n + i];
    return !(v > 0.0) || !(v - v == 0.0);  // not positive, or inf/NaN
  }
};

struct SetIdentity {
  double* B;
  int64_t n;
  QF_HD void operator()(int64_t idx) const { B[idx] = idx % n == idx / n ? 1.0 : 0.0; }
};

// U row-major: U[i * n + j] = B(n-1-i, n-1-j) for j >= i, else 0 (B = L^-1
// column-major).
struct ReverseToUpper {
  const double* B;
  double* U;
  int64_t n;
  QF_HD void operator()(int64_t idx) const {
    const int64_t i = idx / n, j = idx % n;
    U[idx] = j < i ? 0.0 : B[(n - 1 - i) + (n - 1 - j) * n];
  }
};

struct BadFactor {
  const double* U;
  int64_t n;
  QF_HD bool operator()(int64_t idx) const {
    const double v = U[idx];
    if (!(v - v == 0.0)) return true;
    return idx / n == idx % n && !(v > 0.0);
  }
};

// Groups of gs columns of w's rows (the last may be shorter), one index
// per (row, group), min-max or mse: static groups (fitted on the unpermuted
// weight with dead columns zeroed) and the channel strategy (gs = cols).
struct FitGroups {
  const float* w;
  float* scales;
  int32_t* zeros;
  int64_t cols, gs, ng;
  bool mse;
  hd::MseGrid grid;  // also carries symmetric, qmax and the scale store
  QF_HD void operator()(int64_t i) const {
    const int64_t r = i / ng, c0 = (i % ng) * gs, n = gs < cols - c0 ? gs : cols - c0;
    const float* x = w + r * cols + c0;
    const GroupParams p = hd::observed_fit(x, n, 1, mse, grid);
    scales[i] = p.scale;
    zeros[i] = p.zero;
  }
};

// w with the dead columns zeroed (what static groups are fitted on).
struct ZeroDead {
  const float* w;
  const char* dead;
  float* out;
  int64_t cols;
  QF_HD void operator()(int64_t i) const { out[i] = dead[i % cols] ? 0.0f : w[i]; }
};

// A dynamic group's refit at the block starting at column i1 (processing
// order) of the working weight; also the group's output parameters.
struct RefitDynamic {
  const double* W;
  float* cur_scale;
  int32_t* cur_zero;
  float* scales;
  int32_t* zeros;
  int64_t rows, cols, gs, ng, i1;
  bool mse;
  hd::MseGrid grid;
  QF_HD void operator()(int64_t r) const {
    const int64_t n = gs < cols - i1 ? gs : cols - i1;
    const double* x = W + i1 * rows + r;
    const GroupParams p = hd::observed_fit(x, n, rows, mse, grid);
    cur_scale[r] = p.scale;
    cur_zero[r] = p.zero;
    scales[r * ng + i1 / gs] = p.scale;
    zeros[r * ng + i1 / gs] = p.zero;
  }
};

// Column i of the block starting at i1, one index per row: the row's code
// and its scaled error e = (w - q) / U[i, i] (hd::gptq_row_block's first
// half, with the same arithmetic).
struct QuantColumn {
  double* W;
  uint8_t* q;
  const double* U;
  double* E;
  double* loss;
  const int64_t* perm;
  const float* row_scale;  // per-row parameters (channel, dynamic group), or null
  const int32_t* row_zero;
  const float* scales;     // static groups: [rows * ng], or null
  const int32_t* zeros;
  GroupParams tensor_p;
  int64_t rows, cols, gs, ng, i1, i;
  int32_t qmax;
  QF_HD void operator()(int64_t r) const {
    GroupParams p = tensor_p;
    if (row_scale) p = GroupParams{row_scale[r], row_zero[r]};
    if (scales) {
      const int64_t g = perm[i] / gs;
      p = GroupParams{scales[r * ng + g], zeros[r * ng + g]};
    }
    const double x = W[i * rows + r];
    const uint8_t code = hd::quantize_int(static_cast<float>(x), p.scale, p.zero, qmax);
    q[r * cols + perm[i]] = code;
    const double e = (x - hd::dequantize_int(code, p.scale, p.zero)) / U[i * cols + i];
    loss[r] = hd::mul_add_unfused(e, e, loss[r]);
    E[(i - i1) * rows + r] = e;
  }
};

// The rest of the block after column i, one index per (column, row):
// W[j, r] -= E[i, r] * U[i, j], rounded twice as the CPU does.
struct UpdateBlock {
  double* W;
  const double* U;
  const double* E;
  int64_t rows, cols, i1, i;
  QF_HD void operator()(int64_t idx) const {
    const int64_t j = i + 1 + idx / rows, r = idx % rows;
    W[j * rows + r] = hd::mul_add_unfused(-E[(i - i1) * rows + r], U[i * cols + j], W[j * rows + r]);
  }
};

}  // namespace

GptqResult gptq_quantize(const float* w, int64_t rows, int64_t cols, const std::vector<double>& hessian,
                         const QuantScheme& scheme, const GptqOptions& opts, const std::string& name) {
  using AO = GptqOptions::ActOrder;
  gptq_check(w, rows, cols, hessian, scheme, opts, name);
  const bool mse = opts.observer == RangeObserver::Mse;
  if (mse && scheme.strategy == QuantStrategy::Tensor)
    throw unsupported(name, "the mse observer with the tensor strategy has no device version (one search over the "
                            "whole weight); quantize it with --device cpu");

  const bool grouped = scheme.strategy == QuantStrategy::Group;
  const int64_t gs = grouped ? scheme.group_size : cols;
  const bool act_order = opts.actorder == AO::Group || opts.actorder == AO::Weight;
  const bool static_groups = grouped && (opts.actorder == AO::Static || opts.actorder == AO::Weight);
  const bool dynamic_groups = grouped && !static_groups;
  const bool sym = scheme.symmetric;
  const int32_t qmax = scheme.qmax();
  const hd::ScaleStore store = scale_store(scheme.scale_dtype);
  const hd::MseGrid grid = mse_grid(scheme, opts.mse);

  auto rtn_fallback = [&](const std::string& why) {
    return gptq_rtn_fallback(qf::QF_DEV_NS::quantize_rtn(w, rows, cols, scheme, opts.observer, opts.mse), w, name,
                             why);
  };
  const GptqColumns cc = gptq_columns(hessian, cols, act_order);
  if (!cc.finite) return rtn_fallback("the Hessian has non-finite entries");

  GptqResult res;
  QuantizedTensor& out = res.q;
  out.scheme = scheme;
  out.rows = rows;
  out.cols = cols;
  const int64_t ng = out.n_groups();
  const int64_t np = out.n_params();

  const dvec<float> dw = upload(w, rows * cols);
  const dvec<int64_t> dperm = upload(cc.perm.data(), cols);
  const dvec<char> ddead = upload(cc.dead.data(), cols);
  const dvec<double> ddiag = upload(cc.diag.data(), cols);
  dvec<float> dscales(static_cast<size_t>(np), 0.0f);
  dvec<int32_t> dzeros(static_cast<size_t>(np), 0);
  dvec<float> row_scale;  // channel parameters, or the current dynamic group's
  dvec<int32_t> row_zero;
  GroupParams tensor_p{};

  if (scheme.strategy == QuantStrategy::Tensor) {
    const Range rg = range_of(raw(dw), rows * cols);
    tensor_p = hd::params_for_range(rg.lo, rg.hi, sym, qmax, store);
    dscales[0] = tensor_p.scale;
    dzeros[0] = tensor_p.zero;
  } else if (scheme.strategy == QuantStrategy::Channel || dynamic_groups) {
    row_scale.resize(static_cast<size_t>(rows));
    row_zero.resize(static_cast<size_t>(rows));
    if (scheme.strategy == QuantStrategy::Channel) {
      for_each_index(rows, FitGroups{raw(dw), raw(row_scale), raw(row_zero), cols, cols, 1, mse, grid});
      thrust::copy(row_scale.begin(), row_scale.end(), dscales.begin());
      thrust::copy(row_zero.begin(), row_zero.end(), dzeros.begin());
    }
  }
  if (static_groups) {
    dvec<float> w0(static_cast<size_t>(rows * cols));
    for_each_index(rows * cols, ZeroDead{raw(dw), raw(ddead), raw(w0), cols});
    for_each_index(rows * ng, FitGroups{raw(w0), raw(dscales), raw(dzeros), cols, gs, ng, mse, grid});
  }

  // Working weight, column-major in processing order.
  dvec<double> W(static_cast<size_t>(rows * cols));
  for_each_index(rows * cols, LoadWeight{raw(dw), raw(dperm), raw(ddead), raw(W), rows, cols});

  // Damped inverse Cholesky with the shared fallback schedule.
  Blas blas;
  const dvec<double> H = upload(hessian.data(), cols * cols);
  dvec<double> A(static_cast<size_t>(cols * cols)), B(static_cast<size_t>(cols * cols));
  const GptqDamping damping = gptq_damp(opts.dampening_frac, cc.max_diag, [&](double frac, double floor) {
    for_each_index(cols * cols,
                   DampedReversed{raw(H), raw(ddiag), raw(dperm), raw(A), cols, frac * cc.mean_diag + floor});
    if (blas.potrf(Uplo::Lower, cols, raw(A), cols) != 0) return false;
    if (count_if_index(cols, BadPivot{raw(A), cols}) > 0) return false;
    for_each_index(cols * cols, SetIdentity{raw(B), cols});
    blas.trsm(Side::Left, Uplo::Lower, Op::N, Diag::NonUnit, cols, cols, 1.0, raw(A), cols, raw(B), cols);
    for_each_index(cols * cols, ReverseToUpper{raw(B), raw(A), cols});  // A := Hinv, row-major
    return count_if_index(cols * cols, BadFactor{raw(A), cols}) == 0;
  });
  if (!damping.ok) return rtn_fallback("Cholesky of the damped Hessian failed (tried " + damping.tried + ")");
  gptq_note_damping(res, damping, name);
  B = dvec<double>();  // free
  const double* U = raw(A);

  if (grouped && opts.actorder == AO::Group) {
    out.g_idx.resize(static_cast<size_t>(cols));
    for (int64_t j = 0; j < cols; ++j)
      out.g_idx[static_cast<size_t>(cc.perm[static_cast<size_t>(j)])] = static_cast<int32_t>(j / gs);
  }

  // Column loop.
  const int64_t bs = opts.block_size;
  dvec<uint8_t> dq(static_cast<size_t>(rows * cols), 0);
  dvec<double> E(static_cast<size_t>(rows * (bs < cols ? bs : cols)));
  dvec<double> loss(static_cast<size_t>(rows), 0.0);
  for (int64_t i1 = 0; i1 < cols;) {
    int64_t i2 = i1 + bs < cols ? i1 + bs : cols;
    if (dynamic_groups && (i1 / gs + 1) * gs < i2) i2 = (i1 / gs + 1) * gs;
    if (dynamic_groups && i1 % gs == 0)
      for_each_index(rows, RefitDynamic{raw(W), raw(row_scale), raw(row_zero), raw(dscales), raw(dzeros), rows, cols,
                                        gs, ng, i1, mse, grid});
    for (int64_t i = i1; i < i2; ++i) {
      for_each_index(rows, QuantColumn{raw(W), raw(dq), U, raw(E), raw(loss), raw(dperm),
                                       row_scale.empty() ? nullptr : raw(row_scale),
                                       row_zero.empty() ? nullptr : raw(row_zero),
                                       static_groups ? raw(dscales) : nullptr, static_groups ? raw(dzeros) : nullptr,
                                       tensor_p, rows, cols, gs, ng, i1, i, qmax});
      for_each_index(rows * (i2 - i - 1), UpdateBlock{raw(W), U, raw(E), rows, cols, i1, i});
    }
    if (i2 < cols)  // W[:, i2:] -= Err * Hinv[i1:i2, i2:]
      blas.gemm(Op::N, Op::T, rows, cols - i2, i2 - i1, -1.0, raw(E), rows, U + i1 * cols + i2, cols, 1.0,
                raw(W) + i2 * rows, rows);
    i1 = i2;
  }
  out.q = download(dq);
  out.scales = download(dscales);
  out.zeros = download(dzeros);
  res.loss = 0;  // summed here in row order: the same whatever the thread count
  for (double l : download(loss)) res.loss += l;
  res.loss /= 2;
  return res;
}

}  // namespace qf::QF_DEV_NS
