// GPTQ's Hessian on the device: each added batch becomes x^T x in the
// lower triangle of a running sum (syrk, beta 1: the rows of x, row-major,
// are the columns of a column-major cols x n matrix), scaled by 2/N and
// mirrored into the upper triangle when read.
#include "core/error.h"
#include "device/blas.h"
#include "device/exec.h"
#include "quantizers/device_quantizers.h"

namespace qf::QF_DEV_NS {

namespace {

struct ToDouble {
  const float* x;
  double* y;
  QF_HD void operator()(int64_t i) const { y[i] = static_cast<double>(x[i]); }
};

// Upper triangle := lower triangle; both scaled by `scale`.
struct ScaleSymmetric {
  const double* S;
  double* H;
  int64_t n;
  double scale;
  QF_HD void operator()(int64_t idx) const {
    const int64_t i = idx % n, j = idx / n;
    H[idx] = scale * (i >= j ? S[idx] : S[j + i * n]);
  }
};

}  // namespace

struct HessianSum::State {
  int64_t cols = 0, n = 0;
  dvec<double> sum;  // lower triangle of sum x x^T, column-major
  dvec<double> xd;   // the added rows in double, kept between calls
  Blas blas;
};

HessianSum::HessianSum(int64_t cols) : s_(std::make_unique<State>()) {
  if (cols <= 0) throw invalid_input("hessian", "column count must be positive, got " + std::to_string(cols));
  s_->cols = cols;
  fill(s_->sum, cols * cols, 0.0);
}

HessianSum::~HessianSum() = default;

void HessianSum::add(const float* x, int64_t n_rows) {
  if (n_rows <= 0) return add_device(nullptr, n_rows);
  const dvec<float> xf = upload(x, n_rows * s_->cols);
  add_device(raw(xf), n_rows);
}

void HessianSum::add_device(const float* x, int64_t n_rows) {
  if (n_rows < 0) throw invalid_input("hessian", "negative row count");
  if (n_rows == 0) return;
  const int64_t c = s_->cols;
  fit(s_->xd, n_rows * c);
  for_each_index(n_rows * c, ToDouble{x, raw(s_->xd)});
  s_->blas.syrk(Uplo::Lower, Op::N, c, n_rows, 1.0, raw(s_->xd), c, 1.0, raw(s_->sum), c);
  s_->n += n_rows;
}

int64_t HessianSum::samples() const { return s_->n; }

std::vector<double> HessianSum::matrix() const {
  if (s_->n == 0) throw invalid_input("hessian", "Hessian has no calibration samples");
  const int64_t c = s_->cols;
  dvec<double> h(static_cast<size_t>(c * c));
  for_each_index(c * c, ScaleSymmetric{raw(s_->sum), raw(h), c, 2.0 / static_cast<double>(s_->n)});
  return download(h);
}

}  // namespace qf::QF_DEV_NS
