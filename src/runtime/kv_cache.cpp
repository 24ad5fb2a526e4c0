#include "runtime/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/kv_value_sum.h"
#include "runtime/kv_codec.h"

namespace qf::rt {

namespace {

bool quantized(KvDType t) { return t != KvDType::F16; }

// llama.cpp's rotation block for K: the largest power of two of at least 64
// dividing head_dim; for V: 64. Heads below 64 (which llama.cpp leaves
// unrotated) take the largest power of two dividing head_dim, at least 16.
int rotation_block(int64_t hd, bool key) {
  if (hd % 64 == 0) {
    if (!key) return 64;
    int64_t n = 64;
    while (hd % (n * 2) == 0) n *= 2;
    return static_cast<int>(n);
  }
  int64_t n = 1;
  while (hd % (n * 2) == 0) n *= 2;
  return n >= 16 ? static_cast<int>(n) : 0;
}

void rotate_blocks(float* x, int64_t hd, int block) {
  for (int64_t i = 0; i < hd; i += block) hadamard_inplace(x + i, block);
}

}  // namespace

KvCache::KvCache(KvShape shape, KvFormat format, int64_t block_size, int64_t max_blocks)
    : shape_(shape), format_(std::move(format)), block_size_(block_size), max_blocks_(max_blocks) {
  if (shape.n_layers <= 0 || shape.n_kv_heads <= 0 || shape.head_dim <= 0 || block_size <= 0 || max_blocks <= 0)
    throw Error(ErrorKind::Internal, "KvCache: every dimension must be positive");
  if (block_size % 16 != 0) throw Error(ErrorKind::Usage, "KV-cache block size must be a multiple of 16");
  if (format_.has_kivi() && block_size % kKiviGroup != 0)
    throw Error(ErrorKind::Usage, "a KIVI cache needs blocks of a multiple of 32 positions");
  const int64_t L = shape.n_layers, H = shape.n_kv_heads, hd = shape.head_dim;
  for (int64_t l = 0; l < L; ++l)
    for (KvDType t : {format_.k_at(l, L), format_.v_at(l, L)}) {
      const std::string why = kv_dtype_fits(t, hd);
      if (!why.empty()) throw Error(ErrorKind::Usage, "--kv-dtype " + format_.name() + ": " + why);
      types_.push_back(t);
      region_.push_back(token_bytes_ * static_cast<size_t>(block_size));
      vbytes_.push_back(kv_vector_bytes(t, hd));
      token_bytes_ += static_cast<size_t>(H) * vbytes_.back();
    }
  if (format_.rotation == KvRotation::Hadamard && rotation_block(hd, true) == 0)
    throw Error(ErrorKind::Usage, "--kv-rotation hadamard needs a head size divisible by 16");
  params_.assign(static_cast<size_t>(L * 2 * H), 1.f);
  calibrated_.assign(static_cast<size_t>(L), 0);
}

int32_t KvCache::add_sequence() {
  for (size_t i = 0; i < seqs_.size(); ++i)
    if (!seqs_[i].live) {
      seqs_[i] = Sequence{};
      seqs_[i].live = true;
      return static_cast<int32_t>(i);
    }
  seqs_.push_back(Sequence{});
  seqs_.back().live = true;
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

void KvCache::begin_batch(int32_t seq, int64_t first_pos) {
  if (!format_.has_kivi()) return;
  Sequence& s = seqs_.at(static_cast<size_t>(seq));
  const size_t row = static_cast<size_t>(shape_.n_layers * shape_.n_kv_heads * shape_.head_dim);
  auto trim = [&](std::vector<uint16_t>& res, int64_t& base, int64_t keep_from) {
    const int64_t drop = std::clamp<int64_t>(keep_from - base, 0, static_cast<int64_t>(res.size() / row));
    res.erase(res.begin(), res.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(drop) * row));
    base += drop;
  };
  trim(s.k_res, s.k_base, first_pos / kKiviResidual * kKiviResidual);
  trim(s.v_res, s.v_base, first_pos - kKiviResidual);
}

uint64_t KvCache::bytes_per_token() const { return token_bytes_; }

uint64_t KvCache::bytes_per_sequence() const {
  if (!format_.has_kivi()) return 0;
  return static_cast<uint64_t>(2 * kKiviResidual * shape_.n_layers * shape_.n_kv_heads * shape_.head_dim) * 2;
}

uint64_t KvCache::bytes_reserved() const {
  uint64_t n = static_cast<uint64_t>(blocks_in_use()) * bytes_per_block();
  for (const auto& s : seqs_) n += (s.k_res.size() + s.v_res.size()) * 2;
  return n;
}

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

const uint8_t* KvCache::vec(int64_t layer, int which, int32_t seq, int64_t pos, int64_t head) const {
  const Sequence& s = seqs_[static_cast<size_t>(seq)];
  const int64_t bi = pos / block_size_, p = pos % block_size_;
  if (bi >= static_cast<int64_t>(s.blocks.size()))
    throw Error(ErrorKind::Internal, "KvCache: position " + std::to_string(pos) + " was not reserved");
  const size_t r = static_cast<size_t>(layer * 2 + which);
  return blocks_[static_cast<size_t>(s.blocks[static_cast<size_t>(bi)])].get() + region_[r] +
         static_cast<size_t>(head * block_size_ + p) * vbytes_[r];
}

int KvCache::rot_block(int64_t layer, int which) const {
  if (format_.rotation != KvRotation::Hadamard) return 0;
  const KvDType t = which == 0 ? k_type(layer) : v_type(layer);
  return quantized(t) ? rotation_block(shape_.head_dim, which == 0) : 0;
}

const uint16_t* KvCache::residual(int which, const Sequence& s, int64_t layer, int64_t pos, int64_t head) const {
  const std::vector<uint16_t>& res = which == 0 ? s.k_res : s.v_res;
  const int64_t base = which == 0 ? s.k_base : s.v_base;
  const int64_t row = shape_.n_layers * shape_.n_kv_heads * shape_.head_dim;
  const int64_t at = (pos - base) * row + (layer * shape_.n_kv_heads + head) * shape_.head_dim;
  if (pos < base || at + shape_.head_dim > static_cast<int64_t>(res.size()))
    throw Error(ErrorKind::Internal, "KvCache: the f16 copy of position " + std::to_string(pos) + " is gone");
  return res.data() + at;
}

void KvCache::store(int64_t layer, int32_t seq, int64_t pos, const float* k, const float* v) {
  const int64_t H = shape_.n_kv_heads, hd = shape_.head_dim;
  Sequence& s = seqs_[static_cast<size_t>(seq)];
  float x[512];
  if (hd > 512) throw Error(ErrorKind::Unsupported, "head_dim above 512 is not supported");
  for (int which = 0; which < 2; ++which) {
    const float* src = which == 0 ? k : v;
    const KvDType t = which == 0 ? k_type(layer) : v_type(layer);
    const int rb = rot_block(layer, which);
    if (kv_is_kivi(t)) {  // the f16 copy every KIVI position starts as
      std::vector<uint16_t>& res = which == 0 ? s.k_res : s.v_res;
      int64_t& base = which == 0 ? s.k_base : s.v_base;
      const int64_t row = shape_.n_layers * H * hd;
      if (res.empty()) base = which == 0 ? pos / kKiviResidual * kKiviResidual : std::max<int64_t>(0, pos - kKiviResidual);
      if (pos < base) throw Error(ErrorKind::Internal, "KvCache: KIVI positions must be stored in order");
      if (static_cast<int64_t>(res.size()) < (pos - base + 1) * row) res.resize(static_cast<size_t>((pos - base + 1) * row));
      uint16_t* d = res.data() + (pos - base) * row + layer * H * hd;
      for (int64_t i = 0; i < H * hd; ++i) d[i] = f32_to_f16(src[i]);
      if (which == 0) continue;  // keys are quantized by 32-token groups below
    }
    for (int64_t h = 0; h < H; ++h) {
      std::copy_n(src + h * hd, hd, x);
      if (rb) rotate_blocks(x, hd, rb);
      kv_encode(t, x, hd, param(layer, which, h), const_cast<uint8_t*>(vec(layer, which, seq, pos, h)));
    }
  }
  s.length = std::max(s.length, pos + 1);
  const KvDType kt = k_type(layer);
  if (kv_is_kivi(kt) && (pos + 1) % kKiviGroup == 0)
    kivi_encode_group(layer, seq, pos + 1 - kKiviGroup);
}

// KIVI keys of positions [g0, g0 + 32): per head and channel, one scale and
// minimum over the 32 tokens, stored by the group's positions in turn.
void KvCache::kivi_encode_group(int64_t layer, int32_t seq, int64_t g0) {
  const Sequence& s = seqs_[static_cast<size_t>(seq)];
  const int64_t H = shape_.n_kv_heads, hd = shape_.head_dim, per = hd / kKiviGroup;
  const int bits = kivi_bits(k_type(layer));
  std::vector<float> x(static_cast<size_t>(kKiviGroup * hd));
  std::vector<uint8_t> q(static_cast<size_t>(kKiviGroup * hd));
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t r = 0; r < kKiviGroup; ++r) {
      const uint16_t* f = residual(0, s, layer, g0 + r, h);
      for (int64_t d = 0; d < hd; ++d) x[static_cast<size_t>(r * hd + d)] = f16_to_f32(f[d]);
    }
    std::vector<uint16_t> stats(static_cast<size_t>(2 * hd));
    for (int64_t d = 0; d < hd; ++d) {
      uint8_t codes[kKiviGroup];
      kivi_quantize(x.data() + d, hd, kKiviGroup, bits, codes, &stats[static_cast<size_t>(2 * d)],
                    &stats[static_cast<size_t>(2 * d + 1)]);
      for (int64_t r = 0; r < kKiviGroup; ++r) q[static_cast<size_t>(r * hd + d)] = codes[r];
    }
    for (int64_t r = 0; r < kKiviGroup; ++r) {
      uint8_t* dst = const_cast<uint8_t*>(vec(layer, 0, seq, g0 + r, h));
      pack_kv_codes(q.data() + r * hd, hd, bits, dst);
      std::memcpy(dst + hd * bits / 8, stats.data() + 2 * r * per, static_cast<size_t>(4 * per));
    }
  }
}

// A KIVI key group's per-channel scale and minimum: position r of the group
// holds channels [r, r + 1) * head_dim / 32 (kivi_encode_group).
void KvCache::kivi_key_stats(int64_t layer, int32_t seq, int64_t g0, int64_t head, float* scale, float* min) const {
  const int64_t hd = shape_.head_dim, per = hd / kKiviGroup;
  const int bits = kivi_bits(k_type(layer));
  for (int64_t r = 0; r < kKiviGroup; ++r) {
    const uint16_t* st = reinterpret_cast<const uint16_t*>(vec(layer, 0, seq, g0 + r, head) + hd * bits / 8);
    for (int64_t c = 0; c < per; ++c) scale[r * per + c] = f16_to_f32(st[2 * c]), min[r * per + c] = f16_to_f32(st[2 * c + 1]);
  }
}

void KvCache::decode(int64_t layer, int which, int32_t seq, int64_t pos, int64_t head, int64_t query_pos,
                     float* out) const {
  const Sequence& s = seqs_[static_cast<size_t>(seq)];
  const int64_t hd = shape_.head_dim;
  const KvDType t = which == 0 ? k_type(layer) : v_type(layer);
  if (query_pos < 0) query_pos = s.length - 1;
  if (pos >= f16_from(layer, which, query_pos)) {
    row_to_f32(DType::F16, residual(which, s, layer, pos, head), out, hd);
    return;
  }
  if (which == 0 && kv_is_kivi(t)) {
    float scale[512], min[512];
    uint8_t codes[512];
    kivi_key_stats(layer, seq, pos / kKiviGroup * kKiviGroup, head, scale, min);
    unpack_kv_codes(vec(layer, 0, seq, pos, head), hd, kivi_bits(t), codes);
    for (int64_t d = 0; d < hd; ++d) out[d] = static_cast<float>(codes[d]) * scale[d] + min[d];
    return;
  }
  kv_decode(t, vec(layer, which, seq, pos, head), hd, param(layer, which, head), out);
}

void KvCache::load_k(int64_t layer, int32_t seq, int64_t pos, int64_t head, float* out, int64_t query_pos) const {
  decode(layer, 0, seq, pos, head, query_pos, out);
  if (const int rb = rot_block(layer, 0)) rotate_blocks(out, shape_.head_dim, rb);
}

void KvCache::load_v(int64_t layer, int32_t seq, int64_t pos, int64_t head, float* out, int64_t query_pos) const {
  decode(layer, 1, seq, pos, head, query_pos, out);
  if (const int rb = rot_block(layer, 1)) rotate_blocks(out, shape_.head_dim, rb);
}

void KvCache::load_k_rows(int64_t layer, int32_t seq, int64_t head, int64_t p0, int64_t p1, float* out) const {
  const int64_t hd = shape_.head_dim;
  if (k_type(layer) == KvDType::F16) {  // contiguous within each block
    for (int64_t p = p0; p < p1;) {
      const int64_t end = std::min(p1, (p / block_size_ + 1) * block_size_);
      row_to_f32(DType::F16, vec(layer, 0, seq, p, head), out + (p - p0) * hd, (end - p) * hd);
      p = end;
    }
    return;
  }
  for (int64_t p = p0; p < p1; ++p) decode(layer, 0, seq, p, head, INT64_MAX / 2, out + (p - p0) * hd);
}

void KvCache::load_v_cols(int64_t layer, int32_t seq, int64_t head, int64_t p0, int64_t p1, float* out) const {
  const int64_t hd = shape_.head_dim, n = p1 - p0;
  float row[512];
  if (hd > 512) throw Error(ErrorKind::Unsupported, "head_dim above 512 is not supported");
  for (int64_t p = p0; p < p1; ++p) {
    decode(layer, 1, seq, p, head, INT64_MAX / 2, row);
    for (int64_t d = 0; d < hd; ++d) out[d * n + (p - p0)] = row[d];
  }
}

int64_t KvCache::f16_from(int64_t layer, int which, int64_t query_pos) const {
  const KvDType t = which == 0 ? k_type(layer) : v_type(layer);
  if (!kv_is_kivi(t)) return INT64_MAX;
  return which == 0 ? query_pos / kKiviResidual * kKiviResidual : query_pos - kKiviResidual;
}

void KvCache::key_scores(int64_t layer, int32_t seq, int64_t head, int64_t p0, int64_t p1, const float* q, int nq,
                         int64_t query_pos, float* scores) const {
  const KvDType t = k_type(layer);
  const int64_t hd = shape_.head_dim, n = p1 - p0;
  if (kv_is_kivi(t)) {
    kivi_key_scores(layer, seq, head, p0, p1, q, nq, query_pos, scores);
    return;
  }
  const KvKeyDot dot(t, q, nq, hd, param(layer, 0, head));
  const size_t stride = vbytes_[static_cast<size_t>(layer * 2)];
  for (int64_t p = p0; p < p1;) {  // runs of one block: contiguous vectors
    const int64_t end = std::min(p1, (p / block_size_ + 1) * block_size_);
    dot.scores(vec(layer, 0, seq, p, head), end - p, stride, scores + (p - p0), n);
    p = end;
  }
}

// KIVI keys straight from their codes: per 32-token group, q_c * scale_c and
// sum_c q_c * min_c once, then per token the dot of those with its codes.
void KvCache::kivi_key_scores(int64_t layer, int32_t seq, int64_t head, int64_t p0, int64_t p1, const float* q, int nq,
                              int64_t query_pos, float* scores) const {
  const int64_t hd = shape_.head_dim, n = p1 - p0;
  const int bits = kivi_bits(k_type(layer));
  const Sequence& s = seqs_[static_cast<size_t>(seq)];
  const int64_t fk = f16_from(layer, 0, query_pos);
  float qs[8 * 512], k[512];
  float bias[8];
  if (nq > 8 || hd > 512) throw Error(ErrorKind::Unsupported, "KIVI attention: at most 8 query heads per KV head");
  int64_t group = -1;
  for (int64_t p = p0; p < p1; ++p) {
    if (p >= fk) {
      row_to_f32(DType::F16, residual(0, s, layer, p, head), k, hd);
      for (int j = 0; j < nq; ++j) scores[j * n + (p - p0)] = dot_f32(q + j * hd, k, hd);
      continue;
    }
    if (p / kKiviGroup != group) {
      group = p / kKiviGroup;
      float scale[512], min[512];
      kivi_key_stats(layer, seq, group * kKiviGroup, head, scale, min);
      for (int j = 0; j < nq; ++j) {
        bias[j] = 0.f;
        for (int64_t d = 0; d < hd; ++d) {
          qs[j * hd + d] = q[j * hd + d] * scale[d];
          bias[j] += q[j * hd + d] * min[d];
        }
      }
    }
    uint8_t codes[512];
    unpack_kv_codes(vec(layer, 0, seq, p, head), hd, bits, codes);
    for (int64_t d = 0; d < hd; ++d) k[d] = static_cast<float>(codes[d]);
    for (int j = 0; j < nq; ++j) scores[j * n + (p - p0)] = dot_f32(qs + j * hd, k, hd) + bias[j];
  }
}

void KvCache::value_sum(int64_t layer, int32_t seq, int64_t head, int64_t p0, int64_t p1, const float* w, int nq,
                        int64_t query_pos, float* out) const {
  const KvDType t = v_type(layer);
  const int64_t hd = shape_.head_dim, n = p1 - p0;
  const int64_t fv = std::max(p0, std::min(p1, f16_from(layer, 1, query_pos)));  // KIVI's f16 window starts here
  const size_t stride = vbytes_[static_cast<size_t>(layer * 2 + 1)];
  const float prm = param(layer, 1, head);
  for (int64_t p = p0; p < fv;) {  // runs of one block: contiguous vectors
    const int64_t end = std::min(fv, (p / block_size_ + 1) * block_size_);
    kv_value_sum(t, vec(layer, 1, seq, p, head), stride, end - p, hd, prm, w + (p - p0), n, nq, out);
    p = end;
  }
  const Sequence& s = seqs_[static_cast<size_t>(seq)];
  float v[512];
  for (int64_t p = fv; p < p1; ++p) {
    row_to_f32(DType::F16, residual(1, s, layer, p, head), v, hd);
    for (int j = 0; j < nq; ++j) axpy(w[j * n + (p - p0)], v, out + j * hd, hd);
  }
}

void KvCache::rotate_query(int64_t layer, float* q) const {
  if (const int rb = rot_block(layer, 0)) rotate_blocks(q, shape_.head_dim, rb);
}

void KvCache::unrotate_output(int64_t layer, float* out) const {
  if (const int rb = rot_block(layer, 1)) rotate_blocks(out, shape_.head_dim, rb);
}

void KvCache::set_f8_scales(int64_t layer, const std::vector<float>& k_scale, const std::vector<float>& v_scale) {
  if (format_.k != KvDType::F8_E4M3 && format_.v != KvDType::F8_E4M3)
    throw Error(ErrorKind::Usage, "KV-cache scales apply to the f8 cache only");
  const size_t h = static_cast<size_t>(shape_.n_kv_heads);
  if (k_scale.size() != h || v_scale.size() != h)
    throw invalid_input("kv cache", "expected " + std::to_string(h) + " scales per layer");
  for (size_t i = 0; i < h; ++i) {
    if (!(k_scale[i] > 0.f) || !(v_scale[i] > 0.f) || !std::isfinite(k_scale[i]) || !std::isfinite(v_scale[i]))
      throw invalid_input("kv cache", "scales must be finite and positive");
    if (k_type(layer) == KvDType::F8_E4M3) params_[static_cast<size_t>(layer * 2) * h + i] = k_scale[i];
    if (v_type(layer) == KvDType::F8_E4M3) params_[static_cast<size_t>(layer * 2 + 1) * h + i] = v_scale[i];
  }
}

void KvCache::set_nvfp4_amax(int64_t layer, float k_amax, float v_amax) {
  const size_t h = static_cast<size_t>(shape_.n_kv_heads);
  for (int which = 0; which < 2; ++which) {
    const float amax = which == 0 ? k_amax : v_amax;
    if ((which == 0 ? k_type(layer) : v_type(layer)) != KvDType::NVFP4) continue;
    if (!(amax >= 0.f) || !std::isfinite(amax)) throw invalid_input("kv cache", "NVFP4 calibration: amax must be finite");
    // The multiplier form of Model Optimizer's global scale amax / (6 * 448)
    // (quantizers/nvfp4.h); an all-zero calibration keeps 1.
    const float g = amax > 0.f ? 448.f * 6.f / amax : 1.f;
    for (size_t i = 0; i < h; ++i) params_[static_cast<size_t>(layer * 2 + which) * h + i] = g;
  }
  calibrated_[static_cast<size_t>(layer)] = 1;
}

void KvCache::set_nvfp4_amax(const std::vector<std::pair<float, float>>& per_layer) {
  if (static_cast<int64_t>(per_layer.size()) != shape_.n_layers)
    throw Error(ErrorKind::Internal, "KvCache: NVFP4 calibration for " + std::to_string(per_layer.size()) + " layers");
  for (int64_t li = 0; li < shape_.n_layers; ++li)
    set_nvfp4_amax(li, per_layer[static_cast<size_t>(li)].first, per_layer[static_cast<size_t>(li)].second);
}

bool KvCache::needs_calibration() const {
  for (int64_t l = 0; l < shape_.n_layers; ++l)
    if ((k_type(l) == KvDType::NVFP4 || v_type(l) == KvDType::NVFP4) && !calibrated_[static_cast<size_t>(l)]) return true;
  return false;
}

}  // namespace qf::rt
