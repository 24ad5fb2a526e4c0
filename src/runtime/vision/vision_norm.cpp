// Norms and activations of the vision towers, elementwise in f32 as
// transformers computes them; the norms' statistics in double, which makes
// their rounding negligible next to the matrix products'.
#include <cmath>

#include "core/error.h"
#include "runtime/vision/vision_ops.h"

namespace qf::rt::vision {

void layer_norm_rows(const Norm& nrm, const float* x, int64_t n, int64_t d, float* y) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * d;
    float* yr = y + r * d;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < d; ++i) mean += xr[i];
    mean /= static_cast<double>(d);
    for (int64_t i = 0; i < d; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= static_cast<double>(d);
    const double rstd = 1.0 / std::sqrt(var + nrm.eps);
    for (int64_t i = 0; i < d; ++i)
      yr[i] = static_cast<float>((xr[i] - mean) * rstd) * nrm.w[static_cast<size_t>(i)] + nrm.b[static_cast<size_t>(i)];
  }
}

void rms_norm_rows(const Norm& nrm, const float* x, int64_t n, int64_t d, float* y) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * d;
    float* yr = y + r * d;
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(d) + nrm.eps);
    for (int64_t i = 0; i < d; ++i) yr[i] = static_cast<float>(xr[i] * rstd) * nrm.w[static_cast<size_t>(i)];
  }
}

Activation parse_activation(const std::string& name, const std::string& where, const std::string& key) {
  if (name == "quick_gelu") return Activation::QuickGelu;
  if (name == "gelu") return Activation::Gelu;
  if (name == "gelu_pytorch_tanh" || name == "gelu_new") return Activation::GeluTanh;
  if (name == "silu" || name == "swish") return Activation::Silu;
  throw unsupported(where, key + " '" + printable_text(name) +
                               "' is not supported (supported: quick_gelu, gelu, gelu_pytorch_tanh, gelu_new, silu)");
}

void activate(Activation a, float* x, int64_t n) {
  switch (a) {
    case Activation::QuickGelu:  // x * sigmoid(1.702 x)
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] / (1.0f + std::exp(-1.702f * x[i]));
      break;
    case Activation::Gelu:  // exact: x * Phi(x)
      for (int64_t i = 0; i < n; ++i) x[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678118654752f));
      break;
    case Activation::GeluTanh:
      for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        x[i] = 0.5f * v * (1.0f + std::tanh(0.79788456080286536f * (v + 0.044715f * v * v * v)));
      }
      break;
    case Activation::Silu:
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] / (1.0f + std::exp(-x[i]));
      break;
  }
}

}  // namespace qf::rt::vision
