#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace qf::rt {

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

Sampler::Sampler(SamplerOptions o) : o_(o), state_(o.seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull) {
  if (!(o_.temperature >= 0.f) || !std::isfinite(o_.temperature))
    throw Error(ErrorKind::Usage, "--temperature must be a finite value >= 0");
  if (!(o_.top_p > 0.f && o_.top_p <= 1.f)) throw Error(ErrorKind::Usage, "--top-p must be in (0, 1]");
  if (state_ == 0) state_ = 1;
}

float Sampler::uniform() {
  state_ ^= state_ >> 12;
  state_ ^= state_ << 25;
  state_ ^= state_ >> 27;
  return static_cast<float>((state_ * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

int32_t Sampler::sample(const float* logits, int64_t n) {
  if (o_.temperature == 0.f) return argmax(logits, n);
  std::vector<float> p(logits, logits + n);
  const float mx = *std::max_element(p.begin(), p.end());
  double sum = 0.0;
  for (float& v : p) {
    v = std::exp((v - mx) / o_.temperature);
    sum += v;
  }
  for (float& v : p) v = static_cast<float>(v / sum);
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  int64_t keep = n;
  if (o_.top_p < 1.f) {
    std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    double cum = 0.0;
    for (keep = 0; keep < n;) {
      cum += p[idx[static_cast<size_t>(keep)]];
      ++keep;
      if (cum >= o_.top_p) break;
    }
  }
  double mass = 0.0;
  for (int64_t i = 0; i < keep; ++i) mass += p[idx[static_cast<size_t>(i)]];
  const double r = uniform() * mass;
  double cum = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    cum += p[idx[static_cast<size_t>(i)]];
    if (r < cum) return idx[static_cast<size_t>(i)];
  }
  return idx[static_cast<size_t>(keep - 1)];
}

}  // namespace qf::rt
