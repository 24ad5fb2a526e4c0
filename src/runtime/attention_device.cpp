#include "runtime/attention_device.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "device/rows.h"
#include "runtime/device_runtime.h"

namespace qf::QF_DEV_NS {

namespace {

// The causal softmax of one head's nk x nq scores (keys down column t):
// query t (at position nk - nq + t) sees keys lo..t (lo > 0 with a sliding
// window); its column becomes softmax over those and zero elsewhere. One
// column per (head, query) row of the 2-D spaces below, each column's max
// and sum over device::kLanes strided lanes (device/rows.h), the lanes'
// partial sums in f32 and joined in lane order.
struct SoftmaxColumn {
  int64_t nq, nk, window;
  QF_HD int64_t last(int64_t col) const { return nk - nq + col % nq; }
  QF_HD int64_t first(int64_t col) const {
    const int64_t t = last(col);
    return window > 0 && t - window + 1 > 0 ? t - window + 1 : 0;
  }
};
struct SoftmaxLaneMax {  // part[c, l] = max over lane l of column c's visible keys
  float* S;
  float* part;
  SoftmaxColumn sc;
  QF_HD void operator()(int64_t idx) const {
    const int64_t c = idx / device::kLanes, l = idx % device::kLanes;
    const int64_t lo = sc.first(c), t = sc.last(c);
    const float* col = S + c * sc.nk;
    float m = hd::float_of(0xff800000u);  // -inf: a lane past the last key keeps it
    for (int64_t i = lo + l; i <= t; i += device::kLanes) m = col[i] > m ? col[i] : m;
    part[idx] = m;
  }
};
struct SoftmaxJoinMax {
  const float* part;
  float* stat;
  QF_HD void operator()(int64_t c) const {
    float m = part[c * device::kLanes];
    for (int64_t l = 1; l < device::kLanes; ++l) m = part[c * device::kLanes + l] > m ? part[c * device::kLanes + l] : m;
    stat[c] = m;
  }
};
struct SoftmaxLaneExp {  // col[i] = e^(col[i] - max); part[c, l] = the lane's sum
  float* S;
  float* part;
  const float* stat;
  SoftmaxColumn sc;
  QF_HD void operator()(int64_t idx) const {
    const int64_t c = idx / device::kLanes, l = idx % device::kLanes;
    const int64_t lo = sc.first(c), t = sc.last(c);
    float* col = S + c * sc.nk;
    const float m = stat[c];
    float sum = 0.0f;
    for (int64_t i = lo + l; i <= t; i += device::kLanes) {
      col[i] = hd::exp_f32(col[i] - m);
      sum += col[i];
    }
    part[idx] = sum;
  }
};
struct SoftmaxJoinSum {  // stat[c] = 1 / (the lanes' sums in lane order)
  const float* part;
  float* stat;
  QF_HD void operator()(int64_t c) const {
    float sum = 0.0f;
    for (int64_t l = 0; l < device::kLanes; ++l) sum += part[c * device::kLanes + l];
    stat[c] = 1.0f / sum;
  }
};
struct SoftmaxScale {  // one index per score
  float* S;
  const float* stat;
  SoftmaxColumn sc;
  QF_HD void operator()(int64_t idx) const {
    const int64_t c = idx / sc.nk, i = idx % sc.nk;
    S[idx] = i < sc.first(c) || i > sc.last(c) ? 0.0f : S[idx] * stat[c];
  }
};

void check_shape(int64_t nq, int64_t nk, int64_t heads, int64_t kv_heads, int64_t hd) {
  if (nq <= 0 || nk < nq || heads <= 0 || kv_heads <= 0 || hd <= 0 || heads % kv_heads != 0)
    throw invalid_input("attention", "bad shape: " + std::to_string(nq) + " queries, " + std::to_string(nk) +
                                         " keys, " + std::to_string(heads) +
                                         " heads, " + std::to_string(kv_heads) + " kv heads, head dim " +
                                         std::to_string(hd));
}

}  // namespace

void causal_attention(Blas& blas, const float* q, const float* k, const float* v, float* out, int64_t nq, int64_t nk,
                      int64_t heads, int64_t kv_heads, int64_t hd, int64_t window, dvec<float>& scores) {
  check_shape(nq, nk, heads, kv_heads, hd);
  const int64_t group = heads / kv_heads, ldq = heads * hd, ldk = kv_heads * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // The scores, then the lanes' partial results and one value per column.
  const int64_t cols = group * nq, n_scores = cols * nk;
  fit(scores, n_scores + cols * device::kLanes + cols);
  float* part = raw(scores) + n_scores;
  float* stat = part + cols * device::kLanes;
  const SoftmaxColumn sc{nq, nk, window};
  for (int64_t g = 0; g < kv_heads; ++g) {
    // S_h = scale * K_g^T Q_h for the group's heads: K_g is hd x nk (column
    // i = position i's key, leading dimension ldk), Q_h hd x nq (ldq).
    blas.gemm_strided_batched(Op::T, Op::N, nk, nq, hd, scale, k + g * hd, ldk, 0, q + g * group * hd, ldq, hd, 0.0f,
                              raw(scores), nk, nk * nq, group);
    for_each_index(cols * device::kLanes, SoftmaxLaneMax{raw(scores), part, sc});
    for_each_index(cols, SoftmaxJoinMax{part, stat});
    for_each_index(cols * device::kLanes, SoftmaxLaneExp{raw(scores), part, stat, sc});
    for_each_index(cols, SoftmaxJoinSum{part, stat});
    for_each_index(n_scores, SoftmaxScale{raw(scores), stat, sc});
    // O_h = V_g P_h: hd x nq, written as token rows of `out` (ldq).
    blas.gemm_strided_batched(Op::N, Op::N, hd, nq, nk, 1.0f, v + g * hd, ldk, 0, raw(scores), nk, nk * nq, 0.0f,
                              out + g * group * hd, ldq, hd, group);
  }
}

std::vector<float> attention(const float* q, const float* k, const float* v, int64_t nq, int64_t nk, int64_t heads,
                             int64_t kv_heads, int64_t hd, int64_t window) {
  check_shape(nq, nk, heads, kv_heads, hd);
  Blas blas;
  const dvec<float> dq = upload(q, nq * heads * hd), dk = upload(k, nk * kv_heads * hd), dv = upload(v, nk * kv_heads * hd);
  dvec<float> out(static_cast<size_t>(nq * heads * hd)), scores;
  causal_attention(blas, raw(dq), raw(dk), raw(dv), raw(out), nq, nk, heads, kv_heads, hd, window, scores);
  return download(out);
}

}  // namespace qf::QF_DEV_NS
