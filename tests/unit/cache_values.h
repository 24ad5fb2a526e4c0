// Reads back what a runtime KvCache holds for one sequence, in the layout the
// test reference (reference_llama.h) takes.
#pragma once

#include <cstdint>
#include <vector>

#include "reference_llama.h"
#include "runtime/kv_cache.h"

namespace qf::test {

// K and V of positions [0, positions) of sequence `seq`, every layer and KV head.
inline reference::CacheValues cache_values(const rt::KvCache& cache, int32_t seq, int64_t layers, int64_t kv_heads,
                                           int64_t head_dim, int64_t positions) {
  reference::CacheValues cv;
  const size_t kvd = static_cast<size_t>(kv_heads * head_dim), n = static_cast<size_t>(positions);
  cv.k.assign(static_cast<size_t>(layers), std::vector<std::vector<float>>(n, std::vector<float>(kvd)));
  cv.v = cv.k;
  std::vector<float> buf(n * static_cast<size_t>(head_dim));
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t h = 0; h < kv_heads; ++h) {
      const size_t ls = static_cast<size_t>(l), off = static_cast<size_t>(h * head_dim);
      cache.load_k_rows(l, seq, h, 0, positions, buf.data());  // [p][d]
      for (size_t p = 0; p < n; ++p)
        for (size_t d = 0; d < static_cast<size_t>(head_dim); ++d) cv.k[ls][p][off + d] = buf[p * static_cast<size_t>(head_dim) + d];
      cache.load_v_cols(l, seq, h, 0, positions, buf.data());  // [d][p]
      for (size_t p = 0; p < n; ++p)
        for (size_t d = 0; d < static_cast<size_t>(head_dim); ++d) cv.v[ls][p][off + d] = buf[d * n + p];
    }
  return cv;
}

}  // namespace qf::test
