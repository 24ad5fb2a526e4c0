#include "runtime/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "runtime/cpu/kernels.h"

namespace qf::rt {

const char* kv_dtype_name(KvDType t) {
  switch (t) {
    case KvDType::F16: return "f16";
    case KvDType::F8_E4M3: return "f8";
    case KvDType::I8: return "int8";
  }
  return "?";
}

KvDType parse_kv_dtype(const std::string& s) {
  if (s == "f16" || s == "fp16") return KvDType::F16;
  if (s == "f8" || s == "fp8" || s == "f8_e4m3" || s == "fp8_e4m3") return KvDType::F8_E4M3;
  if (s == "int8" || s == "i8") return KvDType::I8;
  throw Error(ErrorKind::Usage, "unknown KV-cache type '" + s + "' (expected f16, f8 or int8)");
}

namespace {
uint64_t round_up(uint64_t v, uint64_t m) { return (v + m - 1) / m * m; }
}  // namespace

KvCache::KvCache(KvShape shape, KvDType dtype, int64_t block_size, int64_t max_blocks)
    : shape_(shape), dtype_(dtype), block_size_(block_size), max_blocks_(max_blocks),
      elem_bytes_(dtype == KvDType::F16 ? 2 : 1) {
  if (shape.n_layers <= 0 || shape.n_kv_heads <= 0 || shape.head_dim <= 0 || block_size <= 0 || max_blocks <= 0)
    throw Error(ErrorKind::Internal, "KvCache: every dimension must be positive");
  if (block_size % 16 != 0) throw Error(ErrorKind::Usage, "KV-cache block size must be a multiple of 16");
  f8_scales_.assign(static_cast<size_t>(shape.n_layers * 2 * shape.n_kv_heads), 1.f);
}

int32_t KvCache::add_sequence() {
  for (size_t i = 0; i < seqs_.size(); ++i)
    if (!seqs_[i].live) {
      seqs_[i] = Sequence{true, 0, {}};
      return static_cast<int32_t>(i);
    }
  seqs_.push_back(Sequence{true, 0, {}});
  return static_cast<int32_t>(seqs_.size() - 1);
}

void KvCache::free_sequence(int32_t seq) {
  Sequence& s = seqs_.at(static_cast<size_t>(seq));
  for (int32_t b : s.blocks) free_.push_back(b);
  s = Sequence{};
}

int64_t KvCache::length(int32_t seq) const { return seqs_.at(static_cast<size_t>(seq)).length; }

void KvCache::reserve(int32_t seq, int64_t n) {
  Sequence& s = seqs_.at(static_cast<size_t>(seq));
  if (!s.live) throw Error(ErrorKind::Internal, "KvCache: sequence " + std::to_string(seq) + " is not live");
  const int64_t need = (n + block_size_ - 1) / block_size_;
  while (static_cast<int64_t>(s.blocks.size()) < need) {
    if (free_.empty()) {
      if (static_cast<int64_t>(blocks_.size()) >= max_blocks_)
        throw Error(ErrorKind::InvalidInput,
                    "KV cache full: " + std::to_string(max_blocks_) + " blocks of " + std::to_string(block_size_) +
                        " positions are in use (raise the context or lower the batch)");
      blocks_.push_back(std::make_unique<uint8_t[]>(bytes_per_block()));
      free_.push_back(static_cast<int32_t>(blocks_.size() - 1));
    }
    s.blocks.push_back(free_.back());
    free_.pop_back();
  }
}

uint64_t KvCache::bytes_per_token() const {
  const uint64_t kv_dim = static_cast<uint64_t>(shape_.n_kv_heads * shape_.head_dim);
  uint64_t b = static_cast<uint64_t>(shape_.n_layers) * 2 * kv_dim * static_cast<uint64_t>(elem_bytes_);
  if (dtype_ == KvDType::I8) b += static_cast<uint64_t>(shape_.n_layers) * 2 * shape_.n_kv_heads * sizeof(float);
  return b;
}

uint64_t KvCache::bytes_reserved() const { return static_cast<uint64_t>(blocks_in_use()) * bytes_per_block(); }

int64_t KvCache::blocks_in_use() const {
  int64_t n = 0;
  for (const auto& s : seqs_) n += static_cast<int64_t>(s.blocks.size());
  return n;
}

uint64_t KvCache::bytes_used() const {
  uint64_t n = 0;
  for (const auto& s : seqs_) n += static_cast<uint64_t>(s.length);
  return n * bytes_per_token();
}

// Block layout: data [layer][K,V][position][kv_dim] elements, then (int8
// only) scales [layer][K,V][position][kv_head] floats, 16-byte aligned.
uint8_t* KvCache::slot(int64_t layer, int which, int32_t seq, int64_t pos, float** scales) const {
  const Sequence& s = seqs_[static_cast<size_t>(seq)];
  const int64_t bi = pos / block_size_, p = pos % block_size_;
  if (bi >= static_cast<int64_t>(s.blocks.size()))
    throw Error(ErrorKind::Internal, "KvCache: position " + std::to_string(pos) + " was not reserved");
  uint8_t* block = blocks_[static_cast<size_t>(s.blocks[static_cast<size_t>(bi)])].get();
  const int64_t kv_dim = shape_.n_kv_heads * shape_.head_dim;
  const int64_t row = (layer * 2 + which) * block_size_ + p;
  if (scales) {
    const uint64_t data_bytes = round_up(
        static_cast<uint64_t>(shape_.n_layers * 2 * block_size_ * kv_dim * elem_bytes_), 16);
    *scales = reinterpret_cast<float*>(block + data_bytes) + row * shape_.n_kv_heads;
  }
  return block + row * kv_dim * elem_bytes_;
}

void KvCache::store(int64_t layer, int32_t seq, int64_t pos, const float* k, const float* v) {
  const int64_t hd = shape_.head_dim, kv_dim = shape_.n_kv_heads * hd;
  for (int which = 0; which < 2; ++which) {
    const float* src = which == 0 ? k : v;
    float* scales = nullptr;
    uint8_t* dst = slot(layer, which, seq, pos, dtype_ == KvDType::I8 ? &scales : nullptr);
    switch (dtype_) {
      case KvDType::F16: {
        uint16_t* d = reinterpret_cast<uint16_t*>(dst);
        for (int64_t i = 0; i < kv_dim; ++i) d[i] = f32_to_f16(src[i]);
        break;
      }
      case KvDType::F8_E4M3: {
        for (int64_t h = 0; h < shape_.n_kv_heads; ++h) {
          const float inv = 1.f / f8_scales_[static_cast<size_t>((layer * 2 + which) * shape_.n_kv_heads + h)];
          for (int64_t i = h * hd; i < (h + 1) * hd; ++i) dst[i] = f32_to_f8e4m3(src[i] * inv);
        }
        break;
      }
      case KvDType::I8: {
        int8_t* d = reinterpret_cast<int8_t*>(dst);
        for (int64_t h = 0; h < shape_.n_kv_heads; ++h) {
          float amax = 0.f;
          for (int64_t i = h * hd; i < (h + 1) * hd; ++i) amax = std::max(amax, std::fabs(src[i]));
          const float scale = amax / 127.f;
          const float inv = scale > 0.f ? 1.f / scale : 0.f;
          scales[h] = scale;
          for (int64_t i = h * hd; i < (h + 1) * hd; ++i)
            d[i] = static_cast<int8_t>(std::clamp(std::nearbyint(src[i] * inv), -127.f, 127.f));
        }
        break;
      }
    }
  }
  Sequence& s = seqs_[static_cast<size_t>(seq)];
  s.length = std::max(s.length, pos + 1);
}

void KvCache::load(int64_t layer, int which, int32_t seq, int64_t pos, int64_t head, float* out) const {
  const int64_t hd = shape_.head_dim;
  float* scales = nullptr;
  const uint8_t* src = slot(layer, which, seq, pos, dtype_ == KvDType::I8 ? &scales : nullptr) + head * hd * elem_bytes_;
  switch (dtype_) {
    case KvDType::F16:
      row_to_f32(DType::F16, src, out, hd);
      return;
    case KvDType::F8_E4M3: {
      const float sc = f8_scales_[static_cast<size_t>((layer * 2 + which) * shape_.n_kv_heads + head)];
      for (int64_t i = 0; i < hd; ++i) out[i] = f8e4m3_to_f32(src[i]) * sc;
      return;
    }
    case KvDType::I8: {
      const int8_t* s = reinterpret_cast<const int8_t*>(src);
      const float sc = scales[head];
      for (int64_t i = 0; i < hd; ++i) out[i] = static_cast<float>(s[i]) * sc;
      return;
    }
  }
}

void KvCache::load_k(int64_t layer, int32_t seq, int64_t pos, int64_t head, float* out) const {
  load(layer, 0, seq, pos, head, out);
}
void KvCache::load_v(int64_t layer, int32_t seq, int64_t pos, int64_t head, float* out) const {
  load(layer, 1, seq, pos, head, out);
}

void KvCache::load_k_rows(int64_t layer, int32_t seq, int64_t head, int64_t p0, int64_t p1, float* out) const {
  const int64_t hd = shape_.head_dim;
  for (int64_t p = p0; p < p1; ++p) load(layer, 0, seq, p, head, out + (p - p0) * hd);
}

void KvCache::load_v_cols(int64_t layer, int32_t seq, int64_t head, int64_t p0, int64_t p1, float* out) const {
  const int64_t hd = shape_.head_dim, n = p1 - p0;
  float row[512];
  if (hd > 512) throw Error(ErrorKind::Unsupported, "head_dim above 512 is not supported");
  for (int64_t p = p0; p < p1; ++p) {
    load(layer, 1, seq, p, head, row);
    for (int64_t d = 0; d < hd; ++d) out[d * n + (p - p0)] = row[d];
  }
}

void KvCache::set_f8_scales(int64_t layer, const std::vector<float>& k_scale, const std::vector<float>& v_scale) {
  if (dtype_ != KvDType::F8_E4M3) throw Error(ErrorKind::Usage, "KV-cache scales apply to the f8 cache only");
  const size_t h = static_cast<size_t>(shape_.n_kv_heads);
  if (k_scale.size() != h || v_scale.size() != h)
    throw invalid_input("kv cache", "expected " + std::to_string(h) + " scales per layer");
  for (size_t i = 0; i < h; ++i) {
    if (!(k_scale[i] > 0.f) || !(v_scale[i] > 0.f) || !std::isfinite(k_scale[i]) || !std::isfinite(v_scale[i]))
      throw invalid_input("kv cache", "scales must be finite and positive");
    f8_scales_[static_cast<size_t>(layer * 2) * h + i] = k_scale[i];
    f8_scales_[static_cast<size_t>(layer * 2 + 1) * h + i] = v_scale[i];
  }
}

}  // namespace qf::rt
