// A Linear's input quantization (quantizers/act_quant.h) on the device, for
// device sources: the CPU's quantize_activations with the same codes, bit for
// bit. Each row's |x| maximum is taken over device::kLanes lanes (a maximum
// does not depend on its order; NaN is skipped as std::max skips it), then
// one index per value quantizes and decodes; NVFP4's blocks of 16 are one
// index each.
#pragma once

#include <cstdint>

#include "core/f8_e4m3.h"
#include "core/hd.h"
#include "device/exec.h"
#include "device/rows.h"
#include "quantizers/act_quant.h"
#include "quantizers/int_quant.h"
#include "quantizers/nvfp4.h"

namespace qf::QF_DEV_NS::act_quant {

constexpr float kFp8Max = 448.0f;
constexpr float kInt8Half = 127.5f;
constexpr float kF32Eps = 1.1920928955078125e-07f;  // 2^-23, compressed-tensors' eps for a zero scale

QF_HD inline float nonzero(float s) { return s > 0 && hd::is_finite(s) ? s : kF32Eps; }
QF_HD inline float max_abs(float m, float x) {
  const float a = hd::abs_f32(x);
  return a > m ? a : m;
}

struct RowAmaxLanes {  // part[r, l] = max |x| over lane l of row r
  const float* x;
  float* part;
  int64_t in;
  QF_HD void operator()(int64_t idx) const {
    const int64_t r = idx / device::kLanes, l = idx % device::kLanes;
    float m = 0.0f;
    for (int64_t i = l; i < in; i += device::kLanes) m = max_abs(m, x[r * in + i]);
    part[idx] = m;
  }
};
struct RowScale {  // scale[r] = nonzero(max of the lanes / div)
  const float* part;
  float* scale;
  float div;
  QF_HD void operator()(int64_t r) const {
    float m = 0.0f;
    for (int64_t l = 0; l < device::kLanes; ++l) m = part[r * device::kLanes + l] > m ? part[r * device::kLanes + l] : m;
    scale[r] = nonzero(m / div);
  }
};
struct QuantInt8 {  // row_scale: per row, or null for the static scale
  const float* x;
  float* out;
  const float* row_scale;
  float scale;
  int32_t zero;
  int64_t in;
  QF_HD void operator()(int64_t idx) const {
    const float sc = row_scale ? row_scale[idx / in] : scale;
    const int32_t z = row_scale ? 0 : zero;
    out[idx] = hd::dequantize_int(hd::quantize_int8(x[idx], sc, z), sc, z);
  }
};
struct QuantFp8 {
  const float* x;
  float* out;
  const float* row_scale;
  float scale;
  int64_t in;
  QF_HD void operator()(int64_t idx) const {
    const float sc = row_scale ? row_scale[idx / in] : scale;
    out[idx] = f8e4m3_to_f32(f32_to_f8e4m3(x[idx] / sc)) * sc;
  }
};
struct QuantNvfp4Block {  // one index per (row, block of 16)
  const float* x;
  float* out;
  float global;
  int64_t in, blocks;
  QF_HD void operator()(int64_t idx) const {
    const int64_t r = idx / blocks, b0 = (idx % blocks) * 16, n = in - b0 < 16 ? in - b0 : 16;
    const float* xb = x + r * in + b0;
    float* ob = out + r * in + b0;
    float m = 0.0f;
    for (int64_t i = 0; i < n; ++i) m = max_abs(m, xb[i]);
    const float s = hd::nvfp4_block_scale(m, global);
    for (int64_t i = 0; i < n; ++i) ob[i] = hd::nvfp4_value(hd::nvfp4_code(xb[i], s, global), s, global);
  }
};

// out := x quantized and decoded as p says: n rows of `in` values on the
// device; `scratch` holds the lanes' maxima and the row scales.
inline void quantize_activations(const ActQuantParams& p, const float* x, int64_t n, int64_t in, float* out,
                                 dvec<float>& scratch) {
  const ActivationScheme& s = p.scheme;
  if (s.is_nvfp4()) {
    const int64_t blocks = (in + 15) / 16;
    for_each_index(n * blocks, QuantNvfp4Block{x, out, p.global_scale, in, blocks});
    return;
  }
  const float* row_scale = nullptr;
  const bool fp8 = s.type == QuantType::Float;
  if (s.dynamic) {
    fit(scratch, n * device::kLanes + n);
    float* part = raw(scratch);
    float* sc = part + n * device::kLanes;
    for_each_index(n * device::kLanes, RowAmaxLanes{x, part, in});
    for_each_index(n, RowScale{part, sc, fp8 ? kFp8Max : kInt8Half});
    row_scale = sc;
  }
  if (fp8) for_each_index(n * in, QuantFp8{x, out, row_scale, p.scale, in});
  else for_each_index(n * in, QuantInt8{x, out, row_scale, p.scale, p.zero_point, in});
}

}  // namespace qf::QF_DEV_NS::act_quant
