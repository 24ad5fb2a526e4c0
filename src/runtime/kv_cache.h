// Paged KV cache.
//
// Storage is a pool of fixed-size blocks of `block_size` token positions;
// each sequence owns a block table (position / block_size -> block). A block
// holds K and V of every layer for its positions, so one table serves the
// whole model. Blocks are taken from the pool when a sequence grows and
// returned when it is freed; the pool never holds more than `max_blocks`.
//
// What a position stores is the format's (kv_format.h): per layer a key type
// and a value type (f16 in the layers a TurboQuant preset keeps), each head
// vector encoded as kv_codec.h says. Inside a block, each (layer, K/V) has a
// region laid out [head][position][vector bytes], so one head's keys are
// contiguous. With --kv-rotation hadamard, K (and Q) are rotated before
// storing when the key type is quantized, V when the value type is, and
// attention's output is rotated back (llama.cpp's rule, kv_format.h).
//
// KIVI also keeps f16 copies of the newest positions beside the blocks: a
// query at position t reads keys at positions >= 128 * floor(t / 128) and
// values at positions >= t - 128 in f16 and the older ones quantized, which
// is what KIVI's decoder sees at step t (it quantizes after each step's
// attention: all 128 residual keys at once, the oldest value one at a time).
// So a batch scored at once gets, per position, the prediction a token-by-
// token decode would make. The f16 copies older than the next batch's first
// query needs are dropped when that batch starts (begin_batch).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/kv_format.h"

namespace qf::rt {

struct KvShape {
  int64_t n_layers = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
};

class KvCache {
 public:
  // Usage error when a type cannot hold this head size (kv_dtype_fits), or
  // block_size is not a multiple of 16 (32 for KIVI).
  KvCache(KvShape shape, KvFormat format, int64_t block_size, int64_t max_blocks);

  const KvFormat& format() const { return format_; }
  int64_t block_size() const { return block_size_; }
  const KvShape& shape() const { return shape_; }
  KvDType k_type(int64_t layer) const { return types_[static_cast<size_t>(layer * 2)]; }
  KvDType v_type(int64_t layer) const { return types_[static_cast<size_t>(layer * 2 + 1)]; }

  // Sequences are small integers handed out by add_sequence().
  int32_t add_sequence();
  void free_sequence(int32_t seq);
  // Number of positions stored so far (highest stored position + 1).
  int64_t length(int32_t seq) const;
  // Makes room for positions [0, n); throws when the pool is exhausted.
  void reserve(int32_t seq, int64_t n);
  // Called before a batch whose first position in `seq` is `first_pos`:
  // drops the f16 copies no query from there on reads (KIVI).
  void begin_batch(int32_t seq, int64_t first_pos);

  // Stores K and V ([n_kv_heads * head_dim] floats each, after RoPE) of one position.
  void store(int64_t layer, int32_t seq, int64_t pos, const float* k, const float* v);
  // Decodes K or V of one head at one position into out[head_dim], in the
  // model's basis (rotation undone), as a query at `query_pos` sees it
  // (matters for KIVI only; the default is the newest stored position).
  void load_k(int64_t layer, int32_t seq, int64_t pos, int64_t head, float* out, int64_t query_pos = -1) const;
  void load_v(int64_t layer, int32_t seq, int64_t pos, int64_t head, float* out, int64_t query_pos = -1) const;

  // Attention's view, in the cache's basis (rotated where the format
  // rotates: pass queries through rotate_query and outputs through
  // unrotate_output). Positions [p0, p1) of one head: K as rows
  // out[(p - p0) * head_dim + d], V transposed, out[d * (p1 - p0) + (p - p0)].
  // Not for KIVI (what a position holds depends on the query), see below.
  void load_k_rows(int64_t layer, int32_t seq, int64_t head, int64_t p0, int64_t p1, float* out) const;
  void load_v_cols(int64_t layer, int32_t seq, int64_t head, int64_t p0, int64_t p1, float* out) const;
  // Straight from the stored bytes, for the nq query heads sharing this KV
  // head of one token at `query_pos` (any format; q: nq x head_dim):
  // scores[j * n + p - p0] = q_j . K[p] and out[j * head_dim + d] +=
  // sum_p w[j * n + p - p0] V[p][d], n = p1 - p0. Each stored vector is read
  // once for all nq queries.
  void key_scores(int64_t layer, int32_t seq, int64_t head, int64_t p0, int64_t p1, const float* q, int nq,
                  int64_t query_pos, float* scores) const;
  void value_sum(int64_t layer, int32_t seq, int64_t head, int64_t p0, int64_t p1, const float* w, int nq,
                 int64_t query_pos, float* out) const;
  // The first position a query at query_pos reads as its f16 copy (KIVI;
  // INT64_MAX when that side keeps none).
  int64_t f16_from(int64_t layer, int which, int64_t query_pos) const;
  void rotate_query(int64_t layer, float* q) const;      // one head vector
  void unrotate_output(int64_t layer, float* out) const;  // one head vector

  // The stored bytes of one head vector (kv_vector_bytes of its type).
  const uint8_t* stored(int64_t layer, int which, int32_t seq, int64_t pos, int64_t head) const {
    return vec(layer, which, seq, pos, head);
  }

  // F8_E4M3 only: per-KV-head scales of one layer (value = e4m3 * scale).
  void set_f8_scales(int64_t layer, const std::vector<float>& k_scale, const std::vector<float>& v_scale);
  // NVFP4 only: the per-tensor global scales of one layer from the absolute
  // maxima of its keys and values (Model Optimizer's amax / (6 * 448)).
  void set_nvfp4_amax(int64_t layer, float k_amax, float v_amax);
  // Every layer's, from Model::kv_amax's (max |K|, max |V|) per layer.
  void set_nvfp4_amax(const std::vector<std::pair<float, float>>& per_layer);
  bool needs_calibration() const;  // an NVFP4 side without its global scales yet

  uint64_t bytes_per_token() const;  // K + V of every layer, scales included
  // Bytes a sequence holds besides its blocks at most in steady decoding:
  // KIVI's f16 windows (128 keys and 128 values, every layer); 0 otherwise.
  uint64_t bytes_per_sequence() const;
  uint64_t bytes_per_block() const { return bytes_per_token() * static_cast<uint64_t>(block_size_); }
  uint64_t bytes_reserved() const;   // blocks taken from the pool x block bytes + f16 windows held
  uint64_t bytes_used() const;       // positions stored x bytes per token
  int64_t blocks_in_use() const;

 private:
  struct Sequence {
    bool live = false;
    int64_t length = 0;
    std::vector<int32_t> blocks;
    // KIVI: f16 copies [pos - base][layer][head][head_dim] of keys and values.
    int64_t k_base = 0, v_base = 0;
    std::vector<uint16_t> k_res, v_res;
  };
  const uint8_t* vec(int64_t layer, int which, int32_t seq, int64_t pos, int64_t head) const;
  float param(int64_t layer, int which, int64_t head) const {
    return params_[static_cast<size_t>((layer * 2 + which) * shape_.n_kv_heads + head)];
  }
  int rot_block(int64_t layer, int which) const;  // 0: not rotated
  const uint16_t* residual(int which, const Sequence& s, int64_t layer, int64_t pos, int64_t head) const;
  void kivi_encode_group(int64_t layer, int32_t seq, int64_t g0);
  void kivi_key_stats(int64_t layer, int32_t seq, int64_t g0, int64_t head, float* scale, float* min) const;
  void kivi_key_scores(int64_t layer, int32_t seq, int64_t head, int64_t p0, int64_t p1, const float* q, int nq,
                       int64_t query_pos, float* scores) const;
  void decode(int64_t layer, int which, int32_t seq, int64_t pos, int64_t head, int64_t query_pos, float* out) const;

  KvShape shape_;
  KvFormat format_;
  int64_t block_size_, max_blocks_;
  std::vector<KvDType> types_;           // [layer][K, V]
  std::vector<size_t> region_, vbytes_;  // per (layer, K/V): offset in a block, bytes per vector
  size_t token_bytes_ = 0;
  std::vector<std::unique_ptr<uint8_t[]>> blocks_;
  std::vector<int32_t> free_;
  std::vector<Sequence> seqs_;
  std::vector<float> params_;  // [layer][K, V][head]: f8 scales, NVFP4 global scales
  std::vector<uint8_t> calibrated_;  // [layer]: NVFP4 global scales set
};

}  // namespace qf::rt
