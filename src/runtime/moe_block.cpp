// Model::moe_block: the sparse MLP of a mixture-of-experts layer.
#include <cmath>
#include <vector>

#include "runtime/cpu/kernels.h"
#include "runtime/model.h"

namespace qf::rt {
namespace {

// down(silu(gate(x)) * up(x)) for m rows of x into y [m, hidden].
void run_expert(const ExpertWeights& e, int64_t layer, int64_t expert, const float* x, int64_t m, int64_t h, float* y,
                ThreadPool& pool, LinearObserver* obs) {
  const int64_t ff = e.gate->out_features();
  thread_local std::vector<float> g, u;
  g.resize(static_cast<size_t>(m * ff)), u.resize(g.size());
  if (obs) obs->observe_expert(layer, expert, LinearObserver::Gate, x, m, h);
  e.gate->forward(x, m, g.data(), pool);
  e.up->forward(x, m, u.data(), pool);
  for (int64_t t = 0; t < m; ++t) swiglu(g.data() + t * ff, u.data() + t * ff, ff);
  if (obs) obs->observe_expert(layer, expert, LinearObserver::Down, g.data(), m, ff);
  e.down->forward(g.data(), m, y, pool);
}

}  // namespace

void Model::moe_block(int64_t li, const float* xn, int64_t n, float* out, ThreadPool& pool, LinearObserver* obs) const {
  const ModelConfig& c = config_;
  const MoeWeights& m = w_.layers[static_cast<size_t>(li)].moe;
  const int64_t h = c.hidden_size, ne = c.num_experts, k = c.num_experts_per_tok;
  if (obs) obs->observe_moe_input(li, xn, n, h);
  std::vector<float> probs(static_cast<size_t>(n * ne));
  m.router->forward(xn, n, probs.data(), pool);
  std::vector<int32_t> choice(static_cast<size_t>(n * k));
  std::vector<float> weight(choice.size());
  for (int64_t t = 0; t < n; ++t) {
    float* p = probs.data() + t * ne;
    softmax(p, ne);
    int32_t* ch = choice.data() + t * k;
    float* w = weight.data() + t * k;
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {  // the largest not yet taken; ties go to the lower index
      int32_t best = -1;
      for (int32_t e = 0; e < ne; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken = taken || ch[i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      ch[j] = best, w[j] = p[best], sum += p[best];
    }
    if (c.norm_topk_prob)
      for (int64_t j = 0; j < k; ++j) w[j] /= sum;
  }
  if (obs) obs->observe_routing(li, choice.data(), weight.data(), n, k);

  // Each expert runs once on the rows routed to it (in token order); every
  // token's outputs add up in expert order, whatever the batch holds.
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(ne));
  std::vector<std::vector<float>> row_w(static_cast<size_t>(ne));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const auto e = static_cast<size_t>(choice[static_cast<size_t>(t * k + j)]);
      rows[e].push_back(t), row_w[e].push_back(weight[static_cast<size_t>(t * k + j)]);
    }
  for (int64_t i = 0; i < n * h; ++i) out[i] = 0.0f;
  std::vector<float> x, y;
  for (int64_t e = 0; e < ne; ++e) {
    const std::vector<int64_t>& r = rows[static_cast<size_t>(e)];
    if (r.empty()) continue;
    const auto me = static_cast<int64_t>(r.size());
    x.resize(static_cast<size_t>(me * h)), y.resize(x.size());
    for (int64_t i = 0; i < me; ++i)
      std::copy(xn + r[static_cast<size_t>(i)] * h, xn + (r[static_cast<size_t>(i)] + 1) * h, x.begin() + i * h);
    run_expert(m.experts[static_cast<size_t>(e)], li, e, x.data(), me, h, y.data(), pool, obs);
    for (int64_t i = 0; i < me; ++i) {
      const float w = row_w[static_cast<size_t>(e)][static_cast<size_t>(i)];
      float* o = out + r[static_cast<size_t>(i)] * h;
      const float* yi = y.data() + i * h;
      for (int64_t d = 0; d < h; ++d) o[d] += yi[d] * w;
    }
  }
  if (m.shared.gate) {  // qwen2_moe: + sigmoid(shared_expert_gate(x)) * shared_expert(x)
    std::vector<float> sg(static_cast<size_t>(n));
    m.shared_gate->forward(xn, n, sg.data(), pool);
    y.resize(static_cast<size_t>(n * h));
    run_expert(m.shared, li, kSharedExpert, xn, n, h, y.data(), pool, obs);
    for (int64_t t = 0; t < n; ++t) {
      const float s = 1.0f / (1.0f + std::exp(-sg[static_cast<size_t>(t)]));
      for (int64_t d = 0; d < h; ++d) out[t * h + d] += s * y[static_cast<size_t>(t * h + d)];
    }
  }
}

}  // namespace qf::rt
