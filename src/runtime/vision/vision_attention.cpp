// attention: for every segment, head and block of queries, the scores
// q k^T as one GEMM tile against the head's keys, scaled and softmaxed row
// by row, then times the values as a second tile against the head's values
// transposed. Keys are packed per head and values per segment and head
// first, so that each tile reads contiguous rows of length head_dim or of
// the segment's length, which is what gemm_tile_f32 takes.
#include <algorithm>

#include "core/error.h"
#include "runtime/cpu/kernels.h"
#include "runtime/vision/vision_ops.h"

namespace qf::rt::vision {

void attention(const float* q, const float* k, const float* v, int64_t ld, int64_t n, int64_t heads,
               int64_t head_dim, float scale, const std::vector<int64_t>& segments, float* out, ThreadPool& pool) {
  if (segments.size() < 2 || segments.front() != 0 || segments.back() != n)
    throw Error(ErrorKind::Internal, "attention: segments must run from 0 to the row count");
  const int64_t E = heads * head_dim;
  std::vector<float> keys(static_cast<size_t>(n * E)), values_t(static_cast<size_t>(n * E));
  for (int64_t h = 0; h < heads; ++h)  // keys[h][t][d]
    for (int64_t t = 0; t < n; ++t)
      std::copy_n(k + t * ld + h * head_dim, head_dim, keys.data() + (h * n + t) * head_dim);
  for (size_t s = 0; s + 1 < segments.size(); ++s) {  // values_t[s0 * E + (h * hd + d) * len + j]
    const int64_t s0 = segments[s], len = segments[s + 1] - s0;
    float* base = values_t.data() + s0 * E;
    for (int64_t j = 0; j < len; ++j)
      for (int64_t c = 0; c < E; ++c) base[c * len + j] = v[(s0 + j) * ld + c];
  }

  struct Task {
    int64_t s0, len, h, q0, rows;
  };
  constexpr int64_t kQueries = 24;
  std::vector<Task> tasks;
  for (size_t s = 0; s + 1 < segments.size(); ++s) {
    const int64_t s0 = segments[s], len = segments[s + 1] - s0;
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t q0 = s0; q0 < s0 + len; q0 += kQueries)
        tasks.push_back({s0, len, h, q0, std::min(kQueries, s0 + len - q0)});
  }
  pool.parallel_for(static_cast<int64_t>(tasks.size()), 1, [&](const Chunk& c) {
    thread_local std::vector<float> scores;
    for (int64_t i = c.begin; i < c.end; ++i) {
      const Task& t = tasks[static_cast<size_t>(i)];
      scores.resize(static_cast<size_t>(t.rows * t.len));
      gemm_tile_f32(q + t.q0 * ld + t.h * head_dim, t.rows, ld, keys.data() + (t.h * n + t.s0) * head_dim, t.len,
                    head_dim, scores.data(), t.len);
      for (int64_t r = 0; r < t.rows; ++r) {
        float* row = scores.data() + r * t.len;
        for (int64_t j = 0; j < t.len; ++j) row[j] *= scale;
        softmax(row, t.len);
      }
      gemm_tile_f32(scores.data(), t.rows, t.len, values_t.data() + t.s0 * E + t.h * head_dim * t.len, head_dim, t.len,
                    out + t.q0 * E + t.h * head_dim, E);
    }
  });
}

}  // namespace qf::rt::vision
