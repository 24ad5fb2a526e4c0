// Paged KV cache.
//
// Storage is a pool of fixed-size blocks of `block_size` token positions;
// each sequence owns a block table (position / block_size -> block). A block
// holds K and V of every layer for its positions, so one table serves the
// whole model. Blocks are taken from the pool when a sequence grows and
// returned when it is freed; the pool never holds more than `max_blocks`.
//
// Element types:
//   F16      K/V as IEEE half;
//   F8_E4M3  K/V as OCP e4m3 divided by a per-(layer, KV head) scale
//            (1.0 until calibrated scales are set, as vLLM does);
//   I8       K/V as int8 with one f32 scale per (layer, position, KV head),
//            absmax / 127 computed when the position is stored.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace qf::rt {

enum class KvDType { F16, F8_E4M3, I8 };

const char* kv_dtype_name(KvDType t);           // "f16", "f8", "int8"
KvDType parse_kv_dtype(const std::string& s);   // accepts f16, f8, fp8, f8_e4m3, int8, i8

struct KvShape {
  int64_t n_layers = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
};

class KvCache {
 public:
  KvCache(KvShape shape, KvDType dtype, int64_t block_size, int64_t max_blocks);

  KvDType dtype() const { return dtype_; }
  int64_t block_size() const { return block_size_; }
  const KvShape& shape() const { return shape_; }

  // Sequences are small integers handed out by add_sequence().
  int32_t add_sequence();
  void free_sequence(int32_t seq);
  // Number of positions stored so far (highest stored position + 1).
  int64_t length(int32_t seq) const;
  // Makes room for positions [0, n); throws when the pool is exhausted.
  void reserve(int32_t seq, int64_t n);

  // Stores K and V ([n_kv_heads * head_dim] floats each) of one position.
  void store(int64_t layer, int32_t seq, int64_t pos, const float* k, const float* v);
  // Decodes K or V of one head at one position into out[head_dim].
  void load_k(int64_t layer, int32_t seq, int64_t pos, int64_t head, float* out) const;
  void load_v(int64_t layer, int32_t seq, int64_t pos, int64_t head, float* out) const;

  // Positions [p0, p1) of one head: K as rows out[(p - p0) * head_dim + d],
  // V transposed, out[d * (p1 - p0) + (p - p0)], the layouts attention wants.
  void load_k_rows(int64_t layer, int32_t seq, int64_t head, int64_t p0, int64_t p1, float* out) const;
  void load_v_cols(int64_t layer, int32_t seq, int64_t head, int64_t p0, int64_t p1, float* out) const;

  // F8_E4M3 only: per-KV-head scales of one layer (value = e4m3 * scale).
  void set_f8_scales(int64_t layer, const std::vector<float>& k_scale, const std::vector<float>& v_scale);

  uint64_t bytes_per_token() const;  // K + V of every layer, scales included
  uint64_t bytes_per_block() const { return bytes_per_token() * static_cast<uint64_t>(block_size_); }
  uint64_t bytes_reserved() const;   // blocks taken from the pool x block bytes
  uint64_t bytes_used() const;       // positions stored x bytes per token
  int64_t blocks_in_use() const;

 private:
  struct Sequence {
    bool live = false;
    int64_t length = 0;
    std::vector<int32_t> blocks;
  };
  uint8_t* slot(int64_t layer, int which, int32_t seq, int64_t pos, float** scales) const;
  void load(int64_t layer, int which, int32_t seq, int64_t pos, int64_t head, float* out) const;

  KvShape shape_;
  KvDType dtype_;
  int64_t block_size_, max_blocks_;
  int64_t elem_bytes_;
  std::vector<std::unique_ptr<uint8_t[]>> blocks_;
  std::vector<int32_t> free_;
  std::vector<Sequence> seqs_;
  std::vector<float> f8_scales_;  // [layer][2][head]
};

}  // namespace qf::rt
