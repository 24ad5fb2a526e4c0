#include "runtime/attention_device.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "runtime/device_runtime.h"

namespace qf::QF_DEV_NS {

namespace {

// Column t of one head's nk x nq scores (keys down the column): softmax over
// the keys query t (at position nk - nq + t) may see, zero elsewhere. One
// index per (head, query).
struct CausalSoftmax {
  float* S;
  int64_t nq, nk, window;
  QF_HD void operator()(int64_t idx) const {
    float* col = S + idx * nk;
    const int64_t t = nk - nq + idx % nq;
    const int64_t lo = window > 0 && t - window + 1 > 0 ? t - window + 1 : 0;
    float m = col[lo];
    for (int64_t i = lo + 1; i <= t; ++i) m = col[i] > m ? col[i] : m;
    float sum = 0.0f;
    for (int64_t i = lo; i <= t; ++i) {
      col[i] = hd::exp_f32(col[i] - m);
      sum += col[i];
    }
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < nk; ++i) col[i] = i < lo || i > t ? 0.0f : col[i] * inv;
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
  scores.resize(static_cast<size_t>(group * nq * nk));
  for (int64_t g = 0; g < kv_heads; ++g) {
    // S_h = scale * K_g^T Q_h for the group's heads: K_g is hd x nk (column
    // i = position i's key, leading dimension ldk), Q_h hd x nq (ldq).
    blas.gemm_strided_batched(Op::T, Op::N, nk, nq, hd, scale, k + g * hd, ldk, 0, q + g * group * hd, ldq, hd, 0.0f,
                              raw(scores), nk, nk * nq, group);
    for_each_index(group * nq, CausalSoftmax{raw(scores), nq, nk, window});
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
