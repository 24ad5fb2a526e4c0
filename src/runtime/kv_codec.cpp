#include "runtime/kv_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>

#include "core/dtype.h"
#include "core/e2m1.h"
#include "core/error.h"
#include "core/f8_e4m3.h"
#include "formats/gguf/gguf.h"
#include "quantizers/kquants.h"
#include "quantizers/nvfp4.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/kv_key_dot.h"
#include "runtime/cpu/kv_value_sum.h"

namespace qf::rt {

namespace {

uint32_t ggml_of(KvDType t) {
  switch (t) {
    case KvDType::Q8_0: return ggml_type::Q8_0;
    case KvDType::Q4_0: return ggml_type::Q4_0;
    case KvDType::Q4_1: return ggml_type::Q4_1;
    case KvDType::Q5_0: return ggml_type::Q5_0;
    case KvDType::Q5_1: return ggml_type::Q5_1;
    case KvDType::IQ4_NL: return ggml_type::IQ4_NL;
    default: return 0;
  }
}

int uniform_bits(KvDType t) {
  switch (t) {
    case KvDType::KIVI2: return 2;
    case KvDType::KIVI4: case KvDType::TQ_V4: case KvDType::TQ_K4_NC: return 4;
    case KvDType::TQ_V3: case KvDType::TQ_K3_NC: return 3;
    default: return 0;
  }
}

// b-bit codes, element i at bit b*i of the little-endian stream (for b = 3,
// eight elements fill three bytes; for b = 2 and 4, a byte holds 4 and 2).
void pack_codes(const uint8_t* q, int64_t n, int b, uint8_t* dst) {
  if (n <= 0) return;
  std::memset(dst, 0, static_cast<size_t>(n) * static_cast<size_t>(b) / 8);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t bit = i * b;
    uint32_t v = static_cast<uint32_t>(q[i]) << (bit % 8);
    for (int64_t j = bit / 8; v; ++j, v >>= 8) dst[j] |= static_cast<uint8_t>(v & 0xFF);
  }
}

// All n codes of a pack_codes stream.
void unpack_codes(const uint8_t* src, int64_t n, int b, uint8_t* q) {
  if (b == 4) {
    for (int64_t i = 0; i < n / 2; ++i) q[2 * i] = src[i] & 0xF, q[2 * i + 1] = src[i] >> 4;
  } else if (b == 2) {
    for (int64_t i = 0; i < n / 4; ++i)
      for (int k = 0; k < 4; ++k) q[4 * i + k] = (src[i] >> (2 * k)) & 3;
  } else {  // 3: eight codes per three bytes
    for (int64_t g = 0; g < n / 8; ++g) {
      const uint32_t v = src[3 * g] | (static_cast<uint32_t>(src[3 * g + 1]) << 8) | (static_cast<uint32_t>(src[3 * g + 2]) << 16);
      for (int k = 0; k < 8; ++k) q[8 * g + k] = (v >> (3 * k)) & 7;
    }
  }
}

// vLLM's value quantizer: min and
// (max - min) / (2^b - 1) in f32, the scale at least 1e-8, codes
// trunc((x - min) / scale + 0.5) clamped; scale and min stored as f16.
void uniform_encode(const float* x, int64_t n, int b, uint8_t* codes, uint16_t* scale, uint16_t* zero) {
  float mn = INFINITY, mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mn = std::min(mn, x[i]), mx = std::max(mx, x[i]);
  const float levels = static_cast<float>((1 << b) - 1);
  float s = (mx - mn) / levels;
  if (!(s > 1e-8f)) s = 1e-8f;
  for (int64_t i = 0; i < n; ++i) {
    const int q = static_cast<int>((x[i] - mn) / s + 0.5f);
    codes[i] = static_cast<uint8_t>(std::clamp(q, 0, (1 << b) - 1));
  }
  *scale = f32_to_f16(s);
  *zero = f32_to_f16(mn);
}

std::vector<double> lloyd_max(int64_t d, int bits) {
  const int n = 1 << bits;
  const double sigma2 = 1.0 / static_cast<double>(d), sigma = std::sqrt(sigma2);
  auto pdf = [&](double x) { return (1.0 / std::sqrt(2 * M_PI * sigma2)) * std::exp(-x * x / (2 * sigma2)); };
  auto trapz = [](auto f, double a, double b) {
    const int steps = 200;
    const double h = (b - a) / steps;
    double r = 0.5 * (f(a) + f(b));
    for (int i = 1; i < steps; ++i) r += f(a + i * h);
    return r * h;
  };
  const double lo = -3.5 * sigma, hi = 3.5 * sigma;
  std::vector<double> c(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) c[static_cast<size_t>(i)] = lo + (hi - lo) * (i + 0.5) / n;
  for (int it = 0; it < 200; ++it) {
    std::vector<double> edges{lo * 3};
    for (int i = 0; i + 1 < n; ++i) edges.push_back((c[static_cast<size_t>(i)] + c[static_cast<size_t>(i) + 1]) / 2.0);
    edges.push_back(hi * 3);
    std::vector<double> next(static_cast<size_t>(n));
    double change = 0;
    for (int i = 0; i < n; ++i) {
      const double a = edges[static_cast<size_t>(i)], b = edges[static_cast<size_t>(i) + 1];
      const double num = trapz([&](double x) { return x * pdf(x); }, a, b), den = trapz(pdf, a, b);
      next[static_cast<size_t>(i)] = den > 1e-15 ? num / den : c[static_cast<size_t>(i)];
      change = std::max(change, std::fabs(next[static_cast<size_t>(i)] - c[static_cast<size_t>(i)]));
    }
    if (change < 1e-10) break;
    c = next;
  }
  return c;
}

struct Tables {
  std::vector<float> centroids, midpoints;
};

const Tables& tq_tables_locked(int64_t d, int bits) {
  static std::mutex mu;
  static std::map<std::pair<int64_t, int>, Tables> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({d, bits});
  if (it == cache.end()) {
    const std::vector<double> c = lloyd_max(d, bits);
    Tables t;
    for (double x : c) t.centroids.push_back(static_cast<float>(x));
    // vLLM compares against midpoints formed in f32 from the f32 centroids.
    for (size_t i = 0; i + 1 < c.size(); ++i) t.midpoints.push_back((t.centroids[i] + t.centroids[i + 1]) / 2.f);
    it = cache.emplace(std::make_pair(d, bits), std::move(t)).first;
  }
  return it->second;  // map nodes never move
}

const Tables& tq_tables(int64_t d, int bits) {
  thread_local int64_t last_d = -1;
  thread_local int last_bits = -1;
  thread_local const Tables* last = nullptr;
  if (d != last_d || bits != last_bits) last = &tq_tables_locked(d, bits), last_d = d, last_bits = bits;
  return *last;
}

// TurboQuant MSE key: the unit vector's rotated coordinates as centroid
// indices (the number of midpoints at or below each), then ||x|| as f16.
void tq_key_encode(const float* x, int64_t hd, int bits, uint8_t* dst) {
  float y[512];
  double n2 = 0;
  for (int64_t i = 0; i < hd; ++i) n2 += static_cast<double>(x[i]) * x[i];
  const float norm = static_cast<float>(std::sqrt(n2));
  for (int64_t i = 0; i < hd; ++i) y[i] = x[i] / (norm + 1e-8f);
  hadamard_inplace(y, hd);
  const std::vector<float>& mid = tq_tables(hd, bits).midpoints;
  uint8_t q[512];
  for (int64_t i = 0; i < hd; ++i)
    q[i] = static_cast<uint8_t>(std::upper_bound(mid.begin(), mid.end(), y[i]) - mid.begin());
  pack_codes(q, hd, bits, dst);
  const uint16_t nh = f32_to_f16(norm);
  std::memcpy(dst + hd * bits / 8, &nh, 2);
}

// The stored key in the rotated basis: centroids (renormalised to a unit
// vector with norm correction), times the stored norm.
void tq_key_rotated(const uint8_t* src, int64_t hd, int bits, float* c) {
  const std::vector<float>& cen = tq_tables(hd, bits).centroids;
  uint8_t q[512];
  unpack_codes(src, hd, bits, q);
  double s2 = 0;
  for (int64_t i = 0; i < hd; ++i) {
    c[i] = cen[q[i]];
    s2 += static_cast<double>(c[i]) * c[i];
  }
  uint16_t nh;
  std::memcpy(&nh, src + hd * bits / 8, 2);
  const float inv = s2 > 0 ? static_cast<float>(1.0 / std::sqrt(s2)) : 0.f;
  const float scale = f16_to_f32(nh) * inv;
  for (int64_t i = 0; i < hd; ++i) c[i] *= scale;
}

void check_head(int64_t hd) {
  if (hd > 512) throw Error(ErrorKind::Unsupported, "KV cache: head_dim above 512 is not supported");
}

}  // namespace

void pack_kv_codes(const uint8_t* q, int64_t n, int bits, uint8_t* dst) { pack_codes(q, n, bits, dst); }
void unpack_kv_codes(const uint8_t* src, int64_t n, int bits, uint8_t* q) { unpack_codes(src, n, bits, q); }

void kivi_quantize(const float* x, int64_t stride, int64_t n, int bits, uint8_t* codes, uint16_t* scale,
                   uint16_t* min) {
  auto h = [](float v) { return f16_to_f32(f32_to_f16(v)); };  // one f16 operation's rounding
  float mn = INFINITY, mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mn = std::min(mn, x[i * stride]), mx = std::max(mx, x[i * stride]);
  const float levels = static_cast<float>((1 << bits) - 1);
  const float s = h(h(mx - mn) / levels);
  for (int64_t i = 0; i < n; ++i) {
    // clamp, then round half to even, as torch's clamp_().round_()
    const float v = s > 0.f ? h(h(x[i * stride] - mn) / s) : 0.f;
    codes[i] = static_cast<uint8_t>(std::nearbyint(std::clamp(v, 0.f, levels)));
  }
  *scale = f32_to_f16(s);
  *min = f32_to_f16(mn);
}

void hadamard_inplace(float* x, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b, x[j + h] = a - b;
      }
  const float s = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

const std::vector<float>& turboquant_centroids(int64_t d, int bits) { return tq_tables(d, bits).centroids; }
const std::vector<float>& turboquant_midpoints(int64_t d, int bits) { return tq_tables(d, bits).midpoints; }

bool kv_type_rotates(KvDType t) { return t == KvDType::TQ_K4_NC || t == KvDType::TQ_K3_NC; }

size_t kv_vector_bytes(KvDType t, int64_t hd) {
  const size_t n = static_cast<size_t>(hd);
  switch (t) {
    case KvDType::F16: return 2 * n;
    case KvDType::F8_E4M3: case KvDType::TQ_K8: return n;
    case KvDType::I8: return 4 + n;
    case KvDType::NVFP4: return n / 2 + n / 16;
    case KvDType::KIVI2: case KvDType::KIVI4:  // codes + per 32 channels (values) or 1/32 of a group (keys): f16 x 2
      return n * static_cast<size_t>(uniform_bits(t)) / 8 + n / 32 * 4;
    case KvDType::TQ_K4_NC: case KvDType::TQ_K3_NC: return n * static_cast<size_t>(uniform_bits(t)) / 8 + 2;
    case KvDType::TQ_V4: case KvDType::TQ_V3: return n * static_cast<size_t>(uniform_bits(t)) / 8 + 4;
    default: return kquants::row_size(ggml_of(t), hd);
  }
}

void kv_encode(KvDType t, const float* x, int64_t hd, float param, uint8_t* dst) {
  check_head(hd);
  switch (t) {
    case KvDType::F16: {
      uint16_t* d = reinterpret_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < hd; ++i) d[i] = f32_to_f16(x[i]);
      return;
    }
    case KvDType::F8_E4M3: {
      const float inv = 1.f / param;
      for (int64_t i = 0; i < hd; ++i) dst[i] = f32_to_f8e4m3(x[i] * inv);
      return;
    }
    case KvDType::TQ_K8:
      for (int64_t i = 0; i < hd; ++i) dst[i] = f32_to_f8e4m3(x[i]);
      return;
    case KvDType::I8: {
      float amax = 0.f;
      for (int64_t i = 0; i < hd; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float scale = amax / 127.f, inv = scale > 0.f ? 1.f / scale : 0.f;
      std::memcpy(dst, &scale, 4);
      int8_t* d = reinterpret_cast<int8_t*>(dst + 4);
      for (int64_t i = 0; i < hd; ++i) d[i] = static_cast<int8_t>(std::clamp(std::nearbyint(x[i] * inv), -127.f, 127.f));
      return;
    }
    case KvDType::NVFP4: {
      uint8_t* codes = dst;
      uint8_t* scales = dst + hd / 2;
      std::memset(codes, 0, static_cast<size_t>(hd / 2));
      for (int64_t b = 0; b < hd / 16; ++b) {
        float amax = 0.f;
        for (int64_t i = b * 16; i < b * 16 + 16; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float bs = hd::nvfp4_block_scale(amax, param);
        scales[b] = f32_to_f8e4m3(bs);
        for (int64_t i = b * 16; i < b * 16 + 16; ++i)
          codes[i / 2] |= static_cast<uint8_t>(hd::nvfp4_code(x[i], bs, param) << (4 * (i % 2)));
      }
      return;
    }
    case KvDType::KIVI2: case KvDType::KIVI4: {
      const int b = uniform_bits(t);
      uint8_t q[512];
      float xs[512];
      for (int64_t i = 0; i < hd; ++i) xs[i] = f16_to_f32(f32_to_f16(x[i]));  // KIVI works on f16 values
      uint16_t* sz = reinterpret_cast<uint16_t*>(dst + hd * b / 8);
      for (int64_t g = 0; g < hd / kKiviGroup; ++g)
        kivi_quantize(xs + g * kKiviGroup, 1, kKiviGroup, b, q + g * kKiviGroup, &sz[2 * g], &sz[2 * g + 1]);
      pack_codes(q, hd, b, dst);
      return;
    }
    case KvDType::TQ_K4_NC: case KvDType::TQ_K3_NC:
      tq_key_encode(x, hd, uniform_bits(t), dst);
      return;
    case KvDType::TQ_V4: case KvDType::TQ_V3: {
      const int b = uniform_bits(t);
      uint8_t q[512];
      uint16_t* sz = reinterpret_cast<uint16_t*>(dst + hd * b / 8);
      uniform_encode(x, hd, b, q, &sz[0], &sz[1]);
      pack_codes(q, hd, b, dst);
      return;
    }
    case KvDType::IQ4_NL:
      kquants::quantize_row_iq4_nl_ref(x, dst, hd);
      return;
    default:
      kquants::quantize_rows(ggml_of(t), x, dst, 1, hd, nullptr);
      return;
  }
}

void kv_decode(KvDType t, const uint8_t* src, int64_t hd, float param, float* out) {
  check_head(hd);
  switch (t) {
    case KvDType::F16:
      row_to_f32(DType::F16, src, out, hd);
      return;
    case KvDType::F8_E4M3:
      for (int64_t i = 0; i < hd; ++i) out[i] = f8e4m3_to_f32(src[i]) * param;
      return;
    case KvDType::TQ_K8:
      for (int64_t i = 0; i < hd; ++i) out[i] = f8e4m3_to_f32(src[i]);
      return;
    case KvDType::I8: {
      float scale;
      std::memcpy(&scale, src, 4);
      const int8_t* s = reinterpret_cast<const int8_t*>(src + 4);
      for (int64_t i = 0; i < hd; ++i) out[i] = static_cast<float>(s[i]) * scale;
      return;
    }
    case KvDType::NVFP4: {
      // nvfp4_value(code, s, g) = e2m1(code) * (s / g), the quotient once per block.
      static const float kE2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
      const uint8_t* scales = src + hd / 2;
      for (int64_t b = 0; b < hd / 16; ++b) {
        const float s = f8e4m3_to_f32(scales[b]) / param;
        for (int64_t i = b * 16; i < b * 16 + 16; i += 2) {
          out[i] = kE2m1[src[i / 2] & 0xF] * s;
          out[i + 1] = kE2m1[src[i / 2] >> 4] * s;
        }
      }
      return;
    }
    case KvDType::KIVI2: case KvDType::KIVI4: case KvDType::TQ_V4: case KvDType::TQ_V3: {
      const int b = uniform_bits(t);
      const int64_t group = kv_is_kivi(t) ? kKiviGroup : hd;
      const uint16_t* sz = reinterpret_cast<const uint16_t*>(src + hd * b / 8);
      uint8_t q[512];
      unpack_codes(src, hd, b, q);
      for (int64_t g = 0; g < hd / group; ++g) {
        const float s = f16_to_f32(sz[2 * g]), z = f16_to_f32(sz[2 * g + 1]);
        for (int64_t i = g * group; i < (g + 1) * group; ++i) out[i] = static_cast<float>(q[i]) * s + z;
      }
      return;
    }
    case KvDType::TQ_K4_NC: case KvDType::TQ_K3_NC:
      tq_key_rotated(src, hd, uniform_bits(t), out);
      hadamard_inplace(out, hd);  // back to the keys' own basis
      return;
    default:
      kquants::dequantize_row(ggml_of(t), src, out, hd);
      return;
  }
}

KvKeyDot::KvKeyDot(KvDType t, const float* q, int nq, int64_t hd, float param)
    : t_(t), nq_(nq), hd_(hd), param_(param), q_(q) {
  check_head(hd);
  ggml_ = ggml_of(t);
  if (ggml_) {
    const uint32_t at = kquants::vec_dot_type(ggml_);
    qa_row_ = kquants::row_size(at, hd);
    qa_.resize(qa_row_ * static_cast<size_t>(nq));
    for (int j = 0; j < nq; ++j) kquants::quantize_activation(at, q + j * hd, qa_.data() + qa_row_ * j, hd);
  } else if (kv_type_rotates(t)) {
    qf_.assign(q, q + nq * hd);
    for (int j = 0; j < nq; ++j) hadamard_inplace(qf_.data() + j * hd, hd);
  }
}

void KvKeyDot::scores(const uint8_t* keys, int64_t n, size_t stride, float* out, int64_t os) const {
  if (ggml_) {
    if (kv_key_scores_simd(t_, keys, stride, n, hd_, qa_.data(), qa_row_, nq_, out, os)) return;
    const kquants::DotKernel dot = kquants::dot_kernel(ggml_, hd_);
    for (int64_t p = 0; p < n; ++p)
      for (int j = 0; j < nq_; ++j) out[j * os + p] = dot(hd_, keys + static_cast<size_t>(p) * stride, qa_.data() + qa_row_ * j);
    return;
  }
  if (t_ == KvDType::NVFP4 && kv_nvfp4_scores(keys, stride, n, hd_, param_, q_, nq_, out, os)) return;
  if (t_ == KvDType::F16 && stride == static_cast<size_t>(hd_) * 2) {
    for (int j = 0; j < nq_; ++j) dot_rows_f16(q_ + j * hd_, reinterpret_cast<const uint16_t*>(keys), hd_, n, out + j * os);
    return;
  }
  float k[512];
  const bool rot = kv_type_rotates(t_);
  const KvDecodeFn decode = kv_decoder(t_);
  for (int64_t p = 0; p < n; ++p) {
    const uint8_t* key = keys + static_cast<size_t>(p) * stride;
    if (rot) tq_key_rotated(key, hd_, uniform_bits(t_), k);
    else decode(key, hd_, param_, k);
    for (int j = 0; j < nq_; ++j) out[j * os + p] = dot_f32(rot ? qf_.data() + j * hd_ : q_ + j * hd_, k, hd_);
  }
}

namespace {

template <class Block>
void decode_blocks(const uint8_t* src, int64_t hd, float, float* out) {
  const Block* b = reinterpret_cast<const Block*>(src);
  for (int64_t i = 0; i < hd / 32; ++i) kquants::dequantize_block(b[i], out + i * 32);
}

void decode_f16(const uint8_t* src, int64_t hd, float, float* out) { row_to_f32(DType::F16, src, out, hd); }

template <KvDType T>
void decode_generic(const uint8_t* src, int64_t hd, float param, float* out) {
  kv_decode(T, src, hd, param, out);
}

}  // namespace

KvDecodeFn kv_decoder(KvDType t) {
  switch (t) {
    case KvDType::F16: return decode_f16;
    case KvDType::Q8_0: return decode_blocks<kquants::BlockQ8_0>;
    case KvDType::Q4_0: return decode_blocks<kquants::BlockQ4_0>;
    case KvDType::Q4_1: return decode_blocks<kquants::BlockQ4_1>;
    case KvDType::Q5_0: return decode_blocks<kquants::BlockQ5_0>;
    case KvDType::Q5_1: return decode_blocks<kquants::BlockQ5_1>;
    case KvDType::IQ4_NL: return decode_blocks<kquants::BlockIQ4_NL>;
    case KvDType::F8_E4M3: return decode_generic<KvDType::F8_E4M3>;
    case KvDType::I8: return decode_generic<KvDType::I8>;
    case KvDType::NVFP4: return decode_generic<KvDType::NVFP4>;
    case KvDType::KIVI2: return decode_generic<KvDType::KIVI2>;
    case KvDType::KIVI4: return decode_generic<KvDType::KIVI4>;
    case KvDType::TQ_K8: return decode_generic<KvDType::TQ_K8>;
    case KvDType::TQ_K4_NC: return decode_generic<KvDType::TQ_K4_NC>;
    case KvDType::TQ_K3_NC: return decode_generic<KvDType::TQ_K3_NC>;
    case KvDType::TQ_V4: return decode_generic<KvDType::TQ_V4>;
    case KvDType::TQ_V3: return decode_generic<KvDType::TQ_V3>;
  }
  return decode_generic<KvDType::F16>;
}

}  // namespace qf::rt
