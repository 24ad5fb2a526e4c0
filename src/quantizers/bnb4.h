// bitsandbytes' 4-bit formats, NF4 and FP4 (QLoRA's `load_in_4bit`), as
// bitsandbytes' CUDA kernels compute them (csrc/kernels.cu: dQuantizeNF4,
// dQuantizeFP4, the dequantization tables, kQuantizeBlockwise) and its
// Python side stores them (functional.py: get_4bit_type, quantize_4bit,
// create_dynamic_map, QuantState.as_dict). docs/formats.md has the layout.
//
// Per element (host and device, core/hd.h):
//   - a code is an index 0..15 into a 16-entry table (NF4: quantiles of a
//     normal; FP4: bit 3 the sign, bits 0-2 index {0, 1/192, 2/3, 1, 1/3,
//     1/2, 1/6, 1/4});
//   - quantizing x: v = x * (1 / absmax) in f32, then the kernel's comparison
//     tree of `v > threshold` tests (the midpoints of neighbouring table
//     values as f32 constants): a value exactly on a threshold takes the
//     lower code; a NaN (an all-zero block, 0 * inf) takes code 0.
//
// Per tensor (bnb4.cpp): blocks of 64 over the flattened weight, absmax per
// block in f32, two codes a byte with the FIRST element in the HIGH nibble;
// optional double quantization of the absmax values (offset = their mean,
// blocks of 256 quantized to the signed 8-bit dynamic map).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/hd.h"
#include "quantizers/quant_scheme.h"

namespace qf {
namespace hd {

// get_4bit_type("nf4"); the kernel's nf4_dequantization_lut.
QF_HD inline float bnb_nf4_value(uint8_t code) {
  const float t[16] = {-1.0f,
                       -0.6961928009986877f,
                       -0.5250730514526367f,
                       -0.39491748809814453f,
                       -0.28444138169288635f,
                       -0.18477343022823334f,
                       -0.09105003625154495f,
                       0.0f,
                       0.07958029955625534f,
                       0.16093020141124725f,
                       0.24611230194568634f,
                       0.33791524171829224f,
                       0.44070982933044434f,
                       0.5626170039176941f,
                       0.7229568362236023f,
                       1.0f};
  return t[code & 15u];
}

// The kernel's dDequantizeFP4Tree: sign in bit 3, magnitude from
// fp4_dequantization_lut (get_4bit_type("fp4") = {0, 0.0625, 8, 12, 4, 6, 2,
// 3} / 12, the same f32 values). Code 8 is -0.0.
QF_HD inline float bnb_fp4_value(uint8_t code) {
  const float t[8] = {0.0f, 0.005208333333f, 0.66666667f, 1.0f, 0.33333333f, 0.5f, 0.16666667f, 0.25f};
  const float m = t[code & 7u];
  return (code & 8u) ? -m : m;
}

// The kernel's dQuantizeNF4 (x already scaled by 1 / absmax).
QF_HD inline uint8_t bnb_nf4_code(float x) {
  if (x > 0.03979014977812767f) {
    if (x > 0.3893125355243683f) {
      if (x > 0.6427869200706482f) return x > 0.8614784181118011f ? 15 : 14;
      return x > 0.5016634166240692f ? 13 : 12;
    }
    if (x > 0.2035212516784668f) return x > 0.2920137718319893f ? 11 : 10;
    return x > 0.1202552504837513f ? 9 : 8;
  }
  if (x > -0.33967943489551544f) {
    if (x > -0.13791173323988914f) return x > -0.045525018125772476f ? 7 : 6;
    return x > -0.23460740596055984f ? 5 : 4;
  }
  if (x > -0.6106329262256622f) return x > -0.4599952697753906f ? 3 : 2;
  return x > -0.8480964004993439f ? 1 : 0;
}

// The kernel's dQuantizeFP4: sign bit for x < 0 (so -0.0 is code 0, and a
// small negative value code 8), then the magnitude's tree.
QF_HD inline uint8_t bnb_fp4_code(float x) {
  const uint8_t sign = x < 0 ? 8 : 0;
  x = abs_f32(x);
  uint8_t m;
  if (x > 0.29166667f) {
    if (x > 0.583333f) m = x > 0.8333333f ? 3 : 2;
    else m = x > 0.4166667f ? 5 : 4;
  } else if (x > 0.0859375f) {
    m = x > 0.20833333f ? 7 : 6;
  } else {
    m = x > 0.00260417f ? 1 : 0;
  }
  return static_cast<uint8_t>(m + sign);
}

QF_HD inline float bnb4_value(bool fp4, uint8_t code) { return fp4 ? bnb_fp4_value(code) : bnb_nf4_value(code); }
QF_HD inline uint8_t bnb4_code(bool fp4, float scaled) { return fp4 ? bnb_fp4_code(scaled) : bnb_nf4_code(scaled); }

// The 8-bit blockwise quantizer's search (kernel dQuantize<0>) over a sorted
// 256-entry map: binary search, then the nearer neighbour by the f32
// midpoint; on a midpoint it keeps the search's pivot.
QF_HD inline uint8_t bnb_dynamic_code(const float* code, float x) {
  int pivot = 127, upper_pivot = 255, lower_pivot = 0;
  float lower = -1.0f, upper = 1.0f;
  float val = code[pivot];
  for (int i = 64; i > 0; i >>= 1) {
    if (x > val) {
      lower_pivot = pivot;
      lower = val;
      pivot += i;
    } else {
      upper_pivot = pivot;
      upper = val;
      pivot -= i;
    }
    val = code[pivot];
  }
  if (upper_pivot == 255) upper = code[upper_pivot];
  if (lower_pivot == 0) lower = code[lower_pivot];
  if (x > val) {
    const float midpoint = (upper + val) * 0.5f;
    return static_cast<uint8_t>(x > midpoint ? upper_pivot : pivot);
  }
  const float midpoint = (lower + val) * 0.5f;
  return static_cast<uint8_t>(x < midpoint ? lower_pivot : pivot);
}

}  // namespace hd

// dequantize_4bit's output: the f32 product rounded to the quant_state's dtype.
inline float bnb_round_out(DType d, float v) {
  if (d == DType::F16) return f16_to_f32(f32_to_f16(v));
  if (d == DType::BF16) return bf16_to_f32(f32_to_bf16(v));
  return v;
}

constexpr int64_t kBnbBlock = 64;         // bitsandbytes' default (transformers never changes it)
constexpr int64_t kBnbNestedBlock = 256;  // quantize_4bit's blocksize for the absmax values

// The 16 table values as bitsandbytes stores them (`weight.quant_map`).
std::array<float, 16> bnb4_quant_map(QuantType t);
// create_dynamic_map(signed=True): the sorted 256-entry map of the nested
// absmax codes (`weight.nested_quant_map`). torch.linspace's scalar formula
// in f32, the means in f32, the powers of ten in double, rounded to f32.
const std::array<float, 256>& bnb_dynamic_map();

// NF4 or FP4 (s.type) round-to-nearest of a row-major [rows, cols] weight:
// blocks of s.group_size over the flattened weight, absmax in f32, codes by
// hd::bnb4_code(x * (1 / absmax)); with s.double_quant the absmax values are
// double-quantized (bnb_double_quant) and `scales` holds their decoded values.
QuantizedTensor quantize_bnb4(const float* w, int64_t rows, int64_t cols, const QuantScheme& s);

// Double quantization of the absmax values, as quantize_4bit with
// compress_statistics: offset = mean (summed in double, rounded to f32), then
// (absmax - offset) in blocks of 256: nested = max |.|, code =
// hd::bnb_dynamic_code(v * (1 / nested)). Fills q's absmax_codes,
// nested_absmax, absmax_offset and sets q.scales to the decoded values.
void bnb_double_quant(const std::vector<float>& absmax, QuantizedTensor& q);
// The absmax values the stored double quantization decodes to:
// f32(f32(map[code] * nested[i / 256]) + offset), dequantize_blockwise's
// product then the `absmax += offset` of dequantize_4bit.
std::vector<float> bnb_decode_absmax(const std::vector<uint8_t>& codes, const std::vector<float>& nested, float offset);

// Two codes a byte, element 2i in the high nibble, 2i + 1 in the low one;
// an odd count is padded with the code of 0.0 (what the kernel packs for the
// zero it loads past the end). Unpack returns n codes.
std::vector<uint8_t> pack_bnb4(const std::vector<uint8_t>& codes, QuantType t);
std::vector<uint8_t> unpack_bnb4(const uint8_t* packed, size_t n_bytes, int64_t n);

}  // namespace qf
