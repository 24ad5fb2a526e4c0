// Next-token sampling: greedy at temperature 0, otherwise softmax(logits / T)
// restricted to the smallest set of tokens whose probability reaches top_p,
// drawn with a seeded xorshift generator (same seed, same tokens).
#pragma once

#include <cstdint>

namespace qf::rt {

struct SamplerOptions {
  float temperature = 0.f;
  float top_p = 1.f;
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(SamplerOptions o);
  int32_t sample(const float* logits, int64_t n);

 private:
  float uniform();  // [0, 1)
  SamplerOptions o_;
  uint64_t state_;
};

// Index of the largest value (the first one on ties).
int32_t argmax(const float* x, int64_t n);

}  // namespace qf::rt
