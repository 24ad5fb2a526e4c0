// RoPE frequencies, computed in float32 as the reference implementations do.
#include <cmath>
#include <string>

#include "core/error.h"
#include "runtime/model.h"

namespace qf::rt {

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int64_t hd = c.head_dim;
  std::vector<float> f(static_cast<size_t>(hd / 2));
  for (int64_t i = 0; i < hd / 2; ++i)
    f[static_cast<size_t>(i)] =
        1.0f / std::pow(static_cast<float>(c.rope_theta), static_cast<float>(2 * i) / static_cast<float>(hd));
  if (!c.rope_scaling) return f;
  const RopeScaling& s = *c.rope_scaling;
  if (s.type == "default" || s.type.empty()) return f;
  if (s.type == "linear") {
    for (float& x : f) x /= static_cast<float>(s.factor);
    return f;
  }
  if (s.type == "llama3") {
    if (!s.low_freq_factor || !s.high_freq_factor || !s.original_max_position_embeddings)
      throw invalid_input("config.json", "rope_scaling llama3 needs low_freq_factor, high_freq_factor and "
                                         "original_max_position_embeddings");
    const double old_ctx = static_cast<double>(*s.original_max_position_embeddings);
    const double lo = *s.low_freq_factor, hi = *s.high_freq_factor, factor = s.factor;
    const double low_wavelen = old_ctx / lo, high_wavelen = old_ctx / hi;
    for (float& x : f) {
      const double wavelen = 2.0 * M_PI / x;
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) {
        x = static_cast<float>(x / factor);
      } else {
        const double smooth = (old_ctx / wavelen - lo) / (hi - lo);
        x = static_cast<float>((1.0 - smooth) * x / factor + smooth * x);
      }
    }
    return f;
  }
  throw unsupported("config.json", "rope_scaling type '" + s.type +
                                       "' is not supported by the runtime (supported: default, linear, llama3)");
}

}  // namespace qf::rt
