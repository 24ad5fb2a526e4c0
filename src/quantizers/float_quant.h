// FP8 (E4M3) and NVFP4 weight quantization into the canonical QuantizedTensor,
// following compressed-tensors' calculate_qparams / generate_gparam /
// _quantize for float types.
//
// FP8 (scheme bits 8, type float; strategy tensor, channel or group):
//   - ranges include 0: amax = max(|min(min(x), 0)|, max(max(x), 0));
//   - scale = amax / 448 computed in f32, then rounded to scheme.scale_dtype
//     (round_scale of quantizers/rtn.h: zero -> the dtype's eps, overflow ->
//     largest finite) BEFORE the codes are computed;
//   - code = e4m3(clamp(x / scale, -448, 448)), the cast round-to-nearest-even
//     (f32_to_f8e4m3 saturates, which is the clamp); w = e4m3(q) * scale.
//
// NVFP4 (scheme QuantScheme::nvfp4(): tensor_group, 16-column blocks):
//   - global_scale = 448 * 6 / max(amax, FLT_MIN) in f32; a result that is not
//     finite (amax zero or tiny) becomes 1 (generate_gparam's nan_to_num);
//   - block scale = e4m3(clamp(global_scale * (amax_block / 6), -448, 448)),
//     kept decoded to f32; a block scale that is (or rounds to) zero becomes
//     0.125, the e4m3 eps compressed-tensors substitutes;
//   - code = e2m1(clamp(x / (block_scale / global_scale), -6, 6)): the
//     effective scale block_scale / global_scale is computed first, then x is
//     divided by it, as _quantize does; e2m1 rounding ties go to the even
//     mantissa (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2,
//     3.5 -> 4, 5 -> 4). An exact zero quotient gets code 0, a negative value
//     that rounds to zero keeps its sign (code 8), as the packer's signbit;
//   - w = e2m1(q) * (block_scale / global_scale).
//
// Weights must be finite (InvalidInput otherwise).
#pragma once

#include <cstdint>

#include "quantizers/nvfp4.h"
#include "quantizers/quant_scheme.h"

namespace qf {

// FP8 E4M3 of a row-major [rows, cols] f32 weight; s.is_fp8(), strategy
// tensor, channel or group. InvalidInput for another scheme, empty shapes or
// non-finite values.
QuantizedTensor quantize_fp8(const float* w, int64_t rows, int64_t cols, const QuantScheme& s);

// NVFP4 of a row-major [rows, cols] f32 weight (cols a multiple of 16);
// s.is_nvfp4(). global_amax < 0: the tensor's own absolute maximum; otherwise
// the amax the global scale is computed from (shared by fused layers).
QuantizedTensor quantize_nvfp4(const float* w, int64_t rows, int64_t cols, const QuantScheme& s,
                               float global_amax = -1);

// compressed-tensors' generate_gparam: 448 * 6 / max(amax, FLT_MIN) in f32,
// 1 when that is not finite (or amax is NaN).
float nvfp4_global_scale(float amax);
// The decoded e4m3 block scale for a block's amax against a global scale
// (0.125 when it rounds to zero), and the e2m1 code of x under a block scale
// and global scale (see above): the shared host/device functions of
// quantizers/nvfp4.h.
using hd::nvfp4_block_scale;  // float nvfp4_block_scale(float block_amax, float global_scale)
using hd::nvfp4_code;         // uint8_t nvfp4_code(float x, float block_scale, float global_scale)

}  // namespace qf
