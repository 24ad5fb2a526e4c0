#include "runtime/finite_weights.h"

#include <cmath>
#include <cstdio>

namespace qf::rt {
namespace {

const char* kind(float v) { return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf"; }

std::string describe(const std::string& name, int64_t r, int64_t c, float v) {
  char buf[96];
  std::snprintf(buf, sizeof buf, " [%lld, %lld] is %s", static_cast<long long>(r), static_cast<long long>(c), kind(v));
  return name + buf;
}

std::string check_vector(const std::string& name, const std::vector<float>& v) {
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i])) {
      char buf[64];
      std::snprintf(buf, sizeof buf, " [%zu] is %s", i, kind(v[i]));
      return name + buf;
    }
  return {};
}

// The first non-finite element of W, rows decoded in parallel chunks; the
// lowest row wins, so the answer does not depend on the thread count.
std::string check_linear(const std::string& name, const Linear& lin, ThreadPool& pool, bool release) {
  const int64_t rows = lin.out_features(), cols = lin.in_features();
  constexpr int64_t kGrain = 64;
  const std::vector<Chunk> chunks = partition(rows, kGrain);
  std::vector<int64_t> bad_row(chunks.size(), -1), bad_col(chunks.size(), -1);
  std::vector<float> bad_val(chunks.size(), 0.f);
  pool.parallel_for(rows, kGrain, [&](const Chunk& ch) {
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = ch.begin; r < ch.end; ++r) {
      lin.decode_row(r, row.data());
      for (int64_t c = 0; c < cols; ++c)
        if (!std::isfinite(row[static_cast<size_t>(c)])) {
          bad_row[static_cast<size_t>(ch.index)] = r, bad_col[static_cast<size_t>(ch.index)] = c;
          bad_val[static_cast<size_t>(ch.index)] = row[static_cast<size_t>(c)];
          return;
        }
    }
  });
  if (release) lin.release_pages();
  for (size_t i = 0; i < chunks.size(); ++i)
    if (bad_row[i] >= 0) return describe(name + ".weight", bad_row[i], bad_col[i], bad_val[i]);
  return check_vector(name + ".bias", lin.bias_values());
}

}  // namespace

std::string find_nonfinite_weight(const Model& m, ThreadPool& pool, bool release) {
  const ModelWeights& w = m.weights();
  std::string bad = check_linear("model.embed_tokens", *w.embed, pool, release);
  for (size_t li = 0; li < w.layers.size() && bad.empty(); ++li) {
    const LayerWeights& L = w.layers[li];
    const std::string p = "model.layers." + std::to_string(li) + ".";
    for (const LayerLinearId& id : layer_linears(m.config(), static_cast<int64_t>(li)))
      if (bad.empty()) bad = check_linear(p + id.name, *layer_linear(L, id), pool, release);
    if (bad.empty() && L.sparse()) bad = check_linear(p + moe_module_prefix(m.config()) + "gate", *L.moe.router, pool, release);
    if (bad.empty() && L.moe.shared_gate) bad = check_linear(p + "mlp.shared_expert_gate", *L.moe.shared_gate, pool, release);
    if (bad.empty()) bad = check_vector(p + "input_layernorm.weight", L.attn_norm);
    if (bad.empty()) bad = check_vector(p + "post_attention_layernorm.weight", L.ffn_norm);
    if (bad.empty()) bad = check_vector(p + "self_attn.q_norm.weight", L.q_norm);
    if (bad.empty()) bad = check_vector(p + "self_attn.k_norm.weight", L.k_norm);
  }
  if (bad.empty()) bad = check_vector("model.norm.weight", w.final_norm);
  if (bad.empty() && w.lm_head != w.embed) bad = check_linear("lm_head", *w.lm_head, pool, release);
  return bad;
}

}  // namespace qf::rt
