// How far decoded values are from the originals: the one measure every
// number format's test uses (integer, FP8, NVFP4, GGUF block types,
// activation and KV-cache quantization), so that formats are compared on the
// same terms and a bound means the same thing everywhere.
//
// Fail closed: a decoded value that is NaN or infinite, or no values at all,
// makes every summary NaN (and valid() false), so a check of the form
// `EXPECT_LT(d.relative_rmse(), bound)` fails instead of passing.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace qf {

class Distortion {
 public:
  // One element. `bound` > 0 is the largest error the format allows for this
  // element (half a step, say); worst_bound_ratio() reports the worst use of it.
  void add(double original, double decoded, double bound = 0);
  // Elementwise over two equal-length sequences (InvalidInput otherwise).
  void add(const std::vector<float>& original, const std::vector<float>& decoded);

  size_t count() const { return n_; }
  size_t nonfinite() const { return nonfinite_; }
  bool valid() const { return n_ > 0 && nonfinite_ == 0; }

  double max_abs_error() const;     // max |decoded - original|
  double max_abs_original() const;  // max |original|
  double rmse() const;              // sqrt(mean (decoded - original)^2)
  // rmse / rms(original): scale-free; NaN when the originals are all zero.
  double relative_rmse() const;
  double snr_db() const;            // 10 log10(sum original^2 / sum error^2)
  // max over the elements given a bound of |error| / bound; 0 when none was.
  double worst_bound_ratio() const;
  // "n 4096, rel. RMSE 0.0721, max |err| 0.31, SNR 22.8 dB" (for failure messages).
  std::string describe() const;

 private:
  size_t n_ = 0, nonfinite_ = 0;
  double sum_sq_err_ = 0, sum_sq_orig_ = 0, max_err_ = 0, max_orig_ = 0, worst_ratio_ = 0;
};

}  // namespace qf
