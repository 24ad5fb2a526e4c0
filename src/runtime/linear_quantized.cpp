// make_quantized_linear: any QuantizedTensor with an optional input quantizer.
//
//   - int8 symmetric channel/tensor weights with int8 activations: the true
//     int8 GEMM (cpu/int8_gemm.h). Weights are kept as signed int8 (q - 128),
//     x is quantized per forward (quantize_activations_int8), and
//       y[t, j] = (acc[t, j] - zx[t] * rowsum_j) * sx[t] * sw[j] (+ bias[j]),
//     acc = sum_i qx[t, i] * qw[j, i] in int32, the correction in int64;
//   - FP8 weights: codes kept as bytes, decoded through a 256-entry table times
//     the tensor/channel/group scale;
//   - NVFP4 weights: codes packed two per byte (element 2j in the low nibble),
//     block scales kept as e4m3 bytes, decoded as table[code] * (scale / global);
//   - bitsandbytes NF4/FP4 weights: the packed bytes as stored (first element
//     in the high nibble) and the f32 absmax of each 64-element block of the
//     flattened weight (decoded when double-quantized), decoded as
//     round_to(dtype, table[code] * absmax), bitsandbytes' dequantize_4bit;
//   - other integer weights: kept packed (make_packed_linear) and decoded by it.
// Decoded rows go through forward_row_tiles against x, fake-quantized first
// (quantize_activations) when there is an input quantizer. Every decode gives
// exactly QuantizedTensor::dequantize_row's values.
#include <algorithm>
#include <array>
#include <cmath>
#include <optional>

#include "core/dtype.h"
#include "core/error.h"
#include "checkpoint/pack.h"
#include "quantizers/bnb4.h"
#include "runtime/cpu/int8_gemm.h"
#include "runtime/linear.h"

namespace qf::rt {
namespace {

constexpr int64_t kInt8RowTile = 32;

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int i = 0; i < 256; ++i) a[static_cast<size_t>(i)] = f8e4m3_to_f32(static_cast<uint8_t>(i));
    return a;
  }();
  return t;
}

const std::array<float, 16>& e2m1_table() {
  static const std::array<float, 16> t = [] {
    std::array<float, 16> a{};
    for (int i = 0; i < 16; ++i) a[static_cast<size_t>(i)] = e2m1_to_f32(static_cast<uint8_t>(i));
    return a;
  }();
  return t;
}

enum class Kind { Int8Gemm, Fp8, Nvfp4, Bnb4, IntDecode };

bool int8_gemm_applies(const QuantizedTensor& q, const ActQuantParams* act) {
  if (!act || act->scheme.type != QuantType::Int || act->scheme.bits != 8) return false;
  const QuantScheme& s = q.scheme;
  if (s.type != QuantType::Int || s.bits != 8 || !s.symmetric || !q.g_idx.empty()) return false;
  if (s.strategy != QuantStrategy::Channel && s.strategy != QuantStrategy::Tensor) return false;
  if (q.cols > kInt8GemmMaxK) return false;
  return std::all_of(q.zeros.begin(), q.zeros.end(), [&](int32_t z) { return z == s.sym_zero(); });
}

// Runs fn(t0, t1) over the n rows of x in deterministic chunks.
void for_token_chunks(int64_t n, ThreadPool& pool, const std::function<void(int64_t, int64_t)>& fn) {
  pool.parallel_for(n, std::max<int64_t>(1, n / (4 * pool.size())), [&](const Chunk& c) { fn(c.begin, c.end); });
}

class QuantizedLinear final : public Linear {
 public:
  QuantizedLinear(const QuantizedTensor& q, std::optional<ActQuantParams> act, std::vector<float> bias,
                  const std::string& name)
      : Linear(q.cols, q.rows), scheme_(q.scheme), act_(std::move(act)), bias_(std::move(bias)) {
    if (int8_gemm_applies(q, act_ ? &*act_ : nullptr)) {
      kind_ = Kind::Int8Gemm;
      qw_.resize(q.q.size());
      for (size_t i = 0; i < q.q.size(); ++i) qw_[i] = static_cast<int8_t>(static_cast<int32_t>(q.q[i]) - 128);
      wsum_ = int8_row_sums(qw_.data(), out_, in_);
      sw_.resize(static_cast<size_t>(out_));
      for (int64_t r = 0; r < out_; ++r) sw_[static_cast<size_t>(r)] = q.scales[static_cast<size_t>(q.param_index(r, 0))];
    } else if (q.scheme.is_fp8()) {
      kind_ = Kind::Fp8;
      codes_ = q.q;
      scales_ = q.scales;
      groups_ = q.n_groups();
    } else if (q.scheme.is_nvfp4()) {
      kind_ = Kind::Nvfp4;
      global_ = q.global_scale;
      groups_ = q.n_groups();
      codes_ = pack_nvfp4_rows(q);          // q.validate: exact non-negative e4m3 block scales,
      block_scales_ = nvfp4_scales_e4m3(q);  // cols a multiple of 16
    } else if (q.scheme.is_bnb4()) {
      kind_ = Kind::Bnb4;
      codes_ = pack_bnb4(q.q, q.scheme.type);
      scales_ = q.scales;
      for (int i = 0; i < 16; ++i) lut16_[static_cast<size_t>(i)] = hd::bnb4_value(q.scheme.type == QuantType::Fp4, static_cast<uint8_t>(i));
    } else {
      kind_ = Kind::IntDecode;
      inner_ = make_packed_linear(q, nullptr, name);
    }
  }

  void forward(const float* x, int64_t n, float* y, ThreadPool& pool) const override {
    if (n <= 0) return;
    if (kind_ == Kind::Int8Gemm) return forward_int8(x, n, y, pool);
    const float* xin = x;
    std::vector<float> xq;
    if (act_) {
      xq.assign(x, x + n * in_);
      for_token_chunks(n, pool, [&](int64_t t0, int64_t t1) { quantize_activations(*act_, xq.data() + t0 * in_, t1 - t0, in_); });
      xin = xq.data();
    }
    forward_row_tiles(xin, n, y, in_, out_, bias_, pool, [&](int64_t r0, int64_t rows, float* buf) -> const float* {
      for (int64_t r = 0; r < rows; ++r) decode_row(r0 + r, buf + r * in_);
      return buf;
    });
  }

  void decode_row(int64_t r, float* out) const override {
    switch (kind_) {
      case Kind::Int8Gemm: {
        const int8_t* q = qw_.data() + r * in_;
        const float s = sw_[static_cast<size_t>(r)];
        for (int64_t c = 0; c < in_; ++c) out[c] = static_cast<float>(q[c]) * s;
        return;
      }
      case Kind::Fp8: {
        const auto& lut = e4m3_table();
        const uint8_t* q = codes_.data() + r * in_;
        if (scheme_.strategy == QuantStrategy::Group) {
          const int64_t gs = scheme_.group_size;
          for (int64_t g = 0; g < groups_; ++g) {
            const float s = scales_[static_cast<size_t>(r * groups_ + g)];
            for (int64_t c = g * gs; c < std::min(in_, (g + 1) * gs); ++c) out[c] = lut[q[c]] * s;
          }
        } else {
          const float s = scales_[scheme_.strategy == QuantStrategy::Tensor ? 0 : static_cast<size_t>(r)];
          for (int64_t c = 0; c < in_; ++c) out[c] = lut[q[c]] * s;
        }
        return;
      }
      case Kind::Nvfp4: {
        const auto& lut = e2m1_table();
        const auto& slut = e4m3_table();
        const int64_t gs = scheme_.group_size;  // 16, divides in_
        for (int64_t g = 0; g < groups_; ++g) {
          const float eff = slut[block_scales_[static_cast<size_t>(r * groups_ + g)]] / global_;
          const int64_t e0 = r * in_ + g * gs;  // element index; in_ is a multiple of 16, so e0 is even
          const uint8_t* p = codes_.data() + e0 / 2;
          float* o = out + g * gs;
          for (int64_t j = 0; j < gs / 2; ++j) {
            o[2 * j] = lut[p[j] & 15u] * eff;
            o[2 * j + 1] = lut[p[j] >> 4] * eff;
          }
        }
        return;
      }
      case Kind::Bnb4: {
        const int64_t bs = scheme_.group_size, e0 = r * in_;
        const DType dt = scheme_.scale_dtype;
        for (int64_t c = 0; c < in_; ++c) {
          const int64_t e = e0 + c;
          const uint8_t b = codes_[static_cast<size_t>(e / 2)];
          const uint8_t code = (e % 2 == 0) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 15u);
          out[c] = bnb_round_out(dt, lut16_[code] * scales_[static_cast<size_t>(e / bs)]);
        }
        return;
      }
      case Kind::IntDecode: inner_->decode_row(r, out); return;
    }
  }

  uint64_t weight_bytes() const override {
    switch (kind_) {
      case Kind::Int8Gemm: return qw_.size() + (sw_.size() + wsum_.size()) * 4;  // int8 codes, f32 scales, int32 row sums
      case Kind::Fp8: return codes_.size() + scales_.size() * 4;                 // e4m3 bytes, f32 scales
      case Kind::Nvfp4: return codes_.size() + block_scales_.size() + 4;         // nibbles, e4m3 block scales, global
      case Kind::Bnb4: return codes_.size() + scales_.size() * 4;                // nibbles, f32 absmax
      case Kind::IntDecode: return inner_->weight_bytes();
    }
    return 0;
  }
  std::vector<float> bias_values() const override { return bias_; }
  std::string format() const override { return scheme_.describe() + (act_ ? " / " + act_->scheme.describe() : ""); }
  bool quantized() const override { return true; }
  const ActQuantParams* input_quantizer() const override { return act_ ? &*act_ : nullptr; }
  DeviceWeightForm device_form() const override {
    DeviceWeightForm f;
    switch (kind_) {
      case Kind::IntDecode: return inner_->device_form();
      case Kind::Int8Gemm:
      case Kind::Bnb4: return f;  // decoded to f32 on the device
      case Kind::Fp8:
        f.kind = DeviceWeightForm::Kind::Fp8;
        f.scales = scales_.data(), f.n_scales = scales_.size();
        break;
      case Kind::Nvfp4:
        f.kind = DeviceWeightForm::Kind::Nvfp4;
        f.block_scales = block_scales_.data(), f.n_scales = block_scales_.size(), f.global_scale = global_;
        break;
    }
    f.blocks = codes_.data(), f.n_codes = codes_.size();
    f.strategy = scheme_.strategy, f.group_size = scheme_.group_size, f.groups = groups_;
    return f;
  }

 private:
  void forward_int8(const float* x, int64_t n, float* y, ThreadPool& pool) const {
    std::vector<int8_t> xq(static_cast<size_t>(n * in_));
    std::vector<float> sx(static_cast<size_t>(n));
    std::vector<int32_t> zx(static_cast<size_t>(n));
    for_token_chunks(n, pool, [&](int64_t t0, int64_t t1) {
      quantize_activations_int8(*act_, x + t0 * in_, t1 - t0, in_, xq.data() + t0 * in_, sx.data() + t0, zx.data() + t0);
    });
    const int64_t tiles = (out_ + kInt8RowTile - 1) / kInt8RowTile;
    pool.parallel_for(tiles, std::max<int64_t>(1, tiles / (4 * pool.size())), [&](const Chunk& c) {
      thread_local std::vector<int32_t> acc;
      acc.resize(static_cast<size_t>(n * kInt8RowTile));
      for (int64_t tile = c.begin; tile < c.end; ++tile) {
        const int64_t r0 = tile * kInt8RowTile, rows = std::min(kInt8RowTile, out_ - r0);
        gemm_s8s8_s32(xq.data(), n, in_, qw_.data() + r0 * in_, rows, in_, wsum_.data() + r0, acc.data(), rows);
        for (int64_t t = 0; t < n; ++t) {
          const int64_t z = zx[static_cast<size_t>(t)];
          const float s = sx[static_cast<size_t>(t)];
          for (int64_t r = 0; r < rows; ++r) {
            const size_t j = static_cast<size_t>(r0 + r);
            const int64_t v = static_cast<int64_t>(acc[static_cast<size_t>(t * rows + r)]) - z * wsum_[j];
            float o = static_cast<float>(v) * s * sw_[j];
            if (!bias_.empty()) o += bias_[j];
            y[t * out_ + r0 + r] = o;
          }
        }
      }
    });
  }

  QuantScheme scheme_;
  std::optional<ActQuantParams> act_;
  std::vector<float> bias_;
  Kind kind_ = Kind::IntDecode;
  // Int8Gemm
  std::vector<int8_t> qw_;
  std::vector<int32_t> wsum_;
  std::vector<float> sw_;
  // Fp8 (codes, scales), Nvfp4 (packed codes, e4m3 block scales, global scale)
  std::vector<uint8_t> codes_;
  std::vector<float> scales_;
  std::vector<uint8_t> block_scales_;
  float global_ = 0;
  int64_t groups_ = 1;
  std::array<float, 16> lut16_{};  // Bnb4
  // IntDecode
  std::unique_ptr<Linear> inner_;
};

}  // namespace

std::unique_ptr<Linear> make_quantized_linear(const QuantizedTensor& q, const ActQuantParams* act, const Tensor* bias,
                                              const std::string& name) {
  q.validate(name);
  if (act) act->scheme.validate(name);
  if (!act && q.scheme.is_int()) return make_packed_linear(q, bias, name);
  std::vector<float> b;
  if (bias) {
    if (bias->numel() != q.rows)
      throw invalid_input(name, "bias has " + std::to_string(bias->numel()) + " values for " + std::to_string(q.rows) + " rows");
    b = bias->to_f32_vector();
  }
  return std::make_unique<QuantizedLinear>(q, act ? std::optional<ActQuantParams>(*act) : std::nullopt, std::move(b), name);
}

}  // namespace qf::rt
