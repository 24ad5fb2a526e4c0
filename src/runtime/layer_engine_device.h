// The pieces of the device decoder layer shared by the decoder
// (decoder_device.cpp) and the calibration layer pass (layer_pass_device.cpp),
// for device sources only: the functors, the weights as uploaded, what a
// capturing pass measures, and LayerEngine, which runs Model::forward_layer's
// computation on the device.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/e2m1.h"
#include "core/error.h"
#include "core/f16.h"
#include "core/f8_e4m3.h"
#include "device/blas.h"
#include "device/exec.h"
#include "device/rows.h"
#include "formats/gguf/gguf.h"
#include "quantizers/device_quantizers.h"
#include "quantizers/kquant_blocks.h"
#include "runtime/act_quant_device.h"
#include "runtime/attention_device.h"
#include "runtime/device_runtime.h"
#include "runtime/model.h"

namespace qf::QF_DEV_NS::layer_engine {

// out[r] = x[r] * (1 / sqrt(mean(x[r]^2) + eps)) * w for rows of `dim`
// (out may be x): the CPU's rms_norm, the mean summed in double over
// device::kLanes lanes (device/rows.h) instead of in index order, so the
// scale can differ from the CPU's in its last bit at most rarely (double
// sums of f32 squares, rounded once to f32).
struct RmsNormRows {
  const float* x;
  const float* w;
  float* out;
  int64_t dim;
  float eps;
};
struct RmsNormLanes {  // part[r, l] = sum of x[r, i]^2 over lane l, in double
  const float* x;
  double* part;
  int64_t dim;
  QF_HD void operator()(int64_t idx) const {
    const int64_t r = idx / device::kLanes, l = idx % device::kLanes;
    const float* xr = x + r * dim;
    double ss = 0.0;
    for (int64_t i = l; i < dim; i += device::kLanes) ss += static_cast<double>(xr[i]) * xr[i];
    part[idx] = ss;
  }
};
struct RmsNormScale {  // scale[r] = f32(1 / sqrt(sum of the lanes / dim + eps))
  const double* part;
  float* scale;
  int64_t dim;
  float eps;
  QF_HD void operator()(int64_t r) const {
    double ss = 0.0;
    for (int64_t l = 0; l < device::kLanes; ++l) ss += part[r * device::kLanes + l];
    scale[r] = static_cast<float>(1.0 / hd::sqrt_f64(ss / static_cast<double>(dim) + eps));
  }
};
struct RmsNormApply {
  const float* x;
  const float* w;
  const float* scale;
  float* out;
  int64_t dim;
  QF_HD void operator()(int64_t idx) const { out[idx] = x[idx] * scale[idx / dim] * w[idx % dim]; }
};
// The norm of `rows` rows; `scratch` holds the lanes' sums and the scales.
inline void rms_norm(int64_t rows, const RmsNormRows& f, dvec<double>& scratch) {
  fit(scratch, rows * device::kLanes + (rows + 1) / 2);
  double* part = raw(scratch);
  float* scale = reinterpret_cast<float*>(part + rows * device::kLanes);
  for_each_index(rows * device::kLanes, RmsNormLanes{f.x, part, f.dim});
  for_each_index(rows, RmsNormScale{part, scale, f.dim, f.eps});
  for_each_index(rows * f.dim, RmsNormApply{f.x, f.w, scale, f.out, f.dim});
}

// RoPE of one (token, head) row of `hd` values: pairs (i, i + hd/2), or
// (2i, 2i + 1) when interleaved, rotated by the angle of position pos0 + t
// (cos/sin tables [position][hd/2], computed on the host as the CPU does).
struct RopeRows {
  float* x;
  const float* cos_t;
  const float* sin_t;
  int64_t heads, hd, pos0;
  bool interleaved;
  QF_HD void operator()(int64_t idx) const {
    const int64_t t = idx / heads, half = hd / 2;
    float* v = x + idx * hd;
    const float* c = cos_t + (pos0 + t) * half;
    const float* s = sin_t + (pos0 + t) * half;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
      const float a = v[i0], b = v[i1];
      v[i0] = a * c[i] - b * s[i];
      v[i1] = b * c[i] + a * s[i];
    }
  }
};

// y[idx] += b[idx % out]: a Linear's bias on n rows of `out`.
struct AddBias {
  float* y;
  const float* b;
  int64_t out;
  QF_HD void operator()(int64_t idx) const { y[idx] += b[idx % out]; }
};

struct AddInPlace {
  float* x;
  const float* y;
  QF_HD void operator()(int64_t i) const { x[i] += y[i]; }
};

// gate = silu(gate) * up.
struct Swiglu {
  float* g;
  const float* u;
  QF_HD void operator()(int64_t i) const {
    const float x = g[i];
    g[i] = x / (1.0f + hd::exp_f32(-x)) * u[i];
  }
};

// The cache's f16 rounding: dst[i] = f16(src[i]) as f32.
struct StoreF16 {
  const float* src;
  float* dst;
  QF_HD void operator()(int64_t i) const { dst[i] = f16_to_f32(f32_to_f16(src[i])); }
};

// Widens 2-byte weights into the f32 scratch matrix.
struct WidenF16 {
  const uint16_t* src;
  float* dst;
  QF_HD void operator()(int64_t i) const { dst[i] = f16_to_f32(src[i]); }
};
struct WidenBf16 {
  const uint16_t* src;
  float* dst;
  QF_HD void operator()(int64_t i) const { dst[i] = bf16_to_f32(src[i]); }
};
// f32 values rounded to bf16 (to nearest, ties to even).
struct NarrowBf16 {
  const float* src;
  uint16_t* dst;
  QF_HD void operator()(int64_t i) const { dst[i] = f32_to_bf16(src[i]); }
};

// dst row r = src row rows[r] (rows of `dim`).
struct GatherRows {
  const float* src;
  const int64_t* rows;
  float* dst;
  int64_t dim;
  QF_HD void operator()(int64_t idx) const { dst[idx] = src[rows[idx / dim] * dim + idx % dim]; }
};

struct SumOf {
  QF_HD float operator()(float a, float b) const { return a + b; }
};

// Decodes ggml blocks into the f32 scratch matrix: one index per block.
struct WidenBlocks {
  const uint8_t* data;
  float* dst;
  uint32_t type;
  int64_t row_bytes, blocks_per_row, block_elems, type_size, cols;
  QF_HD void operator()(int64_t idx) const {
    namespace kq = kquants;
    const int64_t r = idx / blocks_per_row, b = idx % blocks_per_row;
    const uint8_t* p = data + r * row_bytes + b * type_size;
    float* y = dst + r * cols + b * block_elems;
    switch (type) {
      case ggml_type::Q4_0: kq::dequantize_block(*reinterpret_cast<const kq::BlockQ4_0*>(p), y); break;
      case ggml_type::Q4_1: kq::dequantize_block(*reinterpret_cast<const kq::BlockQ4_1*>(p), y); break;
      case ggml_type::Q5_0: kq::dequantize_block(*reinterpret_cast<const kq::BlockQ5_0*>(p), y); break;
      case ggml_type::Q5_1: kq::dequantize_block(*reinterpret_cast<const kq::BlockQ5_1*>(p), y); break;
      case ggml_type::Q8_0: kq::dequantize_block(*reinterpret_cast<const kq::BlockQ8_0*>(p), y); break;
      case ggml_type::Q2_K: kq::dequantize_block(*reinterpret_cast<const kq::BlockQ2_K*>(p), y); break;
      case ggml_type::Q3_K: kq::dequantize_block(*reinterpret_cast<const kq::BlockQ3_K*>(p), y); break;
      case ggml_type::Q4_K: kq::dequantize_block(*reinterpret_cast<const kq::BlockQ4_K*>(p), y); break;
      case ggml_type::Q5_K: kq::dequantize_block(*reinterpret_cast<const kq::BlockQ5_K*>(p), y); break;
      case ggml_type::Q6_K: kq::dequantize_block(*reinterpret_cast<const kq::BlockQ6_K*>(p), y); break;
      default: break;  // upload_linear keeps other types as f32
    }
  }
};
// The ggml types WidenBlocks decodes.
inline bool device_decodes(uint32_t type) {
  switch (type) {
    case ggml_type::Q4_0: case ggml_type::Q4_1: case ggml_type::Q5_0: case ggml_type::Q5_1: case ggml_type::Q8_0:
    case ggml_type::Q2_K: case ggml_type::Q3_K: case ggml_type::Q4_K: case ggml_type::Q5_K: case ggml_type::Q6_K:
      return true;
    default: return false;
  }
}

// Decodes pack-quantized integer rows into the f32 scratch matrix: one index
// per weight, (code - zero) * scale as PackedLinear::decode_row computes it.
struct WidenPacked {
  const uint32_t* packed;
  const float* scales;
  const int32_t* zeros;
  const int32_t* g_idx;  // nullptr: column / group_size
  float* dst;
  int bits;
  int strategy;  // 0 group, 1 channel, 2 tensor
  int64_t group_size, groups, words_per_row, cols;
  QF_HD void operator()(int64_t idx) const {
    const int64_t r = idx / cols, c = idx % cols;
    const uint32_t* w = packed + r * words_per_row;
    const uint64_t bit = static_cast<uint64_t>(c) * static_cast<uint64_t>(bits);
    uint32_t v = w[bit / 32] >> (bit % 32);
    if (bit % 32 + static_cast<uint64_t>(bits) > 32) v |= w[bit / 32 + 1] << (32 - bit % 32);
    v &= (1u << bits) - 1u;
    const int64_t pbase = strategy == 2 ? 0 : r * groups;
    const int64_t g = strategy != 0 ? 0 : g_idx ? g_idx[c] : c / group_size;
    dst[idx] = static_cast<float>(static_cast<int32_t>(v) - zeros[pbase + g]) * scales[pbase + g];
  }
};

// Decodes FP8 E4M3 weights into the f32 scratch matrix: one index per weight.
struct WidenFp8 {
  const uint8_t* codes;
  const float* scales;
  float* dst;
  int strategy;  // 0 group, 1 channel, 2 tensor
  int64_t group_size, groups, cols;
  QF_HD void operator()(int64_t idx) const {
    const int64_t r = idx / cols, c = idx % cols;
    const int64_t p = strategy == 2 ? 0 : strategy == 1 ? r : r * groups + c / group_size;
    dst[idx] = f8e4m3_to_f32(codes[idx]) * scales[p];
  }
};

// Decodes NVFP4 weights (e2m1 nibbles, E4M3 block scales over a global
// scale) into the f32 scratch matrix: one index per weight.
struct WidenNvfp4 {
  const uint8_t* codes;
  const uint8_t* block_scales;
  float* dst;
  float global;
  int64_t group_size, groups, cols;
  QF_HD void operator()(int64_t idx) const {
    const int64_t r = idx / cols, c = idx % cols;
    const float eff = f8e4m3_to_f32(block_scales[r * groups + c / group_size]) / global;
    dst[idx] = e2m1_to_f32(static_cast<uint8_t>((codes[idx / 2] >> (4 * (idx & 1))) & 15u)) * eff;
  }
};

enum class Store { F32, F16, Bf16, Blocks, Packed, Fp8, Nvfp4 };

// The width of a layer's Linear input: hidden, q_dim (o_proj's), hidden,
// intermediate (down_proj's).
inline int64_t input_cols(const ModelConfig& c, rt::LayerInput input) {
  switch (input) {
    case rt::LayerInput::O: return c.q_dim();
    case rt::LayerInput::Down: return c.intermediate_size;
    case rt::LayerInput::Attention:
    case rt::LayerInput::Mlp: break;
  }
  return c.hidden_size;
}

// One Linear on the device, in the form it is kept there.
struct DeviceLinear {
  int64_t out = 0, in = 0;
  Store store = Store::F32;
  bool keep_f32 = false;  // stays in f32 under bf16 compute (routers, the shared expert's gate)
  dvec<float> w32;      // Store::F32
  dvec<uint16_t> w16;   // Store::F16 / Bf16
  dvec<uint8_t> blocks;  // Store::Blocks
  uint32_t ggml = 0;
  int64_t row_bytes = 0, block_elems = 0, type_size = 0;
  dvec<uint32_t> packed;  // Store::Packed
  dvec<float> scales;
  dvec<int32_t> zeros, g_idx;
  int bits = 0, strategy = 0;
  int64_t group_size = 0, groups = 0, words_per_row = 0;
  dvec<uint8_t> block_scales;  // Store::Nvfp4 (codes in `blocks`; Fp8: codes in `blocks`, scales in `scales`)
  float global = 0;
  dvec<float> bias;     // empty: none
  const ActQuantParams* act = nullptr;  // the Linear's input quantizer (owned by the model)
  std::string name;

  uint64_t bytes() const {
    const uint64_t w = store == Store::F32                           ? static_cast<uint64_t>(out * in) * 4
                       : store == Store::F16 || store == Store::Bf16 ? static_cast<uint64_t>(out * in) * 2
                       : store == Store::Blocks                      ? blocks.size()
                       : store == Store::Fp8                         ? blocks.size() + scales.size() * 4
                       : store == Store::Nvfp4                       ? blocks.size() + block_scales.size() + 4
                                                                     : (packed.size() + scales.size() + zeros.size() + g_idx.size()) * 4;
    return w + bias.size() * 4;
  }
};

inline DeviceLinear upload_linear(const rt::Linear& l, const std::string& name) {
  DeviceLinear d;
  d.out = l.out_features(), d.in = l.in_features(), d.name = name, d.act = l.input_quantizer();
  const rt::DeviceWeightForm form = l.device_form();
  const std::string f = l.format();
  // The functors' strategy code: 0 group, 1 channel, 2 tensor.
  const int strategy = form.strategy == QuantStrategy::Group ? 0 : form.strategy == QuantStrategy::Channel ? 1 : 2;
  if (form.kind == rt::DeviceWeightForm::Kind::GgufBlocks && device_decodes(form.ggml_type)) {
    const GgmlTypeInfo* info = ggml_type_info(form.ggml_type);
    d.store = Store::Blocks, d.ggml = form.ggml_type;
    d.row_bytes = static_cast<int64_t>(form.row_bytes), d.block_elems = info->block_size, d.type_size = info->type_size;
    d.blocks = upload(form.blocks, d.row_bytes * d.out);
  } else if (form.kind == rt::DeviceWeightForm::Kind::PackedInt) {
    d.store = Store::Packed, d.bits = form.bits, d.strategy = strategy;
    d.group_size = form.group_size, d.groups = form.groups, d.words_per_row = form.words_per_row;
    d.packed = upload(form.packed, form.words_per_row * d.out);
    d.scales = upload(form.scales, static_cast<int64_t>(form.n_scales));
    d.zeros = upload(form.zeros, static_cast<int64_t>(form.n_scales));
    if (form.g_idx) d.g_idx = upload(form.g_idx, d.in);
  } else if (form.kind == rt::DeviceWeightForm::Kind::Fp8 || form.kind == rt::DeviceWeightForm::Kind::Nvfp4) {
    const bool fp8 = form.kind == rt::DeviceWeightForm::Kind::Fp8;
    d.store = fp8 ? Store::Fp8 : Store::Nvfp4, d.strategy = strategy;
    d.group_size = form.group_size, d.groups = form.groups;
    d.blocks = upload(form.blocks, static_cast<int64_t>(form.n_codes));
    if (fp8) d.scales = upload(form.scales, static_cast<int64_t>(form.n_scales));
    else d.block_scales = upload(form.block_scales, static_cast<int64_t>(form.n_scales)), d.global = form.global_scale;
  } else if (f == "f16" || f == "bf16") {
    // f16 and bf16 weights decode exactly, so narrowing them back is exact too.
    const std::vector<float> w = l.decode_all();
    d.store = f == "f16" ? Store::F16 : Store::Bf16;
    std::vector<uint16_t> h(w.size());
    for (size_t i = 0; i < w.size(); ++i) h[i] = f == "f16" ? f32_to_f16(w[i]) : f32_to_bf16(w[i]);
    d.w16 = upload(h.data(), static_cast<int64_t>(h.size()));
  } else {
    const std::vector<float> w = l.decode_all();
    d.w32 = upload(w.data(), static_cast<int64_t>(w.size()));
  }
  const std::vector<float> b = l.bias_values();
  if (!b.empty()) d.bias = upload(b.data(), static_cast<int64_t>(b.size()));
  return d;
}

// A sparse layer's router and experts, and its MLP block (moe_device.h, included at the end).
struct DeviceMoe;
struct Capture;
class LayerEngine;
inline std::shared_ptr<DeviceMoe> upload_moe(const rt::Model& m, int64_t li);
inline void moe_block(LayerEngine& e, DeviceMoe& moe, int64_t n, Capture* cap);

struct DeviceLayer {
  dvec<float> attn_norm, ffn_norm, q_norm, k_norm;
  DeviceLinear lin[7];  // kLayerLinears order: q k v o gate up down
  int64_t window = 0;
  dvec<float> k_cache, v_cache;  // [capacity, kv_dim]
  std::shared_ptr<DeviceMoe> moe;  // a sparse layer's (lin[4..6] empty); null: dense
};

inline dvec<float> upload_vec(const std::vector<float>& v) { return upload(v.data(), static_cast<int64_t>(v.size())); }

// Decoder layer `li`'s current weights on the device, with a cache of
// `capacity` positions.
inline void upload_layer(const rt::Model& m, int64_t li, int64_t capacity, DeviceLayer& d) {
  const rt::LayerWeights& L = m.weights().layers[static_cast<size_t>(li)];
  d.attn_norm = upload_vec(L.attn_norm), d.ffn_norm = upload_vec(L.ffn_norm);
  d.q_norm = upload_vec(L.q_norm), d.k_norm = upload_vec(L.k_norm);
  for (size_t j = 0; j < 7; ++j) {
    const rt::LayerLinear& ll = rt::kLayerLinears[j];
    if (!(L.*ll.member)) {  // a sparse layer's dense MLP
      d.lin[j] = DeviceLinear{};
      continue;
    }
    d.lin[j] = upload_linear(*(L.*ll.member), "model.layers." + std::to_string(li) + "." + ll.name);
  }
  d.moe.reset();
  if (L.sparse()) d.moe = upload_moe(m, li);
  d.window = m.window(li);
  const size_t kv = static_cast<size_t>(capacity * m.config().kv_dim());
  if (d.k_cache.size() != kv) d.k_cache.resize(kv), d.v_cache.resize(kv);
}

struct AbsOf {
  QF_HD float operator()(float x) const { return hd::abs_f32(x); }
};
// The larger of two, NaN ignored (as std::max(a, NaN) keeps a).
struct MaxOf {
  QF_HD float operator()(float a, float b) const { return b > a ? b : a; }
};
inline float abs_max(const float* x, int64_t n) {
  return transform_reduce_n(x, n, AbsOf{}, 0.0f, MaxOf{});
}

// sum[j] += x[t, j]^2 over the n rows in order, in double: one index per column.
struct ColumnSquareSums {
  const float* x;
  double* sum;
  int64_t n, cols;
  QF_HD void operator()(int64_t j) const {
    double s = sum[j];
    for (int64_t t = 0; t < n; ++t) s += static_cast<double>(x[t * cols + j]) * x[t * cols + j];
    sum[j] = s;
  }
};

// sum[j] += |x[t, j]|, max[j] = max(max[j], |x[t, j]|) over the n rows in
// order, in double: one index per column.
struct ColumnAbsStats {
  const float* x;
  double* sum;
  double* max;
  int64_t n, cols;
  QF_HD void operator()(int64_t j) const {
    double s = sum[j], m = max[j];
    for (int64_t t = 0; t < n; ++t) {
      const double a = static_cast<double>(hd::abs_f32(x[t * cols + j]));
      s += a;
      m = a > m ? a : m;
    }
    sum[j] = s, max[j] = m;
  }
};

// What a pass through a layer measures: the Hessians, ranges, column square
// sums and |x| statistics of its four distinct Linear inputs (rt::LayerInput
// order) and the largest |K| and |V|.
struct Capture {
  rt::LayerCapture what;
  std::unique_ptr<HessianSum> h[4];
  Range range[4] = {};
  dvec<double> sq[4];
  int64_t sq_rows = 0;
  dvec<double> abs_sum[4], abs_max[4];
  float k_amax = 0, v_amax = 0;

  void input(rt::LayerInput i, const float* x, int64_t n, int64_t cols) {
    const int k = static_cast<int>(i);
    if (what.hessians) h[k]->add_device(x, n);
    if (what.square_sums) {
      if (sq[k].empty()) sq[k].assign(static_cast<size_t>(cols), 0.0);
      for_each_index(cols, ColumnSquareSums{x, raw(sq[k]), n, cols});
      if (k == 0) sq_rows += n;
    }
    if (what.abs_stats) {
      if (abs_sum[k].empty()) abs_sum[k].assign(static_cast<size_t>(cols), 0.0), abs_max[k].assign(static_cast<size_t>(cols), 0.0);
      for_each_index(cols, ColumnAbsStats{x, raw(abs_sum[k]), raw(abs_max[k]), n, cols});
    }
    if (what.ranges) {
      const Range r = range_of(x, n * cols);
      range[k].lo = r.lo < range[k].lo ? r.lo : range[k].lo;
      range[k].hi = r.hi > range[k].hi ? r.hi : range[k].hi;
    }
  }
};

// The work of one pass through a layer: the scratch buffers, the algebra and
// the RoPE tables, for positions 0..capacity-1. Model::forward_layer's
// computation on the device, on x_ in place.
class LayerEngine {
 public:
  // bf16: every Linear that does not quantize its input computes in bf16
  // (linear()); the calibration passes of calibration.precision bf16.
  LayerEngine(const rt::Model& m, int64_t capacity, bool bf16 = false) : m_(m), c_(m.config()), bf16_(bf16) {
    // The rotation angles of every position, as Model::rope computes them.
    const std::vector<float>& inv = m.inv_freq();
    const int64_t half = c_.head_dim / 2;
    std::vector<float> cs(static_cast<size_t>(capacity * half)), sn(cs.size());
    for (int64_t p = 0; p < capacity; ++p)
      for (int64_t i = 0; i < half; ++i) {
        const float ang = static_cast<float>(p) * inv[static_cast<size_t>(i)];
        cs[static_cast<size_t>(p * half + i)] = std::cos(ang);
        sn[static_cast<size_t>(p * half + i)] = std::sin(ang);
      }
    cos_ = upload_vec(cs), sin_ = upload_vec(sn);
  }

  // Room for a widened f16/bf16 matrix of `elems` weights.
  void reserve_widened(int64_t elems) {
    if (static_cast<int64_t>(scratch_w_.size()) < elems) scratch_w_.resize(static_cast<size_t>(elems));
  }
  void reserve_widened(const DeviceLinear& l) {
    if (l.store != Store::F32) reserve_widened(l.out * l.in);
  }

  // x_ := n host rows of hidden states.
  void set_x(const float* x, int64_t n) { x_.assign(x, x + n * c_.hidden_size); }
  void get_x(float* x, int64_t n) const {
    thrust::copy(x_.begin(), x_.begin() + static_cast<std::ptrdiff_t>(n * c_.hidden_size), x);
  }
  float* x() { return raw(x_); }
  float* xn() { return raw(xn_); }
  Blas& blas() { return blas_; }
  dvec<double>& norm_scratch() { return norm_; }

  // y[n, out] = x[n, in] W^T (+ bias), the input quantized first when the
  // Linear says so: one GEMM, y^T (out x n) = op T of W's column-major
  // in x out view (W is stored row-major [out, in]) times x^T.
  void linear(DeviceLinear& l, const float* x, int64_t n, float* y) {
    if (l.act) {
      fit(xq_, n * l.in);
      act_quant::quantize_activations(*l.act, x, n, l.in, raw(xq_), act_scratch_);
      x = raw(xq_);
    }
    if (bf16_ && !l.act && !l.keep_f32) {
      // bf16 compute (calibration.precision bf16): the weight as bf16 (as
      // stored, or decoded and rounded), the input rounded to bf16, the
      // products summed in f32 on the tensor cores: rt::make_bf16_linear.
      const uint16_t* W16 = raw(l.w16);
      if (l.store != Store::Bf16) {
        const float* W = widened(l);
        fit(w16_, l.out * l.in);
        for_each_index(l.out * l.in, NarrowBf16{W, raw(w16_)});
        W16 = raw(w16_);
      }
      fit(x16_, n * l.in);
      for_each_index(n * l.in, NarrowBf16{x, raw(x16_)});
      blas_.gemm_16(Half::Bf16, Op::T, Op::N, l.out, n, l.in, 1.0f, W16, l.in, raw(x16_), l.in, 0.0f, y, l.out);
    } else {
      blas_.gemm(Op::T, Op::N, l.out, n, l.in, 1.0f, widened(l), l.in, x, l.in, 0.0f, y, l.out);
    }
    if (!l.bias.empty()) for_each_index(n * l.out, AddBias{y, raw(l.bias), l.out});
  }

  // The Linear's weight as f32 [out, in]: its own (f32 store) or decoded
  // into the scratch matrix.
  const float* widened(DeviceLinear& l) {
    if (l.store == Store::F32) return raw(l.w32);
    float* dst = raw(scratch_w_);
    switch (l.store) {
      case Store::F16: for_each_index(l.out * l.in, WidenF16{raw(l.w16), dst}); break;
      case Store::Bf16: for_each_index(l.out * l.in, WidenBf16{raw(l.w16), dst}); break;
      case Store::Blocks: {
        const int64_t per_row = l.in / l.block_elems;
        for_each_index(l.out * per_row, WidenBlocks{raw(l.blocks), dst, l.ggml, l.row_bytes, per_row, l.block_elems,
                                                    l.type_size, l.in});
        break;
      }
      case Store::Packed:
        for_each_index(l.out * l.in, WidenPacked{raw(l.packed), raw(l.scales), raw(l.zeros),
                                                 l.g_idx.empty() ? nullptr : raw(l.g_idx), dst, l.bits, l.strategy,
                                                 l.group_size, l.groups, l.words_per_row, l.in});
        break;
      case Store::Fp8:
        for_each_index(l.out * l.in, WidenFp8{raw(l.blocks), raw(l.scales), dst, l.strategy, l.group_size, l.groups, l.in});
        break;
      case Store::Nvfp4:
        for_each_index(l.out * l.in, WidenNvfp4{raw(l.blocks), raw(l.block_scales), dst, l.global, l.group_size,
                                                l.groups, l.in});
        break;
      case Store::F32: break;
    }
    return dst;
  }

  // y_ := o_proj(attention(attn_norm(x_))) for the n tokens in x_ at
  // positions pos0..pos0+n-1, appending their K/V to L's cache; att_ keeps
  // o_proj's input. `cap` (optional) sees the Linear inputs and K/V.
  void attention_block(DeviceLayer& L, int64_t n, int64_t pos0, Capture* cap) {
    const int64_t h = c_.hidden_size, hd = c_.head_dim, qd = c_.q_dim(), kvd = c_.kv_dim();
    const int64_t nh = c_.num_attention_heads, nkv = c_.num_key_value_heads;
    const float eps = static_cast<float>(c_.rms_norm_eps);
    reserve(n);
    rms_norm(n, RmsNormRows{raw(x_), raw(L.attn_norm), raw(xn_), h, eps}, norm_);
    if (cap) cap->input(rt::LayerInput::Attention, raw(xn_), n, h);
    linear(L.lin[0], raw(xn_), n, raw(q_));
    linear(L.lin[1], raw(xn_), n, raw(k_));
    linear(L.lin[2], raw(xn_), n, raw(v_));
    if (!L.q_norm.empty()) {
      rms_norm(n * nh, RmsNormRows{raw(q_), raw(L.q_norm), raw(q_), hd, eps}, norm_);
      rms_norm(n * nkv, RmsNormRows{raw(k_), raw(L.k_norm), raw(k_), hd, eps}, norm_);
    }
    const bool il = m_.weights().rope_interleaved;
    for_each_index(n * nh, RopeRows{raw(q_), raw(cos_), raw(sin_), nh, hd, pos0, il});
    for_each_index(n * nkv, RopeRows{raw(k_), raw(cos_), raw(sin_), nkv, hd, pos0, il});
    if (cap && cap->what.kv_amax) {
      const float ka = abs_max(raw(k_), n * kvd), va = abs_max(raw(v_), n * kvd);
      cap->k_amax = ka > cap->k_amax ? ka : cap->k_amax;
      cap->v_amax = va > cap->v_amax ? va : cap->v_amax;
    }
    for_each_index(n * kvd, StoreF16{raw(k_), raw(L.k_cache) + pos0 * kvd});
    for_each_index(n * kvd, StoreF16{raw(v_), raw(L.v_cache) + pos0 * kvd});
    causal_attention(blas_, raw(q_), raw(L.k_cache), raw(L.v_cache), raw(att_), n, pos0 + n, nh, nkv, hd, L.window,
                     scores_);
    if (cap) cap->input(rt::LayerInput::O, raw(att_), n, qd);
    linear(L.lin[3], raw(att_), n, raw(y_));
  }

  // y_ := down(swiglu(gate(xn_), up(xn_))) of the n normed rows in xn_;
  // g_ keeps down_proj's input.
  void mlp_block(DeviceLayer& L, int64_t n, Capture* cap) {
    if (L.moe) return moe_block(*this, *L.moe, n, cap);  // a sparse layer (moe_device.h)
    const int64_t h = c_.hidden_size, ff = c_.intermediate_size;
    reserve(n);
    if (cap) cap->input(rt::LayerInput::Mlp, raw(xn_), n, h);
    linear(L.lin[4], raw(xn_), n, raw(g_));
    linear(L.lin[5], raw(xn_), n, raw(u_));
    for_each_index(n * ff, Swiglu{raw(g_), raw(u_)});
    if (cap) cap->input(rt::LayerInput::Down, raw(g_), n, ff);
    linear(L.lin[6], raw(g_), n, raw(y_));
  }

  // xn_ := ffn_norm(x_ + y_), and x_ += y_ (the attention residual).
  void attention_residual(DeviceLayer& L, int64_t n) {
    const int64_t h = c_.hidden_size;
    for_each_index(n * h, AddInPlace{raw(x_), raw(y_)});
    rms_norm(n, RmsNormRows{raw(x_), raw(L.ffn_norm), raw(xn_), h, static_cast<float>(c_.rms_norm_eps)}, norm_);
  }

  // Layer L on the n tokens in x_ (positions pos0..pos0+n-1), in place:
  // Model::forward_layer.
  void layer(DeviceLayer& L, int64_t n, int64_t pos0, Capture* cap) {
    attention_block(L, n, pos0, cap);
    attention_residual(L, n);
    mlp_block(L, n, cap);
    for_each_index(n * c_.hidden_size, AddInPlace{raw(x_), raw(y_)});
  }

  // The buffers of the last block run, for callers that keep them.
  float* y() { return raw(y_); }
  float* att() { return raw(att_); }
  float* g() { return raw(g_); }
  // x_ := n rows already on the device.
  void set_x_device(const float* x, int64_t n) {
    fit(x_, n * c_.hidden_size);
    thrust::copy(thrust::device_pointer_cast(x), thrust::device_pointer_cast(x) + n * c_.hidden_size, x_.begin());
  }
  // xn_ := n rows already on the device.
  void set_xn_device(const float* x, int64_t n) {
    fit(xn_, n * c_.hidden_size);
    thrust::copy(thrust::device_pointer_cast(x), thrust::device_pointer_cast(x) + n * c_.hidden_size, xn_.begin());
  }

 private:
  void reserve(int64_t n) {
    const int64_t h = c_.hidden_size, qd = c_.q_dim(), kvd = c_.kv_dim(), ff = c_.intermediate_size;
    fit(xn_, n * h), fit(y_, n * h), fit(q_, n * qd), fit(att_, n * qd), fit(k_, n * kvd), fit(v_, n * kvd);
    fit(g_, n * ff), fit(u_, n * ff);
  }

  const rt::Model& m_;
  const ModelConfig& c_;
  bool bf16_ = false;
  Blas blas_;
  dvec<float> cos_, sin_, scratch_w_;
  dvec<double> norm_;         // rms_norm's lane sums and scales
  dvec<float> act_scratch_;   // activation quantization's lane maxima and row scales
  dvec<uint16_t> w16_, x16_;  // bf16 compute's weight and input
  dvec<float> x_, xn_, y_, q_, k_, v_, att_, g_, u_, xq_, scores_;
};

// Tokens outside the vocabulary are refused before any work.
inline void check_tokens(const ModelConfig& c, const int32_t* tokens, int64_t n) {
  for (int64_t t = 0; t < n; ++t)
    if (tokens[t] < 0 || tokens[t] >= c.vocab_size)
      throw invalid_input("forward", "token id " + std::to_string(tokens[t]) + " is outside the vocabulary (size " +
                                         std::to_string(c.vocab_size) + ")");
}

inline void check_capacity(const ModelConfig& c, int64_t capacity, int64_t pass_tokens) {
  if (capacity <= 0 || (c.max_position_embeddings > 0 && capacity > c.max_position_embeddings))
    throw invalid_input("device decoder", "capacity " + std::to_string(capacity) + " is outside 1.." +
                                              std::to_string(c.max_position_embeddings));
  if (pass_tokens <= 0) throw invalid_input("device decoder", "tokens per pass must be positive");
}

}  // namespace qf::QF_DEV_NS::layer_engine

// The sparse MLP of mixture-of-experts layers: DeviceMoe, upload_moe, moe_block.
#include "runtime/moe_device.h"
