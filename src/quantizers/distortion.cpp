#include "quantizers/distortion.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"

namespace qf {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}

void Distortion::add(double original, double decoded, double bound) {
  ++n_;
  if (!std::isfinite(decoded) || !std::isfinite(original)) {
    ++nonfinite_;
    return;
  }
  const double e = std::fabs(decoded - original);
  sum_sq_err_ += e * e;
  sum_sq_orig_ += original * original;
  max_err_ = std::max(max_err_, e);
  max_orig_ = std::max(max_orig_, std::fabs(original));
  if (bound > 0) worst_ratio_ = std::max(worst_ratio_, e / bound);
}

void Distortion::add(const std::vector<float>& original, const std::vector<float>& decoded) {
  if (original.size() != decoded.size())
    throw invalid_input("distortion", std::to_string(original.size()) + " originals but " +
                                          std::to_string(decoded.size()) + " decoded values");
  for (size_t i = 0; i < original.size(); ++i) add(original[i], decoded[i]);
}

double Distortion::max_abs_error() const { return valid() ? max_err_ : kNaN; }
double Distortion::max_abs_original() const { return valid() ? max_orig_ : kNaN; }
double Distortion::rmse() const { return valid() ? std::sqrt(sum_sq_err_ / static_cast<double>(n_)) : kNaN; }

double Distortion::relative_rmse() const {
  if (!valid() || sum_sq_orig_ == 0) return kNaN;
  return std::sqrt(sum_sq_err_ / sum_sq_orig_);
}

double Distortion::snr_db() const {
  if (!valid() || sum_sq_orig_ == 0) return kNaN;
  if (sum_sq_err_ == 0) return std::numeric_limits<double>::infinity();
  return 10 * std::log10(sum_sq_orig_ / sum_sq_err_);
}

double Distortion::worst_bound_ratio() const { return valid() ? worst_ratio_ : kNaN; }

std::string Distortion::describe() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "n %zu, rel. RMSE %.4g, max |err| %.4g, SNR %.3g dB%s", n_, relative_rmse(),
                max_abs_error(), snr_db(), nonfinite_ ? ", non-finite values" : "");
  return buf;
}

}  // namespace qf
