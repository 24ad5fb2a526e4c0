#include "runtime/model.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <set>

#include "core/error.h"
#include "runtime/cpu/kernels.h"

namespace qf::rt {
namespace {

void check_vec(const std::vector<float>& v, int64_t n, const std::string& name) {
  if (static_cast<int64_t>(v.size()) != n)
    throw invalid_input(name, "expected " + std::to_string(n) + " values, got " + std::to_string(v.size()));
}

void check_linear(const std::shared_ptr<Linear>& l, int64_t out, int64_t in, const std::string& name) {
  if (!l) throw not_found(name, "missing weight");
  if (l->out_features() != out || l->in_features() != in)
    throw invalid_input(name, "expected shape [" + std::to_string(out) + ", " + std::to_string(in) + "], got [" +
                                  std::to_string(l->out_features()) + ", " + std::to_string(l->in_features()) + "]");
}

}  // namespace

// The slots Q..Down are the checkpoint layout's Linear roles, in the same order.
static_assert(static_cast<int>(LinearObserver::Q) == static_cast<int>(LinearRole::Q) &&
              static_cast<int>(LinearObserver::O) == static_cast<int>(LinearRole::O) &&
              static_cast<int>(LinearObserver::Gate) == static_cast<int>(LinearRole::Gate) &&
              static_cast<int>(LinearObserver::Down) == static_cast<int>(LinearRole::Down));

LinearShape layer_linear_shape(const ModelConfig& c, LinearObserver::Slot slot) {
  if (slot == LinearObserver::LmHead) return {c.vocab_size, c.hidden_size};
  const HfLinearShape s = hf_linear_shape(c, static_cast<LinearRole>(slot));
  return {s.out, s.in};
}

std::string moe_module_prefix(const ModelConfig& c) { return hf_moe_prefix(c); }

std::vector<LayerLinearId> layer_linears(const ModelConfig& c, int64_t layer) {
  std::vector<LayerLinearId> ids;
  for (HfLinear& l : hf_layer_linears(c, layer))
    ids.push_back({static_cast<LinearObserver::Slot>(l.role), l.expert, std::move(l.name)});
  return ids;
}

const std::shared_ptr<Linear>& layer_linear(const LayerWeights& l, const LayerLinearId& id) {
  if (id.expert == kNoExpert) {
    for (const LayerLinear& ll : kLayerLinears)
      if (ll.slot == id.slot) return l.*ll.member;
  }
  const ExpertWeights* e = id.expert == kSharedExpert ? &l.moe.shared
                           : id.expert >= 0 && id.expert < static_cast<int64_t>(l.moe.experts.size())
                               ? &l.moe.experts[static_cast<size_t>(id.expert)]
                               : nullptr;
  if (e) {
    if (id.slot == LinearObserver::Gate) return e->gate;
    if (id.slot == LinearObserver::Up) return e->up;
    if (id.slot == LinearObserver::Down) return e->down;
  }
  throw Error(ErrorKind::Internal, "layer_linear: no Linear '" + id.name + "' in this layer");
}

std::shared_ptr<Linear>& layer_linear(LayerWeights& l, const LayerLinearId& id) {
  return const_cast<std::shared_ptr<Linear>&>(layer_linear(static_cast<const LayerWeights&>(l), id));
}

LinearShape layer_linear_shape(const ModelConfig& c, const LayerLinearId& id) {
  const HfLinearShape s = hf_linear_shape(c, static_cast<LinearRole>(id.slot), id.expert);
  return {s.out, s.in};
}

Model::Model(ModelConfig config, ModelWeights weights, std::filesystem::path source)
    : config_(std::move(config)), w_(std::move(weights)), source_(std::move(source)) {
  const ModelConfig& c = config_;
  static const std::set<std::string> kTypes = {"llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe"};
  if (!kTypes.count(c.model_type))
    throw unsupported(source_.string(), "model_type '" + c.model_type +
                                           "' is not supported by the runtime (supported: llama, mistral, qwen2, qwen3, "
                                           "mixtral, qwen2_moe, qwen3_moe)");
  if (c.head_dim % 2 != 0 || c.num_attention_heads % c.num_key_value_heads != 0)
    throw invalid_input(source_.string(), "head_dim must be even and heads a multiple of KV heads");
  const int64_t h = c.hidden_size;
  check_linear(w_.embed, c.vocab_size, h, "model.embed_tokens.weight");
  check_linear(w_.lm_head, c.vocab_size, h, "lm_head.weight");
  check_vec(w_.final_norm, h, "model.norm.weight");
  if (static_cast<int64_t>(w_.layers.size()) != c.num_hidden_layers)
    throw invalid_input(source_.string(), "expected " + std::to_string(c.num_hidden_layers) + " layers, found " +
                                              std::to_string(w_.layers.size()));
  for (size_t i = 0; i < w_.layers.size(); ++i) {
    const LayerWeights& l = w_.layers[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    check_vec(l.attn_norm, h, p + "input_layernorm.weight");
    check_vec(l.ffn_norm, h, p + "post_attention_layernorm.weight");
    if (c.model_type == "qwen3" || c.model_type == "qwen3_moe") {
      check_vec(l.q_norm, c.head_dim, p + "self_attn.q_norm.weight");
      check_vec(l.k_norm, c.head_dim, p + "self_attn.k_norm.weight");
    }
    const int64_t li = static_cast<int64_t>(i);
    if (l.sparse() != c.moe_layer(li))
      throw invalid_input(p + moe_module_prefix(c) + "gate.weight",
                          c.moe_layer(li) ? "this layer is sparse by the config but has no router"
                                          : "this layer is dense by the config but has a router");
    if (l.sparse()) {
      check_linear(l.moe.router, c.num_experts, h, p + moe_module_prefix(c) + "gate.weight");
      if (static_cast<int64_t>(l.moe.experts.size()) != c.num_experts)
        throw invalid_input(p + moe_module_prefix(c) + "experts", "expected " + std::to_string(c.num_experts) +
                                                                      " experts, got " + std::to_string(l.moe.experts.size()));
      if (c.shared_expert_intermediate_size > 0) check_linear(l.moe.shared_gate, 1, h, p + "mlp.shared_expert_gate.weight");
      else if (l.moe.shared.gate || l.moe.shared_gate)
        throw invalid_input(p + "mlp.shared_expert", "a shared expert without shared_expert_intermediate_size in the config");
      if (l.gate || l.up || l.down) throw invalid_input(p + "mlp", "a sparse layer with a dense MLP as well");
    }
    for (const LayerLinearId& id : layer_linears(c, li)) {
      const LinearShape shape = layer_linear_shape(c, id);
      check_linear(layer_linear(l, id), shape.out, shape.in, p + id.name + ".weight");
    }
  }
  if (w_.k_scale.size() != w_.v_scale.size() ||
      (!w_.k_scale.empty() && static_cast<int64_t>(w_.k_scale.size()) != c.num_hidden_layers))
    throw invalid_input(source_.string(), "KV-cache scales must be given for every layer (k_scale and v_scale)");
  for (size_t i = 0; i < w_.k_scale.size(); ++i)
    if (!(w_.k_scale[i] > 0 && std::isfinite(w_.k_scale[i]) && w_.v_scale[i] > 0 && std::isfinite(w_.v_scale[i])))
      throw invalid_input(source_.string(), "KV-cache scale of layer " + std::to_string(i) + " is not positive and finite");
  inv_freq_ = rope_inv_freq(c);
  if (c.vlm && !c.vlm->mrope_section.empty()) {
    for (size_t s = 0; s < c.vlm->mrope_section.size(); ++s)
      rope_section_.insert(rope_section_.end(), static_cast<size_t>(c.vlm->mrope_section[s]), static_cast<uint8_t>(s));
    if (rope_section_.size() != inv_freq_.size())
      throw invalid_input("config.json", "rope_scaling.mrope_section does not sum to head_dim / 2");
  }
  if (!w_.rope_freq_factors.empty()) {
    if (w_.rope_freq_factors.size() != inv_freq_.size())
      throw invalid_input("rope_freqs.weight", "expected " + std::to_string(inv_freq_.size()) + " factors, got " +
                                                   std::to_string(w_.rope_freq_factors.size()));
    for (size_t i = 0; i < inv_freq_.size(); ++i) inv_freq_[i] /= w_.rope_freq_factors[i];
  }
}

int64_t Model::window(int64_t layer) const {
  if (!config_.sliding_window) return 0;
  if (config_.model_type == "qwen2" || config_.model_type == "qwen3" || config_.model_type == "qwen2_moe" ||
      config_.model_type == "qwen3_moe") {
    if (config_.max_window_layers && layer < *config_.max_window_layers) return 0;
  }
  return *config_.sliding_window;
}

KvCache Model::make_cache(const KvFormat& format, int64_t max_tokens, int64_t block_size) const {
  KvShape s{config_.num_hidden_layers, config_.num_key_value_heads, config_.head_dim};
  if (format.has_kivi()) {
    block_size = std::max<int64_t>(block_size, kKiviGroup);  // a key group within a block
    if (config_.num_attention_heads / config_.num_key_value_heads > 8)
      throw Error(ErrorKind::Unsupported, "--kv-dtype " + format.name() + ": KIVI attention takes at most 8 query heads "
                                          "per KV head, this model has " +
                                          std::to_string(config_.num_attention_heads / config_.num_key_value_heads));
  }
  // One spare block per 16 sequences' worth of rounding is left to the caller:
  // max_tokens counts positions, blocks are rounded up per sequence.
  KvCache cache(s, format, block_size, std::max<int64_t>(1, (max_tokens + block_size - 1) / block_size));
  if ((format.k == KvDType::F8_E4M3 || format.v == KvDType::F8_E4M3) && !w_.k_scale.empty()) {
    for (int64_t li = 0; li < config_.num_hidden_layers; ++li)
      cache.set_f8_scales(li, std::vector<float>(static_cast<size_t>(s.n_kv_heads), w_.k_scale[static_cast<size_t>(li)]),
                          std::vector<float>(static_cast<size_t>(s.n_kv_heads), w_.v_scale[static_cast<size_t>(li)]));
  }
  return cache;
}

namespace {

// The absolute maxima of every layer's keys (after RoPE) and values.
class KvAmax : public LinearObserver {
 public:
  explicit KvAmax(int64_t layers) : amax(static_cast<size_t>(layers), {0.f, 0.f}) {}
  void observe(int64_t, Slot, const float*, int64_t, int64_t) override {}
  void observe_kv(int64_t layer, const float* k, const float* v, int64_t n, int64_t kv_dim) override {
    auto& a = amax[static_cast<size_t>(layer)];
    for (int64_t i = 0; i < n * kv_dim; ++i) a.first = std::max(a.first, std::fabs(k[i]));
    for (int64_t i = 0; i < n * kv_dim; ++i) a.second = std::max(a.second, std::fabs(v[i]));
  }
  std::vector<std::pair<float, float>> amax;
};

}  // namespace

void Model::calibrate_kv(KvCache& cache, const std::vector<std::vector<int32_t>>& samples, ThreadPool& pool) const {
  if (!cache.needs_calibration()) return;
  cache.set_nvfp4_amax(kv_amax(samples, pool));
}

std::vector<std::pair<float, float>> Model::kv_amax(const std::vector<std::vector<int32_t>>& samples,
                                                    ThreadPool& pool) const {
  KvAmax obs(config_.num_hidden_layers);
  for (const auto& tokens : samples) {
    KvCache f16 = make_cache(KvDType::F16, static_cast<int64_t>(tokens.size()));
    const int32_t seq = f16.add_sequence();
    Batch b;
    for (size_t j = 0; j < tokens.size(); ++j) b.add(tokens[j], seq, static_cast<int64_t>(j), false);
    std::vector<float> logits;
    forward(b, f16, logits, pool, &obs);
  }
  return obs.amax;
}

void Model::rope(const Batch& b, float* x, int64_t heads) const {
  const int64_t hd = config_.head_dim, half = hd / 2;
  const bool sections = !b.rope_pos.empty() && !rope_section_.empty();
  for (size_t t = 0; t < b.size(); ++t) {
    for (int64_t i = 0; i < half; ++i) {
      // Multimodal RoPE: frequency i turns by its section's position.
      const float p = static_cast<float>(sections ? b.rope_pos[3 * t + rope_section_[static_cast<size_t>(i)]] : b.pos[t]);
      const float ang = p * inv_freq_[static_cast<size_t>(i)];
      const float c = std::cos(ang), s = std::sin(ang);
      const int64_t i0 = w_.rope_interleaved ? 2 * i : i, i1 = w_.rope_interleaved ? 2 * i + 1 : i + half;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x + (static_cast<int64_t>(t) * heads + h) * hd;
        const float a = v[i0], bb = v[i1];
        v[i0] = a * c - bb * s;
        v[i1] = bb * c + a * s;
      }
    }
  }
}

// Work items are (sequence, KV head, block of query tokens). Each decodes the
// K rows and transposed V of the positions its queries can see once, for all
// the query heads sharing that KV head; then each head's scores come from the
// GEMM blocks and its outputs from dot products over the transposed V.
void Model::attention(int64_t layer, const Batch& b, const float* q, const KvCache& cache, float* out,
                      ThreadPool& pool) const {
  const int64_t hd = config_.head_dim, nh = config_.num_attention_heads, nkv = config_.num_key_value_heads;
  const int64_t group = nh / nkv;
  const int64_t win = window(layer);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  constexpr size_t kMinQueryBlock = 16;
  struct Item {
    int32_t seq;
    int64_t kvh;
    std::vector<int64_t> tokens;  // batch indices, positions increasing
    int64_t seq_tokens;           // the sequence's tokens in the batch
  };
  std::vector<Item> items;
  {
    std::vector<std::pair<int32_t, std::vector<int64_t>>> by_seq;
    for (int64_t t = 0; t < static_cast<int64_t>(b.size()); ++t) {
      const int32_t s = b.seq[static_cast<size_t>(t)];
      auto it = std::find_if(by_seq.begin(), by_seq.end(), [&](const auto& e) { return e.first == s; });
      if (it == by_seq.end()) by_seq.push_back({s, {t}});
      else it->second.push_back(t);
    }
    // About 8 blocks per thread, so that a thread that runs slower takes
    // fewer of them, and no more: each block decodes the K/V it can see once.
    // The last query blocks see the most keys; they go first, so the short
    // ones fill in at the end.
    const int64_t per_seq_items = static_cast<int64_t>(by_seq.size()) * nkv;
    const int64_t blocks = std::max<int64_t>(1, (8 * pool.size() + per_seq_items - 1) / per_seq_items);
    for (auto& [s, toks] : by_seq) {
      const size_t qb = std::max<size_t>(kMinQueryBlock, (toks.size() + static_cast<size_t>(blocks) - 1) / static_cast<size_t>(blocks));
      for (size_t i = (toks.size() - 1) / qb * qb;; i -= qb) {
        for (int64_t kvh = 0; kvh < nkv; ++kvh)
          items.push_back({s, kvh, std::vector<int64_t>(toks.begin() + static_cast<std::ptrdiff_t>(i),
                                                        toks.begin() + static_cast<std::ptrdiff_t>(std::min(toks.size(), i + qb))),
                          static_cast<int64_t>(toks.size())});
        if (i == 0) break;
      }
    }
  }
  // Each head's scores are formed kQueryRows queries at a time by the GEMM
  // blocks (each score in the order of a single dot, so no float changes),
  // against the keys those queries can see.
  constexpr int64_t kQueryRows = 24;
  auto first_key = [&](int64_t t) {
    const int64_t pos = b.pos[static_cast<size_t>(t)];
    return win > 0 ? std::max<int64_t>(0, pos - win + 1) : 0;
  };
  // Quantized block types (as llama.cpp: the query in the block type's
  // activation type, then integer dots) and KIVI (whose f16 windows depend
  // on the query's position) are read straight from the stored bytes, one
  // token at a time; so are the other non-f16 caches for a sequence with one
  // or two tokens in the batch (decoding), rather than widening every
  // visible position first. An f16 cache always takes the GEMM blocks, whose
  // every score and output has the order of a single dot: its floats do not
  // depend on how the batch is cut (the thread count, the tokens whose
  // logits are wanted).
  const KvDType kt = cache.k_type(layer);
  const bool kivi = kv_is_kivi(kt) || kv_is_kivi(cache.v_type(layer));
  const bool blocks = kv_is_block(kt);
  pool.parallel_for(static_cast<int64_t>(items.size()), 1, [&](const Chunk& c) {
    thread_local std::vector<float> K, Vt, Q, S;
    for (int64_t ii = c.begin; ii < c.end; ++ii) {
      const Item& it = items[static_cast<size_t>(ii)];
      const int64_t queries = static_cast<int64_t>(it.tokens.size());
      if (kivi || blocks || (kt != KvDType::F16 && it.seq_tokens <= 2)) {
        // The query heads of this KV head together: each stored vector is
        // read once for all of them.
        Q.resize(static_cast<size_t>(group * hd));
        for (int64_t t : it.tokens) {
          const int64_t pos = b.pos[static_cast<size_t>(t)], lo = first_key(t), n = pos - lo + 1;
          S.resize(static_cast<size_t>(group * n));
          const int64_t h0 = it.kvh * group;
          std::copy_n(q + (t * nh + h0) * hd, group * hd, Q.data());
          for (int64_t j = 0; j < group; ++j) cache.rotate_query(layer, Q.data() + j * hd);
          cache.key_scores(layer, it.seq, it.kvh, lo, pos + 1, Q.data(), static_cast<int>(group), pos, S.data());
          for (int64_t j = 0; j < group; ++j) {
            float* sj = S.data() + j * n;
            for (int64_t p = 0; p < n; ++p) sj[p] *= scale;
            softmax(sj, n);
          }
          float* o = out + (t * nh + h0) * hd;
          std::fill_n(o, group * hd, 0.f);
          cache.value_sum(layer, it.seq, it.kvh, lo, pos + 1, S.data(), static_cast<int>(group), pos, o);
          for (int64_t j = 0; j < group; ++j) cache.unrotate_output(layer, o + j * hd);
        }
        continue;
      }
      int64_t lo_all = INT64_MAX, hi_all = 0;
      for (int64_t t : it.tokens) {
        lo_all = std::min(lo_all, first_key(t));
        hi_all = std::max(hi_all, b.pos[static_cast<size_t>(t)] + 1);
      }
      const int64_t span = hi_all - lo_all;
      K.resize(static_cast<size_t>(span * hd));
      Vt.resize(static_cast<size_t>(span * hd));
      cache.load_k_rows(layer, it.seq, it.kvh, lo_all, hi_all, K.data());
      cache.load_v_cols(layer, it.seq, it.kvh, lo_all, hi_all, Vt.data());
      for (int64_t h = it.kvh * group; h < (it.kvh + 1) * group; ++h) {
        for (int64_t j0 = 0; j0 < queries; j0 += kQueryRows) {
          const int64_t m = std::min(kQueryRows, queries - j0);
          const int64_t* toks = it.tokens.data() + j0;
          const int64_t k0 = first_key(toks[0]) - lo_all, k1 = b.pos[static_cast<size_t>(toks[m - 1])] + 1 - lo_all;
          Q.resize(static_cast<size_t>(m * hd)), S.resize(static_cast<size_t>(m * (k1 - k0)));
          for (int64_t j = 0; j < m; ++j) {
            std::copy_n(q + (toks[j] * nh + h) * hd, hd, Q.data() + j * hd);
            cache.rotate_query(layer, Q.data() + j * hd);
          }
          gemm_tile_f32(Q.data(), m, hd, K.data() + k0 * hd, k1 - k0, hd, S.data(), k1 - k0);
          for (int64_t j = 0; j < m; ++j) {
            const int64_t t = toks[j], lo = first_key(t);
            const int64_t n = b.pos[static_cast<size_t>(t)] - lo + 1, off = lo - lo_all;
            float* scores = S.data() + j * (k1 - k0) + (off - k0);
            for (int64_t p = 0; p < n; ++p) scores[p] *= scale;
            softmax(scores, n);
            float* o = out + (t * nh + h) * hd;
            for (int64_t d = 0; d < hd; ++d) o[d] = dot_f32(scores, Vt.data() + d * span + off, n);
            cache.unrotate_output(layer, o);
          }
        }
      }
    }
  });
}

void Model::check_batch(const Batch& b, KvCache& cache) const {
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(b.size());
  for (int64_t t = 0; t < n; ++t) {
    const int32_t tok = b.tokens[static_cast<size_t>(t)];
    if (tok < 0 || tok >= c.vocab_size)
      throw invalid_input("forward", "token id " + std::to_string(tok) + " is outside the vocabulary (size " +
                                         std::to_string(c.vocab_size) + ")");
    const int64_t pos = b.pos[static_cast<size_t>(t)];
    if (pos < 0 || (c.max_position_embeddings > 0 && pos >= c.max_position_embeddings))
      throw invalid_input("forward", "position " + std::to_string(pos) + " is beyond the model's maximum context " +
                                         std::to_string(c.max_position_embeddings));
  }
  if (!b.rope_pos.empty() && b.rope_pos.size() != 3 * b.size())
    throw invalid_input("forward", "a multimodal batch needs three rotary positions per token");
  if (!b.embed_row.empty()) {
    if (b.embed_row.size() != b.size()) throw invalid_input("forward", "a multimodal batch needs an input row per token");
    const int64_t rows = b.embeds ? static_cast<int64_t>(b.embeds->size()) / c.hidden_size : 0;
    for (int32_t r : b.embed_row)
      if (r >= rows)
        throw invalid_input("forward", "input row " + std::to_string(r) + " beyond the " + std::to_string(rows) +
                                           " rows given");
  }
  for (int64_t t = 0; t < n; ++t) cache.reserve(b.seq[static_cast<size_t>(t)], b.pos[static_cast<size_t>(t)] + 1);
  if (cache.format().has_kivi()) {
    std::vector<std::pair<int32_t, int64_t>> first;  // (sequence, its first position in the batch)
    for (int64_t t = 0; t < n; ++t) {
      const int32_t sq = b.seq[static_cast<size_t>(t)];
      const int64_t pos = b.pos[static_cast<size_t>(t)];
      auto it = std::find_if(first.begin(), first.end(), [&](const auto& e) { return e.first == sq; });
      if (it == first.end()) first.push_back({sq, pos});
      else it->second = std::min(it->second, pos);
    }
    for (const auto& [sq, pos] : first) cache.begin_batch(sq, pos);
  }
}

void Model::embed(const Batch& b, float* x) const {
  const int64_t h = config_.hidden_size;
  for (size_t t = 0; t < b.size(); ++t) {
    float* row = x + static_cast<int64_t>(t) * h;
    if (!b.embed_row.empty() && b.embed_row[t] >= 0)
      std::copy_n(b.embeds->data() + static_cast<int64_t>(b.embed_row[t]) * h, h, row);
    else
      w_.embed->decode_row(b.tokens[t], row);
  }
}

void add_sequence(Batch& b, const std::vector<int32_t>& tokens, int32_t seq, const MultimodalInputs* mm,
                  int64_t logits_from, int64_t logits_to) {
  const bool multimodal = mm && (!mm->embed_row.empty() || !mm->rope_pos.empty());
  const auto n = static_cast<int64_t>(tokens.size());
  if (multimodal) {
    if ((!mm->embed_row.empty() && static_cast<int64_t>(mm->embed_row.size()) != n) ||
        (!mm->rope_pos.empty() && static_cast<int64_t>(mm->rope_pos.size()) != 3 * n))
      throw invalid_input("forward", "a sequence's multimodal inputs do not match its " + std::to_string(n) + " tokens");
    // Earlier text tokens of the batch get their ordinary inputs.
    for (size_t t = b.embed_row.size(); t < b.size(); ++t) {
      b.embed_row.push_back(-1);
      b.rope_pos.insert(b.rope_pos.end(), 3, b.pos[t]);
    }
  }
  int32_t offset = 0;  // where this sequence's rows start in b.embeds
  if (multimodal && mm->embeds && b.embeds != mm->embeds) {
    if (!b.embeds || b.embeds->empty()) {
      b.embeds = mm->embeds;
    } else {
      if (mm->hidden <= 0) throw invalid_input("forward", "multimodal inputs without their row width");
      auto joined = std::make_shared<std::vector<float>>(*b.embeds);
      offset = static_cast<int32_t>(static_cast<int64_t>(joined->size()) / mm->hidden);
      joined->insert(joined->end(), mm->embeds->begin(), mm->embeds->end());
      b.embeds = std::move(joined);
    }
  }
  const bool keep = multimodal || b.multimodal();  // once a batch has multimodal inputs, every token does
  for (int64_t j = 0; j < n; ++j) {
    const bool logits = j >= logits_from && j < logits_to;
    b.add(tokens[static_cast<size_t>(j)], seq, j, logits);
    if (!keep) continue;
    const bool has_row = multimodal && !mm->embed_row.empty() && mm->embed_row[static_cast<size_t>(j)] >= 0;
    b.embed_row.push_back(has_row ? mm->embed_row[static_cast<size_t>(j)] + offset : -1);
    if (multimodal && !mm->rope_pos.empty())
      b.rope_pos.insert(b.rope_pos.end(), mm->rope_pos.begin() + 3 * j, mm->rope_pos.begin() + 3 * j + 3);
    else
      b.rope_pos.insert(b.rope_pos.end(), 3, j);
  }
}

Batch Batch::subset(const std::vector<int64_t>& rows) const {
  Batch out;
  out.embeds = embeds;
  for (int64_t r : rows) {
    const auto i = static_cast<size_t>(r);
    out.add(tokens[i], seq[i], pos[i], true);
    if (!rope_pos.empty()) out.rope_pos.insert(out.rope_pos.end(), rope_pos.begin() + 3 * r, rope_pos.begin() + 3 * r + 3);
    if (!embed_row.empty()) out.embed_row.push_back(embed_row[i]);
  }
  return out;
}

void Model::attn_norm(int64_t li, const float* x, int64_t n, float* xn) const {
  const int64_t h = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const LayerWeights& L = w_.layers[static_cast<size_t>(li)];
  for (int64_t t = 0; t < n; ++t) rms_norm(x + t * h, L.attn_norm.data(), eps, h, xn + t * h);
}

void Model::ffn_norm(int64_t li, const float* x, int64_t n, float* xn) const {
  const int64_t h = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const LayerWeights& L = w_.layers[static_cast<size_t>(li)];
  for (int64_t t = 0; t < n; ++t) rms_norm(x + t * h, L.ffn_norm.data(), eps, h, xn + t * h);
}

void Model::project_q(int64_t li, const Batch& b, const float* xn, float* q, ThreadPool& pool) const {
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(b.size()), hd = c.head_dim;
  const LayerWeights& L = w_.layers[static_cast<size_t>(li)];
  L.q->forward(xn, n, q, pool);
  if (!L.q_norm.empty()) {
    const float eps = static_cast<float>(c.rms_norm_eps);
    for (int64_t r = 0; r < n * c.num_attention_heads; ++r) rms_norm(q + r * hd, L.q_norm.data(), eps, hd, q + r * hd);
  }
  rope(b, q, c.num_attention_heads);
}

void Model::store_kv(int64_t li, const Batch& b, const float* xn, KvCache& cache, ThreadPool& pool,
                     LinearObserver* obs) const {
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(b.size()), hd = c.head_dim, kvd = c.kv_dim();
  thread_local std::vector<float> k, v;
  k.resize(static_cast<size_t>(n * kvd)), v.resize(k.size());
  const LayerWeights& L = w_.layers[static_cast<size_t>(li)];
  L.k->forward(xn, n, k.data(), pool);
  L.v->forward(xn, n, v.data(), pool);
  if (!L.k_norm.empty()) {
    const float eps = static_cast<float>(c.rms_norm_eps);
    for (int64_t r = 0; r < n * c.num_key_value_heads; ++r)
      rms_norm(k.data() + r * hd, L.k_norm.data(), eps, hd, k.data() + r * hd);
  }
  rope(b, k.data(), c.num_key_value_heads);
  if (obs) obs->observe_kv(li, k.data(), v.data(), n, kvd);
  for (int64_t t = 0; t < n; ++t)
    cache.store(li, b.seq[static_cast<size_t>(t)], b.pos[static_cast<size_t>(t)], k.data() + t * kvd, v.data() + t * kvd);
}

void Model::attention_block(int64_t li, const Batch& b, const float* x, float* out, KvCache& cache,
                            ThreadPool& pool, LinearObserver* obs) const {
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(b.size());
  const int64_t h = c.hidden_size, qd = c.q_dim();
  thread_local std::vector<float> xn, q, att;
  xn.resize(static_cast<size_t>(n * h));
  q.resize(static_cast<size_t>(n * qd)), att.resize(q.size());
  const LayerWeights& L = w_.layers[static_cast<size_t>(li)];
  attn_norm(li, x, n, xn.data());
  if (obs) {
    for (auto slot : {LinearObserver::Q, LinearObserver::K, LinearObserver::V}) obs->observe(li, slot, xn.data(), n, h);
  }
  project_q(li, b, xn.data(), q.data(), pool);
  store_kv(li, b, xn.data(), cache, pool, obs);
  attention(li, b, q.data(), cache, att.data(), pool);
  if (obs) obs->observe(li, LinearObserver::O, att.data(), n, qd);
  L.o->forward(att.data(), n, out, pool);
}

void Model::mlp_block(int64_t li, const float* xn, int64_t n, float* out, ThreadPool& pool,
                      LinearObserver* obs) const {
  const int64_t h = config_.hidden_size, ff = config_.intermediate_size;
  const LayerWeights& L = w_.layers[static_cast<size_t>(li)];
  if (L.sparse()) return moe_block(li, xn, n, out, pool, obs);
  thread_local std::vector<float> g, u;
  g.resize(static_cast<size_t>(n * ff)), u.resize(g.size());
  if (obs) {
    obs->observe(li, LinearObserver::Gate, xn, n, h);
    obs->observe(li, LinearObserver::Up, xn, n, h);
  }
  L.gate->forward(xn, n, g.data(), pool);
  L.up->forward(xn, n, u.data(), pool);
  for (int64_t t = 0; t < n; ++t) swiglu(g.data() + t * ff, u.data() + t * ff, ff);
  if (obs) obs->observe(li, LinearObserver::Down, g.data(), n, ff);
  L.down->forward(g.data(), n, out, pool);
}

namespace {

// x[n, hidden] += y, the residual of a layer's two halves.
void add_rows(float* x, const float* y, int64_t n, int64_t h) {
  for (int64_t i = 0; i < n * h; ++i) x[i] += y[i];
}

// The second half of a decoder layer on n rows: x += mlp_block(ffn_norm(x)).
void add_mlp(const Model& model, int64_t li, float* x, int64_t n, ThreadPool& pool, LinearObserver* obs) {
  const int64_t h = model.config().hidden_size;
  thread_local std::vector<float> xn, y;
  xn.resize(static_cast<size_t>(n * h)), y.resize(xn.size());
  model.ffn_norm(li, x, n, xn.data());
  model.mlp_block(li, xn.data(), n, y.data(), pool, obs);
  add_rows(x, y.data(), n, h);
}

}  // namespace

void Model::forward_layer(int64_t li, const Batch& b, float* x, KvCache& cache, ThreadPool& pool,
                          LinearObserver* obs) const {
  const int64_t n = static_cast<int64_t>(b.size()), h = config_.hidden_size;
  thread_local std::vector<float> y;
  y.resize(static_cast<size_t>(n * h));
  attention_block(li, b, x, y.data(), cache, pool, obs);
  add_rows(x, y.data(), n, h);
  add_mlp(*this, li, x, n, pool, obs);
}

void Model::head(const Batch& b, const float* x, std::vector<float>& logits, ThreadPool& pool,
                 LinearObserver* obs) const {
  const int64_t n = static_cast<int64_t>(b.size()), h = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  std::vector<float> xn(static_cast<size_t>(n * h));
  int64_t m = 0;
  for (int64_t t = 0; t < n; ++t) {
    if (!b.want_logits[static_cast<size_t>(t)]) continue;
    rms_norm(x + t * h, w_.final_norm.data(), eps, h, xn.data() + m * h);
    ++m;
  }
  logits.resize(static_cast<size_t>(m * config_.vocab_size));
  if (m > 0 && obs) obs->observe(-1, LinearObserver::LmHead, xn.data(), m, h);
  if (m > 0) w_.lm_head->forward(xn.data(), m, logits.data(), pool);
}

void Model::forward_layer_rows(int64_t li, const Batch& b, const Batch& kept, const std::vector<int64_t>& rows,
                               const float* x, float* xk, KvCache& cache, ThreadPool& pool) const {
  const int64_t n = static_cast<int64_t>(b.size()), m = static_cast<int64_t>(rows.size());
  const int64_t h = config_.hidden_size, qd = config_.q_dim();
  thread_local std::vector<float> xn, xm, q, att, y;
  xn.resize(static_cast<size_t>(n * h));
  attn_norm(li, x, n, xn.data());
  store_kv(li, b, xn.data(), cache, pool, nullptr);
  if (m == 0) return;
  xm.resize(static_cast<size_t>(m * h)), q.resize(static_cast<size_t>(m * qd)), att.resize(q.size()), y.resize(xm.size());
  for (int64_t i = 0; i < m; ++i) {
    std::copy_n(xn.data() + rows[static_cast<size_t>(i)] * h, h, xm.data() + i * h);
    std::copy_n(x + rows[static_cast<size_t>(i)] * h, h, xk + i * h);
  }
  project_q(li, kept, xm.data(), q.data(), pool);
  attention(li, kept, q.data(), cache, att.data(), pool);
  w_.layers[static_cast<size_t>(li)].o->forward(att.data(), m, y.data(), pool);
  add_rows(xk, y.data(), m, h);
  add_mlp(*this, li, xk, m, pool, nullptr);
}

void Model::forward(const Batch& b, KvCache& cache, std::vector<float>& logits, ThreadPool& pool,
                    LinearObserver* obs) const {
  check_batch(b, cache);
  const int64_t layers = config_.num_hidden_layers, h = config_.hidden_size;
  std::vector<float> x(b.size() * static_cast<size_t>(h));
  embed(b, x.data());
  // Only the last layer's K/V reach the cache: without an observer (which
  // sees every token), its tokens whose logits no one wants stop there.
  std::vector<int64_t> rows;
  for (size_t t = 0; t < b.size(); ++t)
    if (b.want_logits[t]) rows.push_back(static_cast<int64_t>(t));
  const bool trim = obs == nullptr && layers > 0 && rows.size() < b.size();
  for (int64_t li = 0; li < layers - (trim ? 1 : 0); ++li) forward_layer(li, b, x.data(), cache, pool, obs);
  if (!trim) {
    head(b, x.data(), logits, pool, obs);
    return;
  }
  const Batch kept = b.subset(rows);
  std::vector<float> xk(rows.size() * static_cast<size_t>(h));
  forward_layer_rows(layers - 1, b, kept, rows, x.data(), xk.data(), cache, pool);
  head(kept, xk.data(), logits, pool, nullptr);
}

namespace {

// Sums `of` over the Linears one token reads in layer li: all of them in a
// dense layer; in a sparse one the router, the shared expert and its gate,
// and k / n_experts of the routed experts' total (k experts of average size).
template <class Of>
uint64_t per_token_sum(const ModelConfig& c, const LayerWeights& l, int64_t li, Of of) {
  uint64_t sum = 0, routed = 0;
  for (const LayerLinearId& id : layer_linears(c, li)) {
    const uint64_t v = of(*layer_linear(l, id));
    (id.expert >= 0 ? routed : sum) += v;
  }
  if (l.sparse()) {
    sum += of(*l.moe.router) + (l.moe.shared_gate ? of(*l.moe.shared_gate) : 0);
    sum += routed * static_cast<uint64_t>(c.num_experts_per_tok) / static_cast<uint64_t>(c.num_experts);
  }
  return sum;
}

uint64_t linear_params(const Linear& l) { return static_cast<uint64_t>(l.in_features() * l.out_features()); }

}  // namespace

uint64_t Model::bytes_per_token() const {
  uint64_t b = w_.lm_head->weight_bytes() + w_.embed->weight_bytes() / static_cast<uint64_t>(config_.vocab_size);
  for (size_t li = 0; li < w_.layers.size(); ++li)
    b += per_token_sum(config_, w_.layers[li], static_cast<int64_t>(li), [](const Linear& l) { return l.weight_bytes(); });
  b += static_cast<uint64_t>(config_.hidden_size) * 4 * (2 * w_.layers.size() + 1);
  return b;
}

uint64_t Model::parameter_count() const {
  uint64_t n = linear_params(*w_.embed) + (w_.lm_head == w_.embed ? 0 : linear_params(*w_.lm_head));
  for (size_t li = 0; li < w_.layers.size(); ++li) {
    const LayerWeights& l = w_.layers[li];
    for (const LayerLinearId& id : layer_linears(config_, static_cast<int64_t>(li))) n += linear_params(*layer_linear(l, id));
    if (l.sparse()) n += linear_params(*l.moe.router) + (l.moe.shared_gate ? linear_params(*l.moe.shared_gate) : 0);
    n += l.attn_norm.size() + l.ffn_norm.size() + l.q_norm.size() + l.k_norm.size();
  }
  return n + w_.final_norm.size();
}

uint64_t Model::active_parameter_count() const {
  uint64_t n = linear_params(*w_.embed) + (w_.lm_head == w_.embed ? 0 : linear_params(*w_.lm_head));
  for (size_t li = 0; li < w_.layers.size(); ++li) {
    const LayerWeights& l = w_.layers[li];
    n += per_token_sum(config_, l, static_cast<int64_t>(li), linear_params);
    n += l.attn_norm.size() + l.ffn_norm.size() + l.q_norm.size() + l.k_norm.size();
  }
  return n + w_.final_norm.size();
}

std::string Model::weight_format() const {
  std::set<std::string> f;
  for (size_t li = 0; li < w_.layers.size(); ++li)
    for (const LayerLinearId& id : layer_linears(config_, static_cast<int64_t>(li)))
      f.insert(layer_linear(w_.layers[li], id)->format());
  f.insert(w_.lm_head->format());
  if (f.size() == 1) return *f.begin();
  std::string s = "mixed (";
  for (const auto& x : f) s += (s.back() == '(' ? "" : ", ") + x;
  return s + ")";
}

}  // namespace qf::rt
