// Round-to-nearest (RTN) integer weight quantization into the canonical
// QuantizedTensor, and the per-group quantizer that GPTQ shares.
//
// Conventions (compressed-tensors' calculate_qparams, equal to IST-DASLab
// gptq quant.py up to the all-zero case):
//   - ranges always include 0: lo = min(min(x), 0), hi = max(max(x), 0);
//   - symmetric:  scale = max(|lo|, |hi|) / ((qmax - qmin) / 2)  (int4: amax / 7.5,
//                 int8: amax / 127.5), zero = 2^(bits-1); codes are
//                 clamp(round(x / scale) + zero, 0, qmax), i.e. the signed
//                 range [-2^(bits-1), 2^(bits-1) - 1] shifted to unsigned;
//   - asymmetric: scale = (hi - lo) / (2^bits - 1), zero = clamp(round(-lo / scale), 0, qmax);
//   - the scale is computed in f32, then rounded (RNE) to scheme.scale_dtype
//     BEFORE the zero point and the codes are computed from it, so the
//     exported scale is exactly the one the codes were chosen for;
//   - a scale that is (or rounds to) zero is replaced by the scale dtype's
//     machine epsilon (f16 2^-10, bf16 2^-7, f32 2^-23), as compressed-tensors
//     does with torch.finfo(dtype).eps; such groups are all zero, their codes
//     all equal the zero point. Scales above the dtype's largest finite value
//     saturate to it (never inf).
//   - rounding is round-half-to-even (std::nearbyint), as torch.round.
//
// Observers: MinMax uses the range above. Mse is llm-compressor's mse
// observer (observers/mse.py, _grid_search_mse), with its observer_kwargs in
// MseOptions: for i in [0, int(maxshrink * grid)) it tries the range
// p * expand * [lo, hi], p = 1 - i / grid, and keeps for each group the first
// p that strictly minimises sum |dequant(q(x)) - x|^norm over the group (per
// row for channel, the whole tensor for tensor). The search stops early once
// `patience` consecutive candidates improved no group of the tensor
// (quantize_rtn: every group of the weight, as llm-compressor observes the
// whole weight at once; fit_group: the one group it fits). Each candidate's
// scale is rounded to scale_dtype before it is evaluated; with symmetric
// schemes the zero point stays 2^(bits-1). IST-DASLab gptq's search is
// MseOptions{maxshrink 0.8, patience none (INT64_MAX)}.
#pragma once

#include <cstdint>

#include "quantizers/int_quant.h"
#include "quantizers/mse_search.h"
#include "quantizers/quant_scheme.h"

namespace qf {

enum class RangeObserver { MinMax, Mse };
const char* observer_name(RangeObserver o);  // "minmax", "mse"

// The mse observer's settings: llm-compressor's observer_kwargs and defaults.
struct MseOptions {
  double maxshrink = 0.20;  // int(maxshrink * grid) candidates
  int64_t patience = 5;     // consecutive candidates without improvement before stopping
  double grid = 100.0;      // candidate p = 1 - i / grid
  double norm = 2.4;        // error exponent
  double expand = 1.0;      // the search starts from expand * [lo, hi] (>= 1)
};

// Round-to-nearest of a row-major [rows, cols] f32 weight under `scheme`.
// Throws qf::Error (InvalidInput) for an invalid scheme (QuantScheme::validate,
// group size must divide cols) or empty shapes. g_idx stays empty (identity).
QuantizedTensor quantize_rtn(const float* w, int64_t rows, int64_t cols, const QuantScheme& scheme,
                             RangeObserver obs = RangeObserver::MinMax, const MseOptions& mse = {});

// The group quantizer shared by RTN and GPTQ: GroupParams (int_quant.h).
// Fits (scale, zero) to the n values x[0], x[stride], ..., x[(n-1)*stride].
GroupParams fit_group(const float* x, int64_t n, int64_t stride, const QuantScheme& s, RangeObserver obs,
                      const MseOptions& mse = {});
// Same, for values held in double (GPTQ's working copy); each value is first
// converted to f32, so the result equals fit_group on the f32 values.
GroupParams fit_group(const double* x, int64_t n, int64_t stride, const QuantScheme& s, RangeObserver obs,
                      const MseOptions& mse = {});

// clamp(round(x / scale) + zero, 0, qmax); x / scale in f32 as torch does.
uint8_t quantize_value(float x, GroupParams p, const QuantScheme& s);
// (q - zero) * scale in f32.
inline float dequantize_value(uint8_t q, GroupParams p) { return hd::dequantize_int(q, p.scale, p.zero); }

// Rounds a positive f32 scale to `dt` (F16, BF16 or F32) with the conventions
// above (zero -> dtype eps, overflow -> largest finite, NaN -> eps).
// (hd::round_scale_to of int_quant.h, shared with the device code.)
float round_scale(float s, DType dt);
float scale_dtype_eps(DType dt);
hd::ScaleStore scale_store(DType dt);  // F16, BF16, else F32
// The mse observer's search settings for a scheme (quantizers/mse_search.h).
hd::MseGrid mse_grid(const QuantScheme& s, const MseOptions& o);

}  // namespace qf
